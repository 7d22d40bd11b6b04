//! The CPL0 instructions lwpvmm carries out, through the `VcpuOps` seam
//! over real guest memory and page tables (crate::vmm::vcpu::testing):
//! each one's effect and each fault it raises.

use vm_memory::{Bytes, GuestAddress};

use super::*;
use crate::lwp::cpuid::LwpProfile;
use crate::vmm::vcpu::lwp_insn::SegmentBases;
use crate::vmm::vcpu::testing::*;

const LDMXCSR_RAX: &[u8] = &[0x0f, 0xae, 0x10];
const STMXCSR_RAX: &[u8] = &[0x0f, 0xae, 0x18];
const VERW_MEM_RAX: &[u8] = &[0x0f, 0x00, 0x28];
const VERW_CX: &[u8] = &[0x0f, 0x00, 0xe9];
const VERR_CX: &[u8] = &[0x0f, 0x00, 0xe1];
const LOCK_CMPXCHG16B_RDI: &[u8] = &[0xf0, 0x48, 0x0f, 0xc7, 0x0f];

/// What the rig found after the instruction.
struct After<'a> {
    rig: &'a Rig,
    regs: kvm_regs,
    rflags: u64,
}

impl After<'_> {
    fn zf(&self) -> bool {
        self.rflags & RFLAGS_ZF != 0
    }

    fn u128_at(&self, at: u64) -> u128 {
        self.rig.mem.read_obj(GuestAddress(at)).unwrap()
    }
}

/// The outcome wanted: done (the bytes' length on), a fault's vector, or
/// not ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    Done,
    Fault(u8),
    NotOurs,
}

const OLD: u128 = 0x1111_2222_3333_4444_5555_6666_7777_8888;
const NEW: u128 = 0xaaaa_bbbb_cccc_dddd_eeee_ffff_0000_9999;

fn cmpxchg_regs(r: &mut Rig, at: u64, expected: u128) {
    r.vcpu.regs.rdi = at;
    r.vcpu.regs.rax = expected as u64;
    r.vcpu.regs.rdx = (expected >> 64) as u64;
    r.vcpu.regs.rbx = NEW as u64;
    r.vcpu.regs.rcx = (NEW >> 64) as u64;
    r.mem.write_obj(OLD, GuestAddress(AREA)).unwrap();
}

/// Runs `bytes` at CPL0 in 64-bit code at [`KERNEL_CODE`] on `r`'s vCPU
/// with `rflags`: the outcome, and the registers and RFLAGS it left.
fn run(r: &mut Rig, bytes: &[u8], rflags: u64) -> (Outcome, kvm_regs, u64) {
    let sregs = r.vcpu.sregs;
    let mut regs = r.vcpu.regs;
    let view = GuestView::new(&r.mem, r.vcpu.paging(&sregs).unwrap());
    let mut ctx = Context {
        regs: &mut regs,
        rsp: FRAME_AT,
        rflags,
        rip: KERNEL_CODE,
        user: false,
        bitness: 64,
        bases: SegmentBases::default(),
    };
    let got = emulate(&view, &mut r.vcpu, &sregs, &mut ctx, bytes).unwrap();
    let rflags = ctx.rflags;
    (got, regs, rflags)
}

type Setup = fn(&mut Rig);
type Check = fn(&After<'_>) -> bool;

#[test]
fn each_instruction_and_its_faults() {
    // (what, bytes, setup, outcome, a check of what it left); every case
    // starts at CPL0 with CR4.OSFXSR, ZF clear and CF set.
    let table: [(&str, &[u8], Setup, Want, Check); 25] = [
        (
            "ldmxcsr loads MXCSR",
            LDMXCSR_RAX,
            |r| {
                r.vcpu.regs.rax = AREA;
                r.mem.write_obj(0x1fc0u32, GuestAddress(AREA)).unwrap();
            },
            Want::Done,
            |a| a.rig.vcpu.mxcsr == 0x1fc0,
        ),
        (
            "ldmxcsr of a reserved bit: #GP, MXCSR kept",
            LDMXCSR_RAX,
            |r| {
                r.vcpu.regs.rax = AREA;
                r.mem.write_obj(0x1_1f80u32, GuestAddress(AREA)).unwrap();
            },
            Want::Fault(13),
            |a| a.rig.vcpu.mxcsr == 0x1f80,
        ),
        (
            "ldmxcsr without CR4.OSFXSR: #UD",
            LDMXCSR_RAX,
            |r| {
                r.vcpu.regs.rax = AREA;
                r.vcpu.sregs.cr4 &= !CR4_OSFXSR;
            },
            Want::Fault(6),
            |_| true,
        ),
        (
            "ldmxcsr with CR0.EM: #UD",
            LDMXCSR_RAX,
            |r| {
                r.vcpu.regs.rax = AREA;
                r.vcpu.sregs.cr0 |= CR0_EM;
            },
            Want::Fault(6),
            |_| true,
        ),
        (
            "ldmxcsr with CR0.TS: #NM",
            LDMXCSR_RAX,
            |r| {
                r.vcpu.regs.rax = AREA;
                r.vcpu.sregs.cr0 |= CR0_TS;
            },
            Want::Fault(7),
            |_| true,
        ),
        (
            "ldmxcsr from an unmapped page: #PF",
            LDMXCSR_RAX,
            |r| r.vcpu.regs.rax = UNMAPPED,
            Want::Fault(14),
            |a| a.rig.vcpu.mxcsr == 0x1f80,
        ),
        (
            "stmxcsr stores MXCSR",
            STMXCSR_RAX,
            |r| {
                r.vcpu.regs.rax = AREA + 4;
                r.vcpu.mxcsr = 0x1f9f;
            },
            Want::Done,
            |a| a.rig.mem.read_obj::<u32>(GuestAddress(AREA + 4)).unwrap() == 0x1f9f,
        ),
        (
            "stmxcsr to a read-only page (CR0.WP): #PF",
            STMXCSR_RAX,
            |r| r.vcpu.regs.rax = READ_ONLY,
            Want::Fault(14),
            |_| true,
        ),
        (
            "verw of the kernel's data segment: ZF set, CF kept",
            VERW_CX,
            |r| r.vcpu.regs.rcx = KERNEL_DS,
            Want::Done,
            |a| a.zf() && a.rflags & 1 == 1,
        ),
        (
            "verw of a code segment: ZF clear",
            VERW_CX,
            |r| r.vcpu.regs.rcx = KERNEL_CS,
            Want::Done,
            |a| !a.zf(),
        ),
        (
            "verr of readable code: ZF set",
            VERR_CX,
            |r| r.vcpu.regs.rcx = KERNEL_CS,
            Want::Done,
            |a| a.zf(),
        ),
        (
            "verr of a data segment: ZF set",
            VERR_CX,
            |r| r.vcpu.regs.rcx = KERNEL_DS,
            Want::Done,
            |a| a.zf(),
        ),
        (
            "verw of the null selector: ZF clear",
            VERW_CX,
            |r| r.vcpu.regs.rcx = 0,
            Want::Done,
            |a| !a.zf(),
        ),
        (
            "verw past the GDT's limit: ZF clear",
            VERW_CX,
            |r| r.vcpu.regs.rcx = 0x100,
            Want::Done,
            |a| !a.zf(),
        ),
        (
            "verw of an empty descriptor (a system type): ZF clear",
            VERW_CX,
            |r| r.vcpu.regs.rcx = 0x48,
            Want::Done,
            |a| !a.zf(),
        ),
        (
            "verw of user data at CPL0: ZF set",
            VERW_CX,
            |r| r.vcpu.regs.rcx = USER_DS,
            Want::Done,
            |a| a.zf(),
        ),
        (
            "verw of kernel data with RPL 3: ZF clear",
            VERW_CX,
            |r| r.vcpu.regs.rcx = KERNEL_DS | 3,
            Want::Done,
            |a| !a.zf(),
        ),
        (
            "verw of an LDT selector without an LDT: ZF clear",
            VERW_CX,
            |r| r.vcpu.regs.rcx = KERNEL_DS | 4,
            Want::Done,
            |a| !a.zf(),
        ),
        (
            "verw of a selector in memory, as Linux's buffer clear",
            VERW_MEM_RAX,
            |r| {
                r.vcpu.regs.rax = AREA;
                r.mem
                    .write_obj(KERNEL_DS as u16, GuestAddress(AREA))
                    .unwrap();
            },
            Want::Done,
            |a| a.zf(),
        ),
        (
            "verw of a selector on an unmapped page: #PF",
            VERW_MEM_RAX,
            |r| r.vcpu.regs.rax = UNMAPPED,
            Want::Fault(14),
            |_| true,
        ),
        (
            "cmpxchg16b that matches: ZF set, the new value stored",
            LOCK_CMPXCHG16B_RDI,
            |r| cmpxchg_regs(r, AREA, OLD),
            Want::Done,
            |a| a.zf() && a.u128_at(AREA) == NEW,
        ),
        (
            "cmpxchg16b that does not: ZF clear, RDX:RAX loaded, memory kept",
            LOCK_CMPXCHG16B_RDI,
            |r| cmpxchg_regs(r, AREA, 5),
            Want::Done,
            |a| {
                !a.zf()
                    && a.u128_at(AREA) == OLD
                    && (a.regs.rax, a.regs.rdx) == (OLD as u64, (OLD >> 64) as u64)
            },
        ),
        (
            "cmpxchg16b of a misaligned operand: #GP, nothing changed",
            LOCK_CMPXCHG16B_RDI,
            |r| cmpxchg_regs(r, AREA + 8, OLD),
            Want::Fault(13),
            |a| a.u128_at(AREA) == OLD && a.regs.rax == OLD as u64,
        ),
        (
            "cmpxchg16b on a read-only page: #PF even when it would not store",
            LOCK_CMPXCHG16B_RDI,
            |r| cmpxchg_regs(r, READ_ONLY, 5),
            Want::Fault(14),
            |a| a.regs.rax == 5,
        ),
        (
            "another instruction (ud2)",
            &[0x0f, 0x0b],
            |_| {},
            Want::NotOurs,
            |_| true,
        ),
    ];
    for (what, bytes, setup, want, check) in table {
        let mut r = Rig::new(LwpProfile::Off, None);
        r.vcpu.regs.rip = KERNEL_CODE;
        r.vcpu.regs.rflags = 0x3;
        r.vcpu.sregs.cr4 |= CR4_OSFXSR;
        setup(&mut r);
        let (got, regs, rflags) = run(&mut r, bytes, 0x3);
        let outcome = match got {
            Outcome::Done { next_rip, .. } => {
                assert_eq!(next_rip, KERNEL_CODE + bytes.len() as u64, "{what}");
                Want::Done
            }
            Outcome::Fault(f) => Want::Fault(f.vector()),
            Outcome::NotOurs => Want::NotOurs,
        };
        assert_eq!(outcome, want, "{what}");
        let after = After {
            rig: &r,
            regs,
            rflags,
        };
        assert!(check(&after), "{what}: rflags {rflags:#x}, regs {regs:x?}");
    }
}

#[test]
fn a_faulting_or_foreign_instruction_changes_no_register() {
    for bytes in [LDMXCSR_RAX, LOCK_CMPXCHG16B_RDI, &[0x0f, 0x0b][..]] {
        let mut r = Rig::new(LwpProfile::Off, None);
        r.vcpu.regs.rax = UNMAPPED;
        r.vcpu.regs.rdi = UNMAPPED;
        let before = r.vcpu.regs;
        let (got, regs, rflags) = run(&mut r, bytes, 0x2);
        assert!(!matches!(got, Outcome::Done { .. }), "{bytes:x?}");
        assert_eq!(rflags, 0x2, "{bytes:x?}");
        assert_eq!(regs, before, "{bytes:x?}");
    }
}
