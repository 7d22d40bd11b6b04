//! The host-side trace: every record an emulated LWP unit stores, with the
//! vCPU and the address space (CR3) it was stored for, as JSON lines.
//!
//! JSON lines because a trace is appended to while the VM runs, read by
//! people with standard tools (`jq`, `grep`) as often as by `lwpvmm report`,
//! and versioned by its first line: `{"lwpvmm_trace":1,...}`. A binary format
//! would be smaller; a profile of a few seconds is a few MiB either way.

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::lwp::record::EventRecord;

/// The trace format version.
pub const TRACE_VERSION: u32 = 1;

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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
}

impl TraceRecord {
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
        }
    }
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

/// Writes a trace.
pub struct TraceWriter {
    out: BufWriter<File>,
}

impl TraceWriter {
    /// Creates the trace file and writes its header.
    pub fn create(path: &Path, header: &TraceHeader) -> io::Result<Self> {
        let mut out = BufWriter::new(File::create(path)?);
        serde_json::to_writer(&mut out, header)?;
        out.write_all(b"\n")?;
        Ok(TraceWriter { out })
    }

    /// Appends records.
    pub fn append(&mut self, records: &[TraceRecord]) -> io::Result<()> {
        for r in records {
            serde_json::to_writer(&mut self.out, r)?;
            self.out.write_all(b"\n")?;
        }
        Ok(())
    }

    /// Flushes what is buffered.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// Reads a whole trace; `progress` is called every 100 000 lines.
pub fn read(
    path: &Path,
    mut progress: impl FnMut(usize),
) -> Result<(TraceHeader, Vec<TraceRecord>), TraceError> {
    let io_err = |source| TraceError::Io {
        path: path.to_owned(),
        source,
    };
    let format = |line, reason: String| TraceError::Format {
        path: path.to_owned(),
        line,
        reason,
    };
    let mut lines = BufReader::new(File::open(path).map_err(io_err)?).lines();
    let first = lines
        .next()
        .ok_or_else(|| format(1, "empty file: not an lwpvmm trace".into()))?
        .map_err(io_err)?;
    let header: TraceHeader = serde_json::from_str(&first)
        .map_err(|e| format(1, format!("not an lwpvmm trace header: {e}")))?;
    if header.lwpvmm_trace != TRACE_VERSION {
        return Err(format(
            1,
            format!(
                "trace format version {} (this lwpvmm reads {TRACE_VERSION})",
                header.lwpvmm_trace
            ),
        ));
    }
    let mut records = Vec::new();
    for (i, line) in lines.enumerate() {
        let line = line.map_err(io_err)?;
        if line.is_empty() {
            continue;
        }
        records.push(serde_json::from_str(&line).map_err(|e| format(i + 2, e.to_string()))?);
        if (i + 1) % 100_000 == 0 {
            progress(i + 1);
        }
    }
    Ok((header, records))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lwp::record::{EventId, EventRecord};

    #[test]
    fn write_and_read_back() {
        let path = std::env::temp_dir().join(format!("lwpvmm-trace-test-{}", std::process::id()));
        let header = TraceHeader {
            lwpvmm_trace: TRACE_VERSION,
            profile: "emulated".into(),
            sample_hz: 1000,
        };
        let mut w = TraceWriter::create(&path, &header).unwrap();
        let rec = EventRecord::hardware(EventId::Cnh, 2, 0x40_1000, 77);
        w.append(&[TraceRecord::new(1, 0x9000, &rec)]).unwrap();
        w.flush().unwrap();
        let (h, records) = read(&path, |_| {}).unwrap();
        assert_eq!(h, header);
        assert_eq!(records, vec![TraceRecord::new(1, 0x9000, &rec)]);
        std::fs::write(
            &path,
            "{\"lwpvmm_trace\":9,\"profile\":\"x\",\"sample_hz\":0}\n",
        )
        .unwrap();
        let err = read(&path, |_| {}).unwrap_err().to_string();
        assert!(err.contains("version 9"), "{err}");
        std::fs::write(&path, "hello\n").unwrap();
        assert!(read(&path, |_| {}).is_err());
        std::fs::remove_file(path).unwrap();
    }
}
