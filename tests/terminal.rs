//! Every command as a person at a terminal runs it: standard input, output
//! and error on a pseudo-terminal, logging at trace level, the seccomp
//! filters on. A system call that a thread's allowlist lacks (the logger's
//! terminal query was one) ends lwpvmm with a `seccomp:` message, which
//! fails these tests. The Linux guest's run on a terminal is in
//! tests/linux.rs.

// A test: a failed setup or expectation stops it with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;

use common::{on_terminal, require_kvm};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lwpvmm-terminal-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn guest_file(dir: &std::path::Path, name: &str) -> String {
    let path = dir.join(format!("{name}.elf"));
    std::fs::write(&path, lwpvmm::guests::get(name).unwrap()).unwrap();
    path.to_str().unwrap().to_owned()
}

#[test]
fn run_with_guest_warnings() {
    require_kvm();
    let dir = scratch("run");
    let kernel = guest_file(&dir, "hostile");
    let metrics = dir.join("metrics.json");
    let (status, text) = on_terminal(&[
        "run",
        "--kernel",
        &kernel,
        "--memory",
        "64",
        "--metrics",
        metrics.to_str().unwrap(),
    ]);
    assert_eq!(status, Some(1), "the guest's exit value 0:\n{text}");
    assert!(text.contains("guest: 22 passed, 0 failed"), "{text}");
    assert!(text.contains("WARN"), "the guest made lwpvmm warn:\n{text}");
    assert!(metrics.exists());
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn snapshot_and_restore() {
    require_kvm();
    let dir = scratch("restore");
    let kernel = guest_file(&dir, "replay");
    let snap = dir.join("snap");
    let snap = snap.to_str().unwrap();
    let (status, text) = on_terminal(&[
        "run",
        "--kernel",
        &kernel,
        "--memory",
        "64",
        "--cmdline",
        "iterations=30000 snap=100",
        "--snapshot-dir",
        snap,
        "--snapshot-on-port",
    ]);
    assert_eq!(status, Some(1), "{text}");
    assert!(text.contains("snapshot written"), "{text}");
    let (status, text) = on_terminal(&["restore", snap]);
    assert_eq!(status, Some(1), "{text}");
    assert!(text.contains("replay digest "), "{text}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn report_of_a_trace() {
    let dir = scratch("report");
    let svg = dir.join("out.svg");
    let trace = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/report.trace");
    let (status, text) = on_terminal(&["report", trace, "--svg", svg.to_str().unwrap()]);
    assert_eq!(status, Some(0), "{text}");
    assert!(text.contains("0x401020"), "{text}");
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn profile_of_a_program() {
    require_kvm();
    let dir = scratch("profile");
    let program = guest_file(&dir, "example-hot");
    let (status, text) = on_terminal(&["profile", &program, "--top", "3"]);
    assert_eq!(status, Some(0), "{text}");
    assert!(text.contains("hot: done"), "{text}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn demo() {
    require_kvm();
    let (status, text) = on_terminal(&["demo"]);
    assert_eq!(status, Some(0), "{text}");
    assert!(text.contains("result: success"), "{text}");
}
