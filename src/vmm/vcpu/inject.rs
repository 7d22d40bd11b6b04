//! Delivering a fault as the guest's CPU would have: at a CPL0 LWP
//! instruction directly, and for an instruction behind the #UD doorbell by
//! first popping the #UD frame as IRETQ would (RIP, RSP, RFLAGS, and CS and
//! SS reloaded from the guest's GDT), so the fault lands at the LWP
//! instruction itself. When KVM already has an event in flight, the fault
//! waits: the instruction restarts after that event (see `Delivery`).

use std::sync::atomic::Ordering;

use kvm_bindings::{kvm_regs, kvm_sregs};
use vm_memory::ByteValued;

use super::VcpuError;
use super::exit::ExitCx;
use super::ops::Delivery;
use crate::guard::{Access, GuestView};
use crate::guest_warn;
use crate::lwp::fault::GuestFault;
use crate::vmm::privilege;
use crate::vmm::pv::{Frame, Reply};

/// Whether a fault reached the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivered {
    /// Injected at the faulting instruction.
    Injected,
    /// Not yet: KVM had an event in flight, which the guest takes first at
    /// the faulting instruction; that instruction then runs again.
    Restarted,
    /// The #UD frame could not be unwound: the doorbell answered "not ours"
    /// instead (and a rate-limited warning says so).
    NotOurs,
}

/// Injects `fault` with `regs` and `sregs` (see [`Delivery`]), counting a
/// restart.
pub fn fault(
    cx: &mut ExitCx<'_>,
    regs: &kvm_regs,
    sregs: &kvm_sregs,
    fault: GuestFault,
) -> Result<Delivered, VcpuError> {
    let mut sregs = *sregs;
    // KVM_SET_SREGS queues the interrupt this bitmap names as in flight.
    // The copy KVM_CAP_SYNC_REGS took at the exit may still name one that
    // KVM has delivered since (seen on kvm_pvm: the local APIC timer's
    // vector); written back, it would be delivered a second time right
    // after the fault, at the handler's first instruction, before the
    // kernel's SWAPGS: a double fault in Linux. KVM's own event state is
    // what is in flight (`VcpuOps::inject`).
    sregs.interrupt_bitmap = [0; 4];
    Ok(match cx.vcpu.inject(regs, &sregs, fault)? {
        Delivery::Injected => Delivered::Injected,
        Delivery::Restarted => {
            cx.metrics.fault_restarts.fetch_add(1, Ordering::Relaxed);
            Delivered::Restarted
        }
    })
}

/// Pops the #UD frame at `regs.rsp` and injects `fault` at the instruction
/// it describes.
pub fn after_unwind(
    cx: &mut ExitCx<'_>,
    mut regs: kvm_regs,
    mut sregs: kvm_sregs,
    fault: GuestFault,
) -> Result<Delivered, VcpuError> {
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
        return Ok(Delivered::NotOurs);
    };
    regs.rip = frame.rip;
    regs.rsp = frame.rsp;
    regs.rflags = frame.rflags;
    sregs.cs = cs;
    sregs.ss = ss;
    self::fault(cx, &regs, &sregs, fault)
}
