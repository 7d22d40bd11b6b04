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
mod tests {
    use super::*;
    use crate::lwp::cpuid::{LwpFeatures, LwpProfile};
    use crate::lwp::fault::PF_USER;
    use crate::vmm::vcpu::lwp::after_exit;
    use crate::vmm::vcpu::step::StepBackend;
    use crate::vmm::vcpu::testing::*;
    use vm_memory::{Bytes, GuestAddress};

    /// Where the call is made from.
    #[derive(Clone, Copy)]
    enum From {
        Cpl0,
        Cpl3(bool),
    }

    #[test]
    fn every_status() {
        let unmapped_block = {
            let mut a = LwpXsaveArea::INIT;
            a.lwpcb_address = UNMAPPED;
            a
        };
        // (what, profile, from, op, area at, area content, status, RDX)
        type Case = (
            &'static str,
            LwpProfile,
            From,
            u8,
            u64,
            Option<LwpXsaveArea>,
            StateStatus,
            u64,
        );
        let table: [Case; 10] = [
            (
                "save",
                LwpProfile::Emulated,
                From::Cpl0,
                1,
                AREA,
                None,
                StateStatus::Ok,
                0,
            ),
            (
                "restore of LWP off",
                LwpProfile::Emulated,
                From::Cpl0,
                2,
                AREA,
                Some(LwpXsaveArea::INIT),
                StateStatus::Ok,
                0,
            ),
            (
                "declare the #DB doorbell",
                LwpProfile::Precise,
                From::Cpl0,
                3,
                0,
                None,
                StateStatus::Ok,
                0,
            ),
            (
                "no LWP",
                LwpProfile::Off,
                From::Cpl0,
                1,
                AREA,
                None,
                StateStatus::NoLwp,
                0,
            ),
            (
                "save into unmapped memory",
                LwpProfile::Emulated,
                From::Cpl0,
                1,
                UNMAPPED,
                None,
                StateStatus::BadArea,
                0,
            ),
            (
                "restore from unmapped memory",
                LwpProfile::Emulated,
                From::Cpl0,
                2,
                UNMAPPED,
                None,
                StateStatus::BadArea,
                0,
            ),
            (
                "restore of an unmapped LWPCB",
                LwpProfile::Emulated,
                From::Cpl0,
                2,
                AREA,
                Some(unmapped_block),
                StateStatus::Refused,
                14,
            ),
            (
                "unknown operation",
                LwpProfile::Emulated,
                From::Cpl0,
                9,
                AREA,
                None,
                StateStatus::BadCall,
                0,
            ),
            (
                "from CPL3",
                LwpProfile::Emulated,
                From::Cpl3(false),
                1,
                USER_CODE,
                None,
                StateStatus::BadCall,
                0,
            ),
            (
                "from CPL3 in a conforming segment",
                LwpProfile::Emulated,
                From::Cpl3(true),
                1,
                AREA,
                None,
                StateStatus::BadCall,
                0,
            ),
        ];
        for (what, profile, from, op, at, content, status, rdx) in table {
            let mut r = Rig::new(profile, None);
            if let Some(area) = content {
                r.mem
                    .write_slice(area.as_slice(), GuestAddress(at))
                    .unwrap();
            }
            r.mem
                .write_slice(&[0xee; 128], GuestAddress(AREA + 0x800))
                .unwrap();
            if let From::Cpl3(conforming) = from {
                r.at_cpl3(conforming);
            }
            r.vcpu.regs.rax = u64::from(op);
            r.vcpu.regs.rdi = at;
            // docs/pv-abi.md: every call writes RAX, RDX, RCX and R8 (0
            // where they say nothing) and no other register.
            (r.vcpu.regs.rcx, r.vcpu.regs.r8) = (0x1111, 0x2222);
            (r.vcpu.regs.rbx, r.vcpu.regs.r9, r.vcpu.regs.r15) = (0x3333, 0x4444, 0x5555);
            lwp_state_call(&mut r.cx());
            assert_eq!(r.vcpu.regs.rax, status as u64, "{what}");
            assert_eq!(r.vcpu.regs.rdx, rdx, "{what}");
            let regs = &r.vcpu.regs;
            assert_eq!(
                (regs.rbx, regs.r9, regs.r15),
                (0x3333, 0x4444, 0x5555),
                "{what}: preserved"
            );
            if status == StateStatus::Refused {
                assert_eq!(r.vcpu.regs.rcx, UNMAPPED, "{what}: the #PF address");
                assert_eq!(r.lwp.unit().unwrap().cbaddr(), 0, "{what}: LWP is off");
            } else {
                assert_eq!((regs.rcx, regs.r8), (0, 0), "{what}: RCX and R8 cleared");
            }
        }
    }

    #[test]
    fn a_save_writes_the_image_and_a_refused_call_writes_nothing() {
        let mut r = Rig::new(LwpProfile::Emulated, None);
        r.vcpu.regs.rax = 1;
        r.vcpu.regs.rdi = AREA;
        lwp_state_call(&mut r.cx());
        let image: LwpXsaveArea = r.mem.read_obj(GuestAddress(AREA)).unwrap();
        assert_eq!(image, r.lwp.unit().unwrap().save_xsave());
        r.mem.write_slice(&[0xee; 128], GuestAddress(AREA)).unwrap();
        r.at_cpl3(true);
        r.vcpu.regs.rax = 1;
        lwp_state_call(&mut r.cx());
        let mut after = [0u8; 128];
        r.mem.read_slice(&mut after, GuestAddress(AREA)).unwrap();
        assert_eq!(after, [0xee; 128], "nothing written from CPL3");
    }

    #[test]
    fn declaring_the_db_doorbell_grants_precise_events() {
        let mut r = Rig::new(LwpProfile::Precise, Some(StepBackend::TrapFlag));
        let withheld = |r: &Rig| r.lwp.unit().unwrap().withheld();
        assert_eq!(withheld(&r), LwpFeatures::IRE | LwpFeatures::BRE);
        r.vcpu.regs.rax = 3;
        lwp_state_call(&mut r.cx());
        assert_eq!(withheld(&r), LwpFeatures::empty());
    }

    /// Where the register calls' frame is: its exception frame is the rig's.
    const REGS_AT: u64 = FRAME_AT - REGS_FRAME_OFFSET;

    #[test]
    fn register_calls() {
        const HIGH: u64 = 0xABCD_0000_0000_0000;
        const SLWPCB_RAX: [u8; 5] = [0x8f, 0xe9, 0xf8, 0x12, 0xc8];
        const LLWPCB_EAX_B: [u8; 5] = [0x8f, 0xc9, 0x78, 0x12, 0xc0];
        // (what, operation, code at USER_CODE, CS, RAX in the frame, RDI,
        // status, RDX, RIP in the frame after, RAX in the frame after)
        type Case = (
            &'static str,
            u8,
            &'static [u8],
            u64,
            u64,
            u64,
            StateStatus,
            u64,
            u64,
            u64,
        );
        let table: [Case; 8] = [
            (
                "lwpins",
                4,
                &LWPINS,
                USER_CS,
                7,
                REGS_AT,
                StateStatus::Ok,
                0,
                USER_CODE + 9,
                7,
            ),
            (
                "slwpcb writes the saved RAX",
                4,
                &SLWPCB_RAX,
                USER_CS,
                0,
                REGS_AT,
                StateStatus::Ok,
                0,
                USER_CODE + 5,
                LWPCB,
            ),
            (
                "llwpcb eax in compatibility mode: XOP.B ignored",
                4,
                &LLWPCB_EAX_B,
                USER_CS32,
                HIGH | LWPCB,
                REGS_AT,
                StateStatus::Ok,
                0,
                USER_CODE + 5,
                HIGH | LWPCB,
            ),
            (
                "not an LWP instruction",
                4,
                &[0x90],
                USER_CS,
                1,
                REGS_AT,
                StateStatus::NotOurs,
                0,
                USER_CODE,
                1,
            ),
            (
                "llwpcb of an unmapped block: the fault, nothing written",
                4,
                &LLWPCB_RAX,
                USER_CS,
                UNMAPPED,
                REGS_AT,
                StateStatus::Fault,
                14,
                USER_CODE,
                UNMAPPED,
            ),
            (
                "a frame in unmapped memory",
                4,
                &LWPINS,
                USER_CS,
                0,
                UNMAPPED,
                StateStatus::BadArea,
                0,
                USER_CODE,
                0,
            ),
            (
                "a frame whose CS claims CPL3 with a kernel SS",
                4,
                &LWPINS,
                USER_CS,
                0,
                REGS_AT,
                StateStatus::NotOurs,
                0,
                USER_CODE,
                0,
            ),
            (
                "a #DB register call with no stepping in progress",
                5,
                &[0x90],
                USER_CS,
                0,
                REGS_AT,
                StateStatus::NotOurs,
                0,
                USER_CODE,
                0,
            ),
        ];
        for (what, op, code, cs, rax, at, status, rdx, rip, rax_after) in table {
            let mut r = Rig::new(LwpProfile::Emulated, None);
            r.lwpcb(0x2);
            r.code(USER_CODE + 0x100, &LLWPCB_RAX);
            r.frame(USER_CODE + 0x100, USER_CS, USER_DS, 0x202);
            r.vcpu.regs.rax = LWPCB;
            doorbell::ud_doorbell(&mut r.cx()).unwrap();
            assert_eq!(r.lwp.unit().unwrap().cbaddr(), LWPCB, "{what}: loaded");
            r.code(USER_CODE, code);
            let ss = if what.contains("kernel SS") {
                KERNEL_DS
            } else {
                USER_DS
            };
            r.frame(USER_CODE, cs, ss, 0x202);
            let mut saved: SavedRegs = r.mem.read_obj(GuestAddress(REGS_AT)).unwrap();
            saved.rax = rax;
            saved.rcx = 0x11;
            r.mem.write_obj(saved, GuestAddress(REGS_AT)).unwrap();
            r.vcpu.regs.rax = u64::from(op);
            r.vcpu.regs.rdi = at;
            lwp_state_call(&mut r.cx());
            assert_eq!(r.vcpu.regs.rax, status as u64, "{what}");
            assert_eq!(r.vcpu.regs.rdx, rdx, "{what}");
            let after: SavedRegs = r.mem.read_obj(GuestAddress(REGS_AT)).unwrap();
            assert_eq!((after.frame.rip, after.rax), (rip, rax_after), "{what}");
            if status == StateStatus::Fault {
                assert_eq!(r.vcpu.regs.rcx, UNMAPPED, "{what}: the #PF address");
                assert_eq!(r.vcpu.regs.r8, u64::from(PF_USER), "{what}: error code");
            }
        }
    }

    #[test]
    fn executable_mappings_are_checked() {
        let good = {
            let mut m = ExecMapping {
                start: 0x40_0000,
                end: 0x40_8000,
                flags: MAPPING_FIRST,
                ..ExecMapping::default()
            };
            m.path[..8].copy_from_slice(b"/lwp-hot");
            m
        };
        let unterminated = ExecMapping {
            path: [b'a'; 256],
            ..good
        };
        let empty_range = ExecMapping {
            end: 0x40_0000,
            ..good
        };
        // (what, mapping, RDI, status)
        let table = [
            ("a mapping", good, AREA, StateStatus::Ok),
            (
                "a path without its NUL",
                unterminated,
                AREA,
                StateStatus::BadCall,
            ),
            ("an empty range", empty_range, AREA, StateStatus::BadCall),
            (
                "outside mapped memory",
                good,
                UNMAPPED,
                StateStatus::BadArea,
            ),
        ];
        for (what, mapping, rdi, status) in table {
            let mut r = Rig::new(LwpProfile::Emulated, None);
            r.mem.write_obj(mapping, GuestAddress(AREA)).unwrap();
            r.vcpu.regs.rax = 9;
            r.vcpu.regs.rdi = rdi;
            lwp_state_call(&mut r.cx());
            assert_eq!(r.vcpu.regs.rax, status as u64, "{what}");
        }
    }

    #[test]
    fn a_mapping_names_its_process_lwp_on_or_off() {
        use crate::profile::trace::TraceRecord;
        use crate::vmm::base::recorder::{CaptureOwner, Recorder};
        // (profile, flags, the process a capture names)
        let table = [
            (LwpProfile::Emulated, MAPPING_PROCESS, Some("lwp-hot[42]")),
            (LwpProfile::Off, MAPPING_PROCESS, Some("lwp-hot[42]")),
            // An older module's mapping: no process follows it.
            (LwpProfile::Off, 0, None),
        ];
        for (profile, flags, want) in table {
            let mut r = Rig::new(profile, None);
            r.recorder = Recorder::new(None, true, 0);
            let mut m = ExecMapping {
                start: 0x40_0000,
                end: 0x40_8000,
                flags: MAPPING_FIRST | flags,
                pid: 42,
                ..ExecMapping::default()
            };
            m.path[..8].copy_from_slice(b"/lwp-hot");
            r.mem.write_obj(m, GuestAddress(AREA)).unwrap();
            let mut p = MappingProcess::default();
            p.name[..7].copy_from_slice(b"lwp-hot");
            let after = AREA + std::mem::size_of::<ExecMapping>() as u64;
            r.mem.write_obj(p, GuestAddress(after)).unwrap();
            let id = r.recorder.start_capture(CaptureOwner::Owner).unwrap();
            r.vcpu.regs.rax = 9;
            r.vcpu.regs.rdi = AREA;
            lwp_state_call(&mut r.cx());
            assert_eq!(r.vcpu.regs.rax, StateStatus::Ok as u64, "{profile}");
            let cr3 = r.vcpu.sregs.cr3 & CR3_ADDR;
            r.recorder
                .records(&[TraceRecord::stacked(0, cr3, 0x40_1000, &[])]);
            let mut resolver = crate::profile::objects::Resolver::new(None, None);
            let tally = r.recorder.finish_capture(id).unwrap().tally(&mut resolver);
            let top = tally.stacks(None).next().unwrap();
            assert_eq!(
                top.process.map(ToString::to_string).as_deref(),
                want,
                "{profile} {flags}"
            );
        }
    }

    #[test]
    fn the_threshold_line_call() {
        // (profile, RDI, status, threshold line on after, crossings in
        // replies after)
        let table = [
            (LwpProfile::Emulated, 1, StateStatus::Ok, true, false),
            (LwpProfile::Emulated, 3, StateStatus::Ok, true, true),
            (LwpProfile::Emulated, 0, StateStatus::Ok, false, false),
            (LwpProfile::Emulated, 2, StateStatus::BadCall, false, false),
            (LwpProfile::Emulated, 5, StateStatus::BadCall, false, false),
            (LwpProfile::Off, 1, StateStatus::NoLwp, false, false),
        ];
        for (profile, rdi, status, on, in_reply) in table {
            let mut r = Rig::new(profile, None);
            r.vcpu.regs.rax = 6;
            r.vcpu.regs.rdi = rdi;
            lwp_state_call(&mut r.cx());
            assert_eq!(r.vcpu.regs.rax, status as u64, "{profile} {rdi}");
            let state = r.lwp.state();
            assert_eq!(
                state
                    .as_ref()
                    .map(|s| (s.threshold_line, s.crossings_in_reply)),
                (profile != LwpProfile::Off).then_some((on, in_reply)),
                "{profile} {rdi}"
            );
        }
    }

    /// A crossing by the instruction of a #UD register call: with crossings
    /// in replies, RDX = 1 and nothing on the line (the kernel signals the
    /// task, current now; the line's interrupt would wait for interrupts to
    /// be turned on, maybe after a switch); with the line only, RDX = 0 and
    /// one edge after the exit.
    #[test]
    fn a_register_call_answers_its_crossing_in_the_reply_when_asked() {
        // (operation 6's RDI, RDX of the LWPINS call, edges on the line)
        for (rdi, rdx, edges) in [(3u64, 1u64, 0u32), (1, 0, 1)] {
            let mut r = Rig::new(LwpProfile::Emulated, None);
            r.vcpu.regs.rax = 6;
            r.vcpu.regs.rdi = rdi;
            lwp_state_call(&mut r.cx());
            let int = 1u32 << 31;
            r.lwpcb_with(int | 0x2, 32);
            r.lwp
                .unit_mut()
                .unwrap()
                .write_cfg(u64::from(int | 0x2))
                .unwrap();
            r.code(USER_CODE + 0x100, &LLWPCB_RAX);
            r.frame(USER_CODE + 0x100, USER_CS, USER_DS, 0x202);
            r.vcpu.regs.rax = LWPCB;
            doorbell::ud_doorbell(&mut r.cx()).unwrap();
            r.code(USER_CODE, &LWPINS);
            r.frame(USER_CODE, USER_CS, USER_DS, 0x202);
            r.vcpu.regs.rax = 4;
            r.vcpu.regs.rdi = REGS_AT;
            lwp_state_call(&mut r.cx());
            after_exit(&mut r.cx()).unwrap();
            assert_eq!(r.vcpu.regs.rax, StateStatus::Ok as u64, "RDI {rdi}");
            assert_eq!(r.vcpu.regs.rdx, rdx, "RDI {rdi}");
            assert_eq!(r.vcpu.lines.get(), edges, "RDI {rdi}");
            assert_eq!(r.metrics.counters().lwp_interrupts, 1, "RDI {rdi}");
        }
    }

    /// Switching out flushes the ring head into the LWPCB unless the task's
    /// address space is going away (RSI = 1); either way LWP is off after.
    #[test]
    fn switch_out_flushes_unless_told_not_to() {
        // (RSI, head in the LWPCB after)
        for (rsi, head) in [(0u64, 32u32), (1, 0)] {
            let mut r = Rig::new(LwpProfile::Emulated, None);
            r.lwpcb(0x2);
            r.code(USER_CODE, &LLWPCB_RAX);
            r.frame(USER_CODE, USER_CS, USER_DS, 0x202);
            r.vcpu.regs.rax = LWPCB;
            doorbell::ud_doorbell(&mut r.cx()).unwrap();
            r.code(USER_CODE + 5, &LWPINS);
            r.frame(USER_CODE + 5, USER_CS, USER_DS, 0x202);
            doorbell::ud_doorbell(&mut r.cx()).unwrap();
            r.vcpu.regs.rax = 7;
            r.vcpu.regs.rdi = AREA;
            r.vcpu.regs.rsi = rsi;
            lwp_state_call(&mut r.cx());
            assert_eq!(r.vcpu.regs.rax, 0, "RSI {rsi}");
            let cb: crate::lwp::lwpcb::LwpcbFixed = r.mem.read_obj(GuestAddress(LWPCB)).unwrap();
            assert_eq!(cb.head, head, "RSI {rsi}");
            assert_eq!(r.lwp.unit().unwrap().cbaddr(), 0, "RSI {rsi}: LWP off");
            let image: LwpXsaveArea = r.mem.read_obj(GuestAddress(AREA)).unwrap();
            assert_eq!(image.lwpcb_address, LWPCB, "RSI {rsi}: the image saved");
        }
    }
}
