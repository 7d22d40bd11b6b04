//! A hostile virtio driver (resources/guests/virtio_hostile.c) against
//! lwpvmm's devices: malformed descriptor chains end in a status, a chain
//! returned with nothing written, or DEVICE_NEEDS_RESET, never a hang or a
//! crash; and a network device whose guest posts no receive buffers while
//! the host floods its tap does not grow lwpvmm's memory.
//!
//! Its own test binary, so that the process's RSS is this VM's alone. It
//! needs /dev/kvm, /dev/net/tun and the rights to create a network
//! namespace and a tap (root); it fails saying which is missing.

// A test: a failed setup or expectation stops it with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{NamespaceGuard, ip};
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use lwpvmm::vmm::devices::port_bus::{GuestEnd, SerialOut};
use lwpvmm::vmm::devices::virtio::{DiskConfig, NetConfig};
use lwpvmm::vmm::{VmConfig, VmEnd};

/// How much lwpvmm's resident memory may grow while the tap is flooded.
const RSS_GROWTH_BOUND_KIB: u64 = 16 << 10;
const TAP: &str = "lwphostile0";

/// Runs `f` on a thread inside the namespace `ns`.
fn in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> thread::JoinHandle<T> {
    let file = std::fs::File::open(format!("/run/netns/{ns}")).expect("the namespace");
    thread::spawn(move || {
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        f()
    })
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

#[test]
fn malformed_chains_and_a_flooded_tap_leave_lwpvmm_up_and_small() {
    assert!(
        Path::new("/dev/kvm").exists(),
        "this test needs /dev/kvm, which is missing on this machine"
    );
    assert!(
        Path::new("/dev/net/tun").exists(),
        "this test needs /dev/net/tun, which is missing on this machine"
    );
    let name = format!("lwpvmm-hostile-{}", std::process::id());
    let _ = Command::new("ip").args(["netns", "delete", &name]).output();
    ip(&["netns", "add", &name]);
    let ns = NamespaceGuard(name.clone());
    ip(&["-n", &name, "tuntap", "add", "dev", TAP, "mode", "tap"]);
    ip(&["-n", &name, "addr", "add", "172.31.0.1/24", "dev", TAP]);
    ip(&["-n", &name, "link", "set", TAP, "up"]);
    // The guest answers no ARP: name its MAC (lwpvmm's default for the
    // second device) so the flood leaves the host.
    ip(&[
        "-n",
        &name,
        "neigh",
        "add",
        "172.31.0.2",
        "lladdr",
        "02:4c:57:50:00:01",
        "dev",
        TAP,
    ]);

    let disk = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("hostile-disk.img");
    std::fs::write(&disk, vec![0u8; 1 << 20]).expect("disk image");
    let console = Arc::new(Mutex::new(Vec::new()));
    let mut config = VmConfig {
        kernel: lwpvmm::guests::get("virtio_hostile")
            .expect("the guest")
            .to_vec(),
        cmdline: "spin=8000000000".into(),
        memory_mib: 64,
        disks: vec![DiskConfig {
            path: disk,
            read_only: false,
        }],
        nets: vec![NetConfig {
            id: None,
            tap: TAP.into(),
            mac: None,
        }],
        ..VmConfig::default()
    };
    config.host.serial = SerialOut::Capture(Arc::clone(&console));
    let vm = in_netns(&name, move || lwpvmm::vmm::run(&config));

    let text = || String::from_utf8_lossy(&console.lock().unwrap()).into_owned();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !text().contains("# flooding") {
        if vm.is_finished() {
            let outcome = vm.join().expect("the VM thread");
            panic!(
                "the VM ended before the flood ({:?}):\n{}",
                outcome.map(|o| o.end),
                text()
            );
        }
        assert!(
            Instant::now() < deadline,
            "the guest never reached its flood:\n{}",
            text()
        );
        thread::sleep(Duration::from_millis(20));
    }
    let baseline = rss_kib();
    let stop = Arc::new(AtomicBool::new(false));
    let flooding = Arc::clone(&stop);
    let flood = in_netns(&name, move || {
        let socket = UdpSocket::bind("172.31.0.1:0").expect("a UDP socket");
        let payload = [0x42u8; 1400];
        let mut sent = 0u64;
        while !flooding.load(Ordering::Relaxed) {
            if socket.send_to(&payload, "172.31.0.2:9").is_ok() {
                sent += 1;
            }
        }
        sent
    });
    let mut peak = baseline;
    while !vm.is_finished() {
        peak = peak.max(rss_kib());
        thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    let sent = flood.join().expect("the flood");
    let outcome = vm.join().expect("the VM thread").expect("the VM ran");
    drop(ns);
    let console = text();
    assert_eq!(
        outcome.end,
        VmEnd::Guest(GuestEnd::ExitPort(0)),
        "{console}"
    );
    assert!(!console.contains("not ok"), "{console}");
    assert!(sent > 1000, "the flood sent only {sent} datagrams");
    let m = outcome.metrics.device_total;
    assert_eq!(m.net_rx_frames, 0, "no buffer was posted: {m:?}");
    assert!(m.device_errors >= 4, "{m:?}");
    // The disk's errors are its own, not charged to vCPU 0.
    let counters = &outcome.metrics;
    assert_eq!(
        counters.devices[0].device_errors, m.device_errors,
        "{counters:?}"
    );
    assert!(
        peak - baseline < RSS_GROWTH_BOUND_KIB,
        "RSS grew from {baseline} KiB to {peak} KiB while {sent} datagrams flooded the tap"
    );
    println!("RSS {baseline} KiB before, at most {peak} KiB during a flood of {sent} datagrams");
}
