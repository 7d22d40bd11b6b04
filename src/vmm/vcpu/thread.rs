//! The thread that runs one vCPU: KVM_RUN in a loop, each exit dispatched
//! (exit.rs), and the VMM's events taken between runs, as run_state.rs's
//! table says. The VMM drives it through a [`VcpuHandle`]: events on a
//! channel, answered on another, and a kick (a signal whose handler makes
//! KVM_RUN return) so that a running vCPU sees them at once. A paused vCPU
//! blocks on its channel; nothing polls.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use kvm_bindings::kvm_run;
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::signal::{Killable, SIGRTMIN};

use super::context::ExitCx;
use super::exit::{Devices, ExitAction, act, handle_exit};
use super::host_sample;
use super::lwp;
use super::lwp_state::VcpuLwp;
use super::native;
use super::ops::{KvmVcpu, VcpuRun};
use super::pf_entry;
use super::protocol::{VcpuError, VcpuEvent, VcpuResponse, VcpuStep, VcpuStop, VcpuThreadResult};
use super::run_state::{self, Reply, RunState, Transition};
use super::syscall_quirk::SyscallFixup;
use crate::guard::paging::{Marking, translate};
use crate::guard::{Access, GuestMemory};
use crate::lwp::cpuid::{CpuidEntry, LwpFeatures};
use crate::lwp::unit::LwpUnit;
use crate::vmm::base::metrics::VcpuMetrics;
use crate::vmm::base::recorder::Recorder;
use crate::vmm::base::seccomp::{self, SeccompMode, ThreadKind};
use crate::vmm::devices::port_bus::PortBus;
use crate::vmm::vcpu::step::StepBackend;
use crate::vmm::vcpu::vcpu_state::VcpuSnapshot;

/// What every vCPU of a VM shares.
pub struct VcpuShared {
    /// Guest memory.
    pub mem: Arc<GuestMemory>,
    /// The port bus.
    pub bus: Arc<Mutex<PortBus>>,
    /// The virtio devices' register windows.
    pub virtio: crate::vmm::devices::virtio::VirtioBus,
    /// The IOAPIC.
    pub ioapic: Arc<crate::vmm::devices::ioapic::IoapicDevice>,
    /// Set when the VM is to stop.
    pub stop: AtomicBool,
    /// KVM_CAP_XSAVE2 of this VM.
    pub xsave_size: usize,
    /// The MSRs KVM lists as saveable.
    pub msr_indices: Vec<u32>,
    /// The trace, the API's captures and the guest's reported mappings.
    pub recorder: Arc<Recorder>,
    /// Written when a vCPU ends the VM (or fails).
    pub exit: EventFd,
    /// Written when a vCPU reaches a snapshot point.
    pub snapshot_point: EventFd,
    /// The SYSCALL quirk's fixup, when it is on.
    pub syscall_fixup: Option<SyscallFixup>,
    /// The kernel runs in the host's native supervisor mode: the control
    /// thread watches each vCPU ([`native::Watch`]).
    pub native: bool,
}

/// The devices a VM's vCPUs reach: guest memory and what lies on the
/// port bus and the virtio and interrupt lines.
pub struct VmDevices {
    /// Guest memory.
    pub mem: Arc<GuestMemory>,
    /// The port bus.
    pub bus: PortBus,
    /// The virtio devices' register windows.
    pub virtio: crate::vmm::devices::virtio::VirtioBus,
    /// The IOAPIC.
    pub ioapic: Arc<crate::vmm::devices::ioapic::IoapicDevice>,
}

impl VcpuShared {
    /// What the vCPUs of a VM with `devices` share: KVM's XSAVE size and
    /// saveable MSRs (`xsave_size`, `msr_indices`), the `recorder`, the
    /// SYSCALL quirk's fixup when it is on, whether the kernel runs
    /// `native`; not stopping yet, with fresh exit and snapshot-point
    /// descriptors.
    pub fn new(
        devices: VmDevices,
        xsave_size: usize,
        msr_indices: Vec<u32>,
        recorder: Arc<Recorder>,
        syscall_fixup: Option<SyscallFixup>,
        native: bool,
    ) -> std::io::Result<VcpuShared> {
        let eventfd = || EventFd::new(vmm_sys_util::eventfd::EFD_NONBLOCK);
        Ok(VcpuShared {
            mem: devices.mem,
            bus: Arc::new(Mutex::new(devices.bus)),
            virtio: devices.virtio,
            ioapic: devices.ioapic,
            stop: AtomicBool::new(false),
            xsave_size,
            msr_indices,
            recorder,
            exit: eventfd()?,
            snapshot_point: eventfd()?,
            syscall_fixup,
            native,
        })
    }
}

thread_local! {
    static KVM_RUN: Cell<*mut kvm_run> = const { Cell::new(std::ptr::null_mut()) };
}

/// The kick signal's handler: makes the vCPU thread's KVM_RUN return at
/// once (or not enter at all), so it sees what it was kicked for.
pub extern "C" fn kick_handler(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let run = KVM_RUN.with(Cell::get);
    if !run.is_null() {
        // SAFETY: the pointer is this thread's own kvm_run mapping, stored by
        // `Vcpu::run_loop` before the first KVM_RUN and cleared before the
        // mapping goes away; a signal handler on this thread can only run
        // while it is valid. immediate_exit is a plain byte KVM reads at entry.
        unsafe { (*run).immediate_exit = 1 };
    }
}

/// The cycles a vCPU ran between two sampling kicks.
#[derive(Debug, Default)]
struct SampleClock {
    tsc_khz: u32,
    last: Option<(u64, Option<Duration>)>,
}

impl SampleClock {
    /// The cycles of one sampling period at `hz` kicks a second (no limit
    /// when the sampler is off or the TSC's rate unknown). Between two
    /// kicks a vCPU's CPL3 code ran at most that long; the rest of a
    /// longer interval was its kernel's or the VMM's (a kernel at emulated
    /// CPL0 runs for many periods between two user samples), and charged
    /// to the next CPL3 sample it would make that sample's function look
    /// hotter than it is.
    fn period_cycles(&self, hz: u32) -> u64 {
        match (self.tsc_khz, hz) {
            (0, _) | (_, 0) => u64::MAX,
            (khz, hz) => u64::from(khz) * 1000 / u64::from(hz),
        }
    }

    /// Cycles since the last call: the thread's CPU time (which a preempted
    /// thread or a halted guest does not add to) at the TSC rate; the guest
    /// TSC's advance where either is unknown.
    fn cycles(&mut self, tsc: u64) -> u64 {
        let cpu = cpu_time::ThreadTime::try_now()
            .ok()
            .map(|t| t.as_duration());
        match (self.last.replace((tsc, cpu)), cpu) {
            (Some((_, Some(before))), Some(now)) if self.tsc_khz > 0 => {
                let nanos = now.saturating_sub(before).as_nanos();
                u64::try_from(nanos * u128::from(self.tsc_khz) / 1_000_000).unwrap_or(u64::MAX)
            }
            (Some((before, _)), _) => tsc.saturating_sub(before),
            (None, _) => 0,
        }
    }
}

/// A vCPU before its thread starts: a KVM vCPU, or in tests one that
/// exits on cue.
pub struct Vcpu<V = KvmVcpu> {
    kvm: V,
    lwp: VcpuLwp,
    cpuid: Vec<CpuidEntry>,
    clock: SampleClock,
    /// The guest TSC at this vCPU's last whole-guest sample.
    last_guest_sample: Option<u64>,
    metrics: Arc<VcpuMetrics>,
}

/// The thread side of a vCPU's channels.
struct Mailbox {
    events: Receiver<VcpuEvent>,
    responses: Sender<VcpuResponse>,
    pending: Arc<AtomicBool>,
    sample_due: Arc<AtomicBool>,
    watch_due: Arc<AtomicBool>,
    clock_armed: Arc<AtomicBool>,
}

impl Vcpu<KvmVcpu> {
    /// The KVM vCPU (the stepping probe).
    pub fn kvm(&mut self) -> &mut KvmVcpu {
        &mut self.kvm
    }

    /// The CPUID table it was given (KVM_SET_CPUID2).
    pub fn cpuid(&self) -> &[CpuidEntry] {
        &self.cpuid
    }

    /// The KVM vCPU's descriptor (booting, restoring its state).
    pub fn kvm_fd(&self) -> &kvm_ioctls::VcpuFd {
        self.kvm.fd()
    }
}

impl<V: VcpuRun + 'static> Vcpu<V> {
    /// A vCPU: `cpuid` is the table it was given (a snapshot saves it),
    /// `tsc_khz` its TSC rate (0 when unknown).
    pub fn new(kvm: V, cpuid: Vec<CpuidEntry>, lwp: VcpuLwp, tsc_khz: u32) -> Self {
        Vcpu {
            kvm,
            lwp,
            cpuid,
            clock: SampleClock {
                tsc_khz,
                last: None,
            },
            last_guest_sample: None,
            metrics: Arc::new(VcpuMetrics::default()),
        }
    }

    /// Its index.
    pub fn id(&self) -> u8 {
        self.kvm.id()
    }

    /// Its LWP state.
    pub fn lwp(&self) -> &VcpuLwp {
        &self.lwp
    }

    /// Its counters.
    pub fn metrics(&self) -> Arc<VcpuMetrics> {
        Arc::clone(&self.metrics)
    }

    /// Keeps a copy of every record its unit stores, for the trace, with
    /// call stacks when `stacks`.
    pub fn trace_records(&mut self, stacks: bool) {
        self.lwp.keep_log(stacks);
    }

    /// Starts its thread, which installs its seccomp filter before its first
    /// KVM_RUN.
    pub fn start(
        mut self,
        shared: Arc<VcpuShared>,
        seccomp: SeccompMode,
    ) -> std::io::Result<VcpuHandle> {
        let (event_tx, events) = channel();
        let (responses, response_rx) = channel();
        let pending = Arc::new(AtomicBool::new(false));
        let sample_due = Arc::new(AtomicBool::new(false));
        let watch_due = Arc::new(AtomicBool::new(false));
        let clock_armed = Arc::new(AtomicBool::new(false));
        let mailbox = Mailbox {
            events,
            responses,
            pending: Arc::clone(&pending),
            sample_due: Arc::clone(&sample_due),
            watch_due: Arc::clone(&watch_due),
            clock_armed: Arc::clone(&clock_armed),
        };
        let name = format!("vcpu{}", self.id());
        let thread = thread::Builder::new()
            .name(format!("lwpvmm-{name}"))
            .spawn(move || {
                let result = match seccomp::install(ThreadKind::Vcpu, seccomp, &name) {
                    Err(e) => Err(VcpuError::Seccomp(e)),
                    Ok(()) => self.run_loop(&shared, &mailbox),
                };
                if !matches!(result, Ok(VcpuStop::Stopped)) {
                    shared.stop.store(true, Ordering::Release);
                    let _ = shared.exit.write(1);
                }
                (
                    result,
                    self.lwp.unit().map(LwpUnit::stats).unwrap_or_default(),
                )
            })?;
        Ok(VcpuHandle {
            thread,
            events: event_tx,
            responses: response_rx,
            pending,
            sample_due,
            watch_due,
            clock_armed,
        })
    }

    fn run_loop(&mut self, shared: &VcpuShared, mailbox: &Mailbox) -> Result<VcpuStop, VcpuError> {
        if let Some(backend) = self.lwp.stepper.backend() {
            let counter = match backend {
                StepBackend::GuestDebug => &self.metrics.step_backend_guest_debug,
                StepBackend::TrapFlag => &self.metrics.step_backend_trap_flag,
            };
            counter.store(1, Ordering::Relaxed);
        }
        let run = self.kvm.prepare_thread();
        KVM_RUN.with(|c| c.set(run));
        // The SYSCALL fixup arms from the registers before the first entry
        // (a restored kernel has set LSTAR already): KVM stores them in the
        // sync-regs area at an exit, so one that enters nothing comes first.
        let result = match shared.syscall_fixup {
            Some(_) => self.settle().and_then(|()| self.exits(shared, mailbox)),
            None => self.exits(shared, mailbox),
        };
        KVM_RUN.with(|c| c.set(std::ptr::null_mut()));
        result
    }

    fn exits(&mut self, shared: &VcpuShared, mailbox: &Mailbox) -> Result<VcpuStop, VcpuError> {
        let mut hold = false;
        let mut watch = native::Watch::default();
        loop {
            if shared.stop.load(Ordering::Acquire) {
                return Ok(VcpuStop::Stopped);
            }
            if (mailbox.pending.swap(false, Ordering::AcqRel) || hold)
                && let Some(stop) = self.events(mailbox, shared, std::mem::take(&mut hold))?
            {
                return Ok(stop);
            }
            if let Some(fixup) = &shared.syscall_fixup {
                pf_entry::arm(&mut self.kvm, &shared.mem, fixup)?;
            }
            let id = self.kvm.id();
            let exit = self.kvm.run();
            let returned = Instant::now();
            let steps = self.metrics.steps.load(Ordering::Relaxed);
            let action = handle_exit(
                exit,
                &mut Devices {
                    id,
                    bus: &shared.bus,
                    virtio: &shared.virtio,
                    ioapic: &shared.ioapic,
                    mem: &shared.mem,
                    lwp: &mut self.lwp,
                    metrics: &self.metrics,
                },
            )?;
            if action == ExitAction::Interrupted {
                // A kick set it; the next KVM_RUN must enter the guest.
                self.kvm.set_immediate_exit(false);
            }
            let mut cx = ExitCx {
                vcpu: &mut self.kvm,
                lwp: &mut self.lwp,
                mem: &shared.mem,
                metrics: &self.metrics,
                recorder: &shared.recorder,
                syscall_fixup: shared.syscall_fixup.as_ref(),
            };
            let mut sampled = None;
            match act(action, &mut cx)? {
                VcpuStep::End(end) => return Ok(VcpuStop::Ended(end)),
                VcpuStep::SnapshotPoint => {
                    hold = true;
                    let _ = shared.snapshot_point.write(1);
                }
                VcpuStep::Interrupted => {
                    if mailbox.watch_due.swap(false, Ordering::AcqRel) {
                        watch_native(&mut cx, &mut watch, id)?;
                    }
                    if mailbox.sample_due.swap(false, Ordering::AcqRel) {
                        sampled = Some(Instant::now());
                        let cycles = self.clock.cycles(cx.vcpu.guest_tsc());
                        let charged = cycles.min(self.clock.period_cycles(cx.recorder.sample_hz()));
                        let dropped = if lwp::sample(&mut cx, charged) {
                            cycles - charged
                        } else {
                            cycles
                        };
                        cx.metrics
                            .sampler_cycles_dropped
                            .fetch_add(dropped, Ordering::Relaxed);
                        if cx.recorder.whole_guest() {
                            // The guest time since this vCPU's last sample:
                            // kicks a busy host delays or merges still count.
                            let tsc = cx.vcpu.guest_tsc();
                            let khz = u64::from(self.clock.tsc_khz);
                            let elapsed_ns = match self.last_guest_sample.replace(tsc) {
                                Some(before) if khz > 0 => {
                                    tsc.saturating_sub(before).saturating_mul(1_000_000) / khz
                                }
                                _ => 0,
                            };
                            host_sample::take(&mut cx, elapsed_ns);
                        }
                    }
                }
                VcpuStep::Continue => {}
            }
            lwp::after_exit(&mut cx)?;
            if let Some(t) = sampled {
                let ns = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
                self.metrics.sampler_ns.fetch_add(ns, Ordering::Relaxed);
            }
            if self.metrics.steps.load(Ordering::Relaxed) != steps {
                let ns = u64::try_from(returned.elapsed().as_nanos()).unwrap_or(u64::MAX);
                self.metrics.step_ns.fetch_add(ns, Ordering::Relaxed);
            }
            self.publish_clock(mailbox);
        }
    }

    /// Tells the sampler whether this vCPU's unit has a clock event armed
    /// (CNH or RNH in both LWP_CFG and the loaded LWPCB): only then is it
    /// kicked. On arming, the cycles counted so far start afresh, so that
    /// time run unarmed is never charged.
    fn publish_clock(&mut self, mailbox: &Mailbox) {
        let armed = self
            .lwp
            .unit()
            .is_some_and(|u| u.counts(LwpFeatures::CNH) || u.counts(LwpFeatures::RNH));
        if armed != mailbox.clock_armed.load(Ordering::Relaxed) {
            if armed {
                self.clock.cycles(self.kvm.guest_tsc());
            }
            mailbox.clock_armed.store(armed, Ordering::Release);
        }
    }

    /// Takes the events waiting, by the run-state table (`run_state`);
    /// `hold` pauses without being asked (a snapshot point). Returns how to
    /// leave the loop, if it must.
    fn events(
        &mut self,
        mailbox: &Mailbox,
        shared: &VcpuShared,
        hold: bool,
    ) -> Result<Option<VcpuStop>, VcpuError> {
        if hold {
            return self.paused(mailbox, shared, run_state::on_hold());
        }
        while let Ok(event) = mailbox.events.try_recv() {
            let step = run_state::on_event(RunState::Running, event);
            match step.next {
                RunState::Paused => {
                    if let Some(stop) = self.paused(mailbox, shared, step)? {
                        return Ok(Some(stop));
                    }
                }
                RunState::Stopped => return Ok(Some(VcpuStop::Stopped)),
                RunState::Running => self.reply(mailbox, shared, step.reply),
            }
        }
        Ok(None)
    }

    /// Enters Paused by `entry`: settles at a consistent point (KVM
    /// completes pending I/O and applies dirty registers, then returns
    /// without entering the guest), answers, then follows the events until
    /// resumed or finished.
    fn paused(
        &mut self,
        mailbox: &Mailbox,
        shared: &VcpuShared,
        entry: Transition,
    ) -> Result<Option<VcpuStop>, VcpuError> {
        if entry.settle {
            self.settle()?;
        }
        self.reply(mailbox, shared, entry.reply);
        loop {
            let Ok(event) = mailbox.events.recv() else {
                return Ok(Some(VcpuStop::Stopped));
            };
            let step = run_state::on_event(RunState::Paused, event);
            self.reply(mailbox, shared, step.reply);
            match step.next {
                RunState::Paused => {}
                RunState::Running => return Ok(None),
                RunState::Stopped => return Ok(Some(VcpuStop::Stopped)),
            }
        }
    }

    /// Has KVM complete pending I/O, apply dirty registers and store the
    /// registers in the sync-regs area, then return without entering the
    /// guest.
    fn settle(&mut self) -> Result<(), VcpuError> {
        let id = self.kvm.id();
        self.kvm.set_immediate_exit(true);
        let completed = self.kvm.run().map(|_| ());
        self.kvm.set_immediate_exit(false);
        match completed {
            Err(e) if e.errno() != libc::EINTR && e.errno() != libc::EAGAIN => {
                Err(VcpuError::Run {
                    vcpu: id,
                    source: e,
                })
            }
            _ => Ok(()),
        }
    }

    /// Sends the control thread `reply`.
    fn reply(&self, mailbox: &Mailbox, shared: &VcpuShared, reply: Option<Reply>) {
        let response = match reply {
            None => return,
            Some(Reply::Paused) => VcpuResponse::Paused,
            Some(Reply::Resumed) => VcpuResponse::Resumed,
            Some(Reply::State) => VcpuResponse::State(Box::new(self.capture(shared))),
            Some(Reply::StateRefused) => VcpuResponse::State(Box::new(Err(
                crate::vmm::base::control_error::ControlError::Protocol {
                    who: "a running vCPU",
                    answer: "no state".into(),
                    asked: "SaveState",
                },
            ))),
        };
        let _ = mailbox.responses.send(response);
    }

    /// The vCPU's whole state: KVM's and its LWP state.
    fn capture(
        &self,
        shared: &VcpuShared,
    ) -> Result<VcpuSnapshot, crate::vmm::base::control_error::ControlError> {
        let id = self.kvm.id();
        let (mut snapshot, skipped) = self
            .kvm
            .save_state(&self.cpuid, shared.xsave_size, &shared.msr_indices)
            .map_err(|e| {
                crate::vmm::base::control_error::ControlError::host(
                    "saving a vCPU's state",
                    format!("vCPU {id}: {e}"),
                )
            })?;
        if !skipped.is_empty() {
            log::warn!("vCPU {id}: MSRs KVM lists but would not read: {skipped:x?}");
        }
        snapshot.lwp = self.lwp.state();
        Ok(snapshot)
    }
}

/// One look of a native guest's watch ([`native::Watch`]): ends the vCPU
/// with the cause when it spins where the mode cannot run.
fn watch_native(cx: &mut ExitCx<'_>, watch: &mut native::Watch, vcpu: u8) -> Result<(), VcpuError> {
    let (regs, sregs) = (cx.vcpu.regs(), cx.vcpu.sregs());
    let fetch = cx.vcpu.paging(&sregs).and_then(|paging| {
        translate(cx.mem, &paging, regs.rip, Access::UserFetch, Marking::Probe).map(drop)
    });
    match watch.look(regs.rip, fetch) {
        Some(stuck) => Err(VcpuError::NativeStuck {
            vcpu,
            rip: stuck.rip,
            level: stuck.level,
        }),
        None => Ok(()),
    }
}

/// The VMM's side of a running vCPU.
pub struct VcpuHandle {
    thread: JoinHandle<VcpuThreadResult>,
    events: Sender<VcpuEvent>,
    responses: Receiver<VcpuResponse>,
    pending: Arc<AtomicBool>,
    sample_due: Arc<AtomicBool>,
    watch_due: Arc<AtomicBool>,
    clock_armed: Arc<AtomicBool>,
}

impl VcpuHandle {
    /// Sends an event and kicks the vCPU so that it sees it at once; false
    /// when its thread has ended.
    pub fn send(&self, event: VcpuEvent) -> bool {
        let sent = self.events.send(event).is_ok();
        self.pending.store(true, Ordering::Release);
        self.kick();
        sent
    }

    /// The next answer; `None` when the thread has ended.
    pub fn recv(&self) -> Option<VcpuResponse> {
        self.responses.recv().ok()
    }

    /// Asks for a sample at once, if the vCPU has a clock event armed or
    /// `every` vCPU is sampled (a whole-guest profile); any other vCPU is
    /// left running.
    pub fn kick_sample(&self, every: bool) {
        if every || self.clock_armed.load(Ordering::Acquire) {
            self.sample_due.store(true, Ordering::Release);
            self.kick();
        }
    }

    /// Asks a native guest's vCPU to look where it is
    /// ([`native::Watch`]).
    pub fn kick_watch(&self) {
        self.watch_due.store(true, Ordering::Release);
        self.kick();
    }

    /// Makes KVM_RUN return (or not enter).
    pub fn kick(&self) {
        let _ = self.thread.kill(SIGRTMIN());
    }

    /// Waits for the thread to end.
    pub fn join(self) -> thread::Result<VcpuThreadResult> {
        self.thread.join()
    }
}

#[cfg(test)]
mod tests {
    use super::SampleClock;

    #[test]
    fn a_sample_charges_at_most_one_period() {
        // (TSC kHz, sampler Hz, the most one kick charges)
        let table = [
            (2_600_000, 1000, 2_600_000),
            (2_600_000, 250, 10_400_000),
            (0, 1000, u64::MAX),
            (2_600_000, 0, u64::MAX),
        ];
        for (tsc_khz, hz, most) in table {
            let clock = SampleClock {
                tsc_khz,
                last: None,
            };
            assert_eq!(clock.period_cycles(hz), most, "{tsc_khz} kHz at {hz} Hz");
        }
    }
}
