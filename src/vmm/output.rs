//! The files a run writes, opened or created before the VM starts, so that a
//! wrong path fails at once with the path in the message instead of after
//! the whole run: the console file, the metrics file (rewritten in place at
//! every dump, through the descriptor opened at start-up), the trace and
//! the snapshot directory.

use std::io::Write;
use std::path::Path;

use thiserror::Error;

use crate::hostfs::{self, Dir, Fifo, HostFsError, Rewrite, StreamMode};
use crate::lwp::cpuid::LwpProfile;
use crate::profile::trace::{TRACE_VERSION, TraceHeader, TraceWriter};
use crate::vmm::config::HostConfig;

/// Which output a path is for; the command line names the option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputKind {
    /// The serial console file.
    Serial,
    /// The metrics file.
    Metrics,
    /// The trace file.
    Trace,
    /// The snapshot directory.
    SnapshotDir,
}

impl OutputKind {
    fn describe(self) -> &'static str {
        match self {
            OutputKind::Serial => "the console file",
            OutputKind::Metrics => "the metrics file",
            OutputKind::Trace => "the trace file",
            OutputKind::SnapshotDir => "the snapshot directory",
        }
    }
}

/// An output that cannot be created or written.
#[derive(Debug, Error)]
#[error("cannot write {}: {source}", .kind.describe())]
pub struct OutputError {
    /// Which output.
    pub kind: OutputKind,
    /// Why (the path is in it).
    pub source: HostFsError,
}

impl OutputError {
    /// An error of `kind`.
    pub fn new(kind: OutputKind, source: HostFsError) -> Self {
        OutputError { kind, source }
    }
}

/// A file whose whole content is replaced at each write (the metrics):
/// each version is a new file beneath the directory's descriptor, renamed
/// over the path (`crate::hostfs::Rewrite`).
pub type RewriteFile = Rewrite;

/// Replaces the content of the metrics file `file` with `document`, as
/// JSON.
pub fn replace_json(
    file: &RewriteFile,
    document: &impl serde::Serialize,
) -> Result<(), OutputError> {
    let err = |e| OutputError::new(OutputKind::Metrics, e);
    let bytes = serde_json::to_vec_pretty(document).map_err(|e| {
        err(HostFsError::Io {
            path: file.path(),
            source: e.into(),
        })
    })?;
    file.replace(&bytes).map_err(err)
}

/// The console's writer.
pub type Console = Box<dyn Write + Send>;

/// The files a run writes besides the console.
pub struct RunOutputs {
    /// The metrics file.
    pub metrics: Option<RewriteFile>,
    /// The trace.
    pub trace: Option<TraceWriter>,
}

impl RunOutputs {
    /// Opens the console and every other output `host` names, in that order,
    /// and prepares the snapshot directory.
    pub fn open(host: &HostConfig, profile: LwpProfile) -> Result<(Console, Self), OutputError> {
        let console = host
            .serial
            .writer()
            .map_err(|e| OutputError::new(OutputKind::Serial, e))?;
        let profiling = &host.profiling;
        let metrics = profiling
            .metrics
            .as_deref()
            .map(|p| Rewrite::new(p).map_err(|e| OutputError::new(OutputKind::Metrics, e)))
            .transpose()?;
        let trace = match &profiling.trace {
            Some(path) => {
                let header = TraceHeader {
                    lwpvmm_trace: TRACE_VERSION,
                    profile: profile.name().into(),
                    sample_hz: profiling.sample_hz,
                };
                let err = |e| OutputError::new(OutputKind::Trace, e);
                let file =
                    hostfs::open_stream(path, StreamMode::Truncate, Fifo::Refused).map_err(err)?;
                Some(
                    TraceWriter::new(file, &header, profiling.trace_max).map_err(|source| {
                        err(HostFsError::Io {
                            path: path.clone(),
                            source,
                        })
                    })?,
                )
            }
            None => None,
        };
        if let Some(dir) = &host.snapshots.dir {
            prepare_snapshot_dir(dir)?;
        }
        Ok((console, RunOutputs { metrics, trace }))
    }
}

/// Creates the snapshot directory if needed and checks that files can be
/// created in it (a fresh file, removed at once: permissions alone do not
/// tell, for root or a read-only file system).
pub fn prepare_snapshot_dir(dir: &Path) -> Result<(), OutputError> {
    let err = |e| OutputError::new(OutputKind::SnapshotDir, e);
    let held = Dir::create(dir).map_err(err)?;
    drop(held.create_new(".lwpvmm-probe").map_err(err)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_paths_are_named() {
        // (kind, path) that cannot be created
        let table = [
            (OutputKind::Metrics, "/nonexistent-dir/metrics.json"),
            (OutputKind::SnapshotDir, "/proc/lwpvmm-snapshots"),
        ];
        for (kind, path) in table {
            let err = match kind {
                OutputKind::SnapshotDir => prepare_snapshot_dir(Path::new(path)).unwrap_err(),
                _ => Rewrite::new(Path::new(path))
                    .map_err(|e| OutputError::new(kind, e))
                    .unwrap_err(),
            };
            assert_eq!(err.kind, kind);
            let text = err.to_string();
            assert!(text.contains(path), "{text}");
        }
    }
}
