//! `cargo bench --bench vmm -- snapshots`: snapshot and restore times of a 256
//! MiB guest, full and diff, and the snapshot's size. Shared helpers are the
//! bench root's (vmm.rs).

use super::*;

/// Milliseconds in an info log line such as "... in 12.3 ms ...".
fn logged_ms(stderr: &str, marker: &str) -> f64 {
    let line = stderr
        .lines()
        .find(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("no `{marker}` line in:\n{stderr}"));
    let after = &line[line.find(" in ").expect("timing") + 4..];
    after.split(' ').next().unwrap().parse().unwrap()
}

/// A snapshot of the replay guest with `mib` MiB of RAM, taken at its
/// snapshot point after it wrote `fill` MiB; returns the directory and
/// lwpvmm's log.
fn snapshot_of(name: &str, mib: u32, fill: u32, touch: u32) -> (PathBuf, String) {
    let dir = std::env::temp_dir().join(format!("lwpvmm-bench-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let elf = embedded_guest("replay");
    let run = Command::new(env!("CARGO_BIN_EXE_lwpvmm"))
        .env("RUST_LOG", "info")
        .args(["run", "--kernel", elf.to_str().unwrap()])
        .args(["--memory", &mib.to_string()])
        .args([
            "--cmdline",
            &format!("iterations=20000 snap=10000 fill={fill} touch={touch}"),
        ])
        .args([
            "--snapshot-dir",
            dir.to_str().unwrap(),
            "--snapshot-on-port",
        ])
        .output()
        .expect("run");
    let _ = std::fs::remove_file(elf);
    (dir, String::from_utf8_lossy(&run.stderr).into_owned())
}

/// MiB of pages a diff snapshot writes after the replay guest (256 MiB)
/// wrote 1 MiB since its full snapshot (with its ring and stack, and the
/// records lwpvmm stored).
fn diff_written() -> (f64, f64) {
    let dir = std::env::temp_dir().join(format!("lwpvmm-bench-{}-diff", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let elf = embedded_guest("replay");
    let run = Command::new(env!("CARGO_BIN_EXE_lwpvmm"))
        .env("RUST_LOG", "info")
        .args(["run", "--kernel", elf.to_str().unwrap(), "--memory", "256"])
        .args([
            "--cmdline",
            "iterations=20000 snap=10000 snap2=10001 touch=1",
        ])
        .args(["--snapshot-dir", dir.to_str().unwrap()])
        .args(["--snapshot-diff", "--snapshot-on-port"])
        .output()
        .expect("run");
    let log = String::from_utf8_lossy(&run.stderr);
    let bytes: f64 = log
        .lines()
        .filter(|l| l.contains("diff snapshot written"))
        .find_map(|l| {
            let at = l.find(" bytes of memory")?;
            l[..at].rsplit(' ').next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no diff snapshot in:\n{log}"));
    let paused = logged_ms(&log, "diff snapshot written");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(elf);
    (bytes / f64::from(1 << 20), paused)
}

/// Milliseconds until one restore of `dir` runs its vCPUs, and its console.
fn restore_once(dir: &Path, extra: &[&str]) -> (f64, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_lwpvmm"))
        .env("RUST_LOG", "info")
        .args(["restore", dir.to_str().unwrap()])
        .args(extra)
        .output()
        .expect("restore");
    let ms = logged_ms(&String::from_utf8_lossy(&out.stderr), "restored");
    (ms, String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Milliseconds until a restore of `dir` runs its vCPUs (the median of
/// five), and the last run's console.
fn restore_ms(dir: &Path, extra: &[&str]) -> (f64, String) {
    let mut console = String::new();
    let times = (0..5)
        .map(|_| {
            let (ms, out) = restore_once(dir, extra);
            console = out;
            ms
        })
        .collect();
    (median(times), console)
}

pub fn snapshots() {
    let (small, _) = snapshot_of("64m", 64, 0, 0);
    let (big, _) = snapshot_of("1g", 1024, 0, 0);
    let (mid, log) = snapshot_of("256m", 256, 0, 0);
    // Restores of a few milliseconds: the two sizes alternate, so a burst
    // of a noisy neighbour lands on both halves of a round.
    let rounds: Vec<(f64, f64)> = (0..9)
        .map(|_| (restore_once(&small, &[]).0, restore_once(&big, &[]).0))
        .collect();
    let size_ratio = median(rounds.iter().map(|(s, b)| b / s).collect());
    let (r64, r1g) = {
        let (s, b): (Vec<f64>, Vec<f64>) = rounds.into_iter().unzip();
        (median(s), median(b))
    };
    let (r256, _) = restore_ms(&mid, &[]);
    let (verified, _) = restore_ms(&mid, &["--verify"]);
    let taken = logged_ms(&log, "snapshot written");
    println!(
        "snapshots of the replay guest (restore: until the vCPUs run; 64 MiB and 1 GiB: medians of 9 alternating rounds, the others of 5):"
    );
    println!(
        "  restore 64 MiB {r64:.1} ms, 1 GiB {r1g:.1} ms, 256 MiB {r256:.1} ms, 256 MiB --verify {verified:.1} ms"
    );
    println!("restore 1GiB/64MiB = {size_ratio:.2}");
    println!(
        "restore 256MiB / restore --verify 256MiB = {:.3}",
        r256 / verified
    );

    let (touched, _) = snapshot_of("touch", 256, 0, 64);
    let (restored, console) = restore_ms(&touched, &[]);
    let cycles: f64 = console
        .lines()
        .find_map(|l| l.strip_prefix("replay: touched 64 MiB in "))
        .and_then(|l| l.split(' ').next())
        .and_then(|c| c.parse().ok())
        .expect("the touch line");
    let touch_ms = cycles / tsc_hz() * 1e3;
    println!(
        "  a 256 MiB guest restored, then writing a page of each 4 KiB of 64 MiB: {restored:.1} + {touch_ms:.1} ms"
    );
    println!(
        "restore + touch 64MiB working set = {:.1} ms",
        restored + touch_ms
    );

    let (filled, _) = snapshot_of("fill", 1024, 16, 0);
    use std::os::unix::fs::MetadataExt;
    let blocks = std::fs::metadata(filled.join(lwpvmm::vmm::snapshot::MEMORY_FILE))
        .map_or(0, |m| m.blocks() * 512);
    println!(
        "  a 1 GiB guest that wrote 16 MiB: memory file {} MiB long, {:.1} MiB allocated",
        1024,
        blocks as f64 / f64::from(1 << 20)
    );
    println!(
        "snapshot file blocks / touched = {:.2}",
        blocks as f64 / f64::from(16 << 20)
    );
    let (diff, diff_pause) = diff_written();
    println!(
        "  a 256 MiB guest: a full snapshot, then 1 MiB written, then a diff snapshot ({diff:.2} MiB of pages)"
    );
    println!("diff after 1MiB touched: written = {diff:.2} MiB");
    println!(
        "  256 MiB guest: the VM stays paused while the files are written: {taken:.1} ms for a full snapshot, {diff_pause:.1} ms for the diff"
    );
    println!("pause time = {diff_pause:.1} ms");
    for d in [small, big, mid, touched, filled] {
        let _ = std::fs::remove_dir_all(d);
    }
}
