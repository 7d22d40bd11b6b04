//! Debian's stock kernel as a user has it (resources/linux/stock.sh: the
//! package's bzImage unchanged, the guest module built against the
//! package's headers) boots under lwpvmm with its default command line for
//! a kernel that is not ours, and the LWP self-test runs in it: the module
//! loads, and processes on two vCPUs get LWP, with threads that migrate,
//! fork and exec, the threshold signal and `--lwp precise`'s exact counts.
//! Its `--disk` is /dev/vda to the package's virtio drivers, which find it
//! through ACPI (this kernel reads no `virtio_mmio.device=`).
//!
//! The kernel needs no patch for the SYSCALL quirk of these hosts: lwpvmm
//! completes each SYSCALL kvm_pvm leaves at CPL3 (the metrics count them),
//! and /sysentry holds it to patch 0001's rules.
//!
//! The run takes 10 to 15 minutes here (docs/linux-guest.md says where they
//! go): it is stopped only when the guest stops printing, so a loaded
//! host makes it slower, not failed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{
    Console, PROGRAMS, SYSENTRY, assert_lines, assert_syscalls_completed, command, linux,
    require_kvm, spawn_within,
};

/// How long the guest may print nothing before the run counts as stuck:
/// the stock kernel's longest silent stretch here is its first minutes,
/// before its console is set up.
const SILENCE: Duration = Duration::from_secs(20 * 60);
/// The whole run's bound, for CI's sake.
const LIMIT: Duration = Duration::from_secs(60 * 60);

/// Debian's kernel, module and the self-test's initramfs, fetched and built
/// by resources/linux/stock.sh (cached by the package's version).
fn stock() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("stock");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("resources/linux/stock.sh");
    let out = Command::new(&script)
        .arg(&dir)
        .arg(linux())
        .output()
        .expect("run resources/linux/stock.sh");
    assert!(
        out.status.success(),
        "resources/linux/stock.sh failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

#[test]
fn debians_kernel_boots_and_its_processes_get_lwp_through_the_module() {
    require_kvm();
    let dir = stock();
    let path = |name: &str| dir.join(name).to_str().expect("UTF-8 path").to_owned();
    let metrics = path("selftest.metrics.json");
    let disk = path("disk.img");
    std::fs::write(&disk, vec![0u8; 1 << 20]).expect("write the disk image");
    let out = spawn_within(
        command().args([
            "run",
            "--kernel",
            &path("vmlinuz"),
            "--initramfs",
            &path("initramfs.cpio"),
            "--memory",
            "256",
            "--vcpus",
            "2",
            "--lwp",
            "precise",
            "--metrics",
            &metrics,
            "--disk",
            &disk,
        ]),
        LIMIT,
    )
    .wait_while_printing(SILENCE);
    let console = Console::of(&out);
    assert_eq!(out.status.code(), Some(0), "{console}");
    let abi = std::fs::read_to_string(dir.join("abi")).expect("stock.sh's abi file");
    let mut lines: Vec<String> = PROGRAMS
        .iter()
        .chain(&["/lwp-precise"])
        .map(|p| format!("ok - {p}"))
        .collect();
    lines.extend(
        [
            &format!("lwp-linux-selftest: kernel {}", abi.trim()),
            "lwpvmm: LWP for user tasks",
            "ok - the lwpvmm guest module loads",
            "lwp-linux-selftest: package module /cpuid.ko loaded",
            "lwp-linux-selftest: package module /msr.ko loaded",
            "lwp-linux-selftest: package module /virtio_blk.ko loaded",
            "lwp-linux-selftest: cpus 2",
            "ok - every CPU is in /proc/cpuinfo and its CPUID topology names it by its APIC ID",
            "ok - LWP_CFG reads what the kernel enabled at boot, on every CPU",
            SYSENTRY,
            "ok - IRE exact for a 2000-instruction loop",
            "lwp-linux-selftest: 23 passed, 0 failed",
        ]
        .map(String::from),
    );
    assert_lines(&console, &lines);
    assert!(
        console.contains("virtio_blk virtio0: [vda] 2048 512-byte logical blocks"),
        "the disk is not /dev/vda:\n{console}"
    );
    assert_syscalls_completed(Path::new(&metrics));
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(&metrics).unwrap()).unwrap();
    // What lwpvmm carried out for the kernel, for the log.
    for counter in [
        "syscalls_completed",
        "pf_entry_stops",
        "cpl0_cmpxchg16b",
        "cpl0_mxcsr",
        "cpl0_verw",
    ] {
        eprintln!("stock kernel: {counter} = {}", m["vm"][counter]);
    }
}
