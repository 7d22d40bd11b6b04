//! The control plane's vocabulary: what may be asked of a running VM (a
//! [`Request`], answered on the channel it carries) and the [`VmmHandle`]
//! that asks from any thread. The API speaks it and the `Vmm`'s control
//! thread answers it, so it sits below both; a failed request is a
//! [`ControlError`] that says whose fault it was.

use std::path::{Path, PathBuf};
use std::sync::Arc;
#[cfg(test)]
use std::sync::mpsc::Receiver;
use std::sync::mpsc::{Sender, channel};
use std::time::Duration;

#[cfg(test)]
use vmm_sys_util::eventfd::EFD_NONBLOCK;
use vmm_sys_util::eventfd::EventFd;

use super::control_error::ControlError;
use super::metrics::VmCounters;
use super::recorder::Recorder;

/// What a snapshot holds of guest memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
pub enum SnapshotKind {
    /// All of it.
    #[default]
    Full,
    /// The pages written since the parent snapshot.
    Diff,
}

/// A snapshot written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// Where.
    pub dir: PathBuf,
    /// The state file's size.
    pub state_bytes: u64,
    /// The memory file's size.
    pub memory_bytes: u64,
    /// How long the vCPUs took to pause.
    pub pause_time: Duration,
    /// From the request to the VM running again.
    pub total_time: Duration,
}

/// A request to the control thread.
pub enum Request {
    /// Pause every vCPU.
    Pause(Sender<Result<(), ControlError>>),
    /// Resume every vCPU.
    Resume(Sender<Result<(), ControlError>>),
    /// Write a snapshot of this kind to this directory.
    Snapshot(
        PathBuf,
        SnapshotKind,
        Sender<Result<SnapshotInfo, ControlError>>,
    ),
    /// The counters now.
    Metrics(Sender<VmCounters>),
    /// Whether the VM is paused.
    Paused(Sender<bool>),
    /// Write the metrics file now.
    FlushMetrics(Sender<Result<(), ControlError>>),
    /// Give the `usize`th disk this image.
    ReplaceDisk(usize, PathBuf, Sender<Result<(), ControlError>>),
    /// Set the sampler's rate.
    SampleHz(u32, Sender<Result<(), ControlError>>),
    /// Stop the VM.
    Stop,
}

/// Drives a VM from any thread.
#[derive(Clone)]
pub struct VmmHandle {
    requests: Sender<Request>,
    wake: Arc<EventFd>,
    recorder: Arc<Recorder>,
}

impl VmmHandle {
    /// A handle whose requests go to `requests`, the control thread woken
    /// through `wake`.
    pub fn new(requests: Sender<Request>, wake: Arc<EventFd>, recorder: Arc<Recorder>) -> Self {
        VmmHandle {
            requests,
            wake,
            recorder,
        }
    }

    /// The eventfd that wakes the control thread for a request.
    pub fn wake(&self) -> &EventFd {
        &self.wake
    }

    fn ask<T>(&self, request: impl FnOnce(Sender<T>) -> Request) -> Result<T, ControlError> {
        let (reply, answer) = channel();
        self.requests
            .send(request(reply))
            .map_err(|_| ControlError::NotRunning)?;
        let _ = self.wake.write(1);
        answer.recv().map_err(|_| ControlError::NotRunning)
    }

    /// Pauses every vCPU; returns once all are paused.
    pub fn pause(&self) -> Result<(), ControlError> {
        self.ask(Request::Pause)?
    }

    /// Resumes a paused VM.
    pub fn resume(&self) -> Result<(), ControlError> {
        self.ask(Request::Resume)?
    }

    /// Writes a snapshot to `dir` (the VM pauses for it unless paused).
    pub fn snapshot(&self, dir: &Path) -> Result<SnapshotInfo, ControlError> {
        self.snapshot_of(dir, SnapshotKind::Full)
    }

    /// Writes a full snapshot, or a diff on top of the last one this VM
    /// wrote or was restored from (`--snapshot-diff`), to `dir`.
    pub fn snapshot_of(
        &self,
        dir: &Path,
        kind: SnapshotKind,
    ) -> Result<SnapshotInfo, ControlError> {
        self.ask(|r| Request::Snapshot(dir.to_owned(), kind, r))?
    }

    /// Sets the sampler's rate (0: stopped) while the VM runs.
    pub fn set_sample_hz(&self, hz: u32) -> Result<(), ControlError> {
        self.ask(|r| Request::SampleHz(hz, r))?
    }

    /// What the host side records: the trace and the API's captures.
    pub fn recorder(&self) -> &Recorder {
        &self.recorder
    }

    /// The VM's counters now.
    pub fn metrics(&self) -> Result<VmCounters, ControlError> {
        self.ask(Request::Metrics)
    }

    /// A handle and the end its requests arrive at, for tests that answer
    /// them in place of a control thread.
    #[cfg(test)]
    pub(crate) fn for_test() -> (VmmHandle, Receiver<Request>) {
        let (requests, received) = channel();
        let wake = Arc::new(EventFd::new(EFD_NONBLOCK).expect("an eventfd"));
        let recorder = Arc::new(Recorder::new(None, true, 1000));
        (
            VmmHandle {
                requests,
                wake,
                recorder,
            },
            received,
        )
    }

    /// Writes the metrics file now (Firecracker's `FlushMetrics`).
    pub fn flush_metrics(&self) -> Result<(), ControlError> {
        self.ask(Request::FlushMetrics)?
    }

    /// Gives the `index`th disk the image at `path` (Firecracker's
    /// `PATCH /drives`).
    pub fn replace_disk(&self, index: usize, path: &Path) -> Result<(), ControlError> {
        self.ask(|reply| Request::ReplaceDisk(index, path.to_owned(), reply))?
    }

    /// Whether the VM is paused now.
    pub fn is_paused(&self) -> Result<bool, ControlError> {
        self.ask(Request::Paused)
    }

    /// Stops the VM; `Vmm::run` then returns with `VmEnd::Stopped`.
    pub fn stop(&self) {
        if self.requests.send(Request::Stop).is_ok() {
            let _ = self.wake.write(1);
        }
    }
}
