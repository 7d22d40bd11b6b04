//! `cargo bench --bench vmm -- firecracker`: the Firecracker front end: the
//! Linux guest to its first self-test line configured through the API against
//! `lwpvmm run`, the vsock echo round trip, and vsock against TCP for the same
//! bytes. Shared helpers are the bench root's (vmm.rs).

use super::*;

/// One request to lwpvmm's API on `sock`, waiting for the socket first;
/// its status.
fn fc_request(sock: &Path, method: &str, path: &str, body: &str) -> Option<u16> {
    let until = Instant::now() + Duration::from_secs(30);
    while !sock.exists() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(2));
    }
    api_status(
        sock,
        &format!(
            "{method} {path} HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
}

/// Seconds from the process's start to the console's first line `marker`
/// starts, the VM configured by `configure` (on the API socket, or not at
/// all), then the process stopped.
fn first_line_at(args: &[String], marker: &str, configure: impl FnOnce() -> bool) -> Option<f64> {
    let started = Instant::now();
    let mut child = Command::new(&args[0])
        .args(&args[1..])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start lwpvmm");
    let stdout = child.stdout.take().expect("piped stdout");
    let seen = configure()
        && BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .any(|l| l.starts_with(marker));
    let at = started.elapsed().as_secs_f64();
    let _ = child.kill();
    let _ = child.wait();
    seen.then_some(at)
}

/// A vsock client of the guest's /lwp-vsock through the device's socket:
/// `CONNECT`, then `mode` (`e` echo, `s` sink).
fn vsock_connect(uds: &Path, port: u32, mode: u8) -> Option<std::os::unix::net::UnixStream> {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(uds).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(1200))).ok()?;
    s.write_all(format!("CONNECT {port}\n").as_bytes()).ok()?;
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while byte[0] != b'\n' {
        s.read_exact(&mut byte).ok()?;
        line.push(byte[0]);
    }
    line.starts_with(b"OK ").then_some(())?;
    s.write_all(&[mode]).ok()?;
    Some(s)
}

/// Firecracker's API and vsock: the same Linux guest to its first
/// self-test line configured through the API against `lwpvmm run`
/// (medians of three, interleaved), the vsock echo round trip, and 64 MiB
/// over vsock against 64 MiB of TCP over a tap (the guest idle but for
/// the receiving program either way).
pub fn firecracker() {
    use std::io::{Read, Write};
    let Some((kernel, initramfs)) = linux_guest() else {
        println!("firecracker: resources/linux/build.sh failed: skipped");
        return;
    };
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-firecracker");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let marker = "LWP self-test starting";
    let cmdline = lwpvmm::vmm::boot::LINUX_CMDLINE;
    let (mut api, mut cli) = (Vec::new(), Vec::new());
    for run in 0..3 {
        let sock = dir.join(format!("api-{run}.sock"));
        let fc: Vec<String> = [env!("CARGO_BIN_EXE_lwpvmm"), "firecracker", "--api-sock"]
            .map(String::from)
            .into_iter()
            .chain([sock.display().to_string()])
            .collect();
        let boot = format!(
            r#"{{"kernel_image_path": "{kernel}", "initrd_path": "{initramfs}", "boot_args": "{cmdline}"}}"#
        );
        api.extend(first_line_at(&fc, marker, || {
            [
                ("PUT", "/boot-source", boot.as_str()),
                (
                    "PUT",
                    "/machine-config",
                    r#"{"vcpu_count": 1, "mem_size_mib": 64}"#,
                ),
                ("PUT", "/actions", r#"{"action_type": "InstanceStart"}"#),
            ]
            .into_iter()
            .all(|(m, p, b)| fc_request(&sock, m, p, b) == Some(204))
        }));
        cli.extend(first_line_at(
            &lwpvmm_linux(&kernel, &initramfs, 1, &["--cmdline", cmdline]),
            marker,
            || true,
        ));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    match (median(&mut api), median(&mut cli)) {
        (Some(a), Some(c)) => {
            println!("  to \"{marker}\": API {a:.2} s, lwpvmm run {c:.2} s (medians of 3)");
            println!("api boot / cli boot = {:.2}", a / c);
        }
        _ => println!("api boot / cli boot: a boot did not reach \"{marker}\""),
    }

    // vsock: the guest runs /lwp-vsock alone.
    const PORT: u32 = 5000;
    const BYTES: usize = 64 << 20;
    let uds = dir.join("v.sock");
    let config = dir.join("vsock.json");
    std::fs::write(
        &config,
        format!(
            r#"{{"boot-source": {{"kernel_image_path": "{kernel}", "initrd_path": "{initramfs}", "boot_args": "{cmdline} lwpvsockonly={PORT}"}},
"machine-config": {{"vcpu_count": 1, "mem_size_mib": 64}},
"vsock": {{"guest_cid": 3, "uds_path": "{}"}}}}"#,
            uds.display()
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_lwpvmm"))
        .args(["firecracker", "--no-api", "--config-file"])
        .arg(&config)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start lwpvmm");
    let listening = wait_for_line(
        child.stdout.take().expect("piped stdout"),
        "lwp-vsock: listening",
    );
    let mut echo_us = None;
    let mut stream_s = None;
    if listening {
        const ROUND_TRIPS: u32 = 200;
        if let Some(mut s) = vsock_connect(&uds, PORT, b'e') {
            let mut byte = [0u8; 1];
            let t = Instant::now();
            let ok = (0..ROUND_TRIPS)
                .all(|_| s.write_all(b"x").is_ok() && s.read_exact(&mut byte).is_ok());
            echo_us = ok.then(|| t.elapsed().as_secs_f64() * 1e6 / f64::from(ROUND_TRIPS));
        }
        if let Some(mut s) = vsock_connect(&uds, PORT, b's') {
            let t = Instant::now();
            let mut reply = String::new();
            let ok = s.write_all(&vec![0x42u8; BYTES]).is_ok()
                && s.shutdown(std::net::Shutdown::Write).is_ok()
                && s.read_to_string(&mut reply).is_ok()
                && reply.contains(&format!("received {BYTES} bytes"));
            stream_s = ok.then(|| t.elapsed().as_secs_f64());
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    match echo_us {
        Some(us) => println!("vsock echo round trip = {us:.0} us"),
        None => println!("vsock echo round trip: the guest did not answer"),
    }
    if let Some(v) = stream_s {
        println!(
            "  64 MiB over vsock: {v:.1} s ({:.2} MB/s)",
            BYTES as f64 / v / 1e6
        );
    }
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("linux/rootfs.ext4");
    let tcp_s = BenchNetns::create()
        .and_then(|ns| tcp_time_of(Vmm::Lwpvmm, &kernel, &root, &dir, &ns, BYTES));
    match (stream_s, tcp_s) {
        (Some(v), Some(t)) => {
            println!(
                "  64 MiB of TCP over a tap: {t:.1} s ({:.2} MB/s)",
                BYTES as f64 / t / 1e6
            );
            println!("vsock stream 64 MiB / tcp over tap 64 MiB = {:.2}", t / v);
        }
        (v, t) => println!(
            "vsock stream 64 MiB / tcp over tap 64 MiB: not measured (vsock {v:?} s, tcp {t:?} s; TCP needs root for its network namespace)"
        ),
    }
}
