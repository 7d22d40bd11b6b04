//! The VMM: one object that owns a machine for its whole life. The builder
//! makes it (booted, or restored from a snapshot); [`Vmm::run`] starts the
//! vCPU threads and the control thread and returns how the VM ended. A
//! [`VmmHandle`], taken before or while it runs, pauses, resumes,
//! snapshots, reads the metrics of and stops the running VM from any thread:
//! what a control API drives.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, channel};
use std::thread;

use kvm_ioctls::VmFd;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};
use vmm_sys_util::signal::{SIGRTMIN, register_signal_handler};

use crate::lwp::cpuid::LwpFeatures;
use crate::vmm::base::metrics::VcpuMetrics;
use crate::vmm::base::recorder::Recorder;
use crate::vmm::base::request::{Request, VmmHandle};
use crate::vmm::base::signals::StopSignals;
use crate::vmm::config::HostConfig;
use crate::vmm::control::{ControlSetup, ControlThread, RunningThreads};
use crate::vmm::devices::virtio::VirtioBus;
use crate::vmm::devices::virtio::worker::DeviceThread;
use crate::vmm::error::VmError;
use crate::vmm::machine::{Machine, MachineSpec};
use crate::vmm::outcome::RunOutcome;
use crate::vmm::output::RunOutputs;
use crate::vmm::vcpu::native;
use crate::vmm::vcpu::syscall_quirk::SyscallFixup;
use crate::vmm::vcpu::{Vcpu, VcpuEvent, VcpuHandle, VcpuShared, VmDevices, kick_handler};

/// The host sockets a VM's devices bound, removed when the run ends (by
/// the thread that runs it: the device threads may not unlink).
struct SocketFiles(Vec<std::path::PathBuf>);

impl Drop for SocketFiles {
    fn drop(&mut self) {
        use std::os::unix::fs::FileTypeExt;
        for path in &self.0 {
            if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// A built VM.
pub struct Vmm {
    vm: Arc<VmFd>,
    shared: Arc<VcpuShared>,
    vcpus: Vec<Vcpu>,
    spec: MachineSpec,
    outputs_metrics: Option<crate::vmm::output::RewriteFile>,
    host: HostConfig,
    requests: Receiver<Request>,
    handle: VmmHandle,
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
            native,
        } = machine;
        let mut msr_indices = msr_indices;
        if native && !msr_indices.contains(&native::MSR_NATIVE) {
            // Saved with the vCPUs, so a snapshot resumes native.
            msr_indices.push(native::MSR_NATIVE);
        }
        if host.snapshots.on_port {
            bus.claim_snapshot_port();
        }
        let recorder = Arc::new(Recorder::new(
            outputs.trace,
            host.api_served,
            host.profiling.sample_hz,
        ));
        recorder.set_whole_guest(host.profiling.kernel);
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
        // In native mode SYSCALL switches to the kernel as it should: the
        // quirk is emulated mode's (`auto` leaves it off there).
        let syscall_fixup = host
            .syscall_fixup
            .enabled_for(native)
            .then(SyscallFixup::new)
            .transpose()
            .map_err(|source| VmError::Thread {
                what: "control",
                source,
            })?;
        let devices = VmDevices {
            mem,
            bus,
            virtio,
            ioapic,
        };
        let shared = Arc::new(
            VcpuShared::new(
                devices,
                xsave_size,
                msr_indices,
                Arc::clone(&recorder),
                syscall_fixup,
                native,
            )
            .map_err(|source| VmError::Thread {
                what: "control",
                source,
            })?,
        );
        if host.snapshots.diff {
            crate::vmm::machine::log_dirty_pages(&vm, &shared.mem)?;
        }
        let (sender, requests) = channel();
        Ok(Vmm {
            vm,
            shared,
            vcpus,
            spec,
            outputs_metrics: outputs.metrics,
            host: host.clone(),
            requests,
            handle: VmmHandle::new(sender, Arc::new(eventfd()?), recorder),
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
        // Sampled clocks need the sampler; so does a whole-guest profile.
        let sampled = self.host.profiling.kernel
            || self
                .spec
                .profile
                .caps()
                .is_some_and(|c| c.supported.intersects(LwpFeatures::CNH | LwpFeatures::RNH));
        let sample_hz = sampled.then_some(self.host.profiling.sample_hz);
        if !sampled {
            self.shared.recorder.note_sample_hz(0);
        }
        let metrics: Vec<Arc<VcpuMetrics>> = self.vcpus.iter().map(Vcpu::metrics).collect();
        // Removed when this returns, however it returns.
        let _sockets = SocketFiles(self.shared.virtio.socket_paths());
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
            .wake()
            .try_clone()
            .map_err(|source| VmError::Thread {
                what: "control",
                source,
            })?;
        let threads = RunningThreads {
            vcpus: handles,
            vcpu_metrics: metrics,
            devices,
            device_metrics,
        };
        let setup = ControlSetup {
            metrics_file: self.outputs_metrics,
            plan: self.host.snapshots.clone(),
            sample_hz,
            requests: (self.requests, wake),
            stop_signals,
            parent: self.parent,
        };
        let control = ControlThread::new(self.vm, self.shared, threads, self.spec, setup);
        let control = thread::Builder::new()
            .name("lwpvmm-control".into())
            .spawn(move || control.run(seccomp))
            .map_err(|source| VmError::Thread {
                what: "control",
                source,
            })?;
        control
            .join()
            .map_err(|_| VmError::Panicked("control".into()))?
    }
}
