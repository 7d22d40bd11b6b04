//! The virtio devices with the Linux guest of resources/linux: the self-test
//! booted from `rootfs.ext4` leaves its result on the image (checked with
//! e2fsck and debugfs), a snapshot taken while the guest writes a disk
//! restores and the data it wrote checks out, a read-only disk refuses the
//! guest's writes and stays byte-identical, a guest on a tap answers TCP
//! from the host, and the entropy device seeds the guest's CRNG before
//! userspace.
//!
//! These tests need /dev/kvm, e2fsprogs, and for the network test the
//! rights to create a network namespace and a tap (root); each fails with a
//! message saying what is missing.

// A test: a failed setup or expectation stops it with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{Console, Netns, RUN_LIMIT, linux, output_within, require_kvm, spawn_within};
use lwpvmm::vmm::boot::disk_cmdline;

/// A scratch directory of this test's own.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("create a scratch directory");
    dir
}

/// A fresh copy of the root image in `dir`.
fn root_copy(dir: &Path) -> PathBuf {
    let root = dir.join("rootfs.ext4");
    fs::copy(linux().join("rootfs.ext4"), &root).expect("copy rootfs.ext4");
    root
}

fn path(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// Runs `lwpvmm run` on the guest kernel with `args`.
fn linux_with(prefix: &[&str], args: &[&str]) -> (Output, Console) {
    require_kvm();
    let kernel = linux().join("vmlinux");
    let mut command = match prefix.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(common::BIN);
            c
        }
        None => common::command(),
    };
    let out = output_within(
        command
            .args(["run", "--kernel", path(&kernel), "--memory", "64"])
            .args(args),
        RUN_LIMIT,
    );
    let console = Console::of(&out);
    (out, console)
}

/// Runs an e2fsprogs tool; its status and output.
fn e2fs(tool: &str, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(tool)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{tool} (e2fsprogs) is needed: {e}"));
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), text)
}

fn debugfs_cat(image: &Path, file: &str) -> String {
    e2fs("debugfs", &["-R", &format!("cat {file}"), path(image)]).1
}

/// The self-test on one vCPU, booted from a fresh copy of the root image by
/// the default command line: it passes, and the image, checked by e2fsck
/// after lwpvmm exits, holds `/lwp-selftest.result` with the console's boot
/// ID and summary, flushed there (the metrics count the flushes).
#[test]
fn the_selftest_booted_from_a_disk_passes_and_leaves_its_result_on_it() {
    let dir = scratch("disk-boot");
    let root = root_copy(&dir);
    assert!(
        !debugfs_cat(&root, "/lwp-selftest.result").contains("lwp-linux-selftest"),
        "a fresh image has no result"
    );
    let metrics = dir.join("metrics.json");
    let (out, console) = linux_with(&[], &["--disk", path(&root), "--metrics", path(&metrics)]);
    assert_eq!(out.status.code(), Some(0), "{console}");
    assert!(
        console.contains("virtio_mmio.device=4K@0xd0000000:5"),
        "{console}"
    );
    assert!(
        console.contains("VFS: Mounted root (ext4 filesystem)"),
        "{console}"
    );
    for line in [
        "lwp-linux-selftest: cpus 1",
        "lwp-linux-selftest: 22 passed, 0 failed",
        "lwp-linux-selftest: result written to /lwp-selftest.result",
    ] {
        assert!(console.contains(line), "missing {line:?}:\n{console}");
    }
    assert!(!console.contains("not ok"), "{console}");
    let boot_line = console
        .lines()
        .find(|l| l.starts_with("lwp-linux-selftest: boot-id "))
        .unwrap_or_else(|| panic!("no boot-id line:\n{console}"));

    let checked = dir.join("checked.ext4");
    fs::copy(&root, &checked).expect("copy the image");
    let (status, text) = e2fs("e2fsck", &["-fy", path(&checked)]);
    assert!(matches!(status, Some(0 | 1)), "e2fsck -fy: {text}");
    let (status, text) = e2fs("e2fsck", &["-fn", path(&checked)]);
    assert_eq!(status, Some(0), "e2fsck -fn: {text}");
    let result = debugfs_cat(&checked, "/lwp-selftest.result");
    assert!(
        result.contains(boot_line),
        "{boot_line:?} not in {result:?}"
    );
    assert!(
        result.contains("lwp-linux-selftest: 22 passed, 0 failed"),
        "{result:?}"
    );
    let doc: serde_json::Value =
        serde_json::from_slice(&fs::read(&metrics).expect("the metrics")).expect("JSON");
    assert!(doc["vm"]["disk_flushes"].as_u64() > Some(0), "{doc}");
    assert_eq!(doc["vm"]["device_errors"].as_u64(), Some(0), "{doc}");
}

/// A command line without `init=`, as a Firecracker client's usually is:
/// Linux runs `/sbin/init` of the root disk, which is the self-test.
#[test]
fn a_root_disk_boots_without_init_on_the_command_line() {
    let dir = scratch("disk-sbin-init");
    let root = root_copy(&dir);
    let cmdline = format!("{} root=/dev/vda rw", lwpvmm::vmm::boot::LINUX_CMDLINE);
    assert!(!cmdline.contains(" init="));
    let (out, console) = linux_with(&[], &["--disk", path(&root), "--cmdline", &cmdline]);
    assert_eq!(out.status.code(), Some(0), "{console}");
    for line in [
        "Run /sbin/init as init process",
        "lwp-linux-selftest: 22 passed, 0 failed",
    ] {
        assert!(console.contains(line), "missing {line:?}:\n{console}");
    }
}

/// /lwp-disk writes a pattern to a second disk and hits the snapshot port
/// halfway, with the guest's writeback under way; a third disk is attached
/// read-only. The run completes; then the second half of the data disk is
/// zeroed and the snapshot restored: the guest writes that half again and
/// reads everything back with the checksum it computed. The read-only
/// image is byte-identical after both runs.
#[test]
fn a_snapshot_taken_during_disk_io_restores_and_a_read_only_disk_refuses_writes() {
    let dir = scratch("disk-snapshot");
    let root = root_copy(&dir);
    let data = dir.join("data.img");
    let ro = dir.join("ro.img");
    fs::write(&data, vec![0u8; 4 << 20]).expect("data image");
    let ro_bytes: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    fs::write(&ro, &ro_bytes).expect("read-only image");
    let snap = dir.join("snapshot");
    let cmdline = format!("{} lwpdisk=check,ro", disk_cmdline(false));
    let ro_arg = format!("{},ro", path(&ro));
    let (out, console) = linux_with(
        &[],
        &[
            "--disk",
            path(&root),
            "--disk",
            path(&data),
            "--disk",
            &ro_arg,
            "--cmdline",
            &cmdline,
            "--snapshot-dir",
            path(&snap),
            "--snapshot-on-port",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{console}");
    for line in [
        "lwp-disk: snapshot point at 2048 KiB",
        "lwp-disk: write to the read-only disk failed",
        "lwp-disk: done",
    ] {
        assert!(console.contains(line), "missing {line:?}:\n{console}");
    }
    let matched = |console: &str| {
        console
            .lines()
            .any(|l| l.starts_with("lwp-disk: wrote 4096 KiB") && l.ends_with(": match"))
    };
    assert!(matched(&console), "{console}");
    assert!(snap.join("state.bin").exists(), "{console}");

    let mut image = fs::read(&data).expect("data image");
    image[2 << 20..].fill(0);
    fs::write(&data, &image).expect("zero the second half");
    let out = output_within(common::command().args(["restore", path(&snap)]), RUN_LIMIT);
    let restored = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{restored}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        restored.contains("lwp-disk: after the snapshot point"),
        "{restored}"
    );
    assert!(matched(&restored), "{restored}");
    assert_eq!(fs::read(&ro).expect("read-only image"), ro_bytes);
}

/// A guest with `ip=` on a tap the test creates in a network namespace of
/// its own answers a TCP connection from the host: the host sends a
/// message, shuts its side down, and the guest says how many bytes it got.
#[test]
fn a_guest_on_a_tap_answers_tcp_from_the_host() {
    require_kvm();
    assert!(
        Path::new("/dev/net/tun").exists(),
        "the network test needs /dev/net/tun, which is missing on this machine"
    );
    let dir = scratch("net");
    let root = root_copy(&dir);
    let ns = Netns::create(&format!("lwpvmm-test-{}", std::process::id()));
    let cmdline = format!(
        "{} ip=172.30.0.2::172.30.0.1:255.255.255.0::eth0:off lwpnet=7777",
        disk_cmdline(false)
    );
    let kernel = linux().join("vmlinux");
    let child = spawn_within(
        Command::new("ip")
            .args(["netns", "exec", &ns.name, common::BIN])
            .args(["run", "--kernel", path(&kernel), "--memory", "64"])
            .args(["--disk", path(&root), "--net", "tap=lwptap0"])
            .args(["--cmdline", &cmdline]),
        RUN_LIMIT,
    );
    let mut stream = match ns.connect("172.30.0.2:7777", Instant::now() + Duration::from_secs(240))
    {
        Ok(stream) => stream,
        Err(e) => panic!(
            "no answer from the guest: {e}\n{}",
            Console::of(&child.wait())
        ),
    };
    let message = b"lwpvmm network test: hello, guest";
    stream.write_all(message).expect("send");
    stream.shutdown(Shutdown::Write).expect("shutdown");
    let mut reply = String::new();
    stream
        .read_to_string(&mut reply)
        .expect("the guest's reply");
    let out = child.wait();
    let console = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        reply,
        format!("lwp-net: received {} bytes\n", message.len()),
        "{console}"
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{console}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        console.contains("lwp-net: listening on port 7777"),
        "{console}"
    );
}

/// The entropy device (`--entropy`, Firecracker's `PUT /entropy`): the
/// guest's CRNG is seeded from it before userspace (the kernel's `random:
/// crng init done` comes before `Run /init`), and its counters say what it
/// gave. With
/// `--entropy=64` the guest gets no more than the limit lets through: the
/// bucket's 64 bytes and 64 a second for as long as the run took (its CRNG
/// is then ready when the limit has let enough through, which may be after
/// userspace starts).
#[test]
fn an_entropy_device_seeds_the_guests_crng_before_userspace() {
    let dir = scratch("entropy");
    let initramfs = linux().join("initramfs.cpio");
    // (--entropy's argument, whether the limit is checked)
    for (arg, limited) in [("--entropy", false), ("--entropy=64", true)] {
        let metrics = dir.join("metrics.json");
        let started = Instant::now();
        let (out, console) = linux_with(
            &[],
            &[
                "--initramfs",
                path(&initramfs),
                arg,
                "--metrics",
                path(&metrics),
            ],
        );
        let took = started.elapsed();
        assert_eq!(out.status.code(), Some(0), "{arg}: {console}");
        assert!(
            console.contains("lwp-linux-selftest: 22 passed, 0 failed"),
            "{arg}: {console}"
        );
        let seeded = console.find("random: crng init done");
        let userspace = console.find("Run /init as init process");
        assert!(
            limited || (seeded.is_some() && seeded < userspace),
            "{arg}: the CRNG was not ready before userspace:\n{console}"
        );
        let doc: serde_json::Value =
            serde_json::from_slice(&fs::read(&metrics).expect("the metrics")).expect("JSON");
        let bytes = doc["vm"]["entropy_bytes"].as_u64().unwrap_or(0);
        assert!(bytes > 0, "{arg}: {doc}");
        assert_eq!(doc["vm"]["device_errors"].as_u64(), Some(0), "{doc}");
        if limited {
            let most = 64 + 64 * (took.as_secs() + 1);
            assert!(
                bytes <= most,
                "{arg}: {bytes} bytes in {took:?}, more than the limit's {most}"
            );
        }
    }
}
