//! Snapshots on real KVM: a deterministic LWP workload snapshotted at an
//! exact point of its own (the snapshot debug port) and restored in a new
//! process ends exactly as an uninterrupted run, precise events included; a
//! corrupted or mismatched snapshot is refused with a clear message and
//! nothing runs. No test waits on a timer: SIGUSR2 is sent once lwpvmm says
//! it is ready.

// A test: a failed setup or expectation stops it with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{lwpvmm, require_kvm};
use lwpvmm::lwp::cpuid::LwpProfile;
use lwpvmm::lwp::unit::LwpUnit;
use lwpvmm::vmm::snapshot::{self, MEMORY_FILE, STATE_FILE};

/// The replay guest's length, and where it asks for a snapshot (a port
/// write, unclaimed without --snapshot-on-port).
const ITERATIONS: &str = "iterations=30000 snap=15000";

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "lwpvmm-snapshot-test-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A scratch directory holding the replay guest, and the guest's path.
fn replay_guest(name: &str) -> (PathBuf, PathBuf) {
    let work = scratch(name);
    let elf = work.join("replay.elf");
    std::fs::write(&elf, lwpvmm::guests::get("replay").unwrap()).unwrap();
    (work, elf)
}

fn digest(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find(|l| l.starts_with("replay digest "))
        .unwrap_or_else(|| {
            panic!(
                "no digest in:\n{text}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
        .to_owned()
}

fn copy_dir(from: &Path, name: &str) -> PathBuf {
    let to = scratch(name);
    for f in [STATE_FILE, MEMORY_FILE] {
        std::fs::copy(from.join(f), to.join(f)).unwrap();
    }
    to
}

/// Restoring `dir` must fail with status 2, `want` in the message, and no
/// guest output.
fn refused(dir: &Path, extra: &[&str], want: &str) {
    let mut args = vec!["restore", dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = lwpvmm(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{want}: {err}");
    assert!(err.contains(want), "`{want}` not in: {err}");
    assert!(
        out.stdout.is_empty(),
        "nothing may run: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn snapshot_restore_and_refusals() {
    let (work, elf) = replay_guest("guest");
    let kernel = elf.to_str().unwrap();

    let plain = lwpvmm(&[
        "run",
        "--kernel",
        kernel,
        "--memory",
        "64",
        "--cmdline",
        ITERATIONS,
    ]);
    assert_eq!(plain.status.code(), Some(1), "{plain:?}");

    let dir = scratch("snap");
    let snap = dir.to_str().unwrap();
    let taken = lwpvmm(&[
        "run",
        "--kernel",
        kernel,
        "--memory",
        "64",
        "--cmdline",
        ITERATIONS,
        "--snapshot-dir",
        snap,
        "--snapshot-on-port",
    ]);
    assert_eq!(taken.status.code(), Some(1), "{taken:?}");
    assert!(dir.join(STATE_FILE).exists(), "the snapshot was taken");
    assert_eq!(
        digest(&taken),
        digest(&plain),
        "taking a snapshot changes nothing"
    );

    let restored = lwpvmm(&["restore", snap, "--lwp", "emulated"]);
    assert_eq!(restored.status.code(), Some(1), "{restored:?}");
    assert_eq!(
        digest(&restored),
        digest(&plain),
        "same records, none lost or duplicated, same MissedEvents"
    );
    let text = String::from_utf8_lossy(&restored.stdout);
    assert!(
        !text.contains("replay: step 0\n") && text.contains("replay: step 15000\n"),
        "the restored run resumed at iteration 15000:\n{text}"
    );
    // The memory file is mapped copy-on-write: the first restore's guest
    // changed nothing of it, so the same snapshot restores again to the
    // same end, also with the whole file checked first.
    for extra in [&[][..], &["--verify"][..]] {
        let mut args = vec!["restore", snap];
        args.extend_from_slice(extra);
        let again = lwpvmm(&args);
        assert_eq!(again.status.code(), Some(1), "{extra:?}: {again:?}");
        assert_eq!(digest(&again), digest(&plain), "{extra:?}: restored twice");
    }
    // Pages of zeros are holes: a 64 MiB guest that touched little takes
    // little disk.
    use std::os::unix::fs::MetadataExt;
    let memory = std::fs::metadata(dir.join(MEMORY_FILE)).unwrap();
    assert_eq!(memory.len(), 64 << 20);
    assert!(
        memory.blocks() * 512 < 16 << 20,
        "{} bytes allocated",
        memory.blocks() * 512
    );

    // A byte of guest memory changed on disk: --verify refuses it before
    // anything runs.
    let bad = copy_dir(&dir, "verify");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(bad.join(MEMORY_FILE))
        .unwrap();
    let mut byte = [0u8; 1];
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut byte, 0x10_0000).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, &[byte[0] ^ 0xff], 0x10_0000).unwrap();
    refused(&bad, &["--verify"], "CRC-64");

    // A payload byte flipped: the checksum catches it.
    let bad = copy_dir(&dir, "crc");
    let mut bytes = std::fs::read(bad.join(STATE_FILE)).unwrap();
    let last = bytes.len() - 3;
    bytes[last] ^= 0x01;
    std::fs::write(bad.join(STATE_FILE), &bytes).unwrap();
    refused(&bad, &[], "corrupt");

    // A newer format version, and older ones this lwpvmm no longer reads
    // (6 had another checksum, 5 was a machine with KVM's PIC, PIT and
    // IOAPIC).
    for (version, want) in [
        (8, "format version 8 is not supported"),
        (6, "versions before 7 use another checksum"),
        (5, "restore it with the lwpvmm that wrote it"),
        (3, "restore it with the lwpvmm that wrote it"),
    ] {
        let bad = copy_dir(&dir, "version");
        let mut bytes = std::fs::read(bad.join(STATE_FILE)).unwrap();
        bytes[8] = version;
        std::fs::write(bad.join(STATE_FILE), &bytes).unwrap();
        refused(&bad, &[], want);
    }

    // The caller expects another profile.
    refused(
        &dir,
        &["--lwp", "bulldozer"],
        "--lwp: snapshot: it was taken with LWP profile `emulated`, not `bulldozer`",
    );

    // The profile edited (with a valid checksum): the CPUID tables no
    // longer match what this host gives that profile.
    let bad = copy_dir(&dir, "profile");
    let mut state = snapshot::read_state(&bad).unwrap();
    state.profile = LwpProfile::Precise;
    snapshot::write_state(&bad, &state).unwrap();
    refused(&bad, &[], "CPUID table differs");

    // The LWP section's LWPCB moved outside guest RAM.
    let bad = copy_dir(&dir, "lwpcb");
    let mut state = snapshot::read_state(&bad).unwrap();
    let caps = LwpProfile::Emulated.caps().unwrap();
    let lwp = state.vcpus[0].lwp.as_mut().expect("LWP section");
    let block = lwp.unit.block.as_mut().expect("LWP was on at the snapshot");
    block.address = 0x7f00_0000_0000;
    lwp.component62 = LwpUnit::from_state(caps, &lwp.unit)
        .unwrap()
        .save_xsave()
        .to_bytes()
        .to_vec();
    snapshot::write_state(&bad, &state).unwrap();
    refused(&bad, &[], "not in guest RAM");

    // The memory file cut short.
    let bad = copy_dir(&dir, "memory");
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(bad.join(MEMORY_FILE))
        .unwrap();
    file.set_len(1 << 20).unwrap();
    refused(&bad, &[], "memory file is corrupt");

    // No snapshot there at all.
    refused(&work, &[], "state.bin");

    for d in [
        "guest", "snap", "crc", "version", "profile", "lwpcb", "memory", "verify",
    ] {
        let _ = std::fs::remove_dir_all(
            std::env::temp_dir().join(format!("lwpvmm-snapshot-test-{}-{d}", std::process::id())),
        );
    }
}

/// Precise events (instructions and branches retired, single-stepped)
/// carry on after a restore: the snapshot holds the #DB-doorbell
/// declaration and where stepping stood, and the restored unit grants them
/// again. The rings of the restored and the uninterrupted run are the same.
#[test]
fn precise_events_survive_a_snapshot() {
    let (work, elf) = replay_guest("precise-guest");
    let kernel = elf.to_str().unwrap();
    for profile in ["precise", "bulldozer"] {
        let run = |extra: &[&str]| {
            let mut args = vec![
                "run", "--kernel", kernel, "--memory", "64", "--lwp", profile,
            ];
            args.extend_from_slice(extra);
            lwpvmm(&args)
        };
        // The same program: the port write at iteration 150 is an unclaimed
        // port without --snapshot-on-port.
        let plain = run(&["--cmdline", "iterations=300 precise=1 snap=150"]);
        assert_eq!(plain.status.code(), Some(1), "{profile}: {plain:?}");
        let dir = scratch(&format!("precise-{profile}"));
        let metrics = work.join(format!("{profile}.json"));
        let taken = run(&[
            "--cmdline",
            "iterations=300 precise=1 snap=150",
            "--snapshot-dir",
            dir.to_str().unwrap(),
            "--snapshot-on-port",
        ]);
        assert_eq!(
            digest(&taken),
            digest(&plain),
            "{profile}: taking it changes nothing"
        );
        let restored = lwpvmm(&[
            "restore",
            dir.to_str().unwrap(),
            "--metrics",
            metrics.to_str().unwrap(),
        ]);
        assert_eq!(restored.status.code(), Some(1), "{profile}: {restored:?}");
        assert_eq!(
            digest(&restored),
            digest(&plain),
            "{profile}: the restored run's ring equals the uninterrupted run's"
        );
        let m: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&metrics).unwrap()).unwrap();
        assert!(
            m["vm"]["steps"].as_u64().unwrap() > 1000,
            "{profile}: the restored run stepped: {m}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }
    let _ = std::fs::remove_dir_all(work);
}

#[test]
fn a_timer_and_sigusr2_take_snapshots_while_running() {
    require_kvm();
    let work = scratch("usr2");
    let elf = work.join("replay.elf");
    std::fs::write(&elf, lwpvmm::guests::get("replay").unwrap()).unwrap();
    let dir = work.join("snap");
    let mut child = common::command()
        .args([
            "run",
            "--kernel",
            elf.to_str().unwrap(),
            "--memory",
            "32",
            "--cmdline",
            "iterations=1000000000",
        ])
        .args(["--snapshot-dir", dir.to_str().unwrap()])
        .args(["--snapshot-after", "1"])
        .env("RUST_LOG", "lwpvmm=info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let _watch = common::watch(&child);
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("ready:") {
        line.clear();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "lwpvmm ended before it was ready"
        );
    }
    let signal = |name: &str| {
        let sent = Command::new("kill")
            .args([name, &child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
    };
    signal("-USR2");
    // Both requests are answered, by two snapshots or, when they arrive
    // together, by one whose line names both.
    let mut answered = [false; 2];
    while answered != [true; 2] {
        line.clear();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "lwpvmm ended before the snapshots (--snapshot-after's and SIGUSR2's)"
        );
        assert!(!line.contains("failed"), "{line}");
        if line.contains("snapshot written") {
            answered[0] |= line.contains("--snapshot-after");
            answered[1] |= line.contains("SIGUSR2");
        }
    }
    signal("-TERM");
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(143), "the VM ran on until SIGTERM");
    let state = snapshot::read_state(&dir).unwrap();
    assert_eq!(state.memory.regions, vec![(0, 32 << 20)]);
    let _ = std::fs::remove_dir_all(work);
}

/// The memory file truncated underneath a restored VM (which maps it):
/// lwpvmm does not die of SIGBUS or report the guest's confusion as its
/// own; it names the truncation and exits with status 2.
#[test]
fn a_memory_file_truncated_underneath_is_named() {
    let (work, elf) = replay_guest("truncated-guest");
    let dir = scratch("truncated");
    let taken = lwpvmm(&[
        "run",
        "--kernel",
        elf.to_str().unwrap(),
        "--memory",
        "256",
        // After the snapshot point the guest writes every page of 192 MiB:
        // about a second of page-ins, long after the truncation below.
        "--cmdline",
        "iterations=20000 snap=10000 touch=192",
        "--snapshot-dir",
        dir.to_str().unwrap(),
        "--snapshot-on-port",
    ]);
    assert_eq!(taken.status.code(), Some(1), "{taken:?}");
    let mut restore = common::command()
        .env("RUST_LOG", "info")
        .args(["restore", dir.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run lwpvmm restore");
    let _watch = common::watch(&restore);
    // Once the VM runs from the mapped file.
    let mut err = String::new();
    let mut lines = BufReader::new(restore.stderr.take().unwrap()).lines();
    for line in lines.by_ref().map_while(Result::ok) {
        err.push_str(&line);
        err.push('\n');
        if line.contains("restored in") {
            break;
        }
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(MEMORY_FILE))
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    for line in lines.map_while(Result::ok) {
        err.push_str(&line);
        err.push('\n');
    }
    let status = restore.wait().unwrap();
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains("was truncated while the VM ran"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&work);
}

/// Diff snapshots: a full one at the first snapshot point, a diff of what
/// the guest (1 MiB it writes, its ring) and lwpvmm (the records it
/// stored) wrote since at the second. Restoring the diff follows the chain
/// to the full one and ends as the uninterrupted run does, twice; the diff
/// takes a fraction of the full one's disk; a parent replaced since is
/// refused.
#[test]
fn diff_snapshots_restore_through_their_chain() {
    let (work, elf) = replay_guest("diff-guest");
    let kernel = elf.to_str().unwrap();
    let cmdline = "iterations=20000 snap=10000 snap2=15000 touch=1";
    let plain = lwpvmm(&[
        "run",
        "--kernel",
        kernel,
        "--memory",
        "64",
        "--cmdline",
        cmdline,
    ]);
    assert_eq!(plain.status.code(), Some(1), "{plain:?}");
    let dir = scratch("diff");
    let taken = lwpvmm(&[
        "run",
        "--kernel",
        kernel,
        "--memory",
        "64",
        "--cmdline",
        cmdline,
        "--snapshot-dir",
        dir.to_str().unwrap(),
        "--snapshot-diff",
        "--snapshot-on-port",
    ]);
    assert_eq!(taken.status.code(), Some(1), "{taken:?}");
    assert_eq!(digest(&taken), digest(&plain));
    let (full, diff) = (dir.join("0"), dir.join("1"));
    let state = snapshot::read_state(&diff).unwrap();
    let parent = state.memory.parent.expect("the second snapshot is a diff");
    assert_eq!(parent.dir, std::path::absolute(&full).unwrap());
    assert!(snapshot::read_state(&full).unwrap().memory.parent.is_none());
    use std::os::unix::fs::MetadataExt;
    let allocated = |d: &Path| std::fs::metadata(d.join(MEMORY_FILE)).unwrap().blocks() * 512;
    assert!(
        allocated(&diff) <= 2 << 20,
        "the diff of 1 MiB written takes {} bytes",
        allocated(&diff)
    );
    for (which, d) in [("diff", &diff), ("diff again", &diff), ("full", &full)] {
        let restored = lwpvmm(&["restore", d.to_str().unwrap()]);
        assert_eq!(restored.status.code(), Some(1), "{which}: {restored:?}");
        assert_eq!(digest(&restored), digest(&plain), "{which}");
    }
    let verified = lwpvmm(&["restore", diff.to_str().unwrap(), "--verify"]);
    assert_eq!(digest(&verified), digest(&plain), "--verify");

    // The full snapshot's state rewritten (another snapshot there): the
    // diff no longer fits on it.
    let mut base = snapshot::read_state(&full).unwrap();
    base.lwpvmm_version.push_str("-edited");
    snapshot::write_state(&full, &base).unwrap();
    refused(&diff, &[], "was replaced since its diff was taken");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&work);
}
