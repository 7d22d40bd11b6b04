//! What the host side keeps of the records the emulated LWP units store:
//! the trace file (`--trace`), the captures the control API runs (each a
//! [`Capture`], up to [`MAX_CAPTURES`] at once), and the executable
//! mappings the guest reported, so that a capture started at any time
//! resolves its frames. Which EventIds go to the trace and the captures,
//! and whether the trace is written, change while the VM runs; the
//! guest's own LWP state and rings are never touched from here.

use std::io;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use thiserror::Error;

use crate::profile::capture::{Capture, MappingTable};
use crate::profile::trace::{KernelLine, MappingLine, TraceRecord, TraceWriter};

/// Captures running at once (pprof requests and a started capture).
pub const MAX_CAPTURES: usize = 4;
/// Of those, the most that TCP clients (`--api-listen`) hold: they can
/// never take the last slot, which is the owner's.
pub const MAX_TCP_CAPTURES: usize = 2;

/// Every LWP EventId: what is recorded unless the API narrows it.
pub const EVENT_IDS: [u8; 7] = [1, 2, 3, 4, 5, 6, 255];

/// A capture's number, to stop it by.
pub type CaptureId = u64;

/// Why a capture did not start.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum CaptureError {
    /// Too many run already.
    #[error("{MAX_CAPTURES} captures are running already: wait for one to end")]
    Busy,
    /// TCP clients hold all the captures they may.
    #[error("{MAX_TCP_CAPTURES} captures over TCP are running already: wait for one to end")]
    TcpBusy,
    /// The VM keeps no records (no trace and no API).
    #[error("this VM keeps no records")]
    Off,
}

/// The recorder of one VM, shared by its vCPUs and its API.
pub struct Recorder {
    trace: Option<Mutex<TraceWriter>>,
    trace_on: AtomicBool,
    /// One bit per EventId: what goes to the trace and the captures.
    events: [AtomicU64; 4],
    captures: Mutex<Vec<(CaptureId, CaptureOwner, Capture)>>,
    capturing: AtomicBool,
    next_id: AtomicU64,
    mappings: Option<Mutex<MappingTable>>,
    sample_hz: AtomicU32,
    /// The sampler kicks every vCPU and each kick stores a host-side sample
    /// of the whole guest (`--profile-kernel`).
    whole_guest: AtomicBool,
    /// Running captures that asked for whole-guest samples.
    kernel_captures: AtomicU32,
    /// The guest kernel's system-call entry (its LSTAR), once a kernel
    /// sample found it set: 0 until then.
    kernel_entry: AtomicU64,
}

/// Who asked for a capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureOwner {
    /// The owner, on the Unix socket.
    Owner,
    /// A TCP client (`--api-listen`).
    Tcp,
}

/// What [`Recorder::records`] did with a batch.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// Records the trace dropped at its size limit.
    pub trace_dropped: u64,
    /// Whether writing the trace failed.
    pub trace_failed: bool,
}

impl Recorder {
    /// A recorder writing `trace` when given, and keeping mappings for
    /// captures when `captures` (the VM has the control API).
    pub fn new(trace: Option<TraceWriter>, captures: bool, sample_hz: u32) -> Self {
        let r = Recorder {
            trace_on: AtomicBool::new(trace.is_some()),
            trace: trace.map(Mutex::new),
            events: Default::default(),
            captures: Mutex::new(Vec::new()),
            capturing: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
            mappings: captures.then(Mutex::default),
            sample_hz: AtomicU32::new(sample_hz),
            whole_guest: AtomicBool::new(false),
            kernel_captures: AtomicU32::new(0),
            kernel_entry: AtomicU64::new(0),
        };
        r.set_events(&EVENT_IDS);
        r
    }

    /// Whether the units must keep their records for this recorder at all.
    pub fn keeps_records(&self) -> bool {
        self.trace.is_some() || self.mappings.is_some()
    }

    /// Whether a record stored now goes anywhere.
    pub fn wants_records(&self) -> bool {
        self.trace_on.load(Ordering::Relaxed) || self.capturing.load(Ordering::Relaxed)
    }

    /// Whether records of `event` go to the trace and the captures.
    pub fn wants(&self, event: u8) -> bool {
        self.events[usize::from(event / 64)].load(Ordering::Relaxed) & (1 << (event % 64)) != 0
    }

    /// The EventIds recorded.
    pub fn events(&self) -> Vec<u8> {
        (0..=255u8).filter(|&e| self.wants(e)).collect()
    }

    /// Records only `events` from now on.
    pub fn set_events(&self, events: &[u8]) {
        let mut bits = [0u64; 4];
        for &e in events {
            bits[usize::from(e / 64)] |= 1 << (e % 64);
        }
        for (slot, b) in self.events.iter().zip(bits) {
            slot.store(b, Ordering::Relaxed);
        }
    }

    /// Whether the trace is written; `None` without a trace file.
    pub fn trace_on(&self) -> Option<bool> {
        self.trace
            .as_ref()
            .map(|_| self.trace_on.load(Ordering::Relaxed))
    }

    /// Pauses or resumes writing the trace; false without a trace file.
    pub fn set_trace(&self, on: bool) -> bool {
        if self.trace.is_none() {
            return false;
        }
        self.trace_on.store(on, Ordering::Relaxed);
        true
    }

    /// The sampler's rate now (the control thread sets it).
    pub fn sample_hz(&self) -> u32 {
        self.sample_hz.load(Ordering::Relaxed)
    }

    /// Notes the sampler's new rate.
    pub fn note_sample_hz(&self, hz: u32) {
        self.sample_hz.store(hz, Ordering::Relaxed);
    }

    /// Whether the sampler takes host-side samples of the whole guest: set
    /// for the VM, or asked for by a running capture.
    pub fn whole_guest(&self) -> bool {
        self.whole_guest.load(Ordering::Relaxed) || self.kernel_captures.load(Ordering::Relaxed) > 0
    }

    /// Starts or stops host-side samples of the whole guest.
    pub fn set_whole_guest(&self, on: bool) {
        self.whole_guest.store(on, Ordering::Relaxed);
    }

    /// Where the guest kernel's system-call entry lies, once known.
    pub fn kernel_entry(&self) -> Option<u64> {
        Some(self.kernel_entry.load(Ordering::Relaxed)).filter(|&e| e != 0)
    }

    /// Notes where the guest kernel's system-call entry lies (its LSTAR),
    /// the first time only: the trace gets a line saying so, from which a
    /// report places a randomised kernel. False when writing it failed.
    pub fn note_kernel_entry(&self, syscall_entry: u64) -> bool {
        if syscall_entry == 0
            || self
                .kernel_entry
                .compare_exchange(0, syscall_entry, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return true;
        }
        let line = KernelLine { syscall_entry };
        match &self.trace {
            Some(trace) => matches!(trace.lock().map(|mut t| t.append_kernel(line)), Ok(Ok(()))),
            None => true,
        }
    }

    /// Takes records a unit stored, already filtered by [`Self::wants`].
    pub fn records(&self, lines: &[TraceRecord]) -> Written {
        let mut written = Written::default();
        if self.capturing.load(Ordering::Relaxed)
            && let Ok(mut captures) = self.captures.lock()
        {
            for (_, _, c) in captures.iter_mut() {
                lines.iter().for_each(|l| c.record(l));
            }
        }
        if let Some(trace) = self
            .trace
            .as_ref()
            .filter(|_| self.trace_on.load(Ordering::Relaxed))
        {
            match trace.lock().map(|mut t| t.append(lines)) {
                Ok(Ok(dropped)) => written.trace_dropped = dropped,
                _ => written.trace_failed = true,
            }
        }
        written
    }

    /// Notes a sampler kick charged to a sampled context: running captures
    /// share its time out over their clock records.
    pub fn charged_kick(&self) {
        if self.capturing.load(Ordering::Relaxed)
            && let Ok(mut captures) = self.captures.lock()
        {
            captures.iter_mut().for_each(|(_, _, c)| c.kicks += 1);
        }
    }

    /// Takes a mapping the guest reported; false when writing it to the
    /// trace failed.
    pub fn mapping(&self, line: &MappingLine) -> bool {
        if let Some(table) = &self.mappings
            && let Ok(mut table) = table.lock()
        {
            table.apply(line);
        }
        if self.capturing.load(Ordering::Relaxed)
            && let Ok(mut captures) = self.captures.lock()
        {
            captures.iter_mut().for_each(|(_, _, c)| c.mapping(line));
        }
        // The trace gets every mapping, also while its records pause: the
        // records after a resume resolve with them.
        match &self.trace {
            Some(trace) => matches!(trace.lock().map(|mut t| t.append_mapping(line)), Ok(Ok(()))),
            None => true,
        }
    }

    /// Starts a capture for `owner`. TCP clients hold at most
    /// [`MAX_TCP_CAPTURES`], and never the last free slot.
    pub fn start_capture(&self, owner: CaptureOwner) -> Result<CaptureId, CaptureError> {
        self.start_capture_with(owner, false)
    }

    /// Starts a capture for `owner` that, with `kernel`, has the sampler
    /// take whole-guest samples while it runs.
    pub fn start_capture_with(
        &self,
        owner: CaptureOwner,
        kernel: bool,
    ) -> Result<CaptureId, CaptureError> {
        let Some(table) = &self.mappings else {
            return Err(CaptureError::Off);
        };
        let mut capture = Capture::new(&*table.lock().map_err(|_| CaptureError::Off)?);
        capture.kernel = kernel;
        let mut captures = self.captures.lock().map_err(|_| CaptureError::Off)?;
        let tcp = captures
            .iter()
            .filter(|(_, o, _)| *o == CaptureOwner::Tcp)
            .count();
        if owner == CaptureOwner::Tcp && tcp >= MAX_TCP_CAPTURES {
            return Err(CaptureError::TcpBusy);
        }
        let limit = match owner {
            CaptureOwner::Owner => MAX_CAPTURES,
            CaptureOwner::Tcp => MAX_CAPTURES - 1,
        };
        if captures.len() >= limit {
            return Err(CaptureError::Busy);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if kernel {
            self.kernel_captures.fetch_add(1, Ordering::Relaxed);
        }
        captures.push((id, owner, capture));
        self.capturing.store(true, Ordering::Relaxed);
        Ok(id)
    }

    /// Ends capture `id` and hands it over; `None` when it is not running.
    pub fn finish_capture(&self, id: CaptureId) -> Option<Capture> {
        let mut captures = self.captures.lock().ok()?;
        let at = captures.iter().position(|(i, _, _)| *i == id)?;
        let (_, _, capture) = captures.swap_remove(at);
        self.capturing
            .store(!captures.is_empty(), Ordering::Relaxed);
        if capture.kernel {
            self.kernel_captures.fetch_sub(1, Ordering::Relaxed);
        }
        Some(capture)
    }

    /// Captures running.
    pub fn running(&self) -> usize {
        self.captures.lock().map_or(0, |c| c.len())
    }

    /// Records counted by capture `id` so far.
    pub fn capture_records(&self, id: CaptureId) -> Option<u64> {
        let captures = self.captures.lock().ok()?;
        captures
            .iter()
            .find(|(i, _, _)| *i == id)
            .map(|(_, _, c)| c.records)
    }

    /// Flushes the trace.
    pub fn flush(&self) -> io::Result<()> {
        match &self.trace {
            Some(t) => t
                .lock()
                .map_err(|_| io::Error::other("the trace's lock is poisoned"))?
                .flush(),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(event: u8) -> TraceRecord {
        TraceRecord::stacked(event, 0x1000, 0x40_0000, &[])
    }

    #[test]
    fn events_are_chosen_by_id() {
        let r = Recorder::new(None, true, 0);
        assert_eq!(r.events(), EVENT_IDS, "every EventId by default");
        // (EventIds set, ids wanted, ids not)
        let table: &[(&[u8], &[u8], &[u8])] = &[
            (&[5, 6], &[5, 6], &[1, 255]),
            (&[255], &[255], &[5, 63, 64]),
            (&[], &[], &[0, 5, 255]),
            (&[1, 2, 3, 4, 5, 6, 255], &[1, 6, 255], &[0, 7, 63, 64, 128]),
        ];
        for (set, yes, no) in table {
            r.set_events(set);
            assert!(yes.iter().all(|&e| r.wants(e)), "{set:?}");
            assert!(!no.iter().any(|&e| r.wants(e)), "{set:?}");
            assert_eq!(r.events(), set.to_vec());
        }
    }

    #[test]
    fn captures_run_side_by_side_and_end_apart() {
        let r = Recorder::new(None, true, 0);
        assert!(!r.wants_records());
        let a = r.start_capture(CaptureOwner::Owner).unwrap();
        r.records(&[record(5)]);
        let b = r.start_capture(CaptureOwner::Owner).unwrap();
        r.records(&[record(5), record(5)]);
        assert_eq!(r.capture_records(a), Some(3));
        assert_eq!(r.finish_capture(b).map(|c| c.records), Some(2));
        assert!(r.wants_records(), "a still runs");
        assert_eq!(r.finish_capture(a).map(|c| c.records), Some(3));
        assert!(!r.wants_records());
        assert!(r.finish_capture(a).is_none(), "once");
        let ids: Vec<_> = (0..MAX_CAPTURES)
            .map(|_| r.start_capture(CaptureOwner::Owner))
            .collect();
        assert!(ids.iter().all(Result::is_ok));
        assert_eq!(
            r.start_capture(CaptureOwner::Owner),
            Err(CaptureError::Busy)
        );
        assert_eq!(
            Recorder::new(None, false, 0).start_capture(CaptureOwner::Owner),
            Err(CaptureError::Off)
        );
    }

    #[test]
    fn tcp_clients_never_take_the_owners_slot() {
        use CaptureOwner::{Owner, Tcp};
        // (captures asked for in order, what each gets)
        let table: &[&[(CaptureOwner, Result<(), CaptureError>)]] = &[
            &[
                (Tcp, Ok(())),
                (Tcp, Ok(())),
                (Tcp, Err(CaptureError::TcpBusy)),
                (Tcp, Err(CaptureError::TcpBusy)),
                (Owner, Ok(())),
                (Owner, Ok(())),
                (Owner, Err(CaptureError::Busy)),
            ],
            &[
                (Owner, Ok(())),
                (Owner, Ok(())),
                (Tcp, Ok(())),
                (Tcp, Err(CaptureError::Busy)),
                (Owner, Ok(())),
            ],
        ];
        for (n, asks) in table.iter().enumerate() {
            let r = Recorder::new(None, true, 0);
            for (i, (owner, want)) in asks.iter().enumerate() {
                let got = r.start_capture(*owner).map(|_| ());
                assert_eq!(&got, want, "case {n}, ask {i}");
            }
        }
    }

    #[test]
    fn a_capture_starts_from_the_mappings_reported_before_it() {
        let r = Recorder::new(None, true, 0);
        let line = MappingLine {
            cr3: 0x1000,
            start: 0x40_0000,
            end: 0x41_0000,
            offset: 0,
            path: "/lwp-hot".into(),
            build_id: String::new(),
            first: true,
            process: None,
        };
        assert!(r.mapping(&line));
        let id = r.start_capture(CaptureOwner::Owner).unwrap();
        r.records(&[record(5)]);
        let mut resolver = crate::profile::objects::Resolver::new(None, None);
        let tally = r.finish_capture(id).unwrap().tally(&mut resolver);
        let top = tally.stacks(None).next().unwrap();
        assert_eq!(
            resolver.objects[top.frames[0].object as usize].path,
            "/lwp-hot"
        );
    }

    #[test]
    fn a_paused_trace_is_not_written() {
        let path = std::env::temp_dir().join(format!("lwpvmm-recorder-{}", std::process::id()));
        let header = crate::profile::trace::TraceHeader {
            lwpvmm_trace: crate::profile::trace::TRACE_VERSION,
            profile: "emulated".into(),
            sample_hz: 0,
        };
        let writer =
            TraceWriter::new(std::fs::File::create(&path).unwrap(), &header, u64::MAX).unwrap();
        let r = Recorder::new(Some(writer), false, 0);
        let count = |r: &Recorder| {
            r.flush().unwrap();
            let mut n = 0;
            crate::profile::trace::for_each_record(&path, |_| {}, |_| n += 1).unwrap();
            n
        };
        // (trace on, records then in the file)
        for (on, want) in [(true, 1), (false, 1), (true, 2)] {
            assert!(r.set_trace(on));
            assert_eq!(r.trace_on(), Some(on));
            r.records(&[record(5)]);
            assert_eq!(count(&r), want, "trace {on}");
        }
        let _ = std::fs::remove_file(&path);
        let without = Recorder::new(None, true, 0);
        assert_eq!(without.trace_on(), None);
        assert!(!without.set_trace(true), "no trace file to resume");
    }
}
