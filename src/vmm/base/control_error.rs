//! Why a request to a running VM failed (pause, resume, a snapshot, the
//! sampler's rate), and whose fault it was: the request's, the VM's state
//! at the time, a VM that is stopping, or the host's. The control thread
//! answers requests with it, the vCPU and device threads answer the control
//! thread with it, and the API maps it to an HTTP status in one place
//! ([`ControlError::status`]); the command line exits 2 for all of them.

use std::path::PathBuf;

use thiserror::Error;

/// Whose fault a failed request was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The request asked for something this VM cannot do as asked.
    Request,
    /// The request conflicts with the VM's setup or state.
    Conflict,
    /// The VM stopped meanwhile.
    Stopping,
    /// Something on the host failed (a system call, KVM, a file).
    Host,
}

/// Why a request to a running VM failed.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum ControlError {
    /// `sample_hz` for a VM without sampled clock events.
    #[error("the LWP profile has no sampled clock events (CNH, RNH): there is no sampler")]
    NoSampler,
    /// A diff snapshot of a VM started without `--snapshot-diff`.
    #[error("diff snapshots need dirty-page tracking: start the VM with --snapshot-diff")]
    DiffUntracked,
    /// A disk's new image could not be used.
    #[error("the drive's new image: {0}")]
    Drive(String),
    /// A metrics flush for a VM without a metrics file.
    #[error(
        "this VM has no metrics file: configure one first (--metrics, or PUT /metrics before start)"
    )]
    NoMetricsFile,
    /// A diff snapshot with nothing to be a diff of.
    #[error(
        "a diff snapshot needs a parent: this VM has written no snapshot since it started and was not restored from one; take a full one first"
    )]
    NoParent,
    /// A diff snapshot into its parent's directory.
    #[error("a diff snapshot needs a directory of its own: {0} holds its parent")]
    ParentDirectory(PathBuf),
    /// The snapshot directory cannot be made.
    #[error("cannot create the snapshot directory {path}: {reason}")]
    Directory {
        /// The directory.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The VM is not running (it ended, or never ran): nobody answers.
    #[error("the VM is not running")]
    NotRunning,
    /// A thread of the VM ended before it answered.
    #[error("the VM stopped before {0}")]
    Stopped(&'static str),
    /// A thread of the VM answered out of turn.
    #[error("{who} answered {answer} to {asked}")]
    Protocol {
        /// Who.
        who: &'static str,
        /// What it answered.
        answer: String,
        /// What it was asked.
        asked: &'static str,
    },
    /// A host operation failed.
    #[error("{what} failed: {reason}")]
    Host {
        /// The operation.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// A snapshot failed; the VM runs on.
    #[error("the snapshot to {dir} failed: {source}")]
    Snapshot {
        /// Where it was going.
        dir: PathBuf,
        /// Why.
        source: Box<ControlError>,
    },
}

impl ControlError {
    /// A host operation's failure.
    pub fn host(what: &'static str, e: impl std::fmt::Display) -> Self {
        ControlError::Host {
            what,
            reason: e.to_string(),
        }
    }

    /// Whose fault it was.
    pub fn fault(&self) -> Fault {
        match self {
            ControlError::ParentDirectory(_)
            | ControlError::Directory { .. }
            | ControlError::Drive(_) => Fault::Request,
            ControlError::NoSampler
            | ControlError::DiffUntracked
            | ControlError::NoParent
            | ControlError::NoMetricsFile => Fault::Conflict,
            ControlError::NotRunning | ControlError::Stopped(_) => Fault::Stopping,
            ControlError::Protocol { .. } | ControlError::Host { .. } => Fault::Host,
            ControlError::Snapshot { source, .. } => source.fault(),
        }
    }

    /// The HTTP status the API answers it with.
    pub fn status(&self) -> u16 {
        match self.fault() {
            Fault::Request => 400,
            Fault::Conflict => 409,
            Fault::Stopping => 503,
            Fault::Host => 500,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_says_what_to_do_and_whose_fault_it_was() {
        let dir = PathBuf::from("/snaps/1");
        // (error, status, text of its message)
        let table: Vec<(ControlError, u16, &str)> = vec![
            (ControlError::NoSampler, 409, "there is no sampler"),
            (
                ControlError::DiffUntracked,
                409,
                "start the VM with --snapshot-diff",
            ),
            (ControlError::NoParent, 409, "take a full one first"),
            (
                ControlError::ParentDirectory(dir.clone()),
                400,
                "/snaps/1 holds its parent",
            ),
            (
                ControlError::Directory {
                    path: dir.clone(),
                    reason: "Permission denied".into(),
                },
                400,
                "cannot create the snapshot directory /snaps/1: Permission denied",
            ),
            (ControlError::NotRunning, 503, "the VM is not running"),
            (
                ControlError::Stopped("every vCPU paused"),
                503,
                "the VM stopped before every vCPU paused",
            ),
            (
                ControlError::Protocol {
                    who: "vCPU 1",
                    answer: "Resumed".into(),
                    asked: "a pause",
                },
                500,
                "vCPU 1 answered Resumed to a pause",
            ),
            (
                ControlError::host("KVM_GET_DIRTY_LOG", "EFAULT"),
                500,
                "KVM_GET_DIRTY_LOG failed: EFAULT",
            ),
            (
                ControlError::Snapshot {
                    dir: dir.clone(),
                    source: Box::new(ControlError::NoParent),
                },
                409,
                "the snapshot to /snaps/1 failed: a diff snapshot needs a parent",
            ),
        ];
        for (e, status, text) in table {
            assert_eq!(e.status(), status, "{e}");
            assert!(e.to_string().contains(text), "{e}");
        }
    }
}
