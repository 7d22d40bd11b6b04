//! seccomp: a thread under lwpvmm's vCPU or control filter that makes a
//! system call outside the allowlist ends the whole process with SIGSYS,
//! while allowed calls go through. Each case runs in a child process (this
//! same binary, told by an environment variable which probe to run), because
//! a filter cannot be removed once installed.
//!
//! A custom harness: it prints `seccomp: N passed, M failed` and exits
//! non-zero when a case fails.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

use lwpvmm::vmm::seccomp::{ThreadKind, install};

const PROBE: &str = "LWPVMM_SECCOMP_PROBE";

/// The child side: install a filter, then make one system call.
fn probe(which: &str) -> ! {
    let kind = if which.starts_with("control") {
        ThreadKind::Control
    } else {
        ThreadKind::Vcpu
    };
    install(kind).expect("install the filter");
    if which.ends_with("denied") {
        // socket(2) is in no lwpvmm allowlist.
        let _ = std::net::UdpSocket::bind("127.0.0.1:0");
        println!("survived a denied system call");
        std::process::exit(3);
    }
    println!("alive");
    std::process::exit(0);
}

fn main() {
    if let Ok(which) = std::env::var(PROBE) {
        probe(&which);
    }
    let me = std::env::current_exe().expect("current exe");
    // (probe, expected outcome: Ok(exit code) or Err(signal))
    let cases: [(&str, Result<i32, i32>); 4] = [
        ("vcpu-allowed", Ok(0)),
        ("vcpu-denied", Err(libc::SIGSYS)),
        ("control-allowed", Ok(0)),
        ("control-denied", Err(libc::SIGSYS)),
    ];
    let (mut passed, mut failed) = (0, 0);
    for (which, want) in cases {
        let out = Command::new(&me)
            .env(PROBE, which)
            .output()
            .expect("run probe");
        let got = match (out.status.code(), out.status.signal()) {
            (Some(code), _) => Ok(code),
            (None, Some(sig)) => Err(sig),
            _ => Err(-1),
        };
        let ok = got == want
            && (want.is_err() || String::from_utf8_lossy(&out.stdout).contains("alive"));
        println!(
            "{} {which}: {got:?}, want {want:?}",
            if ok { "ok" } else { "FAILED" }
        );
        if ok {
            passed += 1;
        } else {
            failed += 1;
        }
    }
    println!("seccomp: {passed} passed, {failed} failed");
    std::process::exit(if failed == 0 { 0 } else { 1 });
}
