//! lwpvmm boots the Linux guest of resources/linux: the SMP kernel built
//! from Debian's linux-source-6.1 with our host-quirk patches only (built
//! once, then cached under the target directory), the lwpvmm guest module
//! that /init loads first, and the LWP self-test as /init, which runs
//! unmodified -mlwp programs: records, two interleaved processes, faults,
//! the threshold interrupt, a sampled profile whose host-side report these
//! tests check, a 32-bit program, and on SMP processes and threads
//! recording at once on different CPUs, a migrating process, the interrupt
//! reaching the right CPU, and fork and exec storms; under `--lwp precise`
//! exact instruction and branch counts; on one, two and four vCPUs, and
//! across a snapshot of the running guest.
//!
//! These tests need /dev/kvm and fail, loudly, where it is missing; building
//! the kernel needs the packages build.sh installs (apt-get, as root).

// A test: a failed setup or expectation stops it with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Output};

use common::{
    Console, PROGRAMS, RUN_LIMIT, SYSENTRY, assert_lines, assert_syscalls_completed, linux,
    output_within, require_kvm,
};

fn run_linux(extra: &[&str]) -> (Output, Console) {
    run_image("vmlinux", extra)
}

/// As [`run_linux`], booting the kernel file `image` of the guest's build.
fn run_image(image: &str, extra: &[&str]) -> (Output, Console) {
    require_kvm();
    let dir = linux();
    let kernel = dir.join(image);
    let initramfs = dir.join("initramfs.cpio");
    let mut args = vec![
        "run",
        "--kernel",
        kernel.to_str().expect("UTF-8 path"),
        "--initramfs",
        initramfs.to_str().expect("UTF-8 path"),
        "--memory",
        "64",
    ];
    args.extend_from_slice(extra);
    let out = output_within(common::command().args(&args), RUN_LIMIT);
    let console = Console::of(&out);
    (out, console)
}

fn leaf_of_cpuid_command(profile: &str, guest: &str) -> String {
    let out = output_within(
        common::command().args(["cpuid", "--lwp", profile, "--guest", guest, "--json"]),
        RUN_LIMIT,
    );
    assert!(out.status.success(), "{out:?}");
    let entries: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("JSON");
    let e = entries
        .iter()
        .find(|e| e["leaf"] == 0x8000_001Cu64)
        .expect("leaf 0x8000001c");
    let r = |name: &str| e[name].as_u64().expect("JSON integer");
    format!(
        "leaf 0x8000001c: eax={:x} ebx={:x} ecx={:x} edx={:x}",
        r("eax"),
        r("ebx"),
        r("ecx"),
        r("edx")
    )
}

/// Every function row of a report: (function, samples), most first.
fn functions(report: &str) -> Vec<(&str, u64)> {
    report
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3)
                .then(|| f[0].parse::<u64>().ok().map(|n| (f[2], n)))
                .flatten()
        })
        .collect()
}

/// What a full self-test with LWP prints last: 11 checks of its own, one
/// per program.
const ALL_PASSED: &str = "lwp-linux-selftest: 22 passed, 0 failed";

/// Asserts that `console` is a whole, passing self-test on `cpus` CPUs.
fn assert_selftest_passed(console: &Console, cpus: u8) {
    assert_selftest_passed_with(console, cpus, ALL_PASSED);
}

/// As [`assert_selftest_passed`], with the summary line `summary`.
fn assert_selftest_passed_with(console: &Console, cpus: u8, summary: &str) {
    let cpus_line = format!("lwp-linux-selftest: cpus {cpus}");
    let mut lines: Vec<String> = PROGRAMS.iter().map(|p| format!("ok - {p}")).collect();
    lines.extend(
        [
            // The TSC's frequency comes from kvmclock (src/vmm/vcpu/cpuid.rs):
            // calibrating it against the PM timer fails on a loaded host.
            "kvm-clock: Using msrs 4b564d01 and 4b564d00",
            "lwpvmm: LWP for user tasks",
            "ok - the lwpvmm guest module loads",
            "lwp-linux-selftest: kernel 6.1.",
            "ok - every CPU is in /proc/cpuinfo and its CPUID topology names it by its APIC ID",
            "ok - LWP_CFG reads what the kernel enabled at boot, on every CPU",
            SYSENTRY,
            summary,
            &cpus_line,
        ]
        .map(String::from),
    );
    assert_lines(console, &lines);
    assert!(!console.contains("ACPI Error"), "{console}");
    // The TSC frequency comes from kvmclock: a calibration against the PM
    // timer fails on a loaded host and hangs the boot. (The TSC itself may
    // be marked unstable: the invariant TSC is hidden, and the guest keeps
    // kvm-clock as its clocksource, docs/snapshot.md.)
    assert!(
        !console.contains("calibration failed"),
        "the kernel calibrated its TSC and failed:\n{console}"
    );
    assert!(
        console.contains("Switched to clocksource kvm-clock")
            && !console.contains("Switched to clocksource tsc"),
        "the guest's clocksource is kvm-clock:\n{console}"
    );
}

/// The self-test on two vCPUs, traced, with a snapshot in its middle
/// (/init asks for it through the snapshot debug port while other programs
/// are still to run on both CPUs): it passes, the trace's profile puts
/// lwp-hot's hot function on top, and the snapshot, restored in a new
/// process, completes the self-test with everything passing. One run for
/// the three, because each boot costs about 12 s of CI here; its name sorts
/// first so that the longest test starts first.
#[test]
fn a_guest_on_two_vcpus_passes_profiles_and_resumes_from_a_snapshot() {
    let trace = linux().join("selftest.trace");
    let trace_arg = trace.to_str().expect("UTF-8 path");
    let dir = linux().join("smp-snapshot");
    let _ = std::fs::remove_dir_all(&dir);
    let dir_arg = dir.to_str().expect("UTF-8 path");
    let cmdline = format!("{} lwpsnap=1", lwpvmm::vmm::boot::LINUX_CMDLINE);
    let (out, console) = run_linux(&[
        "--lwp",
        "emulated",
        "--vcpus",
        "2",
        "--trace",
        trace_arg,
        "--cmdline",
        &cmdline,
        "--snapshot-dir",
        dir_arg,
        "--snapshot-on-port",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "lwpvmm run did not end with the guest's power-off:\n{console}"
    );
    assert_selftest_passed(&console, 2);
    assert!(
        console.contains("smp: Brought up 1 node, 2 CPUs"),
        "{console}"
    );
    assert!(
        console.contains(&leaf_of_cpuid_command("emulated", "shim")),
        "the guest's leaf differs from `lwpvmm cpuid`:\n{console}"
    );
    let at_ms = |console: &str, prefix: &str| -> u64 {
        console
            .lines()
            .find_map(|l| {
                l.trim_end()
                    .strip_prefix(prefix)?
                    .strip_suffix(" ms")?
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("no {prefix:?} line:\n{console}"))
    };
    let snapshot_ms = at_ms(&console, "snapshot point at ");

    // The module named each process's executable (state call 9), with its
    // build ID: the report finds lwp-hot's own file by its guest path under
    // a sysroot (a directory of the guest's programs, or the initramfs the
    // guest booted), as it does from lwp-hot given as the one ELF.
    let traced = std::fs::read_to_string(&trace).expect("read the trace");
    let hot_mapping = traced
        .lines()
        .find(|l| l.starts_with("{\"mapping\"") && l.contains("\"path\":\"/lwp-hot\""))
        .unwrap_or_else(|| panic!("no mapping line names /lwp-hot"));
    assert!(!hot_mapping.contains("\"build_id\":\"\""), "{hot_mapping}");
    for (option, file) in [
        ("--symbols", linux().join("bin/lwp-hot")),
        ("--sysroot", linux().join("bin")),
        ("--sysroot", linux().join("initramfs.cpio")),
    ] {
        let report = output_within(
            common::command()
                .args(["report", trace_arg, option])
                .arg(&file),
            RUN_LIMIT,
        );
        let text = String::from_utf8_lossy(&report.stdout);
        assert!(report.status.success(), "{option} {file:?}: {report:?}");
        // Every frame is named from lwp-hot's own ELF, and each function's
        // share is its share of the work (1, 2 and 4 units: 14, 29 and 57
        // points) within 5 points: the guest kernel's time at emulated CPL0
        // (the ring drain's #UD path, interrupts) is charged to no user
        // sample (a sample charges at most one sampling period), where it
        // once went to the next one and put hot_2 level with hot_4.
        let rows = functions(&text);
        let samples = |name: &str| rows.iter().find(|(f, _)| *f == name).map_or(0, |r| r.1);
        let hot: u64 = ["hot_1", "hot_2", "hot_4"].iter().map(|f| samples(f)).sum();
        assert!(hot >= 100, "{option} {file:?}: {text}");
        for (function, units) in [("hot_1", 1.0), ("hot_2", 2.0), ("hot_4", 4.0)] {
            let share = 100.0 * samples(function) as f64 / hot as f64;
            let want = 100.0 * units / 7.0;
            assert!(
                (share - want).abs() <= 5.0,
                "{option} {file:?}: {function} has {share:.1} % of the samples, its work {want:.1} %: {text}"
            );
        }
    }
    let _ = std::fs::remove_file(&trace);

    // The restore comes at least 30 s after the snapshot: a guest whose
    // clock followed the host's meanwhile would show the jump.
    let taken = std::fs::metadata(dir.join("state.bin"))
        .and_then(|m| m.modified())
        .expect("the snapshot's state file");
    let waited = taken.elapsed().unwrap_or_default();
    std::thread::sleep(std::time::Duration::from_secs(31).saturating_sub(waited));
    let restored = output_within(common::command().args(["restore", dir_arg]), RUN_LIMIT);
    let after = Console::of(&restored);
    assert_eq!(restored.status.code(), Some(0), "{after}");
    assert!(
        after.contains("after the snapshot point") && !after.contains("self-test starting"),
        "the restored guest resumes at the port write:\n{after}"
    );
    // Guest time goes on from the snapshot (kvmclock restored as it was,
    // not moved on by the host's time meanwhile): the port write and the
    // line after it are moments apart by the guest's clock, and no RCU
    // stall follows.
    let resumed_ms = at_ms(&after, "after the snapshot point at ");
    assert!(
        resumed_ms.saturating_sub(snapshot_ms) < 10_000,
        "the guest's clock jumped from {snapshot_ms} ms to {resumed_ms} ms across the restore:\n{after}"
    );
    assert!(!after.contains("detected stalls"), "{after}");
    for program in &PROGRAMS[5..] {
        assert!(
            after.contains(&format!("ok - {program}")),
            "{program}:\n{after}"
        );
    }
    assert!(after.contains(ALL_PASSED), "{after}");
    assert!(!after.contains("not ok"), "{after}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The self-test under `--lwp precise` on one vCPU: the module reports
/// single-step traps, and the precise-event program counts a loop's
/// instructions and branches exactly, also while its own debugger
/// single-steps it.
///
/// On kvm_pvm its processes' system calls are lwpvmm's to complete (the
/// SYSCALL quirk's fixup, on by default there): the metrics count them.
#[test]
fn precise_events_count_a_linux_loop_exactly() {
    let metrics = linux().join("precise.metrics.json");
    let (out, console) = run_linux(&[
        "--lwp",
        "precise",
        "--metrics",
        metrics.to_str().expect("UTF-8 path"),
    ]);
    assert_eq!(out.status.code(), Some(0), "{console}");
    assert_selftest_passed_with(&console, 1, "lwp-linux-selftest: 23 passed, 0 failed");
    assert_syscalls_completed(&metrics);
    for line in [
        "precise events",
        "ok - IRE exact for a 2000-instruction loop",
        "ok - BRE exact for its 1000 branches",
        "ok - BRE records in the loop name its branch and target",
        "ok - under ptrace: the debugger sees each of its 50 single steps and an INT3, and IRE stays exact",
        "ok - /lwp-precise",
    ] {
        assert!(console.contains(line), "missing {line:?}:\n{console}");
    }
}

/// Also the four-vCPU run (more vCPUs than this host has cores): the guest
/// sees exactly four CPUs, each named by its APIC ID in every topology
/// leaf.
#[test]
fn a_stock_guest_sees_the_leaf_but_runs_no_lwp_programs() {
    let (out, console) = run_linux(&[
        "--lwp",
        "bulldozer",
        "--guest",
        "stock",
        "--vcpus",
        "4",
        "--syscall-fixup",
        "off",
    ]);
    assert_eq!(out.status.code(), Some(0), "{console}");
    for line in [
        SYSENTRY,
        "smp: Brought up 1 node, 4 CPUs",
        "lwp-linux-selftest: cpus 4",
        "ok - every CPU is in /proc/cpuinfo and its CPUID topology names it by its APIC ID",
        "lwp-linux-selftest: 12 passed, 0 failed",
        "LWP programs not run: CPUID 0x8000001c.EAX has no LwpAvail",
        "lwpvmm: paravirtual interface found",
    ] {
        assert!(console.contains(line), "missing {line:?}:\n{console}");
    }
    assert!(!console.contains("LWP for user tasks"), "{console}");
    assert!(
        console.contains(&leaf_of_cpuid_command("bulldozer", "stock")),
        "the guest's leaf differs from `lwpvmm cpuid`:\n{console}"
    );
}

/// With the SYSCALL fixup off, patch 0001 completes the SYSCALLs kvm_pvm
/// leaves at CPL3, as here and in the test above: /sysentry holds it to
/// the same rules as lwpvmm.
#[test]
fn without_lwp_the_selftest_sees_none() {
    let (out, console) = run_linux(&["--lwp", "off", "--syscall-fixup", "off"]);
    assert_eq!(out.status.code(), Some(0), "{console}");
    for line in [
        "not ok - /proc/cpuinfo flags show lwp",
        "not ok - CPUID 0x80000001.ECX[15] (LWP) set",
        "leaf 0x8000001c: eax=0 ebx=0 ecx=0 edx=0",
        "not ok - /proc/lwp_cpuid gives the same leaf",
        "LWP programs not run: CPUID 0x8000001c.EAX has no LwpAvail",
        // Without LWP the MSRs #GP, as on hardware without LWP: the msr
        // driver's reads and writes fail.
        "not ok - LWP_CFG reads what the kernel enabled at boot, on every CPU",
        "not ok - LWP_CBADDR reads 0 at boot",
        SYSENTRY,
        "lwp-linux-selftest: 5 passed, 7 failed",
    ] {
        assert!(console.contains(line), "missing {line:?}:\n{console}");
    }
}

/// The red team's terminal case: a kernel that panics on a garbage
/// initramfs, on a terminal, ends as a reboot (status 4, as every guest
/// panic does with `panic=-1`) instead of lwpvmm dying of a seccomp
/// violation, and lwpvmm's last line says what happened and what the
/// status means.
#[test]
fn a_panicking_kernel_on_a_terminal() {
    require_kvm();
    let dir = linux();
    let garbage = dir.join("garbage.cpio");
    let bytes: Vec<u8> = (0..65536u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    std::fs::write(&garbage, bytes).unwrap();
    let kernel = dir.join("vmlinux");
    let (status, text) = common::on_terminal(&[
        "run",
        "--kernel",
        kernel.to_str().unwrap(),
        "--initramfs",
        garbage.to_str().unwrap(),
        "--memory",
        "64",
    ]);
    assert!(text.contains("Kernel panic"), "{text}");
    assert_eq!(
        status,
        Some(i32::from(lwpvmm::cli::REBOOT_STATUS)),
        "{text}"
    );
    // lwpvmm says what the status means, after the guest's last line.
    let said = "lwpvmm: the guest reset the machine: a reboot, or a kernel panic";
    let at = text
        .find(said)
        .unwrap_or_else(|| panic!("no `{said}` in:\n{text}"));
    assert!(at > text.find("Kernel panic").unwrap(), "{text}");
    assert!(text[at..].contains("exit status 4"), "{text}");
}

/// What a fleet's collector does: lwpvmm runs the Linux guest with
/// `--api-sock` while /lwp-hot and /lwp-warm sample CNH side by side;
/// curl fetches `/debug/pprof/profile?seconds=N`, and `go tool pprof`
/// reads it, with no options, on CPU time: both programs' functions are
/// named, each from its own ELF (the initramfs, lwpvmm's default sysroot,
/// by the paths and build IDs the guest module reported), and warm_leaf's
/// caller is on its stacks.
///
/// It cannot flake on a loaded host: it meets the guest on progress, not
/// on a clock. The programs run until the test stops the VM (up to ten
/// minutes); the capture starts only once both say their sampling loop
/// runs, and captures of 5, 10, 20, 40 and 80 s follow one another until
/// one has at least 25 samples of each program. A host so loaded that
/// none does fails with the counts it saw.
#[test]
fn a_collector_fetches_a_profile_of_two_processes_over_the_api() {
    require_kvm();
    let go = Command::new("go").arg("version").output();
    assert!(
        go.is_ok_and(|o| o.status.success()),
        "this test reads the profile with `go tool pprof`: apt-get install golang-go"
    );
    let dir = linux();
    let sock = dir.join(format!("api-{}.sock", std::process::id()));
    let profile = dir.join(format!("api-{}.pb.gz", std::process::id()));
    let _ = std::fs::remove_file(&sock);
    let cmdline = format!("{} lwpprof=600", lwpvmm::vmm::boot::LINUX_CMDLINE);
    let mut vm = common::spawn_within(
        common::command()
            .args(["run", "--kernel"])
            .arg(dir.join("vmlinux"))
            .arg("--initramfs")
            .arg(dir.join("initramfs.cpio"))
            .args(["--memory", "64", "--vcpus", "2", "--cmdline", &cmdline])
            .arg("--api-sock")
            .arg(&sock),
        RUN_LIMIT + std::time::Duration::from_secs(300),
    );
    let sampling = vm.wait_for_lines(
        &["  lwp-hot: sampling", "  lwp-warm: sampling"],
        std::time::Duration::from_secs(240),
    );
    // Samples of each program in a profile (its cpu_clocks values).
    let per_program = |bytes: &[u8]| -> [i64; 2] {
        let p = lwpvmm::profile::pprof::read(bytes).expect("a gzipped pprof profile");
        let s = |i: i64| p.string_table[i as usize].as_str();
        let slot = p
            .sample_type
            .iter()
            .position(|t| s(t.r#type) == "cpu_clocks");
        let mut n = [0i64; 2];
        for sample in &p.sample {
            let Some(loc) = sample.location_id.first() else {
                continue;
            };
            let m = p.location[*loc as usize - 1].mapping_id;
            let file = (m > 0).then(|| s(p.mapping[m as usize - 1].filename));
            let at = match file {
                Some("/lwp-hot") => 0,
                Some("/lwp-warm") => 1,
                _ => continue,
            };
            n[at] += slot.map_or(0, |i| sample.value[i]);
        }
        n
    };
    let mut seen = Vec::new();
    if sampling {
        for seconds in [5, 10, 20, 40, 80] {
            let fetched = Command::new("curl")
                .args(["-sS", "--fail", "--unix-socket"])
                .arg(&sock)
                .arg("-o")
                .arg(&profile)
                .arg(format!(
                    "http://lwpvmm/debug/pprof/profile?seconds={seconds}"
                ))
                .output()
                .expect("run curl (apt-get install curl)");
            assert!(fetched.status.success(), "curl: {fetched:?}");
            let bytes = std::fs::read(&profile).expect("the profile");
            let counts = per_program(&bytes);
            // Its CPU time fits its span on the guest's two vCPUs.
            let p = lwpvmm::profile::pprof::read(&bytes).expect("a gzipped pprof profile");
            let cpu = p
                .sample_type
                .iter()
                .position(|t| p.string_table[t.r#type as usize] == "cpu")
                .expect("a cpu sample type");
            let total: i64 = p.sample.iter().map(|x| x.value[cpu]).sum();
            assert!(
                p.duration_nanos > 0 && total <= 2 * p.duration_nanos,
                "{total} ns of CPU time in {} ns on 2 vCPUs",
                p.duration_nanos
            );
            seen.push((seconds, counts));
            if counts.iter().all(|&n| n >= 25) {
                break;
            }
        }
    }
    let _ = Command::new("curl")
        .args(["-sS", "--unix-socket"])
        .arg(&sock)
        .args(["-X", "PUT", "-d", r#"{"action_type": "Stop"}"#])
        .arg("http://lwpvmm/actions")
        .output();
    let out = vm.wait();
    let console = Console::of(&out);
    assert!(
        sampling,
        "the guest never started both programs:\n{console}"
    );
    assert!(
        seen.last().is_some_and(|(_, n)| n.iter().all(|&n| n >= 25)),
        "no capture had 25 samples of each program (seconds, [lwp-hot, lwp-warm]): {seen:?}\n{console}"
    );
    assert_eq!(out.status.code(), Some(0), "{console}");

    let top = Command::new("go")
        .args(["tool", "pprof", "-top", "-nodecount=100"])
        .arg(&profile)
        .output()
        .expect("run go tool pprof");
    let text = String::from_utf8_lossy(&top.stdout);
    assert!(top.status.success(), "go tool pprof: {top:?}");
    // Opened on CPU time without options (the profile's default sample
    // type): its totals and each function's are times.
    assert!(text.contains("Type: cpu\n"), "{text}");
    let timed = |l: &str| {
        l.split_whitespace().next().is_some_and(|flat| {
            flat.ends_with('s') && flat.trim_end_matches(['m', 's']).parse::<f64>().is_ok()
        })
    };
    assert!(
        text.lines().any(|l| l.ends_with(" hot_4") && timed(l)),
        "hot_4's flat time:\n{text}"
    );
    for function in ["hot_4", "warm_leaf", "warm_caller"] {
        assert!(
            text.lines()
                .any(|l| l.split_whitespace().last() == Some(function)
                    || l.split_whitespace()
                        .last()
                        .is_some_and(|f| f.starts_with(&format!("{function}.")))),
            "go tool pprof -top lacks {function}:\n{text}"
        );
    }
    // warm_leaf's stacks go through warm_caller: the caller has samples
    // of its own only through its callee (flat 0, cum > 0).
    let traces = Command::new("go")
        .args(["tool", "pprof", "-traces"])
        .arg(&profile)
        .output()
        .expect("run go tool pprof -traces");
    let traces = String::from_utf8_lossy(&traces.stdout);
    let called = traces.split("-----------+").any(|t| {
        let names: Vec<&str> = t
            .lines()
            .filter_map(|l| l.split_whitespace().last())
            .collect();
        names
            .windows(2)
            .any(|w| w[0] == "warm_leaf" && w[1].starts_with("warm_caller"))
    });
    assert!(
        called,
        "no stack has warm_caller above warm_leaf:\n{traces}"
    );

    // Each function is a location of its own program's mapping.
    let bytes = std::fs::read(&profile).expect("the profile");
    let p = lwpvmm::profile::pprof::read(&bytes).expect("a gzipped pprof profile");
    let s = |i: i64| p.string_table[i as usize].as_str();
    for (function, file) in [("hot_4", "/lwp-hot"), ("warm_leaf", "/lwp-warm")] {
        let f = p
            .function
            .iter()
            .find(|f| s(f.name) == function)
            .unwrap_or_else(|| panic!("no function {function}"));
        let loc = p
            .location
            .iter()
            .find(|l| l.line.iter().any(|line| line.function_id == f.id))
            .expect("a location");
        let m = &p.mapping[loc.mapping_id as usize - 1];
        assert_eq!(s(m.filename), file, "{function}");
        assert!(!s(m.build_id).is_empty(), "{function}: no build ID");
    }
    let _ = std::fs::remove_file(&profile);
}

/// Whole-guest profiles (`--profile-kernel`, docs/profiling.md): with no
/// LWP at all, one process spinning in the kernel's read path (/dev/zero)
/// and one in its own code, each pinned to a vCPU for the same ten
/// seconds. The profile names the kernel function that clears the user
/// buffer and the user function, and splits the time between the two
/// processes as the guest did, half each, within 15 points.
#[test]
fn a_whole_guest_profile_names_the_kernel_and_the_process() {
    require_kvm();
    let dir = linux();
    let work = dir.join(format!("whole-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("a scratch directory");
    let trace = work.join("whole.trace");
    let cmdline = format!("{} wholeprof=10", lwpvmm::vmm::boot::LINUX_CMDLINE);
    let out = output_within(
        common::command()
            .args(["run", "--kernel"])
            .arg(dir.join("vmlinux"))
            .arg("--initramfs")
            .arg(dir.join("initramfs.cpio"))
            .args(["--memory", "64", "--vcpus", "2", "--lwp", "off"])
            .args(["--profile-kernel", "--cmdline", &cmdline, "--trace"])
            .arg(&trace),
        RUN_LIMIT,
    );
    let console = Console::of(&out);
    assert!(
        out.status.success() && console.contains("whole-prof: done"),
        "{console}"
    );
    // Without the kernel's symbols its frames are addresses, and report
    // says what to give.
    let bare = output_within(
        common::command().args(["report", "--kernel"]).arg(&trace),
        RUN_LIMIT,
    );
    let said = String::from_utf8_lossy(&bare.stderr);
    assert!(bare.status.success(), "{bare:?}");
    assert!(said.contains("--kernel-symbols"), "{said}");
    let pprof = work.join("whole.pb.gz");
    // Every function listed: on a loaded host the boot's emulated kernel
    // work (its tick, above all) can push the process below the top 20.
    let report = output_within(
        common::command()
            .args(["report", "--kernel", "--top", "100000", "--kernel-symbols"])
            .arg(dir.join("vmlinux"))
            .arg("--symbols")
            .arg(dir.join("bin/spin-user"))
            .arg("--pprof")
            .arg(&pprof)
            .arg(&trace),
        RUN_LIMIT,
    );
    let table = String::from_utf8_lossy(&report.stdout);
    assert!(report.status.success(), "{report:?}");
    assert!(table.contains("spin_user"), "{table}");
    // The kernel's time lies under the process function that asked for it.
    let folded = work.join("whole.folded");
    let kernel_side = output_within(
        common::command()
            .args(["report", "--kernel", "--kernel-symbols"])
            .arg(dir.join("vmlinux"))
            .arg("--symbols")
            .arg(dir.join("bin/spin-kernel"))
            .arg("--folded")
            .arg(&folded)
            .arg(&trace),
        RUN_LIMIT,
    );
    assert!(kernel_side.status.success(), "{kernel_side:?}");
    let stacks = std::fs::read_to_string(&folded).expect("folded stacks");
    assert!(
        stacks
            .lines()
            .any(|l| l.contains("read_zeros;") && l.find("read_zeros;") < l.find("read_zero_[k]")),
        "no stack has the kernel's read under read_zeros:\n{}",
        stacks.lines().take(20).collect::<Vec<_>>().join("\n")
    );
    let p = lwpvmm::profile::pprof::read(&std::fs::read(&pprof).expect("the profile"))
        .expect("a gzipped pprof profile");
    let s = |i: i64| p.string_table[i as usize].as_str();
    let slot = p
        .sample_type
        .iter()
        .position(|t| (s(t.r#type), s(t.unit)) == ("guest_cpu", "nanoseconds"))
        .expect("a guest_cpu sample type in nanoseconds");
    assert_eq!(s(p.default_sample_type), "guest_cpu");
    let function = |location: u64| {
        let l = &p.location[location as usize - 1];
        l.line
            .first()
            .map_or("", |line| s(p.function[line.function_id as usize - 1].name))
    };
    // Each process is its address space: the one whose samples are in
    // spin_user, and the one whose stacks clear the read's buffer.
    let space = |sample: &lwpvmm::profile::pprof::Sample| s(sample.label[0].str).to_owned();
    let (mut user_space, mut kernel_space) = (None, None);
    for sample in &p.sample {
        let names: Vec<&str> = sample.location_id.iter().map(|&l| function(l)).collect();
        if names.first() == Some(&"spin_user") {
            user_space = Some(space(sample));
        }
        if names.iter().any(|n| n.starts_with("clear_user")) && names.contains(&"read_zero") {
            kernel_space = Some(space(sample));
        }
    }
    let (user_space, kernel_space) = (
        user_space.expect("samples in spin_user"),
        kernel_space.expect("samples in the kernel's read_zero clearing the buffer"),
    );
    assert_ne!(user_space, kernel_space);
    let time_in = |wanted: &str| -> i64 {
        p.sample
            .iter()
            .filter(|x| space(x) == wanted)
            .map(|x| x.value[slot])
            .sum()
    };
    let (user, kernel) = (time_in(&user_space), time_in(&kernel_space));
    let share = 100.0 * kernel as f64 / (user + kernel) as f64;
    assert!(
        (35.0..=65.0).contains(&share),
        "the reading process had {share:.0}% of the two processes' time ({kernel} ns against {user} ns), not half"
    );
    // Who ran: the module reports every exec's mappings and process, LWP
    // on or off, so the samples carry pprof's process labels...
    let process_of = |sample: &lwpvmm::profile::pprof::Sample| {
        sample
            .label
            .iter()
            .find(|l| s(l.key) == "process")
            .map(|l| s(l.str).to_owned())
    };
    // (The exec's own kernel work in the new address space comes before
    // the report, which runs on its return to user mode.)
    let user_names: std::collections::BTreeSet<_> = p
        .sample
        .iter()
        .filter(|x| {
            x.location_id
                .first()
                .is_some_and(|&l| function(l) == "spin_user")
        })
        .map(process_of)
        .collect();
    assert_eq!(
        user_names,
        [Some("spin-user".to_owned())].into(),
        "spin_user's samples are the process spin-user's"
    );
    // ... and the guest's own files name its frames (the initramfs as the
    // sysroot, no --symbols), each stack under its process's root frame.
    let by_files = work.join("files.folded");
    let named = output_within(
        common::command()
            .args(["report", "--kernel", "--top", "100000", "--kernel-symbols"])
            .arg(dir.join("vmlinux"))
            .arg("--sysroot")
            .arg(dir.join("initramfs.cpio"))
            .arg("--folded")
            .arg(&by_files)
            .arg(&trace),
        RUN_LIMIT,
    );
    assert!(named.status.success(), "{named:?}");
    let table = String::from_utf8_lossy(&named.stdout);
    assert!(table.contains("spin_user"), "{table}");
    let stacks = std::fs::read_to_string(&by_files).expect("folded stacks");
    for (process, function) in [
        ("spin-user[", ";spin_user "),
        ("spin-kernel[", "read_zeros;"),
    ] {
        assert!(
            stacks
                .lines()
                .any(|l| l.starts_with(process) && l.contains(function)),
            "no stack of {function} under its process {process}..]:\n{}",
            stacks.lines().take(20).collect::<Vec<_>>().join("\n")
        );
    }
    let _ = std::fs::remove_dir_all(&work);
}

/// The Linux guest's bzImage (`vmlinuz`, xz as tinyconfig builds it) boots
/// from its payload decompressed by lwpvmm, not by the decompressor inside
/// it, and its self-test passes; the same kernel compressed in each other
/// format the kernel's build offers (`vmlinuz.FORMAT`, resources/linux/
/// build.sh) decompresses to the same ELF.
#[test]
fn a_bzimage_boots_from_its_payload_decompressed_on_the_host() {
    use lwpvmm::vmm::boot::payload::{self, Format};
    require_kvm();
    let dir = linux();
    let read = |name: &str| std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let xz = payload::decompress(&read("vmlinuz")).expect("vmlinuz's payload");
    assert_eq!(xz.format, Format::Xz);
    // (file, its compression)
    let table = [
        ("vmlinuz.gzip", Format::Gzip),
        ("vmlinuz.bzip2", Format::Bzip2),
        ("vmlinuz.lzma", Format::Lzma),
        ("vmlinuz.lzo", Format::Lzo),
        ("vmlinuz.lz4", Format::Lz4),
        ("vmlinuz.zstd", Format::Zstd),
    ];
    for (file, format) in table {
        let got = payload::decompress(&read(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(got.format, format, "{file}");
        assert!(
            got.bytes == xz.bytes,
            "{file} holds another kernel than vmlinuz"
        );
    }
    let (out, console) = run_image("vmlinuz", &[]);
    assert_eq!(out.status.code(), Some(0), "{console}");
    assert!(
        !console.contains("Decompressing Linux"),
        "the guest ran its own decompressor:\n{console}"
    );
    assert!(console.contains(" passed, 0 failed"), "{console}");
}
