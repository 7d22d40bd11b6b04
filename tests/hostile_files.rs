//! Files a user or an API client names, turned against lwpvmm (issue 44, items 2, 3, 4 and 7):
//! a kernel, initrd or drive swapped for a FIFO between `PUT` and `InstanceStart`; snapshot
//! files planted as symbolic links to files elsewhere, or as FIFOs nobody reads; an initramfs
//! that is a device or larger than the guest's RAM. Each is refused or replaced, the API keeps
//! answering, and SIGTERM still ends lwpvmm. Every wait is bounded by `RUN_LIMIT`, so that a
//! regression fails here instead of hanging the suite.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;

use common::{RUN_LIMIT, http, require_kvm, wait_for_path};
use lwpvmm::vmm::snapshot::{self, MEMORY_FILE, STATE_FILE};

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("hostile-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

fn mkfifo(p: &Path) {
    let made = Command::new("mkfifo").arg(p).status().unwrap();
    assert!(made.success(), "mkfifo {}", p.display());
}

/// An HTTP request that must be answered within `RUN_LIMIT`: a hung API
/// fails the test with `what` instead of hanging it.
fn answered(sock: &Path, method: &str, at: &str, body: &str, what: &str) -> (u16, String) {
    let (sock, method, at, body) = (
        sock.to_owned(),
        method.to_owned(),
        at.to_owned(),
        body.to_owned(),
    );
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(http(&sock, &method, &at, &body));
    });
    rx.recv_timeout(RUN_LIMIT)
        .unwrap_or_else(|_| panic!("{what}: no answer within {RUN_LIMIT:?}"))
}

/// lwpvmm under Firecracker's command line, serving `sock`.
struct Api {
    child: Child,
    sock: PathBuf,
    _watch: common::Watchdog,
}

impl Api {
    fn start(dir: &Path) -> Api {
        let sock = dir.join("api.sock");
        let child = Command::new(common::BIN)
            .args(["firecracker", "--api-sock", path(&sock)])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let watch = common::watch(&child);
        wait_for_path(&sock, RUN_LIMIT);
        Api {
            child,
            sock,
            _watch: watch,
        }
    }

    fn request(&self, method: &str, at: &str, body: &str, what: &str) -> (u16, String) {
        answered(&self.sock, method, at, body, what)
    }

    /// SIGTERM, then the exit status, within `RUN_LIMIT` (the watchdog's).
    fn terminate(mut self) -> Option<i32> {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        self.child.wait().unwrap().code()
    }
}

/// The replay guest, an ELF lwpvmm boots directly, running for as long as
/// the test needs.
fn guest(dir: &Path) -> PathBuf {
    let elf = dir.join("replay.elf");
    std::fs::write(&elf, lwpvmm::guests::get("replay").unwrap()).unwrap();
    elf
}

const LONG_RUN: &str = "iterations=1000000000";

/// The request that names a file, from the kernel's path and another file's:
/// (the endpoint, its body).
type PutFor = fn(&Path, &Path) -> (&'static str, String);

/// Plants something at a path (the first), pointing at a file elsewhere
/// (the second) where it is a link.
type Plant = fn(&Path, &Path);

#[test]
fn a_file_swapped_for_a_fifo_after_put_is_refused_at_instance_start() {
    require_kvm();
    // (the file swapped, the PUT that names it)
    let table: [(&str, PutFor); 3] = [
        ("kernel", |kernel, _| {
            (
                "/boot-source",
                format!(r#"{{"kernel_image_path": "{}"}}"#, path(kernel)),
            )
        }),
        ("initrd", |kernel, initrd| {
            (
                "/boot-source",
                format!(
                    r#"{{"kernel_image_path": "{}", "initrd_path": "{}", "boot_args": "{LONG_RUN}"}}"#,
                    path(kernel),
                    path(initrd)
                ),
            )
        }),
        ("drive", |_, drive| {
            (
                "/drives/data",
                format!(
                    r#"{{"drive_id": "data", "path_on_host": "{}", "is_root_device": false, "is_read_only": true}}"#,
                    path(drive)
                ),
            )
        }),
    ];
    for (swapped, put) in table {
        let dir = scratch(&format!("fifo-{swapped}"));
        let kernel = guest(&dir);
        let other = dir.join("other.img");
        std::fs::write(&other, vec![0u8; 4096]).unwrap();
        let api = Api::start(&dir);
        if swapped == "drive" {
            let body = format!(
                r#"{{"kernel_image_path": "{}", "boot_args": "{LONG_RUN}"}}"#,
                path(&kernel)
            );
            assert_eq!(api.request("PUT", "/boot-source", &body, "boot").0, 204);
        }
        let (at, body) = put(&kernel, &other);
        let (status, answer) = api.request("PUT", at, &body, swapped);
        assert_eq!(status, 204, "{swapped}: {answer}");
        let victim = if swapped == "kernel" { &kernel } else { &other };
        std::fs::remove_file(victim).unwrap();
        mkfifo(victim);
        let (status, answer) = api.request(
            "PUT",
            "/actions",
            r#"{"action_type": "InstanceStart"}"#,
            &format!("InstanceStart with the {swapped} a FIFO"),
        );
        assert_eq!(status, 400, "{swapped}: {answer}");
        assert!(
            answer.contains("is a FIFO, not a regular file") && answer.contains(path(victim)),
            "{swapped}: {answer}"
        );
        let (status, answer) = api.request("GET", "/", "", "GET / after the refusal");
        assert_eq!(status, 200, "{answer}");
        assert!(answer.contains("Not started"), "{answer}");
        assert_eq!(api.terminate(), Some(143), "{swapped}: SIGTERM ends lwpvmm");
    }
}

#[test]
fn snapshot_files_planted_as_links_or_fifos_are_replaced_not_followed() {
    require_kvm();
    let dir = scratch("snapshot-plants");
    let kernel = guest(&dir);
    let api = Api::start(&dir);
    let boot = format!(
        r#"{{"kernel_image_path": "{}", "boot_args": "{LONG_RUN}"}}"#,
        path(&kernel)
    );
    assert_eq!(api.request("PUT", "/boot-source", &boot, "boot").0, 204);
    let (status, answer) = api.request(
        "PUT",
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 32}"#,
        "machine",
    );
    assert_eq!(status, 204, "{answer}");
    let start = r#"{"action_type": "InstanceStart"}"#;
    let (status, answer) = api.request("PUT", "/actions", start, "InstanceStart");
    assert_eq!(status, 204, "{answer}");

    // Item 3: both files links to files elsewhere, which must keep their
    // bytes; item 4: both FIFOs with no reader, which must not stall the
    // snapshot or the API.
    let victims = dir.join("elsewhere");
    std::fs::create_dir_all(&victims).unwrap();
    let plants: [(&str, Plant); 2] = [
        ("links", |at, victim| {
            std::fs::write(victim, b"not lwpvmm's to write").unwrap();
            std::os::unix::fs::symlink(victim, at).unwrap();
        }),
        ("fifos", |at, _| mkfifo(at)),
    ];
    for (kind, plant) in plants {
        let snap = dir.join(kind);
        std::fs::create_dir_all(&snap).unwrap();
        for name in [STATE_FILE, MEMORY_FILE] {
            plant(&snap.join(name), &victims.join(format!("{kind}-{name}")));
        }
        let body = format!(
            r#"{{"snapshot_type": "Full", "snapshot_path": "{}", "mem_file_path": "{}"}}"#,
            path(&snap),
            path(&snap.join(MEMORY_FILE))
        );
        let (status, answer) = api.request(
            "PUT",
            "/snapshot/create",
            &body,
            &format!("a snapshot over {kind}"),
        );
        assert_eq!(status, 204, "{kind}: {answer}");
        for name in [STATE_FILE, MEMORY_FILE] {
            let meta = std::fs::symlink_metadata(snap.join(name)).unwrap();
            assert!(
                meta.is_file(),
                "{kind}: {name} is now the snapshot's own file"
            );
            let victim = victims.join(format!("{kind}-{name}"));
            if victim.exists() {
                assert_eq!(
                    std::fs::read(&victim).unwrap(),
                    b"not lwpvmm's to write",
                    "{kind}: the file {name} pointed at is untouched"
                );
            }
        }
        let state = snapshot::read_state(&snap).unwrap();
        assert_eq!(state.memory.regions, vec![(0, 32 << 20)], "{kind}");
        let left: Vec<_> = std::fs::read_dir(&snap)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.contains("part"))
            .collect();
        assert!(left.is_empty(), "{kind}: {left:?}");
        let (status, _) = api.request("GET", "/", "", "GET / after the snapshot");
        assert_eq!(status, 200);
    }
    assert_eq!(api.terminate(), Some(143), "SIGTERM ends lwpvmm");
}

#[test]
fn an_initramfs_is_a_regular_file_that_fits_the_guests_ram() {
    require_kvm();
    let dir = scratch("initramfs");
    let kernel = guest(&dir);
    let big = dir.join("big.cpio");
    // Sparse: 4 GiB that cost no disk, and would cost 4 GiB of memory if
    // lwpvmm read them.
    std::fs::File::create(&big)
        .unwrap()
        .set_len(4 << 30)
        .unwrap();
    // (initramfs, --memory, what the error says)
    let table = [
        (
            Path::new("/dev/zero"),
            "64",
            "/dev/zero is a character device, not a regular file".to_owned(),
        ),
        (
            big.as_path(),
            "64",
            format!(
                "{} is 4294967296 bytes, more than 67108864 bytes (the guest's RAM",
                big.display()
            ),
        ),
    ];
    for (initramfs, memory, want) in table {
        let out = common::output_within(
            Command::new(common::BIN).args([
                "run",
                "--kernel",
                path(&kernel),
                "--initramfs",
                path(initramfs),
                "--memory",
                memory,
            ]),
            RUN_LIMIT,
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {err}", initramfs.display());
        assert!(err.contains(&want), "`{want}` not in: {err}");
    }
}
