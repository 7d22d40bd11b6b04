//! Delivering a fault as the guest's CPU would have: at a CPL0 LWP
//! instruction directly, and for an instruction behind the #UD doorbell by
//! first popping the #UD frame as IRETQ would (RIP, RSP, RFLAGS, and CS and
//! SS reloaded from the guest's GDT), so the fault lands at the LWP
//! instruction itself. When KVM already has an event in flight, the fault
//! waits: the instruction restarts after that event (see `Delivery`).

use std::sync::atomic::Ordering;

use kvm_bindings::{kvm_regs, kvm_sregs};
use vm_memory::ByteValued;

use super::context::ExitCx;
use super::ops::Delivery;
use super::protocol::VcpuError;
use crate::guard::{Access, GuestView};
use crate::guest_warn;
use crate::lwp::fault::GuestFault;
use crate::vmm::base::pv::{Frame, Reply};
use crate::vmm::vcpu::privilege;

/// Injects `fault` with `regs` and `sregs` (see [`Delivery`]), counting a
/// restart.
pub fn fault(
    cx: &mut ExitCx<'_>,
    regs: &kvm_regs,
    sregs: &kvm_sregs,
    fault: GuestFault,
) -> Result<(), VcpuError> {
    let mut sregs = *sregs;
    // KVM_SET_SREGS queues the interrupt this bitmap names as in flight.
    // The copy KVM_CAP_SYNC_REGS took at the exit may still name one that
    // KVM has delivered since (seen on kvm_pvm: the local APIC timer's
    // vector); written back, it would be delivered a second time right
    // after the fault, at the handler's first instruction, before the
    // kernel's SWAPGS: a double fault in Linux. KVM's own event state is
    // what is in flight (`VcpuOps::inject`).
    sregs.interrupt_bitmap = [0; 4];
    if cx.vcpu.inject(regs, &sregs, fault)? == Delivery::Restarted {
        cx.metrics.fault_restarts.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// Pops the #UD frame at `regs.rsp` and injects `fault` at the instruction
/// it describes. A frame that cannot be unwound gets the doorbell's "not
/// ours" answer instead, with a rate-limited warning.
pub fn after_unwind(
    cx: &mut ExitCx<'_>,
    mut regs: kvm_regs,
    mut sregs: kvm_sregs,
    fault: GuestFault,
) -> Result<(), VcpuError> {
    let unwound = cx.vcpu.paging(&sregs).ok().and_then(|paging| {
        let view = GuestView::new(cx.mem, paging);
        let mut frame = Frame::default();
        view.read(regs.rsp, frame.as_mut_slice(), Access::SupervisorRead)
            .ok()?;
        let cs = privilege::load_segment(&view, &sregs, u16::try_from(frame.cs).ok()?)?;
        let ss = privilege::load_segment(&view, &sregs, u16::try_from(frame.ss).ok()?)?;
        Some((frame, cs, ss))
    });
    let Some((frame, cs, ss)) = unwound else {
        let id = cx.vcpu.id();
        guest_warn!(
            cx.metrics.guest_warnings,
            "vCPU {id}: cannot unwind the #UD frame to deliver {fault}"
        );
        regs.rflags = Reply::NotOurs.apply(regs.rflags);
        cx.vcpu.set_regs(&regs);
        return Ok(());
    };
    regs.rip = frame.rip;
    regs.rsp = frame.rsp;
    regs.rflags = frame.rflags;
    sregs.cs = cs;
    sregs.ss = ss;
    self::fault(cx, &regs, &sregs, fault)
}
