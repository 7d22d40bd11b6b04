//! The KVM side of the SYSCALL quirk's fixup (syscall_quirk.rs has the
//! rule): a guest-debug breakpoint on the kernel's #PF handler, set once
//! the kernel has set up SYSCALL, and at each stop there the fault's frame
//! read through the guard, then either the SYSCALL completed or the fault
//! let through untouched.
//!
//! The breakpoint costs one exit per guest page fault, and nothing per
//! system call beyond that exit: registers come and go through KVM's
//! sync-regs area, the frame and the two bytes before RCX through the
//! guard's walk of the vCPU's page tables.

use std::sync::atomic::Ordering;

use kvm_bindings::kvm_debug_exit_arch;

use super::context::ExitCx;
use super::lwp_insn;
use super::ops::{MSR_LSTAR, MSR_STAR, MSR_SYSCALL_MASK, VcpuOps};
use super::protocol::VcpuError;
use super::syscall_quirk::{self, PfFrame, SyscallEntry, SyscallFixup};
use crate::guard::{Access, GuestMemory, GuestView};
use crate::guest_warn;

/// DR6.B0: the exit is DR0's breakpoint.
const DR6_B0: u64 = 1;
/// The page-fault vector, and an IDT gate's size in 64-bit mode.
const PF_VECTOR: u64 = 14;
const GATE_SIZE: u64 = 16;

/// EFER.SCE: SYSCALL enabled.
const EFER_SCE: u64 = 1;

/// Sets the vCPU's breakpoint on the kernel's #PF handler, once the entry
/// is known: read here when this vCPU is the first to find LSTAR set (the
/// kernel's IDT then names its #PF handler), else the one another vCPU
/// published. Between enabling SYSCALL (EFER.SCE, which Linux sets at its
/// first instruction) and setting LSTAR, each call reads LSTAR again (one
/// KVM_GET_MSRS): a few calls at boot, none once armed, none for a guest
/// that never enables SYSCALL.
pub fn arm(
    vcpu: &mut dyn VcpuOps,
    mem: &GuestMemory,
    fixup: &SyscallFixup,
) -> Result<(), VcpuError> {
    if vcpu.breakpoint().is_some() || fixup.given_up() {
        return Ok(());
    }
    let entry = match fixup.entry() {
        Some(entry) => entry,
        None => match read_entry(vcpu, mem) {
            Some(entry) => {
                let kept = fixup.publish(entry);
                if kept == entry {
                    log::info!(
                        "vCPU {}: completing SYSCALLs kvm_pvm leaves at CPL3: breakpoint on the \
                         kernel's #PF handler {:#x}, LSTAR {:#x}",
                        vcpu.id(),
                        entry.pf_entry,
                        entry.lstar
                    );
                }
                kept
            }
            None => return Ok(()),
        },
    };
    vcpu.set_breakpoint(Some(entry.pf_entry))
}

/// Where this vCPU's kernel takes SYSCALLs and page faults, once it has
/// set LSTAR and its IDT holds a #PF gate.
fn read_entry(vcpu: &dyn VcpuOps, mem: &GuestMemory) -> Option<SyscallEntry> {
    let sregs = vcpu.sregs();
    if sregs.efer & EFER_SCE == 0 {
        return None;
    }
    let lstar = vcpu.msr(MSR_LSTAR).ok().filter(|&l| l != 0)?;
    let star = vcpu.msr(MSR_STAR).ok()?;
    let fmask = vcpu.msr(MSR_SYSCALL_MASK).ok()?;
    if u64::from(sregs.idt.limit) < PF_VECTOR * GATE_SIZE + GATE_SIZE - 1 {
        return None;
    }
    let view = GuestView::new(mem, vcpu.paging(&sregs).ok()?);
    let mut gate = [0u8; GATE_SIZE as usize];
    view.read(
        sregs.idt.base.wrapping_add(PF_VECTOR * GATE_SIZE),
        &mut gate,
        Access::SupervisorRead,
    )
    .ok()?;
    Some(SyscallEntry {
        pf_entry: syscall_quirk::gate_target(&gate)?,
        lstar,
        fmask,
        kernel_cs: u16::try_from((star >> 32) & 0xffff).ok()?,
    })
}

/// Whether a Debug exit is the #PF breakpoint's.
pub fn owns(vcpu: &dyn VcpuOps, exit: &kvm_debug_exit_arch) -> bool {
    exit.dr6 & DR6_B0 != 0 && vcpu.breakpoint() == Some(exit.pc)
}

/// At the kernel's #PF handler: completes the SYSCALL the fault stands
/// for, or lets the fault through, past the handler's first instruction
/// (`skip_first`). A frame or byte the guard cannot read lets the fault
/// through too: the kernel then handles it as it would on any host.
pub fn stop(cx: &mut ExitCx<'_>) -> Result<(), VcpuError> {
    cx.metrics.pf_entry_stops.fetch_add(1, Ordering::Relaxed);
    let regs = cx.vcpu.regs();
    let completed = cx
        .syscall_fixup
        .and_then(SyscallFixup::entry)
        .and_then(|entry| {
            let sregs = cx.vcpu.sregs();
            let view = GuestView::new(cx.mem, cx.vcpu.paging(&sregs).ok()?);
            let mut raw = [0u8; PfFrame::SIZE];
            view.read(regs.rsp, &mut raw, Access::SupervisorRead).ok()?;
            let frame = PfFrame::from_bytes(&raw);
            if !frame.is_fetch_at(entry.lstar) {
                return None;
            }
            let mut before = [0u8; 2];
            let read = regs
                .rcx
                .checked_sub(2)
                .is_some_and(|at| view.read(at, &mut before, Access::UserRead).is_ok());
            syscall_quirk::complete(
                &entry,
                &regs,
                sregs.cs.selector,
                &frame,
                read.then_some(before),
            )
        });
    if let Some(syscall) = completed {
        cx.metrics
            .syscalls_completed
            .fetch_add(1, Ordering::Relaxed);
        cx.vcpu.set_regs(&syscall);
        return Ok(());
    }
    let sregs = cx.vcpu.sregs();
    let past = cx
        .vcpu
        .paging(&sregs)
        .ok()
        .and_then(|paging| lwp_insn::fetch(&GuestView::new(cx.mem, paging), regs.rip, false).ok())
        .and_then(|(bytes, len)| syscall_quirk::skip_first(&regs, sregs.cr4, &bytes[..len]));
    match past {
        Some(past) => cx.vcpu.set_regs(&past),
        None => {
            // The fault must go on, and nothing else gets it past the
            // breakpoint: the fixup ends here for the whole VM.
            if let Some(fixup) = cx.syscall_fixup {
                fixup.give_up();
            }
            cx.vcpu.set_breakpoint(None)?;
            guest_warn!(
                cx.metrics.guest_warnings,
                "vCPU {}: the kernel's #PF handler at {:#x} begins with an instruction lwpvmm \
                 cannot carry out for it: SYSCALLs left at CPL3 are no longer completed",
                cx.vcpu.id(),
                regs.rip
            );
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "pf_entry_tests.rs"]
mod tests;
