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
use serde::{Deserialize, Serialize};
use vm_memory::ByteValued;

use super::VcpuError;
use super::exit::ExitCx;
use crate::guard::{Access, GuestView};
use crate::guest_warn;
use crate::lwp::record::EventId;
use crate::vmm::vcpu::lwp_insn::{self, LwpMnemonic};
use crate::vmm::vcpu::privilege;
use crate::vmm::base::pv::{Frame, RFLAGS_TF, Reply};
use crate::vmm::vcpu::step::{self, StepBackend};

/// The stepping state a snapshot carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepState {
    /// The guest declared that its #DB handler starts with the #DB doorbell.
    pub db_declared: bool,
    /// The instruction of the stepped context that retires at the next
    /// step, while a step is in progress.
    pub step_from: Option<u64>,
    /// A port instruction of the stepped context that exited: (its address,
    /// the address after it). kvm_pvm completes it without the single-step
    /// trap, so the next trap retires two instructions.
    pub pio_step: Option<(u64, u64)>,
}

/// A vCPU's stepper.
#[derive(Debug)]
pub struct Stepper {
    backend: Option<StepBackend>,
    state: StepState,
}

impl Stepper {
    /// `backend` is the host's, when the VM offers precise events to a
    /// shim guest (`None`: no stepping).
    pub fn new(backend: Option<StepBackend>, state: StepState) -> Self {
        Stepper { backend, state }
    }

    /// What a snapshot saves.
    pub fn state(&self) -> StepState {
        self.state
    }

    /// The backend, when the VM steps at all.
    pub fn backend(&self) -> Option<StepBackend> {
        self.backend
    }

    /// True when precise events can be produced now: KVM steps by itself,
    /// or the guest declared the #DB doorbell the trap-flag backend needs.
    pub fn ready(&self) -> bool {
        match self.backend {
            Some(StepBackend::GuestDebug) => true,
            Some(StepBackend::TrapFlag) => self.state.db_declared,
            None => false,
        }
    }

    /// True when the VM offers precise events it cannot produce yet.
    pub fn withholds(&self) -> bool {
        self.backend.is_some() && !self.ready()
    }

    pub(super) fn declare_db(&mut self) {
        self.state.db_declared = true;
    }

    /// Stops stepping (a task switches out): the step origin, if a step was
    /// in progress. A pending port instruction is forgotten with it.
    pub(super) fn take(&mut self) -> Option<u64> {
        self.state.pio_step = None;
        self.state.step_from.take()
    }

    /// Resumes stepping at `origin` (a task switches in whose trap flag is
    /// still set in its saved frame); only the trap-flag backend resumes
    /// this way, the guest-debug one arms at the next exit.
    pub(super) fn resume(&mut self, origin: u64) -> bool {
        if !self.trap_flag() || !self.ready() {
            return false;
        }
        self.state.step_from = Some(origin);
        true
    }

    fn trap_flag(&self) -> bool {
        self.backend == Some(StepBackend::TrapFlag)
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lwp::cpuid::LwpProfile;
    use crate::vmm::base::pv::RFLAGS_CF;
    use crate::vmm::vcpu::doorbell::ud_doorbell;
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
}
