//! `lwpvmm report`: a trace read line by line into a table of records per
//! function, folded stacks and a flamegraph. The output files are checked
//! before the trace is read, and left untouched when there is nothing to
//! write.

use std::fs::{File, OpenOptions};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use crate::lwp::record::EventId;
use crate::profile::report::{self, Symbols, Tally};
use crate::profile::trace::{self, TraceSummary};

use super::{CliError, ReportArgs, read};

/// An output file opened before the work that fills it: created if missing
/// (and removed again if nothing is written), an existing one untouched
/// until the content is ready.
struct PendingFile {
    flag: &'static str,
    path: PathBuf,
    file: File,
    created: bool,
}

impl PendingFile {
    fn open(flag: &'static str, path: &Path) -> Result<Self, CliError> {
        let created = !path.exists();
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|source| CliError::OutputPath {
                flag,
                path: path.to_owned(),
                source,
            })?;
        Ok(PendingFile {
            flag,
            path: path.to_owned(),
            file,
            created,
        })
    }

    /// Replaces the content with what `fill` writes.
    fn commit(
        mut self,
        fill: impl FnOnce(&mut File) -> Result<(), CliError>,
    ) -> Result<(), CliError> {
        let (flag, path) = (self.flag, self.path.clone());
        let fail = |source| CliError::OutputPath { flag, path, source };
        self.file.set_len(0).map_err(fail)?;
        fill(&mut self.file)
    }

    /// Leaves no trace of a file this command created.
    fn abandon(self) {
        if self.created {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// `lwpvmm report`.
pub fn report(out: &mut dyn Write, args: &ReportArgs) -> Result<u8, CliError> {
    if let Some(e) = args.event
        && EventId::from_u8(e).is_none()
    {
        return Err(CliError::UnknownEvent(e));
    }
    let folded_file = args
        .folded
        .as_deref()
        .map(|p| PendingFile::open("--folded", p))
        .transpose()?;
    let svg_file = args
        .svg
        .as_deref()
        .map(|p| PendingFile::open("--svg", p))
        .transpose()?;
    let symbols = match &args.symbols {
        Some(path) => Some(Symbols::from_elf(&read("symbol file", path)?)?),
        None => None,
    };
    let terminal = std::io::stderr().is_terminal();
    let (summary, tally) = tally(&args.trace, |n| {
        if terminal {
            eprint!("\rreading {}: {n} records", args.trace.display());
        }
    });
    if terminal {
        eprint!("\r\x1b[K");
    }
    let summary = summary?;
    warn_incomplete(&args.trace, &summary);
    let event = args.event.or_else(|| tally.default_event());
    let rows = tally.rows(symbols.as_ref(), event);
    writeln!(
        out,
        "# trace {} (profile `{}`, sampler {} Hz)",
        args.trace.display(),
        summary.header.profile,
        summary.header.sample_hz
    )?;
    report::print_table(out, &rows, event, args.top)?;
    let folded = report::folded(&rows);
    if rows.is_empty() && (folded_file.is_some() || svg_file.is_some()) {
        for f in [folded_file, svg_file].into_iter().flatten() {
            f.abandon();
        }
        return Err(CliError::NothingToDraw(report::event_name(event)));
    }
    if let Some(f) = folded_file {
        f.commit(|file| Ok(file.write_all((folded.join("\n") + "\n").as_bytes())?))?;
    }
    if let Some(f) = svg_file {
        let title = format!("lwpvmm: {}", args.trace.display());
        f.commit(|file| Ok(report::flamegraph(&folded, &title, file)?))?;
    }
    Ok(0)
}

/// Reads a trace into a tally, streaming.
fn tally(path: &Path, progress: impl FnMut(usize)) -> (Result<TraceSummary, CliError>, Tally) {
    let mut tally = Tally::default();
    let summary = trace::for_each_record(path, progress, |r| tally.add(r)).map_err(Into::into);
    (summary, tally)
}

fn warn_incomplete(path: &Path, summary: &TraceSummary) {
    if let Some(line) = summary.cut_line {
        log::warn!(
            "{}: line {line} is cut short (was the run killed?); reporting the {} complete records before it",
            path.display(),
            summary.records
        );
    }
    if let Some(limit) = summary.limit {
        log::warn!(
            "{}: the trace reached its size limit of {} bytes (--trace-max); later records are not in it",
            path.display(),
            limit.max_bytes
        );
    }
}

/// Prints the report of a trace, named with `elf`'s symbols (the demo and
/// `lwpvmm profile`).
pub fn trace_report(
    out: &mut dyn Write,
    trace_file: &Path,
    elf: &[u8],
    top: usize,
) -> Result<(), CliError> {
    let (summary, tally) = tally(trace_file, |_| {});
    warn_incomplete(trace_file, &summary?);
    let symbols = Symbols::from_elf(elf).ok();
    let event = tally.default_event();
    let rows = tally.rows(symbols.as_ref(), event);
    report::print_table(out, &rows, event, top)?;
    Ok(())
}
