//! lwpvmm in Firecracker's place, as an orchestrator runs it: under the
//! name `firecracker` (a symlink), configured over the API alone as
//! Firecracker's getting-started guide does it with curl, the Linux guest
//! boots and passes its self-test while a host process talks to it over
//! vsock (Firecracker's hybrid design: `CONNECT PORT` on the device's
//! socket one way, the socket's `_PORT` sibling the other); a Full and a
//! Diff snapshot are taken through `/snapshot/create` and the Diff is
//! loaded in a new process through `/snapshot/load`, where the self-test
//! completes and the guest answers over vsock again (its connections were
//! reset, its listener was not). A drive gets a new image after the start
//! (`PATCH /drives`) and the guest sees its new size. The same guest, on a
//! tap and answering over vsock, boots from a
//! `--config-file` with `--no-api`. Misuse before and after the start is
//! answered, and the process goes on; a tap that is not there is refused
//! when it is PUT, a body within Firecracker's default payload size is
//! taken, and a start that fails leaves nothing beside the metrics file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{
    Console, Netns, PROGRAMS, RUN_LIMIT, http, linux, output_within, require_kvm, spawn_within,
    wait_for_path,
};

/// Held by each test that boots the Linux guest: one at a time, each
/// gets the host's cores (two 2-vCPU guests at once on a 2-core host
/// double each one's time).
static LINUX_GUEST: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The self-test's summary line.
const ALL_PASSED: &str = "lwp-linux-selftest: 22 passed, 0 failed";

/// A scratch directory of this test's.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("fc-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// lwpvmm under the name `firecracker`, in `dir`.
fn firecracker(dir: &Path) -> PathBuf {
    let link = dir.join("firecracker");
    std::os::unix::fs::symlink(common::BIN, &link).unwrap();
    link
}

/// The guest's vsock port (/lwp-vsock, `lwpvsock=` on the command line);
/// it says hello to the host on the next one.
const VSOCK_PORT: u32 = 5000;

/// Connects to the guest's vsock port through the device's socket, as
/// Firecracker's hybrid vsock has it, and has it echo `message`. Until the
/// guest listens, its reset closes the connection: tried again every half
/// second for up to `RUN_LIMIT` (the guest's program prints nothing,
/// beside the self-test).
fn vsock_echo(uds: &Path, message: &[u8]) -> Vec<u8> {
    let until = std::time::Instant::now() + RUN_LIMIT;
    let (s, mut reader) = loop {
        let mut s =
            UnixStream::connect(uds).unwrap_or_else(|e| panic!("connect {}: {e}", uds.display()));
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s.write_all(format!("CONNECT {VSOCK_PORT}\n").as_bytes())
            .unwrap();
        let mut reader = BufReader::new(s.try_clone().unwrap());
        let mut line = String::new();
        let _ = reader.read_line(&mut line);
        if line.starts_with("OK ") && line.ends_with('\n') {
            break (s, reader);
        }
        assert!(
            std::time::Instant::now() < until,
            "the guest never accepted a vsock connection on port {VSOCK_PORT}: {line:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let mut s = s;
    s.write_all(b"e").unwrap();
    s.write_all(message).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut echo = Vec::new();
    reader.read_to_end(&mut echo).unwrap();
    echo
}

/// lwpvmm under the name `firecracker` in `dir`, serving only its API
/// socket (returned once it is there).
fn api_only(dir: &Path) -> (common::Bounded, PathBuf) {
    let bin = firecracker(dir);
    let sock = dir.join("firecracker.socket");
    let vm = spawn_within(
        Command::new(&bin).args(["--api-sock", path(&sock)]),
        RUN_LIMIT,
    );
    wait_for_path(&sock, Duration::from_secs(30));
    (vm, sock)
}

/// Sends a request and asserts its status.
fn expect(sock: &Path, method: &str, at: &str, body: &str, status: u16) -> String {
    let (got, answer) = http(sock, method, at, body);
    assert_eq!(got, status, "{method} {at} {body}: {answer}");
    answer
}

#[test]
fn a_linux_guest_boots_snapshots_and_loads_through_firecrackers_api_alone() {
    require_kvm();
    let _one = LINUX_GUEST
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = scratch("api");
    let bin = firecracker(&dir);
    let sock = dir.join("firecracker.socket");
    let log = dir.join("fc.log");
    let metrics = dir.join("metrics.json");
    let (full, diff) = (dir.join("full"), dir.join("diff"));
    let uds = dir.join("v.sock");
    let linux = linux();
    // The host process the guest says hello to: `uds_path_PORT`.
    let hello = UnixListener::bind(dir.join(format!("v.sock_{}", VSOCK_PORT + 1))).unwrap();
    // Waited for at most RUN_LIMIT, so that a guest that never says
    // hello fails the test instead of hanging it.
    hello.set_nonblocking(true).unwrap();
    let hello = std::thread::spawn(move || {
        let until = std::time::Instant::now() + RUN_LIMIT;
        let mut s = loop {
            match hello.accept() {
                Ok((s, _)) => break s,
                Err(_) if std::time::Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return format!("no hello from the guest: {e}"),
            }
        };
        s.set_nonblocking(false).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut said = String::new();
        let _ = s.read_to_string(&mut said);
        said
    });
    let mut vm = spawn_within(
        Command::new(&bin).args(["--api-sock", path(&sock), "--id", "lwp-test"]),
        RUN_LIMIT,
    );
    wait_for_path(&sock, Duration::from_secs(30));

    // Misuse first: each is answered, and the process goes on.
    expect(
        &sock,
        "PUT",
        "/actions",
        r#"{"action_type": "InstanceStart"}"#,
        400,
    );
    expect(
        &sock,
        "PUT",
        "/boot-source",
        r#"{"kernel_image_path": "/no/such/vmlinux"}"#,
        400,
    );
    expect(
        &sock,
        "PUT",
        "/machine-config",
        r#"{"vcpu_count": 2, "mem_size_mib": 64, "bogus": 1}"#,
        400,
    );
    expect(
        &sock,
        "PUT",
        "/vsock",
        r#"{"guest_cid": 1, "uds_path": "/tmp/x.sock"}"#,
        400,
    );
    expect(&sock, "PUT", "/mmds", r#"{}"#, 400);
    expect(&sock, "GET", "/nothing", "", 400);

    // The getting-started sequence.
    let answer = expect(&sock, "GET", "/", "", 200);
    assert!(
        answer.contains("Not started") && answer.contains("lwp-test"),
        "{answer}"
    );
    expect(
        &sock,
        "PUT",
        "/logger",
        &format!(r#"{{"log_path": "{}", "level": "Info"}}"#, path(&log)),
        204,
    );
    expect(
        &sock,
        "PUT",
        "/metrics",
        &format!(r#"{{"metrics_path": "{}"}}"#, path(&metrics)),
        204,
    );
    expect(
        &sock,
        "PUT",
        "/boot-source",
        &format!(
            r#"{{"kernel_image_path": "{}", "initrd_path": "{}", "boot_args": "{} lwpvsock={VSOCK_PORT}"}}"#,
            path(&linux.join("vmlinux")),
            path(&linux.join("initramfs.cpio")),
            lwpvmm::vmm::boot::LINUX_CMDLINE,
        ),
        204,
    );
    expect(
        &sock,
        "PUT",
        "/machine-config",
        r#"{"vcpu_count": 2, "mem_size_mib": 64, "track_dirty_pages": true}"#,
        204,
    );
    expect(
        &sock,
        "PUT",
        "/vsock",
        &format!(r#"{{"guest_cid": 3, "uds_path": "{}"}}"#, path(&uds)),
        204,
    );
    expect(
        &sock,
        "PUT",
        "/drives/rootfs",
        &format!(
            r#"{{"drive_id": "rootfs", "path_on_host": "{}", "is_root_device": true, "is_read_only": true}}"#,
            path(&linux.join("rootfs.ext4"))
        ),
        204,
    );
    expect(
        &sock,
        "PUT",
        "/lwp",
        r#"{"profile": "emulated", "sample_hz": 1000}"#,
        204,
    );
    let config = expect(&sock, "GET", "/vm/config", "", 200);
    assert!(
        config.contains("rootfs.ext4") && config.contains("\"lwp\""),
        "{config}"
    );
    expect(
        &sock,
        "PUT",
        "/actions",
        r#"{"action_type": "InstanceStart"}"#,
        204,
    );
    assert!(expect(&sock, "GET", "/", "", 200).contains("Running"));

    // After the start: configuration is refused, the VM goes on.
    expect(
        &sock,
        "PUT",
        "/boot-source",
        r#"{"kernel_image_path": "/x"}"#,
        400,
    );
    expect(
        &sock,
        "PUT",
        "/actions",
        r#"{"action_type": "InstanceStart"}"#,
        400,
    );
    expect(
        &sock,
        "PUT",
        "/actions",
        r#"{"action_type": "FlushMetrics"}"#,
        204,
    );
    // lwpvmm's own endpoints answer on Firecracker's socket.
    let prometheus = expect(&sock, "GET", "/metrics", "", 200);
    assert!(prometheus.contains("lwpvmm_"), "{prometheus}");
    expect(&sock, "GET", "/debug/pprof/profile?seconds=1", "", 200);
    let flushed = std::fs::read_to_string(&metrics).expect("the metrics file after FlushMetrics");
    assert!(flushed.contains("\"vcpus\""), "{flushed}");

    assert_eq!(
        vsock_echo(&uds, b"over vsock, before the snapshot"),
        b"over vsock, before the snapshot"
    );
    assert_eq!(hello.join().unwrap(), "lwp-vsock: hello from the guest\n");
    // A new image for the root drive, of another size: the guest hears of
    // its capacity through a configuration interrupt (the kernel's line is
    // checked at the end).
    let small = dir.join("small.img");
    std::fs::write(&small, vec![0u8; 1 << 20]).unwrap();
    expect(
        &sock,
        "PATCH",
        "/drives/rootfs",
        &format!(
            r#"{{"drive_id": "rootfs", "path_on_host": "{}"}}"#,
            path(&small)
        ),
        204,
    );

    let midway = format!("ok - {}", PROGRAMS[2]);
    assert!(
        vm.wait_for_lines(&[&midway], Duration::from_secs(240)),
        "the self-test did not reach {midway}:\n{}",
        Console::of(&vm.wait())
    );
    expect(
        &sock,
        "PUT",
        "/snapshot/create",
        &format!(
            r#"{{"snapshot_type": "Full", "snapshot_path": "{}", "mem_file_path": "{}"}}"#,
            path(&full),
            path(&full.join("memory.bin"))
        ),
        204,
    );
    expect(
        &sock,
        "PUT",
        "/snapshot/create",
        &format!(
            r#"{{"snapshot_type": "Diff", "snapshot_path": "{}", "mem_file_path": "{}"}}"#,
            path(&diff),
            path(&diff.join("memory.bin"))
        ),
        204,
    );
    assert!(
        vm.wait_for_lines(&[ALL_PASSED], Duration::from_secs(240)),
        "the self-test did not pass:\n{}",
        Console::of(&vm.wait())
    );
    let out = vm.wait();
    let console = Console::of(&out);
    assert_eq!(out.status.code(), Some(0), "{console}");
    assert!(!console.contains("not ok"), "{console}");
    assert!(
        console.contains("[vda] new size: 2048 512-byte logical blocks"),
        "the guest did not see the drive's new image:\n{console}"
    );
    assert!(!sock.exists(), "the socket is removed at the end");
    assert!(!uds.exists(), "the vsock socket is removed at the end");
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        logged.contains("ready:"),
        "the log file has lwpvmm's lines: {logged}"
    );

    // The Diff, loaded by a new process through the API.
    let sock = dir.join("load.socket");
    let mut restored = spawn_within(
        Command::new(&bin).args(["--api-sock", path(&sock)]),
        RUN_LIMIT,
    );
    wait_for_path(&sock, Duration::from_secs(30));
    expect(
        &sock,
        "PUT",
        "/snapshot/load",
        &format!(
            r#"{{"snapshot_path": "{}", "mem_backend": {{"backend_type": "Uffd", "backend_path": "/tmp/uffd"}}}}"#,
            path(&diff)
        ),
        400,
    );
    expect(
        &sock,
        "PUT",
        "/snapshot/load",
        &format!(
            r#"{{"snapshot_path": "{}", "mem_backend": {{"backend_type": "File", "backend_path": "{}"}}, "resume_vm": true}}"#,
            path(&diff),
            path(&diff.join("memory.bin"))
        ),
        204,
    );
    // The guest's connections were reset by the load; its listener was not.
    assert_eq!(vsock_echo(&uds, b"after the load"), b"after the load");
    assert!(
        restored.wait_for_lines(&[ALL_PASSED], Duration::from_secs(240)),
        "the loaded snapshot did not complete the self-test:\n{}",
        Console::of(&restored.wait())
    );
    let out = restored.wait();
    let after = Console::of(&out);
    assert_eq!(out.status.code(), Some(0), "{after}");
    assert!(
        !after.contains("self-test starting"),
        "the load resumed, not rebooted:\n{after}"
    );
    assert!(!after.contains("not ok"), "{after}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The one-Linux-guest lock, for a test (`what`) that puts its guests on
/// taps: it fails saying why on a machine without KVM or /dev/net/tun.
fn linux_guest_on_taps(what: &str) -> std::sync::MutexGuard<'static, ()> {
    require_kvm();
    let one = LINUX_GUEST
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    assert!(
        Path::new("/dev/net/tun").exists(),
        "{what} puts its guests on taps: it needs /dev/net/tun, which is missing on this machine"
    );
    one
}

#[test]
fn a_config_file_boots_the_guest_without_the_api() {
    let _one = linux_guest_on_taps("the config-file test");
    let dir = scratch("config");
    let linux = linux();
    let config = dir.join("vm.json");
    let metrics = dir.join("metrics.json");
    let uds = dir.join("v.sock");
    // The guest on a tap in a namespace of the test's own, its address
    // from `ip=`, as Firecracker's getting-started guide sets it.
    let ns = Netns::create(&format!("lwpvmm-fc-{}", std::process::id()));
    std::fs::write(
        &config,
        format!(
            r#"{{
  "boot-source": {{"kernel_image_path": "{}", "initrd_path": "{}", "boot_args": "{} ip=172.30.0.2::172.30.0.1:255.255.255.0::eth0:off lwpvsock={VSOCK_PORT}"}},
  "drives": [{{"drive_id": "rootfs", "path_on_host": "{}", "is_root_device": true, "is_read_only": true}}],
  "machine-config": {{"vcpu_count": 2, "mem_size_mib": 64}},
  "network-interfaces": [{{"iface_id": "eth0", "guest_mac": "06:00:ac:10:00:02", "host_dev_name": "lwptap0"}}],
  "vsock": {{"guest_cid": 3, "uds_path": "{}"}},
  "lwp": {{"profile": "emulated"}}
}}"#,
            path(&linux.join("vmlinux")),
            path(&linux.join("initramfs.cpio")),
            lwpvmm::vmm::boot::LINUX_CMDLINE,
            path(&linux.join("rootfs.ext4")),
            path(&uds),
        ),
    )
    .unwrap();
    let run = spawn_within(
        Command::new("ip")
            .args(["netns", "exec", &ns.name, common::BIN])
            .args(["firecracker", "--no-api", "--config-file", path(&config)])
            .args(["--metrics-path", path(&metrics)]),
        RUN_LIMIT,
    );
    // The guest answers over the config file's vsock too.
    wait_for_path(&uds, Duration::from_secs(60));
    assert_eq!(
        vsock_echo(&uds, b"configured by file"),
        b"configured by file"
    );
    let out = run.wait();
    let console = Console::of(&out);
    assert_eq!(out.status.code(), Some(0), "{console}");
    assert!(console.contains(ALL_PASSED), "{console}");
    assert!(console.contains("lwp-linux-selftest: cpus 2"), "{console}");
    assert!(
        console.contains("IP-Config: Complete:")
            && console.contains("hwaddr=06:00:ac:10:00:02, ipaddr=172.30.0.2"),
        "the guest's eth0 is the tap's, with the config file's MAC:\n{console}"
    );
    let written = std::fs::read_to_string(&metrics).expect("--metrics-path is written at the end");
    assert!(written.contains("\"end\""), "{written}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// dud's and husker's sandboxes: one golden snapshot, loaded by many
/// processes at once, each clone on a tap and a vsock socket of its own
/// (`network_overrides`, `vsock_override`), the golden's tap gone.
#[test]
fn clones_of_one_snapshot_get_taps_and_vsock_sockets_of_their_own() {
    let _one = linux_guest_on_taps("the clone test");
    let dir = scratch("clones");
    let linux = linux();
    let bin = firecracker(&dir);
    let ns = Netns::create(&format!("lwpvmm-clone-{}", std::process::id()));
    for tap in ["lwpclone1", "lwpclone2"] {
        let out = Command::new("ip")
            .args(["-n", &ns.name, "tuntap", "add", "dev", tap, "mode", "tap"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{tap}: {out:?}");
    }
    let in_ns = |sock: &Path| {
        let mut c = Command::new("ip");
        c.args([
            "netns",
            "exec",
            &ns.name,
            path(&bin),
            "--api-sock",
            path(sock),
        ]);
        c
    };
    let golden_uds = dir.join("golden.vsock");
    let golden_sock = dir.join("golden.socket");
    let snapshot = dir.join("golden");
    let golden = spawn_within(&mut in_ns(&golden_sock), RUN_LIMIT);
    wait_for_path(&golden_sock, Duration::from_secs(30));
    for (at, body) in [
        (
            "/boot-source",
            format!(
                r#"{{"kernel_image_path": "{}", "initrd_path": "{}", "boot_args": "{} lwpvsock={VSOCK_PORT}"}}"#,
                path(&linux.join("vmlinux")),
                path(&linux.join("initramfs.cpio")),
                lwpvmm::vmm::boot::LINUX_CMDLINE,
            ),
        ),
        (
            "/machine-config",
            r#"{"vcpu_count": 1, "mem_size_mib": 64}"#.into(),
        ),
        (
            "/network-interfaces/eth0",
            r#"{"iface_id": "eth0", "host_dev_name": "lwptap0"}"#.into(),
        ),
        (
            "/vsock",
            format!(r#"{{"guest_cid": 3, "uds_path": "{}"}}"#, path(&golden_uds)),
        ),
        ("/actions", r#"{"action_type": "InstanceStart"}"#.into()),
    ] {
        expect(&golden_sock, "PUT", at, &body, 204);
    }
    assert_eq!(vsock_echo(&golden_uds, b"golden"), b"golden");
    expect(&golden_sock, "PATCH", "/vm", r#"{"state": "Paused"}"#, 204);
    expect(
        &golden_sock,
        "PUT",
        "/snapshot/create",
        &format!(
            r#"{{"snapshot_type": "Full", "snapshot_path": "{}", "mem_file_path": "{}"}}"#,
            path(&snapshot),
            path(&snapshot.join("memory.bin"))
        ),
        204,
    );
    let out = golden.terminate();
    assert_eq!(out.status.code(), Some(143), "{}", Console::of(&out));
    let gone = Command::new("ip")
        .args(["-n", &ns.name, "link", "delete", "lwptap0"])
        .output()
        .unwrap();
    assert!(gone.status.success(), "{gone:?}");

    let load = |overrides: &str| {
        format!(
            r#"{{"snapshot_path": "{}", "mem_backend": {{"backend_type": "File", "backend_path": "{}"}}, "resume_vm": true{overrides}}}"#,
            path(&snapshot),
            path(&snapshot.join("memory.bin"))
        )
    };
    // Without overrides the golden's tap is named, and it is gone.
    let plain_sock = dir.join("plain.socket");
    let plain = spawn_within(&mut in_ns(&plain_sock), RUN_LIMIT);
    wait_for_path(&plain_sock, Duration::from_secs(30));
    let (status, answer) = http(&plain_sock, "PUT", "/snapshot/load", &load(""));
    assert!(
        status >= 400 && answer.contains("lwptap0"),
        "{status} {answer}"
    );
    drop(plain.terminate());

    let clones: Vec<_> = (1..=2)
        .map(|i| {
            let sock = dir.join(format!("clone{i}.socket"));
            let uds = dir.join(format!("clone{i}.vsock"));
            let run = spawn_within(&mut in_ns(&sock), RUN_LIMIT);
            wait_for_path(&sock, Duration::from_secs(30));
            expect(
                &sock,
                "PUT",
                "/snapshot/load",
                &load(&format!(
                    r#", "network_overrides": [{{"iface_id": "eth0", "host_dev_name": "lwpclone{i}"}}], "vsock_override": {{"uds_path": "{}"}}"#,
                    path(&uds)
                )),
                204,
            );
            (run, uds)
        })
        .collect();
    // Both clones run at once, each answering on its own socket.
    for (i, (_, uds)) in clones.iter().enumerate() {
        let message = format!("clone {}", i + 1);
        assert_eq!(vsock_echo(uds, message.as_bytes()), message.as_bytes());
    }
    for (run, uds) in clones {
        let out = run.terminate();
        let console = Console::of(&out);
        assert_eq!(out.status.code(), Some(143), "{console}");
        assert!(
            !uds.exists(),
            "the clone's vsock socket is removed at its end"
        );
    }
    assert!(!golden_uds.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn firecrackers_command_line_is_taken_and_refused_as_firecracker_does() {
    let dir = scratch("args");
    let bin = firecracker(&dir);
    let run = |args: &[&str]| {
        let out = output_within(Command::new(&bin).args(args), RUN_LIMIT);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (status, text) = run(&["--version"]);
    assert_eq!(status, Some(0), "{text}");
    assert!(text.starts_with("Firecracker v1.17.0 (lwpvmm "), "{text}");
    // microheart's flag: taken, and the log says the devices stay MMIO.
    let missing_config = dir.join("vm.json");
    let (status, text) = run(&[
        "--enable-pci",
        "--no-api",
        "--config-file",
        path(&missing_config),
    ]);
    assert_eq!(status, Some(2), "{text}");
    assert!(
        text.contains(
            "--enable-pci: lwpvmm has no PCI transport; the microVM's devices are on virtio-mmio"
        ) && text.contains("--config-file"),
        "{text}"
    );
    let missing = dir.join("missing.json");
    let exists = dir.join("exists.socket");
    std::fs::write(&exists, b"").unwrap();
    // (arguments, the words of the refusal)
    let table: &[(&[&str], &str)] = &[
        (
            &["--api-sok", "x"],
            "Found argument 'api-sok' which wasn't expected",
        ),
        (
            &["--no-api"],
            "Argument 'config-file' required, but not found.",
        ),
        (
            &["--seccomp-filter", "f.bpf"],
            "--seccomp-filter is not offered by lwpvmm",
        ),
        (
            &["--no-api", "--config-file", path(&missing)],
            "--config-file",
        ),
        (&["--api-sock", path(&exists)], "already exists"),
    ];
    for (args, words) in table {
        let (status, text) = run(args);
        assert_eq!(status, Some(2), "{args:?}: {text}");
        assert!(text.contains(words), "{args:?}: {text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_tap_is_refused_when_put_a_large_body_is_taken_and_a_failed_start_leaves_nothing() {
    require_kvm();
    let dir = scratch("failed-start");
    let metrics = dir.join("metrics.json");
    let junk = dir.join("junk.bin");
    std::fs::write(&junk, vec![0x5a; 4096]).unwrap();
    let (_vm, sock) = api_only(&dir);
    let refused = expect(
        &sock,
        "PUT",
        "/network-interfaces/eth0",
        r#"{"iface_id": "eth0", "host_dev_name": "lwpvmm-notap"}"#,
        400,
    );
    assert!(
        refused.contains("no network interface of that name"),
        "{refused}"
    );
    expect(
        &sock,
        "PUT",
        "/metrics",
        &format!(r#"{{"metrics_path": "{}"}}"#, path(&metrics)),
        204,
    );
    // A body past lwpvmm's own 16 KiB, within Firecracker's default
    // --http-api-max-payload-size (51200).
    let long = format!(
        r#"{{"kernel_image_path": "{}", "boot_args": "console=ttyS0 {}"}}"#,
        path(&junk),
        "x".repeat(40_000)
    );
    expect(&sock, "PUT", "/boot-source", &long, 204);
    let too_long = format!(
        r#"{{"kernel_image_path": "{}", "boot_args": "{}"}}"#,
        path(&junk),
        "x".repeat(60_000)
    );
    let refused = expect(&sock, "PUT", "/boot-source", &too_long, 413);
    assert!(refused.contains("larger than 51200 bytes"), "{refused}");
    expect(
        &sock,
        "PUT",
        "/boot-source",
        &format!(
            r#"{{"kernel_image_path": "{}", "boot_args": "console=ttyS0"}}"#,
            path(&junk)
        ),
        204,
    );
    // The start opens the metrics file's directory and fails after it.
    let failed = expect(
        &sock,
        "PUT",
        "/actions",
        r#"{"action_type": "InstanceStart"}"#,
        400,
    );
    assert!(failed.contains("neither an x86-64 ELF"), "{failed}");
    let left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".lwpvmm-part") || name == "metrics.json")
        .collect();
    assert!(left.is_empty(), "a failed start left {left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `PUT /logger` without a level logs at Firecracker's default, Info: every
/// API request as Firecracker's API server logs it, and the boot's
/// milestones (a guest that boots at once and ends: the replay guest).
#[test]
fn the_logger_logs_the_requests_and_the_boot() {
    require_kvm();
    let dir = scratch("logger");
    let log = dir.join("fc.log");
    let kernel = dir.join("replay.elf");
    std::fs::write(&kernel, lwpvmm::guests::get("replay").unwrap()).unwrap();
    let (vm, sock) = api_only(&dir);
    expect(
        &sock,
        "PUT",
        "/logger",
        &format!(r#"{{"log_path": "{}"}}"#, path(&log)),
        204,
    );
    expect(
        &sock,
        "PUT",
        "/boot-source",
        &format!(
            r#"{{"kernel_image_path": "{}", "boot_args": "iterations=1000"}}"#,
            path(&kernel)
        ),
        204,
    );
    expect(
        &sock,
        "PUT",
        "/actions",
        r#"{"action_type": "InstanceStart"}"#,
        204,
    );
    let out = vm.wait();
    assert!(out.status.code().is_some(), "{out:?}");
    let logged = std::fs::read_to_string(&log).unwrap();
    // (`PUT /logger` itself came before the log was there.)
    for line in [
        "The API server received a Put request on \"/boot-source\".",
        "The API server received a Put request on \"/actions\".",
        "ready: 1 vCPU(s) running",
    ] {
        assert!(logged.contains(line), "`{line}` not in the log:\n{logged}");
    }
}

/// What Firecracker's clients send boots our kernel: firecracker-python's
/// own `boot_args` (none of the words this host needs, which lwpvmm adds
/// for our kernel run emulated) and no `boot_args` at all, each with only a
/// root drive and no initrd (Linux runs the drive's /sbin/init).
#[test]
fn a_clients_boot_args_or_none_and_a_root_drive_boot_our_kernel() {
    require_kvm();
    let _one = LINUX_GUEST
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let linux = linux();
    // (the config's boot_args, if any)
    let table = [Some("console=ttyS0 reboot=k panic=1 pci=off"), None];
    for (i, boot_args) in table.into_iter().enumerate() {
        let dir = scratch(&format!("client-args-{i}"));
        let config = dir.join("vm.json");
        let args = boot_args.map_or(String::new(), |a| format!(r#", "boot_args": "{a}""#));
        std::fs::write(
            &config,
            format!(
                r#"{{
  "boot-source": {{"kernel_image_path": "{}"{args}}},
  "drives": [{{"drive_id": "rootfs", "path_on_host": "{}", "is_root_device": true, "is_read_only": true}}],
  "machine-config": {{"vcpu_count": 1, "mem_size_mib": 64}}
}}"#,
                path(&linux.join("vmlinux")),
                path(&linux.join("rootfs.ext4")),
            ),
        )
        .unwrap();
        let out = spawn_within(
            Command::new(common::BIN).args([
                "firecracker",
                "--no-api",
                "--config-file",
                path(&config),
            ]),
            RUN_LIMIT,
        )
        .wait();
        let console = Console::of(&out);
        assert_eq!(out.status.code(), Some(0), "{boot_args:?}: {console}");
        for line in ["Run /sbin/init as init process", ALL_PASSED] {
            assert!(
                console.contains(line),
                "{boot_args:?}: no {line:?}:\n{console}"
            );
        }
    }
}
