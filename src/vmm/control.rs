//! The control thread of a running VM: an event-manager loop over the VM's
//! end, requests from [`VmmHandle`](crate::vmm::base::request::VmmHandle)s, snapshot
//! points, the snapshot timer, the sampler, SIGUSR1/SIGUSR2, SIGINT/SIGTERM/SIGHUP
//! and console input. It pauses, resumes and snapshots the vCPUs through
//! their handles (channels: nothing polls, nothing sleeps), and at the end
//! stops and joins them. Its seccomp filter goes on once the loop's
//! descriptors exist.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use event_manager::{EventManager, MutEventSubscriber, SubscriberOps};
use kvm_ioctls::VmFd;
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;

use crate::vmm::base::control_error::ControlError;
use crate::vmm::base::metrics::{DeviceMetrics, VcpuMetrics, VmCounters, VmMetrics};
use crate::vmm::base::request::{Request, SnapshotInfo, SnapshotKind};
use crate::vmm::base::seccomp::{self, SeccompMode, ThreadKind};
use crate::vmm::base::signals::{self, StopSignals};
use crate::vmm::config::SnapshotPlan;
use crate::vmm::control_events::{
    Seen, Sources, arm_sampler, signal_pipe, stdin_is_terminal, timer, timer_error,
};
use crate::vmm::devices::port_bus::GuestEnd;
use crate::vmm::devices::virtio::worker::DeviceThread;
use crate::vmm::error::VmError;
use crate::vmm::machine::MachineSpec;
use crate::vmm::outcome::{RunOutcome, VmEnd, metrics_document};
use crate::vmm::output::{RewriteFile, replace_json};
use crate::vmm::snapshot::{self, MemoryLayout, ParentRef, SnapshotError, VmKvmState, VmSnapshot};
use crate::vmm::vcpu::native::WATCH_PERIOD;
use crate::vmm::vcpu::{VcpuEvent, VcpuHandle, VcpuResponse, VcpuShared, VcpuStop};

/// What the control thread needs of the VM itself, beside its vCPUs,
/// devices and memory: KVM's VM-wide state and its dirty log, for
/// snapshots. A `VmFd`; the control thread's tests pass a VM without KVM.
pub trait VmOps: Send + Sync {
    /// The VM-wide KVM state (kvmclock), read while the vCPUs are paused.
    fn kvm_state(&self) -> Result<VmKvmState, SnapshotError>;
    /// KVM's bitmap of the pages written in memory slot `slot` (`len`
    /// bytes) since the last call, which clears it.
    fn dirty_log(&self, slot: u32, len: usize) -> Result<Vec<u64>, kvm_ioctls::Error>;
}

impl VmOps for VmFd {
    fn kvm_state(&self) -> Result<VmKvmState, SnapshotError> {
        VmKvmState::capture(self)
    }

    fn dirty_log(&self, slot: u32, len: usize) -> Result<Vec<u64>, kvm_ioctls::Error> {
        self.get_dirty_log(slot, len)
    }
}

/// The threads a control thread watches, and their counters.
pub struct RunningThreads {
    /// The running vCPUs.
    pub vcpus: Vec<VcpuHandle>,
    /// Their counters.
    pub vcpu_metrics: Vec<Arc<VcpuMetrics>>,
    /// The virtio device thread, when the VM has devices.
    pub devices: Option<DeviceThread>,
    /// Each virtio device's counters.
    pub device_metrics: Vec<Arc<DeviceMetrics>>,
}

/// How a control thread runs: where its output goes, what it is asked
/// and what it was told.
pub struct ControlSetup {
    /// The metrics file.
    pub metrics_file: Option<RewriteFile>,
    /// When and where to take snapshots.
    pub plan: SnapshotPlan,
    /// The sampler's rate (0: stopped), when the profile has clock events
    /// to sample.
    pub sample_hz: Option<u32>,
    /// Requests from handles, and the descriptor that wakes the loop for
    /// them.
    pub requests: (Receiver<Request>, EventFd),
    /// SIGINT, SIGTERM and SIGHUP, when the VM stops on them.
    pub stop_signals: Option<StopSignals>,
    /// The snapshot the VM was restored from: what a first diff snapshot
    /// is on top of.
    pub parent: Option<ParentRef>,
}

/// Everything the control thread owns.
pub struct ControlThread {
    /// The VM (its clock and dirty log for snapshots).
    vm: Arc<dyn VmOps>,
    /// What the vCPUs share.
    shared: Arc<VcpuShared>,
    /// The running vCPUs.
    vcpus: Vec<VcpuHandle>,
    /// The virtio device thread, when the VM has devices.
    devices: Option<DeviceThread>,
    /// The vCPUs' counters.
    vcpu_metrics: Vec<Arc<VcpuMetrics>>,
    /// Each virtio device's counters.
    device_metrics: Vec<Arc<DeviceMetrics>>,
    /// The VM's own counters (snapshots), which this thread keeps.
    vm_metrics: VmMetrics,
    /// The metrics file.
    metrics_file: Option<RewriteFile>,
    /// What the machine is.
    spec: MachineSpec,
    /// When and where to take snapshots.
    plan: SnapshotPlan,
    /// The sampler's rate (0: stopped), when the profile has clock events
    /// to sample; a request can change it while the VM runs.
    sample_hz: Option<u32>,
    /// Requests from handles, and the descriptor that wakes the loop for
    /// them.
    requests: (Receiver<Request>, EventFd),
    /// SIGINT, SIGTERM and SIGHUP, when the VM stops on them.
    stop_signals: Option<StopSignals>,
    /// The last snapshot written (or restored from): what a diff snapshot
    /// is on top of.
    parent: Option<ParentRef>,
    /// Snapshots written into numbered directories (`--snapshot-diff`).
    numbered: u32,
}

impl ControlThread {
    /// The control thread of `vm` (a machine of `spec`), whose vCPUs share
    /// `shared`, over the running `threads`, set up as `setup` says; no
    /// snapshot counted or numbered yet.
    pub fn new(
        vm: Arc<dyn VmOps>,
        shared: Arc<VcpuShared>,
        threads: RunningThreads,
        spec: MachineSpec,
        setup: ControlSetup,
    ) -> ControlThread {
        ControlThread {
            vm,
            shared,
            vcpus: threads.vcpus,
            devices: threads.devices,
            vcpu_metrics: threads.vcpu_metrics,
            device_metrics: threads.device_metrics,
            vm_metrics: VmMetrics::default(),
            metrics_file: setup.metrics_file,
            spec,
            plan: setup.plan,
            sample_hz: setup.sample_hz,
            requests: setup.requests,
            stop_signals: setup.stop_signals,
            parent: setup.parent,
            numbered: 0,
        }
    }

    /// Runs the VM to its end.
    pub fn run(mut self, seccomp: SeccompMode) -> Result<RunOutcome, VmError> {
        let event_err = |e: event_manager::Error| VmError::EventLoop(format!("{e:?}"));
        let clone = |fd: &EventFd| {
            fd.try_clone().map_err(|source| VmError::Thread {
                what: "control",
                source,
            })
        };
        let sources = Arc::new(Mutex::new(Sources {
            exit: clone(&self.shared.exit)?,
            snapshot_point: clone(&self.shared.snapshot_point)?,
            wake: clone(&self.requests.1)?,
            syscall_entry: self
                .shared
                .syscall_fixup
                .as_ref()
                .map(|f| clone(&f.armed))
                .transpose()?,
            timer: match (&self.plan.dir, self.plan.after) {
                (Some(_), Some(after)) => Some(timer(Some(after.max(Duration::from_millis(1))))?),
                _ => None,
            },
            sampler: self
                .sample_hz
                .map(|hz| {
                    let mut t = timer(None)?;
                    arm_sampler(&mut t, hz)?;
                    Ok::<_, VmError>(t)
                })
                .transpose()?,
            watch: self
                .shared
                .native
                .then(|| {
                    let mut t = timer(None)?;
                    t.reset(WATCH_PERIOD, Some(WATCH_PERIOD))
                        .map_err(timer_error)?;
                    Ok::<_, VmError>(t)
                })
                .transpose()?,
            // Always installed: without --metrics or --snapshot-dir the
            // signal is answered with a log line, never the default
            // action, which would end the VM.
            sigusr1: Some(signal_pipe(signal_hook::consts::SIGUSR1, "SIGUSR1")?),
            sigusr2: Some(signal_pipe(signal_hook::consts::SIGUSR2, "SIGUSR2")?),
            stop_signals: self.stop_signals.take(),
            stdin: stdin_is_terminal().then(std::io::stdin),
            bus: Arc::clone(&self.shared.bus),
            seen: Seen::default(),
        }));
        let mut manager =
            EventManager::<Arc<Mutex<dyn MutEventSubscriber + Send>>>::new().map_err(event_err)?;
        manager.add_subscriber(sources.clone());
        seccomp::install(ThreadKind::Control, seccomp, "control")?;
        log::info!(
            "ready: {} vCPU(s) running (pid {}); SIGUSR1 writes the metrics, SIGUSR2 takes a snapshot",
            self.vcpus.len(),
            std::process::id()
        );
        let mut errors = Vec::new();
        // A metrics file holds a whole document from the start.
        self.write_metrics(Ok(None), &[]);
        let mut paused = false;
        let signal = loop {
            let seen = sources
                .lock()
                .map(|mut s| std::mem::take(&mut s.seen))
                .unwrap_or(Seen {
                    done: true,
                    ..Seen::default()
                });
            if seen.done {
                break seen.signal;
            }
            if seen.metrics {
                if self.metrics_file.is_none() {
                    log::warn!(
                        "SIGUSR1 writes the metrics to the --metrics file: this run has none"
                    );
                }
                self.write_metrics(Ok(None), &[]);
            }
            if seen.snapshot.contains(&"SIGUSR2") && self.plan.dir.is_none() {
                log::warn!("SIGUSR2 takes a snapshot into --snapshot-dir: this run has none");
            }
            if seen.syscall_entry {
                // A halted vCPU has no exit of its own before it runs a
                // process: the kick makes it set its breakpoint now.
                self.vcpus.iter().for_each(VcpuHandle::kick);
            }
            if seen.watch && !paused {
                self.vcpus.iter().for_each(VcpuHandle::kick_watch);
            }
            if seen.samples > 0 && !paused {
                let every = self.shared.recorder.whole_guest();
                self.vcpus.iter().for_each(|h| h.kick_sample(every));
            }
            if !seen.snapshot.is_empty()
                && let Some((dir, kind)) = self.next_planned()
                && let Err(e) = self.snapshot(&dir, kind, &mut paused, &seen.snapshot.join(" and "))
            {
                log::error!("{e}");
                errors.push(e.to_string());
            }
            if seen.requests && self.requests(&mut paused, &sources) {
                break None;
            }
            manager.run().map_err(event_err)?;
        };
        self.finish(signal, errors)
    }

    /// Answers every waiting request; true when one asks to stop.
    fn requests(&mut self, paused: &mut bool, sources: &Mutex<Sources>) -> bool {
        while let Ok(request) = self.requests.0.try_recv() {
            match request {
                Request::Pause(reply) => {
                    let _ = reply.send(self.pause(paused));
                }
                Request::Resume(reply) => {
                    let _ = reply.send(self.resume(paused));
                }
                Request::Snapshot(dir, kind, reply) => {
                    let _ = reply.send(self.snapshot(&dir, kind, paused, "a request"));
                }
                Request::Metrics(reply) => {
                    let _ = reply.send(VmCounters::of(
                        &self.vcpu_metrics,
                        &self.device_metrics,
                        &self.vm_metrics,
                    ));
                }
                Request::FlushMetrics(reply) => {
                    let _ = reply.send(self.flush_metrics());
                }
                Request::ReplaceDisk(index, path, reply) => {
                    let done = self
                        .shared
                        .virtio
                        .replace_disk(index, &path)
                        .map_err(|e| ControlError::Drive(e.to_string()));
                    let _ = reply.send(done);
                }
                Request::Paused(reply) => {
                    let _ = reply.send(*paused);
                }
                Request::SampleHz(hz, reply) => {
                    let _ = reply.send(self.set_sample_hz(hz, sources));
                }
                Request::Stop => return true,
            }
        }
        false
    }

    /// Sets the sampler's rate.
    fn set_sample_hz(&mut self, hz: u32, sources: &Mutex<Sources>) -> Result<(), ControlError> {
        if self.sample_hz.is_none() {
            return Err(ControlError::NoSampler);
        }
        let mut s = sources
            .lock()
            .map_err(|_| ControlError::host("the control loop", "its lock is poisoned"))?;
        if let Some(t) = s.sampler.as_mut() {
            arm_sampler(t, hz).map_err(|e| ControlError::host("arming the sampler", e))?;
        }
        self.sample_hz = Some(hz);
        self.shared.recorder.note_sample_hz(hz);
        Ok(())
    }

    /// Pauses every vCPU (waits until each is at its consistent point).
    fn pause(&mut self, paused: &mut bool) -> Result<(), ControlError> {
        if *paused {
            return Ok(());
        }
        let stopped = ControlError::Stopped("every vCPU paused");
        for h in &self.vcpus {
            if !h.send(VcpuEvent::Pause) {
                return Err(stopped);
            }
        }
        for h in &self.vcpus {
            match h.recv() {
                Some(VcpuResponse::Paused) => {}
                Some(other) => {
                    return Err(ControlError::Protocol {
                        who: "a vCPU",
                        answer: format!("{other:?}"),
                        asked: "a pause",
                    });
                }
                None => return Err(stopped),
            }
        }
        // After the vCPUs, so that no notification arrives once it waits.
        if let Some(d) = &self.devices {
            d.pause()?;
        }
        *paused = true;
        Ok(())
    }

    /// Lets every paused vCPU run again.
    fn resume(&mut self, paused: &mut bool) -> Result<(), ControlError> {
        if !*paused {
            return Ok(());
        }
        if let Some(d) = &self.devices {
            d.resume()?;
        }
        for h in &self.vcpus {
            h.send(VcpuEvent::Resume);
        }
        for h in &self.vcpus {
            if !matches!(h.recv(), Some(VcpuResponse::Resumed)) {
                return Err(ControlError::Stopped("every vCPU resumed"));
            }
        }
        *paused = false;
        Ok(())
    }

    /// Where the next planned snapshot (SIGUSR2, the timer, the port) goes:
    /// `--snapshot-dir`, or with `--snapshot-diff` its numbered
    /// subdirectories, the first full and each later one a diff.
    fn next_planned(&mut self) -> Option<(PathBuf, SnapshotKind)> {
        let dir = self.plan.dir.clone()?;
        if !self.plan.diff {
            return Some((dir, SnapshotKind::Full));
        }
        let kind = if self.parent.is_some() {
            SnapshotKind::Diff
        } else {
            SnapshotKind::Full
        };
        let numbered = dir.join(self.numbered.to_string());
        self.numbered += 1;
        Some((numbered, kind))
    }

    /// Pauses the VM (unless it is paused), writes a snapshot to `dir`,
    /// and resumes it if it was running; `why` names what asked for it.
    fn snapshot(
        &mut self,
        dir: &Path,
        kind: SnapshotKind,
        paused: &mut bool,
        why: &str,
    ) -> Result<SnapshotInfo, ControlError> {
        let started = Instant::now();
        let was_paused = *paused;
        let fail = |e: ControlError| ControlError::Snapshot {
            dir: dir.to_owned(),
            source: Box::new(e),
        };
        self.pause(paused).map_err(fail)?;
        let pause_time = started.elapsed();
        let result = self.write_snapshot(dir, kind).map_err(fail);
        if result.is_err() {
            // The dirty pages taken for it are gone: only a full snapshot
            // can follow.
            self.parent = None;
        }
        if !was_paused {
            self.resume(paused).map_err(fail)?;
        }
        let (state_bytes, memory_bytes) = result?;
        self.vm_metrics.snapshots.fetch_add(1, Ordering::Relaxed);
        let info = SnapshotInfo {
            dir: dir.to_owned(),
            state_bytes,
            memory_bytes,
            pause_time,
            total_time: started.elapsed(),
        };
        log::info!(
            "{} snapshot written to {} for {why} in {:.1} ms, the VM paused throughout ({:.1} ms of it to pause the vCPUs; {state_bytes} bytes of state, {memory_bytes} bytes of memory)",
            match kind {
                SnapshotKind::Full => "full",
                SnapshotKind::Diff => "diff",
            },
            dir.display(),
            info.total_time.as_secs_f64() * 1e3,
            info.pause_time.as_secs_f64() * 1e3
        );
        Ok(info)
    }

    /// The pages written since the last call, one bit per 4 KiB page of
    /// each region: KVM's dirty log (the guest's own writes, and KVM's)
    /// merged with guest memory's bitmap (lwpvmm's writes: LWP records,
    /// LWPCB write-backs, page-table Accessed/Dirty bits, exception frames,
    /// the virtio devices). Both are cleared.
    fn take_dirty(&self) -> Result<Vec<Vec<u64>>, ControlError> {
        let mem = &self.shared.mem;
        let mut out = Vec::new();
        for (slot, region) in mem.iter().enumerate() {
            let len = region.len() as usize;
            let kvm = self
                .vm
                .dirty_log(slot as u32, len)
                .map_err(|e| ControlError::host("KVM_GET_DIRTY_LOG", e))?;
            let ours = vm_memory::MmapRegion::bitmap(region).get_and_reset();
            let words = len.div_ceil(4096).div_ceil(64);
            out.push(
                (0..words)
                    .map(|i| kvm.get(i).copied().unwrap_or(0) | ours.get(i).copied().unwrap_or(0))
                    .collect(),
            );
        }
        Ok(out)
    }

    fn write_snapshot(
        &mut self,
        dir: &Path,
        kind: SnapshotKind,
    ) -> Result<(u64, u64), ControlError> {
        let create = |dir: &Path| {
            crate::hostfs::Dir::create(dir)
                .map(drop)
                .map_err(|e| ControlError::Directory {
                    path: dir.to_owned(),
                    reason: e.to_string(),
                })
        };
        let parent = match kind {
            SnapshotKind::Full => None,
            SnapshotKind::Diff => {
                if !self.plan.diff {
                    return Err(ControlError::DiffUntracked);
                }
                let parent = self.parent.clone().ok_or(ControlError::NoParent)?;
                create(dir)?;
                if std::path::absolute(dir).map_err(|e| ControlError::host("getcwd", e))?
                    == parent.dir
                {
                    return Err(ControlError::ParentDirectory(dir.to_owned()));
                }
                Some(parent)
            }
        };
        let mut vcpus = Vec::new();
        for h in &self.vcpus {
            h.send(VcpuEvent::SaveState);
        }
        for h in &self.vcpus {
            match h.recv() {
                Some(VcpuResponse::State(state)) => vcpus.push((*state)?),
                _ => return Err(ControlError::Stopped("every vCPU saved its state")),
            }
        }
        let vm = self
            .vm
            .kvm_state()
            .map_err(|e| ControlError::host("KVM_GET_CLOCK", e))?;
        let devices = self.shared.virtio.snapshot()?;
        let (serial, pm) = {
            let bus = self
                .shared
                .bus
                .lock()
                .map_err(|_| ControlError::host("the port bus", "its lock is poisoned"))?;
            (bus.serial_state(), bus.pm_state())
        };
        create(dir)?;
        let (crc64, pages, memory_bytes) = if parent.is_some() {
            let dirty = self.take_dirty()?;
            let d = snapshot::write_diff_memory(dir, &self.shared.mem, &dirty)
                .map_err(|e| ControlError::host("writing the memory file", e))?;
            (d.crc64, d.pages, d.bytes)
        } else {
            if self.plan.diff {
                // The base the next diff counts from.
                self.take_dirty()?;
            }
            let (crc64, bytes) = snapshot::write_memory(dir, &self.shared.mem)
                .map_err(|e| ControlError::host("writing the memory file", e))?;
            (crc64, Vec::new(), bytes)
        };
        let state = VmSnapshot {
            lwpvmm_version: env!("CARGO_PKG_VERSION").into(),
            profile: self.spec.profile,
            guest: self.spec.guest,
            memory: MemoryLayout {
                regions: snapshot::layout(&self.shared.mem),
                crc64,
                parent,
                pages,
            },
            vm,
            ioapic: self.shared.ioapic.state(),
            serial,
            pm,
            devices,
            vcpus,
        };
        let (state_bytes, state_crc) = snapshot::write_state(dir, &state)
            .map_err(|e| ControlError::host("writing the state file", e))?;
        self.parent = Some(ParentRef {
            dir: std::path::absolute(dir).map_err(|e| ControlError::host("getcwd", e))?,
            state_crc,
        });
        Ok((state_bytes, memory_bytes))
    }

    /// Writes the metrics file (when there is one): how the run ended
    /// (`None` while it runs), or the error it ended on. A failure is
    /// logged, and returned when the run has ended.
    fn write_metrics(
        &self,
        end: Result<Option<VmEnd>, &VmError>,
        lwp: &[crate::lwp::unit::UnitStats],
    ) -> Option<String> {
        let file = self.metrics_file.as_ref()?;
        let counters = VmCounters::of(&self.vcpu_metrics, &self.device_metrics, &self.vm_metrics);
        let mut document = metrics_document(end.ok().flatten(), &counters, lwp);
        document.error = end.err().map(ToString::to_string);
        let e = replace_json(file, &document).err()?.to_string();
        log::error!("{e}");
        matches!(end, Ok(Some(_))).then_some(e)
    }

    /// Writes the metrics file now, for a request.
    fn flush_metrics(&self) -> Result<(), ControlError> {
        let file = self
            .metrics_file
            .as_ref()
            .ok_or(ControlError::NoMetricsFile)?;
        let counters = VmCounters::of(&self.vcpu_metrics, &self.device_metrics, &self.vm_metrics);
        let document = metrics_document(None, &counters, &[]);
        replace_json(file, &document).map_err(|e| ControlError::host("writing the metrics file", e))
    }

    /// Stops and joins every vCPU, flushes the console and the trace, writes
    /// the metrics, and says how the VM ended.
    fn finish(
        mut self,
        signal: Option<i32>,
        mut errors: Vec<String>,
    ) -> Result<RunOutcome, VmError> {
        self.shared.stop.store(true, Ordering::Release);
        for h in &self.vcpus {
            h.send(VcpuEvent::Finish);
        }
        let devices = self.devices.take().map(DeviceThread::finish);
        let mut first: Option<Result<GuestEnd, VmError>> = None;
        let mut lwp = Vec::new();
        for (id, h) in std::mem::take(&mut self.vcpus).into_iter().enumerate() {
            let (result, stats) = h
                .join()
                .map_err(|_| VmError::Panicked(format!("vCPU {id}")))?;
            lwp.push(stats);
            let r = match result {
                Ok(VcpuStop::Ended(end)) => Some(Ok(end)),
                Ok(VcpuStop::Stopped) => None,
                Err(e) => Some(Err(VmError::from(e))),
            };
            if first.is_none() {
                first = r;
            }
        }
        if let Some(Err(e)) = devices {
            errors.push(e.to_string());
        }
        if let Ok(mut b) = self.shared.bus.lock() {
            b.flush();
            if let Some(e) = b.take_console_error() {
                errors.push(VmError::Console(e).to_string());
            }
        }
        if self.shared.recorder.flush().is_err() {
            self.vcpu_metrics[0]
                .trace_errors
                .fetch_add(1, Ordering::Relaxed);
        }
        let end = match (first, signal) {
            (Some(Err(e)), _) => {
                // What was counted is written also when the VM failed.
                self.write_metrics(Err(&e), &lwp);
                return Err(e);
            }
            (Some(Ok(end)), _) => VmEnd::Guest(end),
            (None, Some(signal)) => {
                log::info!("{} received: the VM was stopped", signals::name(signal));
                VmEnd::Signal(signal)
            }
            (None, None) => VmEnd::Stopped,
        };
        if !matches!(end, VmEnd::Signal(_)) {
            log::info!("the VM ended: {end}");
        }
        errors.extend(self.write_metrics(Ok(Some(end)), &lwp));
        Ok(RunOutcome {
            end,
            metrics: VmCounters::of(&self.vcpu_metrics, &self.device_metrics, &self.vm_metrics),
            lwp,
            errors,
        })
    }
}
