//! unit.rs's tests of faults, the threshold interrupt and the unit's
//! saved state (MSRs, XSAVE component 62, snapshots), on unit_tests.rs's rig.

use super::*;

#[test]
fn llwpcb_faults_keep_the_old_block() {
    let rw_user_write = PF_PRESENT | PF_USER | PF_WRITE;
    type Setup = fn(&mut Rig) -> u64;
    let table: [(&str, Setup, GuestFault); 6] = [
        (
            "unmapped LWPCB",
            |_| 0x9000,
            GuestFault::PageFault {
                address: 0x9000,
                error_code: PF_USER,
            },
        ),
        (
            "supervisor LWPCB",
            |r| {
                r.mem.map(0x9000, PAGE, PagePerm::Supervisor);
                0x9000
            },
            GuestFault::PageFault {
                address: 0x9000,
                error_code: PF_PRESENT | PF_USER,
            },
        ),
        (
            "read-only LWPCB",
            |r| {
                r.mem.map(0x9000, PAGE, PagePerm::ReadOnly);
                r.mem.poke(0x9004, &4096u32.to_le_bytes());
                0x9000
            },
            GuestFault::PageFault {
                address: 0x9000,
                error_code: rw_user_write,
            },
        ),
        (
            "read-only ring page",
            |r| {
                r.mem.map(0x9000, PAGE, PagePerm::ReadWrite);
                let fixed = LwpcbFixed {
                    buffer_size_random: 8192,
                    buffer_base: 0x20_0000,
                    ..Default::default()
                };
                r.mem.poke(0x9000, fixed.as_slice());
                r.mem.map(0x20_0000, PAGE, PagePerm::ReadWrite);
                r.mem.map(0x20_1000, PAGE, PagePerm::ReadOnly);
                0x9000
            },
            GuestFault::PageFault {
                address: 0x20_1000,
                error_code: rw_user_write,
            },
        ),
        (
            "ring too small",
            |r| {
                r.mem.map(0x9000, PAGE, PagePerm::ReadWrite);
                r.mem.poke(0x9004, &1000u32.to_le_bytes());
                0x9000
            },
            GuestFault::GeneralProtection,
        ),
        (
            "ring wraps past 2^64",
            |r| {
                r.mem.map(0x9000, PAGE, PagePerm::ReadWrite);
                let fixed = LwpcbFixed {
                    buffer_size_random: 4096,
                    buffer_base: u64::MAX - 1023,
                    ..Default::default()
                };
                r.mem.poke(0x9000, fixed.as_slice());
                0x9000
            },
            GuestFault::GeneralProtection,
        ),
    ];
    for (name, setup, want) in table {
        let mut r = rig(LwpProfile::Emulated, 0, 1024);
        r.load();
        r.ins(1);
        let at = setup(&mut r);
        assert_eq!(r.unit.llwpcb(&mut r.mem, at), Err(want), "{name}");
        assert_eq!(r.unit.cbaddr(), CB, "{name}: old block stays");
        assert_eq!(r.head(), 32, "{name}");
    }
}

#[test]
fn store_fault_after_load_is_a_missed_record() {
    let mut r = rig(LwpProfile::Emulated, 0, 8192);
    r.load();
    r.mem.unmap(RING);
    assert!(r.ins(1), "dropped record reports CF=1");
    assert_eq!(r.head(), 0);
    let s = r.unit.stats();
    assert_eq!((s.records_missed, s.store_faults), (1, 1));
    r.mem.unmap(CB);
    assert!(r.ins(2), "tail unreadable");
    assert_eq!(r.unit.slwpcb(&mut r.mem), Ok(CB), "SLWPCB still answers");
    assert_eq!(r.unit.stats().flush_faults, 1);
    r.unit.llwpcb(&mut r.mem, 0).unwrap();
    assert_eq!(
        r.unit.cbaddr(),
        0,
        "LLWPCB 0 disables even when the flush faults"
    );
}

/// S1: what a write-protected page (copy-on-write after fork) does to
/// each LWP instruction that stores, and that the instruction then
/// restarts once the page is writable again.
#[test]
fn write_protected_pages_fault_at_the_instruction_and_restart() {
    let wp = |address| {
        Err(GuestFault::PageFault {
            address,
            error_code: PF_PRESENT | PF_WRITE | PF_USER,
        })
    };
    type Op = fn(&mut Rig) -> Result<u64, GuestFault>;
    let lwpins: Op = |r| {
        let ev = ProgrammedEvent::default();
        r.unit.lwpins(&mut r.mem, &ev, 0).map(u64::from)
    };
    let lwpval: Op = |r| {
        let ev = ProgrammedEvent::default();
        r.unit.lwpval(&mut r.mem, &ev, 0).map(|()| 0)
    };
    let slwpcb: Op = |r| r.unit.slwpcb(&mut r.mem);
    let off: Op = |r| r.unit.llwpcb(&mut r.mem, 0).map(|()| 0);
    // (what, page write-protected, LWPVAL counter, operation, fault,
    //  result once writable, head afterwards)
    type Row = (
        &'static str,
        u64,
        u32,
        Op,
        Result<u64, GuestFault>,
        u64,
        u32,
    );
    let table: [Row; 5] = [
        ("LWPINS", RING, 0, lwpins, wp(RING + 32), 0, 64),
        ("LWPVAL storing", RING, 0, lwpval, wp(RING + 32), 0, 64),
        ("LWPVAL counting only", RING, 5, lwpval, Ok(0), 0, 32),
        ("SLWPCB", CB, 0, slwpcb, wp(CB), CB, 32),
        ("LLWPCB 0", CB, 0, off, wp(CB), 0, 32),
    ];
    // S1 covers every present page a CPL3 store may not write: one
    // made read-only (copy-on-write) and a supervisor page alike.
    let rows = [PagePerm::ReadOnly, PagePerm::Supervisor]
        .into_iter()
        .flat_map(|perm| table.map(|row| (perm, row)));
    for (perm, (what, page, counter, op, fault, then, head)) in rows {
        let what = format!("{what} ({perm:?} page)");
        let mut r = rig(LwpProfile::Emulated, 0x2000_0003, 4096);
        r.set_event(1, 0, counter);
        r.load();
        r.ins(1);
        let missed = r.unit.block().unwrap().missed_events;
        r.mem.map(page, PAGE, perm);
        assert_eq!(op(&mut r), fault, "{what}");
        assert_eq!(r.head(), 32, "{what}: nothing stored");
        assert_eq!(r.unit.block().unwrap().missed_events, missed, "{what}");
        r.mem.map(page, PAGE, PagePerm::ReadWrite);
        assert_eq!(op(&mut r), Ok(then), "{what}: restarted");
        if r.unit.cbaddr() != 0 {
            assert_eq!(r.head(), head, "{what}");
        } else {
            assert_eq!(r.u32_at(CB + OFF_HEAD), head, "{what}: flushed");
        }
    }
}

/// X3: a restore checks the LWPCB as loads and the ring not at all;
/// the stores check (S1), so a task forked from keeps its LWP, and a
/// ring that is gone shows at its first store.
#[test]
fn a_restore_accepts_write_protected_pages() {
    let mut r = rig(LwpProfile::Emulated, 0x2000_0002, 4096);
    r.load();
    r.ins(1);
    let area = r.unit.save_xsave();
    r.mem.map(CB, PAGE, PagePerm::ReadOnly);
    r.mem.map(RING, 4096, PagePerm::ReadOnly);
    let mut fresh = LwpUnit::new(*r.unit.caps());
    fresh.write_cfg(r.unit.cfg().raw()).unwrap();
    fresh.restore_xsave(&mut r.mem, &area).unwrap();
    assert_eq!(fresh.cbaddr(), CB);
    let ev = ProgrammedEvent::default();
    assert!(matches!(
        fresh.lwpins(&mut r.mem, &ev, 0),
        Err(GuestFault::PageFault { .. })
    ));
    r.mem.map(RING, 4096, PagePerm::ReadWrite);
    assert_eq!(fresh.lwpins(&mut r.mem, &ev, 0), Ok(false));
    assert_eq!(fresh.block().unwrap().head, 64);
    r.mem.unmap(RING);
    let mut gone = LwpUnit::new(*r.unit.caps());
    gone.write_cfg(r.unit.cfg().raw()).unwrap();
    gone.restore_xsave(&mut r.mem, &area).unwrap();
    assert_eq!(
        gone.lwpins(&mut r.mem, &ev, 0),
        Ok(true),
        "a ring that is not there shows at its first store: a missed record"
    );
    assert_eq!(gone.stats().store_faults, 1);
    r.mem.unmap(CB);
    assert!(
        fresh.restore_xsave(&mut r.mem, &area).is_err(),
        "an LWPCB that is not there is still refused"
    );
}

#[test]
fn threshold_interrupt_once_per_crossing() {
    let mut r = rig(LwpProfile::Emulated, 0x8000_0000, 1024);
    r.set_u32(OFF_THRESHOLD, 96);
    r.load();
    let mut taken = Vec::new();
    for i in 0..6 {
        r.ins(i);
        taken.push(r.unit.take_interrupt());
    }
    let deliver = Some(ThresholdInterrupt::Deliver(0x40));
    assert_eq!(taken, [None, None, deliver, None, None, None]);
    assert_eq!(r.u32_at(CB + OFF_HEAD), 96, "head flushed for the handler");
    // Software consumes everything: the next crossing interrupts again.
    r.set_u32(OFF_TAIL, 6 * 32);
    for i in 0..3 {
        r.ins(i);
    }
    assert_eq!(r.unit.take_interrupt(), deliver);
    assert_eq!(r.unit.stats().interrupts_due, 2);
}

#[test]
fn threshold_interrupt_needs_int_everywhere() {
    // (LWPCB flags, LWP_CFG, threshold, interrupt expected)
    let table = [
        (0x8000_0000, 0x0000_4000_8000_0000, 32, true),
        (0, 0x0000_4000_8000_0000, 32, false),
        (0x8000_0000, 0x0000_4000_0000_0000, 32, false),
        (0x8000_0000, 0x0000_4000_8000_0000, 0, false),
    ];
    for (flags, cfg, threshold, want) in table {
        let mut r = rig(LwpProfile::Emulated, flags, 1024);
        r.set_u32(OFF_THRESHOLD, threshold);
        r.load();
        r.unit.write_cfg(cfg).unwrap();
        r.ins(0);
        assert_eq!(
            r.unit.take_interrupt().is_some(),
            want,
            "{flags:#x} {cfg:#x} {threshold}"
        );
    }
}

#[test]
fn exception_vectors_are_suppressed() {
    let mut r = rig(LwpProfile::Emulated, 0x8000_0000, 1024);
    r.set_u32(OFF_THRESHOLD, 32);
    r.unit.write_cfg(0x0000_1F00_8000_0000).unwrap();
    r.load();
    r.ins(0);
    assert_eq!(
        r.unit.take_interrupt(),
        Some(ThresholdInterrupt::Suppressed(0x1F))
    );
    assert_eq!(r.unit.stats().interrupts_suppressed, 1);
}

#[test]
fn record_log_keeps_stored_records_only() {
    let mut r = rig(LwpProfile::Emulated, 0, 1024);
    r.load();
    r.ins(1);
    assert!(r.unit.drain_log().is_empty(), "no log unless asked");
    r.unit.keep_log();
    for i in 0..40 {
        r.ins(i);
    }
    let log = r.unit.drain_log();
    assert_eq!(
        log.len(),
        30,
        "31 slots minus the one already used; missed ones are not logged"
    );
    assert_eq!(log[0].data1, 0);
    assert!(r.unit.drain_log().is_empty(), "drained");
}

#[test]
fn withheld_features_are_neither_granted_nor_counted() {
    let mut r = rig(LwpProfile::Precise, 0xC, 4096);
    r.unit.withhold(LwpFeatures::IRE | LwpFeatures::BRE);
    r.load();
    assert_eq!(r.u32_at(CB + OFF_FLAGS), 0, "LLWPCB does not grant them");
    r.unit.count(&mut r.mem, EventId::Ire, 100, 0, 0);
    assert_eq!(r.unit.stats().records_stored, 0);
    r.unit.withhold(LwpFeatures::empty());
    r.set_u32(OFF_FLAGS, 0xC);
    r.load();
    assert_eq!(r.u32_at(CB + OFF_FLAGS), 0xC, "granted once available");
}

#[test]
fn msrs() {
    let mut r = rig(LwpProfile::Emulated, 0, 1024);
    assert_eq!(r.unit.cfg().raw(), 0x0000_4005_E000_0062);
    assert!(r.unit.write_cfg(1 << 2).is_err(), "IRE not in emulated");
    assert_eq!(
        r.unit.cfg().raw(),
        0x0000_4005_E000_0062,
        "a refused write changes nothing"
    );
    r.load();
    assert_eq!(
        r.unit.write_cbaddr(0x5000),
        Err(MsrError::CbaddrNonZero(0x5000))
    );
    assert_eq!(r.unit.cbaddr(), CB);
    r.mem.clear_writes();
    r.unit.write_cbaddr(0).unwrap();
    assert_eq!(r.unit.cbaddr(), 0);
    assert!(r.mem.writes().is_empty(), "WRMSR 0 does not flush");
}

#[test]
fn xsave_round_trip() {
    let mut r = rig(LwpProfile::Emulated, 0x2000_0062, 4096);
    r.set_event(1, 3, 3);
    r.set_event(6, 0x10000, 0x500);
    r.load();
    for i in 0..5 {
        r.ins(i);
        r.unit
            .lwpval(&mut r.mem, &ProgrammedEvent::default(), 0)
            .unwrap();
    }
    let area = r.unit.save_xsave();
    assert_eq!(area.lwpcb_address, CB);
    assert_eq!(area.head, r.head());
    assert_eq!(
        area.counters[0], 2,
        "counter 1 after 5 LWPVALs with interval 3"
    );
    assert_eq!(area.counters[5], 0x500);
    let mut fresh = LwpUnit::new(*r.unit.caps());
    fresh.write_cfg(r.unit.cfg().raw()).unwrap();
    fresh.restore_xsave(&mut r.mem, &area).unwrap();
    assert_eq!(
        fresh.block(),
        r.unit.block(),
        "restored block equals the saved one"
    );
    assert_eq!(fresh.save_xsave(), area);
    fresh
        .restore_xsave(&mut r.mem, &LwpXsaveArea::INIT)
        .unwrap();
    assert_eq!(fresh.cbaddr(), 0, "init state disables LWP");
}

#[test]
fn xsave_restore_is_validated() {
    let mut r = rig(LwpProfile::Emulated, 0x2, 4096);
    r.load();
    let good = r.unit.save_xsave();
    type Breaker = fn(&mut LwpXsaveArea);
    // (what is wrong, how, the fault, the flags loaded when taken)
    let table: [(&str, Breaker, Option<GuestFault>, u32); 4] = [
        (
            "flags beyond the profile are dropped",
            |a| a.flags = 0xFFFF_FFFF,
            None,
            0xE000_0062,
        ),
        (
            "ring too small",
            |a| a.buffer_size = 64,
            Some(GuestFault::GeneralProtection),
            0,
        ),
        (
            "LWPCB unmapped",
            |a| a.lwpcb_address = 0x7000_0000,
            Some(GuestFault::PageFault {
                address: 0x7000_0000,
                error_code: PF_USER,
            }),
            0,
        ),
        (
            "ring unmapped: not walked at restore, its stores are (X3)",
            |a| a.buffer_base = 0x7000_0000,
            None,
            0x2,
        ),
    ];
    for (name, breaker, want, flags) in table {
        let mut area = good;
        breaker(&mut area);
        let mut u = LwpUnit::new(*r.unit.caps());
        let got = u.restore_xsave(&mut r.mem, &area);
        assert_eq!(got.err(), want, "{name}");
        if want.is_none() {
            assert_eq!(u.block().unwrap().flags.bits(), flags, "{name}");
        } else {
            assert_eq!(u.cbaddr(), 0, "{name}: nothing loaded");
        }
    }
    let mut with_record = good;
    with_record.saved_record[0] = 255;
    let mut u = LwpUnit::new(*r.unit.caps());
    u.restore_xsave(&mut r.mem, &with_record).unwrap();
    assert_eq!(
        u.block().unwrap().missed_events,
        1,
        "saved record counted as missed"
    );
}

#[test]
fn state_round_trip_and_validation() {
    let mut r = rig(LwpProfile::Emulated, 0x8000_0002, 4096);
    r.load();
    r.ins(1);
    let state = r.unit.state();
    let back = LwpUnit::from_state(*r.unit.caps(), &state).unwrap();
    assert_eq!(back.state(), state);
    let mut bad = state;
    bad.cfg = 1 << 2;
    assert!(matches!(
        LwpUnit::from_state(*r.unit.caps(), &bad),
        Err(StateError::Cfg(_))
    ));
    let mut bad = state;
    if let Some(b) = bad.block.as_mut() {
        b.head = 4096;
    }
    assert!(matches!(
        LwpUnit::from_state(*r.unit.caps(), &bad),
        Err(StateError::Block(_))
    ));
    let bulldozer = LwpProfile::Bulldozer.caps().unwrap();
    assert!(
        LwpUnit::from_state(bulldozer, &state).is_err(),
        "other profile"
    );
}
