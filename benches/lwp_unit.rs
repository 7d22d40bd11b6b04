//! Cost of the emulated unit's memory path: a record stored into a 64 KiB
//! ring through the guard (page walk, RAM check, A/D update included), next to
//! the same store with no translation at all, and an LLWPCB validation.
//! After criterion's figures, two ratios measured in the same run, each the
//! median of rounds that time both sides back to back (so a noisy
//! neighbour's burst lands on both halves of a round): a component-62
//! restore (a context switch into an LWP task) with a 256 MiB ring against
//! one with a 4 KiB ring, and LLWPCB with a 64 KiB ring against one 32-byte
//! `write_obj`.

// A benchmark: a failed setup or expectation stops it with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::hint::black_box;
use std::time::Instant;

use common::median;
use criterion::{Criterion, criterion_group};
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
    ring_guest(RING_SIZE, false)
}

/// A guest whose LWPCB at CB names a ring of `size` bytes at RING, mapped
/// to RAM from RING_GPA on, or, with `alias`, every ring page to the one
/// page there (so a 256 MiB ring fits 16 MiB of RAM); returns its memory
/// and CR3.
fn ring_guest(size: u32, alias: bool) -> (GuestMemory, u64) {
    let mem = GuestMemory::from_ranges(&[(GuestAddress(0), 16 << 20)]).unwrap();
    let cr3 = {
        let mut pt = PageTables::new(&mem, 0x1000, 0x20_0000).unwrap();
        pt.map_range(CB, CB_GPA, 0x1000, PteFlags::USER_RW).unwrap();
        if alias {
            for page in 0..u64::from(size).div_ceil(0x1000) {
                pt.map(
                    RING + page * 0x1000,
                    RING_GPA,
                    lwpvmm::guard::pagetable::PageSize::Size4K,
                    PteFlags::USER_RW,
                )
                .unwrap();
            }
        } else {
            pt.map_range(RING, RING_GPA, u64::from(size), PteFlags::USER_RW)
                .unwrap();
        }
        pt.cr3()
    };
    let fixed = LwpcbFixed {
        flags: FLAGS,
        buffer_size_random: size,
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

/// Nanoseconds per call of `f`, over `n` calls.
fn per_call(n: u32, f: &mut impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed().as_nanos() as f64 / f64::from(n)
}

/// `a` against `b` in 101 rounds, each timing `na` calls of `a` and then
/// `nb` of `b`: the medians of their per-call nanoseconds and of the
/// rounds' ratios.
fn paired(na: u32, mut a: impl FnMut(), nb: u32, mut b: impl FnMut()) -> (f64, f64, f64) {
    let rounds: Vec<(f64, f64)> = (0..101)
        .map(|_| (per_call(na, &mut a), per_call(nb, &mut b)))
        .collect();
    let ratio = median(rounds.iter().map(|(a, b)| a / b).collect());
    let (ta, tb): (Vec<f64>, Vec<f64>) = rounds.into_iter().unzip();
    (median(ta), median(tb), ratio)
}

/// The aliased ring guest of `size` bytes, its block loaded: its memory,
/// paging and the unit's component-62 image.
fn loaded(size: u32) -> (GuestMemory, Paging, lwpvmm::lwp::xsave::LwpXsaveArea) {
    let (mem, cr3) = ring_guest(size, true);
    let mut u = unit();
    let area = {
        let mut view = GuestView::new(&mem, paging(cr3));
        u.llwpcb(&mut view, CB).unwrap();
        u.save_xsave()
    };
    (mem, paging(cr3), area)
}

fn ratios() {
    let restore = |size: u32| {
        let (mem, paging, area) = loaded(size);
        let mut u = unit();
        move || {
            let mut view = GuestView::new(&mem, paging);
            u.restore_xsave(&mut view, black_box(&area)).unwrap();
        }
    };
    // BufferSize has 28 bits: the largest ring is a page short of 256 MiB.
    let (big, small, ratio) = paired(200, restore((256 << 20) - 4096), 200, restore(4096));
    println!("restore through the guard: 256 MiB ring {big:.0} ns, 4 KiB ring {small:.0} ns");
    println!("restore 256MiB ring / 4KiB ring = {ratio:.2}");

    let (mem, cr3) = guest();
    let mut u = unit();
    let record = EventRecord::default();
    let mut slot = 0u64;
    let (llwpcb, write, ratio) = paired(
        200,
        || {
            let mut view = GuestView::new(&mem, paging(cr3));
            u.llwpcb(&mut view, black_box(CB)).unwrap();
        },
        5_000,
        || {
            slot = (slot + 32) % u64::from(RING_SIZE);
            mem.write_obj(black_box(record), GuestAddress(RING_GPA + slot))
                .unwrap();
        },
    );
    println!("llwpcb of a 64 KiB ring {llwpcb:.0} ns, baseline write_obj {write:.1} ns");
    println!("llwpcb 64KiB ring / baseline write_obj = {ratio:.1}");
}

criterion_group!(lwp_unit, benches);

fn main() {
    lwp_unit();
    Criterion::default().configure_from_args().final_summary();
    ratios();
}
