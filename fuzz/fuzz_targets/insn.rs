//! The instruction path: arbitrary bytes decoded and emulated as if a #UD
//! doorbell had brought them, with arbitrary registers, in 64-, 32- or
//! 16-bit code with arbitrary segment bases, against guest memory that maps
//! a few pages. Nothing may panic.
#![no_main]

use kvm_bindings::kvm_regs;
use libfuzzer_sys::fuzz_target;
use lwpvmm::guard::pagetable::{PageTables, PteFlags};
use lwpvmm::guard::{GuestMemory, GuestView, Paging, PagingCaps};

use lwpvmm::lwp::cpuid::LwpProfile;
use lwpvmm::lwp::unit::LwpUnit;
use lwpvmm::vmm::vcpu::lwp_insn::{Context, SegmentBases, emulate};
use vm_memory::GuestAddress;

fuzz_target!(|data: &[u8]| {
    if data.len() < 16 + 8 * 5 {
        return;
    }
    let mem = GuestMemory::from_ranges(&[(GuestAddress(0), 4 << 20)]).expect("memory");
    let cr3 = {
        let Ok(mut pt) = PageTables::new(&mem, 0x1000, 0x10_0000) else { return };
        if pt.map_range(0x40_0000, 0x20_0000, 0x8000, PteFlags::USER_RW).is_err() {
            return;
        }
        pt.cr3()
    };
    let Ok(paging) = Paging::from_regs(0x8001_0001, cr3, 0x20, 0xD00, PagingCaps::COMMON, 0) else { return };
    let mut view = GuestView::new(&mem, paging);
    let word = |i: usize| u64::from_le_bytes(data[16 + 8 * i..24 + 8 * i].try_into().unwrap());
    let mut regs = kvm_regs {
        rax: word(0),
        rcx: word(1),
        rdx: word(2),
        rbx: 0x40_0000,
        ..Default::default()
    };
    let mut unit = LwpUnit::new(LwpProfile::Precise.caps().expect("caps"));
    let _ = unit.write_cfg(word(3));
    let mut ctx = Context {
        regs: &mut regs,
        rsp: 0x40_7000,
        rflags: 0x202,
        rip: 0x40_1000,
        user: data[15] & 1 == 0,
        bitness: [64, 32, 16, 64][usize::from(data[15] >> 1 & 3)],
        bases: SegmentBases {
            ds: word(4),
            fs: word(4).rotate_left(17),
            ..SegmentBases::default()
        },
    };
    let len = usize::from(data[14] % 16).min(15);
    let _ = emulate(&mut view, Some(&mut unit), &mut ctx, &data[..len], 0);
});
