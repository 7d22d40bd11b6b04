//! unit.rs's tests.

use super::*;
use crate::lwp::cpuid::LwpProfile;
use crate::lwp::fault::{PF_PRESENT, PF_USER, PF_WRITE};
use crate::lwp::flat::{FlatMemory, PAGE, PagePerm};
use crate::lwp::lwpcb::OFF_FLAGS;
use crate::lwp::record::{BRANCH_TAKEN, RECORD_SIZE};

const CB: u64 = 0x1000;
const RING: u64 = 0x10_000;
/// LWP_CFG's upper half in every rig: vector 0x40, CoreId 5.
const CFG_HIGH: u64 = 0x0000_4005_0000_0000;

struct Rig {
    unit: LwpUnit,
    mem: FlatMemory,
}

/// A unit with LWP_CFG enabling everything (CoreId 5, vector 0x40), an
/// LWPCB at CB and a ring of `size` bytes at RING, not yet loaded.
fn rig(profile: LwpProfile, flags: u32, size: u32) -> Rig {
    let caps = profile.caps().unwrap();
    let mut unit = LwpUnit::new(caps);
    let cfg = CFG_HIGH | u64::from(caps.flag_mask().bits());
    unit.write_cfg(cfg).unwrap();
    let mut mem = FlatMemory::new();
    mem.map(CB, PAGE, PagePerm::ReadWrite);
    mem.map(RING, u64::from(size.max(1)), PagePerm::ReadWrite);
    let fixed = LwpcbFixed {
        flags,
        buffer_size_random: size,
        buffer_base: RING,
        ..Default::default()
    };
    mem.poke(CB, fixed.as_slice());
    Rig { unit, mem }
}

impl Rig {
    fn set_u32(&mut self, off: u64, v: u32) {
        self.mem.poke(CB + off, &v.to_le_bytes());
    }
    fn u32_at(&self, addr: u64) -> u32 {
        let mut b = [0u8; 4];
        self.mem.peek(addr, &mut b);
        u32::from_le_bytes(b)
    }
    fn u64_at(&self, addr: u64) -> u64 {
        let mut b = [0u8; 8];
        self.mem.peek(addr, &mut b);
        u64::from_le_bytes(b)
    }
    fn set_event(&mut self, id: u64, interval: u32, counter: u32) {
        self.set_u32(128 + 8 * (id - 1), interval);
        self.set_u32(128 + 8 * (id - 1) + 4, counter);
    }
    fn load(&mut self) {
        self.unit.llwpcb(&mut self.mem, CB).unwrap();
    }
    fn record(&self, slot: u64) -> EventRecord {
        let mut r = EventRecord::default();
        self.mem
            .peek(RING + slot * RECORD_SIZE as u64, r.as_mut_slice());
        r
    }
    fn ins(&mut self, data1: u32) -> bool {
        let ev = ProgrammedEvent {
            data1,
            data2: 0xD2,
            flags: 0x1_0003,
            instruction_address: 0x40_0000 + u64::from(data1),
        };
        self.unit
            .lwpins(&mut self.mem, &ev, 0x7777)
            .expect("no write-protected ring slot")
    }
    fn head(&self) -> u32 {
        self.unit.block().unwrap().head
    }
}

#[test]
fn llwpcb_loads_and_writes_back() {
    let mut r = rig(LwpProfile::Emulated, 0xFFFF_FFFF, 4100);
    r.set_u32(OFF_HEAD, 70);
    r.set_u32(OFF_THRESHOLD, 100);
    r.set_event(1, 0x3FF_FFFF, 0x3FF_FFFF);
    r.set_event(5, 3, 2);
    r.load();
    assert_eq!(r.unit.cbaddr(), CB);
    assert_eq!(r.u32_at(CB + OFF_FLAGS), 0xE000_0062, "granted flags");
    assert_eq!(r.u32_at(CB + OFF_BUFFER_SIZE), 4096, "rounded size");
    assert_eq!(r.u32_at(CB + OFF_HEAD), 64, "rounded head");
    assert_eq!(r.u32_at(CB + OFF_THRESHOLD), 96, "rounded threshold");
    assert_eq!(
        r.u32_at(CB + 128),
        0,
        "negative interval 1 raised to its minimum, 0"
    );
    assert_eq!(r.u32_at(CB + 132), 0, "negative counter 1 becomes 0");
    assert_eq!(
        r.u32_at(CB + 128 + 32),
        0xFFFF,
        "CNH interval raised to its minimum"
    );
    assert_eq!(r.u32_at(CB + 128 + 36), 2, "CNH counter kept");
}

#[test]
fn lwpins_record_fields() {
    let mut r = rig(LwpProfile::Emulated, 0x4000_0000, 1024);
    r.load();
    assert!(!r.ins(9));
    let rec = r.record(0);
    assert_eq!(rec.event_id, 255);
    assert_eq!(rec.core_id, 5);
    assert_eq!(rec.event_flags, 3, "imm32 truncated to 16 bits");
    assert_eq!(rec.data1, 9);
    assert_eq!(rec.data2, 0xD2);
    assert_eq!(rec.instruction_address, 0x40_0009);
    assert_eq!(rec.timestamp, 0x7777, "PTSC on");
    assert_eq!(r.head(), 32);
    assert_eq!(r.unit.slwpcb(&mut r.mem), Ok(CB));
    assert_eq!(r.u32_at(CB + OFF_HEAD), 32, "SLWPCB flushes the head");
}

#[test]
fn timestamp_needs_ptsc_in_both_lwpcb_and_cfg() {
    // (LWPCB flags, LWP_CFG, expected timestamp)
    let table = [
        (0x4000_0000, 0x4000_0000, 0x7777),
        (0, 0x4000_0000, 0),
        (0x4000_0000, 0, 0),
    ];
    for (flags, cfg, want) in table {
        let mut r = rig(LwpProfile::Emulated, flags, 1024);
        r.unit.write_cfg(cfg).unwrap();
        r.load();
        r.unit.write_cfg(cfg).unwrap();
        r.ins(1);
        assert_eq!(r.record(0).timestamp, want, "flags {flags:#x} cfg {cfg:#x}");
    }
}

#[test]
fn full_ring_sets_cf_and_counts_missed() {
    let mut r = rig(LwpProfile::Emulated, 0, 1024);
    r.load();
    let slots = 1024 / 32;
    for i in 0..slots - 1 {
        assert!(!r.ins(i), "record {i} fits");
    }
    assert_eq!(r.head(), 1024 - 32);
    for i in 0..3 {
        assert!(r.ins(100 + i), "ring full: CF=1");
    }
    assert_eq!(r.head(), 1024 - 32, "head not advanced");
    assert_eq!(
        r.record(u64::from(slots) - 1).data1,
        102,
        "last slot overwritten"
    );
    r.unit.slwpcb(&mut r.mem).unwrap();
    assert_eq!(r.u64_at(CB + OFF_MISSED), 3);
    // Software consumes two records: two more fit.
    r.set_u32(OFF_TAIL, 64);
    assert!(!r.ins(7));
    assert!(!r.ins(8));
    assert!(r.ins(9));
    assert_eq!(r.unit.stats().records_stored, u64::from(slots) + 1);
    assert_eq!(r.unit.stats().records_missed, 4);
}

#[test]
fn invalid_tail_counts_as_full() {
    for tail in [1024u32, 0xFFFF_FFF0] {
        let mut r = rig(LwpProfile::Emulated, 0, 1024);
        r.set_u32(OFF_TAIL, tail);
        r.load();
        assert!(r.ins(1), "tail {tail:#x}");
        assert_eq!(r.unit.stats().records_stored, 0);
    }
    let mut r = rig(LwpProfile::Emulated, 0, 1024);
    r.set_u32(OFF_TAIL, 65);
    r.load();
    assert!(!r.ins(1), "tail 65 is read as 64: room for one record");
    assert!(r.ins(2), "and no more");
}

#[test]
fn continuous_mode_overwrites() {
    let mut r = rig(LwpProfile::Emulated, 0x2000_0000, 1024);
    r.load();
    for i in 0..100 {
        assert!(!r.ins(i), "continuous mode never stalls");
    }
    assert_eq!(r.head(), (100 * 32) % 1024);
    assert_eq!(r.record(0).data1, 96, "oldest slot overwritten");
    assert_eq!(r.unit.stats().records_missed, 0);
}

#[test]
fn lwpval_every_interval_plus_one() {
    // (interval, initial counter, executions, expected records)
    let table = [
        (0, 0, 5, 5),
        (2, 0, 9, 3),
        (2, 2, 9, 3),
        (2, 1, 2, 1),
        (4, 4, 4, 0),
    ];
    for (interval, counter, runs, want) in table {
        let mut r = rig(LwpProfile::Emulated, 0x2, 4096);
        r.set_event(1, interval, counter);
        r.load();
        let ev = ProgrammedEvent::default();
        for _ in 0..runs {
            r.unit.lwpval(&mut r.mem, &ev, 0).unwrap();
        }
        assert_eq!(
            r.unit.stats().records_stored,
            want,
            "interval {interval} counter {counter} runs {runs}"
        );
    }
}

#[test]
fn lwpval_needs_val_enabled() {
    let mut r = rig(LwpProfile::Emulated, 0x2, 4096);
    r.load();
    r.unit.write_cfg(0).unwrap();
    r.unit
        .lwpval(&mut r.mem, &ProgrammedEvent::default(), 0)
        .unwrap();
    assert_eq!(r.unit.stats().records_stored, 0, "LWP_CFG masks at once");
    r.unit.write_cfg(0x2).unwrap();
    r.unit
        .lwpval(&mut r.mem, &ProgrammedEvent::default(), 0)
        .unwrap();
    assert_eq!(r.unit.stats().records_stored, 1);
    let rec = r.record(0);
    assert_eq!(rec.event_id, 1);
}

#[test]
fn lwp_off_is_a_no_op() {
    let mut r = rig(LwpProfile::Emulated, 0x2, 4096);
    assert!(!r.ins(1), "LWPINS with LWP off: CF=0");
    r.unit
        .lwpval(&mut r.mem, &ProgrammedEvent::default(), 0)
        .unwrap();
    assert_eq!(r.unit.slwpcb(&mut r.mem), Ok(0));
    assert!(r.mem.writes().is_empty());
}

#[test]
fn bulk_charge_crossings() {
    // (interval, counter, n, records stored, missed by the cap, counter after)
    let max = MAX_RECORDS_PER_CHARGE;
    let table = [
        (0xFFFF, 10, 5, 0, 0, 5),
        (0xFFFF, 10, 11, 1, 0, 0xFFFF),
        (0xFFFF, 0, 0x10000 * 3, 3, 0, 0),
        (0xFFFF, 0, 0x10000 * (max + 10) + 1, max, 11, 0xFFFF),
        (0xFFFF, 0, u64::MAX, max, 0, 0),
    ];
    for (interval, counter, n, stored, capped, after) in table {
        let mut r = rig(LwpProfile::Emulated, 0x2000_0020, 4096);
        r.set_event(5, interval, counter);
        r.load();
        r.unit.count(&mut r.mem, EventId::Cnh, n, 0x1234, 0);
        let s = r.unit.stats();
        assert_eq!(s.records_stored, stored, "n={n:#x}");
        if n != u64::MAX {
            assert_eq!(s.records_missed, capped, "n={n:#x}");
            assert_eq!(r.unit.block().unwrap().events[5].counter, after, "n={n:#x}");
        }
        let slot = r.unit.block().unwrap().events[5];
        assert!((0..=slot.interval).contains(&slot.counter));
    }
}

#[test]
fn events_the_profile_lacks_are_not_counted() {
    let mut r = rig(LwpProfile::Emulated, 0xFFFF_FFFF, 4096);
    r.load();
    r.unit.count(&mut r.mem, EventId::Ire, 1000, 0, 0);
    r.unit.retire_branch(&mut r.mem, 0, 0, true, 0);
    assert_eq!(r.unit.stats().records_stored, 0);
    let mut p = rig(LwpProfile::Precise, 0x8, 4096);
    p.load();
    for i in 0..16 {
        p.unit
            .retire_branch(&mut p.mem, 0x100 + i, 0x200, i % 2 == 0, 0);
    }
    assert_eq!(
        p.unit.stats().records_stored,
        1,
        "BRE interval raised to 15"
    );
    let rec = p.record(0);
    let fields = (
        rec.event_id,
        rec.event_flags,
        rec.instruction_address,
        rec.data2,
    );
    assert_eq!(
        fields,
        (3, BRANCH_TAKEN, 0x100, 0x200),
        "counter 0: the first branch records"
    );
}

#[path = "unit_fault_tests.rs"]
mod faults_and_state;
