//! The `lwpvmm` binary as a user runs it.

use std::process::{Command, Output};

fn lwpvmm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lwpvmm"))
        .args(args)
        .output()
        .expect("run lwpvmm")
}

fn leaf(entries: &[serde_json::Value], leaf: u64) -> [u64; 4] {
    let e = entries
        .iter()
        .find(|e| e["leaf"] == leaf)
        .unwrap_or_else(|| panic!("leaf {leaf:#x} missing"));
    assert_eq!(e["subleaf"], 0);
    ["eax", "ebx", "ecx", "edx"].map(|r| e[r].as_u64().expect("JSON integer"))
}

#[test]
fn cpuid_json_per_profile() {
    // (profile, guest, 0x8000001C EAX/EBX/ECX/EDX, 0x80000001.ECX)
    let table = [
        (
            "bulldozer",
            "shim",
            [0x8000_000F, 0x8003_2013, 0x0001_0200, 0x8000_000F],
            1 << 15,
        ),
        (
            "bulldozer",
            "stock",
            [0, 0x8003_2013, 0x0001_0200, 0x8000_000F],
            1 << 15,
        ),
        (
            "emulated",
            "shim",
            [0xE000_0063, 0x8006_2016, 0x0001_0200, 0xE000_0063],
            1 << 15,
        ),
        (
            "precise",
            "shim",
            [0xE000_006F, 0x8006_2016, 0x0001_0200, 0xE000_006F],
            1 << 15,
        ),
        ("off", "shim", [0, 0, 0, 0], 0),
    ];
    for (profile, guest, lwp, ext_ecx) in table {
        let out = lwpvmm(&["cpuid", "--lwp", profile, "--guest", guest, "--json"]);
        assert!(out.status.success(), "{profile}: {:?}", out);
        let entries: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(leaf(&entries, 0x8000_001C), lwp, "{profile} {guest}");
        assert_eq!(leaf(&entries, 0x8000_0001)[2], ext_ecx, "{profile} {guest}");
        let max = leaf(&entries, 0x8000_0000)[0];
        assert!(
            ext_ecx == 0 || max >= 0x8000_001C,
            "{profile}: max extended leaf"
        );
    }
}

#[test]
fn cpuid_table_decodes_fields() {
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
