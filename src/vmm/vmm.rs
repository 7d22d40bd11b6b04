//! The VMM: one object that owns a machine for its whole life. The builder
//! makes it (booted, or restored from a snapshot); [`Vmm::run`] starts the
//! vCPU threads and the control thread and returns how the VM ended. A
//! [`VmmHandle`], taken before or while it runs, pauses, resumes,
//! snapshots, reads the metrics of and stops the running VM from any thread:
//! what a control API drives.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use kvm_ioctls::VmFd;
use serde::Serialize;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};
use vmm_sys_util::signal::{SIGRTMIN, register_signal_handler};

use crate::vmm::api::ApiListeners;
use crate::vmm::config::HostConfig;
use crate::vmm::control::Control;
use crate::vmm::base::control_error::ControlError;
use crate::vmm::devices::port_bus::GuestEnd;
use crate::vmm::error::VmError;
use crate::vmm::machine::{Machine, MachineSpec};
use crate::vmm::base::metrics::{VcpuMetrics, VmCounters};
use crate::vmm::output::RunOutputs;
use crate::vmm::base::recorder::Recorder;
use crate::vmm::base::signals::StopSignals;
use crate::vmm::vcpu::{Shared, Vcpu, VcpuEvent, VcpuHandle, kick_handler};
use crate::vmm::devices::virtio::VirtioBus;
use crate::vmm::devices::virtio::worker::DeviceThread;
use crate::lwp::cpuid::LwpFeatures;
use crate::lwp::unit::UnitStats;

/// Why a VM stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmEnd {
    /// The guest ended it.
    Guest(GuestEnd),
    /// lwpvmm received this signal (SIGINT, SIGTERM) and stopped it.
    Signal(i32),
    /// A [`VmmHandle`] stopped it.
    Stopped,
}

impl std::fmt::Display for VmEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VmEnd::Guest(end) => end.fmt(f),
            VmEnd::Signal(signal) => write!(f, "{} received", crate::vmm::base::signals::name(*signal)),
            VmEnd::Stopped => f.write_str("stopped through the API or a VmmHandle"),
        }
    }
}

/// How a VM ended.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// Why it stopped.
    pub end: VmEnd,
    /// The counters.
    pub metrics: VmCounters,
    /// Each vCPU's LWP unit counters.
    pub lwp: Vec<UnitStats>,
    /// What failed on the way without stopping the VM (a requested
    /// snapshot, a metrics write): the caller should report it and fail.
    pub errors: Vec<String>,
}

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

/// The metrics file's document: how the run ended (`null` while it runs),
/// the VM's counters, and each LWP unit's.
#[derive(Debug, Serialize)]
pub struct MetricsDocument<'a> {
    end: Option<serde_json::Value>,
    /// Why the run failed, when it ended on a VMM error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    vm: &'a VmCounters,
    lwp_units: &'a [UnitStats],
}

/// The metrics document for `end`.
pub fn metrics_document<'a>(
    end: Option<VmEnd>,
    vm: &'a VmCounters,
    lwp_units: &'a [UnitStats],
) -> MetricsDocument<'a> {
    let end = end.map(|end| match end {
        VmEnd::Guest(GuestEnd::ExitPort(value)) => serde_json::json!({ "exit_port": value }),
        VmEnd::Guest(GuestEnd::PowerOff) => serde_json::json!("power_off"),
        VmEnd::Guest(GuestEnd::Reboot) => serde_json::json!("reboot"),
        VmEnd::Guest(GuestEnd::OutputClosed) => serde_json::json!("output_closed"),
        VmEnd::Signal(signal) => serde_json::json!({ "signal": signal }),
        VmEnd::Stopped => serde_json::json!("stopped"),
    });
    MetricsDocument {
        end,
        error: None,
        vm,
        lwp_units,
    }
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
    fn ask<T>(&self, request: impl FnOnce(Sender<T>) -> Request) -> Result<T, VmError> {
        let (reply, answer) = channel();
        self.requests
            .send(request(reply))
            .map_err(|_| VmError::NotRunning)?;
        let _ = self.wake.write(1);
        answer.recv().map_err(|_| VmError::NotRunning)
    }

    /// Pauses every vCPU; returns once all are paused.
    pub fn pause(&self) -> Result<(), VmError> {
        Ok(self.ask(Request::Pause)??)
    }

    /// Resumes a paused VM.
    pub fn resume(&self) -> Result<(), VmError> {
        Ok(self.ask(Request::Resume)??)
    }

    /// Writes a snapshot to `dir` (the VM pauses for it unless paused).
    pub fn snapshot(&self, dir: &Path) -> Result<SnapshotInfo, VmError> {
        self.snapshot_of(dir, SnapshotKind::Full)
    }

    /// Writes a full snapshot, or a diff on top of the last one this VM
    /// wrote or was restored from (`--snapshot-diff`), to `dir`.
    pub fn snapshot_of(&self, dir: &Path, kind: SnapshotKind) -> Result<SnapshotInfo, VmError> {
        Ok(self.ask(|r| Request::Snapshot(dir.to_owned(), kind, r))??)
    }

    /// Sets the sampler's rate (0: stopped) while the VM runs.
    pub fn set_sample_hz(&self, hz: u32) -> Result<(), VmError> {
        Ok(self.ask(|r| Request::SampleHz(hz, r))??)
    }

    /// What the host side records: the trace and the API's captures.
    pub fn recorder(&self) -> &Recorder {
        &self.recorder
    }

    /// The VM's counters now.
    pub fn metrics(&self) -> Result<VmCounters, VmError> {
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

    /// Whether the VM is paused now.
    pub fn is_paused(&self) -> Result<bool, VmError> {
        self.ask(Request::Paused)
    }

    /// Stops the VM; [`Vmm::run`] then returns with [`VmEnd::Stopped`].
    pub fn stop(&self) {
        if self.requests.send(Request::Stop).is_ok() {
            let _ = self.wake.write(1);
        }
    }
}

/// A built VM.
pub struct Vmm {
    vm: Arc<VmFd>,
    shared: Arc<Shared>,
    vcpus: Vec<Vcpu>,
    spec: MachineSpec,
    outputs_metrics: Option<crate::vmm::output::RewriteFile>,
    host: HostConfig,
    requests: Receiver<Request>,
    handle: VmmHandle,
    api: Option<ApiListeners>,
    /// The snapshot this VM was restored from: a diff's first parent.
    pub(super) parent: Option<crate::vmm::snapshot::ParentRef>,
}

impl Vmm {
    /// Wraps a created (and booted or restored) machine.
    pub(super) fn new(
        machine: Machine,
        virtio: VirtioBus,
        outputs: RunOutputs,
        host: &HostConfig,
    ) -> Result<Vmm, VmError> {
        let Machine {
            vm,
            mem,
            mut bus,
            ioapic,
            mut vcpus,
            xsave_size,
            msr_indices,
            spec,
        } = machine;
        if host.snapshots.on_port {
            bus.claim_snapshot_port();
        }
        let recorder = Arc::new(Recorder::new(
            outputs.trace,
            host.api.sock.is_some() || host.api.listen.is_some(),
            host.profiling.sample_hz,
        ));
        if recorder.keeps_records() {
            let stacks = host.profiling.stacks;
            vcpus.iter_mut().for_each(|v| v.trace_records(stacks));
        }
        let eventfd = || {
            EventFd::new(EFD_NONBLOCK).map_err(|source| VmError::Thread {
                what: "control",
                source,
            })
        };
        let shared = Arc::new(Shared {
            mem,
            bus: Arc::new(Mutex::new(bus)),
            virtio,
            ioapic,
            stop: Default::default(),
            xsave_size,
            msr_indices,
            recorder: Arc::clone(&recorder),
            exit: eventfd()?,
            snapshot_point: eventfd()?,
        });
        if host.snapshots.diff {
            crate::vmm::machine::log_dirty_pages(&vm, &shared.mem)?;
        }
        let api = ApiListeners::bind(&host.api)?;
        let (sender, requests) = channel();
        Ok(Vmm {
            vm,
            shared,
            vcpus,
            spec,
            outputs_metrics: outputs.metrics,
            host: host.clone(),
            requests,
            handle: VmmHandle {
                requests: sender,
                wake: Arc::new(eventfd()?),
                recorder,
            },
            api,
            parent: None,
        })
    }

    /// A handle to drive the VM while it runs.
    pub fn handle(&self) -> VmmHandle {
        self.handle.clone()
    }

    /// Runs the VM to its end: the vCPU threads, then the control thread,
    /// whose result this returns. The calling thread gets no seccomp filter.
    pub fn run(self) -> Result<RunOutcome, VmError> {
        register_signal_handler(SIGRTMIN(), kick_handler).map_err(|e| VmError::Signal {
            what: "the vCPU kick",
            source: e.into(),
        })?;
        // Registered before any vCPU runs, so that no stop signal is lost.
        let stop_signals = self
            .host
            .stop_on_signals
            .then(StopSignals::register)
            .transpose()
            .map_err(|source| VmError::Signal {
                what: "SIGINT, SIGTERM and SIGHUP",
                source,
            })?;
        let sampled = self
            .spec
            .profile
            .caps()
            .is_some_and(|c| c.supported.intersects(LwpFeatures::CNH | LwpFeatures::RNH));
        let sample_hz = sampled.then_some(self.host.profiling.sample_hz);
        if !sampled {
            self.shared.recorder.note_sample_hz(0);
        }
        let metrics: Vec<Arc<VcpuMetrics>> = self.vcpus.iter().map(Vcpu::metrics).collect();
        let seccomp = self.host.seccomp;
        // Devices first: a vCPU may notify a queue at its first instruction.
        let device_metrics = self.shared.virtio.metrics();
        let devices =
            DeviceThread::start(&self.shared.virtio, Arc::clone(&self.shared.mem), seccomp)?;
        let mut handles: Vec<VcpuHandle> = Vec::new();
        for vcpu in self.vcpus {
            match vcpu.start(Arc::clone(&self.shared), seccomp) {
                Ok(handle) => handles.push(handle),
                Err(source) => {
                    // The vCPUs already running must not outlive the run.
                    self.shared.stop.store(true, Ordering::Release);
                    for h in handles {
                        h.send(VcpuEvent::Finish);
                        let _ = h.join();
                    }
                    if let Some(d) = devices {
                        let _ = d.finish();
                    }
                    return Err(VmError::Thread {
                        what: "vCPU",
                        source,
                    });
                }
            }
        }
        let wake = self
            .handle
            .wake
            .try_clone()
            .map_err(|source| VmError::Thread {
                what: "control",
                source,
            })?;
        let control = Control {
            vm: self.vm,
            shared: self.shared,
            vcpus: handles,
            devices,
            metrics,
            device_metrics,
            metrics_file: self.outputs_metrics,
            spec: self.spec,
            plan: self.host.snapshots.clone(),
            sample_hz,
            requests: (self.requests, wake),
            stop_signals,
            parent: self.parent,
            numbered: 0,
        };
        let control = thread::Builder::new()
            .name("lwpvmm-control".into())
            .spawn(move || control.run(seccomp))
            .map_err(|source| VmError::Thread {
                what: "control",
                source,
            })?;
        // After the control thread, which answers what the API asks; a
        // failure here stops the VM it started.
        let api = match self.api.map(|a| a.start(self.handle.clone(), seccomp)) {
            Some(Err(e)) => {
                self.handle.stop();
                let _ = control.join();
                return Err(e.into());
            }
            started => started.and_then(Result::ok),
        };
        let outcome = control
            .join()
            .map_err(|_| VmError::Panicked("control".into()));
        if let Some(api) = api {
            api.finish();
        }
        outcome?
    }
}
