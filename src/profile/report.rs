//! `lwpvmm report`: a trace turned into a perf-report-like table (samples
//! per function, symbolised from the guest ELF's symbol table with the
//! `object` crate), folded stacks, and a flamegraph SVG (the `inferno`
//! crate). Stacks are one frame deep: the sampled function. lwpvmm does not
//! unwind guest frame pointers.

use std::collections::BTreeMap;
use std::io::{self, Write};

use object::{Object, ObjectSymbol, SymbolKind};
use thiserror::Error;

use super::trace::TraceRecord;
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

/// Function symbols of a guest ELF, sorted by address.
#[derive(Debug, Default)]
pub struct Symbols {
    functions: Vec<(u64, u64, String)>,
}

impl Symbols {
    /// The function symbols of `elf`. A symbol without a size ends where the
    /// next one starts.
    pub fn from_elf(elf: &[u8]) -> Result<Self, ReportError> {
        let file = object::File::parse(elf)?;
        let mut f: Vec<(u64, u64, String)> = file
            .symbols()
            .filter(|s| s.kind() == SymbolKind::Text && s.is_definition())
            .filter_map(|s| Some((s.address(), s.size(), s.name().ok()?.to_owned())))
            .filter(|(_, _, name)| !name.is_empty())
            .collect();
        f.sort_by_key(|&(a, _, _)| a);
        f.dedup_by_key(|(a, _, _)| *a);
        let starts: Vec<u64> = f.iter().map(|s| s.0).skip(1).chain([u64::MAX]).collect();
        let functions = f
            .into_iter()
            .zip(starts)
            .map(|((a, size, name), next)| {
                let end = if size > 0 {
                    a.saturating_add(size)
                } else {
                    next
                };
                (a, end, name)
            })
            .collect();
        Ok(Symbols { functions })
    }

    /// The function containing `ip`.
    pub fn lookup(&self, ip: u64) -> Option<&str> {
        let i = self.functions.partition_point(|&(a, _, _)| a <= ip);
        let (start, end, name) = self.functions.get(i.checked_sub(1)?)?;
        (*start..*end).contains(&ip).then_some(name.as_str())
    }
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

/// Records counted per EventId and instruction address as a trace streams
/// by: what a report needs, in memory that grows with the number of distinct
/// addresses, not with the trace.
#[derive(Debug, Default)]
pub struct Tally {
    counts: BTreeMap<u8, BTreeMap<u64, u64>>,
}

impl Tally {
    /// Counts one record.
    pub fn add(&mut self, record: &TraceRecord) {
        *self
            .counts
            .entry(record.event)
            .or_default()
            .entry(record.ip)
            .or_default() += 1;
    }

    /// The EventId a report counts by default: CNH (5) when the trace has
    /// it, else RNH (6), else every record.
    pub fn default_event(&self) -> Option<u8> {
        [EventId::Cnh as u8, EventId::Rnh as u8]
            .into_iter()
            .find(|e| self.counts.contains_key(e))
    }

    /// Records of `event` (or all) per function, most first; ties by name.
    pub fn rows(&self, symbols: Option<&Symbols>, event: Option<u8>) -> Vec<Row> {
        let mut counts: BTreeMap<String, u64> = BTreeMap::new();
        let mut total = 0u64;
        for (_, by_ip) in self
            .counts
            .iter()
            .filter(|(e, _)| event.is_none_or(|want| **e == want))
        {
            for (&ip, &n) in by_ip {
                let name = symbols
                    .and_then(|s| s.lookup(ip))
                    .map_or_else(|| format!("{ip:#x}"), str::to_owned);
                *counts.entry(name).or_default() += n;
                total += n;
            }
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

/// What a report counts, in words.
pub fn event_name(event: Option<u8>) -> String {
    match event.map(|e| (e, EventId::from_u8(e))) {
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

/// Folded stacks (one frame deep): `function count` per line.
pub fn folded(rows: &[Row]) -> Vec<String> {
    rows.iter()
        .map(|r| format!("{} {}", r.name, r.samples))
        .collect()
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

    fn rec(event: u8, ip: u64) -> TraceRecord {
        TraceRecord {
            vcpu: 0,
            cr3: 0,
            event,
            core: 0,
            flags: 0,
            data1: 0,
            data2: 0,
            ip,
            timestamp: 0,
        }
    }

    #[test]
    fn symbols_from_an_embedded_guest() {
        let syms = Symbols::from_elf(crate::guests::get("demo").unwrap()).unwrap();
        let main = syms
            .functions
            .iter()
            .find(|f| f.2 == "main")
            .expect("main is a symbol")
            .0;
        assert_eq!(syms.lookup(main), Some("main"));
        assert_eq!(syms.lookup(0), None);
    }

    #[test]
    fn tally_counts_and_orders() {
        let mut tally = Tally::default();
        for r in [
            rec(5, 0x10),
            rec(5, 0x10),
            rec(5, 0x20),
            rec(255, 0x30),
            rec(5, 0x10),
        ] {
            tally.add(&r);
        }
        assert_eq!(tally.default_event(), Some(5));
        let rows = tally.rows(None, Some(5));
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].name.as_str(), rows[0].samples), ("0x10", 3));
        assert!((rows[0].share - 75.0).abs() < 1e-9);
        assert_eq!(folded(&rows), vec!["0x10 3", "0x20 1"]);
        assert_eq!(tally.rows(None, None).len(), 3);
        let mut svg = Vec::new();
        flamegraph(&folded(&rows), "t", &mut svg).unwrap();
        assert!(String::from_utf8(svg).unwrap().contains("<svg"));
    }
}
