//! Precise events by single-stepping, per vCPU: the backend this host
//! allows, whether the guest declared its #DB doorbell, and where the
//! stepped context stands (the instruction that retires at the next step,
//! and a port instruction whose trap kvm_pvm drops). The #DB doorbell (and
//! its register call), KVM's Debug exits, stepping across an emulated LWP
//! instruction, arming at an exit, and handing the step origin to a guest
//! that switches tasks and back live here; what one step retires is
//! `vmm::vcpu::step`. docs/pv-abi.md.

use std::sync::atomic::Ordering;

use kvm_bindings::{kvm_debug_exit_arch, kvm_sregs};
use vm_memory::ByteValued;

use super::context::ExitCx;
use super::protocol::VcpuError;
use crate::guard::{Access, GuestView};
use crate::guest_warn;
use crate::lwp::record::EventId;
use crate::vmm::base::pv::{Frame, RFLAGS_TF, Reply};
use crate::vmm::vcpu::lwp_insn::{self, LwpMnemonic};
use crate::vmm::vcpu::privilege;
use crate::vmm::vcpu::step::{self, StepBackend};

/// The #DB doorbell (docs/pv-abi.md): a single-step trap of the trap-flag
/// backend. The instruction at the step origin has retired and control is
/// at the frame's RIP. Counts IRE, and BRE for a branch, then keeps TF in
/// the frame while the context stays live. A #DB lwpvmm did not cause (no
/// stepping in progress) goes to the guest's own handler.
pub fn db_doorbell(cx: &mut ExitCx<'_>) {
    let (mut regs, sregs) = (cx.vcpu.regs(), cx.vcpu.sregs());
    // A ring from outside CPL0 has no handler to answer and changes
    // nothing: writing the registers would also cancel the single-step trap
    // KVM holds pending for the `out` itself.
    if !privilege::is_kernel(&sregs) {
        return;
    }
    let reply = step_trap(cx, &sregs, regs.rsp);
    regs.rflags = reply.apply(regs.rflags);
    cx.vcpu.set_regs(&regs);
}

/// The #DB doorbell's work (also the register call's) for the trap frame at
/// `frame_at`, from CPL0: counts the step and sets or clears TF in the
/// frame, or answers [`Reply::NotOurs`] with the frame untouched.
pub fn step_trap(cx: &mut ExitCx<'_>, sregs: &kvm_sregs, frame_at: u64) -> Reply {
    // Every check comes before the stepping state is taken, so that a
    // refused call leaves the stepping in progress intact.
    let checked = cx.vcpu.paging(sregs).ok().and_then(|paging| {
        let view = GuestView::new(cx.mem, paging);
        let mut frame = Frame::default();
        view.read(frame_at, frame.as_mut_slice(), Access::SupervisorRead)
            .ok()?;
        let code = privilege::frame_privilege(&view, sregs, frame.cs, frame.ss).ok()?;
        Some((view, frame, code))
    });
    let (Some((mut view, mut frame, code)), Some(mut prev)) =
        (checked, cx.lwp.stepper.state.step_from)
    else {
        return Reply::NotOurs;
    };
    let (user, bitness) = (code.cpl == 3, code.bitness);
    cx.lwp.stepper.state.step_from = None;
    let tsc = cx.vcpu.guest_tsc();
    let pio = cx.lwp.stepper.state.pio_step.take();
    if let (true, Some(unit)) = (user, cx.lwp.unit_mut()) {
        if let Some((at, after)) = pio
            && at == prev
            && frame.rip != after
        {
            // The trap after the port instruction was lost: it retired
            // first, then the instruction at `after`.
            cx.metrics.steps.fetch_add(1, Ordering::Relaxed);
            step::retire(unit, &mut view, bitness, prev, after, tsc);
            prev = after;
        }
        cx.metrics.steps.fetch_add(1, Ordering::Relaxed);
        step::retire(unit, &mut view, bitness, prev, frame.rip, tsc);
    }
    if cx.lwp.precise_live(user, sregs.cr3) {
        cx.lwp.stepper.state.step_from = Some(frame.rip);
        frame.rflags |= RFLAGS_TF;
    } else {
        frame.rflags &= !RFLAGS_TF;
    }
    if view
        .write(frame_at, frame.as_slice(), Access::SupervisorWrite)
        .is_err()
    {
        cx.lwp.stepper.state.step_from = None;
    }
    Reply::Handled
}

/// A Debug exit of the guest-debug backend: a step at CPL3 retires the
/// instruction at the step origin; steps through CPL0 code (a handler) are
/// not counted.
pub fn debug_exit(cx: &mut ExitCx<'_>, exit: &kvm_debug_exit_arch) -> Result<(), VcpuError> {
    let Some(pc) = step::debug_exit_step(exit) else {
        return Ok(());
    };
    let sregs = cx.vcpu.sregs();
    if !privilege::is_user(&sregs) {
        return Ok(());
    }
    let tsc = cx.vcpu.guest_tsc();
    let paging = cx.vcpu.paging(&sregs);
    if let (Some(prev), Ok(paging), Some(unit)) =
        (cx.lwp.stepper.state.step_from, paging, cx.lwp.unit_mut())
    {
        cx.metrics.steps.fetch_add(1, Ordering::Relaxed);
        let bitness = lwp_insn::code_bitness(sregs.cs.l, sregs.cs.db);
        let mut view = GuestView::new(cx.mem, paging);
        step::retire(unit, &mut view, bitness, prev, pc, tsc);
    }
    if cx.lwp.precise_live(true, sregs.cr3) {
        cx.lwp.stepper.state.step_from = Some(pc);
        Ok(())
    } else {
        cx.lwp.stepper.state.step_from = None;
        cx.vcpu.single_step(false)
    }
}

/// Starts stepping at an exit that finds the context live at CPL3 but not
/// stepped (stepping stops where event delivery masks TF).
pub fn arm(cx: &mut ExitCx<'_>) -> Result<(), VcpuError> {
    if cx.lwp.stepper.state.step_from.is_some() {
        return Ok(());
    }
    let (mut regs, sregs) = (cx.vcpu.regs(), cx.vcpu.sregs());
    if !cx.lwp.precise_live(privilege::is_user(&sregs), sregs.cr3) {
        return Ok(());
    }
    cx.lwp.stepper.state.step_from = Some(regs.rip);
    match cx.lwp.stepper.backend {
        Some(StepBackend::TrapFlag) => {
            regs.rflags |= RFLAGS_TF;
            cx.vcpu.set_regs(&regs);
            Ok(())
        }
        Some(StepBackend::GuestDebug) => cx.vcpu.single_step(true),
        None => Ok(()),
    }
}

/// Notes a port instruction of the stepped context after its exit (see
/// [`StepState::pio_step`]). KVM reports RIP at the instruction or, as
/// kvm_pvm does, already after it.
pub fn note_pio_step(cx: &mut ExitCx<'_>) {
    let (rip, sregs) = (cx.vcpu.regs().rip, cx.vcpu.sregs());
    let (Some(at), true) = (cx.lwp.stepper.state.step_from, privilege::is_user(&sregs)) else {
        return;
    };
    let Ok(paging) = cx.vcpu.paging(&sregs) else {
        return;
    };
    let view = GuestView::new(cx.mem, paging);
    let after = lwp_insn::fetch(&view, at, true)
        .ok()
        .and_then(|(bytes, len)| {
            let bitness = lwp_insn::code_bitness(sregs.cs.l, sregs.cs.db);
            lwp_insn::length(&bytes[..len], bitness, at)
        })
        .map(|n| at.wrapping_add(n));
    cx.lwp.stepper.state.pio_step = after
        .filter(|&after| rip == at || rip == after)
        .map(|after| (at, after));
}

/// Stepping across an LWP instruction lwpvmm emulated at `rip` for a context
/// (CPL3 or not, CR3) that continues at `next`: the instruction retires (IRE
/// when a step was in progress), and the context's RFLAGS (`rflags`, the
/// frame's) keeps or loses TF as the context stays live or not.
pub fn across_instruction(
    cx: &mut ExitCx<'_>,
    view: &mut GuestView<'_>,
    mnemonic: LwpMnemonic,
    (user, cr3): (bool, u64),
    (rip, next): (u64, u64),
    rflags: &mut u64,
) {
    let id = cx.vcpu.id();
    if mnemonic == LwpMnemonic::Llwpcb && cx.lwp.stepper.withholds() {
        guest_warn!(
            cx.metrics.guest_warnings,
            "vCPU {id}: IRE and BRE not granted: the guest has not declared its #DB doorbell (docs/pv-abi.md)"
        );
    }
    let tsc = cx.vcpu.guest_tsc();
    let stepping = cx.lwp.stepper.state.step_from.take().is_some();
    let trap_flag = cx.lwp.stepper.trap_flag();
    if cx.lwp.precise_live(user, cr3) {
        if let (true, Some(unit)) = (stepping, cx.lwp.unit_mut()) {
            unit.count(view, EventId::Ire, 1, rip, tsc);
        }
        cx.lwp.stepper.state.step_from = Some(next);
        if trap_flag {
            *rflags |= RFLAGS_TF;
        }
    } else if stepping && trap_flag {
        *rflags &= !RFLAGS_TF;
    }
}
