//! LWP instructions the guest's CPU cannot run: behind the #UD doorbell
//! (a CPL3 instruction, or any on hosts that run CPL0 natively) and after a
//! CPL0 emulation failure (kvm_pvm's emulator), both through the same
//! `lwp_insn` emulation. Also the two other instructions kvm_pvm's emulator
//! fails on in Linux guests: FWAIT, skipped, and INT3, delivered as the #BP
//! the CPU raises. docs/pv-abi.md.

use std::sync::atomic::Ordering;

use kvm_bindings::{kvm_regs, kvm_sregs};
use vm_memory::ByteValued;

use super::context::ExitCx;
use super::emulator_gap;
use super::inject;
use super::kernel_insn::{self, KernelMnemonic};
use super::ops::MSR_KERNEL_GS_BASE;
use super::protocol::{VcpuError, VcpuStep};
use super::stepper;
use crate::guard::{Access, GuestView};
use crate::guest_warn;
use crate::lwp::fault::GuestFault;
use crate::profile::stack::UnwindStart;
use crate::vmm::base::metrics::VcpuMetrics;
use crate::vmm::base::pv::{FRAME_SIZE, Frame, Reply};
use crate::vmm::vcpu::lwp_insn::{self, Context, LwpMnemonic, NotLwp, Outcome, SegmentBases};
use crate::vmm::vcpu::privilege;

/// FWAIT's opcode.
const FWAIT: u8 = 0x9b;
/// INT3's opcode.
const INT3: u8 = 0xcc;

/// What the doorbell answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The instruction was emulated: the frame and registers are updated.
    Handled,
    /// The instruction raises this fault.
    Fault(GuestFault),
    /// Not lwpvmm's: the guest's own #UD path runs. With a reason when the
    /// doorbell was misused (it is logged, rate limited).
    NotOurs(Option<String>),
}

/// The #UD doorbell: the guest's #UD handler ran `out` as its first
/// instruction; the exception frame is at RSP and every other general
/// register holds the interrupted context.
pub fn ud_doorbell(cx: &mut ExitCx<'_>) -> Result<(), VcpuError> {
    let m = cx.metrics;
    m.ud_doorbells.fetch_add(1, Ordering::Relaxed);
    let (mut regs, sregs) = (cx.vcpu.regs(), cx.vcpu.sregs());
    let frame_at = regs.rsp;
    match behind_doorbell(cx, &mut regs, &sregs, frame_at, GsBase::Loaded) {
        Answer::Fault(fault) => {
            m.ud_faults.fetch_add(1, Ordering::Relaxed);
            m.count_denial(fault);
            inject::after_unwind(cx, regs, sregs, fault)?;
            return Ok(());
        }
        Answer::Handled => {
            m.ud_handled.fetch_add(1, Ordering::Relaxed);
            regs.rflags = Reply::Handled.apply(regs.rflags);
        }
        Answer::NotOurs(why) => {
            m.ud_not_lwp.fetch_add(1, Ordering::Relaxed);
            if let Some(why) = why {
                let id = cx.vcpu.id();
                guest_warn!(m.guest_warnings, "vCPU {id}: #UD doorbell refused: {why}");
            }
            regs.rflags = Reply::NotOurs.apply(regs.rflags);
        }
    }
    cx.vcpu.set_regs(&regs);
    Ok(())
}

/// Where the interrupted context's GS base is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GsBase {
    /// In GS: the doorbell rings before any SWAPGS.
    Loaded,
    /// In KERNEL_GS_BASE: a register call from a kernel that ran SWAPGS
    /// on entry from CPL3 (read only for a GS-relative operand).
    Swapped,
}

/// Emulates the instruction behind a doorbell or a register call, with the
/// exception frame at `frame_at`; on [`Answer::Handled`] the frame in guest
/// memory and `regs` (the interrupted context's registers) are updated.
pub fn behind_doorbell(
    cx: &mut ExitCx<'_>,
    regs: &mut kvm_regs,
    sregs: &kvm_sregs,
    frame_at: u64,
    gs: GsBase,
) -> Answer {
    if !privilege::is_kernel(sregs) {
        return Answer::NotOurs(Some(format!(
            "doorbell rung at CPL{}",
            privilege::cpl(sregs)
        )));
    }
    let paging = match cx.vcpu.paging(sregs) {
        Ok(p) => p,
        Err(e) => return Answer::NotOurs(Some(e.to_string())),
    };
    let mut view = GuestView::new(cx.mem, paging);
    let mut frame = Frame::default();
    let bad_frame = |e: &dyn std::fmt::Display| {
        Answer::NotOurs(Some(format!("exception frame at {frame_at:#x}: {e}")))
    };
    if let Err(e) = view
        .read(frame_at, frame.as_mut_slice(), Access::SupervisorRead)
        .and_then(|()| view.check(frame_at, FRAME_SIZE, Access::SupervisorWrite))
    {
        return bad_frame(&e);
    }
    let code = match privilege::frame_privilege(&view, sregs, frame.cs, frame.ss) {
        Ok(code) => code,
        Err(e) => return bad_frame(&e),
    };
    let user = code.cpl == 3;
    let (bytes, len) = match lwp_insn::fetch(&view, frame.rip, user) {
        Ok(b) => b,
        Err(fault) => return Answer::Fault(fault),
    };
    let gs_base = match gs {
        GsBase::Swapped if lwp_insn::uses_gs(&bytes[..len], code.bitness) => {
            match cx.vcpu.msr(MSR_KERNEL_GS_BASE) {
                Ok(base) => base,
                Err(e) => return Answer::NotOurs(Some(format!("KERNEL_GS_BASE: {e}"))),
            }
        }
        _ => sregs.gs.base,
    };
    // The CPU runs the handler: DS, ES and FS are the context's as it
    // loaded them, CS and SS come from the frame, GS as `gs` says.
    let mut bases = SegmentBases::loaded(sregs, code.bitness);
    bases.gs = gs_base;
    if code.bitness != 64 {
        bases.cs = code.cs_base;
        bases.ss = u16::try_from(frame.ss)
            .ok()
            .and_then(|s| privilege::load_segment(&view, sregs, s))
            .map_or(0, |s| s.base);
    }
    let tsc = cx.vcpu.guest_tsc();
    // Before the instruction: SLWPCB may write RBP.
    let unwind = UnwindStart {
        fp: regs.rbp,
        sp: frame.rsp,
        long_mode: code.bitness == 64,
    };
    let mut ctx = Context {
        regs,
        rsp: frame.rsp,
        rflags: frame.rflags,
        rip: frame.rip,
        user,
        bitness: code.bitness,
        bases,
    };
    match lwp_insn::emulate(&mut view, cx.lwp.insn_unit(), &mut ctx, &bytes[..len], tsc) {
        Outcome::Done { next_rip, mnemonic } => {
            count_mnemonic(cx.metrics, mnemonic);
            cx.lwp.note_lwpcb_space(sregs.cr3);
            if user {
                cx.lwp.note_unwind(unwind);
            }
            let mut rflags = ctx.rflags;
            stepper::across_instruction(
                cx,
                &mut view,
                mnemonic,
                (user, sregs.cr3),
                (frame.rip, next_rip),
                &mut rflags,
            );
            frame.rip = next_rip;
            frame.rsp = ctx.rsp;
            frame.rflags = rflags;
            match view.write(frame_at, frame.as_slice(), Access::SupervisorWrite) {
                Ok(()) => Answer::Handled,
                Err(e) => Answer::NotOurs(Some(format!("exception frame write-back: {e}"))),
            }
        }
        Outcome::NotLwp(_) => Answer::NotOurs(None),
        Outcome::Fault(fault) => Answer::Fault(fault),
    }
}

/// KVM's emulator (CPL0 on kvm_pvm) could not run an instruction. LWP
/// instructions are emulated here, and FWAIT is skipped: Linux runs it
/// when a process drops its FPU state, and it does nothing unless an
/// unmasked x87 exception is pending, whose #MF is then lost (a known gap,
/// docs/linux-guest.md). INT3 raises #BP as the CPU does, a trap whose frame
/// holds the address after it: Linux patches its own text with INT3
/// (`text_poke_bp`: static keys, kprobes, tracepoints), and its handler
/// finds the patch site from that address. Anything else ends the VM.
pub fn emulation_failure(cx: &mut ExitCx<'_>) -> Result<VcpuStep, VcpuError> {
    let failure = cx.vcpu.emulation_failure();
    let (mut regs, sregs) = (cx.vcpu.regs(), cx.vcpu.sregs());
    let (vcpu, rip_at, suberror) = (cx.vcpu.id(), regs.rip, failure.suberror);
    let unhandled = move |bytes: &str| VcpuError::Unhandled {
        vcpu,
        exit: format!("KVM_EXIT_INTERNAL_ERROR (suberror {suberror})"),
        rip: rip_at,
        bytes: bytes.to_owned(),
    };
    let Some((raw, len)) = failure.bytes else {
        return Err(unhandled(""));
    };
    let bytes = &raw[..len];
    if bytes[0] == FWAIT && privilege::is_kernel(&sregs) {
        cx.metrics.cpl0_fwait.fetch_add(1, Ordering::Relaxed);
        regs.rip = regs.rip.wrapping_add(1);
        cx.vcpu.set_regs(&regs);
        return Ok(VcpuStep::Continue);
    }
    if bytes[0] == INT3 && privilege::is_kernel(&sregs) {
        cx.metrics.cpl0_int3.fetch_add(1, Ordering::Relaxed);
        regs.rip = regs.rip.wrapping_add(1);
        inject::fault(cx, &regs, &sregs, GuestFault::Breakpoint)?;
        return Ok(VcpuStep::Continue);
    }
    let described = format!(
        ", emulation failed on instruction bytes {}",
        bytes
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let Ok(paging) = cx.vcpu.paging(&sregs) else {
        return Err(unhandled(&described));
    };
    let mut view = GuestView::new(cx.mem, paging);
    let tsc = cx.vcpu.guest_tsc();
    let (rsp, rflags, rip) = (regs.rsp, regs.rflags, regs.rip);
    let bitness = lwp_insn::code_bitness(sregs.cs.l, sregs.cs.db);
    if privilege::is_kernel(&sregs) {
        let mut ctx = Context {
            regs: &mut regs,
            rsp,
            rflags,
            rip,
            user: false,
            bitness,
            bases: SegmentBases::loaded(&sregs, bitness),
        };
        match kernel_insn::emulate(&view, &mut *cx.vcpu, &sregs, &mut ctx, bytes)? {
            kernel_insn::Outcome::Done { next_rip, mnemonic } => {
                let counter = match mnemonic {
                    KernelMnemonic::Ldmxcsr | KernelMnemonic::Stmxcsr => &cx.metrics.cpl0_mxcsr,
                    KernelMnemonic::Verr | KernelMnemonic::Verw => &cx.metrics.cpl0_verw,
                    KernelMnemonic::Cmpxchg16b => &cx.metrics.cpl0_cmpxchg16b,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                regs.rflags = ctx.rflags;
                regs.rip = next_rip;
                cx.vcpu.set_regs(&regs);
                return Ok(VcpuStep::Continue);
            }
            kernel_insn::Outcome::Fault(fault) => {
                inject::fault(cx, &regs, &sregs, fault)?;
                return Ok(VcpuStep::Continue);
            }
            kernel_insn::Outcome::NotOurs => {}
        }
    }
    let mut ctx = Context {
        regs: &mut regs,
        rsp,
        rflags,
        rip,
        user: privilege::is_user(&sregs),
        bitness,
        bases: SegmentBases::loaded(&sregs, bitness),
    };
    let outcome = lwp_insn::emulate(&mut view, cx.lwp.insn_unit(), &mut ctx, bytes, tsc);
    let (rsp, rflags) = (ctx.rsp, ctx.rflags);
    match outcome {
        Outcome::Done { next_rip, mnemonic } => {
            cx.metrics.cpl0_lwp.fetch_add(1, Ordering::Relaxed);
            count_mnemonic(cx.metrics, mnemonic);
            cx.lwp.note_lwpcb_space(sregs.cr3);
            regs.rsp = rsp;
            regs.rflags = rflags;
            regs.rip = next_rip;
            cx.vcpu.set_regs(&regs);
            Ok(VcpuStep::Continue)
        }
        Outcome::Fault(fault) => {
            cx.metrics.cpl0_lwp.fetch_add(1, Ordering::Relaxed);
            cx.metrics.count_denial(fault);
            inject::fault(cx, &regs, &sregs, fault)?;
            Ok(VcpuStep::Continue)
        }
        Outcome::NotLwp(NotLwp::LwpDisabled) => {
            inject::fault(cx, &regs, &sregs, GuestFault::InvalidOpcode)?;
            Ok(VcpuStep::Continue)
        }
        Outcome::NotLwp(NotLwp::OtherInstruction) => {
            let why = privilege::is_kernel(&sregs)
                .then(|| emulator_gap::known(bytes))
                .flatten()
                .map(|gap| gap.explain())
                .unwrap_or_default();
            Err(unhandled(&format!("{described}{why}")))
        }
    }
}

fn count_mnemonic(metrics: &VcpuMetrics, m: LwpMnemonic) {
    let c = match m {
        LwpMnemonic::Llwpcb => &metrics.llwpcb,
        LwpMnemonic::Slwpcb => &metrics.slwpcb,
        LwpMnemonic::Lwpins => &metrics.lwpins,
        LwpMnemonic::Lwpval => &metrics.lwpval,
    };
    c.fetch_add(1, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lwp::cpuid::LwpProfile;
    use crate::lwp::fault::{PF_FETCH, PF_USER};
    use crate::vmm::base::pv::RFLAGS_CF;
    use crate::vmm::vcpu::testing::*;

    /// What a #UD doorbell test sets up before it rings.
    #[derive(Clone, Copy)]
    enum Setup {
        /// The LWPCB loaded, then the doorbell with this frame (RIP, CS,
        /// SS) at CPL0.
        Frame(u64, u64, u64),
        /// As `Frame`, with RSP pointing where nothing is mapped.
        UnmappedFrame,
        /// Rung from CPL3, in the user or the conforming code segment.
        Cpl3(bool),
    }

    /// The reply, and what lands where.
    #[derive(Debug, PartialEq)]
    enum Want {
        /// CF clear, the frame's RIP moved past the instruction.
        Handled(u64),
        /// CF set; a warning counted or not.
        NotOurs(bool),
        /// This fault injected at the instruction, from CPL3.
        Injected(GuestFault),
    }

    fn ring(profile: LwpProfile, instructions: &[u8], rax: u64, setup: Setup) -> (Rig, Want) {
        let mut r = Rig::new(profile, None);
        r.lwpcb(0x2);
        r.code(USER_CODE, instructions);
        r.vcpu.regs.rax = LWPCB;
        if profile.caps().is_some() {
            r.frame(USER_CODE, USER_CS, USER_DS, 0x202);
            r.code(USER_CODE + 0x100, &LLWPCB_RAX);
            r.frame(USER_CODE + 0x100, USER_CS, USER_DS, 0x202);
            ud_doorbell(&mut r.cx()).unwrap();
        }
        r.vcpu.regs.rax = rax;
        r.vcpu.regs.rflags = 0x2;
        match setup {
            Setup::Frame(rip, cs, ss) => r.frame(rip, cs, ss, 0x202),
            Setup::UnmappedFrame => {
                r.frame(USER_CODE, USER_CS, USER_DS, 0x202);
                r.vcpu.regs.rsp = UNMAPPED;
            }
            Setup::Cpl3(conforming) => r.at_cpl3(conforming),
        }
        let warnings = r.metrics.counters().guest_warnings;
        let injected = r.vcpu.injected.len();
        ud_doorbell(&mut r.cx()).unwrap();
        let want = if r.vcpu.injected.len() > injected {
            Want::Injected(r.vcpu.injected.last().unwrap().2)
        } else if r.vcpu.regs.rflags & RFLAGS_CF == 0 {
            Want::Handled(r.read_frame().rip)
        } else {
            Want::NotOurs(r.metrics.counters().guest_warnings > warnings)
        };
        (r, want)
    }

    #[test]
    fn ud_doorbell_replies() {
        let user = Setup::Frame(USER_CODE, USER_CS, USER_DS);
        let nop = [0x90];
        let pf = |address, error_code| {
            Want::Injected(GuestFault::PageFault {
                address,
                error_code,
            })
        };
        // (what, profile, instruction bytes at USER_CODE, RAX, setup, want)
        type Case<'a> = (&'a str, LwpProfile, &'a [u8], u64, Setup, Want);
        let table: [Case; 12] = [
            (
                "lwpins",
                LwpProfile::Emulated,
                &LWPINS,
                7,
                user,
                Want::Handled(USER_CODE + 9),
            ),
            (
                "not an LWP instruction",
                LwpProfile::Emulated,
                &nop,
                0,
                user,
                Want::NotOurs(false),
            ),
            (
                "no LWP in the profile",
                LwpProfile::Off,
                &LWPINS,
                0,
                user,
                Want::NotOurs(false),
            ),
            (
                "from CPL3",
                LwpProfile::Emulated,
                &LWPINS,
                0,
                Setup::Cpl3(false),
                Want::NotOurs(true),
            ),
            (
                "from CPL3 in a conforming segment",
                LwpProfile::Emulated,
                &LWPINS,
                0,
                Setup::Cpl3(true),
                Want::NotOurs(true),
            ),
            (
                "frame unmapped",
                LwpProfile::Emulated,
                &LWPINS,
                0,
                Setup::UnmappedFrame,
                Want::NotOurs(true),
            ),
            (
                "frame CS.RPL 0, SS.RPL 3",
                LwpProfile::Emulated,
                &LWPINS,
                0,
                Setup::Frame(USER_CODE, KERNEL_CS, USER_DS),
                Want::NotOurs(true),
            ),
            (
                "frame: kernel CS with RPL 3",
                LwpProfile::Emulated,
                &LWPINS,
                0,
                Setup::Frame(USER_CODE, KERNEL_CS | 3, USER_DS),
                Want::NotOurs(true),
            ),
            (
                "frame: user CS with RPL 0",
                LwpProfile::Emulated,
                &LWPINS,
                0,
                Setup::Frame(USER_CODE, USER_CS & !3, KERNEL_DS),
                Want::NotOurs(true),
            ),
            (
                "llwpcb of an unmapped block faults at the instruction",
                LwpProfile::Emulated,
                &LLWPCB_RAX,
                UNMAPPED,
                user,
                pf(UNMAPPED, PF_USER),
            ),
            (
                "an instruction that cannot be fetched faults",
                LwpProfile::Emulated,
                &LWPINS,
                0,
                Setup::Frame(UNMAPPED, USER_CS, USER_DS),
                pf(UNMAPPED, PF_USER | PF_FETCH),
            ),
            (
                "a fault whose frame cannot be unwound (SS in the LDT)",
                LwpProfile::Emulated,
                &LLWPCB_RAX,
                UNMAPPED,
                Setup::Frame(USER_CODE, USER_CS, USER_DS | 4),
                Want::NotOurs(true),
            ),
        ];
        for (what, profile, bytes, rax, setup, want) in table {
            let (_, got) = ring(profile, bytes, rax, setup);
            assert_eq!(got, want, "{what}");
        }
    }

    #[test]
    fn a_handled_lwpins_stores_its_record_and_a_fault_unwinds_the_frame() {
        let (r, _) = ring(
            LwpProfile::Emulated,
            &LWPINS,
            7,
            Setup::Frame(USER_CODE, USER_CS, USER_DS),
        );
        let rec = r.record(0);
        assert_eq!(
            (rec.event_id, rec.data2, rec.instruction_address),
            (255, 7, USER_CODE)
        );
        assert_eq!(r.metrics.counters().lwpins, 1);
        let (r, _) = ring(
            LwpProfile::Emulated,
            &LLWPCB_RAX,
            UNMAPPED,
            Setup::Frame(USER_CODE, USER_CS, USER_DS),
        );
        let (regs, sregs, _) = r.vcpu.injected[0];
        assert_eq!(
            (regs.rip, regs.rsp, regs.rflags),
            (USER_CODE, USER_STACK - 0x80, 0x202)
        );
        assert_eq!(
            (sregs.cs.selector, sregs.cs.dpl, sregs.ss.selector),
            (0x23, 3, 0x1b)
        );
        assert_eq!(r.metrics.counters().ud_faults, 1);
    }

    /// A fault found while KVM has an event in flight is not injected: the
    /// frame is unwound, so the event lands at the LWP instruction, which
    /// then runs again and faults then. The exit's copy of the interrupt
    /// bitmap is never written back.
    #[test]
    fn a_fault_with_an_event_in_flight_restarts_the_instruction() {
        let mut r = Rig::new(LwpProfile::Emulated, None);
        r.code(USER_CODE, &LLWPCB_RAX);
        for (in_flight, injected, restarts) in [(true, 0, 1), (false, 1, 1)] {
            r.vcpu.regs.rax = UNMAPPED;
            r.frame(USER_CODE, USER_CS, USER_DS, 0x202);
            // A stale copy of an interrupt KVM already delivered (vector
            // 0xEC, Linux's local APIC timer): never written back.
            r.vcpu.sregs.interrupt_bitmap[3] = 1 << (0xEC - 192);
            r.vcpu.event_in_flight = in_flight;
            ud_doorbell(&mut r.cx()).unwrap();
            let unwound = (r.vcpu.regs.rip, r.vcpu.regs.rflags, r.vcpu.sregs.cs.dpl);
            assert_eq!(unwound, (USER_CODE, 0x202, 3), "in flight: {in_flight}");
            assert_eq!(r.vcpu.injected.len(), injected, "in flight: {in_flight}");
            assert_eq!(
                r.vcpu.sregs.interrupt_bitmap, [0; 4],
                "in flight: {in_flight}"
            );
            assert_eq!(r.metrics.counters().fault_restarts, restarts);
        }
    }

    #[test]
    fn emulation_failures() {
        // (what, profile, CPL0 bytes, RAX, result: Ok(RIP after) or
        // Err(text in the error), fault injected)
        type Case = (
            &'static str,
            LwpProfile,
            Vec<u8>,
            u64,
            Result<u64, &'static str>,
            Option<u8>,
        );
        let table: [Case; 10] = [
            (
                "verw, which the host's emulator lacks: carried out",
                LwpProfile::Emulated,
                vec![0x0f, 0x00, 0xe9],
                0,
                Ok(KERNEL_CODE + 3),
                None,
            ),
            (
                "ldmxcsr without CR4.OSFXSR: #UD",
                LwpProfile::Off,
                vec![0x0f, 0xae, 0x10],
                AREA,
                Ok(KERNEL_CODE),
                Some(6),
            ),
            (
                "int3: #BP with the address after it",
                LwpProfile::Emulated,
                vec![0xcc],
                0,
                Ok(KERNEL_CODE + 1),
                Some(3),
            ),
            (
                "fwait",
                LwpProfile::Emulated,
                vec![0x9b],
                0,
                Ok(KERNEL_CODE + 1),
                None,
            ),
            (
                "lwpins",
                LwpProfile::Emulated,
                LWPINS.to_vec(),
                0,
                Ok(KERNEL_CODE + 9),
                None,
            ),
            (
                "llwpcb of an unmapped block",
                LwpProfile::Emulated,
                LLWPCB_RAX.to_vec(),
                UNMAPPED,
                Ok(KERNEL_CODE),
                Some(14),
            ),
            (
                "no LWP: #UD",
                LwpProfile::Off,
                LWPINS.to_vec(),
                0,
                Ok(KERNEL_CODE),
                Some(6),
            ),
            (
                "another instruction",
                LwpProfile::Emulated,
                vec![0x0f, 0x0b],
                0,
                Err("0f 0b"),
                None,
            ),
            (
                "XRSTOR, which the emulator lacks: the cause and the fix",
                LwpProfile::Emulated,
                vec![0x48, 0x0f, 0xae, 0x2f],
                0,
                Err("48 0f ae 2f; that is XRSTOR at CPL0"),
                None,
            ),
            (
                "no bytes",
                LwpProfile::Emulated,
                vec![],
                0,
                Err("suberror 1"),
                None,
            ),
        ];
        for (what, profile, bytes, rax, want, fault) in table {
            let mut r = Rig::new(profile, None);
            r.vcpu.regs.rip = KERNEL_CODE;
            r.vcpu.regs.rax = rax;
            let mut raw = [0u8; 15];
            raw[..bytes.len()].copy_from_slice(&bytes);
            r.vcpu.failure.bytes = (!bytes.is_empty()).then_some((raw, bytes.len()));
            let got = emulation_failure(&mut r.cx());
            match (got, want) {
                (Ok(VcpuStep::Continue), Ok(rip)) => {
                    let at = r.vcpu.injected.first().map_or(r.vcpu.regs.rip, |i| i.0.rip);
                    assert_eq!(at, rip, "{what}");
                }
                (Err(e), Err(text)) => assert!(e.to_string().contains(text), "{what}: {e}"),
                (got, want) => panic!("{what}: {got:?}, want {want:?}"),
            }
            let injected = r.vcpu.injected.first().map(|i| i.2.vector());
            assert_eq!(injected, fault, "{what}");
        }
    }
}
