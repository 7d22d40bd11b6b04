//! The LWP state calls (docs/pv-abi.md): a guest kernel saves and restores
//! a vCPU's LWP state as a component-62 image, around its own context
//! switches, and declares its #DB doorbell. AL is the operation, RDI the
//! 128-byte area (guest-linear, supervisor memory); the status goes to RAX,
//! a refused image's fault to RDX (vector) and RCX (#PF address).

use std::sync::atomic::Ordering;

use vm_memory::ByteValued;

use super::exit::ExitCx;
use crate::guard::{Access, GuestView};
use crate::guest_warn;
use crate::lwp::fault::GuestFault;
use crate::lwp::xsave::LwpXsaveArea;
use crate::vmm::privilege;
use crate::vmm::pv::{StateOp, StateStatus};

/// Handles a write to the state port.
pub fn lwp_state_call(cx: &mut ExitCx<'_>) {
    cx.metrics.lwp_state_calls.fetch_add(1, Ordering::Relaxed);
    let (mut regs, sregs) = (cx.vcpu.regs(), cx.vcpu.sregs());
    let (status, detail) = state_call(cx, regs.rax as u8, regs.rdi);
    cx.lwp.note_lwpcb_space(sregs.cr3);
    if let Some(fault) = detail {
        cx.metrics.count_denial(fault);
    }
    if status != StateStatus::Ok {
        let id = cx.vcpu.id();
        guest_warn!(
            cx.metrics.guest_warnings,
            "vCPU {id}: LWP state call failed: {status:?}"
        );
    }
    regs.rax = status as u64;
    regs.rdx = detail.map_or(0, |f| u64::from(f.vector()));
    regs.rcx = match detail {
        Some(GuestFault::PageFault { address, .. }) => address,
        _ => 0,
    };
    cx.vcpu.set_regs(&regs);
}

fn state_call(cx: &mut ExitCx<'_>, op: u8, area_at: u64) -> (StateStatus, Option<GuestFault>) {
    let sregs = cx.vcpu.sregs();
    if !privilege::is_kernel(&sregs) {
        return (StateStatus::BadCall, None);
    }
    if cx.lwp.unit().is_none() {
        return (StateStatus::NoLwp, None);
    }
    let (Ok(paging), Ok(op)) = (cx.vcpu.paging(&sregs), StateOp::try_from(op)) else {
        return (StateStatus::BadCall, None);
    };
    let mut view = GuestView::new(cx.mem, paging);
    let in_lwpcb_space = cx.lwp.in_lwpcb_space(sregs.cr3);
    match op {
        StateOp::Save => {
            let Some(unit) = cx.lwp.unit_mut() else {
                return (StateStatus::NoLwp, None);
            };
            // The image has no MissedEvents: flush it (and the head) into
            // the LWPCB as SLWPCB does, when its address space is current.
            // A flush that faults is counted in the unit's flush_faults.
            if in_lwpcb_space {
                unit.flush_for_switch(&mut view);
            }
            let area = unit.save_xsave();
            match view.write(area_at, area.as_slice(), Access::SupervisorWrite) {
                Ok(()) => (StateStatus::Ok, None),
                Err(_) => (StateStatus::BadArea, None),
            }
        }
        StateOp::Restore => {
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
            match unit.restore_xsave(&mut view, &area) {
                Ok(()) => (StateStatus::Ok, None),
                Err(fault) => {
                    // Never leave the previous context's LWPCB live for
                    // the context being restored.
                    let _ = unit.write_cbaddr(0);
                    (StateStatus::Refused, Some(fault))
                }
            }
        }
        StateOp::DeclareDb => {
            cx.lwp.declare_db();
            (StateStatus::Ok, None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lwp::cpuid::{LwpFeatures, LwpProfile};
    use crate::vmm::step::StepBackend;
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
            lwp_state_call(&mut r.cx());
            assert_eq!(r.vcpu.regs.rax, status as u64, "{what}");
            assert_eq!(r.vcpu.regs.rdx, rdx, "{what}");
            if status == StateStatus::Refused {
                assert_eq!(r.vcpu.regs.rcx, UNMAPPED, "{what}: the #PF address");
                assert_eq!(r.lwp.unit().unwrap().cbaddr(), 0, "{what}: LWP is off");
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
}
