//! state_call.rs's tests.

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
