//! kvm_pvm's SYSCALL quirk, and the rule that completes such a SYSCALL.
//!
//! On kvm_pvm a CPL3 SYSCALL updates RCX, R11, RIP and RFLAGS as SYSCALL
//! says but stays at CPL3, so the fetch at LSTAR raises a user-mode #PF
//! that the guest kernel's IDT takes: an unmodified Linux kills the
//! process. lwpvmm stops the vCPU at the kernel's #PF entry (a KVM
//! guest-debug hardware breakpoint on the handler IDT vector 14 names) and,
//! when the fault is such a SYSCALL's, rewinds the exception and enters
//! LSTAR at CPL0 as the CPU should have (`pf_entry.rs` does the KVM side).
//!
//! The rule is patch 0001's, which the red team held to: the frame is a
//! user-mode instruction fetch fault at LSTAR, and the two bytes before
//! the return address SYSCALL left in RCX are a SYSCALL (`0f 05`) the
//! process can read. A process may also jump to LSTAR itself with any R11,
//! so the flags it gets back are only R11's user-changeable bits, as
//! sigreturn allows (IOPL, VIF, VIP and NT stay clear).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use iced_x86::{Decoder, DecoderOptions, Mnemonic};
use kvm_bindings::kvm_regs;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::lwp::fault::{PF_FETCH, PF_USER};

/// RFLAGS bits.
const FLAGS_FIXED: u64 = 1 << 1;
const FLAGS_IF: u64 = 1 << 9;
const FLAGS_RF: u64 = 1 << 16;
/// What a process may set in its own flags (Linux's FIX_EFLAGS on x86-64:
/// CF, PF, AF, ZF, SF, TF, DF, OF, RF, AC).
const FLAGS_USER: u64 = 0x1 | 0x4 | 0x10 | 0x40 | 0x80 | 0x100 | 0x400 | 0x800 | FLAGS_RF | 1 << 18;
/// SYSCALL's opcode.
pub const SYSCALL: [u8; 2] = [0x0f, 0x05];

/// Where the guest kernel takes page faults and system calls, read once
/// it has set them up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyscallEntry {
    /// The #PF handler (IDT vector 14's gate).
    pub pf_entry: u64,
    /// LSTAR: the 64-bit SYSCALL entry.
    pub lstar: u64,
    /// SFMASK: the flags SYSCALL clears.
    pub fmask: u64,
    /// The code selector SYSCALL loads (STAR[47:32]).
    pub kernel_cs: u16,
}

/// What every vCPU of a VM with the fixup on shares: the entry the first
/// vCPU to see it read, and an event that asks the control thread to kick
/// the others (a vCPU halted in the guest has no exit of its own).
#[derive(Debug)]
pub struct SyscallFixup {
    entry: OnceLock<SyscallEntry>,
    /// Set when a vCPU met a #PF handler it cannot step past.
    given_up: AtomicBool,
    /// Written when the entry is read.
    pub armed: EventFd,
}

impl SyscallFixup {
    /// A fixup with no entry read yet.
    pub fn new() -> std::io::Result<Self> {
        Ok(SyscallFixup {
            entry: OnceLock::new(),
            given_up: AtomicBool::new(false),
            armed: EventFd::new(EFD_NONBLOCK)?,
        })
    }

    /// Ends the fixup for every vCPU.
    pub fn give_up(&self) {
        self.given_up.store(true, Ordering::Release);
    }

    /// Whether a vCPU ended it.
    pub fn given_up(&self) -> bool {
        self.given_up.load(Ordering::Acquire)
    }

    /// The entry, once read.
    pub fn entry(&self) -> Option<SyscallEntry> {
        self.entry.get().copied()
    }

    /// Records the entry (the first vCPU's wins: the kernel sets the same on
    /// every CPU) and asks for the other vCPUs to be kicked.
    pub fn publish(&self, entry: SyscallEntry) -> SyscallEntry {
        let mut first = false;
        let kept = *self.entry.get_or_init(|| {
            first = true;
            entry
        });
        if first {
            let _ = self.armed.write(1);
        }
        kept
    }
}

/// The exception frame a #PF from CPL3 pushed: error code, RIP, CS,
/// RFLAGS, RSP, SS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PfFrame {
    pub error: u64,
    pub rip: u64,
    pub cs: u64,
    pub rflags: u64,
    pub rsp: u64,
    pub ss: u64,
}

impl PfFrame {
    /// The frame's size in bytes.
    pub const SIZE: usize = 48;

    /// The frame from its bytes, lowest address first.
    pub fn from_bytes(raw: &[u8; Self::SIZE]) -> Self {
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&raw[i * 8..i * 8 + 8]);
            u64::from_le_bytes(w)
        };
        PfFrame {
            error: word(0),
            rip: word(1),
            cs: word(2),
            rflags: word(3),
            rsp: word(4),
            ss: word(5),
        }
    }

    /// Whether this fault can be the quirk's: a user-mode instruction
    /// fetch at LSTAR. The bytes before RCX decide the rest.
    pub fn is_fetch_at(&self, lstar: u64) -> bool {
        let user_fetch = u64::from(PF_USER | PF_FETCH);
        self.cs & 3 == 3 && self.rip == lstar && self.error & user_fetch == user_fetch
    }
}

/// The registers a completed SYSCALL leaves: `regs` are the vCPU's at the
/// #PF entry (the process's general registers, the kernel's RIP and RSP),
/// `frame` the fault's frame, `before_rcx` the two bytes the process can
/// read before RCX (None when it cannot). None when the fault is not a
/// SYSCALL's: the kernel then takes it as the fault it is.
pub fn complete(
    entry: &SyscallEntry,
    regs: &kvm_regs,
    cs: u16,
    frame: &PfFrame,
    before_rcx: Option<[u8; 2]>,
) -> Option<kvm_regs> {
    if !frame.is_fetch_at(entry.lstar) || before_rcx != Some(SYSCALL) {
        return None;
    }
    // The exception loaded the IDT gate's selector; SYSCALL loads STAR's.
    // Linux makes them one; a kernel that does not is left to its fault.
    if cs & !3 != entry.kernel_cs & !3 {
        return None;
    }
    let user_flags = (regs.r11 & FLAGS_USER) | FLAGS_FIXED | FLAGS_IF;
    Some(kvm_regs {
        rip: entry.lstar,
        rsp: frame.rsp,
        r11: user_flags,
        rflags: (user_flags & !entry.fmask & !FLAGS_RF) | FLAGS_FIXED,
        ..*regs
    })
}

/// The registers after the handler's first instruction, `bytes`, when
/// lwpvmm can carry it out itself: at a breakpoint that was not the
/// quirk's, the fault goes on past it. RF cannot do that here: kvm_pvm's
/// emulator stops at a guest-debug breakpoint whatever RF says (measured:
/// the vCPU stopped at the same NOP for minutes). Linux's handlers begin
/// with ENDBR64 (a NOP without CET's tracking, CR4.CET clear), CLAC or the
/// NOPs that replace it, and CLD; None for anything else.
pub fn skip_first(regs: &kvm_regs, cr4: u64, bytes: &[u8]) -> Option<kvm_regs> {
    const CR4_CET: u64 = 1 << 23;
    const FLAGS_DF: u64 = 1 << 10;
    const FLAGS_AC: u64 = 1 << 18;
    let mut decoder = Decoder::try_with_ip(64, bytes, regs.rip, DecoderOptions::NONE).ok()?;
    let insn = decoder.decode();
    if insn.is_invalid() {
        return None;
    }
    let cleared = match insn.mnemonic() {
        Mnemonic::Nop => 0,
        Mnemonic::Endbr64 if cr4 & CR4_CET == 0 => 0,
        Mnemonic::Clac => FLAGS_AC,
        Mnemonic::Cld => FLAGS_DF,
        _ => return None,
    };
    Some(kvm_regs {
        rip: insn.next_ip(),
        rflags: regs.rflags & !cleared,
        ..*regs
    })
}

/// The handler an IDT gate of 64-bit mode names: offset bits 0-15 in
/// bytes 0-1, 16-31 in bytes 6-7, 32-63 in bytes 8-11. None for a gate
/// that is not present.
pub fn gate_target(gate: &[u8; 16]) -> Option<u64> {
    let present = gate[5] & 0x80 != 0;
    let low = u64::from(u16::from_le_bytes([gate[0], gate[1]]));
    let mid = u64::from(u16::from_le_bytes([gate[6], gate[7]]));
    let high = u64::from(u32::from_le_bytes([gate[8], gate[9], gate[10], gate[11]]));
    present.then_some(low | mid << 16 | high << 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LSTAR: u64 = 0xffff_ffff_8160_0040;
    const PF_ENTRY: u64 = 0xffff_ffff_8160_0b20;
    const ENTRY: SyscallEntry = SyscallEntry {
        pf_entry: PF_ENTRY,
        lstar: LSTAR,
        // Linux's: TF, DF, IF, IOPL, NT, AC.
        fmask: 0x47700,
        kernel_cs: 0x10,
    };
    /// The frame the quirk leaves (logged from a real boot: error 0x15,
    /// flags 0x10002 once SYSCALL masked them).
    const FRAME: PfFrame = PfFrame {
        error: 0x15,
        rip: LSTAR,
        cs: 0x33,
        rflags: 0x10002,
        rsp: 0x7ffd_0000_1000,
        ss: 0x2b,
    };

    fn regs() -> kvm_regs {
        kvm_regs {
            rax: 39,
            rcx: 0x40_1187,
            r11: 0x246,
            rip: PF_ENTRY,
            rsp: 0xffff_c900_0000_bf58,
            rflags: 0x2,
            ..Default::default()
        }
    }

    #[test]
    fn a_syscalls_fault_becomes_the_syscall_and_nothing_else_does() {
        let with = |f: fn(&mut PfFrame)| {
            let mut frame = FRAME;
            f(&mut frame);
            frame
        };
        // (case, frame, bytes before RCX, kernel CS at the entry, completed)
        type Case = (&'static str, PfFrame, Option<[u8; 2]>, u16, bool);
        let table: [Case; 9] = [
            ("the quirk's fault", FRAME, Some(SYSCALL), 0x10, true),
            (
                "RCX after another instruction",
                FRAME,
                Some([0x0f, 0x34]),
                0x10,
                false,
            ),
            ("RCX the process cannot read", FRAME, None, 0x10, false),
            (
                "a kernel-mode fault",
                with(|f| f.cs = 0x10),
                Some(SYSCALL),
                0x10,
                false,
            ),
            (
                "another address",
                with(|f| f.rip = LSTAR + 1),
                Some(SYSCALL),
                0x10,
                false,
            ),
            (
                "a data fault",
                with(|f| f.error = 0x5),
                Some(SYSCALL),
                0x10,
                false,
            ),
            (
                "a supervisor fetch",
                with(|f| f.error = 0x11),
                Some(SYSCALL),
                0x10,
                false,
            ),
            (
                "a gate selector unlike STAR's",
                FRAME,
                Some(SYSCALL),
                0x08,
                false,
            ),
            (
                "a not-present fetch",
                with(|f| f.error = 0x14),
                Some(SYSCALL),
                0x10,
                true,
            ),
        ];
        for (case, frame, bytes, cs, completed) in table {
            let got = complete(&ENTRY, &regs(), cs, &frame, bytes);
            assert_eq!(got.is_some(), completed, "{case}");
        }
    }

    #[test]
    fn the_completed_syscall_enters_lstar_on_the_process_stack_with_its_registers() {
        let got = complete(&ENTRY, &regs(), 0x10, &FRAME, Some(SYSCALL)).unwrap();
        assert_eq!(got.rip, LSTAR);
        assert_eq!(got.rsp, FRAME.rsp, "SYSCALL keeps the process's stack");
        assert_eq!((got.rax, got.rcx), (39, 0x40_1187));
        assert_eq!(got.r11, 0x246);
        assert_eq!(got.rflags, 0x46, "SFMASK cleared IF; RF clear");
    }

    #[test]
    fn flags_the_process_may_not_set_never_reach_the_kernel_or_come_back() {
        // (R11 as the process left it, R11 the kernel returns, RFLAGS at LSTAR)
        let table = [
            (0x246, 0x246, 0x46),
            // IOPL 3, NT, VIF, VIP, VM: dropped; IF always on.
            (0x1a7002, 0x202, 0x2),
            // ID (bit 21): not among what sigreturn restores.
            (0x200202, 0x202, 0x2),
            // TF and AC: the process may set them; SYSCALL masks them.
            (0x40302, 0x40302, 0x2),
            // RF: restored on return, never set at the entry.
            (0x10246, 0x10246, 0x46),
        ];
        for (r11, want_r11, want_flags) in table {
            let regs = kvm_regs { r11, ..regs() };
            let got = complete(&ENTRY, &regs, 0x10, &FRAME, Some(SYSCALL)).unwrap();
            assert_eq!(
                (got.r11, got.rflags),
                (want_r11, want_flags),
                "R11 {r11:#x}"
            );
        }
    }

    #[test]
    fn the_handlers_first_instruction_is_carried_out_when_it_is_linuxs() {
        let at = |rflags| kvm_regs { rflags, ..regs() };
        // (instruction, CR4, RFLAGS before, (RIP advance, RFLAGS after))
        type Case = (&'static [u8], u64, u64, Option<(u64, u64)>);
        let table: [Case; 9] = [
            (&[0x90], 0, 0x2, Some((1, 0x2))),
            (&[0x0f, 0x1f, 0x00], 0, 0x2, Some((3, 0x2))),
            (
                &[0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00],
                0,
                0x2,
                Some((6, 0x2)),
            ),
            (&[0xf3, 0x0f, 0x1e, 0xfa], 0, 0x2, Some((4, 0x2))),
            (&[0xf3, 0x0f, 0x1e, 0xfa], 1 << 23, 0x2, None),
            (&[0x0f, 0x01, 0xca], 0, 0x40002, Some((3, 0x2))),
            (&[0xfc], 0, 0x402, Some((1, 0x2))),
            (&[0xe8, 0x17, 0x09, 0x00, 0x00], 0, 0x2, None),
            (&[0x0f], 0, 0x2, None),
        ];
        for (bytes, cr4, rflags, want) in table {
            let got = skip_first(&at(rflags), cr4, bytes);
            let want = want.map(|(len, rflags)| kvm_regs {
                rip: PF_ENTRY + len,
                rflags,
                ..regs()
            });
            assert_eq!(got, want, "{bytes:x?}");
        }
    }

    #[test]
    fn gates_name_their_handler_when_present() {
        let mut gate = [0u8; 16];
        gate[0..2].copy_from_slice(&0x0b20u16.to_le_bytes());
        gate[2..4].copy_from_slice(&0x10u16.to_le_bytes());
        gate[5] = 0x8e;
        gate[6..8].copy_from_slice(&0x8160u16.to_le_bytes());
        gate[8..12].copy_from_slice(&0xffff_ffffu32.to_le_bytes());
        assert_eq!(gate_target(&gate), Some(PF_ENTRY));
        gate[5] = 0x0e;
        assert_eq!(gate_target(&gate), None);
    }

    #[test]
    fn the_first_entry_published_is_kept_and_arms_once() {
        let fixup = SyscallFixup::new().unwrap();
        assert_eq!(fixup.entry(), None);
        assert_eq!(fixup.publish(ENTRY), ENTRY);
        let other = SyscallEntry { lstar: 1, ..ENTRY };
        assert_eq!(fixup.publish(other), ENTRY);
        assert_eq!(fixup.entry(), Some(ENTRY));
        assert_eq!(fixup.armed.read().unwrap(), 1);
        assert!(fixup.armed.read().is_err(), "armed once");
    }
}
