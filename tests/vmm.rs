//! lwpvmm on real KVM with its own small guests (resources/guests): CPUID,
//! the LWP MSRs, each LWP instruction through the #UD shim, bad LWPCBs, the
//! threshold interrupt, exit statuses and unhandled exits.
//!
//! Every machine of this project has /dev/kvm; these tests fail, loudly,
//! where it is missing.

// A test: a failed setup or expectation stops it with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use common::{lwpvmm, require_kvm};
use lwpvmm::lwp::cpuid::{GuestLwpSupport, LwpProfile};
use lwpvmm::vmm::devices::port_bus::{GuestEnd, SerialOut};
use lwpvmm::vmm::{self, HostConfig, Profiling, RunOutcome, VmConfig, VmEnd};

fn boot(
    name: &str,
    profile: LwpProfile,
    guest: GuestLwpSupport,
    cmdline: &str,
) -> (RunOutcome, String) {
    boot_with(name, profile, guest, cmdline, 1)
}

fn boot_with(
    name: &str,
    profile: LwpProfile,
    guest: GuestLwpSupport,
    cmdline: &str,
    vcpus: u8,
) -> (RunOutcome, String) {
    boot_profiled(name, profile, guest, cmdline, vcpus, Profiling::default())
}

fn boot_profiled(
    name: &str,
    profile: LwpProfile,
    guest: GuestLwpSupport,
    cmdline: &str,
    vcpus: u8,
    profiling: Profiling,
) -> (RunOutcome, String) {
    require_kvm();
    let console = Arc::new(Mutex::new(Vec::new()));
    let config = VmConfig {
        kernel: lwpvmm::guests::get(name).expect("embedded guest").to_vec(),
        cmdline: cmdline.into(),
        memory_mib: 64,
        vcpus,
        profile,
        guest,
        host: HostConfig {
            serial: SerialOut::Capture(Arc::clone(&console)),
            profiling,
            ..HostConfig::default()
        },
        ..VmConfig::default()
    };
    let outcome = vmm::run(&config).unwrap_or_else(|e| panic!("guest {name}: {e}"));
    let text = String::from_utf8_lossy(&console.lock().unwrap()).into_owned();
    (outcome, text)
}

/// Boots a self-checking guest and asserts that it passed every check.
fn passes(name: &str, profile: LwpProfile) -> RunOutcome {
    let (outcome, text) = boot(name, profile, GuestLwpSupport::Shim, "");
    assert!(
        text.contains(" passed, 0 failed") && outcome.end == VmEnd::Guest(GuestEnd::ExitPort(0)),
        "guest {name} ({profile}) failed, ended {:?}:\n{text}",
        outcome.end
    );
    assert!(!text.contains("not ok"), "{text}");
    outcome
}

#[test]
fn guest_reads_the_profile_cpuid() {
    let table = [
        (LwpProfile::Emulated, GuestLwpSupport::Shim),
        (LwpProfile::Precise, GuestLwpSupport::Shim),
        (LwpProfile::Bulldozer, GuestLwpSupport::Shim),
        (LwpProfile::Bulldozer, GuestLwpSupport::Stock),
        (LwpProfile::Off, GuestLwpSupport::Shim),
    ];
    for (profile, guest) in table {
        let (outcome, text) = boot("cpuid", profile, guest, "");
        assert_eq!(outcome.end, VmEnd::Guest(GuestEnd::ExitPort(0)), "{text}");
        let seen: Vec<[u64; 5]> = text
            .lines()
            .filter_map(|l| l.strip_prefix("cpuid "))
            .map(|l| {
                let v: Vec<u64> = l
                    .split(' ')
                    .map(|x| u64::from_str_radix(x.trim_start_matches("0x"), 16).unwrap())
                    .collect();
                [v[0], v[1], v[2], v[3], v[4]]
            })
            .collect();
        let want = vmm::machine::cpuid_table(profile, guest).unwrap();
        let find = |leaf: u64| {
            let w = want.iter().find(|e| u64::from(e.leaf) == leaf);
            w.map(|e| {
                [
                    u64::from(e.eax),
                    u64::from(e.ebx),
                    u64::from(e.ecx),
                    u64::from(e.edx),
                ]
            })
            .unwrap_or([0; 4])
        };
        for s in &seen {
            let w = find(s[0]);
            match s[0] {
                0x8000_0001 => assert_eq!(s[3] & 1 << 15, w[2] & 1 << 15, "{profile}: LWP flag"),
                0x8000_0000 => assert_eq!(s[1], w[0], "{profile}: max extended leaf"),
                _ => assert_eq!(&s[1..], &w[..], "{profile} {guest:?}: leaf {:#x}", s[0]),
            }
        }
        assert_eq!(seen.len(), 5, "{text}");
    }
}

#[test]
fn lwp_msrs_follow_the_model() {
    let outcome = passes("msr", LwpProfile::Emulated);
    assert_eq!(outcome.metrics.total.msr_gp, 3, "three refused WRMSRs");
    passes("msr", LwpProfile::Off);
}

/// LDMXCSR, STMXCSR, VERR, VERW and LOCK CMPXCHG16B at CPL0 give what the
/// CPU gives, through the real vCPU thread and its seccomp filter: where
/// the host's emulator lacks them (kvm_pvm) lwpvmm carries them out and
/// counts them; where the CPU runs CPL0 they never exit.
#[test]
fn cpl0_instructions_the_host_emulator_lacks_give_what_the_cpu_gives() {
    let (outcome, text) = boot("kernel_insn", LwpProfile::Off, GuestLwpSupport::Shim, "");
    let t = &outcome.metrics.total;
    eprintln!(
        "carried out by lwpvmm: {} MXCSR, {} VERR/VERW, {} CMPXCHG16B",
        t.cpl0_mxcsr, t.cpl0_verw, t.cpl0_cmpxchg16b
    );
    assert!(
        text.contains(" passed, 0 failed") && outcome.end == VmEnd::Guest(GuestEnd::ExitPort(0)),
        "{text}"
    );
    // Each counter is all or nothing: the host's emulator lacks an
    // instruction or runs it.
    for (what, n, all) in [
        ("MXCSR", t.cpl0_mxcsr, 2),
        ("VERR/VERW", t.cpl0_verw, 5),
        ("CMPXCHG16B", t.cpl0_cmpxchg16b, 2),
    ] {
        assert!(n == 0 || n == all, "{what}: {n} of {all} carried out");
    }
}

#[test]
fn each_lwp_instruction_through_the_shim() {
    let outcome = passes("insn", LwpProfile::Emulated);
    assert!(outcome.metrics.total.ud_handled > 40);
    assert_eq!(outcome.metrics.total.ud_faults, 0);
    let lwp = outcome.lwp[0];
    assert_eq!(lwp.records_missed, 4);
    // CPL0 LWP instructions: emulated after KVM's emulator gives up (kvm_pvm),
    // or through the shim (hosts that run CPL0 natively).
    assert!(outcome.metrics.total.cpl0_lwp == 3 || outcome.metrics.total.ud_handled >= 53);
}

/// LWP instructions in a compatibility-mode (32-bit) code segment, through
/// the same #UD doorbell: decoded with the segment's size.
#[test]
fn lwp_instructions_in_a_32_bit_code_segment() {
    let outcome = passes("compat32", LwpProfile::Emulated);
    assert!(outcome.metrics.total.ud_handled >= 6);
    assert_eq!(outcome.metrics.total.ud_faults, 0);
}

#[test]
fn lwp_instructions_are_ud_without_the_profile_or_the_shim() {
    // The guest's #UD handler reports an unexpected #UD with exit value
    // 0x80 | 6: the VMM answered "not LWP" and the guest's own path ran.
    for (profile, guest) in [
        (LwpProfile::Off, GuestLwpSupport::Shim),
        (LwpProfile::Emulated, GuestLwpSupport::Stock),
    ] {
        let (outcome, text) = boot("insn", profile, guest, "");
        assert_eq!(
            outcome.end,
            VmEnd::Guest(GuestEnd::ExitPort(0x86)),
            "{profile} {guest:?}:\n{text}"
        );
        assert_eq!(outcome.metrics.total.ud_handled, 0);
    }
}

#[test]
fn bad_lwpcbs_get_the_documented_faults() {
    let outcome = passes("bad_lwpcb", LwpProfile::Emulated);
    assert_eq!(outcome.metrics.total.ud_faults, 8, "eight faulting LLWPCBs");
    // (not present, protection, #GP) as bad_lwpcb.c's cases add up
    let m = &outcome.metrics.total;
    let denials = [m.denied_not_present, m.denied_protection, m.denied_gp];
    assert_eq!(denials, [1, 2, 5], "denials by the check that refused them");
    assert_eq!(outcome.metrics.vcpus.len(), 1, "per-vCPU counters");
}

#[test]
fn threshold_interrupt_once_per_crossing() {
    let outcome = passes("threshold", LwpProfile::Emulated);
    assert_eq!(
        outcome.metrics.total.lwp_interrupts,
        2 + 200,
        "two crossings, then a storm of 200"
    );
    assert_eq!(outcome.lwp[0].interrupts_due, 2 + 200);
}

#[test]
fn two_vcpus_never_mix_records() {
    let (outcome, text) = boot_with("smp", LwpProfile::Emulated, GuestLwpSupport::Shim, "", 2);
    assert!(
        outcome.end == VmEnd::Guest(GuestEnd::ExitPort(0)) && text.contains("7 passed, 0 failed"),
        "ended {:?}:\n{text}",
        outcome.end
    );
    assert_eq!(outcome.lwp.len(), 2);
    for (id, unit) in outcome.lwp.iter().enumerate() {
        assert_eq!(
            unit.records_stored, 200,
            "vCPU {id}'s own unit stored its records"
        );
    }
}

#[test]
fn two_tasks_keep_their_own_records_across_switches() {
    let outcome = passes("twotask", LwpProfile::Emulated);
    let calls = outcome.metrics.total.lwp_state_calls;
    assert!(
        calls >= 4 && calls.is_multiple_of(2),
        "a save and a restore per switch: {calls}"
    );
    assert_eq!(outcome.lwp[0].records_stored, 2 * 1500, "the counts add up");
    assert_eq!(outcome.lwp[0].records_missed, 0);
}

#[test]
fn hostile_guest_gets_nowhere() {
    let outcome = passes("hostile", LwpProfile::Emulated);
    assert_eq!(
        outcome.metrics.total.lwp_interrupts_suppressed, 50,
        "an interrupt storm on an exception vector"
    );
    assert_eq!(outcome.metrics.total.lwp_interrupts, 0);
    assert_eq!(
        outcome.metrics.total.ud_not_lwp, 3,
        "bogus frame, no #UD, CPL3 doorbell"
    );
    assert_eq!(outcome.metrics.total.lwp_state_calls, 3);
    assert!(outcome.metrics.total.llwpcb >= 4000, "LLWPCB storm");
}

#[test]
fn page_tables_changed_by_another_vcpu_are_rechecked() {
    let (outcome, text) = boot_with(
        "pt_race",
        LwpProfile::Emulated,
        GuestLwpSupport::Shim,
        "",
        2,
    );
    assert!(
        outcome.end == VmEnd::Guest(GuestEnd::ExitPort(0)) && text.contains("5 passed, 0 failed"),
        "ended {:?}:\n{text}",
        outcome.end
    );
    let unit = outcome.lwp[0];
    assert_eq!(unit.records_stored + unit.records_missed, 400);
    assert_eq!(
        unit.records_missed, unit.store_faults,
        "every miss is a refused store"
    );
}

#[test]
fn sampled_events_stay_in_their_address_space() {
    let trace = std::env::temp_dir().join(format!(
        "lwpvmm-test-{}-sample_as.trace",
        std::process::id()
    ));
    let profiling = Profiling {
        sample_hz: 1000,
        trace: Some(trace.clone()),
        ..Default::default()
    };
    let (outcome, text) = boot_profiled(
        "sample_as",
        LwpProfile::Emulated,
        GuestLwpSupport::Shim,
        "",
        1,
        profiling,
    );
    assert!(
        outcome.end == VmEnd::Guest(GuestEnd::ExitPort(0)) && text.contains("3 passed, 0 failed"),
        "{text}"
    );
    let kicks = outcome.metrics.total.sampler_kicks;
    let charged = outcome.metrics.total.samples_charged;
    assert!(
        charged > 0 && charged < kicks,
        "samples in the other address space are not charged: {charged} of {kicks}"
    );
    let mut spaces = std::collections::BTreeSet::new();
    lwpvmm::profile::trace::for_each_record(
        &trace,
        |_| {},
        |r| {
            if r.event == 5 {
                spaces.insert(r.cr3);
            }
        },
    )
    .unwrap();
    assert_eq!(
        spaces.len(),
        1,
        "every CNH record was stored in one address space: {spaces:x?}"
    );
    std::fs::remove_file(trace).unwrap();
}

/// The sampler kicks a vCPU only while its unit has a clock event armed:
/// none at all for a guest that never enables CNH or RNH, although the
/// profile offers them and the sampler runs.
#[test]
fn the_sampler_kicks_only_armed_vcpus() {
    // (lwp= of the throughput guest, kicked)
    for (lwp, kicked) in [(0, false), (1, true)] {
        let profiling = Profiling {
            sample_hz: 1000,
            ..Default::default()
        };
        let cmdline = format!("lwp={lwp} work=300000000");
        let (outcome, text) = boot_profiled(
            "throughput",
            LwpProfile::Emulated,
            GuestLwpSupport::Shim,
            &cmdline,
            1,
            profiling,
        );
        assert_eq!(outcome.end, VmEnd::Guest(GuestEnd::ExitPort(0)), "{text}");
        let m = &outcome.metrics.total;
        assert_eq!(
            m.sampler_kicks > 0,
            kicked,
            "lwp={lwp}: {} kicks",
            m.sampler_kicks
        );
        assert_eq!(m.samples_charged > 0, kicked, "lwp={lwp}");
    }
}

/// The trace has the call stack of each sampled record, unwound by the
/// guest's frame pointers; the report folds it, outermost first, and
/// writes it as a pprof profile whose samples have the same stacks.
#[test]
fn sampled_records_have_call_stacks_in_the_report_and_the_pprof() {
    let dir = std::env::temp_dir().join(format!("lwpvmm-test-{}-stacks", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (trace, folded, pprof) = (dir.join("t"), dir.join("f"), dir.join("p.pb.gz"));
    let profiling = Profiling {
        sample_hz: 1000,
        trace: Some(trace.clone()),
        ..Default::default()
    };
    let (outcome, text) = boot_profiled(
        "demo",
        LwpProfile::Emulated,
        GuestLwpSupport::Shim,
        "",
        1,
        profiling,
    );
    assert_eq!(outcome.end, VmEnd::Guest(GuestEnd::ExitPort(0)), "{text}");
    let elf = guest_file("demo");
    let out = lwpvmm(&[
        "report",
        trace.to_str().unwrap(),
        "--symbols",
        elf.to_str().unwrap(),
        "--folded",
        folded.to_str().unwrap(),
        "--pprof",
        pprof.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let lines = std::fs::read_to_string(&folded).unwrap();
    for work in ["work_1", "work_2", "work_4"] {
        assert!(
            lines.lines().any(|l| l.contains(&format!(";main;{work} "))),
            "{work} is called from main:\n{lines}"
        );
    }
    let profile = lwpvmm::profile::pprof::read(&std::fs::read(&pprof).unwrap()).unwrap();
    let name = |location: u64| {
        let l = &profile.location[location as usize - 1];
        let f = &profile.function[l.line.first()?.function_id as usize - 1];
        Some(profile.string_table[f.name as usize].clone())
    };
    let stacked = profile
        .sample
        .iter()
        .filter(|s| s.location_id.len() >= 2)
        .filter(|s| name(s.location_id[0]).as_deref() == Some("work_4"))
        .filter(|s| name(s.location_id[1]).as_deref() == Some("main"))
        .count();
    assert!(stacked > 0, "a work_4 sample called from main: {profile:?}");
    std::fs::remove_dir_all(dir).unwrap();
    std::fs::remove_file(elf).unwrap();
}

#[test]
fn precise_events_by_single_stepping() {
    for profile in [LwpProfile::Precise, LwpProfile::Bulldozer] {
        let outcome = passes("precise", profile);
        assert_eq!(
            outcome.metrics.total.steps,
            194 + 11,
            "{profile}: one step per stepped instruction (the first after LLWPCB is counted by it)"
        );
        assert_eq!(outcome.lwp[0].records_stored, 12 + 6 + 1, "{profile}");
    }
}

/// Writes an embedded guest to a file of its own (tests run in parallel).
fn guest_file(name: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path =
        std::env::temp_dir().join(format!("lwpvmm-test-{}-{n}-{name}.elf", std::process::id()));
    std::fs::write(&path, lwpvmm::guests::get(name).unwrap()).unwrap();
    path
}

#[test]
fn exit_port_status_is_qemu_compatible() {
    let elf = guest_file("minimal");
    let kernel = elf.to_str().unwrap();
    // (command line, exit status: (value << 1) | 1)
    for (cmdline, status) in [("", 1), ("exit=21", 43), ("exit=127", 255)] {
        let out = lwpvmm(&[
            "run",
            "--kernel",
            kernel,
            "--memory",
            "32",
            "--cmdline",
            cmdline,
        ]);
        assert_eq!(out.status.code(), Some(status), "{cmdline}: {out:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("minimal guest: hello"));
    }
    std::fs::remove_file(elf).unwrap();
}

/// An unhandled exit ends the run with a message naming it, and the
/// `--metrics` file still holds what was counted, with the error.
#[test]
fn unhandled_exit_names_exit_vcpu_and_rip() {
    let elf = guest_file("unhandled");
    let metrics = elf.with_extension("json");
    let out = lwpvmm(&[
        "run",
        "--kernel",
        elf.to_str().unwrap(),
        "--metrics",
        metrics.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    for want in ["vCPU 0", "unhandled exit MmioWrite", "RIP 0x"] {
        assert!(err.contains(want), "missing `{want}` in: {err}");
    }
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(&metrics).unwrap()).unwrap();
    assert!(
        m["error"]
            .as_str()
            .is_some_and(|e| e.contains("unhandled exit")),
        "{m}"
    );
    assert!(m["vm"]["exits_mmio"].as_u64() > Some(0), "{m}");
    std::fs::remove_file(elf).unwrap();
    std::fs::remove_file(metrics).unwrap();
}

/// A kernel file cut short, as a failed copy leaves it.
fn truncated_kernel() -> PathBuf {
    let path = guest_file("minimal");
    let image = std::fs::read(&path).unwrap();
    std::fs::write(&path, &image[..image.len() / 2]).unwrap();
    path
}

/// The example program relinked at kernel addresses (virtual != physical),
/// as a vmlinux is.
fn kernel_linked_program() -> PathBuf {
    let path = guest_file("example-hot");
    let mut elf = std::fs::read(&path).unwrap();
    let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
    let phentsize = usize::from(u16::from_le_bytes([elf[0x36], elf[0x37]]));
    let phnum = usize::from(u16::from_le_bytes([elf[0x38], elf[0x39]]));
    for at in (0..phnum).map(|i| phoff + i * phentsize) {
        if elf[at..at + 4] == 1u32.to_le_bytes() {
            let vaddr = u64::from_le_bytes(elf[at + 0x10..at + 0x18].try_into().unwrap());
            let high = vaddr | 0xffff_ffff_8000_0000;
            elf[at + 0x10..at + 0x18].copy_from_slice(&high.to_le_bytes());
        }
    }
    std::fs::write(&path, elf).unwrap();
    path
}

#[test]
fn errors_say_what_to_fix() {
    let missing = std::env::temp_dir().join("lwpvmm-test-no-such-kernel");
    let text_file = std::env::temp_dir().join(format!("lwpvmm-test-{}-text", std::process::id()));
    std::fs::write(&text_file, "not a kernel").unwrap();
    let minimal = guest_file("minimal");
    let truncated = truncated_kernel();
    let kernel_linked = kernel_linked_program();
    let (m, t, k) = (
        minimal.to_str().unwrap(),
        truncated.to_str().unwrap(),
        kernel_linked.to_str().unwrap(),
    );
    let no_dir = "/nonexistent-lwpvmm-dir/out";
    // A directory that is not a snapshot.
    let empty =
        std::env::temp_dir().join(format!("lwpvmm-test-{}-not-a-snapshot", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let e = empty.to_str().unwrap();
    // (arguments, text the error must contain)
    let table: [(Vec<&str>, &str); 19] = [
        (
            vec!["run", "--kernel", missing.to_str().unwrap()],
            "cannot read kernel",
        ),
        (
            vec!["run", "--kernel", text_file.to_str().unwrap()],
            "neither an x86-64 ELF nor a Linux bzImage",
        ),
        (vec!["run", "--kernel", m, "--memory", "4"], "--memory"),
        (vec!["run", "--kernel", m, "--vcpus", "0"], "1..=254"),
        (vec!["run", "--kernel", m, "--vcpus", "1000"], "1..=254"),
        (vec!["run", "--kernel", t], "the kernel file is truncated"),
        (
            vec!["run", "--kernel", m, "--metrics", no_dir],
            "--metrics /nonexistent-lwpvmm-dir/out",
        ),
        (
            vec!["run", "--kernel", m, "--trace", no_dir],
            "--trace /nonexistent-lwpvmm-dir/out",
        ),
        (
            vec!["run", "--kernel", m, "--serial", no_dir],
            "--serial /nonexistent-lwpvmm-dir/out",
        ),
        (
            vec![
                "run",
                "--kernel",
                m,
                "--snapshot-dir",
                "/proc/lwpvmm-snapshots",
            ],
            "--snapshot-dir /proc/lwpvmm-snapshots",
        ),
        (
            vec!["run", "--kernel", m, "--trace-max", "lots"],
            "not a size",
        ),
        (vec!["profile", k], "lwpvmm run --kernel"),
        // An option --disk does not have, not a file that is missing.
        (
            vec!["run", "--kernel", m, "--disk", "img,rw"],
            "`rw` is not a --disk option: the only one is `,ro`",
        ),
        // The range the README gives, in the units written.
        (
            vec!["run", "--kernel", m, "--memory", "2T"],
            "give 16 MiB to 1 TiB",
        ),
        (
            vec!["run", "--kernel", m, "--memory", "2000000"],
            "give 16 MiB to 1 TiB",
        ),
        (
            vec!["run", "--kernel", m, "--sample-hz", "-5"],
            "0..=100000",
        ),
        (vec!["profile", k, "--sample-hz", "-5"], "0..=100000"),
        (vec!["restore", e], "is not a snapshot: it has no state.bin"),
        (
            vec!["firecracker", "--describe-snapshot", e],
            "is not a snapshot: it has no state.bin",
        ),
    ];
    for (args, want) in table {
        let out = lwpvmm(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: `{want}` not in: {err}");
        assert!(
            out.stdout.is_empty(),
            "{args:?}: refused before the guest ran: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    for f in [text_file, minimal, truncated, kernel_linked] {
        std::fs::remove_file(f).unwrap();
    }
    std::fs::remove_dir(empty).unwrap();
}

/// A console that cannot be written stops the run at the first byte lost,
/// with an error that says so and names --serial, instead of a run that
/// goes on, and exits 0, with its console lost: here the --serial file's
/// size limit (RLIMIT_FSIZE 0, with SIGXFSZ ignored, so that the write
/// fails as on a full file system).
#[test]
fn a_console_that_cannot_be_written_fails_the_run() {
    require_kvm();
    let elf = guest_file("minimal");
    let console = elf.with_extension("console");
    let out = common::output_within(
        std::process::Command::new("sh")
            .args(["-c", "ulimit -f 0; trap '' XFSZ; exec \"$0\" \"$@\""])
            .arg(env!("CARGO_BIN_EXE_lwpvmm"))
            .args(["run", "--kernel", elf.to_str().unwrap(), "--serial"])
            .arg(&console),
        common::RUN_LIMIT,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for want in ["writing the guest's console failed", "--serial"] {
        assert!(err.contains(want), "`{want}` not in: {err}");
    }
    std::fs::remove_file(elf).unwrap();
    std::fs::remove_file(console).unwrap();
}

/// `--cmdline-append` adds to the command line, the default one or
/// --cmdline's, without copying it: the minimal guest exits with the value
/// of the `exit=` it finds there.
#[test]
fn cmdline_append_adds_words_to_the_command_line() {
    let elf = guest_file("minimal");
    let kernel = elf.to_str().unwrap();
    // (options, exit status: (value << 1) | 1)
    let table: [(&[&str], i32); 4] = [
        (&["--cmdline-append", "exit=21"], 43),
        (&["--cmdline", "quiet", "--cmdline-append", "exit=5"], 11),
        (&["--cmdline", "", "--cmdline-append", "exit=9"], 19),
        (
            &["--cmdline-append", "quiet", "--cmdline-append", "exit=7"],
            15,
        ),
    ];
    for (options, status) in table {
        let mut args = vec!["run", "--kernel", kernel, "--memory", "32"];
        args.extend_from_slice(options);
        let out = lwpvmm(&args);
        assert_eq!(out.status.code(), Some(status), "{options:?}: {out:?}");
    }
    std::fs::remove_file(elf).unwrap();
}

/// A snapshot that was asked for and failed fails the run (status 2), after
/// the guest ran to its end.
#[test]
fn a_failed_snapshot_fails_the_run() {
    let replay = guest_file("replay");
    let dir = std::env::temp_dir().join(format!("lwpvmm-test-{}-badsnap", std::process::id()));
    std::fs::create_dir_all(dir.join("state.bin")).unwrap();
    let out = lwpvmm(&[
        "run",
        "--kernel",
        replay.to_str().unwrap(),
        "--memory",
        "64",
        "--cmdline",
        "iterations=3000 snap=100",
        "--snapshot-dir",
        dir.to_str().unwrap(),
        "--snapshot-on-port",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("snapshot to"), "{err}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("replay digest"),
        "the guest ran on"
    );
    std::fs::remove_dir_all(dir).unwrap();
    std::fs::remove_file(replay).unwrap();
}

#[test]
fn demo_succeeds() {
    let out = lwpvmm(&["demo"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("result: success"), "{text}");
    assert!(
        text.contains("14 records: 10 LWPVAL samples, 4 LWPINS marks"),
        "{text}"
    );
}

#[test]
fn privilege_comes_from_ss_not_cs() {
    let outcome = passes("privilege", LwpProfile::Emulated);
    assert_eq!(
        outcome.metrics.total.ud_not_lwp, 4,
        "three impossible frames and the forged one from CPL3"
    );
    assert_eq!(
        outcome.metrics.total.lwpins, 2,
        "the two frames the CPU pushes"
    );
}

#[test]
fn protection_keys_are_honoured_where_offered() {
    let (outcome, text) = boot("pku", LwpProfile::Emulated, GuestLwpSupport::Shim, "");
    assert!(
        outcome.end == VmEnd::Guest(GuestEnd::ExitPort(0)) && text.contains(" 0 failed"),
        "{text}"
    );
    let offered = text.contains("pku: offered");
    assert!(
        offered || text.contains("pku: not offered"),
        "the guest says which case ran: {text}"
    );
    println!(
        "protection keys {}offered here",
        if offered { "" } else { "not " }
    );
}

/// `--trace-max` bounds the trace: the records past it are counted, not
/// written, and the trace and its report say so.
#[test]
fn the_trace_stops_at_its_limit() {
    let replay = guest_file("replay");
    let dir = std::env::temp_dir().join(format!("lwpvmm-test-{}-tracemax", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (trace, metrics) = (dir.join("t.trace"), dir.join("m.json"));
    let out = lwpvmm(&[
        "run",
        "--kernel",
        replay.to_str().unwrap(),
        "--memory",
        "64",
        "--trace",
        trace.to_str().unwrap(),
        "--trace-max",
        "4K",
        "--metrics",
        metrics.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let size = std::fs::metadata(&trace).unwrap().len();
    assert!(
        size <= 4096 + 200,
        "header, records within 4 KiB, the limit line: {size}"
    );
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(&metrics).unwrap()).unwrap();
    assert!(m["vm"]["trace_dropped"].as_u64().unwrap() > 500, "{m}");
    let report = lwpvmm(&["report", trace.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&report.stderr);
    assert!(report.status.success(), "{report:?}");
    assert!(
        err.contains("reached its size limit of 4096 bytes"),
        "{err}"
    );
    std::fs::remove_dir_all(dir).unwrap();
    std::fs::remove_file(replay).unwrap();
}

/// Whole-guest samples never touch the guest's LWP state: the replay
/// guest's ring (its digest, head, tail, MissedEvents and counter) is the
/// same byte for byte with `--profile-kernel` at 10 kHz as without.
#[test]
fn whole_guest_samples_leave_the_lwp_ring_as_it_was() {
    let replay = guest_file("replay");
    let digest = |extra: &[&str]| -> String {
        let mut args = vec![
            "run",
            "--kernel",
            replay.to_str().unwrap(),
            "--memory",
            "64",
            "--cmdline",
            "iterations=20000",
        ];
        args.extend_from_slice(extra);
        let out = lwpvmm(&args);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines()
            .find(|l| l.starts_with("replay digest"))
            .unwrap_or_else(|| panic!("{extra:?}: no digest in {text}"))
            .to_owned()
    };
    let metrics =
        std::env::temp_dir().join(format!("lwpvmm-test-{}-whole.json", std::process::id()));
    let off = digest(&["--sample-hz", "0"]);
    let on = digest(&[
        "--profile-kernel",
        "--sample-hz",
        "10000",
        "--metrics",
        metrics.to_str().unwrap(),
    ]);
    assert_eq!(off, on);
    // The samples were taken: the comparison is not of two quiet runs.
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(&metrics).unwrap()).unwrap();
    let taken: u64 = ["guest_kernel_samples", "guest_user_samples"]
        .iter()
        .map(|k| m["vm"][k].as_u64().unwrap_or(0))
        .sum();
    assert!(taken > 0, "no whole-guest sample was taken: {m}");
    std::fs::remove_file(metrics).unwrap();
    std::fs::remove_file(replay).unwrap();
}
