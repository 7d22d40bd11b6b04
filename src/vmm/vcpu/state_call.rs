//! The LWP state calls (docs/pv-abi.md): a guest kernel saves and restores
//! a vCPU's LWP state as a component-62 image, around its own context
//! switches, declares that it reports single-step traps, hands lwpvmm an
//! LWP instruction or a single-step trap described by a saved-register
//! frame (the register calls, for a handler that cannot start with a
//! doorbell: a Linux module's notifier), and moves its threshold interrupts
//! to a line. AL is the operation, RDI the area or frame (guest-linear,
//! supervisor memory); the status goes to RAX, a fault to RDX (vector), RCX
//! (#PF address) and R8 (#PF error code).

use std::sync::atomic::Ordering;

use kvm_bindings::kvm_sregs;
use vm_memory::ByteValued;

use super::context::ExitCx;
use super::doorbell::{self, Answer, GsBase};
use super::lwp_state::CR3_ADDR;
use super::stepper;
use crate::guard::{Access, GuestView};
use crate::guest_warn;
use crate::lwp::fault::GuestFault;
use crate::lwp::xsave::LwpXsaveArea;
use crate::profile::objects::hex;
use crate::profile::trace::{MappingLine, Process};
use crate::vmm::base::pv::{
    ExecMapping, LINE_CROSSINGS_IN_REPLY, LINE_ON, MAPPING_FIRST, MAPPING_PROCESS, MappingProcess,
    REGS_FRAME_OFFSET, REGS_SIZE, Reply, SavedRegs, StateOp, StateStatus, THRESHOLD_LINES,
};
use crate::vmm::vcpu::privilege;

/// Handles a write to the state port.
pub fn lwp_state_call(cx: &mut ExitCx<'_>) {
    cx.metrics.lwp_state_calls.fetch_add(1, Ordering::Relaxed);
    let (mut regs, sregs) = (cx.vcpu.regs(), cx.vcpu.sregs());
    let (status, detail) = state_call(cx, regs.rax as u8, regs.rdi, regs.rsi);
    cx.lwp.note_lwpcb_space(sregs.cr3);
    let fault = match detail {
        Detail::Fault(fault) => Some(fault),
        _ => None,
    };
    if let Some(fault) = fault {
        cx.metrics.count_denial(fault);
    }
    if !matches!(
        status,
        StateStatus::Ok | StateStatus::NotOurs | StateStatus::Fault
    ) {
        let id = cx.vcpu.id();
        guest_warn!(
            cx.metrics.guest_warnings,
            "vCPU {id}: LWP state call failed: {status:?}"
        );
    }
    regs.rax = status as u64;
    regs.rdx = match detail {
        Detail::Fault(f) => u64::from(f.vector()),
        Detail::Value(v) => v,
        Detail::Nothing => 0,
    };
    (regs.rcx, regs.r8) = match fault {
        Some(GuestFault::PageFault {
            address,
            error_code,
        }) => (address, u64::from(error_code)),
        _ => (0, 0),
    };
    cx.vcpu.set_regs(&regs);
}

/// What a call returns besides its status: a fault (RDX, RCX, R8) or a
/// value (RDX).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Detail {
    Nothing,
    Fault(GuestFault),
    Value(u64),
}

impl From<Option<GuestFault>> for Detail {
    fn from(fault: Option<GuestFault>) -> Self {
        fault.map_or(Detail::Nothing, Detail::Fault)
    }
}

/// Operation 4: the #UD doorbell's work for the saved-register frame at
/// `at`. The frame is read and written through the guard as supervisor
/// memory; the context's privilege comes from its saved CS, checked as the
/// doorbell checks it.
fn ud_regs(cx: &mut ExitCx<'_>, sregs: &kvm_sregs, at: u64) -> (StateStatus, Option<GuestFault>) {
    let Ok(paging) = cx.vcpu.paging(sregs) else {
        return (StateStatus::BadArea, None);
    };
    let mut saved = SavedRegs::default();
    let view = GuestView::new(cx.mem, paging);
    if view
        .read(at, saved.as_mut_slice(), Access::SupervisorRead)
        .and_then(|()| view.check(at, REGS_SIZE, Access::SupervisorWrite))
        .is_err()
    {
        return (StateStatus::BadArea, None);
    }
    let mut regs = saved.to_kvm();
    let frame_at = at.wrapping_add(REGS_FRAME_OFFSET);
    cx.metrics.ud_doorbells.fetch_add(1, Ordering::Relaxed);
    match doorbell::behind_doorbell(cx, &mut regs, sregs, frame_at, GsBase::Swapped) {
        Answer::Handled => {
            cx.metrics.ud_handled.fetch_add(1, Ordering::Relaxed);
            saved.set_gprs(&regs);
            let gprs = &saved.as_slice()[..REGS_FRAME_OFFSET as usize];
            let view = GuestView::new(cx.mem, paging);
            match view.write(at, gprs, Access::SupervisorWrite) {
                Ok(()) => (StateStatus::Ok, None),
                Err(_) => (StateStatus::BadArea, None),
            }
        }
        Answer::Fault(fault) => {
            cx.metrics.ud_faults.fetch_add(1, Ordering::Relaxed);
            (StateStatus::Fault, Some(fault))
        }
        Answer::NotOurs(why) => {
            cx.metrics.ud_not_lwp.fetch_add(1, Ordering::Relaxed);
            if let Some(why) = why {
                let id = cx.vcpu.id();
                guest_warn!(
                    cx.metrics.guest_warnings,
                    "vCPU {id}: #UD register call refused: {why}"
                );
            }
            (StateStatus::NotOurs, None)
        }
    }
}

fn state_call(cx: &mut ExitCx<'_>, op: u8, area_at: u64, rsi: u64) -> (StateStatus, Detail) {
    let sregs = cx.vcpu.sregs();
    if !privilege::is_kernel(&sregs) {
        return (StateStatus::BadCall, Detail::Nothing);
    }
    let op = StateOp::try_from(op);
    // A mapping names a process for a whole-guest profile, LWP or not.
    if cx.lwp.unit().is_none() && op != Ok(StateOp::ExecMapping) {
        return (StateStatus::NoLwp, Detail::Nothing);
    }
    let (Ok(paging), Ok(op)) = (cx.vcpu.paging(&sregs), op) else {
        return (StateStatus::BadCall, Detail::Nothing);
    };
    let mut view = GuestView::new(cx.mem, paging);
    let in_lwpcb_space = cx.lwp.in_lwpcb_space(sregs.cr3);
    match op {
        StateOp::Save => {
            let (status, fault) = save(cx, &mut view, area_at, in_lwpcb_space);
            (status, fault.into())
        }
        StateOp::Restore => {
            let (status, fault) = restore(cx, &mut view, area_at);
            (status, fault.into())
        }
        StateOp::SwitchOut => {
            // RSI = 1: the task's address space is going away (exit): no
            // flush into it.
            let flush = in_lwpcb_space && rsi == 0;
            let (status, fault) = save(cx, &mut view, area_at, flush);
            if let Some(unit) = cx.lwp.unit_mut() {
                unit.off();
            }
            let origin = cx.lwp.stepper.take();
            match status {
                StateStatus::Ok => (status, Detail::Value(origin.unwrap_or(0))),
                _ => (status, fault.into()),
            }
        }
        StateOp::SwitchIn => {
            let (status, fault) = restore(cx, &mut view, area_at);
            if status != StateStatus::Ok {
                return (status, fault.into());
            }
            cx.lwp.note_lwpcb_space(sregs.cr3);
            let resumed =
                rsi != 0 && cx.lwp.precise_live(true, sregs.cr3) && cx.lwp.stepper.resume(rsi);
            (status, Detail::Value(u64::from(resumed)))
        }
        StateOp::DeclareDb => {
            cx.lwp.declare_db();
            (StateStatus::Ok, Detail::Nothing)
        }
        StateOp::UdRegs => match ud_regs(cx, &sregs, area_at) {
            (StateStatus::Ok, _) => (StateStatus::Ok, crossing_reply(cx)),
            (status, fault) => (status, fault.into()),
        },
        StateOp::DbRegs => {
            let frame_at = area_at.wrapping_add(REGS_FRAME_OFFSET);
            match stepper::step_trap(cx, &sregs, frame_at) {
                Reply::Handled => (StateStatus::Ok, crossing_reply(cx)),
                Reply::NotOurs => (StateStatus::NotOurs, Detail::Nothing),
            }
        }
        StateOp::ThresholdLine => {
            if area_at & !(LINE_ON | LINE_CROSSINGS_IN_REPLY) != 0
                || area_at == LINE_CROSSINGS_IN_REPLY
            {
                return (StateStatus::BadCall, Detail::Nothing);
            }
            if u32::from(cx.vcpu.id()) >= THRESHOLD_LINES {
                return (StateStatus::NoLine, Detail::Nothing);
            }
            cx.lwp.set_threshold_line(
                area_at & LINE_ON != 0,
                area_at & LINE_CROSSINGS_IN_REPLY != 0,
            );
            (StateStatus::Ok, Detail::Nothing)
        }
        StateOp::ExecMapping => (exec_mapping(cx, &view, sregs.cr3, area_at), Detail::Nothing),
    }
}

/// RDX of a register call that succeeded: 1 when the instruction crossed
/// the threshold and the kernel asked for crossings in replies (it signals
/// the task itself, now current, and nothing is raised on the line).
fn crossing_reply(cx: &mut ExitCx<'_>) -> Detail {
    if cx.lwp.take_reply_crossing() {
        cx.metrics.lwp_interrupts.fetch_add(1, Ordering::Relaxed);
        Detail::Value(1)
    } else {
        Detail::Nothing
    }
}

/// Operation 9: the executable mapping at `at` of the address space `cr3`
/// goes to the recorder: the trace, and the mapping table of the API's
/// captures (without either it is only read).
fn exec_mapping(cx: &mut ExitCx<'_>, view: &GuestView<'_>, cr3: u64, at: u64) -> StateStatus {
    let mut m = ExecMapping::default();
    if view
        .read(at, m.as_mut_slice(), Access::SupervisorRead)
        .is_err()
    {
        return StateStatus::BadArea;
    }
    let Some(path) = m.path().filter(|_| m.start < m.end) else {
        return StateStatus::BadCall;
    };
    let process = if m.flags & MAPPING_PROCESS != 0 {
        let mut p = MappingProcess::default();
        let after = at.wrapping_add(std::mem::size_of::<ExecMapping>() as u64);
        if view
            .read(after, p.as_mut_slice(), Access::SupervisorRead)
            .is_err()
        {
            return StateStatus::BadArea;
        }
        Some(Process {
            pid: m.pid,
            name: p.name(),
        })
    } else {
        None
    };
    let line = MappingLine {
        cr3: cr3 & CR3_ADDR,
        start: m.start,
        end: m.end,
        offset: m.offset,
        path,
        build_id: m.build_id().map(hex).unwrap_or_default(),
        first: m.flags & MAPPING_FIRST != 0,
        process,
    };
    if !cx.recorder.mapping(&line) {
        cx.metrics.trace_errors.fetch_add(1, Ordering::Relaxed);
    }
    StateStatus::Ok
}

/// Saves the unit's state into the area at `area_at`, first flushing it
/// into the LWPCB when `flush` (its address space is current).
fn save(
    cx: &mut ExitCx<'_>,
    view: &mut GuestView<'_>,
    area_at: u64,
    flush: bool,
) -> (StateStatus, Option<GuestFault>) {
    let Some(unit) = cx.lwp.unit_mut() else {
        return (StateStatus::NoLwp, None);
    };
    // The image has no MissedEvents: flush it (and the head) into the
    // LWPCB as SLWPCB does. A flush that faults is counted in the unit's
    // flush_faults.
    if flush {
        unit.flush_for_switch(view);
    }
    let area = unit.save_xsave();
    match view.write(area_at, area.as_slice(), Access::SupervisorWrite) {
        Ok(()) => (StateStatus::Ok, None),
        Err(_) => (StateStatus::BadArea, None),
    }
}

/// Restores the unit's state from the untrusted area at `area_at`.
fn restore(
    cx: &mut ExitCx<'_>,
    view: &mut GuestView<'_>,
    area_at: u64,
) -> (StateStatus, Option<GuestFault>) {
    let mut area = LwpXsaveArea::INIT;
    if view
        .read(area_at, area.as_mut_slice(), Access::SupervisorRead)
        .is_err()
    {
        return (StateStatus::BadArea, None);
    }
    let Some(unit) = cx.lwp.unit_mut() else {
        return (StateStatus::NoLwp, None);
    };
    match unit.restore_xsave(view, &area) {
        Ok(()) => (StateStatus::Ok, None),
        Err(fault) => {
            // Never leave the previous context's LWPCB live for the context
            // being restored.
            unit.off();
            (StateStatus::Refused, Some(fault))
        }
    }
}

#[cfg(test)]
#[path = "state_call_tests.rs"]
mod tests;
