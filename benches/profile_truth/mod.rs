//! `cargo bench --bench vmm -- profile_truth`: whether a profile's shares
//! match the work (docs/profiling.md). The Linux guest's `/lwp-hot` runs
//! hot_1, hot_2 and hot_4 doing 1, 2 and 4 units of work (14, 29 and 57
//! points) under CNH sampling in the self-test, and the embedded demo's
//! work_1, work_2 and work_4 the same without a kernel; each line gives the
//! worst distance of a function's share from its work's, in points, and the
//! pprof profile of the Linux run its CPU time against the run's span times
//! its vCPUs.

use std::path::Path;
use std::process::Command;

use super::linux_guest;

/// The worst distance in points of `functions`' shares (in `report`'s
/// table) from 1:2:4.
fn worst_error(report: &str, functions: [&str; 3]) -> Option<f64> {
    let samples = |name: &str| -> Option<f64> {
        report.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && f[2] == name).then(|| f[0].parse().ok())?
        })
    };
    let counts = functions.map(samples);
    let total: f64 = counts.iter().flatten().sum();
    if counts.iter().any(Option::is_none) || total == 0.0 {
        return None;
    }
    Some(
        counts
            .iter()
            .flatten()
            .zip([1.0, 2.0, 4.0])
            .map(|(n, units)| (100.0 * n / total - 100.0 * units / 7.0).abs())
            .fold(0.0, f64::max),
    )
}

fn lwpvmm(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_lwpvmm"))
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "lwpvmm {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn profile_truth() {
    println!("profile truth (shares against the work, 1:2:4):");
    let demo = lwpvmm(&["demo"]);
    match worst_error(&demo, ["work_1", "work_2", "work_4"]) {
        Some(e) => println!("demo shares: worst error = {e:.1} points"),
        None => println!("demo shares: no work_1/work_2/work_4 rows in:\n{demo}"),
    }
    let Some((kernel, initramfs)) = linux_guest() else {
        println!("profile_truth: resources/linux/build.sh failed: the Linux lines skipped");
        return;
    };
    let tmp = std::env::temp_dir().join(format!("lwpvmm-bench-truth-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let (trace, pprof) = (tmp.join("run.trace"), tmp.join("run.pb.gz"));
    let path = |p: &Path| p.display().to_string();
    let console = lwpvmm(&[
        "run",
        "--kernel",
        &kernel,
        "--initramfs",
        &initramfs,
        "--memory",
        "64",
        "--trace",
        &path(&trace),
    ]);
    assert!(
        console.contains("lwp-linux-selftest: 22 passed"),
        "{console}"
    );
    let hot = Path::new(&kernel).with_file_name("bin").join("lwp-hot");
    let report = lwpvmm(&[
        "report",
        &path(&trace),
        "--symbols",
        &path(&hot),
        "--pprof",
        &path(&pprof),
    ]);
    match worst_error(&report, ["hot_1", "hot_2", "hot_4"]) {
        Some(e) => println!("linux hot shares: worst error = {e:.1} points"),
        None => println!("linux hot shares: no hot_1/hot_2/hot_4 rows in:\n{report}"),
    }
    let bytes = std::fs::read(&pprof).unwrap();
    let p = lwpvmm::profile::pprof::read(&bytes).unwrap();
    let cpu = p
        .sample_type
        .iter()
        .position(|t| p.string_table[t.r#type as usize] == "cpu");
    let total: i64 = cpu.map_or(0, |slot| p.sample.iter().map(|s| s.value[slot]).sum());
    // One vCPU: the self-test's run.
    println!(
        "  the Linux run's pprof: {} ms of CPU time in a {} ms span on 1 vCPU",
        total / 1_000_000,
        p.duration_nanos / 1_000_000
    );
    println!(
        "pprof total / (wall x vcpus) = {:.2}",
        total as f64 / p.duration_nanos.max(1) as f64
    );
    let _ = std::fs::remove_dir_all(tmp);
}
