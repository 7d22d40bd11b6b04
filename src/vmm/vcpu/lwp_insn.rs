//! Emulation of one LWP instruction (LLWPCB, SLWPCB, LWPINS, LWPVAL) in a
//! guest context: decoding with iced-x86, operand fetch (registers, r/m32
//! memory through the guard), the LWP unit, and the results to write back.
//! Shared by the paravirtual #UD doorbell, the register call and the CPL0
//! emulation-failure path. Code is decoded with its code segment's size: in
//! compatibility mode XOP.W and the R, X and B bits are ignored and 67h
//! selects 16-bit addressing, as the CPU (and binutils) decode it.

use iced_x86::{
    Decoder, DecoderError, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind, Register,
};
use kvm_bindings::{kvm_regs, kvm_sregs};

use crate::guard::{Access, GuestView};
use crate::lwp::fault::GuestFault;
use crate::lwp::record::ProgrammedEvent;
use crate::lwp::unit::LwpUnit;
use crate::vmm::base::pv::RFLAGS_CF;

/// The longest x86 instruction.
pub const MAX_INSN_LEN: usize = 15;

/// The context an LWP instruction executes in.
pub struct Context<'a> {
    /// General registers; RSP is taken from `rsp`, not from here.
    pub regs: &'a mut kvm_regs,
    /// The context's RSP.
    pub rsp: u64,
    /// The context's RFLAGS.
    pub rflags: u64,
    /// Address of the instruction.
    pub rip: u64,
    /// True when the context runs at CPL3.
    pub user: bool,
    /// The size of its code: 64 (64-bit mode), 32 or 16 (compatibility
    /// mode).
    pub bitness: u32,
    /// Its segment bases, for memory operands.
    pub bases: SegmentBases,
}

/// The segment bases a memory operand adds. In 64-bit mode only FS and GS
/// have one; in compatibility mode every segment does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SegmentBases {
    /// ES.
    pub es: u64,
    /// CS.
    pub cs: u64,
    /// SS.
    pub ss: u64,
    /// DS.
    pub ds: u64,
    /// FS.
    pub fs: u64,
    /// GS.
    pub gs: u64,
}

impl SegmentBases {
    /// The bases the segment registers in `s` hold, for code of `bitness`
    /// (64-bit code: FS and GS only).
    pub fn loaded(s: &kvm_sregs, bitness: u32) -> Self {
        let long = SegmentBases {
            fs: s.fs.base,
            gs: s.gs.base,
            ..Default::default()
        };
        if bitness == 64 {
            return long;
        }
        SegmentBases {
            es: s.es.base,
            cs: s.cs.base,
            ss: s.ss.base,
            ds: s.ds.base,
            ..long
        }
    }
}

/// The code size of a code segment: 64 with CS.L, else 32 with CS.D, else
/// 16.
pub fn code_bitness(l: u8, db: u8) -> u32 {
    match (l, db) {
        (1, _) => 64,
        (_, 1) => 32,
        _ => 16,
    }
}

/// Why an instruction is not one the VMM emulates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotLwp {
    /// The bytes decode to another instruction (or to nothing valid).
    OtherInstruction,
    /// The VM's profile has no LWP, or the guest is a stock guest.
    LwpDisabled,
}

/// The outcome of one emulation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Done: the context continues at `next_rip` (registers, RSP and RFLAGS
    /// in the context are updated).
    Done {
        /// Address after the instruction.
        next_rip: u64,
        /// Which instruction it was.
        mnemonic: LwpMnemonic,
    },
    /// Not an LWP instruction for the VMM: the guest's own #UD applies.
    NotLwp(NotLwp),
    /// The instruction raises this fault.
    Fault(GuestFault),
}

/// The four LWP instructions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LwpMnemonic {
    /// LLWPCB.
    Llwpcb,
    /// SLWPCB.
    Slwpcb,
    /// LWPINS.
    Lwpins,
    /// LWPVAL.
    Lwpval,
}

/// A retired branch, as BRE records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Branch {
    /// Whether control went to the target.
    pub taken: bool,
    /// The target: where control went when taken, the branch's own target
    /// when not (Data2 of the record).
    pub target: u64,
}

/// Classifies the instruction at `rip` (its bytes in `bytes`) that just
/// retired, with control now at `next`: a branch or not. Jumps, calls and
/// returns (direct or indirect, conditional or not) are branches.
pub fn retired_branch(bytes: &[u8], bitness: u32, rip: u64, next: u64) -> Option<Branch> {
    let mut decoder = Decoder::try_with_ip(bitness, bytes, rip, DecoderOptions::NONE).ok()?;
    let insn = decoder.decode();
    if insn.is_invalid() {
        return None;
    }
    let taken = next != insn.next_ip();
    match insn.flow_control() {
        FlowControl::ConditionalBranch => Some(Branch {
            taken,
            target: if taken {
                next
            } else {
                insn.near_branch_target()
            },
        }),
        FlowControl::UnconditionalBranch
        | FlowControl::IndirectBranch
        | FlowControl::Call
        | FlowControl::IndirectCall
        | FlowControl::Return => Some(Branch {
            taken: true,
            target: next,
        }),
        _ => None,
    }
}

/// The length of the instruction `bytes` start with in code of `bitness`,
/// when they decode to one.
pub fn length(bytes: &[u8], bitness: u32, rip: u64) -> Option<u64> {
    let mut decoder = Decoder::try_with_ip(bitness, bytes, rip, DecoderOptions::NONE).ok()?;
    let insn = decoder.decode();
    (!insn.is_invalid()).then(|| insn.len() as u64)
}

/// Reads up to [`MAX_INSN_LEN`] instruction bytes at `rip`, stopping at the
/// first page that cannot be fetched. Fails only when not even the first
/// byte can be.
pub fn fetch(
    view: &GuestView<'_>,
    rip: u64,
    user: bool,
) -> Result<([u8; MAX_INSN_LEN], usize), GuestFault> {
    let access = if user {
        Access::UserFetch
    } else {
        Access::SupervisorFetch
    };
    let mut bytes = [0u8; MAX_INSN_LEN];
    if view.read(rip, &mut bytes, access).is_ok() {
        return Ok((bytes, MAX_INSN_LEN));
    }
    let in_page = (0x1000 - (rip & 0xfff)).min(MAX_INSN_LEN as u64) as usize;
    view.read(rip, &mut bytes[..in_page], access)
        .map_err(|e| e.fault())?;
    Ok((bytes, in_page))
}

/// True when `bytes` decode, in code of `bitness`, to an instruction with a
/// GS-relative memory operand.
pub fn uses_gs(bytes: &[u8], bitness: u32) -> bool {
    Decoder::try_with_ip(bitness, bytes, 0, DecoderOptions::NONE).is_ok_and(|mut d| {
        let insn = d.decode();
        !insn.is_invalid()
            && (0..insn.op_count()).any(|i| insn.op_kind(i) == OpKind::Memory)
            && insn.memory_segment() == Register::GS
    })
}

/// Decodes `bytes` (the first `len` are valid) and emulates the instruction
/// if it is an LWP instruction. `unit` is `None` when LWP is not offered.
pub fn emulate(
    view: &mut GuestView<'_>,
    unit: Option<&mut LwpUnit>,
    ctx: &mut Context<'_>,
    bytes: &[u8],
    tsc: u64,
) -> Outcome {
    let Ok(mut decoder) = Decoder::try_with_ip(ctx.bitness, bytes, ctx.rip, DecoderOptions::NONE)
    else {
        return Outcome::NotLwp(NotLwp::OtherInstruction);
    };
    let insn = decoder.decode();
    if insn.is_invalid() {
        if decoder.last_error() == DecoderError::NoMoreBytes && bytes.len() < MAX_INSN_LEN {
            // The instruction runs onto a page that cannot be fetched.
            let next = ctx.rip.wrapping_add(bytes.len() as u64);
            let mut b = [0u8; 1];
            let access = if ctx.user {
                Access::UserFetch
            } else {
                Access::SupervisorFetch
            };
            if let Err(e) = view.read(next, &mut b, access) {
                return Outcome::Fault(e.fault());
            }
        }
        return Outcome::NotLwp(NotLwp::OtherInstruction);
    }
    let mnemonic = match insn.mnemonic() {
        Mnemonic::Llwpcb => LwpMnemonic::Llwpcb,
        Mnemonic::Slwpcb => LwpMnemonic::Slwpcb,
        Mnemonic::Lwpins => LwpMnemonic::Lwpins,
        Mnemonic::Lwpval => LwpMnemonic::Lwpval,
        _ => return Outcome::NotLwp(NotLwp::OtherInstruction),
    };
    let Some(unit) = unit else {
        return Outcome::NotLwp(NotLwp::LwpDisabled);
    };
    match run(view, unit, ctx, &insn, mnemonic, tsc) {
        Ok(()) => Outcome::Done {
            next_rip: insn.next_ip(),
            mnemonic,
        },
        Err(fault) => Outcome::Fault(fault),
    }
}

fn run(
    view: &mut GuestView<'_>,
    unit: &mut LwpUnit,
    ctx: &mut Context<'_>,
    insn: &Instruction,
    mnemonic: LwpMnemonic,
    tsc: u64,
) -> Result<(), GuestFault> {
    match mnemonic {
        LwpMnemonic::Llwpcb => {
            let address = read_reg(ctx, insn.op_register(0));
            unit.llwpcb(view, address)
        }
        LwpMnemonic::Slwpcb => {
            let address = unit.slwpcb(view)?;
            write_reg(ctx, insn.op_register(0), address);
            Ok(())
        }
        LwpMnemonic::Lwpins | LwpMnemonic::Lwpval => {
            let ev = ProgrammedEvent {
                data2: read_reg(ctx, insn.op_register(0)),
                data1: read_rm32(view, ctx, insn)?,
                flags: insn.immediate32(),
                instruction_address: ctx.rip,
            };
            if mnemonic == LwpMnemonic::Lwpins {
                let cf = unit.lwpins(view, &ev, tsc)?;
                ctx.rflags = (ctx.rflags & !RFLAGS_CF) | u64::from(cf);
            } else {
                unit.lwpval(view, &ev, tsc)?;
            }
            Ok(())
        }
    }
}

fn read_rm32(
    view: &GuestView<'_>,
    ctx: &Context<'_>,
    insn: &Instruction,
) -> Result<u32, GuestFault> {
    if insn.op_kind(1) == OpKind::Register {
        return Ok(read_reg(ctx, insn.op_register(1)) as u32);
    }
    let address = memory_address(ctx, insn, 1).ok_or(GuestFault::GeneralProtection)?;
    let access = if ctx.user {
        Access::UserRead
    } else {
        Access::SupervisorRead
    };
    let mut b = [0u8; 4];
    view.read(address, &mut b, access).map_err(|e| e.fault())?;
    Ok(u32::from_le_bytes(b))
}

/// The linear address of `insn`'s memory operand `op` in `ctx`: segment
/// base, base, index and displacement, wrapped to 32 bits outside 64-bit
/// mode; `None` when iced-x86 cannot compute it.
pub fn memory_address(ctx: &Context<'_>, insn: &Instruction, op: u32) -> Option<u64> {
    let address = insn.virtual_address(op, 0, |reg, _, _| {
        let b = &ctx.bases;
        Some(match reg {
            Register::ES => b.es,
            Register::CS => b.cs,
            Register::SS => b.ss,
            Register::DS => b.ds,
            Register::FS => b.fs,
            Register::GS => b.gs,
            r => read_reg(ctx, r),
        })
    })?;
    // Outside 64-bit mode linear addresses are 32 bits: base + offset wraps.
    Some(if ctx.bitness == 64 {
        address
    } else {
        address & 0xffff_ffff
    })
}

fn slot<'a>(ctx: &'a mut Context<'_>, full: Register) -> Option<&'a mut u64> {
    let r = &mut *ctx.regs;
    Some(match full {
        Register::RAX => &mut r.rax,
        Register::RBX => &mut r.rbx,
        Register::RCX => &mut r.rcx,
        Register::RDX => &mut r.rdx,
        Register::RSI => &mut r.rsi,
        Register::RDI => &mut r.rdi,
        Register::RBP => &mut r.rbp,
        Register::RSP => &mut ctx.rsp,
        Register::R8 => &mut r.r8,
        Register::R9 => &mut r.r9,
        Register::R10 => &mut r.r10,
        Register::R11 => &mut r.r11,
        Register::R12 => &mut r.r12,
        Register::R13 => &mut r.r13,
        Register::R14 => &mut r.r14,
        Register::R15 => &mut r.r15,
        _ => return None,
    })
}

/// The value of a 16-, 32- or 64-bit general register (narrower reads are
/// zero-extended).
pub fn read_reg(ctx: &Context<'_>, reg: Register) -> u64 {
    let r = &*ctx.regs;
    let value = match reg.full_register() {
        Register::RAX => r.rax,
        Register::RBX => r.rbx,
        Register::RCX => r.rcx,
        Register::RDX => r.rdx,
        Register::RSI => r.rsi,
        Register::RDI => r.rdi,
        Register::RBP => r.rbp,
        Register::RSP => ctx.rsp,
        Register::R8 => r.r8,
        Register::R9 => r.r9,
        Register::R10 => r.r10,
        Register::R11 => r.r11,
        Register::R12 => r.r12,
        Register::R13 => r.r13,
        Register::R14 => r.r14,
        Register::R15 => r.r15,
        _ => 0,
    };
    match reg.size() {
        2 => value & 0xffff,
        4 => value & 0xffff_ffff,
        _ => value,
    }
}

/// Writes a 32- or 64-bit general register (a 32-bit write zero-extends).
fn write_reg(ctx: &mut Context<'_>, reg: Register, value: u64) {
    let value = if reg.size() == 4 {
        value & 0xffff_ffff
    } else {
        value
    };
    if let Some(v) = slot(ctx, reg.full_register()) {
        *v = value;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::pagetable::{PageTables, PteFlags};
    use crate::guard::{GuestMemory, Paging, PagingCaps};

    use crate::lwp::cpuid::LwpProfile;
    use crate::lwp::lwpcb::LwpcbFixed;
    use crate::lwp::record::EventRecord;
    use vm_memory::{ByteValued, Bytes, GuestAddress};

    const CB: u64 = 0x40_0000;
    const RING: u64 = 0x40_1000;
    const DATA: u64 = 0x40_3000;

    struct Rig {
        mem: GuestMemory,
        cr3: u64,
        unit: LwpUnit,
        regs: kvm_regs,
        bitness: u32,
        ds: u64,
    }

    fn rig() -> Rig {
        let mem = GuestMemory::from_ranges(&[(GuestAddress(0), 16 << 20)]).unwrap();
        let cr3 = {
            let mut pt = PageTables::new(&mem, 0x1000, 0x10_0000).unwrap();
            pt.map_range(CB, CB, 0x4000, PteFlags::USER_RW).unwrap();
            pt.cr3()
        };
        let fixed = LwpcbFixed {
            flags: 0x2,
            buffer_size_random: 4096,
            buffer_base: RING,
            ..Default::default()
        };
        mem.write_slice(fixed.as_slice(), GuestAddress(CB)).unwrap();
        mem.write_obj(0xDEAD_BEEFu32, GuestAddress(DATA + 8))
            .unwrap();
        let mut unit = LwpUnit::new(LwpProfile::Emulated.caps().unwrap());
        unit.write_cfg(0x2).unwrap();
        Rig {
            mem,
            cr3,
            unit,
            regs: kvm_regs::default(),
            bitness: 64,
            ds: 0,
        }
    }

    impl Rig {
        fn exec(&mut self, bytes: &[u8], rflags: u64) -> (Outcome, u64, u64) {
            let paging =
                Paging::from_regs(0x8001_0001, self.cr3, 0x20, 0xD00, PagingCaps::COMMON, 0)
                    .unwrap();
            let mut view = GuestView::new(&self.mem, paging);
            let mut ctx = Context {
                regs: &mut self.regs,
                rsp: 0x7000,
                rflags,
                rip: 0x1000,
                user: true,
                bitness: self.bitness,
                bases: SegmentBases {
                    ds: self.ds,
                    ..SegmentBases::default()
                },
            };
            let out = emulate(&mut view, Some(&mut self.unit), &mut ctx, bytes, 0);
            (out, ctx.rflags, ctx.rsp)
        }
        fn record(&self, slot: u64) -> EventRecord {
            self.mem.read_obj(GuestAddress(RING + 32 * slot)).unwrap()
        }
    }

    fn done(next_rip: u64, mnemonic: LwpMnemonic) -> Outcome {
        Outcome::Done { next_rip, mnemonic }
    }

    #[test]
    fn segment_bases_apply_outside_64_bit_code_only() {
        let mut s = kvm_sregs::default();
        (
            s.es.base, s.cs.base, s.ss.base, s.ds.base, s.fs.base, s.gs.base,
        ) = (1, 2, 3, 4, 5, 6);
        // (bitness, bases)
        let table = [
            (64, [0, 0, 0, 0, 5, 6]),
            (32, [1, 2, 3, 4, 5, 6]),
            (16, [1, 2, 3, 4, 5, 6]),
        ];
        for (bitness, [es, cs, ss, ds, fs, gs]) in table {
            let want = SegmentBases {
                es,
                cs,
                ss,
                ds,
                fs,
                gs,
            };
            assert_eq!(SegmentBases::loaded(&s, bitness), want, "{bitness}");
        }
    }

    #[test]
    fn compatibility_mode_decodes_with_the_code_size() {
        const HIGH: u64 = 0xABCD_0000_0000_0000;
        // (what, bytes, bitness, RAX, RBX, RDI, DS base, outcome, LWPCB
        // address after, Data1 of the stored record)
        type Case = (
            &'static str,
            &'static [u8],
            u32,
            [u64; 4],
            Outcome,
            u64,
            Option<u32>,
        );
        const LWPINS_EDI: [u8; 9] = [0x8f, 0xea, 0x78, 0x12, 0x07, 0x34, 0x12, 0, 0];
        const LWPINS_BX: [u8; 10] = [0x67, 0x8f, 0xea, 0x78, 0x12, 0x07, 0x34, 0x12, 0, 0];
        let table: [Case; 6] = [
            (
                "llwpcb eax with XOP.W1",
                &[0x8f, 0xe9, 0xf8, 0x12, 0xc0],
                32,
                [HIGH | CB, 0, 0, 0],
                done(0x1005, LwpMnemonic::Llwpcb),
                CB,
                None,
            ),
            (
                "llwpcb eax with XOP.B",
                &[0x8f, 0xc9, 0x78, 0x12, 0xc0],
                32,
                [HIGH | CB, 0, 0, 0],
                done(0x1005, LwpMnemonic::Llwpcb),
                CB,
                None,
            ),
            (
                "the same bytes in 64-bit code: llwpcb r8d",
                &[0x8f, 0xc9, 0x78, 0x12, 0xc0],
                64,
                [CB, 0, 0, 0],
                done(0x1005, LwpMnemonic::Llwpcb),
                0,
                None,
            ),
            (
                "lwpins eax, [edi]: a 32-bit address",
                &LWPINS_EDI,
                32,
                [0, 0, HIGH | (DATA + 8), 0],
                done(0x1009, LwpMnemonic::Lwpins),
                CB,
                Some(0xDEAD_BEEF),
            ),
            (
                "lwpins eax, [bx] with 67h: 16-bit addressing plus DS",
                &LWPINS_BX,
                32,
                [0, HIGH | 0x1_3008, 0, 0x40_0000],
                done(0x100a, LwpMnemonic::Lwpins),
                CB,
                Some(0xDEAD_BEEF),
            ),
            (
                "lwpins in 16-bit code: [bx] without 67h",
                &LWPINS_EDI,
                16,
                [0, HIGH | 0x3008, 0, 0x40_0000],
                done(0x1009, LwpMnemonic::Lwpins),
                CB,
                Some(0xDEAD_BEEF),
            ),
        ];
        for (what, bytes, bitness, [rax, rbx, rdi, ds], want, cb, data1) in table {
            let mut r = rig();
            r.bitness = bitness;
            if !bytes.starts_with(&[0x8f, 0xe9]) && !bytes.starts_with(&[0x8f, 0xc9]) {
                r.regs.rax = CB;
                r.bitness = 64;
                r.exec(&[0x8f, 0xe9, 0xf8, 0x12, 0xc0], 0);
                r.bitness = bitness;
            }
            (r.regs.rax, r.regs.rbx, r.regs.rdi) = (rax, rbx, rdi);
            r.ds = ds;
            assert_eq!(r.exec(bytes, 0).0, want, "{what}");
            assert_eq!(r.unit.cbaddr(), cb, "{what}");
            if let Some(d) = data1 {
                assert_eq!(r.record(0).data1, d, "{what}");
            }
        }
    }

    #[test]
    fn the_four_instructions() {
        let mut r = rig();
        r.regs.rax = CB;
        // llwpcb rax
        assert_eq!(
            r.exec(&[0x8f, 0xe9, 0xf8, 0x12, 0xc0], 0).0,
            done(0x1005, LwpMnemonic::Llwpcb)
        );
        assert_eq!(r.unit.cbaddr(), CB);
        // lwpins rax, ecx, 0x1234: Data2 = rax, Data1 = ecx
        r.regs.rcx = 0xFFFF_FFFF_0000_0011;
        let (out, rflags, _) = r.exec(&[0x8f, 0xea, 0xf8, 0x12, 0xc1, 0x34, 0x12, 0, 0], 0x1);
        assert_eq!(out, done(0x1009, LwpMnemonic::Lwpins));
        assert_eq!(rflags, 0, "CF cleared: stored");
        let rec = r.record(0);
        assert_eq!(
            (rec.event_id, rec.data1, rec.data2, rec.event_flags),
            (255, 0x11, CB, 0x1234)
        );
        assert_eq!(rec.instruction_address, 0x1000);
        // lwpval edx, dword [rip+0x2ff9]: Data1 from memory, Data2 = edx
        r.regs.rdx = 0xAAAA_BBBB_0000_0005;
        let disp = (DATA + 8 - 0x100D) as u32;
        let mut lwpval = vec![0x8f, 0xea, 0x68, 0x12, 0x0d];
        lwpval.extend_from_slice(&disp.to_le_bytes());
        lwpval.extend_from_slice(&7u32.to_le_bytes());
        assert_eq!(r.exec(&lwpval, 0).0, done(0x100D, LwpMnemonic::Lwpval));
        let rec = r.record(1);
        assert_eq!(
            (rec.event_id, rec.data1, rec.data2, rec.event_flags),
            (1, 0xDEAD_BEEF, 5, 7)
        );
        // slwpcb ebx: 32-bit destination, zero-extended
        r.regs.rbx = u64::MAX;
        assert_eq!(
            r.exec(&[0x8f, 0xe9, 0x78, 0x12, 0xcb], 0).0,
            done(0x1005, LwpMnemonic::Slwpcb)
        );
        assert_eq!(r.regs.rbx, CB);
        // slwpcb rsp writes the context's RSP
        let (_, _, rsp) = r.exec(&[0x8f, 0xe9, 0xf8, 0x12, 0xcc], 0);
        assert_eq!(rsp, CB);
    }

    #[test]
    fn faults_and_other_instructions() {
        let mut r = rig();
        // (bytes, rax, outcome); a truncated instruction whose next byte
        // cannot be fetched raises the fetch fault.
        let table: [(&[u8], u64, Outcome); 5] = [
            (&[0x0f, 0x0b], 0, Outcome::NotLwp(NotLwp::OtherInstruction)),
            (
                &[0x8f, 0xe9],
                0,
                Outcome::Fault(GuestFault::PageFault {
                    address: 0x1002,
                    error_code: 0x14,
                }),
            ),
            (&[0xcd, 0x80], 0, Outcome::NotLwp(NotLwp::OtherInstruction)),
            (
                &[0x8f, 0xe9, 0xf8, 0x12, 0xc0],
                0x50_0000,
                Outcome::Fault(GuestFault::PageFault {
                    address: 0x50_0000,
                    error_code: 4,
                }),
            ),
            (
                &[0x8f, 0xe9, 0xf8, 0x12, 0xc0],
                0x8000_0000_0000_0000,
                Outcome::Fault(GuestFault::GeneralProtection),
            ),
        ];
        for (bytes, rax, want) in table {
            r.regs.rax = rax;
            assert_eq!(r.exec(bytes, 0).0, want, "{bytes:x?}");
        }
        assert_eq!(r.unit.cbaddr(), 0);
        // A memory operand that is not mapped faults like the instruction would.
        let (out, _, _) = r.exec(
            &[
                0x8f, 0xea, 0x68, 0x12, 0x0c, 0x25, 0, 0, 0x60, 0, 7, 0, 0, 0,
            ],
            0,
        );
        assert_eq!(
            out,
            Outcome::Fault(GuestFault::PageFault {
                address: 0x60_0000,
                error_code: 4
            })
        );
    }

    #[test]
    fn branches_are_classified() {
        // (bytes at 0x1000, next RIP, expected)
        let table: [(&[u8], u64, Option<Branch>); 6] = [
            (
                &[0x75, 0xfc],
                0xffe,
                Some(Branch {
                    taken: true,
                    target: 0xffe,
                }),
            ),
            (
                &[0x75, 0xfc],
                0x1002,
                Some(Branch {
                    taken: false,
                    target: 0xffe,
                }),
            ),
            (
                &[0xeb, 0x10],
                0x1012,
                Some(Branch {
                    taken: true,
                    target: 0x1012,
                }),
            ),
            (
                &[0xff, 0xe0],
                0x5000,
                Some(Branch {
                    taken: true,
                    target: 0x5000,
                }),
            ),
            (
                &[0xc3],
                0x7777,
                Some(Branch {
                    taken: true,
                    target: 0x7777,
                }),
            ),
            (&[0xff, 0xc9], 0x1002, None),
        ];
        for (bytes, next, want) in table {
            assert_eq!(retired_branch(bytes, 64, 0x1000, next), want, "{bytes:x?}");
        }
        // 40h is INC EAX in 32-bit code, a REX prefix in 64-bit code.
        let inc_then_jmp = [0x40, 0xeb, 0xfe];
        assert_eq!(retired_branch(&inc_then_jmp, 32, 0x1000, 0x1001), None);
        assert!(retired_branch(&inc_then_jmp, 64, 0x1000, 0x1001).is_some());
        assert_eq!(length(&inc_then_jmp, 32, 0x1000), Some(1));
        assert_eq!(length(&inc_then_jmp, 64, 0x1000), Some(3));
    }

    #[test]
    fn no_unit_means_not_lwp() {
        let mut r = rig();
        let paging =
            Paging::from_regs(0x8001_0001, r.cr3, 0x20, 0xD00, PagingCaps::COMMON, 0).unwrap();
        let mut view = GuestView::new(&r.mem, paging);
        let mut ctx = Context {
            regs: &mut r.regs,
            rsp: 0,
            rflags: 0,
            rip: 0,
            user: true,
            bitness: 64,
            bases: SegmentBases::default(),
        };
        let out = emulate(
            &mut view,
            None,
            &mut ctx,
            &[0x8f, 0xe9, 0xf8, 0x12, 0xc8],
            0,
        );
        assert_eq!(out, Outcome::NotLwp(NotLwp::LwpDisabled));
    }
}
