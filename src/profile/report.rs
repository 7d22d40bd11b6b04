//! `lwpvmm report`: a trace turned into a perf-report-like table (samples
//! per function, named by [`super::objects`]), folded stacks, a flamegraph
//! SVG (the `inferno` crate) and a pprof profile ([`super::pprof`]). A
//! record's stack is its instruction address and the return addresses the
//! trace has for it (`stack`, unwound by frame pointers); a return address
//! is named by the call before it.

use std::collections::BTreeMap;
use std::io::{self, Write};

use thiserror::Error;

use super::objects::{Frame, Resolver};
use super::trace::{GUEST_CPU, Process, TraceRecord};
use crate::lwp::record::EventId;

/// Why a report cannot be made.
#[derive(Debug, Error)]
pub enum ReportError {
    /// The symbol file is not an ELF object.
    #[error("cannot read symbols: {0}")]
    Symbols(#[from] object::Error),
    /// The SVG could not be written.
    #[error("cannot write the flamegraph: {0}")]
    Flamegraph(io::Error),
    /// Output failed.
    #[error("cannot write the report: {0}")]
    Output(#[from] io::Error),
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The function (or the address when it has no symbol).
    pub name: String,
    /// Records attributed to it.
    pub samples: u64,
    /// Its share of all counted records, in percent.
    pub share: f64,
}

/// Records counted per EventId and stack as a trace streams by: what a
/// report needs, in memory that grows with the number of distinct stacks,
/// not with the trace.
#[derive(Debug, Default)]
pub struct Tally {
    /// EventId -> stack -> records.
    counts: BTreeMap<u8, BTreeMap<StackKey, u64>>,
    /// The processes the records ran in, each once.
    processes: Vec<Process>,
}

/// What one count is of: the CR3, the process that ran in it (an index
/// into [`Tally`]'s processes), and the stack (the record's frame, then its
/// callers, innermost first).
type StackKey = (u64, Option<usize>, Vec<Frame>);

/// One counted stack.
#[derive(Debug, Clone, Copy)]
pub struct Counted<'a> {
    /// Its EventId.
    pub event: u8,
    /// The address space it was stored in.
    pub cr3: u64,
    /// The process that ran in it then, when the guest said.
    pub process: Option<&'a Process>,
    /// The record's frame, then its callers.
    pub frames: &'a [Frame],
    /// How many records.
    pub count: u64,
}

impl Tally {
    /// Counts one record (a whole-guest sample as its periods), its
    /// addresses resolved by `resolver` as the trace stands at this record.
    /// A record interrupted in a function without a frame gets its caller
    /// from the word at the stack pointer
    /// ([`super::objects::Symbols::frameless_caller`]).
    pub fn add(&mut self, record: &TraceRecord, resolver: &Resolver) {
        self.add_n(record, resolver, record.weight());
    }

    /// Counts `n` records like `record` at once (a capture's stacks).
    pub fn add_n(&mut self, record: &TraceRecord, resolver: &Resolver, n: u64) {
        let leaf = resolver.frame(record.cr3, record.ip);
        let caller = record.top.and_then(|top| {
            let frame = resolver.frame(record.cr3, top);
            let symbols = resolver.symbols(leaf)?;
            (frame.object == leaf.object)
                .then(|| symbols.frameless_caller(leaf.address, frame.address))
                .flatten()
                .map(|_| frame)
        });
        let stack: Vec<Frame> = std::iter::once(leaf)
            .chain(caller)
            .chain(record.stack.iter().map(|&a| resolver.frame(record.cr3, a)))
            .collect();
        // The process as the trace stands at this record: a CR3 reused by a
        // later process names that one only from its report on.
        let process = resolver.process(record.cr3).map(|p| {
            match self.processes.iter().position(|known| known == p) {
                Some(i) => i,
                None => {
                    self.processes.push(p.clone());
                    self.processes.len() - 1
                }
            }
        });
        // A trace is outside input: its weights add without overflowing.
        let count = self
            .counts
            .entry(record.event)
            .or_default()
            .entry((record.cr3, process, stack))
            .or_default();
        *count = count.saturating_add(n);
    }

    /// The stacks of `event` (or of every EventId) with their counts.
    pub fn stacks(&self, event: Option<u8>) -> impl Iterator<Item = Counted<'_>> {
        self.counts
            .iter()
            .filter(move |(e, _)| event.is_none_or(|want| **e == want))
            .flat_map(move |(&event, stacks)| {
                stacks
                    .iter()
                    .map(move |((cr3, process, frames), &count)| Counted {
                        event,
                        cr3: *cr3,
                        process: process.map(|i| &self.processes[i]),
                        frames,
                        count,
                    })
            })
    }

    /// The EventIds the trace has.
    pub fn events(&self) -> impl Iterator<Item = u8> + '_ {
        self.counts.keys().copied()
    }

    /// The EventId a report counts by default: CNH (5) when the trace has
    /// it, else RNH (6), else the whole-guest samples (0), else every
    /// record.
    pub fn default_event(&self) -> Option<u8> {
        [EventId::Cnh as u8, EventId::Rnh as u8, GUEST_CPU]
            .into_iter()
            .find(|e| self.counts.contains_key(e))
    }

    /// Whether a frame is a guest-kernel address no object names.
    pub fn has_unnamed_kernel_frames(&self) -> bool {
        self.counts
            .values()
            .flat_map(BTreeMap::keys)
            .any(|(_, _, frames)| {
                frames
                    .iter()
                    .any(|f| f.object == Frame::RAW && Resolver::is_kernel(f.address))
            })
    }

    /// Records of `event` (or all) whose innermost frame is a user address
    /// no object covers: code outside every mapping the guest reported for
    /// its address space (a guest without the module, a process that ran
    /// before the module loaded, or code mapped after the report: a
    /// program's exec is reported, libraries its loader maps later are not
    /// until its first LWP instruction). Their frames stay addresses.
    pub fn unreported_user(&self, event: Option<u8>) -> u64 {
        self.stacks(event)
            .filter(|c| {
                c.frames
                    .first()
                    .is_some_and(|f| f.object == Frame::RAW && !Resolver::is_kernel(f.address))
            })
            .map(|c| c.count)
            .fold(0, u64::saturating_add)
    }

    /// What [`Self::unreported_user`] means for a reader, when there are
    /// any: the sentence a report prints and a profile carries.
    pub fn unreported_user_note(&self, event: Option<u8>) -> Option<String> {
        match self.unreported_user(event) {
            0 => None,
            n => Some(format!(
                "{n} records are in user code outside every executable mapping the guest reported, so their frames are addresses: the guest module reports each process's mappings after its exec (and again at its first LWP instruction); a guest without the module, a process started before it loaded, or a library mapped after the report is not named"
            )),
        }
    }

    /// Records of `event` (or all) per function, most first; ties by name.
    pub fn rows(&self, resolver: &Resolver, event: Option<u8>) -> Vec<Row> {
        let mut counts: BTreeMap<String, u64> = BTreeMap::new();
        let mut total = 0u64;
        for c in self.stacks(event) {
            *counts.entry(resolver.name(c.frames[0], false)).or_default() += c.count;
            total += c.count;
        }
        let mut rows: Vec<Row> = counts
            .into_iter()
            .map(|(name, samples)| Row {
                name,
                samples,
                share: 100.0 * samples as f64 / total.max(1) as f64,
            })
            .collect();
        rows.sort_by(|a, b| b.samples.cmp(&a.samples).then_with(|| a.name.cmp(&b.name)));
        rows
    }
}

/// A short name of what records of `event` count: a pprof sample type.
pub fn event_label(event: u8) -> String {
    if event == GUEST_CPU {
        return "guest_cpu_samples".into();
    }
    match EventId::from_u8(event) {
        Some(EventId::Val) => "lwpval".into(),
        Some(EventId::Ire) => "instructions".into(),
        Some(EventId::Bre) => "branches".into(),
        Some(EventId::Dme) => "dcache_misses".into(),
        Some(EventId::Cnh) => "cpu_clocks".into(),
        Some(EventId::Rnh) => "ref_clocks".into(),
        Some(EventId::Ins) => "lwpins".into(),
        None => format!("event_{event}"),
    }
}

/// What a report counts, in words.
pub fn event_name(event: Option<u8>) -> String {
    match event.map(|e| (e, EventId::from_u8(e))) {
        Some((GUEST_CPU, _)) => {
            "host samples of the whole guest, kernel and processes (--profile-kernel)".to_owned()
        }
        Some((e, Some(EventId::Val))) => format!("EventId {e} (LWPVAL samples)"),
        Some((e, Some(EventId::Ire))) => format!("EventId {e} (instructions retired)"),
        Some((e, Some(EventId::Bre))) => format!("EventId {e} (branches retired)"),
        Some((e, Some(EventId::Dme))) => format!("EventId {e} (data-cache misses)"),
        Some((e, Some(EventId::Cnh))) => format!("EventId {e} (CPU clocks not halted, sampled)"),
        Some((e, Some(EventId::Rnh))) => {
            format!("EventId {e} (reference clocks not halted, sampled)")
        }
        Some((e, Some(EventId::Ins))) => format!("EventId {e} (LWPINS events)"),
        Some((e, None)) => format!("EventId {e}"),
        None => "every EventId".to_owned(),
    }
}

/// Prints the table.
pub fn print_table(
    out: &mut dyn Write,
    rows: &[Row],
    event: Option<u8>,
    limit: usize,
) -> io::Result<()> {
    let total: u64 = rows.iter().map(|r| r.samples).sum();
    writeln!(out, "# {total} records of {}", event_name(event))?;
    writeln!(out, "{:>10} {:>8}  function", "samples", "share")?;
    for r in rows.iter().take(limit) {
        writeln!(out, "{:>10} {:>7.2}%  {}", r.samples, r.share, r.name)?;
    }
    if rows.len() > limit {
        writeln!(out, "# ... {} more functions", rows.len() - limit)?;
    }
    Ok(())
}

/// Folded stacks, outermost frame first: `caller;...;function count` per
/// line, one line per distinct stack, sorted. A stack of a process the
/// guest named starts with it (`name[pid]`), so a flame graph's roots say
/// who ran.
pub fn folded(tally: &Tally, resolver: &Resolver, event: Option<u8>) -> Vec<String> {
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    for c in tally.stacks(event) {
        let frames: Vec<String> = c
            .process
            .map(Process::to_string)
            .into_iter()
            .chain(
                c.frames
                    .iter()
                    .enumerate()
                    .rev()
                    .map(|(i, &f)| resolver.name(f, i > 0)),
            )
            .collect();
        *lines.entry(frames.join(";")).or_default() += c.count;
    }
    lines.into_iter().map(|(s, n)| format!("{s} {n}")).collect()
}

/// A flamegraph SVG of the folded stacks.
pub fn flamegraph(folded: &[String], title: &str, out: impl Write) -> Result<(), ReportError> {
    let mut options = inferno::flamegraph::Options::default();
    options.title = title.to_owned();
    inferno::flamegraph::from_lines(&mut options, folded.iter().map(String::as_str), out)
        .map_err(ReportError::Flamegraph)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::objects::Symbols;
    use crate::profile::trace::MappingLine;

    fn rec(event: u8, ip: u64) -> TraceRecord {
        stacked(event, ip, &[])
    }

    fn stacked(event: u8, ip: u64, stack: &[u64]) -> TraceRecord {
        TraceRecord::stacked(event, 0, ip, stack)
    }

    #[test]
    fn tally_counts_and_orders() {
        let none = Resolver::default();
        let mut tally = Tally::default();
        for r in [
            rec(5, 0x10),
            rec(5, 0x10),
            rec(5, 0x20),
            rec(255, 0x30),
            rec(5, 0x10),
        ] {
            tally.add(&r, &none);
        }
        assert_eq!(tally.default_event(), Some(5));
        let rows = tally.rows(&none, Some(5));
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].name.as_str(), rows[0].samples), ("0x10", 3));
        assert!((rows[0].share - 75.0).abs() < 1e-9);
        assert_eq!(folded(&tally, &none, Some(5)), vec!["0x10 3", "0x20 1"]);
        assert_eq!(tally.rows(&none, None).len(), 3);
        let mut svg = Vec::new();
        flamegraph(&folded(&tally, &none, Some(5)), "t", &mut svg).unwrap();
        assert!(String::from_utf8(svg).unwrap().contains("<svg"));
    }

    #[test]
    fn stacks_fold_outermost_first_and_name_return_addresses_by_their_call() {
        let syms = Resolver::with_symbols(Symbols::from_functions(&[
            (0x100, 0x200, "leaf", true),
            (0x200, 0x300, "caller", true),
            (0x300, 0x400, "outer", true),
        ]));
        let mut tally = Tally::default();
        // A return address just past the caller's end still names the
        // caller: the call is the byte before it.
        for r in [
            stacked(5, 0x110, &[0x300, 0x350]),
            stacked(5, 0x120, &[0x300, 0x350]),
            stacked(5, 0x110, &[0x250]),
            rec(5, 0x500),
        ] {
            tally.add(&r, &syms);
        }
        assert_eq!(
            folded(&tally, &syms, Some(5)),
            vec!["0x500 1", "caller;leaf 1", "outer;caller;leaf 2"]
        );
        let rows = tally.rows(&syms, Some(5));
        assert_eq!((rows[0].name.as_str(), rows[0].samples), ("leaf", 3));
    }

    #[test]
    fn processes_root_their_stacks_as_the_trace_stood_at_each_record() {
        use crate::profile::objects::mapping;
        let mut r = Resolver::default();
        let mut tally = Tally::default();
        let named = |cr3, pid, name: &str| MappingLine {
            process: Some(Process {
                pid,
                name: name.into(),
            }),
            ..mapping(cr3, 0x40_0000, "/x", true)
        };
        // (a mapping reported before the record, the record's CR3 and IP)
        let steps = [
            (None, 0x1000, 0x40_0010),
            (Some(named(0x1000, 7, "sh")), 0x1000, 0x40_0010),
            (None, 0x1000, 0x40_0010),
            // The CR3 reused by another program: its name from its report.
            (Some(named(0x1000, 9, "lwp-hot")), 0x1000, 0x40_0010),
            // Outside every reported mapping.
            (None, 0x2000, 0x40_0010),
        ];
        for (line, cr3, ip) in steps {
            if let Some(line) = line {
                r.mapping(&line);
            }
            tally.add(&TraceRecord::stacked(5, cr3, ip, &[]), &r);
        }
        // The file /x is not read (no sysroot): its frames are addresses,
        // under their process.
        assert_eq!(
            folded(&tally, &r, Some(5)),
            ["0x400010 2", "lwp-hot[9];0x400010 1", "sh[7];0x400010 2"]
        );
        // The first record (before any report) and the last.
        assert_eq!(tally.unreported_user(Some(5)), 2);
        let note = tally.unreported_user_note(Some(5)).unwrap();
        assert!(
            note.starts_with("2 records are in user code outside"),
            "{note}"
        );
    }
}
