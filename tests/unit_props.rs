//! Property tests of the LWP unit on random instruction sequences and random
//! LWPCBs, against an in-memory user address space.

// A test: a failed setup or expectation stops it with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lwpvmm::lwp::cpuid::{LwpFeatures, LwpProfile};
use lwpvmm::lwp::fault::{GuestFault, PF_PRESENT};
use lwpvmm::lwp::flat::{FlatMemory, PAGE, PagePerm};
use lwpvmm::lwp::lwpcb::{LoadedLwpcb, LwpcbFixed, OFF_MISSED, OFF_TAIL};
use lwpvmm::lwp::record::{EventId, ProgrammedEvent};
use lwpvmm::lwp::unit::LwpUnit;
use proptest::prelude::*;
use vm_memory::ByteValued;

const CBS: [u64; 2] = [0x1000, 0x3000];
const RINGS: [u64; 2] = [0x10_0000, 0x20_0000];
/// Rings are mapped this large, with a writable guard page on each side, so
/// a stray store would land in mapped memory and show in the write log.
const RING_MAP: u64 = 0x1_0000;

#[derive(Debug, Clone)]
enum Op {
    Load(usize),
    Unload,
    Store,
    Ins(u32),
    Val,
    Count(EventId, u64),
    Branch(bool),
    Consume(u32),
    Cfg(u64),
    SaveRestore,
    BreakRingPage(u64),
    RepairRing,
}

#[derive(Debug, Clone)]
struct Block {
    flags: u32,
    size: u32,
    head: u32,
    threshold: u32,
    tail: u32,
    pairs: Vec<(u32, u32)>,
}

fn block() -> impl Strategy<Value = Block> {
    (
        any::<u32>(),
        prop_oneof![Just(1024u32), Just(4096), 0u32..0x1_0000, any::<u32>()],
        prop_oneof![Just(0u32), 0u32..0x1_0000, any::<u32>()],
        prop_oneof![Just(0u32), Just(32), 0u32..0x1000],
        prop_oneof![Just(0u32), 0u32..0x1_0000, any::<u32>()],
        prop::collection::vec((0u32..64, 0u32..64), 6),
    )
        .prop_map(|(flags, size, head, threshold, tail, pairs)| Block {
            flags,
            size,
            head,
            threshold,
            tail,
            pairs,
        })
}

fn op(faults: bool) -> BoxedStrategy<Op> {
    let base = prop_oneof![
        (0usize..2).prop_map(Op::Load),
        Just(Op::Unload),
        Just(Op::Store),
        any::<u32>().prop_map(Op::Ins),
        Just(Op::Val),
        (
            prop_oneof![Just(EventId::Ire), Just(EventId::Cnh), Just(EventId::Rnh)],
            0u64..5000
        )
            .prop_map(|(id, n)| Op::Count(id, n)),
        any::<bool>().prop_map(Op::Branch),
        (0u32..40).prop_map(Op::Consume),
        prop_oneof![
            Just(0u64),
            Just(0xE000_006Eu64),
            Just(0x0000_2001_E000_006E),
            any::<u64>()
        ]
        .prop_map(Op::Cfg),
        Just(Op::SaveRestore),
    ];
    if faults {
        prop_oneof![
            8 => base,
            1 => (0u64..16).prop_map(Op::BreakRingPage),
            1 => Just(Op::RepairRing),
        ]
        .boxed()
    } else {
        base.boxed()
    }
}

struct Rig {
    unit: LwpUnit,
    mem: FlatMemory,
}

fn rig(blocks: &[Block; 2]) -> Rig {
    let caps = LwpProfile::Precise.caps().unwrap();
    let mut unit = LwpUnit::new(caps);
    unit.write_cfg(0x0000_2001_E000_006E).unwrap();
    let mut mem = FlatMemory::new();
    for (i, b) in blocks.iter().enumerate() {
        mem.map(CBS[i], PAGE, PagePerm::ReadWrite);
        mem.map(RINGS[i] - PAGE, RING_MAP + 2 * PAGE, PagePerm::ReadWrite);
        let fixed = LwpcbFixed {
            flags: b.flags,
            buffer_size_random: b.size & 0x0001_FFFF | b.size & 0xF000_0000,
            buffer_base: RINGS[i],
            head: b.head,
            threshold: b.threshold,
            tail: b.tail,
            ..Default::default()
        };
        mem.poke(CBS[i], fixed.as_slice());
        for (n, (interval, counter)) in b.pairs.iter().enumerate() {
            let at = CBS[i] + 128 + 8 * n as u64;
            mem.poke(at, &interval.to_le_bytes());
            mem.poke(at + 4, &counter.to_le_bytes());
        }
    }
    Rig { unit, mem }
}

fn read_u32(mem: &FlatMemory, at: u64) -> u32 {
    let mut b = [0; 4];
    mem.peek(at, &mut b);
    u32::from_le_bytes(b)
}

/// Records one event of `id` would produce: a brute-force count of counter
/// crossings, independent of the unit's arithmetic.
fn crossings(counter: i32, interval: i32, n: u64) -> u64 {
    let (mut c, mut k) = (i64::from(counter), 0);
    for _ in 0..n {
        c -= 1;
        if c < 0 {
            k += 1;
            c = i64::from(interval);
        }
    }
    k
}

/// Records `n` events of `id` should generate with the unit as it is.
/// A #PF on a present page: what S1 raises.
fn write_protected(fault: GuestFault) -> bool {
    matches!(fault, GuestFault::PageFault { error_code, .. } if error_code & PF_PRESENT != 0)
}

fn expected(unit: &LwpUnit, block: Option<LoadedLwpcb>, id: EventId, n: u64) -> u64 {
    let feature = LwpFeatures::for_event(id as u8).unwrap();
    block.map_or(0, |b| {
        if (b.flags & unit.cfg().features()).contains(feature) {
            let slot = b.events[id as usize];
            crossings(slot.counter, slot.interval, n)
        } else {
            0
        }
    })
}

fn run(blocks: [Block; 2], ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut r = rig(&blocks);
    let cb_len = u64::from(r.unit.caps().cb_size());
    let mut broken = false;
    for op in ops {
        let before = r.unit.block().copied();
        let stats = r.unit.stats();
        let cont =
            before.is_some_and(|b| (b.flags & r.unit.cfg().features()).contains(LwpFeatures::CONT));
        let mut expected_events: Option<u64> = None;
        r.mem.clear_writes();
        match op {
            Op::Load(i) => {
                let _ = r.unit.llwpcb(&mut r.mem, CBS[i]);
            }
            Op::Unload => {
                let _ = r.unit.llwpcb(&mut r.mem, 0);
            }
            Op::Store => {
                let addr = r
                    .unit
                    .slwpcb(&mut r.mem)
                    .expect("LWPCB pages are never write-protected here");
                prop_assert_eq!(addr, before.map_or(0, |b| b.address));
                if let Some(b) = before {
                    let mut m = [0u8; 8];
                    r.mem.peek(b.address + OFF_MISSED, &mut m);
                    prop_assert_eq!(u64::from_le_bytes(m), b.missed_events);
                }
            }
            Op::Ins(d) => {
                let ev = ProgrammedEvent {
                    data1: d,
                    ..Default::default()
                };
                match r.unit.lwpins(&mut r.mem, &ev, 1) {
                    Ok(cf) => {
                        expected_events = Some(u64::from(before.is_some()));
                        let missed = r.unit.stats().records_missed - stats.records_missed;
                        prop_assert_eq!(cf, missed == 1, "CF reports the missed record");
                        if cont && !broken {
                            prop_assert!(!cf, "continuous mode never stalls");
                        }
                    }
                    Err(fault) => {
                        prop_assert!(broken && write_protected(fault), "{fault}");
                        prop_assert_eq!(r.unit.block().copied(), before, "S1: nothing changes");
                        expected_events = Some(0);
                    }
                }
            }
            Op::Val => {
                let want = expected(&r.unit, before, EventId::Val, 1);
                match r.unit.lwpval(&mut r.mem, &ProgrammedEvent::default(), 2) {
                    Ok(()) => expected_events = Some(want),
                    Err(fault) => {
                        prop_assert!(broken && write_protected(fault), "{fault}");
                        prop_assert_eq!(r.unit.block().copied(), before, "S1: nothing changes");
                        expected_events = Some(0);
                    }
                }
            }
            Op::Count(id, n) => {
                expected_events = Some(expected(&r.unit, before, id, n));
                r.unit.count(&mut r.mem, id, n, 0x40_1000, 3);
            }
            Op::Branch(taken) => {
                expected_events = Some(expected(&r.unit, before, EventId::Bre, 1));
                r.unit
                    .retire_branch(&mut r.mem, 0x40_2000, 0x40_3000, taken, 4);
            }
            Op::Consume(records) => {
                if let Some(b) = before {
                    let tail = read_u32(&r.mem, b.address + OFF_TAIL);
                    let moved = (tail % b.buffer_size + records * 32) % b.buffer_size;
                    r.mem.poke(b.address + OFF_TAIL, &moved.to_le_bytes());
                }
            }
            Op::Cfg(v) => {
                let _ = r.unit.write_cfg(v);
            }
            Op::SaveRestore => {
                let area = r.unit.save_xsave();
                let mut fresh = LwpUnit::new(*r.unit.caps());
                fresh.write_cfg(r.unit.cfg().raw()).unwrap();
                // Write-protected ring pages do not stop a restore (X3).
                fresh.restore_xsave(&mut r.mem, &area).unwrap();
                let mut want = r.unit.block().copied();
                // MissedEvents comes from memory, as flushed last.
                if let (Some(w), Some(got)) = (want.as_mut(), fresh.block()) {
                    w.missed_events = got.missed_events;
                }
                prop_assert_eq!(fresh.block().copied(), want, "component 62 round trip");
            }
            Op::BreakRingPage(page) => {
                if let Some(b) = before {
                    r.mem
                        .map(b.buffer_base + page * PAGE, PAGE, PagePerm::ReadOnly);
                    broken = true;
                }
            }
            Op::RepairRing => {
                for ring in RINGS {
                    r.mem.map(ring, RING_MAP, PagePerm::ReadWrite);
                }
                broken = false;
            }
        }
        let after = r.unit.block().copied();
        // Stores only inside the LWPCBs and the rings of the blocks involved.
        for &(at, len) in r.mem.writes() {
            let inside = |start: u64, size: u64| at >= start && at + len <= start + size;
            let ok = CBS.iter().any(|&cb| inside(cb, cb_len))
                || [before, after]
                    .iter()
                    .flatten()
                    .any(|b| inside(b.buffer_base, u64::from(b.buffer_size)));
            prop_assert!(
                ok,
                "store of {} bytes at {:#x} is outside every allowed range",
                len,
                at
            );
        }
        // Every generated record is either stored or missed.
        if let Some(events) = expected_events {
            let s = r.unit.stats();
            let accounted = (s.records_stored - stats.records_stored)
                + (s.records_missed - stats.records_missed);
            prop_assert_eq!(
                accounted,
                events,
                "records stored + missed = records generated"
            );
        }
        if let Some(b) = after {
            prop_assert!(
                b.head < b.buffer_size && b.head % 32 == 0,
                "head {:#x}",
                b.head
            );
            prop_assert!(b.buffer_size >= 1024 && b.buffer_size % 32 == 0);
            let sync = !(b.flags & r.unit.cfg().features()).contains(LwpFeatures::CONT);
            let stored = r.unit.stats().records_stored > stats.records_stored;
            if sync && stored && before.map(|x| x.address) == Some(b.address) {
                let tail = read_u32(&r.mem, b.address + OFF_TAIL);
                prop_assert_ne!(b.head, tail - tail % 32, "one slot always stays free");
            }
            for slot in &b.events[1..] {
                prop_assert!(slot.counter >= 0 && slot.interval >= 0);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn unit_keeps_its_invariants(
        blocks in [block(), block()],
        ops in prop::collection::vec(op(false), 1..120),
    ) {
        run(blocks, ops)?;
    }

    #[test]
    fn unit_survives_failing_memory(
        blocks in [block(), block()],
        ops in prop::collection::vec(op(true), 1..120),
    ) {
        run(blocks, ops)?;
    }
}
