//! The `lwpvmm` binary as a user runs it.

use std::process::{Command, Output};

fn lwpvmm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lwpvmm"))
        .args(args)
        .output()
        .expect("run lwpvmm")
}

fn leaf(entries: &[serde_json::Value], leaf: u64) -> Option<[u64; 4]> {
    let e = entries.iter().find(|e| e["leaf"] == leaf)?;
    assert_eq!(e["subleaf"], 0);
    Some(["eax", "ebx", "ecx", "edx"].map(|r| e[r].as_u64().expect("JSON integer")))
}

fn require_kvm() {
    assert!(
        std::path::Path::new("/dev/kvm").exists(),
        "these tests need /dev/kvm (lwpvmm cpuid asks KVM for its supported CPUID); it is missing"
    );
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
    let out = Command::new(env!("CARGO_BIN_EXE_lwpvmm"))
        .current_dir(root)
        .args(["report", "tests/data/report.trace"])
        .output()
        .unwrap();
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
