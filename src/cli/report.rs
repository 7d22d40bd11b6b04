//! `lwpvmm report`: a trace read line by line into a table of records per
//! function, folded stacks and a flamegraph. The output files are checked
//! before the trace is read, and left untouched when there is nothing to
//! write.

use std::fs::File;
use std::io::{IsTerminal, Write};
use std::path::Path;

use crate::hostfs::Rewrite;
use crate::lwp::record::EventId;
use crate::profile::objects::{Resolver, Symbols, read_kernel_symbols};
use crate::profile::pprof;
use crate::profile::report::{self, ReportError, Tally};
use crate::profile::sysroot::Sysroot;
use crate::profile::trace::{self, Entry, GUEST_CPU, TraceSummary};

use super::{CliError, MAX_NAMED_FILE, ReportArgs, read};

/// An output file of the report: checked when the command starts (its
/// directory takes a new file), written under a fresh name and renamed
/// over the path once its content is ready (`crate::hostfs::Rewrite`), so
/// an existing file stays untouched until then and a link planted at the
/// path is replaced, not written through.
struct PendingFile {
    flag: &'static str,
    file: Rewrite,
}

impl PendingFile {
    fn open(flag: &'static str, path: &Path) -> Result<Self, CliError> {
        let file = Rewrite::new(path).map_err(|source| CliError::OutputFile { flag, source })?;
        Ok(PendingFile { flag, file })
    }

    /// Writes what `fill` writes as the file's new content.
    fn commit(self, fill: impl FnOnce(&mut File) -> Result<(), CliError>) -> Result<(), CliError> {
        let flag = self.flag;
        let fail = |source| CliError::OutputFile { flag, source };
        let mut new = self.file.begin().map_err(fail)?;
        fill(new.file_mut())?;
        new.commit().map_err(fail)
    }
}

/// `lwpvmm report`.
pub fn report(out: &mut dyn Write, args: &ReportArgs) -> Result<u8, CliError> {
    if let Some(e) = args.event
        && e != GUEST_CPU
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
    let pprof_file = args
        .pprof
        .as_deref()
        .map(|p| PendingFile::open("--pprof", p))
        .transpose()?;
    let elf = args
        .symbols
        .as_ref()
        .map(|path| {
            read(
                "symbol file",
                path,
                MAX_NAMED_FILE,
                "the most read of a symbol file",
            )
        })
        .transpose()?;
    if let Some(elf) = &elf {
        Symbols::from_elf(elf).map_err(ReportError::Symbols)?;
    }
    let sysroot = args
        .sysroot
        .as_deref()
        .map(Sysroot::open)
        .transpose()?
        .map(std::sync::Arc::new);
    let mut resolver = Resolver::new(
        args.symbols
            .as_ref()
            .zip(elf.as_deref())
            .map(|(path, elf)| (path.display().to_string(), elf)),
        sysroot,
    );
    if let Some(path) = &args.kernel_symbols {
        let bytes = read_kernel_symbols(path).map_err(|source| CliError::KernelSymbols {
            path: path.clone(),
            source,
        })?;
        resolver.set_kernel(&path.display().to_string(), &bytes);
    }
    let terminal = std::io::stderr().is_terminal();
    let (summary, tally) = tally(&args.trace, &mut resolver, |n| {
        if terminal {
            eprint!("\rreading {}: {n} records", args.trace.display());
        }
    });
    if terminal {
        eprint!("\r\x1b[K");
    }
    let summary = summary?;
    warn_incomplete(&args.trace, &summary);
    if args.sysroot.is_none() && args.symbols.is_none() && resolver.has_mappings() {
        log::warn!(
            "the trace names the guest's executable files, but without --sysroot their frames are addresses: give --sysroot DIR (the guest's files) or --sysroot INITRAMFS (the initramfs it booted)"
        );
    }
    if let Some(root) = &args.sysroot
        && !resolver.missing.is_empty()
    {
        let names: Vec<String> = resolver
            .missing
            .iter()
            .map(|(path, why)| format!("{path} ({why})"))
            .collect();
        let more = match resolver.missing_more {
            0 => String::new(),
            n => format!(" and {n} more"),
        };
        log::warn!(
            "{} guest files were not read from {}, their frames are addresses: {}{more}",
            names.len() as u64 + resolver.missing_more,
            root.display(),
            names.join(", ")
        );
    }
    if args.kernel_symbols.is_none() && tally.has_unnamed_kernel_frames() {
        log::warn!(
            "the trace has samples of the guest kernel, whose frames are addresses: give --kernel-symbols (the kernel's vmlinux, or a copy of its /proc/kallsyms)"
        );
    }
    let event = args
        .kernel
        .then_some(GUEST_CPU)
        .or(args.event)
        .or_else(|| tally.default_event());
    if let Some(note) = tally.unreported_user_note(event) {
        log::warn!("{note}");
    }
    let rows = tally.rows(&resolver, event);
    writeln!(
        out,
        "# trace {} (profile `{}`, sampler {} Hz)",
        args.trace.display(),
        summary.header.profile,
        summary.header.sample_hz
    )?;
    report::print_table(out, &rows, event, args.top)?;
    let folded = report::folded(&tally, &resolver, event);
    if rows.is_empty() && (folded_file.is_some() || svg_file.is_some() || pprof_file.is_some()) {
        for f in [folded_file, svg_file, pprof_file].into_iter().flatten() {
            drop(f);
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
    if let Some(f) = pprof_file {
        // The run's span: the trace was created at its start and last
        // written at its end.
        let nanos = |t: std::io::Result<std::time::SystemTime>| {
            t.ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        };
        let meta = std::fs::metadata(&args.trace).ok();
        let end = meta.as_ref().and_then(|m| nanos(m.modified()));
        let start = meta.as_ref().and_then(|m| nanos(m.created()));
        let timing = pprof::Timing {
            time_nanos: start.or(end).unwrap_or(0),
            duration_nanos: start.zip(end).map_or(0, |(s, e)| (e - s).max(0)),
            sample_hz: summary.header.sample_hz,
            kicks: None,
            vcpus: summary.vcpus,
        };
        let profile = pprof::profile(&tally, &resolver, timing, "the host-side trace");
        f.commit(|file| Ok(pprof::write(&profile, file)?))?;
    }
    Ok(0)
}

/// Reads a trace into a tally, streaming; its mapping lines go to
/// `resolver` as they come, so each record is named as its address space
/// stood then.
fn tally(
    path: &Path,
    resolver: &mut Resolver,
    progress: impl FnMut(usize),
) -> (Result<TraceSummary, CliError>, Tally) {
    let mut tally = Tally::default();
    let summary = trace::for_each_entry(path, progress, |e| match e {
        Entry::Record(r) => tally.add(r, resolver),
        Entry::Mapping(m) => resolver.mapping(m),
        Entry::Kernel(k) => {
            resolver.kernel_entry(k.syscall_entry);
        }
    })
    .map_err(Into::into);
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
    let mut resolver = Resolver::new(Some((String::new(), elf)), None);
    let (summary, tally) = tally(trace_file, &mut resolver, |_| {});
    warn_incomplete(trace_file, &summary?);
    let event = tally.default_event();
    let rows = tally.rows(&resolver, event);
    report::print_table(out, &rows, event, top)?;
    Ok(())
}
