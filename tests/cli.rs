//! The `lwpvmm` binary as a user runs it.

// A test: a failed setup or expectation stops it with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{lwpvmm, require_kvm};

fn leaf(entries: &[serde_json::Value], leaf: u64) -> Option<[u64; 4]> {
    let e = entries.iter().find(|e| e["leaf"] == leaf)?;
    assert_eq!(e["subleaf"], 0);
    Some(["eax", "ebx", "ecx", "edx"].map(|r| e[r].as_u64().expect("JSON integer")))
}

#[test]
fn cpuid_json_per_profile() {
    require_kvm();
    // (profile, guest, 0x8000001C EAX/EBX/ECX/EDX or absent, 0x80000001.ECX[15])
    let table = [
        (
            "bulldozer",
            "shim",
            Some([0x8000_000F, 0x8003_2013, 0x0001_0200, 0x8000_000F]),
            true,
        ),
        (
            "bulldozer",
            "stock",
            Some([0, 0x8003_2013, 0x0001_0200, 0x8000_000F]),
            true,
        ),
        (
            "emulated",
            "shim",
            Some([0xE000_0063, 0x8006_2016, 0x0001_0200, 0xE000_0063]),
            true,
        ),
        (
            "precise",
            "shim",
            Some([0xE000_006F, 0x8006_2016, 0x0001_0200, 0xE000_006F]),
            true,
        ),
        ("off", "shim", None, false),
    ];
    for (profile, guest, lwp, flag) in table {
        let out = lwpvmm(&["cpuid", "--lwp", profile, "--guest", guest, "--json"]);
        assert!(out.status.success(), "{profile}: {out:?}");
        let entries: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(leaf(&entries, 0x8000_001C), lwp, "{profile} {guest}");
        let ext = leaf(&entries, 0x8000_0001).expect("leaf 0x80000001");
        assert_eq!(ext[2] & (1 << 15) != 0, flag, "{profile} {guest}");
        let max = leaf(&entries, 0x8000_0000).expect("leaf 0x80000000")[0];
        assert!(!flag || max >= 0x8000_001C, "{profile}: max extended leaf");
        let pv = leaf(&entries, 0x4000_0101).expect("hypervisor leaf");
        assert_eq!(pv[0], 1, "PV ABI version");
    }
}

#[test]
fn cpuid_table_decodes_fields() {
    require_kvm();
    let out = lwpvmm(&["cpuid", "--lwp", "bulldozer"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for want in [
        "0x8000001c",
        "0x80032013",
        "LwpCbSize 19 qwords (152 bytes)",
        "LwpMaxEvents 3",
        "EDX supported: AVAIL VAL IRE BRE INT",
    ] {
        assert!(text.contains(want), "missing `{want}` in:\n{text}");
    }
}

#[test]
fn unknown_profile_is_refused_with_the_choices() {
    let out = lwpvmm(&["cpuid", "--lwp", "zen"]);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("zen") && err.contains("bulldozer"), "{err}");
}

#[test]
fn report_matches_the_golden_output() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = common::output_within(
        common::command()
            .current_dir(root)
            .args(["report", "tests/data/report.trace"]),
        common::RUN_LIMIT,
    );
    assert!(out.status.success(), "{out:?}");
    let golden = std::fs::read_to_string(format!("{root}/tests/data/report.golden")).unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), golden);
}

#[test]
fn report_writes_folded_stacks_and_a_flamegraph() {
    let dir = std::env::temp_dir().join(format!("lwpvmm-report-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (folded, svg) = (dir.join("out.folded"), dir.join("out.svg"));
    let trace = format!("{}/tests/data/report.trace", env!("CARGO_MANIFEST_DIR"));
    let out = lwpvmm(&[
        "report",
        &trace,
        "--event",
        "6",
        "--folded",
        folded.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(std::fs::read_to_string(&folded).unwrap(), "0x401020 3\n");
    assert!(std::fs::read_to_string(&svg).unwrap().contains("0x401020"));
    std::fs::write(dir.join("bad.trace"), "not a trace\n").unwrap();
    let bad = lwpvmm(&["report", dir.join("bad.trace").to_str().unwrap()]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not an lwpvmm trace"));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn profile_runs_a_users_program_and_reports_it() {
    require_kvm();
    let dir = std::env::temp_dir().join(format!("lwpvmm-profile-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (hot, low) = (dir.join("hot.elf"), dir.join("low.elf"));
    std::fs::write(&hot, lwpvmm::guests::get("example-hot").unwrap()).unwrap();
    std::fs::write(&low, lwpvmm::guests::get("minimal").unwrap()).unwrap();
    let out = lwpvmm(&["profile", hot.to_str().unwrap(), "--top", "3"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("hot: done"),
        "the program's console output: {text}"
    );
    let top = text
        .lines()
        .find(|l| l.contains('%'))
        .expect("a report row");
    assert!(top.ends_with("hot"), "the hottest function leads: {text}");
    let refused = lwpvmm(&["profile", low.to_str().unwrap()]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("16 MiB"));
    std::fs::remove_dir_all(dir).unwrap();
}

/// Waits until `path` holds `text` (the run is then under way).
fn wait_for(path: &std::path::Path, text: &str, child: &mut std::process::Child) {
    let started = std::time::Instant::now();
    while !std::fs::read_to_string(path).is_ok_and(|t| t.contains(text)) {
        assert!(
            child.try_wait().unwrap().is_none(),
            "lwpvmm ended before writing {text:?}"
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "no {text:?} in {} after 60 s",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A scratch directory named for `what` holding the replay guest, and the
/// guest's path.
fn replay_in(what: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("lwpvmm-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kernel = dir.join("replay.elf");
    std::fs::write(&kernel, lwpvmm::guests::get("replay").unwrap()).unwrap();
    (dir, kernel)
}

/// Sends SIG`name` to `child`.
fn signal(child: &std::process::Child, name: &str) {
    let sent = std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(sent.success());
}

/// SIGINT and SIGTERM stop the VM at once and cleanly: the console (to a
/// file, written through line by line while the VM runs: the test waits for
/// a line in it), the trace and the metrics are all there, one line says
/// why, and the status is 128 + N.
#[test]
fn signals_stop_the_vm_cleanly() {
    require_kvm();
    let (dir, kernel) = replay_in("signals");
    // (signal, its number)
    for (signal_name, number) in [("INT", 2), ("TERM", 15), ("HUP", 1)] {
        let (console, trace, metrics) = (
            dir.join(format!("{signal_name}.console")),
            dir.join(format!("{signal_name}.trace")),
            dir.join(format!("{signal_name}.json")),
        );
        let mut child = common::command()
            .args(["run", "--kernel"])
            .arg(&kernel)
            .args(["--memory", "64", "--cmdline", "iterations=1000000000"])
            .arg("--serial")
            .arg(&console)
            .arg("--trace")
            .arg(&trace)
            .arg("--metrics")
            .arg(&metrics)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let _watch = common::watch(&child);
        // Iteration 1000 reached: LWPVAL records are stored.
        wait_for(&console, "replay: step 1000", &mut child);
        signal(&child, signal_name);
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(128 + number),
            "SIG{signal_name}: {err}"
        );
        assert!(
            err.contains(&format!("SIG{signal_name} received: the VM was stopped")),
            "{err}"
        );
        let m: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&metrics).unwrap()).unwrap();
        assert_eq!(m["end"]["signal"], number, "{m}");
        assert!(m["vm"]["lwpval"].as_u64().unwrap() > 0, "{m}");
        let report = lwpvmm(&["report", trace.to_str().unwrap(), "--event", "1"]);
        let text = String::from_utf8_lossy(&report.stdout);
        assert!(report.status.success(), "{report:?}");
        assert!(
            !text.contains("# 0 records"),
            "the trace has records:\n{text}"
        );
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// SIGUSR1 and SIGUSR2 never end a run, with or without the option they
/// serve (each says what it needs); two quick SIGINTs end it at once with
/// a line saying so, and the metrics file still holds a whole document.
#[test]
fn user_signals_and_a_second_sigint() {
    require_kvm();
    let (dir, kernel) = replay_in("usr");
    // (with --metrics, what the run's standard error then says)
    let table = [
        (
            false,
            "SIGUSR1 writes the metrics to the --metrics file: this run has none",
        ),
        (
            true,
            "SIGUSR2 takes a snapshot into --snapshot-dir: this run has none",
        ),
    ];
    for (with_metrics, says) in table {
        let (console, metrics) = (
            dir.join(format!("{with_metrics}.console")),
            dir.join(format!("{with_metrics}.json")),
        );
        let mut command = common::command();
        command
            .args(["run", "--kernel"])
            .arg(&kernel)
            .args(["--memory", "64", "--cmdline", "iterations=1000000000"])
            .arg("--serial")
            .arg(&console)
            .env("RUST_LOG", "lwpvmm=info")
            .stderr(std::process::Stdio::piped());
        if with_metrics {
            command.arg("--metrics").arg(&metrics);
        }
        let mut child = command.spawn().unwrap();
        let _watch = common::watch(&child);
        wait_for(&console, "replay: step 1000", &mut child);
        signal(&child, "USR1");
        signal(&child, "USR2");
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(
            child.try_wait().unwrap().is_none(),
            "SIGUSR1 and SIGUSR2 ended the run"
        );
        // Two at once: the second ends the process before the first's
        // clean stop completes, or the clean stop wins; either way the
        // metrics file is whole.
        signal(&child, "INT");
        signal(&child, "INT");
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(130), "{err}");
        assert!(err.contains(says), "{err}");
        assert!(
            err.contains("SIGINT again: exiting at once")
                || err.contains("SIGINT received: the VM was stopped"),
            "{err}"
        );
        if with_metrics {
            let m: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&metrics).unwrap()).unwrap();
            assert!(m["vm"].is_object(), "a whole document: {m}");
        }
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// What a new user gets wrong, each answered with what is wrong: a kernel
/// for another machine, a file that is not a trace, a snapshot directory
/// of diffs; and what a user writes as elsewhere (`--memory 64M`,
/// `--api-listen localhost:PORT`) is taken.
#[test]
fn a_new_users_inputs_are_answered() {
    require_kvm();
    let dir = std::env::temp_dir().join(format!("lwpvmm-inputs-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("snaps/0")).unwrap();
    let mut arm64 = vec![0u8; 64];
    arm64[..4].copy_from_slice(b"\x7fELF");
    (arm64[4], arm64[5], arm64[18]) = (2, 1, 183);
    std::fs::write(dir.join("arm64.elf"), &arm64).unwrap();
    std::fs::write(dir.join("bin.trace"), [0u8, 0xff, 0xfe, 1]).unwrap();
    std::fs::write(dir.join("snaps/0/state.bin"), b"x").unwrap();
    let minimal = dir.join("minimal.elf");
    std::fs::write(&minimal, lwpvmm::guests::get("minimal").unwrap()).unwrap();
    let p = |name: &str| dir.join(name).display().to_string();
    let minimal = minimal.display().to_string();
    // (arguments, exit status, text on standard error)
    let table: Vec<(Vec<String>, i32, &str)> = vec![
        (
            vec!["run".into(), "--kernel".into(), p("arm64.elf")],
            2,
            "is a 64-bit ELF for arm64 (AArch64): lwpvmm boots x86-64 kernels",
        ),
        (
            vec!["report".into(), p("bin.trace")],
            2,
            "not an lwpvmm trace",
        ),
        (
            vec!["restore".into(), p("snaps")],
            2,
            "holds the --snapshot-diff snapshots 0",
        ),
        (
            vec![
                "run".into(),
                "--kernel".into(),
                minimal.clone(),
                "--memory".into(),
                "64M".into(),
                "--api-listen".into(),
                "localhost:0".into(),
            ],
            1,
            "",
        ),
        (
            vec![
                "run".into(),
                "--kernel".into(),
                minimal,
                "--memory".into(),
                "64Q".into(),
            ],
            2,
            "`64Q` is not a memory size",
        ),
    ];
    for (args, status, text) in table {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = lwpvmm(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(status), "{args:?}: {err}");
        assert!(err.contains(text), "{args:?}: {err}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// `RUST_LOG=lwpvmm=info` says why the VM ended, as the README says.
#[test]
fn info_logging_says_why_the_vm_ended() {
    require_kvm();
    let kernel = std::env::temp_dir().join(format!("lwpvmm-why-{}.elf", std::process::id()));
    std::fs::write(&kernel, lwpvmm::guests::get("minimal").unwrap()).unwrap();
    let out = common::output_within(
        common::command()
            .args(["run", "--kernel"])
            .arg(&kernel)
            .env("RUST_LOG", "lwpvmm=info"),
        common::RUN_LIMIT,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("the VM ended: the guest wrote 0 to the exit port"),
        "{err}"
    );
    let _ = std::fs::remove_file(kernel);
}

/// A reader that goes away ends the output, not in an error: `cpuid |
/// head -1` ends 0, and a run whose console nobody reads any more stops
/// cleanly, with its metrics written.
#[test]
fn a_closed_standard_output_ends_the_output() {
    require_kvm();
    use std::io::BufRead;
    let closed = common::command()
        .arg("cpuid")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map(|mut c| {
            let _watch = common::watch(&c);
            drop(c.stdout.take());
            c.wait_with_output().unwrap()
        })
        .unwrap();
    assert_eq!(closed.status.code(), Some(0), "{closed:?}");
    let (dir, kernel) = replay_in("epipe");
    let metrics = dir.join("m.json");
    let mut child = common::command()
        .args(["run", "--kernel"])
        .arg(&kernel)
        .args([
            "--memory",
            "64",
            "--cmdline",
            "iterations=1000000000",
            "--metrics",
        ])
        .arg(&metrics)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let _watch = common::watch(&child);
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("standard output was closed: the VM was stopped"),
        "{err}"
    );
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(&metrics).unwrap()).unwrap();
    assert_eq!(m["end"], "output_closed", "{m}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// `report` refuses what it cannot honour and reports what it can: an
/// unknown EventId, a flamegraph with no samples (nothing is written), and
/// a trace whose last line a killed run cut short (a warning, and the
/// complete lines before it).
#[test]
fn report_edge_cases() {
    let dir = std::env::temp_dir().join(format!("lwpvmm-report-edges-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = std::fs::read_to_string(format!(
        "{}/tests/data/report.trace",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let cut = dir.join("cut.trace");
    std::fs::write(&cut, format!("{good}{{\"vcpu\":0,\"cr3\":10")).unwrap();
    let svg = dir.join("none.svg");
    let trace = format!("{}/tests/data/report.trace", env!("CARGO_MANIFEST_DIR"));
    let (trace, cut_s, svg_s) = (trace.as_str(), cut.to_str().unwrap(), svg.to_str().unwrap());
    // (arguments, exit status, text on stdout or stderr)
    let table: [(Vec<&str>, i32, &str); 4] = [
        (
            vec!["report", trace, "--event", "99"],
            2,
            "--event 99 is not an LWP EventId",
        ),
        (
            vec!["report", trace, "--event", "2", "--svg", svg_s],
            2,
            "no flamegraph, folded stack or profile to write",
        ),
        (vec!["report", cut_s], 0, "is cut short"),
        (vec!["report", cut_s], 0, "# 15 records of EventId 5"),
    ];
    for (args, status, want) in table {
        let out = lwpvmm(&args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(status), "{args:?}: {text}");
        assert!(text.contains(want), "{args:?}: `{want}` not in: {text}");
    }
    assert!(!svg.exists(), "a refused flamegraph leaves no file");
    std::fs::remove_dir_all(dir).unwrap();
}

/// `report` streams: a trace far larger than the address space it may use
/// (prlimit --as) is reported.
#[test]
fn report_streams_a_trace_larger_than_its_memory() {
    let dir = std::env::temp_dir().join(format!("lwpvmm-report-big-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let big = dir.join("big.trace");
    {
        use std::io::Write;
        let line = r#"{"vcpu":0,"cr3":4096,"event":5,"core":0,"flags":0,"data1":0,"data2":0,"ip":4198400,"timestamp":7}"#;
        let chunk = format!("{line}\n").repeat(10_000);
        let mut w = std::fs::File::create(&big).unwrap();
        writeln!(
            w,
            r#"{{"lwpvmm_trace":2,"profile":"emulated","sample_hz":1000}}"#
        )
        .unwrap();
        for _ in 0..120 {
            w.write_all(chunk.as_bytes()).unwrap();
        }
    }
    let size = std::fs::metadata(&big).unwrap().len();
    let limit: u64 = 48 << 20;
    assert!(
        size > 2 * limit,
        "the trace ({size} bytes) must exceed the limit"
    );
    let out = common::output_within(
        std::process::Command::new("prlimit")
            .arg(format!("--as={limit}"))
            .arg(common::BIN)
            .args(["report", big.to_str().unwrap()]),
        common::RUN_LIMIT,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(text.contains("# 1200000 records"), "{text}");
    std::fs::remove_dir_all(dir).unwrap();
}
