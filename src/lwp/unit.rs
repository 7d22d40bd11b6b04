//! The emulated LWP unit of one vCPU: the state machine behind LLWPCB,
//! SLWPCB, LWPINS, LWPVAL, the hardware-style counters and the MSRs.
//!
//! The unit is pure: it reaches guest memory only through [`UserMemory`],
//! reads no clock (callers pass the TSC) and delivers nothing itself (it
//! reports a due threshold interrupt; the VMM injects it).

use thiserror::Error;
use vm_memory::ByteValued;

use super::cpuid::{LwpCaps, LwpFeatures};
use super::fault::{GuestFault, PF_PRESENT, PF_RESERVED};
use super::lwpcb::{
    EventSlot, LoadedLwpcb, LwpcbError, LwpcbFixed, MAX_EVENT_ID, OFF_BUFFER_SIZE, OFF_FLAGS,
    OFF_HEAD, OFF_MISSED, OFF_TAIL, OFF_THRESHOLD, to_s26,
};
use super::memory::{UserMemory, read_u32};
use super::msr::{LwpCfg, MsrError, check_cbaddr_write};
use super::record::{EventId, EventRecord, ProgrammedEvent};
use super::xsave::LwpXsaveArea;

/// The most records one bulk charge ([`LwpUnit::count`]) stores; crossings
/// beyond it are counted in MissedEvents. Bounds the work a single sampling
/// kick can cause.
pub const MAX_RECORDS_PER_CHARGE: u64 = 64;

/// The largest LWPCB any CPUID encoding can describe (255 quadwords).
const MAX_CB_BYTES: usize = 255 * 8;

/// Vectors below this are exceptions; a threshold interrupt on one is not
/// delivered.
pub const FIRST_INTERRUPT_VECTOR: u8 = 32;

/// Counters the VMM turns into metrics. Every event the unit generates ends
/// either stored or missed: `records_stored + records_missed` is the number
/// of records generated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct UnitStats {
    /// Records written into the ring.
    pub records_stored: u64,
    /// Records counted in MissedEvents instead (full ring, store fault,
    /// bulk-charge cap, discarded saved record).
    pub records_missed: u64,
    /// Records lost because the tail read or the record store faulted.
    pub store_faults: u64,
    /// Flushes of head, MissedEvents or counters into the LWPCB that faulted.
    pub flush_faults: u64,
    /// Threshold crossings with the interrupt enabled.
    pub interrupts_due: u64,
    /// Due interrupts not delivered because the vector is below 32.
    pub interrupts_suppressed: u64,
}

/// A due threshold interrupt, as [`LwpUnit::take_interrupt`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThresholdInterrupt {
    /// Inject this vector into the vCPU's local APIC.
    Deliver(u8),
    /// LWP_CFG names an exception vector (0-31): nothing is delivered.
    Suppressed(u8),
}

/// Everything the unit holds, for snapshots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UnitState {
    /// LWP_CFG.
    pub cfg: u64,
    /// The loaded LWPCB, if LWP is on.
    pub block: Option<LoadedLwpcb>,
    /// A threshold interrupt not yet taken by the VMM.
    pub interrupt_due: bool,
}

/// Why a saved unit state is refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum StateError {
    /// LWP_CFG does not validate against the profile.
    #[error("saved LWP_CFG is invalid: {0}")]
    Cfg(#[from] MsrError),
    /// The loaded block breaks an invariant LLWPCB establishes.
    #[error("saved LWPCB state is invalid: {0}")]
    Block(#[from] LwpcbError),
}

enum Stored {
    Yes,
    Missed,
}

/// How loading a block checks its LWPCB and ring.
#[derive(Clone, Copy)]
enum Store {
    /// As CPL3 stores (LLWPCB, L1).
    Checked,
    /// The LWPCB as CPL3 loads, the ring not at all: a restore cannot
    /// fault, a page write-protected until the task next writes it
    /// (copy-on-write after fork) must not turn the task's LWP off, and a
    /// context switch must not cost a walk of every ring page; every store
    /// walks its own page (X3).
    Deferred,
}

/// The LWP unit of one vCPU.
#[derive(Debug, Clone)]
pub struct LwpUnit {
    caps: LwpCaps,
    cfg: LwpCfg,
    block: Option<LoadedLwpcb>,
    interrupt_due: bool,
    stats: UnitStats,
    log: Option<Vec<EventRecord>>,
    withheld: LwpFeatures,
}

impl LwpUnit {
    /// A unit at power-on: LWP_CFG 0, no LWPCB.
    pub fn new(caps: LwpCaps) -> Self {
        LwpUnit {
            caps,
            cfg: LwpCfg::RESET,
            block: None,
            interrupt_due: false,
            stats: UnitStats::default(),
            log: None,
            withheld: LwpFeatures::empty(),
        }
    }

    /// Features the VMM cannot produce at the moment (precise events before
    /// the guest declared its #DB doorbell): LLWPCB does not grant them and
    /// they are not counted, as if LWP_CFG did not enable them.
    pub fn withhold(&mut self, features: LwpFeatures) {
        self.withheld = features;
    }

    /// The features LLWPCB withholds.
    pub fn withheld(&self) -> LwpFeatures {
        self.withheld
    }

    /// Keeps a copy of every record stored from now on, for a host-side
    /// trace; [`drain_log`](Self::drain_log) takes them.
    pub fn keep_log(&mut self) {
        self.log.get_or_insert_with(Vec::new);
    }

    /// The records stored since the last call (empty unless `keep_log`).
    /// Each call to the unit stores at most a bounded number of records,
    /// so draining after every call keeps the log small.
    pub fn drain_log(&mut self) -> Vec<EventRecord> {
        self.log.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// The profile the unit emulates.
    pub fn caps(&self) -> &LwpCaps {
        &self.caps
    }

    /// LWP_CFG as RDMSR returns it.
    pub fn cfg(&self) -> LwpCfg {
        self.cfg
    }

    /// WRMSR LWP_CFG. Takes effect at once: events the OS disables stop
    /// being counted even while an LWPCB stays loaded.
    pub fn write_cfg(&mut self, value: u64) -> Result<(), MsrError> {
        self.cfg = LwpCfg::write(&self.caps, value)?;
        Ok(())
    }

    /// LWP_CBADDR as RDMSR returns it: the loaded LWPCB, or 0.
    pub fn cbaddr(&self) -> u64 {
        self.block.map_or(0, |b| b.address)
    }

    /// WRMSR LWP_CBADDR: 0 turns LWP off without a flush; anything else #GPs.
    pub fn write_cbaddr(&mut self, value: u64) -> Result<(), MsrError> {
        check_cbaddr_write(value)?;
        self.block = None;
        Ok(())
    }

    /// Turns LWP off, as WRMSR LWP_CBADDR = 0 does.
    pub fn off(&mut self) {
        self.block = None;
    }

    /// The loaded block, if LWP is on.
    pub fn block(&self) -> Option<&LoadedLwpcb> {
        self.block.as_ref()
    }

    /// The unit's counters.
    pub fn stats(&self) -> UnitStats {
        self.stats
    }

    /// LLWPCB: flushes the active block, then loads the block at `address`
    /// (0 turns LWP off). A fault reading or checking the new block, or an
    /// invalid block (#GP), leaves the previous block loaded; so does a
    /// write-protected page under the old LWPCB (S1), before anything is
    /// flushed.
    pub fn llwpcb(&mut self, mem: &mut dyn UserMemory, address: u64) -> Result<(), GuestFault> {
        self.check_flush(mem)?;
        self.flush(mem);
        if address == 0 {
            self.block = None;
            return Ok(());
        }
        let grant = self.cfg.features() - self.withheld;
        let block = self.load(mem, address, grant, None, Store::Checked)?;
        self.write_back(mem, &block)?;
        self.block = Some(block);
        Ok(())
    }

    /// SLWPCB: flushes head, MissedEvents and counters into the LWPCB and
    /// returns its address, or 0 when LWP is off. A write-protected LWPCB
    /// page raises #PF first (S1).
    pub fn slwpcb(&mut self, mem: &mut dyn UserMemory) -> Result<u64, GuestFault> {
        self.check_flush(mem)?;
        self.flush(mem);
        Ok(self.cbaddr())
    }

    /// LWPINS: stores an EventId-255 record. Returns CF: true when the record
    /// was counted in MissedEvents instead (full ring or a store fault), false
    /// when stored or when LWP is off. A write-protected ring slot raises #PF
    /// and changes nothing (S1).
    pub fn lwpins(
        &mut self,
        mem: &mut dyn UserMemory,
        ev: &ProgrammedEvent,
        tsc: u64,
    ) -> Result<bool, GuestFault> {
        let Some(b) = self.block else {
            return Ok(false);
        };
        Self::check_slot(mem, &b, self.caps.event_size())?;
        let record = EventRecord::programmed(EventId::Ins, self.cfg.core_id(), ev, self.stamp(tsc));
        Ok(matches!(self.store(mem, record), Stored::Missed))
    }

    /// LWPVAL: counts one EventId-1 event; a record every interval + 1. When
    /// this one would store a record into a write-protected ring slot, #PF
    /// and nothing counted (S1).
    pub fn lwpval(
        &mut self,
        mem: &mut dyn UserMemory,
        ev: &ProgrammedEvent,
        tsc: u64,
    ) -> Result<(), GuestFault> {
        if let Some(b) = self.block
            && self.effective(LwpFeatures::VAL)
            && b.events[EventId::Val as usize].counter <= 0
        {
            Self::check_slot(mem, &b, self.caps.event_size())?;
        }
        let record = EventRecord::programmed(EventId::Val, self.cfg.core_id(), ev, self.stamp(tsc));
        self.charge(mem, EventId::Val, 1, record);
        Ok(())
    }

    /// The flush a context switch needs (X6): head, MissedEvents and the
    /// counters into the LWPCB, best effort (L6).
    pub fn flush_for_switch(&mut self, mem: &mut dyn UserMemory) {
        self.flush(mem);
    }

    /// S1: a store an LWP instruction makes to a present page it may not
    /// write (read-only, supervisor, or denied by a protection key) raises
    /// #PF at the instruction before anything changes,
    /// so that the OS can resolve it (copy-on-write after fork) and the
    /// instruction restarts. Other faults keep the best-effort rules (L6,
    /// R6).
    fn restartable(mem: &mut dyn UserMemory, address: u64, len: u64) -> Result<(), GuestFault> {
        match mem.check_user_write(address, len) {
            Err(f @ GuestFault::PageFault { error_code, .. })
                if error_code & PF_PRESENT != 0 && error_code & PF_RESERVED == 0 =>
            {
                Err(f)
            }
            _ => Ok(()),
        }
    }

    fn check_flush(&self, mem: &mut dyn UserMemory) -> Result<(), GuestFault> {
        match self.block {
            Some(b) => Self::restartable(mem, b.address, self.cb_len() as u64),
            None => Ok(()),
        }
    }

    fn check_slot(mem: &mut dyn UserMemory, b: &LoadedLwpcb, es: u32) -> Result<(), GuestFault> {
        match b.buffer_base.checked_add(u64::from(b.head)) {
            Some(at) => Self::restartable(mem, at, u64::from(es)),
            None => Ok(()),
        }
    }

    fn cb_len(&self) -> usize {
        (self.caps.cb_size() as usize).clamp(LwpcbFixed::default().as_slice().len(), MAX_CB_BYTES)
    }

    /// Charges `n` occurrences of a hardware event without a payload (IRE,
    /// DME, CNH, RNH) to the instruction at `ip`. Nothing happens unless the
    /// event is enabled in both the LWPCB and LWP_CFG.
    pub fn count(&mut self, mem: &mut dyn UserMemory, id: EventId, n: u64, ip: u64, tsc: u64) {
        let record = EventRecord::hardware(id, self.cfg.core_id(), ip, self.stamp(tsc));
        self.charge(mem, id, n, record);
    }

    /// Charges one retired branch at `ip` going to `target`.
    pub fn retire_branch(
        &mut self,
        mem: &mut dyn UserMemory,
        ip: u64,
        target: u64,
        taken: bool,
        tsc: u64,
    ) {
        let record = EventRecord::branch(self.cfg.core_id(), ip, target, taken, self.stamp(tsc));
        self.charge(mem, EventId::Bre, 1, record);
    }

    /// Takes the due threshold interrupt, if any.
    pub fn take_interrupt(&mut self) -> Option<ThresholdInterrupt> {
        if !std::mem::take(&mut self.interrupt_due) {
            return None;
        }
        let vector = self.cfg.vector();
        if vector < FIRST_INTERRUPT_VECTOR {
            self.stats.interrupts_suppressed += 1;
            Some(ThresholdInterrupt::Suppressed(vector))
        } else {
            Some(ThresholdInterrupt::Deliver(vector))
        }
    }

    /// XSAVE of component 62. Writes nothing to guest memory.
    pub fn save_xsave(&self) -> LwpXsaveArea {
        let Some(b) = &self.block else {
            return LwpXsaveArea::INIT;
        };
        let mut area = LwpXsaveArea {
            lwpcb_address: b.address,
            flags: b.flags.bits(),
            head: b.head,
            buffer_base: b.buffer_base,
            buffer_size: b.buffer_size_word(),
            filters: b.filters,
            ..LwpXsaveArea::INIT
        };
        for (id, slot) in b.events.iter().enumerate().skip(1) {
            area.counters[id - 1] = to_s26(slot.counter);
        }
        area
    }

    /// XRSTOR of component 62: the init state turns LWP off; otherwise the
    /// image is untrusted and validated as LLWPCB validates a block, with the
    /// fields the image lacks (Threshold, MissedEvents, intervals, IP filter)
    /// read from the LWPCB it names. Nothing is flushed and nothing is written.
    /// A non-zero saved record cannot be replayed faithfully and is counted
    /// in MissedEvents.
    pub fn restore_xsave(
        &mut self,
        mem: &mut dyn UserMemory,
        area: &LwpXsaveArea,
    ) -> Result<(), GuestFault> {
        if area.is_init() {
            self.block = None;
            return Ok(());
        }
        let mut block = self.load(
            mem,
            area.lwpcb_address,
            LwpFeatures::all(),
            Some(area),
            Store::Deferred,
        )?;
        if area.saved_record.iter().any(|&b| b != 0) {
            // MissedEvents comes from the guest's LWPCB: it may be at its
            // maximum already.
            block.missed_events = block.missed_events.saturating_add(1);
            self.stats.records_missed = self.stats.records_missed.saturating_add(1);
        }
        self.block = Some(block);
        Ok(())
    }

    /// The whole state, for a snapshot.
    pub fn state(&self) -> UnitState {
        UnitState {
            cfg: self.cfg.raw(),
            block: self.block,
            interrupt_due: self.interrupt_due,
        }
    }

    /// Rebuilds a unit from a snapshot's state, which is untrusted.
    pub fn from_state(caps: LwpCaps, state: &UnitState) -> Result<Self, StateError> {
        let cfg = LwpCfg::from_saved(&caps, state.cfg)?;
        if let Some(b) = &state.block {
            b.check(&caps)?;
        }
        Ok(LwpUnit {
            caps,
            cfg,
            block: state.block,
            interrupt_due: state.interrupt_due,
            stats: UnitStats::default(),
            log: None,
            withheld: LwpFeatures::empty(),
        })
    }

    fn stamp(&self, tsc: u64) -> u64 {
        if self.effective(LwpFeatures::PTSC) {
            tsc
        } else {
            0
        }
    }

    /// True when `feature` is enabled in both the loaded LWPCB and LWP_CFG.
    pub fn counts(&self, feature: LwpFeatures) -> bool {
        self.effective(feature)
    }

    fn effective(&self, feature: LwpFeatures) -> bool {
        self.block
            .is_some_and(|b| (b.flags & (self.cfg.features() - self.withheld)).contains(feature))
    }

    /// Reads, checks and normalises the block at `address`. With `image`,
    /// the fields a component-62 image carries come from it instead.
    fn load(
        &self,
        mem: &mut dyn UserMemory,
        address: u64,
        grant: LwpFeatures,
        image: Option<&LwpXsaveArea>,
        store: Store,
    ) -> Result<LoadedLwpcb, GuestFault> {
        let caps = &self.caps;
        let cb_len = self.cb_len();
        let mut raw = [0u8; MAX_CB_BYTES];
        let raw = &mut raw[..cb_len];
        mem.read_user(address, raw)?;
        let check = |mem: &mut dyn UserMemory, at: u64, len: u64| match store {
            Store::Checked => mem.check_user_write(at, len),
            Store::Deferred => mem.check_user_read(at, len),
        };
        check(mem, address, cb_len as u64)?;
        let mut fixed = LwpcbFixed::default();
        let fixed_len = fixed.as_slice().len();
        fixed.as_mut_slice().copy_from_slice(&raw[..fixed_len]);
        let mut pairs = [(0u32, 0u32); MAX_EVENT_ID];
        let word = |off: usize| {
            raw.get(off..off + 4)
                .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        for (i, pair) in pairs.iter_mut().enumerate() {
            let off = LoadedLwpcb::interval_offset(caps, i + 1) as usize;
            *pair = (word(off), word(off + 4));
        }
        if let Some(img) = image {
            fixed.flags = img.flags;
            fixed.head = img.head;
            fixed.buffer_base = img.buffer_base;
            fixed.buffer_size_random = img.buffer_size;
            fixed.filters = img.filters;
            for (pair, &counter) in pairs.iter_mut().zip(img.counters.iter()) {
                pair.1 = counter;
            }
        }
        let max = usize::from(caps.max_events()).min(MAX_EVENT_ID);
        let block = LoadedLwpcb::normalize(caps, grant, address, &fixed, &pairs[..max])
            .map_err(|_| GuestFault::GeneralProtection)?;
        if let Store::Checked = store {
            check(mem, block.buffer_base, u64::from(block.buffer_size))?;
        }
        Ok(block)
    }

    /// Writes LLWPCB's normalised fields back into the new block, so software
    /// reads exactly what the unit runs with.
    fn write_back(&self, mem: &mut dyn UserMemory, b: &LoadedLwpcb) -> Result<(), GuestFault> {
        let max = usize::from(self.caps.max_events()).min(MAX_EVENT_ID);
        let mut pairs = [0u8; 8 * MAX_EVENT_ID];
        for (id, chunk) in (1..=max).zip(pairs.chunks_exact_mut(8)) {
            let EventSlot { interval, counter } = b.events[id];
            chunk[..4].copy_from_slice(&to_s26(interval).to_le_bytes());
            chunk[4..].copy_from_slice(&to_s26(counter).to_le_bytes());
        }
        let (flags, size) = (
            b.flags.bits().to_le_bytes(),
            b.buffer_size_word().to_le_bytes(),
        );
        let (head, threshold) = (b.head.to_le_bytes(), b.threshold.to_le_bytes());
        // Only these fields: software owns the others (the tail among them),
        // and another thread may be writing them.
        mem.write_user_fields(
            b.address,
            self.cb_len() as u64,
            &[
                (OFF_FLAGS, &flags),
                (OFF_BUFFER_SIZE, &size),
                (OFF_HEAD, &head),
                (OFF_THRESHOLD, &threshold),
                (
                    LoadedLwpcb::interval_offset(&self.caps, 1),
                    &pairs[..8 * max],
                ),
            ],
        )
    }

    /// Best-effort flush of head, MissedEvents and counters into the LWPCB:
    /// in one call when the whole block may be stored (each page translated
    /// once), else field by field, storing what can be stored.
    fn flush(&mut self, mem: &mut dyn UserMemory) {
        let Some(b) = self.block else { return };
        let max = usize::from(self.caps.max_events()).min(MAX_EVENT_ID);
        let mut counters = [[0u8; 4]; MAX_EVENT_ID];
        for (id, c) in (1..=max).zip(counters.iter_mut()) {
            *c = to_s26(b.events[id].counter).to_le_bytes();
        }
        let (head, missed) = (b.head.to_le_bytes(), b.missed_events.to_le_bytes());
        let mut fields: [(u64, &[u8]); 2 + MAX_EVENT_ID] = [(0, &[]); 2 + MAX_EVENT_ID];
        fields[0] = (OFF_HEAD, &head);
        fields[1] = (OFF_MISSED, &missed);
        for (id, (field, c)) in (1..=max).zip(fields[2..].iter_mut().zip(&counters)) {
            *field = (LoadedLwpcb::interval_offset(&self.caps, id) + 4, c);
        }
        if mem
            .write_user_fields(b.address, self.cb_len() as u64, &fields[..2 + max])
            .is_ok()
        {
            return;
        }
        let mut ok = Self::flush_position(mem, &b);
        for id in 1..=usize::from(self.caps.max_events()).min(MAX_EVENT_ID) {
            let off = LoadedLwpcb::interval_offset(&self.caps, id) + 4;
            ok &= b.address.checked_add(off).is_some_and(|a| {
                mem.write_user(a, &to_s26(b.events[id].counter).to_le_bytes())
                    .is_ok()
            });
        }
        if !ok {
            self.stats.flush_faults += 1;
        }
    }

    /// Writes head and MissedEvents; true when both stores succeeded.
    fn flush_position(mem: &mut dyn UserMemory, b: &LoadedLwpcb) -> bool {
        let mut store = |off: u64, bytes: &[u8]| {
            b.address
                .checked_add(off)
                .is_some_and(|a| mem.write_user(a, bytes).is_ok())
        };
        store(OFF_HEAD, &b.head.to_le_bytes()) & store(OFF_MISSED, &b.missed_events.to_le_bytes())
    }

    /// Counts `n` events of `id` and stores `record` once per crossing.
    fn charge(&mut self, mem: &mut dyn UserMemory, id: EventId, n: u64, record: EventRecord) {
        let Some(enable) = LwpFeatures::for_event(id as u8) else {
            return;
        };
        if n == 0 || !self.effective(enable) {
            return;
        }
        let Some(block) = self.block.as_mut() else {
            return;
        };
        let slot = &mut block.events[id as usize];
        let left = i64::from(slot.counter) - i64::try_from(n).unwrap_or(i64::MAX);
        if left >= 0 {
            slot.counter = left as i32;
            return;
        }
        let period = i64::from(slot.interval.max(0)) + 1;
        let over = -(left + 1);
        let crossings = (over / period + 1) as u64;
        slot.counter = (period - 1 - over % period) as i32;
        let stored = crossings.min(MAX_RECORDS_PER_CHARGE);
        let excess = crossings - stored;
        block.missed_events = block.missed_events.saturating_add(excess);
        self.stats.records_missed += excess;
        for _ in 0..stored {
            self.store(mem, record);
        }
    }

    /// Stores one record at the head of the ring, following the ring rules:
    /// one slot stays free; on a full ring (synchronised mode) the record
    /// overwrites the free slot, the head stays and MissedEvents counts it.
    fn store(&mut self, mem: &mut dyn UserMemory, record: EventRecord) -> Stored {
        let es = self.caps.event_size();
        let continuous = self.effective(LwpFeatures::CONT);
        let interrupt = self.effective(LwpFeatures::INT);
        let Some(b) = self.block.as_mut() else {
            return Stored::Missed;
        };
        let size = b.buffer_size;
        let tail_word = b.address.checked_add(OFF_TAIL).map(|a| read_u32(mem, a));
        let tail = match tail_word {
            Some(Ok(t)) => Some(t - t % es).filter(|&t| t < size),
            _ if continuous => None,
            _ => {
                self.stats.store_faults += 1;
                return Self::miss(b, &mut self.stats);
            }
        };
        let next = (b.head + es) % size;
        let slot = b.buffer_base.checked_add(u64::from(b.head));
        if !continuous && tail.is_none_or(|t| t == next) {
            if let (Some(_), Some(at)) = (tail, slot) {
                let _ = mem.write_user(at, record.as_slice());
            }
            return Self::miss(b, &mut self.stats);
        }
        let written = slot.is_some_and(|at| mem.write_user(at, record.as_slice()).is_ok());
        if !written {
            self.stats.store_faults += 1;
            return Self::miss(b, &mut self.stats);
        }
        self.stats.records_stored += 1;
        if let Some(log) = self.log.as_mut() {
            log.push(record);
        }
        let before = b.head;
        b.head = next;
        if let Some(t) = tail {
            let fill = |h: u32| (h + size - t) % size;
            if interrupt
                && b.threshold > 0
                && fill(before) < b.threshold
                && fill(next) >= b.threshold
            {
                self.interrupt_due = true;
                self.stats.interrupts_due += 1;
                if !Self::flush_position(mem, b) {
                    self.stats.flush_faults += 1;
                }
            }
        }
        Stored::Yes
    }

    fn miss(b: &mut LoadedLwpcb, stats: &mut UnitStats) -> Stored {
        b.missed_events = b.missed_events.saturating_add(1);
        stats.records_missed += 1;
        Stored::Missed
    }
}

#[cfg(test)]
mod tests {
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
}
