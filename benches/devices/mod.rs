//! `cargo bench --bench vmm -- devices`: the virtio devices: sequential and
//! random disk reads and writes and TCP from the host over a tap into the Linux
//! guest, and the longest pause through the API while a guest storms its disk
//! queue. Shared helpers are the bench root's (vmm.rs).

use super::*;

/// The disk benchmark's three timings in seconds (host clock, from the
/// guest's `start` line to its result line): seq-write, seq-read,
/// randread.
fn disk_times(vmm: Vmm, kernel: &str, root: &Path, dir: &Path) -> Option<[f64; 3]> {
    let root_copy = dir.join("root.ext4");
    let data = dir.join("data.img");
    std::fs::copy(root, &root_copy).ok()?;
    std::fs::write(&data, vec![0u8; 8 << 20]).ok()?;
    let args = device_vm(
        vmm,
        kernel,
        &[&root_copy, &data],
        None,
        "lwpdisk=seq-write,seq-read,randread",
    );
    let markers: [fn(&str) -> bool; 6] = [
        |l| l.contains("lwp-disk: start seq-write"),
        |l| l.starts_with("lwp-disk: seq-write "),
        |l| l.contains("lwp-disk: start seq-read"),
        |l| l.starts_with("lwp-disk: seq-read "),
        |l| l.contains("lwp-disk: start randread"),
        |l| l.starts_with("lwp-disk: randread "),
    ];
    let (seen, _) = console_times(&args, &markers);
    let t = |i: usize| Some(seen[i + 1]? - seen[i]?);
    Some([t(0)?, t(2)?, t(4)?])
}

/// Bytes the host sends the guest's TCP sink.
const TCP_BYTES: usize = 4 << 20;

/// Seconds from the host's connect to the guest's answer after it received
/// TCP_BYTES, the VMM running in `ns`.
fn tcp_time(vmm: Vmm, kernel: &str, root: &Path, dir: &Path, ns: &BenchNetns) -> Option<f64> {
    tcp_time_of(vmm, kernel, root, dir, ns, TCP_BYTES)
}

/// The longest a pause through the API took while the guest kept a
/// 256-entry ring of maximal (32.5 MB) reads posted (the virtio_hostile
/// guest's storm): a pause waits for the request at hand, not the ring.
fn pause_under_storm() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-storm");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let disk = dir.join("disk.img");
    std::fs::File::create(&disk)
        .and_then(|f| f.set_len(64 << 20))
        .unwrap();
    let sock = dir.join("api.sock");
    let guest = embedded_guest("virtio_hostile");
    let mut child = Command::new(env!("CARGO_BIN_EXE_lwpvmm"))
        .args(["run", "--kernel"])
        .arg(&guest)
        .args(["--cmdline", "storm=1", "--memory", "128", "--disk"])
        .arg(&disk)
        .arg("--api-sock")
        .arg(&sock)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run lwpvmm");
    let stdout = child.stdout.take().unwrap();
    let storming = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|l| l.contains("# storm"));
    let body = |state: &str| {
        let b = format!(r#"{{"state": "{state}"}}"#);
        format!(
            "PATCH /vm HTTP/1.1\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        )
    };
    let mut worst: Option<f64> = None;
    if storming {
        for _ in 0..10 {
            std::thread::sleep(Duration::from_millis(200));
            let t = Instant::now();
            let paused = api_status(&sock, &body("Paused"));
            let ms = t.elapsed().as_secs_f64() * 1e3;
            if paused != Some(204) || api_status(&sock, &body("Resumed")) != Some(204) {
                worst = None;
                break;
            }
            worst = Some(worst.map_or(ms, |w: f64| w.max(ms)));
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    match worst {
        Some(ms) => println!("pause under a block storm = {ms:.1} ms"),
        None => println!("pause under a block storm: the storm guest did not run"),
    }
}

pub fn devices() {
    pause_under_storm();
    let Some((kernel, _)) = linux_guest() else {
        println!("devices: resources/linux/build.sh failed: skipped");
        return;
    };
    if !has_qemu() {
        println!("devices: qemu not installed (apt-get install qemu-system-x86): no comparison");
        return;
    }
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("linux/rootfs.ext4");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-devices");
    let _ = std::fs::create_dir_all(&dir);
    const RUNS: usize = 5;
    let mut disk: [[Vec<f64>; 3]; 2] = Default::default();
    let mut tcp: [Vec<f64>; 2] = Default::default();
    let ns = BenchNetns::create();
    for run in 0..RUNS {
        for (i, vmm) in [Vmm::Lwpvmm, Vmm::Qemu].into_iter().enumerate() {
            if let Some(times) = disk_times(vmm, &kernel, &root, &dir) {
                for (k, t) in times.into_iter().enumerate() {
                    disk[i][k].push(t);
                }
            }
            if let Some(ns) = &ns
                && let Some(t) = tcp_time(vmm, &kernel, &root, &dir, ns)
            {
                tcp[i].push(t);
            }
        }
        eprintln!("devices: run {} of {RUNS} done", run + 1);
    }
    let mb = |bytes: f64, secs: f64| bytes / secs / 1e6;
    let names = ["seq-write", "seq-read", "4k-randread"];
    let bytes = [8.0 * 1048576.0, 8.0 * 1048576.0, 512.0 * 4096.0];
    println!("devices, median of {RUNS} runs (MB/s in the guest's I/O, host clock):");
    let mut ratios = [None; 3];
    for k in 0..3 {
        if disk[0][k].is_empty() || disk[1][k].is_empty() {
            // On kvm_pvm, QEMU's guest stops at the kernel's first FWAIT at
            // CPL0 (a KVM emulation failure that lwpvmm handles itself).
            println!(
                "  disk {}: no timing from {} ({} of {RUNS} runs of lwpvmm, {} of qemu completed)",
                names[k],
                if disk[0][k].is_empty() {
                    "lwpvmm"
                } else {
                    "qemu"
                },
                disk[0][k].len(),
                disk[1][k].len()
            );
            continue;
        }
        let (l, q) = (median(disk[0][k].clone()), median(disk[1][k].clone()));
        println!(
            "  disk {:<12} lwpvmm {:7.2} MB/s  qemu microvm {:7.2} MB/s",
            names[k],
            mb(bytes[k], l),
            mb(bytes[k], q)
        );
        ratios[k] = Some(q / l);
    }
    let show = |r: Option<f64>| r.map_or("-".into(), |r| format!("{r:.2}"));
    println!("disk seq-read lwpvmm/qemu = {}", show(ratios[1]));
    println!("disk seq-write lwpvmm/qemu = {}", show(ratios[0]));
    println!("disk 4k-randread lwpvmm/qemu = {}", show(ratios[2]));
    let tcp_ratio = if tcp[0].is_empty() || tcp[1].is_empty() {
        if ns.is_none() {
            println!("  tcp: no network namespace and tap (run as root): no comparison");
        } else {
            println!(
                "  tcp: {} of {RUNS} runs of lwpvmm, {} of qemu completed",
                tcp[0].len(),
                tcp[1].len()
            );
        }
        None
    } else {
        let (l, q) = (median(tcp[0].clone()), median(tcp[1].clone()));
        println!(
            "  tcp host-to-guest {} MiB: lwpvmm {:.2} MB/s  qemu microvm {:.2} MB/s",
            TCP_BYTES >> 20,
            mb(TCP_BYTES as f64, l),
            mb(TCP_BYTES as f64, q)
        );
        Some(q / l)
    };
    println!("net tcp host-to-guest lwpvmm/qemu = {}", show(tcp_ratio));
    println!("  (ratios are throughput: lwpvmm's over QEMU's; above 1.0 lwpvmm is faster)");
}
