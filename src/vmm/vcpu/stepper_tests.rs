//! stepper.rs's tests. They set stepping up as a guest does, through the
//! #UD doorbell and the state call, so they sit above those handlers as well
//! as the stepper, and stepper.rs imports neither.

use super::stepper::*;
use kvm_bindings::kvm_debug_exit_arch;

use crate::lwp::cpuid::LwpProfile;
use crate::vmm::base::pv::RFLAGS_CF;
use crate::vmm::base::pv::RFLAGS_TF;
use crate::vmm::vcpu::doorbell::ud_doorbell;
use crate::vmm::vcpu::step::StepBackend;
use crate::vmm::vcpu::testing::*;
use vm_memory::{Bytes, GuestAddress};

const IRE: u32 = 1 << 2;
const OUT_5B: [u8; 2] = [0xe6, 0x5b];

/// A vCPU whose CPL3 context just ran LLWPCB (IRE enabled) at
/// USER_CODE through the #UD doorbell: stepping is under way from the
/// next instruction.
fn stepping(backend: StepBackend) -> Rig {
    let mut r = Rig::new(LwpProfile::Precise, Some(backend));
    r.lwp.declare_db();
    r.lwpcb(IRE);
    r.code(USER_CODE, &LLWPCB_RAX);
    r.code(USER_CODE + 5, &OUT_5B);
    r.frame(USER_CODE, USER_CS, USER_DS, 0x202);
    r.vcpu.regs.rax = LWPCB;
    ud_doorbell(&mut r.cx()).unwrap();
    assert_eq!(r.lwp.stepper.state().step_from, Some(USER_CODE + 5));
    r
}

/// What a #DB doorbell test sets up.
#[derive(Clone, Copy)]
enum Setup {
    /// The trap after the instruction at USER_CODE + 5.
    Step,
    /// The same, with no stepping in progress.
    NotStepping,
    /// Rung from CPL3.
    FromCpl3,
    /// A frame whose CS.RPL and SS.RPL differ.
    BadFrame,
    /// The LWPCB was unloaded meanwhile: the context is no longer live.
    NoLongerLive,
}

#[test]
fn db_doorbell_replies() {
    // (what, setup, steps counted, CF, TF in the frame, step origin after)
    type Case = (&'static str, Setup, u64, Option<bool>, bool, Option<u64>);
    let table: [Case; 5] = [
        (
            "a step",
            Setup::Step,
            1,
            Some(false),
            true,
            Some(USER_CODE + 7),
        ),
        (
            "no step in progress",
            Setup::NotStepping,
            0,
            Some(true),
            false,
            None,
        ),
        (
            "rung from CPL3: nothing changes",
            Setup::FromCpl3,
            0,
            None,
            false,
            Some(USER_CODE + 5),
        ),
        (
            "an impossible frame",
            Setup::BadFrame,
            0,
            Some(true),
            false,
            Some(USER_CODE + 5),
        ),
        (
            "the context left LWP",
            Setup::NoLongerLive,
            1,
            Some(false),
            false,
            None,
        ),
    ];
    for (what, setup, steps, cf, tf, origin) in table {
        let mut r = stepping(StepBackend::TrapFlag);
        let ss = match setup {
            Setup::BadFrame => KERNEL_DS,
            _ => USER_DS,
        };
        r.frame(USER_CODE + 7, USER_CS, ss, 0x202);
        match setup {
            Setup::NotStepping => r.lwp.stepper.state.step_from = None,
            Setup::FromCpl3 => r.at_cpl3(false),
            Setup::NoLongerLive => {
                r.lwp.unit_mut().unwrap().write_cbaddr(0).unwrap();
            }
            Setup::Step | Setup::BadFrame => {}
        }
        r.vcpu.regs.rflags = 0x2;
        let sets = r.vcpu.regs_set;
        db_doorbell(&mut r.cx());
        assert_eq!(r.metrics.counters().steps, steps, "{what}");
        let answered = (r.vcpu.regs_set > sets).then_some(r.vcpu.regs.rflags & RFLAGS_CF != 0);
        assert_eq!(answered, cf, "{what}");
        assert_eq!(r.read_frame().rflags & RFLAGS_TF != 0, tf, "{what}");
        assert_eq!(r.lwp.stepper.state().step_from, origin, "{what}");
    }
}

/// kvm_pvm drops the trap after a CPL3 port instruction: noted at its
/// exit (RIP already past it, as kvm_pvm reports it), the next trap
/// retires both.
#[test]
fn a_port_instruction_without_its_trap_is_counted() {
    for rip_at_exit in [USER_CODE + 5, USER_CODE + 7] {
        let mut r = stepping(StepBackend::TrapFlag);
        r.at_cpl3(false);
        r.vcpu.regs.rip = rip_at_exit;
        note_pio_step(&mut r.cx());
        assert_eq!(
            r.lwp.stepper.state().pio_step,
            Some((USER_CODE + 5, USER_CODE + 7))
        );
        r.frame(USER_CODE + 9, USER_CS, USER_DS, 0x302);
        db_doorbell(&mut r.cx());
        assert_eq!(
            r.metrics.counters().steps,
            2,
            "RIP {rip_at_exit:#x} at the exit"
        );
        assert_eq!(r.lwp.stepper.state().pio_step, None);
    }
}

#[test]
fn arming_and_debug_exits() {
    // Trap flag: an exit that finds the context live sets TF.
    let mut r = stepping(StepBackend::TrapFlag);
    r.lwp.stepper.state.step_from = None;
    r.at_cpl3(false);
    r.vcpu.regs.rip = USER_CODE + 5;
    arm(&mut r.cx()).unwrap();
    assert_ne!(r.vcpu.regs.rflags & RFLAGS_TF, 0);
    assert_eq!(r.lwp.stepper.state().step_from, Some(USER_CODE + 5));
    // Guest debug: KVM steps; a Debug exit at CPL3 counts the step, and
    // stepping stops once the context is no longer live.
    let mut r = stepping(StepBackend::GuestDebug);
    r.lwp.stepper.state.step_from = None;
    r.at_cpl3(false);
    r.vcpu.regs.rip = USER_CODE + 5;
    arm(&mut r.cx()).unwrap();
    assert_eq!(r.vcpu.single_step, Some(true));
    let exit = kvm_debug_exit_arch {
        exception: 1,
        dr6: 1 << 14,
        pc: USER_CODE + 7,
        ..Default::default()
    };
    debug_exit(&mut r.cx(), &exit).unwrap();
    assert_eq!(r.metrics.counters().steps, 1);
    r.lwp.unit_mut().unwrap().write_cbaddr(0).unwrap();
    debug_exit(&mut r.cx(), &exit).unwrap();
    assert_eq!(r.vcpu.single_step, Some(false));
}

/// A task switching out takes the stepping with it, and switching in
/// (on this vCPU or another) gives it back when its context is live.
#[test]
fn stepping_follows_the_task_across_switches() {
    use crate::vmm::vcpu::state_call::lwp_state_call;
    // (backend, image restored, origin given, RDX after switching in,
    // step origin after)
    let table = [
        (StepBackend::TrapFlag, true, true, 1, Some(USER_CODE + 5)),
        (StepBackend::TrapFlag, true, false, 0, None),
        (StepBackend::TrapFlag, false, true, 0, None),
        (StepBackend::GuestDebug, true, true, 0, None),
    ];
    for (backend, image, give, rdx, after) in table {
        let what = format!("{backend:?} image {image} give {give}");
        let mut r = stepping(backend);
        r.at_cpl0();
        r.vcpu.regs.rax = 7;
        r.vcpu.regs.rdi = AREA;
        lwp_state_call(&mut r.cx());
        let origin = r.vcpu.regs.rdx;
        assert_eq!((r.vcpu.regs.rax, origin), (0, USER_CODE + 5), "{what}");
        assert_eq!(r.lwp.unit().unwrap().cbaddr(), 0, "{what}: LWP off");
        assert_eq!(r.lwp.stepper.state().step_from, None, "{what}");
        if !image {
            r.mem.write_slice(&[0; 128], GuestAddress(AREA)).unwrap();
        }
        r.vcpu.regs.rax = 8;
        r.vcpu.regs.rsi = if give { origin } else { 0 };
        lwp_state_call(&mut r.cx());
        assert_eq!((r.vcpu.regs.rax, r.vcpu.regs.rdx), (0, rdx), "{what}");
        assert_eq!(r.lwp.stepper.state().step_from, after, "{what}");
        let cb = if image { LWPCB } else { 0 };
        assert_eq!(r.lwp.unit().unwrap().cbaddr(), cb, "{what}");
    }
}
