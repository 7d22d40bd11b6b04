//! The host-side trace: every record an emulated LWP unit stores, with the
//! vCPU and the address space (CR3) it was stored for, as JSON lines; and
//! with `--profile-kernel`, the host's own samples of the whole guest
//! (EventId [`GUEST_CPU`]), which are never LWP records.
//!
//! JSON lines because a trace is appended to while the VM runs, read by
//! people with standard tools (`jq`, `grep`) as often as by `lwpvmm report`,
//! and versioned by its first line: `{"lwpvmm_trace":1,...}`. A binary format
//! would be smaller; a profile of a few seconds is a few MiB either way.
//! A trace is capped in size (the writer's limit), and read line by line, so
//! that neither writing nor reading one grows without bound.

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::lwp::record::EventRecord;

/// The trace format version: 2 added the line that ends a trace at its
/// size limit, 3 the call stack of a record, 4 the host's samples of the
/// whole guest ([`GUEST_CPU`], `kernel`), 5 the kernel's line
/// ([`KernelLine`]).
pub const TRACE_VERSION: u32 = 5;

/// The EventId of a host-side sample of the whole guest (`--profile-kernel`):
/// 0, which LWP reserves and never stores. Such a line is what the sampler's
/// kick found: the vCPU's RIP (`ip`), its stack, whether it ran the kernel
/// (`kernel`), and the guest time it stands for: `data1` sampling periods
/// of `data2` nanoseconds each. The guest's LWP state is not involved.
pub const GUEST_CPU: u8 = 0;

/// The first line of a trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceHeader {
    /// Always [`TRACE_VERSION`] for this format.
    pub lwpvmm_trace: u32,
    /// The LWP profile the VM ran with.
    pub profile: String,
    /// The sampler's rate (0: off).
    pub sample_hz: u32,
}

/// One stored record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceRecord {
    /// The vCPU whose unit stored it.
    pub vcpu: u8,
    /// CR3 (address bits) when it was stored.
    pub cr3: u64,
    /// EventId.
    pub event: u8,
    /// CoreId.
    pub core: u8,
    /// EventFlags.
    pub flags: u16,
    /// Data1.
    pub data1: u32,
    /// Data2.
    pub data2: u64,
    /// InstructionAddress.
    pub ip: u64,
    /// TimeStamp (0 without PTSC).
    pub timestamp: u64,
    /// The return addresses of the interrupted context's stack, innermost
    /// first, unwound by frame pointers (sampled, LWPINS and LWPVAL records;
    /// absent where nothing was found).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stack: Vec<u64>,
    /// The word at the stack pointer, with a stack: the return address
    /// when the interrupted function has no frame of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top: Option<u64>,
    /// A host-side sample ([`GUEST_CPU`]) taken at CPL0: `ip` and `stack`
    /// are the guest kernel's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kernel: bool,
}

impl TraceRecord {
    /// How many samples this line counts as: a whole-guest sample's
    /// periods (at least one), one for an LWP record.
    pub fn weight(&self) -> u64 {
        if self.event == GUEST_CPU {
            u64::from(self.data1.max(1))
        } else {
            1
        }
    }

    /// The trace line of `record`.
    pub fn new(vcpu: u8, cr3: u64, record: &EventRecord) -> Self {
        TraceRecord {
            vcpu,
            cr3,
            event: record.event_id,
            core: record.core_id,
            flags: record.event_flags,
            data1: record.data1,
            data2: record.data2,
            ip: record.instruction_address,
            timestamp: record.timestamp,
            stack: Vec::new(),
            top: None,
            kernel: false,
        }
    }

    /// A host-side sample of vCPU `vcpu` in address space `cr3` at `ip`, in
    /// the kernel when `kernel`, standing for `periods` sampling periods of
    /// `period_ns` of guest time, at guest TSC `timestamp`.
    pub fn guest_cpu(
        vcpu: u8,
        cr3: u64,
        ip: u64,
        kernel: bool,
        periods: u32,
        period_ns: u64,
        timestamp: u64,
    ) -> Self {
        TraceRecord {
            vcpu,
            cr3,
            event: GUEST_CPU,
            core: vcpu,
            flags: 0,
            data1: periods,
            data2: period_ns,
            ip,
            timestamp,
            stack: Vec::new(),
            top: None,
            kernel,
        }
    }

    /// A record of `event` at `ip` in address space `cr3` with `stack`,
    /// everything else zero (report tests).
    #[cfg(test)]
    pub fn stacked(event: u8, cr3: u64, ip: u64, stack: &[u64]) -> Self {
        TraceRecord {
            vcpu: 0,
            cr3,
            event,
            core: 0,
            flags: 0,
            data1: 0,
            data2: 0,
            ip,
            timestamp: 0,
            stack: stack.to_vec(),
            top: None,
            kernel: false,
        }
    }
}

/// A trace line naming an executable mapping of an address space, as the
/// guest reported it (docs/pv-abi.md, operation 9): from that line on, the
/// records of `cr3` at addresses in `start..end` lie in `path`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MappingLine {
    /// The address space (CR3 address bits).
    pub cr3: u64,
    /// The first address.
    pub start: u64,
    /// The address past the last.
    pub end: u64,
    /// The file offset mapped at `start`.
    pub offset: u64,
    /// The file's path in the guest.
    pub path: String,
    /// Its ELF build ID in hex ("" when unknown).
    #[serde(default)]
    pub build_id: String,
    /// The first mapping of a report: the address space's earlier mappings
    /// are gone (a new program, or a reused CR3).
    #[serde(default)]
    pub first: bool,
    /// The process the address space belongs to, when the guest said
    /// (absent from the traces of older modules).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<Process>,
}

/// A guest process: who ran in an address space.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Process {
    /// Its id (Linux's tgid).
    pub pid: u32,
    /// Its name (Linux's `comm`).
    pub name: String,
}

impl std::fmt::Display for Process {
    /// As `ps` shows it, `name[pid]`: a flame graph's root frame.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}[{}]", self.name, self.pid)
    }
}

#[derive(Serialize, Deserialize)]
struct MappingWrapper {
    mapping: MappingLine,
}

/// A trace line saying where the guest kernel's system-call entry lies in
/// this run, so that a report corrects a randomised (KASLR) kernel's
/// addresses to its vmlinux's: the kernel's MSR LSTAR, which Linux points at
/// `entry_SYSCALL_64`. Written once, at the first kernel sample after the
/// kernel set it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelLine {
    /// The value of LSTAR.
    pub syscall_entry: u64,
}

#[derive(Serialize, Deserialize)]
struct KernelWrapper {
    kernel: KernelLine,
}

/// One line of a trace after its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry<'a> {
    /// A record.
    Record(&'a TraceRecord),
    /// An executable mapping.
    Mapping(&'a MappingLine),
    /// Where the guest kernel lies.
    Kernel(KernelLine),
}

/// Why a trace cannot be read.
#[derive(Debug, Error)]
pub enum TraceError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// Not a regular file (a directory, a device, a FIFO).
    #[error("{0}: not a regular file, so not an lwpvmm trace")]
    NotRegular(PathBuf),
    /// A line is not what the format says.
    #[error("{path}:{line}: {reason}")]
    Format {
        /// The file.
        path: PathBuf,
        /// The line number (1-based).
        line: usize,
        /// What is wrong.
        reason: String,
    },
}

/// The line that ends a trace whose size limit was reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitReached {
    /// The limit, in bytes of records.
    pub max_bytes: u64,
}

#[derive(Serialize, Deserialize)]
struct LimitLine {
    limit_reached: LimitReached,
}

/// Writes a trace, up to a size limit.
pub struct TraceWriter {
    out: BufWriter<File>,
    written: u64,
    max: u64,
    full: bool,
    line: Vec<u8>,
}

impl TraceWriter {
    /// Writes the header to `file`, the trace file opened for it
    /// (`crate::hostfs::open_stream`). Record lines stop once they would
    /// take more than `max_bytes`; a last line then says so.
    pub fn new(file: File, header: &TraceHeader, max_bytes: u64) -> io::Result<Self> {
        let mut out = BufWriter::new(file);
        serde_json::to_writer(&mut out, header)?;
        out.write_all(b"\n")?;
        Ok(TraceWriter {
            out,
            written: 0,
            max: max_bytes,
            full: false,
            line: Vec::new(),
        })
    }

    /// Appends records; returns how many were dropped because the limit is
    /// reached.
    pub fn append(&mut self, records: &[TraceRecord]) -> io::Result<u64> {
        for (i, r) in records.iter().enumerate() {
            if !self.write_line(r)? {
                return Ok((records.len() - i) as u64);
            }
        }
        Ok(0)
    }

    /// Appends a mapping line; past the limit it is dropped, as records
    /// are.
    pub fn append_mapping(&mut self, mapping: &MappingLine) -> io::Result<()> {
        let line = MappingWrapper {
            mapping: mapping.clone(),
        };
        self.write_line(&line).map(|_| ())
    }

    /// Appends the kernel's line; past the limit it is dropped, as records
    /// are.
    pub fn append_kernel(&mut self, kernel: KernelLine) -> io::Result<()> {
        self.write_line(&KernelWrapper { kernel }).map(|_| ())
    }

    /// Writes one line within the limit; false when it did not fit (and
    /// the limit line is written the first time).
    fn write_line(&mut self, value: &impl Serialize) -> io::Result<bool> {
        if self.full {
            return Ok(false);
        }
        self.line.clear();
        serde_json::to_writer(&mut self.line, value)?;
        self.line.push(b'\n');
        let len = self.line.len() as u64;
        if self.written + len > self.max {
            self.full = true;
            let limit = LimitLine {
                limit_reached: LimitReached {
                    max_bytes: self.max,
                },
            };
            serde_json::to_writer(&mut self.out, &limit)?;
            self.out.write_all(b"\n")?;
            self.out.flush()?;
            return Ok(false);
        }
        self.out.write_all(&self.line)?;
        self.written += len;
        Ok(true)
    }

    /// Flushes what is buffered.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// What reading a whole trace found besides its records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceSummary {
    /// The header.
    pub header: TraceHeader,
    /// Records read.
    pub records: u64,
    /// The vCPUs its records came from (one more than the highest index).
    pub vcpus: u32,
    /// The writer's size limit, when the trace ends because it was reached.
    pub limit: Option<LimitReached>,
    /// The line number of a last line cut short (a run that was killed
    /// while writing); the lines before it were read.
    pub cut_line: Option<usize>,
}

/// The longest header line read: a trace's is under 100 bytes.
const HEADER_MAX: u64 = 4096;

/// Trace format versions this lwpvmm reads: version 1 had no limit line,
/// versions 1 and 2 no stacks.
const READABLE_VERSIONS: [u32; 5] = [1, 2, 3, 4, TRACE_VERSION];

/// Reads a trace line by line, handing each record to `f`, without holding
/// more than one line; `progress` is called every 100 000 lines.
pub fn for_each_record(
    path: &Path,
    progress: impl FnMut(usize),
    mut f: impl FnMut(&TraceRecord),
) -> Result<TraceSummary, TraceError> {
    for_each_entry(path, progress, |e| {
        if let Entry::Record(r) = e {
            f(r);
        }
    })
}

/// As [`for_each_record`], with the mapping lines too, in their order.
pub fn for_each_entry(
    path: &Path,
    mut progress: impl FnMut(usize),
    mut f: impl FnMut(Entry<'_>),
) -> Result<TraceSummary, TraceError> {
    let io_err = |source| TraceError::Io {
        path: path.to_owned(),
        source,
    };
    let format = |line, reason: String| TraceError::Format {
        path: path.to_owned(),
        line,
        reason,
    };
    let file = match crate::hostfs::open_input(path) {
        Ok(input) => input.into_file(),
        Err(crate::hostfs::HostFsError::NotRegular { .. }) => {
            return Err(TraceError::NotRegular(path.to_owned()));
        }
        Err(crate::hostfs::HostFsError::Io { source, .. }) => return Err(io_err(source)),
        Err(e) => return Err(io_err(std::io::Error::other(e))),
    };
    let mut input = BufReader::new(file);
    // The header line, read as bytes and at most HEADER_MAX of them: a
    // file that is not a trace may be binary, or one endless line.
    let mut first = Vec::new();
    Read::by_ref(&mut input)
        .take(HEADER_MAX)
        .read_until(b'\n', &mut first)
        .map_err(io_err)?;
    if first.is_empty() {
        return Err(format(1, "empty file: not an lwpvmm trace".into()));
    }
    let text = std::str::from_utf8(&first).map_err(|_| {
        format(
            1,
            "not an lwpvmm trace: its first line is not text (a binary file?); a trace starts with {\"lwpvmm_trace\": N, ...}".into(),
        )
    })?;
    let header: TraceHeader = serde_json::from_str(text.trim_end()).map_err(|e| {
        format(
            1,
            format!("not an lwpvmm trace: its first line is not a trace header ({e}); a trace starts with {{\"lwpvmm_trace\": N, ...}}"),
        )
    })?;
    let mut text = String::new();
    if !READABLE_VERSIONS.contains(&header.lwpvmm_trace) {
        return Err(format(
            1,
            format!(
                "trace format version {} (this lwpvmm reads versions 1 to {TRACE_VERSION})",
                header.lwpvmm_trace
            ),
        ));
    }
    let mut summary = TraceSummary {
        header,
        records: 0,
        vcpus: 0,
        limit: None,
        cut_line: None,
    };
    let mut number = 1;
    loop {
        text.clear();
        if input.read_line(&mut text).map_err(io_err)? == 0 {
            return Ok(summary);
        }
        number += 1;
        let line = text.trim_end();
        if line.is_empty() {
            continue;
        }
        if summary.limit.is_some() {
            return Err(format(number, "a line after the limit line".into()));
        }
        match serde_json::from_str::<TraceRecord>(line) {
            Ok(record) => {
                f(Entry::Record(&record));
                summary.records += 1;
                summary.vcpus = summary.vcpus.max(u32::from(record.vcpu) + 1);
            }
            Err(e) => {
                if let Ok(m) = serde_json::from_str::<MappingWrapper>(line) {
                    f(Entry::Mapping(&m.mapping));
                } else if let Ok(k) = serde_json::from_str::<KernelWrapper>(line) {
                    f(Entry::Kernel(k.kernel));
                } else if let Ok(limit) = serde_json::from_str::<LimitLine>(line) {
                    summary.limit = Some(limit.limit_reached);
                } else if !text.ends_with('\n') {
                    summary.cut_line = Some(number);
                    return Ok(summary);
                } else {
                    return Err(format(number, e.to_string()));
                }
            }
        }
        if (number - 1) % 100_000 == 0 {
            progress(number - 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lwp::record::{EventId, EventRecord};

    fn temp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("lwpvmm-trace-{name}-{}", std::process::id()))
    }

    fn header() -> TraceHeader {
        TraceHeader {
            lwpvmm_trace: TRACE_VERSION,
            profile: "emulated".into(),
            sample_hz: 1000,
        }
    }

    fn read_all(path: &Path) -> Result<(TraceSummary, Vec<TraceRecord>), TraceError> {
        let mut records = Vec::new();
        let summary = for_each_record(path, |_| {}, |r| records.push(r.clone()))?;
        Ok((summary, records))
    }

    #[test]
    fn write_and_read_back() {
        let path = temp("rw");
        let mut w =
            TraceWriter::new(std::fs::File::create(&path).unwrap(), &header(), u64::MAX).unwrap();
        let rec = EventRecord::hardware(EventId::Cnh, 2, 0x40_1000, 77);
        let plain = TraceRecord::new(1, 0x9000, &rec);
        let stacked = TraceRecord {
            stack: vec![0x40_2000, 0x40_3000],
            ..plain.clone()
        };
        let lines = [plain, stacked];
        assert_eq!(w.append(&lines).unwrap(), 0);
        w.flush().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            text.matches("stack").count(),
            1,
            "an empty stack is left out"
        );
        let (summary, records) = read_all(&path).unwrap();
        assert_eq!(summary.header, header());
        assert_eq!((summary.limit, summary.cut_line), (None, None));
        assert_eq!(records, lines);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn the_kernel_line_is_read_back_in_its_place() {
        let path = temp("kernel");
        let mut w =
            TraceWriter::new(std::fs::File::create(&path).unwrap(), &header(), u64::MAX).unwrap();
        let sample = TraceRecord::guest_cpu(0, 0x5000, 0xffff_ffff_9000_0010, true, 1, 1, 0);
        let kernel = KernelLine {
            syscall_entry: 0xffff_ffff_9060_0040,
        };
        w.append(std::slice::from_ref(&sample)).unwrap();
        w.append_kernel(kernel).unwrap();
        w.append(std::slice::from_ref(&sample)).unwrap();
        w.flush().unwrap();
        let mut seen = Vec::new();
        let summary = for_each_entry(
            &path,
            |_| {},
            |e| {
                seen.push(match e {
                    Entry::Record(_) => "record",
                    Entry::Mapping(_) => "mapping",
                    Entry::Kernel(k) if k == kernel => "kernel",
                    Entry::Kernel(_) => "another kernel",
                })
            },
        )
        .unwrap();
        assert_eq!(seen, ["record", "kernel", "record"]);
        assert_eq!(summary.records, 2, "the kernel line is not a record");
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn the_limit_stops_the_records_and_says_so() {
        let path = temp("limit");
        let rec = TraceRecord::new(0, 0, &EventRecord::hardware(EventId::Cnh, 1, 0x40_1000, 7));
        let line = serde_json::to_vec(&rec).unwrap().len() as u64 + 1;
        let mut w = TraceWriter::new(
            std::fs::File::create(&path).unwrap(),
            &header(),
            3 * line + 1,
        )
        .unwrap();
        let five = vec![rec.clone(); 5];
        assert_eq!(w.append(&five).unwrap(), 2, "3 fit");
        assert_eq!(w.append(&five[..2]).unwrap(), 2);
        w.flush().unwrap();
        let (summary, records) = read_all(&path).unwrap();
        assert_eq!(records.len(), 3);
        assert_eq!(
            summary.limit,
            Some(LimitReached {
                max_bytes: 3 * line + 1
            })
        );
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn bad_traces() {
        let path = temp("bad");
        let good = r#"{"vcpu":0,"cr3":1,"event":5,"core":0,"flags":0,"data1":0,"data2":0,"ip":2,"timestamp":3}"#;
        let v1 = r#"{"lwpvmm_trace":1,"profile":"emulated","sample_hz":0}"#;
        // (content, Ok((records, cut line)) or Err(text in the error))
        type Want = Result<(usize, Option<usize>), &'static str>;
        let table: [(String, Want); 6] = [
            (format!("{v1}\n{good}\n"), Ok((1, None))),
            (format!("{v1}\n{good}\n{}", &good[..30]), Ok((1, Some(3)))),
            (format!("{v1}\n{}\n{good}\n", &good[..30]), Err(":2:")),
            (
                r#"{"lwpvmm_trace":9,"profile":"x","sample_hz":0}"#.to_owned(),
                Err("version 9"),
            ),
            ("hello\n".to_owned(), Err("not an lwpvmm trace")),
            (String::new(), Err("empty file")),
        ];
        for (content, want) in table {
            std::fs::write(&path, &content).unwrap();
            match (read_all(&path), want) {
                (Ok((summary, records)), Ok((n, cut))) => {
                    assert_eq!((records.len(), summary.cut_line), (n, cut), "{content}")
                }
                (Err(e), Err(text)) => assert!(e.to_string().contains(text), "{e}"),
                (got, want) => panic!("{content}: got {got:?}, want {want:?}"),
            }
        }
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn a_whole_guest_sample_is_a_line_of_its_own_kind() {
        let mut r =
            TraceRecord::guest_cpu(1, 0x5000, 0xffff_ffff_8100_0010, true, 2, 1_000_000, 77);
        r.stack = vec![0xffff_ffff_8100_0200];
        let line = serde_json::to_string(&r).unwrap();
        assert!(
            line.contains(r#""event":0"#) && line.contains(r#""kernel":true"#),
            "{line}"
        );
        assert_eq!(serde_json::from_str::<TraceRecord>(&line).unwrap(), r);
        // An LWP record's line does not grow a kernel field.
        let lwp = TraceRecord::stacked(5, 0x5000, 0x40_0000, &[]);
        assert!(!serde_json::to_string(&lwp).unwrap().contains("kernel"));
    }
}
