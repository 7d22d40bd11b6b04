//! The control API as a user drives it: lwpvmm runs a guest that would
//! loop for minutes, with `--api-sock` and `--api-listen`; the test pauses,
//! resumes, snapshots, reads the metrics and stops it over HTTP, sends
//! what no client should (malformed, oversized, a client that leaves
//! without its answer), checks the TCP listener refuses control endpoints,
//! and that a second lwpvmm refuses the same socket path.

// A test: a failed setup or expectation stops it with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// lwpvmm, killed if the test ends without stopping it.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends `raw` on the Unix socket and returns (status, body).
fn unix(sock: &Path, raw: &str) -> (u16, String) {
    let mut s = UnixStream::connect(sock).expect("connect to the API socket");
    exchange(&mut s, raw.as_bytes())
}

fn tcp(addr: SocketAddr, raw: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect to --api-listen");
    exchange(&mut s, raw.as_bytes())
}

fn exchange(s: &mut (impl Read + Write), raw: &[u8]) -> (u16, String) {
    let (status, body) = exchange_bytes(s, raw);
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// As [`exchange`], for a binary body (a profile).
fn exchange_bytes(s: &mut (impl Read + Write), raw: &[u8]) -> (u16, Vec<u8>) {
    s.write_all(raw).unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).unwrap();
    let status = std::str::from_utf8(answer.get(9..12).unwrap_or_default())
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {:?}", String::from_utf8_lossy(&answer)));
    let body = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(Vec::new(), |at| answer[at + 4..].to_vec());
    (status, body)
}

/// The CNH samples of a gzipped pprof profile, and its comments.
fn cpu_clocks(gzipped: &[u8]) -> (i64, Vec<String>) {
    let p = lwpvmm::profile::pprof::read(gzipped).expect("a gzipped pprof profile");
    let slot = p
        .sample_type
        .iter()
        .position(|t| p.string_table[t.r#type as usize] == "cpu_clocks");
    let samples = slot.map_or(0, |i| p.sample.iter().map(|s| s.value[i]).sum());
    let comments = p
        .comment
        .iter()
        .map(|&c| p.string_table[c as usize].clone())
        .collect();
    (samples, comments)
}

/// What `GET /capture` says.
fn capture_status(sock: &Path) -> serde_json::Value {
    let (status, body) = unix(sock, &get("/capture"));
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: lwpvmm\r\n\r\n")
}

fn with_body(method: &str, path: &str, body: &str) -> String {
    format!(
        "{method} {path} HTTP/1.1\r\nHost: lwpvmm\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// The sampler's kicks so far: the guest arms CNH, so a running vCPU is
/// kicked a thousand times a second and a paused one never.
fn kicks(sock: &Path) -> u64 {
    let (status, body) = unix(sock, &get("/vm/metrics"));
    assert_eq!(status, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    json["sampler_kicks"].as_u64().expect("sampler_kicks")
}

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// The throughput guest looping for minutes under lwpvmm with both
/// listeners, in `dir`; returns it once its socket answers, and its
/// arguments (for a second lwpvmm on the same socket).
fn start_vm(dir: &Path) -> (Running, PathBuf, SocketAddr, Vec<String>) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let guest = dir.join("throughput.elf");
    std::fs::write(&guest, lwpvmm::guests::get("throughput").unwrap()).unwrap();
    let (sock, listen) = (dir.join("api.sock"), free_port());
    let args = vec![
        "run".to_owned(),
        "--kernel".into(),
        guest.display().to_string(),
        "--cmdline".into(),
        "lwp=1 work=1000000000000".into(),
        "--api-sock".into(),
        sock.display().to_string(),
        "--api-listen".into(),
        listen.to_string(),
    ];
    let mut vm = Running(
        common::command()
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run lwpvmm"),
    );
    let _watch = common::watch(&vm.0);
    let started = Instant::now();
    while UnixStream::connect(&sock).is_err() {
        assert!(
            vm.0.try_wait().unwrap().is_none(),
            "lwpvmm ended before its API socket answered"
        );
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no API socket after 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (vm, sock, listen, args)
}

/// What Prometheus's own checker says of `/metrics` (Debian's
/// `prometheus` package ships `promtool`): nothing, for every series.
#[test]
fn promtool_finds_nothing_to_fix_in_the_metrics() {
    common::require_kvm();
    let promtool = Command::new("promtool").arg("--version").output();
    assert!(
        promtool.is_ok_and(|o| o.status.success()),
        "this test checks /metrics with promtool: apt-get install prometheus"
    );
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("api-promtool-{}", std::process::id()));
    let (_vm, sock, _, _) = start_vm(&dir);
    let (status, text) = unix(&sock, &get("/metrics"));
    assert_eq!(status, 200, "{text}");
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    check
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = check.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {}{}\non:\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("lwpvmm_sampler_seconds_total{vcpu=\"0\"} "),
        "{text}"
    );
}

#[test]
fn the_api_drives_a_running_vm_and_refuses_what_it_must() {
    common::require_kvm();
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("api-{}", std::process::id()));
    let (mut vm, sock, listen, args) = start_vm(&dir);
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the socket is owner-only");

    let (status, body) = unix(&sock, &get("/"));
    assert_eq!(
        (status, body.contains("\"Running\"")),
        (200, true),
        "{body}"
    );

    // Paused, the guest is not kicked; resumed, it is again.
    let pause = with_body("PATCH", "/vm", r#"{"state": "Paused"}"#);
    assert_eq!(unix(&sock, &pause).0, 204);
    assert!(unix(&sock, &get("/")).1.contains("\"Paused\""));
    let before = kicks(&sock);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(kicks(&sock), before, "a paused VM was kicked");
    let resume = with_body("PATCH", "/vm", r#"{"state": "Resumed"}"#);
    assert_eq!(unix(&sock, &resume).0, 204);

    let snap = dir.join("snap");
    let body = format!(r#"{{"snapshot_path": "{}"}}"#, snap.display());
    let (status, answer) = unix(&sock, &with_body("PUT", "/snapshot/create", &body));
    assert_eq!(status, 200, "{answer}");
    assert!(snap.join("state.bin").exists() && snap.join("memory.bin").exists());

    // What no client should send: each refused with its 4xx, the VM runs on.
    let oversized = format!(
        "PUT /snapshot/create HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
        1 << 20
    );
    let long_head = format!("GET /{} HTTP/1.1\r\n\r\n", "x".repeat(10_000));
    let refusals: [(&str, u16, &str); 6] = [
        ("NOT HTTP\r\n\r\n", 400, "malformed"),
        (&oversized, 413, "larger than"),
        (&long_head, 431, "larger than"),
        (&with_body("PATCH", "/vm", "{"), 400, "send e.g."),
        (&get("/nothing"), 404, "there are"),
        (&get("/actions"), 405, "takes PUT"),
    ];
    for (raw, want, text) in refusals {
        let (status, body) = unix(&sock, raw);
        assert_eq!(status, want, "{raw:.40}: {body}");
        assert!(body.contains(text), "{raw:.40}: {body}");
    }
    // A client that leaves before its answer, and one that never finishes.
    for raw in [get("/vm/metrics"), "GET / HTTP/1.1\r\n".to_owned()] {
        let mut s = UnixStream::connect(&sock).unwrap();
        s.write_all(raw.as_bytes()).unwrap();
        drop(s);
    }
    let running = kicks(&sock);
    std::thread::sleep(Duration::from_millis(200));
    assert!(kicks(&sock) > running, "the VM runs on");

    // TCP: the metrics, nothing else.
    let (status, body) = tcp(listen, &get("/metrics"));
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("# TYPE lwpvmm_exits_io_total counter"),
        "{body}"
    );
    assert!(
        body.contains("lwpvmm_exits_io_total{vcpu=\"0\"} "),
        "{body}"
    );
    for raw in [
        &pause,
        &with_body("PUT", "/actions", r#"{"action_type": "Stop"}"#),
    ] {
        assert_eq!(tcp(listen, raw).0, 403);
    }

    // The host-side capture at run time: the sampler's rate, a started
    // and stopped capture, pprof over either listener, a pprof client that
    // leaves, and /metrics answered while a capture runs.
    assert_eq!(capture_status(&sock)["sample_hz"], 1000);
    let rate = |hz: u32| with_body("PATCH", "/capture", &format!(r#"{{"sample_hz": {hz}}}"#));
    assert_eq!(unix(&sock, &rate(0)).0, 204);
    std::thread::sleep(Duration::from_millis(50));
    let stopped = kicks(&sock);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(kicks(&sock), stopped, "the sampler at 0 Hz kicked");
    assert_eq!(unix(&sock, &rate(1000)).0, 204);
    std::thread::sleep(Duration::from_millis(300));
    assert!(kicks(&sock) > stopped, "the sampler resumed");
    assert_eq!(unix(&sock, &with_body("PUT", "/capture/start", "")).0, 204);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(capture_status(&sock)["started"].as_u64() > Some(0));
    let mut s = UnixStream::connect(&sock).unwrap();
    let (status, profile) =
        exchange_bytes(&mut s, with_body("PUT", "/capture/stop", "").as_bytes());
    assert_eq!(status, 200);
    let (samples, comments) = cpu_clocks(&profile);
    assert!(samples > 0, "no CNH samples in 1.5 s: {comments:?}");
    assert!(
        comments.iter().any(|c| c.contains("control API")),
        "{comments:?}"
    );
    let pprof = |seconds: &str| get(&format!("/debug/pprof/profile?seconds={seconds}"));
    let over_tcp = std::thread::spawn({
        let raw = pprof("2");
        move || exchange_bytes(&mut TcpStream::connect(listen).unwrap(), raw.as_bytes())
    });
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(tcp(listen, &get("/metrics")).0, 200);
    assert!(
        !over_tcp.is_finished(),
        "the metrics waited for the capture to end"
    );
    let (status, profile) = over_tcp.join().unwrap();
    assert_eq!(status, 200);
    assert!(cpu_clocks(&profile).0 > 0, "no CNH samples in 2 s");
    for bad in ["0", "301", "x"] {
        let (status, body) = unix(&sock, &pprof(bad));
        assert_eq!(status, 400, "{bad}: {body}");
    }
    let mut leaving = UnixStream::connect(&sock).unwrap();
    leaving.write_all(pprof("60").as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(capture_status(&sock)["running"], 1);
    drop(leaving);
    let left = Instant::now();
    while capture_status(&sock)["running"] != 0 {
        assert!(
            left.elapsed() < Duration::from_secs(5),
            "a client that left still has its capture"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // A second lwpvmm may not take the socket.
    let second = common::output_within(common::command().args(&args), common::RUN_LIMIT);
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("already exists"), "{stderr}");

    let stop = with_body("PUT", "/actions", r#"{"action_type": "Stop"}"#);
    assert_eq!(unix(&sock, &stop).0, 204);
    let end = Instant::now();
    let status = loop {
        if let Some(status) = vm.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            end.elapsed() < Duration::from_secs(30),
            "still running 30 s after Stop"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    vm.0.stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(!sock.exists(), "the socket is removed at exit");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Slow TCP clients (a byte a second, or nothing) and held-open TCP pprof
/// requests while the owner uses the socket: each slow client would be
/// closed only at its request deadline (5 s from its connection) and keeps
/// sending for longer, so an owner's answer that arrives within 4 s came
/// while they all held their connections. Before the poll loop served
/// connections side by side, the first trickling client held the API
/// thread for as long as it kept sending.
#[test]
fn slow_tcp_clients_never_delay_the_owner() {
    common::require_kvm();
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("api-slow-{}", std::process::id()));
    let (_vm, sock, listen, _) = start_vm(&dir);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut slow = Vec::new();
    for i in 0..8 {
        let done = done.clone();
        slow.push(std::thread::spawn(move || {
            let mut s = TcpStream::connect(listen).unwrap();
            for b in b"GET /metrics HTTP/1.1\r\nHost: x\r\n".iter().cycle() {
                if done.load(std::sync::atomic::Ordering::Relaxed) {
                    return;
                }
                // Half trickle a byte a second, half stay idle.
                if i % 2 == 0 && s.write_all(&[*b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }));
    }
    std::thread::sleep(Duration::from_millis(300));
    let within = |s: &UnixStream| s.set_read_timeout(Some(Duration::from_secs(4))).unwrap();
    let mut owner = UnixStream::connect(&sock).unwrap();
    within(&owner);
    let (status, body) = exchange(&mut owner, get("/").as_bytes());
    assert_eq!(
        status, 200,
        "the owner's GET / beside eight slow clients: {body}"
    );
    let mut scrape = TcpStream::connect(listen).unwrap();
    scrape
        .set_read_timeout(Some(Duration::from_secs(4)))
        .unwrap();
    let (status, body) = exchange(&mut scrape, get("/metrics").as_bytes());
    assert_eq!(status, 200, "a scrape beside eight slow clients: {body}");

    // Held-open TCP pprof requests take at most their own slots: the
    // owner still starts a capture.
    let pprof = get("/debug/pprof/profile?seconds=300");
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..4 {
        let mut s = TcpStream::connect(listen).unwrap();
        s.write_all(pprof.as_bytes()).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut answer = Vec::new();
        match s.read_to_end(&mut answer) {
            Ok(_) => {
                let text = String::from_utf8_lossy(&answer);
                assert!(text.starts_with("HTTP/1.1 409"), "{text}");
                assert!(text.contains("over TCP"), "{text}");
                refused += 1;
            }
            Err(_) => held.push(s),
        }
    }
    assert_eq!((held.len(), refused), (2, 2), "two TCP captures at most");
    let mut start = UnixStream::connect(&sock).unwrap();
    within(&start);
    let (status, body) = exchange(
        &mut start,
        with_body("PUT", "/capture/start", "").as_bytes(),
    );
    assert_eq!(status, 204, "the owner's capture beside TCP's: {body}");
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    slow.into_iter().for_each(|t| t.join().unwrap());
    let _ = std::fs::remove_dir_all(&dir);
}
