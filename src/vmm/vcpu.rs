//! One vCPU thread: KVM_RUN and its exits. Port I/O goes to the bus, LWP
//! MSR exits to the vCPU's LWP unit, the #UD doorbell and CPL0 emulation
//! failures on LWP instructions to the instruction emulator; anything else
//! ends the VM with an error that names the exit, the vCPU and RIP.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvm_bindings::{
    KVM_GUESTDBG_ENABLE, KVM_GUESTDBG_SINGLESTEP, kvm_debug_exit_arch, kvm_guest_debug, kvm_msi,
    kvm_regs, kvm_run, kvm_sregs,
};
use kvm_ioctls::{SyncReg, VcpuExit, VcpuFd, VmFd};
use thiserror::Error;
use vm_memory::ByteValued;

use super::devices::{GuestEnd, PortAction, PortBus};
use super::guest_paging::PagingSource;
use super::lwp_insn::{self, Context, LwpMnemonic, MAX_INSN_LEN, Outcome};
use super::metrics::Metrics;
use super::pause::PauseGate;
use super::privilege;
use super::snapshot::LwpSection;
use super::step::{self, StepBackend};
use super::vcpu_state;
use crate::guard::{Access, GuardError, GuestMemory, GuestView, Paging};
use crate::guest_warn;
use crate::lwp::cpuid::CpuidEntry;
use crate::lwp::cpuid::LwpFeatures;
use crate::lwp::fault::GuestFault;
use crate::lwp::msr::{MSR_LWP_CBADDR, MSR_LWP_CFG};
use crate::lwp::record::EventId;
use crate::lwp::unit::{LwpUnit, ThresholdInterrupt};
use crate::lwp::xsave::LwpXsaveArea;
use crate::profile::trace::{TraceRecord, TraceWriter};

const RFLAGS_CF: u64 = 1;
const RFLAGS_TF: u64 = 1 << 8;
/// LWP state call: save component 62 into the area.
pub const STATE_SAVE: u8 = 1;
/// LWP state call: restore component 62 from the area.
pub const STATE_RESTORE: u8 = 2;
/// LWP state call: the guest's #DB handler starts with the #DB doorbell.
pub const STATE_DECLARE_DB: u8 = 3;

/// The status an LWP state call returns in RAX.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub enum StateStatus {
    /// Done.
    Ok = 0,
    /// The VM has no LWP.
    NoLwp = 1,
    /// The area cannot be read or written as supervisor memory.
    BadArea = 2,
    /// The image was refused (invalid, or its LWPCB or ring faults); LWP is
    /// now off. RDX holds the fault's vector, RCX the #PF address.
    Refused = 3,
    /// Unknown operation, or called from CPL3.
    BadCall = 4,
}
const KVM_INTERNAL_ERROR_EMULATION: u32 = 1;
/// FWAIT's opcode.
const FWAIT: u8 = 0x9b;
const KVM_INTERNAL_ERROR_EMULATION_FLAG_INSTRUCTION_BYTES: u64 = 1;
/// The address bits of CR3 (PCID and flag bits masked).
const CR3_ADDR: u64 = 0x000F_FFFF_FFFF_F000;

/// Why a vCPU stopped the VM with an error.
#[derive(Debug, Error)]
pub enum VcpuError {
    /// KVM_RUN failed.
    #[error("vCPU {vcpu}: KVM_RUN failed: {source}")]
    Run {
        /// The vCPU.
        vcpu: u8,
        /// The error.
        source: kvm_ioctls::Error,
    },
    /// An ioctl needed to handle an exit failed.
    #[error("vCPU {vcpu}: {what} failed: {source}")]
    Ioctl {
        /// The vCPU.
        vcpu: u8,
        /// The ioctl.
        what: &'static str,
        /// The error.
        source: kvm_ioctls::Error,
    },
    /// An exit lwpvmm does not handle.
    #[error("vCPU {vcpu}: unhandled exit {exit} at RIP {rip:#x}{bytes}")]
    Unhandled {
        /// The vCPU.
        vcpu: u8,
        /// The exit, named.
        exit: String,
        /// RIP at the exit.
        rip: u64,
        /// The instruction bytes, when KVM gave them.
        bytes: String,
    },
    /// The vCPU thread's seccomp filter could not be installed.
    #[error("vCPU thread: {0}")]
    Seccomp(#[from] super::seccomp::SeccompError),
    /// The guest triple-faulted or KVM shut it down.
    #[error("vCPU {vcpu}: the guest shut down (triple fault or KVM shutdown) at RIP {rip:#x}")]
    Shutdown {
        /// The vCPU.
        vcpu: u8,
        /// RIP at the exit.
        rip: u64,
    },
}

/// How a vCPU left its loop without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VcpuStop {
    /// The guest ended the VM.
    Ended(GuestEnd),
    /// Another vCPU ended the VM.
    Stopped,
}

/// What all vCPUs of a VM share.
pub struct Shared {
    /// The VM.
    pub vm: Arc<VmFd>,
    /// Guest memory.
    pub mem: Arc<GuestMemory>,
    /// The port bus.
    pub bus: Arc<Mutex<PortBus>>,
    /// Set when the VM is to stop.
    pub stop: Arc<AtomicBool>,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// The snapshot rendezvous.
    pub pause: Arc<PauseGate>,
    /// KVM_CAP_XSAVE2 of this VM.
    pub xsave_size: usize,
    /// The MSRs KVM lists as saveable.
    pub msr_indices: Arc<Vec<u32>>,
    /// The host-side trace, when one is written.
    pub trace: Option<Arc<Mutex<TraceWriter>>>,
}

thread_local! {
    static KVM_RUN: Cell<*mut kvm_run> = const { Cell::new(std::ptr::null_mut()) };
}

/// The kick signal's handler: makes the vCPU thread's KVM_RUN return at
/// once (or not enter at all), so it sees the stop flag.
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

/// A vCPU and its LWP unit.
pub struct Vcpu {
    fd: VcpuFd,
    id: u8,
    cpuid: Vec<CpuidEntry>,
    paging: PagingSource,
    unit: Option<LwpUnit>,
    instructions: bool,
    tsc_offset: i64,
    sample_due: Arc<AtomicBool>,
    tsc_khz: u32,
    last_sample: Option<(u64, Option<Duration>)>,
    lwpcb_cr3: Option<u64>,
    db_declared: bool,
    step_from: Option<u64>,
    /// A port instruction of the stepped context that exited: (its address,
    /// the address after it). kvm_pvm completes such an instruction
    /// without the single-step trap, so the next trap retires two.
    pio_step: Option<(u64, u64)>,
    backend: StepBackend,
    stepping: bool,
}

impl Vcpu {
    /// A vCPU with its LWP unit (`None` when the VM has no LWP).
    /// `cpuid` is the table lwpvmm set, `paging` what the guard takes from
    /// the table KVM reports back (a host module may add bits of its own).
    /// `instructions` is false for a stock guest: its LWP instructions #UD
    /// (CPUID tells it LwpAvail = 0) while the MSRs still work.
    /// `tsc_offset` turns the host TSC into the guest's.
    pub fn new(
        fd: VcpuFd,
        id: u8,
        cpuid: Vec<CpuidEntry>,
        paging: PagingSource,
        unit: Option<LwpUnit>,
        instructions: bool,
        tsc_offset: i64,
    ) -> Self {
        Vcpu {
            fd,
            id,
            paging,
            cpuid,
            unit,
            instructions,
            tsc_offset,
            sample_due: Arc::new(AtomicBool::new(false)),
            tsc_khz: 0,
            last_sample: None,
            lwpcb_cr3: None,
            db_declared: false,
            step_from: None,
            pio_step: None,
            backend: StepBackend::TrapFlag,
            stepping: false,
        }
    }

    /// Chooses how this vCPU single-steps. With the trap-flag backend the
    /// precise events stay withheld until the guest declares its #DB
    /// doorbell.
    pub fn set_step_backend(&mut self, backend: StepBackend) {
        self.backend = backend;
        self.stepping = true;
        self.update_withheld();
    }

    fn update_withheld(&mut self) {
        let ready = self.backend == StepBackend::GuestDebug || self.db_declared;
        if let Some(u) = self.unit.as_mut() {
            u.withhold(if ready {
                LwpFeatures::empty()
            } else {
                LwpFeatures::IRE | LwpFeatures::BRE
            });
        }
    }

    /// The start-up probe of the stepping backends, run on a vCPU of a
    /// throwaway VM booted with the `stepprobe` guest: KVM's single-step is
    /// turned on at the guest's CPL3 port write; a Debug exit at CPL3 means
    /// the guest-debug backend works, the guest's #DB doorbell (or the exit
    /// port) means the trap flag went to the guest instead.
    pub fn probe_stepping(&mut self) -> Result<StepBackend, VcpuError> {
        self.fd.set_sync_valid_reg(SyncReg::SystemRegister);
        let mut enabled = false;
        for _ in 0..10_000 {
            // None: a Debug exit; Some(port): a port write; other exits end
            // the probe.
            let seen = match self.fd.run() {
                Ok(VcpuExit::IoOut(port, _)) => Some(Some(port)),
                Ok(VcpuExit::IoIn(_, data)) => {
                    data.fill(0xff);
                    Some(Some(0))
                }
                Ok(VcpuExit::Debug(_)) => Some(None),
                Err(e) if e.errno() == libc::EINTR => Some(Some(0)),
                _ => None,
            };
            match seen {
                None => return Ok(StepBackend::TrapFlag),
                Some(None) if privilege::is_user(&self.fd.sync_regs().sregs) => {
                    return Ok(StepBackend::GuestDebug);
                }
                Some(Some(super::devices::POST_PORT)) if !enabled => {
                    enabled = true;
                    self.guest_debug(true)?;
                }
                Some(Some(super::cpuid::PV_DB_PORT | super::cpuid::EXIT_PORT)) => {
                    return Ok(StepBackend::TrapFlag);
                }
                Some(_) => {}
            }
        }
        Ok(StepBackend::TrapFlag)
    }

    /// Turns KVM's single-step on or off (guest-debug backend).
    fn guest_debug(&mut self, on: bool) -> Result<(), VcpuError> {
        let id = self.id;
        let debug = kvm_guest_debug {
            control: if on {
                KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_SINGLESTEP
            } else {
                0
            },
            ..Default::default()
        };
        self.fd
            .set_guest_debug(&debug)
            .map_err(|source| VcpuError::Ioctl {
                vcpu: id,
                what: "KVM_SET_GUEST_DEBUG",
                source,
            })
    }

    /// A Debug exit of the guest-debug backend: a step at CPL3 retires the
    /// instruction at `step_from`; steps through CPL0 code (a handler) are
    /// not counted.
    fn debug_exit(&mut self, shared: &Shared, exit: &kvm_debug_exit_arch) -> Result<(), VcpuError> {
        let Some(pc) = step::debug_exit_step(exit) else {
            return Ok(());
        };
        let sregs = self.fd.sync_regs().sregs;
        if !privilege::is_user(&sregs) {
            return Ok(());
        }
        let tsc = self.guest_tsc();
        if let (Some(prev), Ok(paging), Some(unit)) =
            (self.step_from, self.paging(&sregs), self.unit.as_mut())
        {
            shared.metrics.steps.fetch_add(1, Ordering::Relaxed);
            step::retire(
                unit,
                &mut GuestView::new(&shared.mem, paging),
                prev,
                pc,
                tsc,
            );
        }
        if self.precise_live(true, sregs.cr3) {
            self.step_from = Some(pc);
            Ok(())
        } else {
            self.step_from = None;
            self.guest_debug(false)
        }
    }

    /// True when the context (CPL, CR3) runs under a live LWPCB with IRE or
    /// BRE enabled and the guest has declared its #DB doorbell: every
    /// instruction it retires must be stepped.
    fn precise_live(&self, cpl3: bool, cr3: u64) -> bool {
        (self.db_declared || self.backend == StepBackend::GuestDebug)
            && cpl3
            && self.lwpcb_cr3 == Some(cr3 & CR3_ADDR)
            && self
                .unit
                .as_ref()
                .is_some_and(|u| u.counts(LwpFeatures::IRE) || u.counts(LwpFeatures::BRE))
    }

    /// The #DB doorbell (docs/pv-abi.md): a single-step trap of the
    /// trap-flag backend. The instruction at `step_from` has retired and
    /// control is at the frame's RIP. Counts IRE, and BRE for a branch, then
    /// keeps TF in the frame while the context stays live. A #DB the VMM did
    /// not cause (no stepping in progress) goes to the guest's own handler.
    fn db_doorbell(&mut self, shared: &Shared) {
        let sync = self.fd.sync_regs();
        let (mut regs, sregs) = (sync.regs, sync.sregs);
        // Every check comes before the stepping state is taken, so that a
        // refused ring leaves the stepping in progress intact. A ring from
        // outside CPL0 has no handler to answer and changes nothing: writing
        // the registers would also cancel the single-step trap KVM holds
        // pending for the `out` itself.
        if !privilege::is_kernel(&sregs) {
            return;
        }
        let checked = self.paging(&sregs).ok().and_then(|paging| {
            let view = GuestView::new(&shared.mem, paging);
            let mut frame = Frame::default();
            view.read(regs.rsp, frame.as_mut_slice(), Access::SupervisorRead)
                .ok()?;
            let cpl = privilege::frame_privilege(&view, &sregs, frame.cs, frame.ss).ok()?;
            Some((view, frame, cpl == 3))
        });
        let Some((mut view, mut frame, user)) = checked else {
            regs.rflags |= RFLAGS_CF;
            self.commit_regs(regs);
            return;
        };
        let Some(mut prev) = self.step_from.take() else {
            regs.rflags |= RFLAGS_CF;
            self.commit_regs(regs);
            return;
        };
        let tsc = self.guest_tsc();
        if let (true, Some(unit)) = (user, self.unit.as_mut()) {
            if let Some((at, after)) = self.pio_step.take()
                && at == prev
                && frame.rip != after
            {
                // The trap after the port instruction was lost: it retired
                // first, then the instruction at `after`.
                shared.metrics.steps.fetch_add(1, Ordering::Relaxed);
                step::retire(unit, &mut view, prev, after, tsc);
                prev = after;
            }
            shared.metrics.steps.fetch_add(1, Ordering::Relaxed);
            step::retire(unit, &mut view, prev, frame.rip, tsc);
        }
        if self.precise_live(user, sregs.cr3) {
            self.step_from = Some(frame.rip);
            frame.rflags |= RFLAGS_TF;
        } else {
            frame.rflags &= !RFLAGS_TF;
        }
        if view
            .write(regs.rsp, frame.as_slice(), Access::SupervisorWrite)
            .is_err()
        {
            self.step_from = None;
        }
        regs.rflags &= !RFLAGS_CF;
        self.commit_regs(regs);
    }

    /// Starts stepping at an exit that finds the context live at CPL3 but
    /// not stepped (stepping stops where event delivery masks TF).
    fn arm_stepping(&mut self) -> Result<(), VcpuError> {
        if self.step_from.is_some() {
            return Ok(());
        }
        let sync = self.fd.sync_regs();
        let (mut regs, sregs) = (sync.regs, sync.sregs);
        if !self.precise_live(privilege::is_user(&sregs), sregs.cr3) {
            return Ok(());
        }
        self.step_from = Some(regs.rip);
        match self.backend {
            StepBackend::TrapFlag => {
                regs.rflags |= RFLAGS_TF;
                self.commit_regs(regs);
                Ok(())
            }
            StepBackend::GuestDebug => self.guest_debug(true),
        }
    }

    /// Notes a port instruction of the context being stepped, after its
    /// exit (see `pio_step`). KVM reports RIP at the instruction or, as
    /// kvm_pvm does, already after it.
    fn note_pio_step(&mut self, shared: &Shared) {
        let sync = self.fd.sync_regs();
        let (rip, sregs) = (sync.regs.rip, sync.sregs);
        let (Some(at), true) = (self.step_from, privilege::is_user(&sregs)) else {
            return;
        };
        let Ok(paging) = self.paging(&sregs) else {
            return;
        };
        let view = GuestView::new(&shared.mem, paging);
        let after = lwp_insn::fetch(&view, at, true)
            .ok()
            .and_then(|(bytes, len)| lwp_insn::length(&bytes[..len], at))
            .map(|n| at.wrapping_add(n));
        self.pio_step = after
            .filter(|&after| rip == at || rip == after)
            .map(|after| (at, after));
    }

    /// The flag the sampler sets before it kicks this vCPU.
    pub fn sample_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.sample_due)
    }

    /// Keeps a copy of every record this vCPU's unit stores, for the trace.
    pub fn trace_records(&mut self) {
        if let Some(u) = self.unit.as_mut() {
            u.keep_log();
        }
    }

    /// Notes the address space that loaded the LWPCB, after an operation
    /// that may have loaded one.
    fn note_lwpcb_space(&mut self, cr3: u64) {
        self.lwpcb_cr3 = self
            .unit
            .as_ref()
            .and_then(LwpUnit::block)
            .map(|_| cr3 & CR3_ADDR);
    }

    /// Sets the guest TSC's rate, which turns the vCPU thread's CPU time
    /// into clock cycles for the sampled clock events.
    pub fn set_tsc_khz(&mut self, khz: u32) {
        self.tsc_khz = khz;
    }

    /// The cycles the vCPU ran since the last sample: its thread's CPU time
    /// (what a host that preempts the thread, or a guest that halts, does
    /// not add to) at the TSC rate; the guest TSC's advance where either is
    /// unknown.
    fn cycles_since_last_sample(&mut self, now: u64) -> u64 {
        let cpu = cpu_time::ThreadTime::try_now()
            .ok()
            .map(|t| t.as_duration());
        let last = self.last_sample.replace((now, cpu));
        match (last, cpu) {
            (Some((_, Some(before))), Some(cpu)) if self.tsc_khz > 0 => {
                let nanos = cpu.saturating_sub(before).as_nanos();
                u64::try_from(nanos * u128::from(self.tsc_khz) / 1_000_000).unwrap_or(u64::MAX)
            }
            (Some((before, _)), _) => now.saturating_sub(before),
            (None, _) => 0,
        }
    }

    /// A sampling kick: charges the cycles the vCPU ran since the last
    /// sample to CNH and RNH, but only while the vCPU runs at CPL3 in the
    /// address space that loaded the LWPCB. docs/profiling.md.
    fn sample(&mut self, shared: &Shared) {
        let now = self.guest_tsc();
        let elapsed = self.cycles_since_last_sample(now);
        shared.metrics.sampler_kicks.fetch_add(1, Ordering::Relaxed);
        let sync = self.fd.sync_regs();
        let (rip, sregs) = (sync.regs.rip, sync.sregs);
        let live = privilege::is_user(&sregs) && self.lwpcb_cr3 == Some(sregs.cr3 & CR3_ADDR);
        let paging = self.paging(&sregs);
        let (Some(unit), true, Ok(paging)) = (self.unit.as_mut(), live, paging) else {
            return;
        };
        let mut view = GuestView::new(&shared.mem, paging);
        unit.count(&mut view, EventId::Cnh, elapsed, rip, now);
        unit.count(&mut view, EventId::Rnh, elapsed, rip, now);
        shared
            .metrics
            .samples_charged
            .fetch_add(1, Ordering::Relaxed);
    }

    /// After every exit: the trace, then a due threshold interrupt.
    fn after_exit(&mut self, shared: &Shared) -> Result<(), VcpuError> {
        if let Some(u) = &self.unit {
            let stats = u.stats();
            shared
                .metrics
                .records_stored
                .store(stats.records_stored, Ordering::Relaxed);
            shared
                .metrics
                .records_missed
                .store(stats.records_missed, Ordering::Relaxed);
        }
        if let (Some(trace), Some(unit)) = (&shared.trace, self.unit.as_mut()) {
            let records = unit.drain_log();
            if !records.is_empty() {
                let cr3 = self.fd.sync_regs().sregs.cr3 & CR3_ADDR;
                let lines: Vec<TraceRecord> = records
                    .iter()
                    .map(|r| TraceRecord::new(self.id, cr3, r))
                    .collect();
                match trace.lock().map(|mut t| t.append(&lines)) {
                    Ok(Ok(dropped)) => {
                        shared
                            .metrics
                            .trace_dropped
                            .fetch_add(dropped, Ordering::Relaxed);
                    }
                    _ => {
                        shared.metrics.trace_errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        self.deliver_interrupt(shared);
        self.arm_stepping()
    }

    /// The vCPU's paging as the guard walks it, from `sregs` (the current
    /// special registers), its CPUID and, under CR4.PKE, its PKRU.
    fn paging(&self, sregs: &kvm_sregs) -> Result<Paging, GuardError> {
        self.paging.of_vcpu(&self.fd, sregs)
    }

    /// The vCPU's index (its APIC ID).
    pub fn id(&self) -> u8 {
        self.id
    }

    /// The KVM vCPU, for restoring its state before it runs.
    pub fn fd(&self) -> &VcpuFd {
        &self.fd
    }

    /// Replaces the LWP unit and the address space that loaded its LWPCB
    /// (restoring a snapshot).
    pub fn set_unit(&mut self, unit: Option<LwpUnit>, lwpcb_cr3: Option<u64>) {
        self.unit = unit;
        self.lwpcb_cr3 = lwpcb_cr3.map(|c| c & CR3_ADDR);
    }

    /// Hands `regs` to KVM through the sync-regs area, applied at the next
    /// KVM_RUN (no ioctl).
    fn commit_regs(&mut self, regs: kvm_regs) {
        self.fd.sync_regs_mut().regs = regs;
        self.fd.set_sync_dirty_reg(SyncReg::Register);
    }

    /// Saves this vCPU's state (KVM and LWP) and parks until the snapshot
    /// is written.
    fn park(&mut self, shared: &Shared) {
        let state = vcpu_state::capture(
            &self.fd,
            self.id,
            &self.cpuid,
            shared.xsave_size,
            &shared.msr_indices,
        )
        .map(|(mut snapshot, skipped)| {
            if !skipped.is_empty() {
                log::warn!(
                    "vCPU {}: MSRs KVM lists but would not read: {skipped:x?}",
                    self.id
                );
            }
            snapshot.lwp = self.unit.as_ref().map(|u| LwpSection {
                unit: u.state(),
                component62: u.save_xsave().to_bytes().to_vec(),
                lwpcb_cr3: self.lwpcb_cr3,
            });
            snapshot
        })
        .map_err(|e| format!("vCPU {}: {e}", self.id));
        shared.pause.park(self.id, state, &shared.stop);
    }

    /// The unit the LWP instructions reach: none for a stock guest.
    fn insn_unit(&mut self) -> Option<&mut LwpUnit> {
        if self.instructions {
            self.unit.as_mut()
        } else {
            None
        }
    }

    /// The LWP unit, for the end-of-run summary.
    pub fn unit(&self) -> Option<&LwpUnit> {
        self.unit.as_ref()
    }

    /// Runs until the guest exits, another vCPU stops the VM, or an error.
    pub fn run_loop(&mut self, shared: &Shared) -> Result<VcpuStop, VcpuError> {
        if self.stepping {
            let counter = match self.backend {
                StepBackend::GuestDebug => &shared.metrics.step_backend_guest_debug,
                StepBackend::TrapFlag => &shared.metrics.step_backend_trap_flag,
            };
            counter.store(1, Ordering::Relaxed);
        }
        self.fd.set_sync_valid_reg(SyncReg::Register);
        self.fd.set_sync_valid_reg(SyncReg::SystemRegister);
        KVM_RUN.with(|c| c.set(self.fd.get_kvm_run()));
        let result = self.exits(shared);
        KVM_RUN.with(|c| c.set(std::ptr::null_mut()));
        result
    }

    fn exits(&mut self, shared: &Shared) -> Result<VcpuStop, VcpuError> {
        let id = self.id;
        loop {
            if shared.stop.load(Ordering::Acquire) {
                return Ok(VcpuStop::Stopped);
            }
            if shared.pause.requested() {
                // KVM completes pending I/O and applies dirty registers,
                // then returns EINTR: a consistent point to save state.
                self.fd.set_kvm_immediate_exit(1);
            }
            let mut port_exit = false;
            let action = match self.fd.run() {
                Ok(VcpuExit::IoOut(port, data)) => {
                    port_exit = true;
                    shared.metrics.exits_io.fetch_add(1, Ordering::Relaxed);
                    let action = shared
                        .bus
                        .lock()
                        .map_or(PortAction::Handled, |mut b| b.write(port, data));
                    if action == PortAction::Unclaimed {
                        guest_warn!(
                            shared.metrics.unclaimed_ports,
                            "vCPU {id}: write to unclaimed port {port:#x}"
                        );
                    }
                    action
                }
                Ok(VcpuExit::IoIn(port, data)) => {
                    port_exit = true;
                    shared.metrics.exits_io.fetch_add(1, Ordering::Relaxed);
                    if shared
                        .bus
                        .lock()
                        .map_or(PortAction::Handled, |mut b| b.read(port, data))
                        == PortAction::Unclaimed
                    {
                        guest_warn!(
                            shared.metrics.unclaimed_ports,
                            "vCPU {id}: read of unclaimed port {port:#x}"
                        );
                    }
                    PortAction::Handled
                }
                Ok(VcpuExit::X86Rdmsr(exit)) => {
                    shared.metrics.exits_msr.fetch_add(1, Ordering::Relaxed);
                    match msr_read(self.unit.as_ref(), exit.index) {
                        Some(v) => {
                            *exit.data = v;
                            *exit.error = 0;
                        }
                        None => *exit.error = 1,
                    }
                    PortAction::Handled
                }
                Ok(VcpuExit::X86Wrmsr(exit)) => {
                    shared.metrics.exits_msr.fetch_add(1, Ordering::Relaxed);
                    let ok = msr_write(self.unit.as_mut(), exit.index, exit.data);
                    *exit.error = u8::from(!ok);
                    if !ok {
                        guest_warn!(
                            shared.metrics.msr_gp,
                            "vCPU {id}: WRMSR {:#x} <- {:#x} refused with #GP",
                            exit.index,
                            exit.data
                        );
                    }
                    PortAction::Handled
                }
                Ok(VcpuExit::Debug(exit)) if self.backend == StepBackend::GuestDebug => {
                    self.debug_exit(shared, &exit)?;
                    PortAction::Handled
                }
                Ok(VcpuExit::Shutdown) => {
                    return Err(VcpuError::Shutdown {
                        vcpu: id,
                        rip: self.fd.sync_regs().regs.rip,
                    });
                }
                Ok(VcpuExit::InternalError) => {
                    self.emulation_failure(shared)?;
                    PortAction::Handled
                }
                Ok(other) => {
                    let exit = describe(&other);
                    return Err(VcpuError::Unhandled {
                        vcpu: id,
                        exit,
                        rip: self.fd.sync_regs().regs.rip,
                        bytes: String::new(),
                    });
                }
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                    self.fd.set_kvm_immediate_exit(0);
                    if self.sample_due.swap(false, Ordering::AcqRel) {
                        self.sample(shared);
                    }
                    if shared.pause.requested() {
                        self.park(shared);
                    }
                    PortAction::Handled
                }
                Err(source) => return Err(VcpuError::Run { vcpu: id, source }),
            };
            if port_exit && self.step_from.is_some() {
                self.note_pio_step(shared);
            }
            match action {
                PortAction::End(end) => return Ok(VcpuStop::Ended(end)),
                PortAction::UdDoorbell => self.ud_doorbell(shared)?,
                PortAction::LwpStateCall => self.lwp_state_call(shared),
                PortAction::DbDoorbell => self.db_doorbell(shared),
                PortAction::Handled | PortAction::Unclaimed => {}
            }
            self.after_exit(shared)?;
        }
    }

    fn guest_tsc(&self) -> u64 {
        // SAFETY: RDTSC has no memory effects; the host CPU has it (x86-64).
        let host = unsafe { core::arch::x86_64::_rdtsc() };
        host.wrapping_add_signed(self.tsc_offset)
    }

    /// The #UD doorbell: the guest's #UD handler ran `out` as its first
    /// instruction; the exception frame is at RSP and every other general
    /// register holds the interrupted context. docs/pv-abi.md.
    fn ud_doorbell(&mut self, shared: &Shared) -> Result<(), VcpuError> {
        let id = self.id;
        shared.metrics.ud_doorbells.fetch_add(1, Ordering::Relaxed);
        let sync = self.fd.sync_regs();
        let (mut regs, sregs) = (sync.regs, sync.sregs);
        let reply = self.doorbell_reply(shared, &mut regs, &sregs);
        match reply {
            Ok(Some(fault)) => {
                shared.metrics.ud_faults.fetch_add(1, Ordering::Relaxed);
                shared.metrics.count_denial(fault);
                return self.inject_after_unwind(shared, regs, sregs, fault);
            }
            Ok(None) => {
                shared.metrics.ud_handled.fetch_add(1, Ordering::Relaxed);
                regs.rflags &= !RFLAGS_CF;
            }
            Err(why) => {
                shared.metrics.ud_not_lwp.fetch_add(1, Ordering::Relaxed);
                if let Some(why) = why {
                    guest_warn!(
                        shared.metrics.guest_warnings,
                        "vCPU {id}: #UD doorbell refused: {why}"
                    );
                }
                regs.rflags |= RFLAGS_CF;
            }
        }
        self.commit_regs(regs);
        Ok(())
    }

    /// An LWP state call (docs/pv-abi.md): AL = operation, RDI = the 128-byte
    /// area (guest-linear, supervisor memory); the status goes to RAX, fault
    /// details to RDX (vector) and RCX (address).
    fn lwp_state_call(&mut self, shared: &Shared) {
        let id = self.id;
        shared
            .metrics
            .lwp_state_calls
            .fetch_add(1, Ordering::Relaxed);
        let sync = self.fd.sync_regs();
        let (mut regs, sregs) = (sync.regs, sync.sregs);
        let (status, detail) = self.state_call(shared, &regs, &sregs);
        self.note_lwpcb_space(sregs.cr3);
        if let Some(fault) = detail {
            shared.metrics.count_denial(fault);
        }
        if status != StateStatus::Ok {
            guest_warn!(
                shared.metrics.guest_warnings,
                "vCPU {id}: LWP state call failed: {status:?}"
            );
        }
        regs.rax = status as u64;
        regs.rdx = detail.map_or(0, |f| u64::from(f.vector()));
        regs.rcx = match detail {
            Some(GuestFault::PageFault { address, .. }) => address,
            _ => 0,
        };
        self.commit_regs(regs);
    }

    fn state_call(
        &mut self,
        shared: &Shared,
        regs: &kvm_regs,
        sregs: &kvm_sregs,
    ) -> (StateStatus, Option<GuestFault>) {
        if !privilege::is_kernel(sregs) {
            return (StateStatus::BadCall, None);
        }
        let in_lwpcb_space = self.lwpcb_cr3 == Some(sregs.cr3 & CR3_ADDR);
        let paging = self.paging(sregs);
        let Some(unit) = self.unit.as_mut() else {
            return (StateStatus::NoLwp, None);
        };
        let Ok(paging) = paging else {
            return (StateStatus::BadCall, None);
        };
        let mut view = GuestView::new(&shared.mem, paging);
        let area_at = regs.rdi;
        match regs.rax as u8 {
            STATE_SAVE => {
                // The image has no MissedEvents: flush it (and the head) into
                // the LWPCB as SLWPCB does, when its address space is current.
                // A flush that faults is counted in the unit's flush_faults.
                if in_lwpcb_space {
                    unit.slwpcb(&mut view);
                }
                let area = unit.save_xsave();
                match view.write(area_at, area.as_slice(), Access::SupervisorWrite) {
                    Ok(()) => (StateStatus::Ok, None),
                    Err(_) => (StateStatus::BadArea, None),
                }
            }
            STATE_RESTORE => {
                let mut area = LwpXsaveArea::INIT;
                if view
                    .read(area_at, area.as_mut_slice(), Access::SupervisorRead)
                    .is_err()
                {
                    return (StateStatus::BadArea, None);
                }
                match unit.restore_xsave(&mut view, &area) {
                    Ok(()) => (StateStatus::Ok, None),
                    Err(fault) => {
                        // Never leave the previous context's LWPCB live for
                        // the context being restored.
                        let _ = unit.write_cbaddr(0);
                        (StateStatus::Refused, Some(fault))
                    }
                }
            }
            STATE_DECLARE_DB => {
                self.db_declared = true;
                self.update_withheld();
                (StateStatus::Ok, None)
            }
            _ => (StateStatus::BadCall, None),
        }
    }

    /// Emulates the instruction behind a doorbell. `Ok(None)`: handled (the
    /// frame and registers updated); `Ok(Some(fault))`: the instruction
    /// faults; `Err(reason)`: not handled, the guest's own #UD path runs
    /// (`reason` is a message for a doorbell that was misused).
    fn doorbell_reply(
        &mut self,
        shared: &Shared,
        regs: &mut kvm_regs,
        sregs: &kvm_sregs,
    ) -> Result<Option<GuestFault>, Option<String>> {
        if !privilege::is_kernel(sregs) {
            return Err(Some(format!(
                "doorbell rung at CPL{}",
                privilege::cpl(sregs)
            )));
        }
        let paging = self.paging(sregs).map_err(|e| Some(e.to_string()))?;
        let mut view = GuestView::new(&shared.mem, paging);
        let mut frame = Frame::default();
        view.read(regs.rsp, frame.as_mut_slice(), Access::SupervisorRead)
            .and_then(|()| view.check(regs.rsp, FRAME_SIZE, Access::SupervisorWrite))
            .map_err(|e| Some(format!("exception frame at {:#x}: {e}", regs.rsp)))?;
        let user = privilege::frame_privilege(&view, sregs, frame.cs, frame.ss)
            .map_err(|e| Some(format!("exception frame at {:#x}: {e}", regs.rsp)))?
            == 3;
        let (bytes, len) = match lwp_insn::fetch(&view, frame.rip, user) {
            Ok(b) => b,
            Err(fault) => return Ok(Some(fault)),
        };
        let tsc = self.guest_tsc();
        let mut ctx = Context {
            regs,
            rsp: frame.rsp,
            rflags: frame.rflags,
            rip: frame.rip,
            user,
            fs_base: sregs.fs.base,
            gs_base: sregs.gs.base,
        };
        match lwp_insn::emulate(&mut view, self.insn_unit(), &mut ctx, &bytes[..len], tsc) {
            Outcome::Done { next_rip, mnemonic } => {
                count_mnemonic(&shared.metrics, mnemonic);
                self.note_lwpcb_space(sregs.cr3);
                if mnemonic == LwpMnemonic::Llwpcb
                    && self.stepping
                    && !self.db_declared
                    && self.backend == StepBackend::TrapFlag
                {
                    let id = self.id;
                    guest_warn!(
                        shared.metrics.guest_warnings,
                        "vCPU {id}: IRE and BRE not granted: the guest has not declared its #DB doorbell (docs/pv-abi.md)"
                    );
                }
                let stepping = self.step_from.take().is_some();
                let trap_flag = self.backend == StepBackend::TrapFlag;
                if self.precise_live(user, sregs.cr3) {
                    if stepping && let Some(unit) = self.unit.as_mut() {
                        unit.count(&mut view, EventId::Ire, 1, frame.rip, tsc);
                    }
                    self.step_from = Some(next_rip);
                    if trap_flag {
                        ctx.rflags |= RFLAGS_TF;
                    }
                } else if stepping && trap_flag {
                    ctx.rflags &= !RFLAGS_TF;
                }
                frame.rip = next_rip;
                frame.rsp = ctx.rsp;
                frame.rflags = ctx.rflags;
                view.write(ctx.regs.rsp, frame.as_slice(), Access::SupervisorWrite)
                    .map_err(|e| Some(format!("exception frame write-back: {e}")))?;
                Ok(None)
            }
            Outcome::NotLwp(_) => Err(None),
            Outcome::Fault(fault) => Ok(Some(fault)),
        }
    }

    /// Delivers `fault` as if the interrupted instruction had raised it: pops
    /// the #UD frame (an IRETQ done by the VMM) and injects the exception.
    fn inject_after_unwind(
        &mut self,
        shared: &Shared,
        mut regs: kvm_regs,
        mut sregs: kvm_sregs,
        fault: GuestFault,
    ) -> Result<(), VcpuError> {
        let id = self.id;
        let unwound = (|| {
            let paging = self.paging(&sregs).ok()?;
            let view = GuestView::new(&shared.mem, paging);
            let mut frame = Frame::default();
            view.read(regs.rsp, frame.as_mut_slice(), Access::SupervisorRead)
                .ok()?;
            let cs = privilege::load_segment(&view, &sregs, u16::try_from(frame.cs).ok()?)?;
            let ss = privilege::load_segment(&view, &sregs, u16::try_from(frame.ss).ok()?)?;
            Some((frame, cs, ss))
        })();
        let Some((frame, cs, ss)) = unwound else {
            guest_warn!(
                shared.metrics.guest_warnings,
                "vCPU {id}: cannot unwind the #UD frame to deliver {fault}"
            );
            regs.rflags |= RFLAGS_CF;
            self.commit_regs(regs);
            return Ok(());
        };
        regs.rip = frame.rip;
        regs.rsp = frame.rsp;
        regs.rflags = frame.rflags;
        sregs.cs = cs;
        sregs.ss = ss;
        self.inject(regs, sregs, fault)
    }

    /// Sets the registers and injects `fault`.
    fn inject(
        &mut self,
        regs: kvm_regs,
        mut sregs: kvm_sregs,
        fault: GuestFault,
    ) -> Result<(), VcpuError> {
        let id = self.id;
        let ioctl = |what, source| VcpuError::Ioctl {
            vcpu: id,
            what,
            source,
        };
        if let GuestFault::PageFault { address, .. } = fault {
            sregs.cr2 = address;
        }
        self.fd
            .set_regs(&regs)
            .map_err(|e| ioctl("KVM_SET_REGS", e))?;
        self.fd
            .set_sregs(&sregs)
            .map_err(|e| ioctl("KVM_SET_SREGS", e))?;
        let mut events = self
            .fd
            .get_vcpu_events()
            .map_err(|e| ioctl("KVM_GET_VCPU_EVENTS", e))?;
        events.exception.injected = 1;
        events.exception.nr = fault.vector();
        events.exception.has_error_code = u8::from(fault.error_code().is_some());
        events.exception.error_code = fault.error_code().unwrap_or(0);
        self.fd
            .set_vcpu_events(&events)
            .map_err(|e| ioctl("KVM_SET_VCPU_EVENTS", e))
    }

    /// KVM's emulator (CPL0 on kvm_pvm) could not run an instruction. LWP
    /// instructions are emulated here, and FWAIT is skipped: Linux runs it
    /// when a process drops its FPU state, and it does nothing unless an
    /// unmasked x87 exception is pending, whose #MF is then lost (a known gap,
    /// docs/linux-guest.md). Anything else ends the VM.
    fn emulation_failure(&mut self, shared: &Shared) -> Result<(), VcpuError> {
        let id = self.id;
        let run = self.fd.get_kvm_run();
        // SAFETY: this is a KVM_EXIT_INTERNAL_ERROR exit, for which KVM fills
        // the `internal` member of the exit union; `emulation_failure` is the
        // same storage viewed with the layout KVM uses when suberror is
        // EMULATION and ndata covers it. Both are plain integers.
        let (suberror, flags, size, raw) = unsafe {
            let ef = run.__bindgen_anon_1.emulation_failure;
            let insn = ef.__bindgen_anon_1.__bindgen_anon_1;
            (ef.suberror, ef.flags, insn.insn_size, insn.insn_bytes)
        };
        let sync = self.fd.sync_regs();
        let (mut regs, sregs) = (sync.regs, sync.sregs);
        let has_bytes = suberror == KVM_INTERNAL_ERROR_EMULATION
            && flags & KVM_INTERNAL_ERROR_EMULATION_FLAG_INSTRUCTION_BYTES != 0;
        let len = usize::from(size).min(MAX_INSN_LEN);
        if has_bytes && len > 0 && raw[0] == FWAIT && privilege::is_kernel(&sregs) {
            shared.metrics.cpl0_fwait.fetch_add(1, Ordering::Relaxed);
            regs.rip = regs.rip.wrapping_add(1);
            self.commit_regs(regs);
            return Ok(());
        }
        if has_bytes && len > 0 {
            let paging = self.paging(&sregs);
            if let Ok(paging) = paging {
                let mut view = GuestView::new(&shared.mem, paging);
                let tsc = self.guest_tsc();
                let rsp = regs.rsp;
                let mut ctx = Context {
                    regs: &mut regs,
                    rsp,
                    rflags: sync.regs.rflags,
                    rip: sync.regs.rip,
                    user: privilege::is_user(&sregs),
                    fs_base: sregs.fs.base,
                    gs_base: sregs.gs.base,
                };
                match lwp_insn::emulate(&mut view, self.insn_unit(), &mut ctx, &raw[..len], tsc) {
                    Outcome::Done { next_rip, mnemonic } => {
                        shared.metrics.cpl0_lwp.fetch_add(1, Ordering::Relaxed);
                        count_mnemonic(&shared.metrics, mnemonic);
                        self.note_lwpcb_space(sregs.cr3);
                        let (rsp, rflags) = (ctx.rsp, ctx.rflags);
                        regs.rsp = rsp;
                        regs.rflags = rflags;
                        regs.rip = next_rip;
                        self.commit_regs(regs);
                        return Ok(());
                    }
                    Outcome::Fault(fault) => {
                        shared.metrics.cpl0_lwp.fetch_add(1, Ordering::Relaxed);
                        shared.metrics.count_denial(fault);
                        return self.inject(regs, sregs, fault);
                    }
                    Outcome::NotLwp(lwp_insn::NotLwp::LwpDisabled) => {
                        return self.inject(regs, sregs, GuestFault::InvalidOpcode);
                    }
                    Outcome::NotLwp(lwp_insn::NotLwp::OtherInstruction) => {}
                }
            }
        }
        let bytes = if has_bytes {
            format!(
                ", emulation failed on instruction bytes {}",
                raw[..len]
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            )
        } else {
            String::new()
        };
        Err(VcpuError::Unhandled {
            vcpu: id,
            exit: format!("KVM_EXIT_INTERNAL_ERROR (suberror {suberror})"),
            rip: sync.regs.rip,
            bytes,
        })
    }

    fn deliver_interrupt(&mut self, shared: &Shared) {
        let id = self.id;
        let Some(irq) = self.unit.as_mut().and_then(LwpUnit::take_interrupt) else {
            return;
        };
        match irq {
            ThresholdInterrupt::Deliver(vector) => {
                let msi = kvm_msi {
                    address_lo: 0xfee0_0000 | (u32::from(id) << 12),
                    data: u32::from(vector),
                    ..Default::default()
                };
                match shared.vm.signal_msi(msi) {
                    Ok(_) => {
                        shared
                            .metrics
                            .lwp_interrupts
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => guest_warn!(
                        shared.metrics.guest_warnings,
                        "vCPU {id}: LWP threshold interrupt {vector:#x} not delivered: {e}"
                    ),
                }
            }
            ThresholdInterrupt::Suppressed(vector) => guest_warn!(
                shared.metrics.lwp_interrupts_suppressed,
                "vCPU {id}: LWP threshold interrupt on exception vector {vector:#x} suppressed"
            ),
        }
    }
}

/// An exit, named for an error message (addresses in hex).
fn describe(exit: &VcpuExit<'_>) -> String {
    match exit {
        VcpuExit::MmioRead(addr, data) => {
            format!(
                "MmioRead ({} bytes at guest-physical {addr:#x}, which no device backs)",
                data.len()
            )
        }
        VcpuExit::MmioWrite(addr, data) => {
            format!(
                "MmioWrite ({} bytes at guest-physical {addr:#x}, which no device backs)",
                data.len()
            )
        }
        other => format!("{other:?}"),
    }
}

fn count_mnemonic(metrics: &Metrics, m: LwpMnemonic) {
    let c = match m {
        LwpMnemonic::Llwpcb => &metrics.llwpcb,
        LwpMnemonic::Slwpcb => &metrics.slwpcb,
        LwpMnemonic::Lwpins => &metrics.lwpins,
        LwpMnemonic::Lwpval => &metrics.lwpval,
    };
    c.fetch_add(1, Ordering::Relaxed);
}

/// RDMSR of an LWP MSR; `None` raises #GP.
pub fn msr_read(unit: Option<&LwpUnit>, index: u32) -> Option<u64> {
    let unit = unit?;
    match index {
        MSR_LWP_CFG => Some(unit.cfg().raw()),
        MSR_LWP_CBADDR => Some(unit.cbaddr()),
        _ => None,
    }
}

/// WRMSR of an LWP MSR; false raises #GP.
pub fn msr_write(unit: Option<&mut LwpUnit>, index: u32, value: u64) -> bool {
    let Some(unit) = unit else { return false };
    match index {
        MSR_LWP_CFG => unit.write_cfg(value).is_ok(),
        MSR_LWP_CBADDR => unit.write_cbaddr(value).is_ok(),
        _ => false,
    }
}

const FRAME_SIZE: u64 = 40;

/// A 64-bit exception frame without an error code.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct Frame {
    rip: u64,
    cs: u64,
    rflags: u64,
    rsp: u64,
    ss: u64,
}

// SAFETY: Frame is repr(C) and made only of u64 fields, so it has no padding
// and every byte pattern is a valid value.
unsafe impl ByteValued for Frame {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lwp::cpuid::LwpProfile;

    #[test]
    fn msr_table() {
        let mut unit = LwpUnit::new(LwpProfile::Bulldozer.caps().unwrap());
        // (index, value written, write accepted, value read back)
        let table = [
            (
                MSR_LWP_CFG,
                0x0000_4000_8000_000E,
                true,
                Some(0x0000_4000_8000_000E),
            ),
            (MSR_LWP_CFG, 1 << 5, false, Some(0x0000_4000_8000_000E)),
            (MSR_LWP_CFG, 1 << 7, false, Some(0x0000_4000_8000_000E)),
            (MSR_LWP_CBADDR, 0, true, Some(0)),
            (MSR_LWP_CBADDR, 0x1000, false, Some(0)),
            (0xC000_0107, 0, false, None),
        ];
        for (index, value, ok, read) in table {
            assert_eq!(
                msr_write(Some(&mut unit), index, value),
                ok,
                "{index:#x} <- {value:#x}"
            );
            assert_eq!(msr_read(Some(&unit), index), read, "{index:#x}");
        }
        assert_eq!(msr_read(None, MSR_LWP_CFG), None, "no LWP: #GP");
        assert!(!msr_write(None, MSR_LWP_CFG, 0), "no LWP: #GP");
    }
}
