//! The LWP unit driven by arbitrary instruction, MSR and memory sequences
//! against the in-memory address space: nothing may panic, and no byte may
//! be stored outside the LWPCBs and the rings of the blocks involved (the
//! block loaded before an operation, whose LWPCB a flush writes, and the
//! one loaded after it).
#![no_main]

use libfuzzer_sys::fuzz_target;
use lwpvmm::lwp::cpuid::LwpProfile;
use lwpvmm::lwp::flat::{FlatMemory, PAGE, PagePerm};
use lwpvmm::lwp::record::{EventId, ProgrammedEvent};
use lwpvmm::lwp::unit::LwpUnit;
use lwpvmm::lwp::xsave::LwpXsaveArea;

const CBS: [u64; 2] = [0x1000, 0x3000];

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 * 176 + 1 {
        return;
    }
    let profile = LwpProfile::ALL[usize::from(data[0] % 3) + 1];
    let Some(caps) = profile.caps() else { return };
    let mut unit = LwpUnit::new(caps);
    let mut mem = FlatMemory::new();
    for (i, cb) in CBS.iter().enumerate() {
        mem.map(*cb, PAGE, PagePerm::ReadWrite);
        mem.poke(*cb, &data[1 + i * 176..1 + (i + 1) * 176]);
    }
    mem.map(0x10_0000, 0x2_0000, PagePerm::ReadWrite);
    let mut ops = &data[1 + 2 * 176..];
    let cb_len = u64::from(caps.cb_size());
    while ops.len() >= 9 {
        let (op, rest) = ops.split_at(9);
        ops = rest;
        let arg = u64::from_le_bytes(op[1..9].try_into().unwrap());
        let before = unit.block().copied();
        mem.clear_writes();
        match op[0] % 12 {
            0 => drop(unit.llwpcb(&mut mem, CBS[(arg & 1) as usize])),
            1 => drop(unit.llwpcb(&mut mem, arg)),
            2 => drop(unit.slwpcb(&mut mem)),
            3 => drop(unit.lwpins(&mut mem, &ProgrammedEvent { data1: arg as u32, ..Default::default() }, arg)),
            4 => drop(unit.lwpval(&mut mem, &ProgrammedEvent::default(), arg)),
            5 => unit.count(&mut mem, EventId::Cnh, arg, arg, arg),
            6 => unit.retire_branch(&mut mem, arg, !arg, arg & 1 == 0, 0),
            7 => drop(unit.write_cfg(arg)),
            8 => drop(unit.write_cbaddr(arg & 1)),
            9 => mem.map(0x10_0000 + (arg % 32) * PAGE, PAGE, PagePerm::ReadOnly),
            10 => {
                let mut bytes = [0u8; 128];
                for (i, b) in bytes.iter_mut().enumerate() {
                    *b = op[1 + i % 8].wrapping_mul(i as u8);
                }
                let _ = unit.restore_xsave(&mut mem, &LwpXsaveArea::from_bytes(&bytes));
            }
            _ => drop(unit.take_interrupt()),
        }
        let after = unit.block().copied();
        for &(at, len) in mem.writes() {
            let inside = |start: u64, size: u64| at >= start && at + len <= start.saturating_add(size);
            let ok = CBS.iter().any(|&cb| inside(cb, cb_len))
                || [before, after].iter().flatten().any(|b| inside(b.buffer_base, u64::from(b.buffer_size)))
                || [before, after].iter().flatten().any(|b| inside(b.address, cb_len));
            assert!(ok, "store of {len} bytes at {at:#x} outside every allowed range");
        }
    }
});
