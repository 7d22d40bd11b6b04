//! Cost of the emulated unit's memory path: a record stored into a 64 KiB
//! ring through the guard (page walk, RAM check, A/D update included), next to
//! the same store with no translation at all, and an LLWPCB validation.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use lwpvmm::guard::pagetable::{PageTables, PteFlags};
use lwpvmm::guard::{GuestMemory, GuestView, Paging, PagingCaps};

use lwpvmm::lwp::cpuid::LwpProfile;
use lwpvmm::lwp::flat::{FlatMemory, PagePerm};
use lwpvmm::lwp::lwpcb::LwpcbFixed;
use lwpvmm::lwp::record::{EventRecord, ProgrammedEvent};
use lwpvmm::lwp::unit::LwpUnit;
use vm_memory::{ByteValued, Bytes, GuestAddress};

const CB: u64 = 0x7000_1000;
const RING: u64 = 0x7001_0000;
const RING_SIZE: u32 = 64 * 1024;
const CB_GPA: u64 = 0x20_0000;
const RING_GPA: u64 = 0x30_0000;
/// Continuous mode: the ring never fills, so every LWPINS stores a record.
const FLAGS: u32 = 0x2000_0000;

fn guest() -> (GuestMemory, u64) {
    let mem = GuestMemory::from_ranges(&[(GuestAddress(0), 16 << 20)]).unwrap();
    let cr3 = {
        let mut pt = PageTables::new(&mem, 0x1000, 0x10_0000).unwrap();
        pt.map_range(CB, CB_GPA, 0x1000, PteFlags::USER_RW).unwrap();
        pt.map_range(RING, RING_GPA, u64::from(RING_SIZE), PteFlags::USER_RW)
            .unwrap();
        pt.cr3()
    };
    let fixed = LwpcbFixed {
        flags: FLAGS,
        buffer_size_random: RING_SIZE,
        buffer_base: RING,
        ..Default::default()
    };
    mem.write_slice(fixed.as_slice(), GuestAddress(CB_GPA))
        .unwrap();
    (mem, cr3)
}

fn paging(cr3: u64) -> Paging {
    Paging::from_regs(0x8001_0001, cr3, 0x20, 0xD00, PagingCaps::COMMON, 0).unwrap()
}

fn unit() -> LwpUnit {
    let mut unit = LwpUnit::new(LwpProfile::Emulated.caps().unwrap());
    unit.write_cfg(0xE000_0062).unwrap();
    unit
}

fn benches(c: &mut Criterion) {
    let (mem, cr3) = guest();
    let ev = ProgrammedEvent {
        data1: 1,
        data2: 2,
        flags: 3,
        instruction_address: 0x40_1000,
    };

    let mut u = unit();
    let mut view = GuestView::new(&mem, paging(cr3));
    u.llwpcb(&mut view, CB).unwrap();
    c.bench_function("lwpins: record into 64 KiB ring through the guard", |b| {
        b.iter(|| black_box(u.lwpins(&mut view, black_box(&ev), 0)))
    });

    let record = EventRecord::default();
    let mut slot = 0u64;
    c.bench_function("baseline: 32-byte write_obj at a physical address", |b| {
        b.iter(|| {
            slot = (slot + 32) % u64::from(RING_SIZE);
            mem.write_obj(black_box(record), GuestAddress(RING_GPA + slot))
                .unwrap()
        })
    });

    let mut flat = FlatMemory::new();
    flat.map(CB, 0x1000, PagePerm::ReadWrite);
    flat.map(RING, u64::from(RING_SIZE), PagePerm::ReadWrite);
    let mut fixed = LwpcbFixed::default();
    mem.read_slice(fixed.as_mut_slice(), GuestAddress(CB_GPA))
        .unwrap();
    flat.poke(CB, fixed.as_slice());
    let mut fu = unit();
    fu.llwpcb(&mut flat, CB).unwrap();
    c.bench_function("lwpins: record into 64 KiB ring, in-memory fake", |b| {
        b.iter(|| {
            flat.clear_writes();
            black_box(fu.lwpins(&mut flat, black_box(&ev), 0))
        })
    });

    let mut lu = unit();
    let mut view = GuestView::new(&mem, paging(cr3));
    c.bench_function(
        "llwpcb: validate and load, 64 KiB ring, through the guard",
        |b| b.iter(|| lu.llwpcb(&mut view, black_box(CB)).unwrap()),
    );
}

criterion_group!(lwp_unit, benches);
criterion_main!(lwp_unit);
