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
#[path = "unit_tests.rs"]
mod tests;
