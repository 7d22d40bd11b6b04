//! Instructions a kernel runs at CPL0 that the host's instruction emulator
//! cannot (kvm_pvm runs guest CPL0 in KVM's emulator, which lacks them):
//! lwpvmm carries them out itself after the emulation-failure exit, as the
//! CPU would, and the guest goes on. A distribution kernel meets them on its
//! way to userspace (docs/linux-guest.md, "What lwpvmm emulates for it"):
//!
//! - LDMXCSR and STMXCSR (`kernel_fpu_begin_mask`): through the vCPU's
//!   XSAVE image; #UD without CR4.OSFXSR or with CR0.EM, #NM with CR0.TS,
//!   #GP for bits outside its MXCSR_MASK.
//! - VERR and VERW (VERW is the MDS mitigation's buffer clear): the selector
//!   is checked as the architecture says and only ZF changes; a VM has no
//!   CPU buffers of its own to clear.
//! - CMPXCHG16B (SLUB's lockless free lists): one atomic 16-byte
//!   compare-exchange on guest RAM through the guard, as a supervisor store
//!   (the CPU writes the operand back even when the comparison fails); #GP
//!   for an operand not 16-byte aligned.
//!
//! Memory operands go through the guard as supervisor accesses, with the
//! faults the CPU would raise. Anything else is not ours: the caller stops
//! the VM naming the bytes, as before.

use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind};
use kvm_bindings::{kvm_regs, kvm_segment, kvm_sregs};

use super::lwp_insn::{self, Context};
use super::ops::VcpuOps;
use super::protocol::VcpuError;
use super::segment::segment;
use crate::guard::{Access, GuestView};
use crate::lwp::fault::GuestFault;

/// RFLAGS.ZF.
const RFLAGS_ZF: u64 = 1 << 6;
/// CR0.EM: x87 and SSE instructions raise #UD.
const CR0_EM: u64 = 1 << 2;
/// CR0.TS: the first x87 or SSE instruction raises #NM.
const CR0_TS: u64 = 1 << 3;
/// CR4.OSFXSR: the OS saves SSE state; without it SSE instructions #UD.
const CR4_OSFXSR: u64 = 1 << 9;
/// The MXCSR_MASK of a processor whose FXSAVE image reports 0: every bit
/// but DAZ (bit 6) up to 15 (Intel SDM, "Guidelines for Writing to the
/// MXCSR Register").
const MXCSR_MASK_DEFAULT: u32 = 0xffbf;

/// The instructions this module carries out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelMnemonic {
    /// LDMXCSR m32.
    Ldmxcsr,
    /// STMXCSR m32.
    Stmxcsr,
    /// VERR r/m16.
    Verr,
    /// VERW r/m16.
    Verw,
    /// CMPXCHG16B m128.
    Cmpxchg16b,
}

/// What became of an instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Carried out: the registers are updated and the guest goes on at
    /// `next_rip`.
    Done {
        /// The address after the instruction.
        next_rip: u64,
        /// Which it was.
        mnemonic: KernelMnemonic,
    },
    /// The instruction raises this fault; nothing was changed.
    Fault(GuestFault),
    /// Not one of ours.
    NotOurs,
}

/// Decodes `bytes` at the CPL0 context `ctx` and carries the instruction
/// out when it is one of ours. MXCSR is read and written through `vcpu`;
/// a failing ioctl is an error.
pub fn emulate(
    view: &GuestView<'_>,
    vcpu: &mut dyn VcpuOps,
    sregs: &kvm_sregs,
    ctx: &mut Context<'_>,
    bytes: &[u8],
) -> Result<Outcome, VcpuError> {
    let Ok(mut decoder) = Decoder::try_with_ip(ctx.bitness, bytes, ctx.rip, DecoderOptions::NONE)
    else {
        return Ok(Outcome::NotOurs);
    };
    let insn = decoder.decode();
    let mnemonic = match insn.mnemonic() {
        _ if insn.is_invalid() => return Ok(Outcome::NotOurs),
        Mnemonic::Ldmxcsr => KernelMnemonic::Ldmxcsr,
        Mnemonic::Stmxcsr => KernelMnemonic::Stmxcsr,
        Mnemonic::Verr => KernelMnemonic::Verr,
        Mnemonic::Verw => KernelMnemonic::Verw,
        Mnemonic::Cmpxchg16b => KernelMnemonic::Cmpxchg16b,
        _ => return Ok(Outcome::NotOurs),
    };
    let done = match mnemonic {
        KernelMnemonic::Ldmxcsr | KernelMnemonic::Stmxcsr => {
            mxcsr(view, vcpu, sregs, ctx, &insn, mnemonic)?
        }
        KernelMnemonic::Verr | KernelMnemonic::Verw => verify(view, sregs, ctx, &insn, mnemonic),
        KernelMnemonic::Cmpxchg16b => cmpxchg16b(view, ctx, &insn),
    };
    Ok(match done {
        Ok(()) => Outcome::Done {
            next_rip: insn.next_ip(),
            mnemonic,
        },
        Err(fault) => Outcome::Fault(fault),
    })
}

/// The linear address of memory operand `op`.
fn address(ctx: &Context<'_>, insn: &Instruction, op: u32) -> Result<u64, GuestFault> {
    lwp_insn::memory_address(ctx, insn, op).ok_or(GuestFault::GeneralProtection)
}

fn mxcsr(
    view: &GuestView<'_>,
    vcpu: &mut dyn VcpuOps,
    sregs: &kvm_sregs,
    ctx: &Context<'_>,
    insn: &Instruction,
    mnemonic: KernelMnemonic,
) -> Result<Result<(), GuestFault>, VcpuError> {
    if sregs.cr0 & CR0_EM != 0 || sregs.cr4 & CR4_OSFXSR == 0 {
        return Ok(Err(GuestFault::InvalidOpcode));
    }
    if sregs.cr0 & CR0_TS != 0 {
        return Ok(Err(GuestFault::DeviceNotAvailable));
    }
    let at = match address(ctx, insn, 0) {
        Ok(at) => at,
        Err(fault) => return Ok(Err(fault)),
    };
    let (current, mask) = vcpu.mxcsr()?;
    if mnemonic == KernelMnemonic::Stmxcsr {
        let value = current;
        return Ok(view
            .write(at, &value.to_le_bytes(), Access::SupervisorWrite)
            .map_err(|e| e.fault()));
    }
    let mut raw = [0u8; 4];
    if let Err(e) = view.read(at, &mut raw, Access::SupervisorRead) {
        return Ok(Err(e.fault()));
    }
    let value = u32::from_le_bytes(raw);
    let mask = if mask == 0 { MXCSR_MASK_DEFAULT } else { mask };
    if value & !mask != 0 {
        return Ok(Err(GuestFault::GeneralProtection));
    }
    vcpu.set_mxcsr(value)?;
    Ok(Ok(()))
}

fn verify(
    view: &GuestView<'_>,
    sregs: &kvm_sregs,
    ctx: &mut Context<'_>,
    insn: &Instruction,
    mnemonic: KernelMnemonic,
) -> Result<(), GuestFault> {
    let selector = match insn.op0_kind() {
        OpKind::Register => lwp_insn::read_reg(ctx, insn.op0_register()) as u16,
        _ => {
            let mut raw = [0u8; 2];
            view.read(address(ctx, insn, 0)?, &mut raw, Access::SupervisorRead)
                .map_err(|e| e.fault())?;
            u16::from_le_bytes(raw)
        }
    };
    let cpl = sregs.ss.dpl;
    let ok = descriptor(view, sregs, selector)
        .is_some_and(|d| verifies(&d, selector, cpl, mnemonic == KernelMnemonic::Verw));
    ctx.rflags = if ok {
        ctx.rflags | RFLAGS_ZF
    } else {
        ctx.rflags & !RFLAGS_ZF
    };
    Ok(())
}

/// The descriptor `selector` names in the GDT or the loaded LDT, read as
/// supervisor memory; `None` for the null selector, one past its table's
/// limit, an LDT selector with no LDT, or a table that cannot be read.
fn descriptor(view: &GuestView<'_>, sregs: &kvm_sregs, selector: u16) -> Option<kvm_segment> {
    let index = u64::from(selector & !7);
    let (base, limit) = if selector & 4 != 0 {
        if sregs.ldt.unusable != 0 || sregs.ldt.present == 0 {
            return None;
        }
        (sregs.ldt.base, u64::from(sregs.ldt.limit))
    } else {
        if index == 0 {
            return None;
        }
        (sregs.gdt.base, u64::from(sregs.gdt.limit))
    };
    if index + 7 > limit {
        return None;
    }
    let mut raw = [0u8; 8];
    view.read(base.checked_add(index)?, &mut raw, Access::SupervisorRead)
        .ok()?;
    Some(segment(selector, u64::from_le_bytes(raw)))
}

/// Whether a code or data segment `d` may be read (VERR) or written
/// (VERW) at `cpl` through `selector`: a system descriptor never; VERW only
/// a writable data segment, VERR a data or readable code segment; a
/// conforming code segment whatever the privilege, anything else only
/// when its DPL is at least CPL and the selector's RPL.
fn verifies(d: &kvm_segment, selector: u16, cpl: u8, write: bool) -> bool {
    if d.s == 0 {
        return false;
    }
    let code = d.type_ & 8 != 0;
    // Type bit 1: readable for code, writable for data.
    let allowed = match (code, write) {
        (true, true) => false,
        (true, false) | (false, true) => d.type_ & 2 != 0,
        (false, false) => true,
    };
    let conforming = code && d.type_ & 4 != 0;
    allowed && (conforming || (d.dpl >= cpl && d.dpl >= (selector & 3) as u8))
}

fn cmpxchg16b(
    view: &GuestView<'_>,
    ctx: &mut Context<'_>,
    insn: &Instruction,
) -> Result<(), GuestFault> {
    let at = address(ctx, insn, 0)?;
    if at % 16 != 0 {
        return Err(GuestFault::GeneralProtection);
    }
    let regs: &mut kvm_regs = ctx.regs;
    let expected = u128::from(regs.rax) | (u128::from(regs.rdx) << 64);
    let new = u128::from(regs.rbx) | (u128::from(regs.rcx) << 64);
    let found = view
        .compare_exchange_u128(at, expected, new, Access::SupervisorWrite)
        .map_err(|e| e.fault())?;
    if found == expected {
        ctx.rflags |= RFLAGS_ZF;
    } else {
        ctx.regs.rax = found as u64;
        ctx.regs.rdx = (found >> 64) as u64;
        ctx.rflags &= !RFLAGS_ZF;
    }
    Ok(())
}

#[cfg(test)]
#[path = "kernel_insn_tests.rs"]
mod tests;
