//! The files a run writes, opened or created before the VM starts, so that a
//! wrong path fails at once with the path in the message instead of after
//! the whole run: the console file, the metrics file (rewritten in place at
//! every dump, through the descriptor opened at start-up), the trace and
//! the snapshot directory.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::lwp::cpuid::LwpProfile;
use crate::profile::trace::{TRACE_VERSION, TraceHeader, TraceWriter};
use crate::vmm::config::HostConfig;
use crate::vmm::devices::port_bus::SerialOut;

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
#[error("cannot write {} {}: {source}", .kind.describe(), .path.display())]
pub struct OutputError {
    /// Which output.
    pub kind: OutputKind,
    /// Its path.
    pub path: PathBuf,
    /// Why.
    pub source: io::Error,
}

impl OutputError {
    /// An error of `kind` at `path`.
    pub fn new(kind: OutputKind, path: &Path, source: io::Error) -> Self {
        OutputError {
            kind,
            path: path.to_owned(),
            source,
        }
    }
}

/// A file whose whole content is replaced at each write (the metrics),
/// through the descriptor opened at start-up: the control thread rewrites
/// it without opening anything.
#[derive(Debug)]
pub struct RewriteFile {
    path: PathBuf,
    part: PathBuf,
}

impl RewriteFile {
    /// Checks that the file can be written: its temporary sibling is
    /// created (and left for [`Self::replace`]), the file itself is not
    /// touched until the first replacement.
    pub fn create(kind: OutputKind, path: &Path) -> Result<Self, OutputError> {
        let err = |e| OutputError::new(kind, path, e);
        if path.is_dir() {
            return Err(err(io::Error::from(io::ErrorKind::IsADirectory)));
        }
        let name = path
            .file_name()
            .ok_or_else(|| err(io::Error::from(io::ErrorKind::InvalidFilename)))?;
        let mut part_name = std::ffi::OsString::from(".");
        part_name.push(name);
        part_name.push(".lwpvmm-part");
        let part = path.with_file_name(part_name);
        File::create(&part).map_err(err)?;
        Ok(RewriteFile {
            path: path.to_owned(),
            part,
        })
    }

    /// Replaces the content with `bytes`: written beside the file and
    /// renamed over it, so the file always holds a whole document (the
    /// last one), never a truncated one, whenever the process ends.
    pub fn replace(&self, bytes: &[u8]) -> io::Result<()> {
        std::fs::write(&self.part, bytes)?;
        std::fs::rename(&self.part, &self.path)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
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
        let console = host.serial.writer().map_err(|e| match &host.serial {
            SerialOut::File(path) => OutputError::new(OutputKind::Serial, path, e),
            _ => OutputError::new(OutputKind::Serial, Path::new("stdout"), e),
        })?;
        let profiling = &host.profiling;
        let metrics = profiling
            .metrics
            .as_deref()
            .map(|p| RewriteFile::create(OutputKind::Metrics, p))
            .transpose()?;
        let trace = match &profiling.trace {
            Some(path) => {
                let header = TraceHeader {
                    lwpvmm_trace: TRACE_VERSION,
                    profile: profile.name().into(),
                    sample_hz: profiling.sample_hz,
                };
                Some(
                    TraceWriter::create(path, &header, profiling.trace_max)
                        .map_err(|e| OutputError::new(OutputKind::Trace, path, e))?,
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
/// created in it (with a probe file, removed at once: permissions alone do
/// not tell, for root or a read-only file system).
pub fn prepare_snapshot_dir(dir: &Path) -> Result<(), OutputError> {
    let err = |e| OutputError::new(OutputKind::SnapshotDir, dir, e);
    std::fs::create_dir_all(dir).map_err(err)?;
    let probe = dir.join(format!(".lwpvmm-probe-{}", std::process::id()));
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .map_err(err)?;
    std::fs::remove_file(&probe).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites_replace_the_whole_content() {
        let path = std::env::temp_dir().join(format!("lwpvmm-output-{}", std::process::id()));
        let f = RewriteFile::create(OutputKind::Metrics, &path).unwrap();
        f.replace(b"a longer first version").unwrap();
        f.replace(b"short").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"short");
        std::fs::remove_file(&path).unwrap();
    }

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
                _ => RewriteFile::create(kind, Path::new(path)).unwrap_err(),
            };
            assert_eq!(err.kind, kind);
            let text = err.to_string();
            assert!(text.contains(path), "{text}");
        }
    }
}
