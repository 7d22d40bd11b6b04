//! The host's native supervisor mode (docs/pv-abi.md, "Native supervisor mode"), through the
//! `native` guest: a kernel that declares the mode runs its CPL0 code on the CPU and reaches
//! user mode by SYSRETQ; `--supervisor` chooses, and refuses what cannot run native with the
//! reason; a kernel page without U=1 ends the run with its cause instead of hanging it; a
//! snapshot resumes native. Which mode a run got is read from the guest itself: RDMSR of the
//! mode's MSR gives its page in native mode and 0 emulated. These tests need a kvm_pvm host
//! with the mode (this project's hosts); elsewhere they fail saying so.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{RUN_LIMIT, output_within, require_kvm};
use lwpvmm::vmm::vcpu::native;

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("native-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Fails the test, saying why, on a host without the mode.
fn require_native() {
    require_kvm();
    let kvm = kvm_ioctls::Kvm::new().unwrap();
    let vm = kvm.create_vm().unwrap();
    let vcpu = vm.create_vcpu(0).unwrap();
    assert!(
        native::host_offers(&vcpu),
        "this test needs a host whose KVM offers native supervisor mode (kvm_pvm: MSR 0x4b564d11 reads \"PVM\"), as this project's hosts do"
    );
}

fn guest(dir: &Path, name: &str) -> PathBuf {
    let elf = dir.join(format!("{name}.elf"));
    std::fs::write(&elf, lwpvmm::guests::get(name).unwrap()).unwrap();
    elf
}

fn lwpvmm(args: &[&str]) -> Output {
    output_within(common::command().args(args), RUN_LIMIT)
}

fn run(kernel: &Path, supervisor: &str, cmdline: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "run",
        "--kernel",
        kernel.to_str().unwrap(),
        "--memory",
        "64",
        "--supervisor",
        supervisor,
        "--cmdline",
        cmdline,
    ];
    args.extend_from_slice(extra);
    lwpvmm(&args)
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// What vCPU 0's kernel reads of the mode's MSR in native mode.
fn native_page_line() -> String {
    format!(
        "native: MSR 0x4b564d10 reads {:#x}\n",
        native::page_of(0).unwrap()
    )
}

#[test]
fn a_kernel_that_declares_the_mode_runs_native_and_reaches_user_mode_by_sysret() {
    require_native();
    let dir = scratch("runs");
    let kernel = guest(&dir, "native");
    // (--supervisor, the line the kernel prints of the mode's MSR)
    let table = [
        ("native", native_page_line()),
        ("auto", native_page_line()),
        ("emulated", "native: MSR 0x4b564d10 reads 0x0\n".to_owned()),
    ];
    for (supervisor, msr) in table {
        // CPL3 is entered by SYSRETQ, which only the native run needs.
        let user = if supervisor == "emulated" { 0 } else { 1 };
        let cmdline = format!("probe=1 iterations=100000 exits=10 user={user}");
        let out = run(&kernel, supervisor, &cmdline, &[]);
        let (console, err) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{supervisor}: {console}{err}");
        assert!(
            console.contains(&msr),
            "{supervisor}: `{msr}` not in {console}"
        );
        let mut lines = vec![
            "native: cpl0 loop 100000 iterations in ",
            "native: port exits 10 exits in ",
        ];
        if user == 1 {
            lines.push("native: cpl3 loop 100000 iterations in ");
        }
        for line in lines {
            assert!(
                console.contains(line),
                "{supervisor}: `{line}` not in {console}"
            );
        }
        if supervisor != "emulated" {
            // Its CPUID shows the host's leaves: the VM's are in its page.
            for line in vm_leaves() {
                assert!(console.contains(&line), "`{line}` not in {console}");
            }
        }
    }
}

/// The lines the native guest prints of the VM's lwpvmm and LWP leaves
/// (the default LWP profile, the shim guest), from lwpvmm's own table.
fn vm_leaves() -> Vec<String> {
    let table = lwpvmm::vmm::machine::cpuid_table(
        lwpvmm::lwp::cpuid::LwpProfile::Emulated,
        lwpvmm::lwp::cpuid::GuestLwpSupport::Shim,
    )
    .unwrap();
    [0x4000_0100, 0x8000_001c]
        .iter()
        .map(|&leaf| {
            let e = table.iter().find(|e| e.leaf == leaf).unwrap();
            format!(
                "native: leaf {leaf:#x}: eax={:#x} ebx={:#x} ecx={:#x} edx={:#x}\n",
                e.eax, e.ebx, e.ecx, e.edx
            )
        })
        .collect()
}

#[test]
fn supervisor_native_refuses_what_cannot_run_native_and_auto_runs_it_emulated() {
    require_native();
    let dir = scratch("refusals");
    let (native_kernel, minimal) = (guest(&dir, "native"), guest(&dir, "minimal"));
    // (kernel, --supervisor, extra arguments, exit status, what stderr says)
    let table: [(&Path, &str, &[&str], i32, &str); 3] = [
        (
            &minimal,
            "native",
            &[],
            2,
            "--supervisor native: the kernel does not declare native supervisor mode",
        ),
        (
            &native_kernel,
            "native",
            &["--vcpus", "65"],
            2,
            "native supervisor mode takes at most 64 vCPUs (asked for 65)",
        ),
        (&minimal, "auto", &[], 1, ""),
    ];
    for (kernel, supervisor, extra, status, want) in table {
        let out = run(kernel, supervisor, "", extra);
        let (console, err) = text(&out);
        assert_eq!(
            out.status.code(),
            Some(status),
            "{supervisor} {extra:?}: {console}{err}"
        );
        assert!(err.contains(want), "`{want}` not in: {err}");
    }
}

#[test]
fn a_kernel_page_without_u_ends_the_run_with_its_cause() {
    require_native();
    let dir = scratch("u0");
    let kernel = guest(&dir, "native");
    let out = run(&kernel, "native", "supervisor_page=1", &[]);
    let (console, err) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{console}{err}");
    assert!(
        console.contains("native: mapping my own code supervisor-only")
            && !console.contains("still running"),
        "{console}"
    );
    for want in [
        "vCPU 0 stopped making progress at RIP 0x",
        "the kernel maps that page without U=1 (its Pd entry)",
    ] {
        assert!(err.contains(want), "`{want}` not in: {err}");
    }
}

#[test]
fn a_native_snapshot_resumes_native_and_is_refused_emulated() {
    require_native();
    let dir = scratch("snapshot");
    let kernel = guest(&dir, "native");
    let snap = dir.join("snap");
    let taken = run(
        &kernel,
        "native",
        "snap=1 probe=1 iterations=100000 exits=10 user=1",
        &[
            "--snapshot-dir",
            snap.to_str().unwrap(),
            "--snapshot-on-port",
        ],
    );
    let (console, err) = text(&taken);
    assert_eq!(taken.status.code(), Some(1), "{console}{err}");
    let state = lwpvmm::vmm::snapshot::read_state(&snap).unwrap();
    let saved = state.vcpus[0]
        .msrs
        .iter()
        .find(|(index, _)| *index == native::MSR_NATIVE)
        .map(|&(_, value)| value & !0xfff);
    assert_eq!(saved, native::page_of(0), "the snapshot keeps the mode");

    let restored = lwpvmm(&["restore", snap.to_str().unwrap()]);
    let (console, err) = text(&restored);
    assert_eq!(restored.status.code(), Some(1), "{console}{err}");
    assert!(
        console.starts_with(&native_page_line()) && console.contains("native: cpl3 loop "),
        "the restored kernel runs on from the snapshot point, native:\n{console}"
    );
    let refused = lwpvmm(&[
        "restore",
        snap.to_str().unwrap(),
        "--supervisor",
        "emulated",
    ]);
    let (console, err) = text(&refused);
    assert_eq!(refused.status.code(), Some(2), "{console}{err}");
    assert!(
        err.contains("runs in native supervisor mode, which --supervisor emulated refuses"),
        "{err}"
    );
}

/// The two questions a native Linux turns on, asked of the CPU: can a
/// kernel whose pages are all U=1 keep user mode out of its memory (by page
/// tables of user mode's own, as KPTI's), and can an exception taken in user
/// mode return there with every register although the only way back is
/// SYSRETQ, which overwrites RCX and R11 (through a return trampoline in
/// user memory)? docs/linux-guest.md ("Native supervisor mode") has the
/// answers and what they mean, with how the page's interrupt flag and the
/// LAPIC timer work together.
#[test]
fn user_mode_is_kept_out_of_kernel_memory_and_gets_every_register_back() {
    require_native();
    let dir = scratch("isolation");
    let kernel = guest(&dir, "native");
    // (the probes asked for, the lines the kernel prints)
    let table: [(&str, &[&str]); 5] = [
        (
            "isolation=1",
            &[
                // Every page U=1: the secret is readable from user mode...
                "native: a user read of 0x400000 on the kernel's page tables read 0x5ec2e75ec2e7\n",
                // ... but not on tables that map only the entry area: a user
                // #PF (error 0x4) through the kernel's IDT, from CS 0x2b.
                "native: a user read of 0x400000 on user page tables faulted: #PF error 0x4 at 0x400000, cs 0x2b\n",
            ],
        ),
        (
            "trampoline=1",
            &[
                "native: after a user-mode #UD returned by SYSRETQ and the trampoline: rcx 0x1111 r11 0x2222 rax 0x3333, rsp moved by 0\n",
            ],
        ),
        (
            // The page's interrupt flag: with it off the LAPIC timer's
            // tick only sets the pending byte; with it on again the tick
            // comes at the next trapped instruction. (What HLT does is
            // printed, not asserted: it differs from host to host.)
            "halt=1",
            &[
                "native: with the page's IF off the tick: ticks 0, pending byte 1, ",
                "native: IF on again and one trapped MOV from CR0: ticks 1, pending byte 0, ",
                // lwpvmm's halt sleeps until the tick, which it delivers.
                "native: the power port's halt with the page's IF on: ticks 1, pending byte 0, ",
            ],
        ),
        (
            // Where events land and what they do to the page's IF (byte
            // 0; byte 1 is pending): what a native Linux's entry code
            // builds on (docs/linux-guest.md, "What the events probe
            // answered").
            "events=1",
            &[
                // Delivery clears the page's IF; the frame's IF is the
                // page's as it was, and IRETQ to the kernel gives it back.
                "native: a kernel-mode tick: the page's bytes at entry 0x0, frame cs 0x8 rflags.IF 1; after its IRETQ the page's bytes 0x1\n",
                // User mode keeps the page's IF: off, no tick comes there.
                "native: a user-mode tick, the page's IF on: vector 48 error 0x0 cs 0x2b rflags.IF 1 the page's bytes at entry 0x0 stack TSS.RSP0 ",
                "native: a user-mode tick, the page's IF off: no trap, syscall saw the page's bytes 0x100\n",
                // A pending tick comes after the next trapped instruction
                // is done: after SWAPGS in kernel mode, after SYSRETQ in
                // user mode.
                "native: a tick pending as the page's IF is set just before SWAPGS: delivered after it, frame cs 0x8\n",
                "native: a tick pending as the page's IF is set just before SYSRETQ: delivered after it, frame cs 0x2b\n",
                // SYSCALL applies FMASK's IF to the page.
                "native: a SYSCALL with the page's IF on: no trap, syscall saw the page's bytes 0x0\n",
                // The host leaves CR2 to MOV from CR2, not the page.
                "native: a user-mode #PF: vector 14 error 0x4 cs 0x2b rflags.IF 0 the page's bytes at entry 0x0 stack TSS.RSP0 cr2 0x200000000 the page's cr2 0x0\n",
                "native: a kernel-mode #DE through an IST gate: vector 0 error 0x0 cs 0x8 rflags.IF 0 the page's bytes at entry 0x0 stack TSS.IST1 ",
                "native: MOV to DS, ES, SS and LRETQ at CPL0: no trap\n",
                // The kernel's half is no refuge: once kernel mode has
                // used a mapping, user mode reads through it too.
                "native: a user read of the -2 GiB alias of 0x400000 after the kernel read 0x5ec2e75ec2e7\n",
                "native: SYSRETQ to code at the -2 GiB alias: no trap",
            ],
        ),
        (
            "isolation=1 trampoline=1",
            &[
                "on user page tables faulted: #PF error 0x4",
                "rcx 0x1111 r11 0x2222 rax 0x3333, rsp moved by 0\n",
            ],
        ),
    ];
    for (probes, lines) in table {
        let cmdline = format!("{probes} iterations=1000 exits=1");
        let out = run(&kernel, "native", &cmdline, &[]);
        let (console, err) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{probes}: {console}{err}");
        for line in lines {
            assert!(
                console.contains(line),
                "{probes}: `{line}` not in {console}"
            );
        }
        // The kernel runs on natively after its probes.
        assert!(
            console.contains("native: cpl0 loop 1000 iterations in "),
            "{probes}: {console}"
        );
    }
}

/// SMP in native mode: the second vCPU, started by INIT and SIPI, runs its real-mode
/// trampoline and reaches long mode and its own page (0xA1000), and IPIs go both ways, the
/// BSP's waking the AP from lwpvmm's halt (the power port's value 2).
#[test]
fn a_second_vcpu_starts_native_and_trades_ipis_with_the_first() {
    require_native();
    let dir = scratch("smp");
    let kernel = guest(&dir, "native");
    let out = run(
        &kernel,
        "native",
        "smp=1 iterations=1000 exits=1",
        &["--vcpus", "2"],
    );
    let (console, err) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{console}{err}");
    let page = native::page_of(1).unwrap();
    for line in [
        format!("native: the AP started; its MSR reads {page:#x}, its cpl0 loop "),
        "native: the AP's IPI reached the BSP: 1\n".to_owned(),
        "native: the BSP's IPI woke the AP from the power port's halt: yes\n".to_owned(),
    ] {
        assert!(console.contains(&line), "`{line}` not in {console}{err}");
    }
}
