//! Delivering a fault as the guest's CPU would have: at a CPL0 LWP
//! instruction directly, and for an instruction behind the #UD doorbell by
//! first popping the #UD frame as IRETQ would (RIP, RSP, RFLAGS, and CS and
//! SS reloaded from the guest's GDT), so the fault lands at the LWP
//! instruction itself.

use kvm_bindings::{kvm_regs, kvm_sregs};
use vm_memory::ByteValued;

use super::VcpuError;
use super::exit::ExitCx;
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
    /// The #UD frame could not be unwound: the doorbell answered "not ours"
    /// instead (and a rate-limited warning says so).
    NotOurs,
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
    cx.vcpu.inject(&regs, &sregs, fault)?;
    Ok(Delivered::Injected)
}
