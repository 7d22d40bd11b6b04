//! The SYSCALL quirk's fixup through the `VcpuOps` seam over real guest
//! memory and page tables (crate::vmm::vcpu::testing): arming from the
//! kernel's IDT and MSRs, and each stop at the #PF handler, completed,
//! passed on, or given up.

use vm_memory::{Bytes, GuestAddress};

use super::*;
use crate::lwp::cpuid::LwpProfile;
use crate::vmm::vcpu::testing::*;

/// The kernel's #PF handler (its first instruction a NOP), its SYSCALL
/// entry, and its IDT (supervisor memory).
const PF_HANDLER: u64 = KERNEL_CODE;
const LSTAR: u64 = KERNEL_CODE + 0x100;
const IDT: u64 = AREA + 0x800;
/// Linux's SFMASK; STAR with the rig's kernel code selector.
const FMASK: u64 = 0x47700;
const STAR: u64 = 0x0023 << 48 | KERNEL_CS << 32;
/// A SYSCALL in the process's code, and where it returns.
const SYSCALL_AT: u64 = USER_CODE + 0x10;
const RETURN: u64 = SYSCALL_AT + 2;
/// The #PF frame: its error code below the frame's words.
const PF_FRAME: u64 = FRAME_AT - 8;
const USER_RSP: u64 = USER_STACK - 0x80;
const EFER_SCE: u64 = 1;

/// (case, change to the kernel, breakpoint)
type ArmCase = (&'static str, fn(&mut Rig), Option<u64>);
/// (case, change to the fault, outcome)
type StopCase = (&'static str, fn(&mut Rig), Stop);

/// A 64-bit interrupt gate to `target`.
fn gate(target: u64, present: bool) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[0..2].copy_from_slice(&(target as u16).to_le_bytes());
    g[2..4].copy_from_slice(&(KERNEL_CS as u16).to_le_bytes());
    g[5] = if present { 0x8e } else { 0x0e };
    g[6..8].copy_from_slice(&((target >> 16) as u16).to_le_bytes());
    g[8..12].copy_from_slice(&((target >> 32) as u32).to_le_bytes());
    g
}

/// A rig whose kernel has set up SYSCALL and its IDT, with the fixup on.
fn kernel() -> Rig {
    let mut r = Rig::new(LwpProfile::Emulated, None);
    r.vcpu.sregs.efer |= EFER_SCE;
    r.vcpu.sregs.idt.base = IDT;
    r.vcpu.sregs.idt.limit = 0xfff;
    r.vcpu.lstar = LSTAR;
    r.vcpu.star = STAR;
    r.vcpu.fmask = FMASK;
    r.mem
        .write_slice(&gate(PF_HANDLER, true), GuestAddress(IDT + 14 * 16))
        .unwrap();
    r.code(PF_HANDLER, &[0x90]);
    r.code(SYSCALL_AT, &[0x0f, 0x05]);
    r.syscall_fixup = Some(SyscallFixup::new().unwrap());
    r
}

fn arm_rig(r: &mut Rig) {
    let fixup = r.syscall_fixup.take().unwrap();
    arm(&mut r.vcpu, &r.mem, &fixup).unwrap();
    r.syscall_fixup = Some(fixup);
}

#[test]
fn the_breakpoint_goes_where_the_kernels_idt_says_once_syscall_is_set_up() {
    let table: [ArmCase; 5] = [
        ("set up", |_| {}, Some(PF_HANDLER)),
        (
            "SYSCALL not enabled",
            |r| r.vcpu.sregs.efer &= !EFER_SCE,
            None,
        ),
        ("LSTAR not yet set", |r| r.vcpu.lstar = 0, None),
        (
            "no #PF gate yet",
            |r| r.vcpu.sregs.idt.limit = 14 * 16,
            None,
        ),
        (
            "a gate not present",
            |r| {
                r.mem
                    .write_slice(&gate(PF_HANDLER, false), GuestAddress(IDT + 14 * 16))
                    .unwrap();
            },
            None,
        ),
    ];
    for (case, change, want) in table {
        let mut r = kernel();
        change(&mut r);
        arm_rig(&mut r);
        assert_eq!(r.vcpu.breakpoint, want, "{case}");
        let entry = r.syscall_fixup.as_ref().unwrap().entry();
        assert_eq!(entry.map(|e| e.pf_entry), want, "{case}: published");
        if let Some(entry) = entry {
            assert_eq!(
                (entry.lstar, entry.fmask, entry.kernel_cs),
                (LSTAR, FMASK, KERNEL_CS as u16)
            );
        }
    }
}

#[test]
fn a_vcpu_arms_from_the_entry_another_published() {
    let mut first = kernel();
    arm_rig(&mut first);
    let fixup = first.syscall_fixup.take().unwrap();
    // Halted before setting up SYSCALL itself: it reads nothing.
    let mut other = kernel();
    other.vcpu.lstar = 0;
    other.vcpu.sregs.efer = 0;
    arm(&mut other.vcpu, &other.mem, &fixup).unwrap();
    assert_eq!(other.vcpu.breakpoint, Some(PF_HANDLER));
}

/// What a stop at the handler did.
#[derive(Debug, PartialEq, Eq)]
enum Stop {
    /// The SYSCALL entered at LSTAR.
    Completed,
    /// The fault went on past the handler's first instruction.
    PassedOn,
    /// The fixup ended.
    GaveUp,
}

#[test]
fn each_stop_completes_a_syscall_or_passes_the_fault_on() {
    let table: [StopCase; 8] = [
        ("the quirk's fault", |_| {}, Stop::Completed),
        (
            "a kernel-mode fault",
            |r| write_frame(r, 0x11, LSTAR, KERNEL_CS),
            Stop::PassedOn,
        ),
        (
            "a process's data fault",
            |r| write_frame(r, 0x6, 0x40_5000, USER_CS),
            Stop::PassedOn,
        ),
        (
            "RCX after no SYSCALL",
            |r| r.vcpu.regs.rcx = SYSCALL_AT,
            Stop::PassedOn,
        ),
        (
            "RCX on an unmapped page",
            |r| r.vcpu.regs.rcx = UNMAPPED + 2,
            Stop::PassedOn,
        ),
        (
            "RCX after a SYSCALL in kernel memory",
            |r| {
                r.code(AREA, &[0x0f, 0x05]);
                r.vcpu.regs.rcx = AREA + 2;
            },
            Stop::PassedOn,
        ),
        (
            "a data fault in a handler that begins with CLAC",
            |r| {
                r.code(PF_HANDLER, &[0x0f, 0x01, 0xca]);
                write_frame(r, 0x6, 0x40_5000, USER_CS);
            },
            Stop::PassedOn,
        ),
        (
            "a data fault in a handler that begins with a CALL",
            |r| {
                r.code(PF_HANDLER, &[0xe8, 0, 0, 0, 0]);
                write_frame(r, 0x6, 0x40_5000, USER_CS);
            },
            Stop::GaveUp,
        ),
    ];
    for (case, change, want) in table {
        let mut r = kernel();
        arm_rig(&mut r);
        quirk_fault(&mut r);
        change(&mut r);
        let before = r.vcpu.regs;
        stop(&mut r.cx()).unwrap();
        let regs = r.vcpu.regs;
        let fixup = r.syscall_fixup.as_ref().unwrap();
        let got = if fixup.given_up() {
            Stop::GaveUp
        } else if regs.rip == LSTAR {
            Stop::Completed
        } else {
            Stop::PassedOn
        };
        assert_eq!(got, want, "{case}");
        let counters = r.metrics.counters();
        assert_eq!(counters.pf_entry_stops, 1, "{case}");
        assert_eq!(
            counters.syscalls_completed,
            u64::from(want == Stop::Completed),
            "{case}"
        );
        match want {
            Stop::Completed => {
                assert_eq!(
                    (regs.rsp, regs.rcx, regs.rax),
                    (USER_RSP, RETURN, 39),
                    "{case}"
                );
                assert_eq!((regs.r11, regs.rflags), (0x246, 0x46), "{case}");
            }
            Stop::PassedOn => {
                let len = if case.contains("CLAC") { 3 } else { 1 };
                assert_eq!(regs.rip, PF_HANDLER + len, "{case}");
                assert_eq!(regs.rsp, before.rsp, "{case}: the frame stays");
                assert_eq!(r.vcpu.breakpoint, Some(PF_HANDLER), "{case}");
            }
            Stop::GaveUp => {
                assert_eq!(regs, before, "{case}: the handler runs as it is");
                assert_eq!(r.vcpu.breakpoint, None, "{case}");
                assert_eq!(counters.guest_warnings, 1, "{case}");
                // A vCPU not yet armed stays so.
                let mut other = kernel();
                arm(&mut other.vcpu, &other.mem, fixup).unwrap();
                assert_eq!(other.vcpu.breakpoint, None, "{case}");
            }
        }
    }
}

/// The vCPU at the handler's first instruction with a #PF frame of
/// `error` at `rip` in `cs` on its stack.
fn write_frame(r: &mut Rig, error: u64, rip: u64, cs: u64) {
    let words = [error, rip, cs, 0x10002, USER_RSP, USER_DS];
    for (i, w) in words.iter().enumerate() {
        r.mem
            .write_obj(*w, GuestAddress(PF_FRAME + 8 * i as u64))
            .unwrap();
    }
    r.at_cpl0();
    r.vcpu.regs.rsp = PF_FRAME;
    r.vcpu.regs.rip = PF_HANDLER;
}

/// The fault kvm_pvm's SYSCALL of getpid (39) leaves: a user fetch fault
/// at LSTAR, RCX after the SYSCALL, R11 the process's flags.
fn quirk_fault(r: &mut Rig) {
    write_frame(r, 0x15, LSTAR, 0x33);
    r.vcpu.regs.rax = 39;
    r.vcpu.regs.rcx = RETURN;
    r.vcpu.regs.r11 = 0x246;
    r.vcpu.sregs.cs.selector = KERNEL_CS as u16;
}
