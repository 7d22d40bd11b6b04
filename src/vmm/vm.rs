//! A VM from configuration (or from a snapshot) to exit: opening KVM and
//! checking the capabilities lwpvmm needs, guest memory, the in-kernel
//! irqchip and PIT, the LWP MSR filter, CPUID, boot, one thread per vCPU,
//! the event loop that waits for the end and takes snapshots, and the clean
//! shutdown of every thread.

use std::io::Read;
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use event_manager::{EventManager, EventOps, Events, MutEventSubscriber, SubscriberOps};
use kvm_bindings::{
    CpuId, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE,
    KVM_MAX_CPUID_ENTRIES, KVM_MSR_EXIT_REASON_FILTER, Msrs, kvm_cpuid_entry2, kvm_enable_cap,
    kvm_irqchip, kvm_msr_entry, kvm_pit_config, kvm_userspace_memory_region,
};
use kvm_ioctls::{
    Cap, Kvm, MsrFilterDefaultAction, MsrFilterRange, MsrFilterRangeFlags, VcpuFd, VmFd,
};
use thiserror::Error;
use vm_memory::{Address, GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};
use vmm_sys_util::signal::{Killable, SIGRTMIN, register_signal_handler};
use vmm_sys_util::timerfd::TimerFd;

use super::boot::{self, BootError};
use super::cpuid;
use super::devices::{GuestEnd, PortBus, SERIAL_IRQ, SerialOut};
use super::guest_paging::PagingSource;
use super::metrics::{self, Metrics};
use super::output::{self, OutputError, OutputKind, RewriteFile};
use super::pause::PauseGate;
use super::seccomp::{self, SeccompError, SeccompMode, ThreadKind};
use super::signals::{self, StopSignals};
use super::snapshot::{self, MemoryLayout, SnapshotError, VcpuSnapshot, VmKvmState, VmSnapshot};
use super::step::StepBackend;
use super::vcpu::{Shared, Vcpu, VcpuError, VcpuStop, kick_handler};
use super::vcpu_state::{self, VcpuStateError};
use crate::guard::{Access, GuestMemory, GuestView};
use crate::lwp::cpuid::{CpuidEntry, GuestLwpSupport, LwpFeatures, LwpProfile, UnknownProfile};
use crate::lwp::msr::MSR_LWP_CFG;
use crate::lwp::unit::{LwpUnit, UnitStats};
use crate::profile::trace::{TRACE_VERSION, TraceHeader, TraceWriter};

const MSR_IA32_TSC: u32 = 0x10;
const PIT_SPEAKER_DUMMY: u32 = 1;

/// What to run.
#[derive(Debug, Clone)]
pub struct VmConfig {
    /// The kernel image (ELF or bzImage).
    pub kernel: Vec<u8>,
    /// The initramfs, if any.
    pub initramfs: Option<Vec<u8>>,
    /// The kernel command line.
    pub cmdline: String,
    /// Guest RAM in MiB.
    pub memory_mib: u64,
    /// Number of vCPUs.
    pub vcpus: u8,
    /// The LWP profile.
    pub profile: LwpProfile,
    /// Whether the guest carries the paravirtual shim.
    pub guest: GuestLwpSupport,
    /// Where serial output goes.
    pub serial: SerialOut,
    /// When and where to take snapshots.
    pub snapshots: SnapshotPlan,
    /// The seccomp filters of the vCPU and control threads.
    pub seccomp: SeccompMode,
    /// Stop the VM cleanly on SIGINT and SIGTERM (a second one ends the
    /// process at once). For programs that own their signals, as the CLI.
    pub stop_on_signals: bool,
    /// The sampler and the trace.
    pub profiling: Profiling,
    /// A user's program for the profile host guest (`lwpvmm profile`),
    /// loaded beside the kernel; its entry goes on the command line.
    pub program: Option<Vec<u8>>,
}

/// The trace's size limit unless the caller sets one: 1 GiB.
pub const DEFAULT_TRACE_MAX: u64 = 1 << 30;

/// Sampled events and the host-side trace.
#[derive(Debug, Clone)]
pub struct Profiling {
    /// Sampling kicks per second and vCPU (0: no sampler). The sampler runs
    /// only when the profile has CNH or RNH.
    pub sample_hz: u32,
    /// Write every stored LWP record to this trace file.
    pub trace: Option<PathBuf>,
    /// The trace's size limit in bytes: records past it are counted in the
    /// metrics (`trace_dropped`), not written, and the trace says so.
    pub trace_max: u64,
    /// Where the counters go as JSON at the end, and on SIGUSR1 while the
    /// VM runs.
    pub metrics: Option<PathBuf>,
}

impl Default for Profiling {
    fn default() -> Self {
        Profiling {
            sample_hz: 0,
            trace: None,
            trace_max: DEFAULT_TRACE_MAX,
            metrics: None,
        }
    }
}

/// When and where a running VM writes snapshots.
#[derive(Debug, Clone, Default)]
pub struct SnapshotPlan {
    /// The snapshot directory; without it no snapshot is taken.
    pub dir: Option<PathBuf>,
    /// Take one this long after the start.
    pub after: Option<Duration>,
}

/// Why a VM could not run.
#[derive(Debug, Error)]
pub enum VmError {
    /// /dev/kvm cannot be opened.
    #[error(
        "cannot open /dev/kvm ({0}): lwpvmm needs KVM; check that the kvm module is loaded and that you may read and write /dev/kvm"
    )]
    NoKvm(kvm_ioctls::Error),
    /// A capability lwpvmm needs is missing.
    #[error("this KVM lacks {0}, which lwpvmm needs")]
    MissingCap(&'static str),
    /// A KVM ioctl failed during setup.
    #[error("{what} failed: {source}")]
    Setup {
        /// What was being done.
        what: &'static str,
        /// The error.
        source: kvm_ioctls::Error,
    },
    /// Booting failed.
    #[error(transparent)]
    Boot(#[from] BootError),
    /// A vCPU count out of range.
    #[error("--vcpus {0} is out of range: give 1 to {1}")]
    VcpuCount(u8, usize),
    /// A vCPU ended the VM with an error.
    #[error(transparent)]
    Vcpu(#[from] VcpuError),
    /// Host-side I/O (event loop, signal handlers) failed.
    #[error("{0}: {1}")]
    Io(&'static str, std::io::Error),
    /// An output file or directory cannot be created or written.
    #[error(transparent)]
    Output(#[from] OutputError),
    /// A seccomp filter could not be installed.
    #[error("control thread: {0}")]
    Seccomp(#[from] SeccompError),
    /// A vCPU thread panicked.
    #[error("vCPU {0} thread panicked")]
    Panicked(u8),
    /// A snapshot could not be read, or was refused.
    #[error("snapshot: {0}")]
    Snapshot(#[from] SnapshotError),
    /// A vCPU's saved state could not be restored.
    #[error("vCPU {0}: {1}")]
    VcpuState(u8, VcpuStateError),
}

/// Why a VM stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmEnd {
    /// The guest ended it.
    Guest(GuestEnd),
    /// lwpvmm received this signal (SIGINT, SIGTERM) and stopped it.
    Signal(i32),
}

/// How a VM ended.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// Why it stopped.
    pub end: VmEnd,
    /// The counters.
    pub metrics: serde_json::Value,
    /// Each vCPU's LWP unit counters.
    pub lwp: Vec<UnitStats>,
    /// What failed on the way without stopping the VM (a requested
    /// snapshot, a metrics write): the caller should report it and fail.
    pub errors: Vec<String>,
}

/// The metrics document: how the run ended (`null` while it runs), the
/// VM's counters, and each LWP unit's.
pub fn metrics_document(
    end: Option<VmEnd>,
    vm: &serde_json::Value,
    lwp: &[UnitStats],
) -> serde_json::Value {
    let end = match end {
        None => serde_json::Value::Null,
        Some(VmEnd::Guest(GuestEnd::ExitPort(value))) => serde_json::json!({ "exit_port": value }),
        Some(VmEnd::Guest(GuestEnd::PowerOff)) => serde_json::json!("power_off"),
        Some(VmEnd::Guest(GuestEnd::Reboot)) => serde_json::json!("reboot"),
        Some(VmEnd::Signal(signal)) => serde_json::json!({ "signal": signal }),
    };
    serde_json::json!({ "end": end, "vm": vm, "lwp_units": lwp })
}

/// The console's writer.
type Console = Box<dyn std::io::Write + Send>;

/// The files a run writes besides the console, opened before anything else.
struct Outputs {
    metrics: Option<RewriteFile>,
    trace: Option<TraceWriter>,
}

impl Outputs {
    /// Opens the console and every other output, in that order.
    fn open(
        serial: &SerialOut,
        profiling: &Profiling,
        plan: &SnapshotPlan,
        profile: LwpProfile,
    ) -> Result<(Console, Self), VmError> {
        let console = serial.writer().map_err(|e| match serial {
            SerialOut::File(path) => OutputError::new(OutputKind::Serial, path, e),
            _ => OutputError::new(OutputKind::Serial, Path::new("stdout"), e),
        })?;
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
        if let Some(dir) = &plan.dir {
            output::prepare_snapshot_dir(dir)?;
        }
        Ok((console, Outputs { metrics, trace }))
    }
}

fn setup(what: &'static str) -> impl Fn(kvm_ioctls::Error) -> VmError {
    move |source| VmError::Setup { what, source }
}

/// A created VM whose vCPUs have not run yet.
struct Machine {
    vm: Arc<VmFd>,
    mem: Arc<GuestMemory>,
    bus: Arc<Mutex<PortBus>>,
    vcpus: Vec<Vcpu>,
    xsave_size: usize,
    msr_indices: Vec<u32>,
    profile: LwpProfile,
    guest: GuestLwpSupport,
}

/// Opens KVM and checks every capability lwpvmm relies on.
fn open_kvm() -> Result<Kvm, VmError> {
    let kvm = Kvm::new().map_err(VmError::NoKvm)?;
    for (cap, name) in [
        (Cap::Irqchip, "KVM_CAP_IRQCHIP"),
        (Cap::UserMemory, "KVM_CAP_USER_MEMORY"),
        (Cap::SyncRegs, "KVM_CAP_SYNC_REGS"),
        (Cap::ImmediateExit, "KVM_CAP_IMMEDIATE_EXIT"),
        (Cap::X86UserSpaceMsr, "KVM_CAP_X86_USER_SPACE_MSR"),
        (Cap::X86MsrFilter, "KVM_CAP_X86_MSR_FILTER"),
        (Cap::SignalMsi, "KVM_CAP_SIGNAL_MSI"),
        (Cap::Irqfd, "KVM_CAP_IRQFD"),
    ] {
        if !kvm.check_extension(cap) {
            return Err(VmError::MissingCap(name));
        }
    }
    Ok(kvm)
}

/// The machine: memory, irqchip, PIT, MSR routing, the port bus and the
/// vCPUs with their CPUID and LWP units. Nothing is booted yet.
fn create_machine(
    kvm: &Kvm,
    memory_mib: u64,
    vcpu_count: u8,
    profile: LwpProfile,
    guest: GuestLwpSupport,
    bus: impl FnOnce(EventFd) -> Result<PortBus, VmError>,
) -> Result<Machine, VmError> {
    let max_vcpus = kvm.get_max_vcpus().min(255);
    if vcpu_count == 0 || usize::from(vcpu_count) > max_vcpus {
        return Err(VmError::VcpuCount(vcpu_count, max_vcpus));
    }
    let vm = Arc::new(kvm.create_vm().map_err(setup("KVM_CREATE_VM"))?);
    let mem = Arc::new(boot::create_memory(memory_mib)?);
    register_memory(&vm, &mem)?;
    vm.set_tss_address(0xfffb_d000)
        .map_err(setup("KVM_SET_TSS_ADDR"))?;
    vm.create_irq_chip().map_err(setup("KVM_CREATE_IRQCHIP"))?;
    let pit = kvm_pit_config {
        flags: PIT_SPEAKER_DUMMY,
        ..Default::default()
    };
    vm.create_pit2(pit).map_err(setup("KVM_CREATE_PIT2"))?;
    route_lwp_msrs(&vm)?;
    let serial_irq = EventFd::new(EFD_NONBLOCK).map_err(|e| VmError::Io("serial eventfd", e))?;
    vm.register_irqfd(&serial_irq, SERIAL_IRQ)
        .map_err(setup("KVM_IRQFD"))?;
    let bus = Arc::new(Mutex::new(bus(serial_irq)?));
    let supported = supported_cpuid(kvm)?;
    let xsave_size = usize::try_from(vm.check_extension_int(Cap::Xsave2))
        .ok()
        .filter(|&n| n >= 4096)
        .unwrap_or(4096);
    let msr_indices = kvm
        .get_msr_index_list()
        .map_err(setup("KVM_GET_MSR_INDEX_LIST"))?
        .as_slice()
        .to_vec();
    let mut vcpus = Vec::new();
    for id in 0..vcpu_count {
        let fd = vm
            .create_vcpu(u64::from(id))
            .map_err(setup("KVM_CREATE_VCPU"))?;
        let table = cpuid::build(&supported, profile, guest, id);
        let kvm_table: Vec<kvm_cpuid_entry2> = table.iter().map(to_kvm).collect();
        let kvm_cpuid = CpuId::from_entries(&kvm_table)
            .map_err(|_| VmError::MissingCap("room for the CPUID table"))?;
        fd.set_cpuid2(&kvm_cpuid).map_err(setup("KVM_SET_CPUID2"))?;
        // What the guest sees: kvm_pvm ORs host bits into leaves 1 and 7.
        let seen: Vec<CpuidEntry> = fd
            .get_cpuid2(KVM_MAX_CPUID_ENTRIES)
            .map_err(setup("KVM_GET_CPUID2"))?
            .as_slice()
            .iter()
            .map(from_kvm)
            .collect();
        let unit = profile.caps().map(LwpUnit::new);
        let tsc_offset = tsc_offset(&fd)?;
        // Without the rate the sampler charges TSC time instead of run time.
        let tsc_khz = fd.get_tsc_khz().unwrap_or(0);
        let instructions = guest == GuestLwpSupport::Shim;
        let mut vcpu = Vcpu::new(
            fd,
            id,
            table,
            PagingSource::new(&seen),
            unit,
            instructions,
            tsc_offset,
        );
        vcpu.set_tsc_khz(tsc_khz);
        vcpus.push(vcpu);
    }
    let precise = profile
        .caps()
        .is_some_and(|c| c.supported.intersects(LwpFeatures::IRE | LwpFeatures::BRE));
    if precise && guest == GuestLwpSupport::Shim {
        let backend = step_backend(kvm);
        vcpus.iter_mut().for_each(|v| v.set_step_backend(backend));
    }
    Ok(Machine {
        vm,
        mem,
        bus,
        vcpus,
        xsave_size,
        msr_indices,
        profile,
        guest,
    })
}

/// Boots a kernel and runs the VM to its end.
pub fn run(config: &VmConfig) -> Result<RunOutcome, VmError> {
    let (console, outputs) = Outputs::open(
        &config.serial,
        &config.profiling,
        &config.snapshots,
        config.profile,
    )?;
    let kvm = open_kvm()?;
    let machine = create_machine(
        &kvm,
        config.memory_mib,
        config.vcpus,
        config.profile,
        config.guest,
        |irq| Ok(PortBus::new(console, irq)),
    )?;
    let mut cmdline = config.cmdline.clone();
    if let Some(program) = &config.program {
        let entry = boot::load_program(&machine.mem, program)?;
        cmdline = format!("{cmdline} entry={entry}").trim().to_owned();
    }
    boot_kernel(
        &machine,
        &config.kernel,
        &cmdline,
        config.initramfs.as_deref(),
    )?;
    run_machine(
        machine,
        outputs,
        &config.snapshots,
        &config.profiling,
        Threads {
            seccomp: config.seccomp,
            stop_on_signals: config.stop_on_signals,
        },
    )
}

/// Loads a kernel, writes its boot information and sets the boot vCPU's
/// registers.
fn boot_kernel(
    machine: &Machine,
    image: &[u8],
    cmdline: &str,
    initramfs: Option<&[u8]>,
) -> Result<(), VmError> {
    let kernel = boot::load_kernel(&machine.mem, image)?;
    boot::write_boot_info(&machine.mem, &kernel, cmdline, initramfs)?;
    boot::write_gdt(&machine.mem)?;
    let boot_vcpu = machine.vcpus[0].fd();
    let sregs = boot_vcpu.get_sregs().map_err(setup("KVM_GET_SREGS"))?;
    let (regs, sregs) = boot::initial_state(kernel.entry, sregs);
    boot_vcpu
        .set_sregs(&sregs)
        .map_err(setup("KVM_SET_SREGS"))?;
    boot_vcpu.set_regs(&regs).map_err(setup("KVM_SET_REGS"))
}

/// Which stepping backend this host supports, probed once per process with
/// a throwaway VM (capabilities cannot tell: kvm_pvm reports
/// SET_GUEST_DEBUG and ROBUST_SINGLESTEP yet never exits for CPL3 steps).
fn step_backend(kvm: &Kvm) -> StepBackend {
    static BACKEND: OnceLock<StepBackend> = OnceLock::new();
    *BACKEND.get_or_init(|| {
        let backend = probe_step_backend(kvm).unwrap_or_else(|e| {
            log::warn!("stepping probe failed ({e}); using the trap-flag backend");
            StepBackend::TrapFlag
        });
        log::info!("precise events: the {} stepping backend", backend.name());
        backend
    })
}

fn probe_step_backend(kvm: &Kvm) -> Result<StepBackend, VmError> {
    let mut machine = create_machine(kvm, 16, 1, LwpProfile::Off, GuestLwpSupport::Stock, |irq| {
        Ok(PortBus::new(Box::new(std::io::sink()), irq))
    })?;
    let probe = crate::guests::get("stepprobe").unwrap_or_default();
    boot_kernel(&machine, probe, "", None)?;
    Ok(machine.vcpus[0].probe_stepping()?)
}

/// Options of `lwpvmm restore`.
#[derive(Debug, Clone)]
pub struct RestoreConfig {
    /// The snapshot directory.
    pub dir: PathBuf,
    /// Where serial output goes.
    pub serial: SerialOut,
    /// The profile the caller expects, if any: a snapshot taken with
    /// another is refused.
    pub profile: Option<LwpProfile>,
    /// Snapshots to take from the restored VM.
    pub snapshots: SnapshotPlan,
    /// The seccomp filters of the vCPU and control threads.
    pub seccomp: SeccompMode,
    /// Stop the VM cleanly on SIGINT and SIGTERM, as [`VmConfig`].
    pub stop_on_signals: bool,
    /// The sampler and the trace.
    pub profiling: Profiling,
}

/// Restores a snapshot and runs the VM to its end. Everything in the
/// snapshot is checked before any vCPU runs.
pub fn restore(config: &RestoreConfig) -> Result<RunOutcome, VmError> {
    let started = Instant::now();
    let snap = snapshot::read_state(&config.dir)?;
    let profile: LwpProfile = snap
        .profile
        .parse()
        .map_err(|e: UnknownProfile| SnapshotError::Mismatch(e.to_string()))?;
    let (console, outputs) = Outputs::open(
        &config.serial,
        &config.profiling,
        &config.snapshots,
        profile,
    )?;
    if let Some(want) = config.profile
        && want != profile
    {
        return Err(SnapshotError::Mismatch(format!(
            "it was taken with LWP profile `{profile}`, --lwp asks for `{want}`"
        ))
        .into());
    }
    let guest = match snap.guest.as_str() {
        "shim" => GuestLwpSupport::Shim,
        "stock" => GuestLwpSupport::Stock,
        other => {
            return Err(SnapshotError::Mismatch(format!("unknown guest kind `{other}`")).into());
        }
    };
    let total: u64 = snap.memory.regions.iter().map(|r| r.1).sum();
    let vcpu_count = u8::try_from(snap.vcpus.len())
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| SnapshotError::Mismatch(format!("{} vCPUs", snap.vcpus.len())))?;
    if snap
        .vcpus
        .iter()
        .enumerate()
        .any(|(i, v)| usize::from(v.id) != i)
    {
        return Err(SnapshotError::Mismatch("vCPU ids are not 0..n in order".into()).into());
    }
    let kvm = open_kvm()?;
    check_cpuid(&kvm, &snap, profile, guest)?;
    let serial_state = snap.serial.clone();
    let mut machine = create_machine(&kvm, total >> 20, vcpu_count, profile, guest, |irq| {
        PortBus::from_state(console, irq, &serial_state)
            .map_err(|e| SnapshotError::Mismatch(format!("the serial port's state: {e}")).into())
    })?;
    snapshot::read_memory(&config.dir, &machine.mem, &snap.memory)?;
    for (vcpu, saved) in machine.vcpus.iter_mut().zip(&snap.vcpus) {
        let unit = restore_lwp(&machine.mem, profile, saved)?;
        vcpu_state::apply(vcpu.fd(), saved, machine.xsave_size)
            .map_err(|e| VmError::VcpuState(saved.id, e))?;
        vcpu.set_unit(unit, saved.lwp.as_ref().and_then(|l| l.lwpcb_cr3));
    }
    let vm = &machine.vm;
    vm.set_pit2(&snap.vm.pit).map_err(setup("KVM_SET_PIT2"))?;
    vm.set_clock(&snap.vm.clock)
        .map_err(setup("KVM_SET_CLOCK"))?;
    for chip in [&snap.vm.pic_master, &snap.vm.pic_slave, &snap.vm.ioapic] {
        vm.set_irqchip(chip).map_err(setup("KVM_SET_IRQCHIP"))?;
    }
    log::info!(
        "snapshot {} restored in {:.1} ms",
        config.dir.display(),
        started.elapsed().as_secs_f64() * 1e3
    );
    run_machine(
        machine,
        outputs,
        &config.snapshots,
        &config.profiling,
        Threads {
            seccomp: config.seccomp,
            stop_on_signals: config.stop_on_signals,
        },
    )
}

/// Refuses a snapshot whose CPUID tables differ from what this host gives
/// the same profile.
fn check_cpuid(
    kvm: &Kvm,
    snap: &VmSnapshot,
    profile: LwpProfile,
    guest: GuestLwpSupport,
) -> Result<(), VmError> {
    let supported = supported_cpuid(kvm)?;
    for v in &snap.vcpus {
        let here = cpuid::build(&supported, profile, guest, v.id);
        if here != v.cpuid {
            let differing: Vec<String> = here
                .iter()
                .filter(|e| !v.cpuid.contains(e))
                .chain(v.cpuid.iter().filter(|e| !here.contains(e)))
                .map(|e| format!("{:#x}.{}", e.leaf, e.subleaf))
                .take(6)
                .collect();
            return Err(SnapshotError::Mismatch(format!(
                "vCPU {}: the CPUID table differs from the one this host gives profile `{profile}` (leaves {})",
                v.id,
                differing.join(", ")
            ))
            .into());
        }
    }
    Ok(())
}

/// Rebuilds a vCPU's LWP unit from its snapshot section, which is untrusted.
fn restore_lwp(
    mem: &GuestMemory,
    profile: LwpProfile,
    saved: &VcpuSnapshot,
) -> Result<Option<LwpUnit>, VmError> {
    let id = saved.id;
    let bad = |reason: String| VmError::from(SnapshotError::Lwp { vcpu: id, reason });
    let (Some(caps), Some(section)) = (profile.caps(), &saved.lwp) else {
        return match (profile.caps(), &saved.lwp) {
            (None, None) => Ok(None),
            _ => Err(bad(format!(
                "LWP section present: {}, profile `{profile}`",
                saved.lwp.is_some()
            ))),
        };
    };
    let unit = LwpUnit::from_state(caps, &section.unit).map_err(|e| bad(e.to_string()))?;
    if unit.save_xsave().to_bytes().as_slice() != section.component62.as_slice() {
        return Err(bad(
            "the component-62 image does not match the unit state".into()
        ));
    }
    if let Some(block) = unit.block() {
        let xsave: Vec<u8> = saved.xsave.iter().flat_map(|w| w.to_le_bytes()).collect();
        let paging = PagingSource::new(&saved.cpuid)
            .paging(&saved.sregs, Some(&xsave))
            .map_err(|e| bad(e.to_string()))?;
        GuestView::new(mem, paging)
            .check(block.address, u64::from(caps.cb_size()), Access::UserWrite)
            .map_err(|e| {
                bad(format!(
                    "the LWPCB at {:#x} is not in guest RAM the vCPU can reach: {e}",
                    block.address
                ))
            })?;
    }
    Ok(Some(unit))
}

fn supported_cpuid(kvm: &Kvm) -> Result<Vec<CpuidEntry>, VmError> {
    let supported = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(setup("KVM_GET_SUPPORTED_CPUID"))?;
    Ok(supported.as_slice().iter().map(from_kvm).collect())
}

fn register_memory(vm: &VmFd, mem: &GuestMemory) -> Result<(), VmError> {
    for (slot, region) in mem.iter().enumerate() {
        let host = mem
            .get_host_address(region.start_addr())
            .map_err(|_| VmError::MissingCap("a host mapping of guest memory"))?;
        let region = kvm_userspace_memory_region {
            slot: slot as u32,
            flags: 0,
            guest_phys_addr: region.start_addr().raw_value(),
            memory_size: region.len(),
            userspace_addr: host as u64,
        };
        // SAFETY: the region describes a live mmap owned by `mem`, which the
        // VM (and every vCPU thread) keeps alive through an Arc until the VM
        // is dropped; slots do not overlap because regions do not.
        unsafe { vm.set_user_memory_region(region) }
            .map_err(setup("KVM_SET_USER_MEMORY_REGION"))?;
    }
    Ok(())
}

/// Sends guest accesses to LWP_CFG and LWP_CBADDR to userspace: KVM does not
/// know them, and the deny filter keeps the routing even on a kernel that
/// starts to.
fn route_lwp_msrs(vm: &VmFd) -> Result<(), VmError> {
    let cap = kvm_enable_cap {
        cap: kvm_bindings::KVM_CAP_X86_USER_SPACE_MSR,
        args: [u64::from(KVM_MSR_EXIT_REASON_FILTER), 0, 0, 0],
        ..Default::default()
    };
    vm.enable_cap(&cap)
        .map_err(setup("enabling KVM_CAP_X86_USER_SPACE_MSR"))?;
    let bitmap = [0u8; 1];
    let range = MsrFilterRange {
        flags: MsrFilterRangeFlags::READ | MsrFilterRangeFlags::WRITE,
        base: MSR_LWP_CFG,
        msr_count: 2,
        bitmap: &bitmap,
    };
    vm.set_msr_filter(MsrFilterDefaultAction::ALLOW, &[range])
        .map_err(setup("KVM_X86_SET_MSR_FILTER"))
}

fn tsc_offset(fd: &VcpuFd) -> Result<i64, VmError> {
    let mut msrs = Msrs::from_entries(&[kvm_msr_entry {
        index: MSR_IA32_TSC,
        ..Default::default()
    }])
    .map_err(|_| VmError::MissingCap("room for one MSR"))?;
    // SAFETY: RDTSC has no memory effects; the host CPU has it (x86-64).
    let host = unsafe { core::arch::x86_64::_rdtsc() };
    let n = fd
        .get_msrs(&mut msrs)
        .map_err(setup("KVM_GET_MSRS(IA32_TSC)"))?;
    let guest = if n == 1 {
        msrs.as_slice()[0].data
    } else {
        host
    };
    Ok(guest.wrapping_sub(host) as i64)
}

fn from_kvm(e: &kvm_cpuid_entry2) -> CpuidEntry {
    CpuidEntry {
        leaf: e.function,
        subleaf: e.index,
        eax: e.eax,
        ebx: e.ebx,
        ecx: e.ecx,
        edx: e.edx,
    }
}

fn to_kvm(e: &CpuidEntry) -> kvm_cpuid_entry2 {
    let significant = matches!(
        e.leaf,
        4 | 7
            | 0xB
            | 0xD
            | 0xF
            | 0x10
            | 0x12
            | 0x14
            | 0x17
            | 0x18
            | 0x1D
            | 0x1E
            | 0x1F
            | 0x24
            | 0x8000_001D
            | 0x8000_0020
            | 0x8000_0026
    );
    kvm_cpuid_entry2 {
        function: e.leaf,
        index: e.subleaf,
        flags: if significant {
            kvm_bindings::KVM_CPUID_FLAG_SIGNIFCANT_INDEX
        } else {
            0
        },
        eax: e.eax,
        ebx: e.ebx,
        ecx: e.ecx,
        edx: e.edx,
        ..Default::default()
    }
}

/// The table `lwpvmm cpuid` prints: what vCPU 0 of a VM with this profile
/// receives through KVM_SET_CPUID2 (a host module may OR in bits of its own).
pub fn cpuid_table(
    profile: LwpProfile,
    guest: GuestLwpSupport,
) -> Result<Vec<CpuidEntry>, VmError> {
    let kvm = Kvm::new().map_err(VmError::NoKvm)?;
    Ok(cpuid::build(&supported_cpuid(&kvm)?, profile, guest, 0))
}

/// What the event loop is waiting for: the VM's end, console input,
/// snapshot requests (the `--snapshot-after` timer and SIGUSR2), metrics
/// dumps (SIGUSR1), sampler ticks and stop signals.
struct Control {
    exit: EventFd,
    stdin: Option<std::io::Stdin>,
    bus: Arc<Mutex<PortBus>>,
    timer: Option<TimerFd>,
    sigusr2: Option<UnixStream>,
    sampler: Option<TimerFd>,
    samples_due: u64,
    sigusr1: Option<UnixStream>,
    stop_signals: Option<StopSignals>,
    metrics_due: bool,
    snapshot_due: bool,
    signal: Option<i32>,
    done: bool,
}

impl MutEventSubscriber for Control {
    fn process(&mut self, events: Events, ops: &mut EventOps) {
        let fd = events.fd();
        if fd == self.exit.as_raw_fd() {
            self.done = true;
        } else if let Some(t) = self.sampler.as_mut().filter(|t| t.as_raw_fd() == fd) {
            self.samples_due += t.wait().unwrap_or(0);
        } else if let Some(t) = self.timer.as_mut().filter(|t| t.as_raw_fd() == fd) {
            let _ = t.wait();
            self.snapshot_due = true;
        } else if let Some(s) = self.sigusr2.as_mut().filter(|s| s.as_raw_fd() == fd) {
            let mut b = [0u8; 16];
            let _ = s.read(&mut b);
            self.snapshot_due = true;
        } else if let Some(s) = self.sigusr1.as_mut().filter(|s| s.as_raw_fd() == fd) {
            let mut b = [0u8; 16];
            let _ = s.read(&mut b);
            self.metrics_due = true;
        } else if let Some(signal) = self.stop_signals.as_mut().and_then(|s| s.arrived(fd)) {
            self.signal.get_or_insert(signal);
            self.done = true;
        } else {
            self.console_input(ops);
        }
    }

    fn init(&mut self, ops: &mut EventOps) {
        let _ = ops.add(Events::new(&self.exit, EventSet::IN));
        if let Some(t) = &self.timer {
            let _ = ops.add(Events::new(t, EventSet::IN));
        }
        if let Some(t) = &self.sampler {
            let _ = ops.add(Events::new(t, EventSet::IN));
        }
        for s in self.sigusr2.iter().chain(&self.sigusr1) {
            let _ = ops.add(Events::new(s, EventSet::IN));
        }
        for fd in self.stop_signals.iter().flat_map(StopSignals::fds) {
            let _ = ops.add(Events::new_raw(fd, EventSet::IN));
        }
        if let Some(s) = &self.stdin
            && ops
                .add(Events::new_raw(s.as_raw_fd(), EventSet::IN))
                .is_err()
        {
            self.stdin = None;
        }
    }
}

impl Control {
    fn console_input(&mut self, ops: &mut EventOps) {
        let mut buf = [0u8; 64];
        let n = match &self.stdin {
            Some(s) => s.lock().read(&mut buf).unwrap_or(0),
            None => 0,
        };
        if n == 0 {
            if let Some(s) = self.stdin.take() {
                let _ = ops.remove(Events::new_raw(s.as_raw_fd(), EventSet::IN));
            }
            return;
        }
        if let Ok(mut bus) = self.bus.lock() {
            let _ = bus.serial_input(&buf[..n]);
        }
    }
}

fn stdin_is_terminal() -> bool {
    use std::io::IsTerminal;
    std::io::stdin().is_terminal()
}

/// A socket that receives a byte whenever `signal` arrives (signal-hook
/// writes it from the handler), for the event loop.
fn signal_pipe(signal: libc::c_int) -> Result<UnixStream, VmError> {
    let (reader, writer) = UnixStream::pair().map_err(|e| VmError::Io("signal pipe", e))?;
    reader
        .set_nonblocking(true)
        .map_err(|e| VmError::Io("signal pipe", e))?;
    signal_hook::low_level::pipe::register(signal, writer)
        .map_err(|e| VmError::Io("signal handler", e))?;
    Ok(reader)
}

fn event_error(what: &'static str) -> impl Fn(event_manager::Error) -> VmError {
    move |e| VmError::Io(what, std::io::Error::other(format!("{e:?}")))
}

/// What the main thread needs to take a snapshot while vCPU threads run.
struct Snapshotter<'a> {
    dir: &'a Path,
    vm: &'a VmFd,
    mem: &'a GuestMemory,
    bus: &'a Mutex<PortBus>,
    pause: &'a PauseGate,
    stop: &'a AtomicBool,
    profile: LwpProfile,
    guest: GuestLwpSupport,
}

impl Snapshotter<'_> {
    /// Pauses every vCPU, writes the snapshot, resumes. The vCPUs must have
    /// been kicked after `pause.request()`.
    fn take(&self) -> Result<(u64, u64), VmError> {
        let result = self.write();
        self.pause.release();
        result
    }

    fn write(&self) -> Result<(u64, u64), VmError> {
        let vcpus = self
            .pause
            .collect(self.stop)
            .map_err(SnapshotError::Mismatch)?;
        let chip = |chip_id| {
            let mut c = kvm_irqchip {
                chip_id,
                ..Default::default()
            };
            self.vm
                .get_irqchip(&mut c)
                .map(|()| c)
                .map_err(setup("KVM_GET_IRQCHIP"))
        };
        let vm = VmKvmState {
            pic_master: chip(KVM_IRQCHIP_PIC_MASTER)?,
            pic_slave: chip(KVM_IRQCHIP_PIC_SLAVE)?,
            ioapic: chip(KVM_IRQCHIP_IOAPIC)?,
            pit: self.vm.get_pit2().map_err(setup("KVM_GET_PIT2"))?,
            clock: self.vm.get_clock().map_err(setup("KVM_GET_CLOCK"))?,
        };
        let serial = self
            .bus
            .lock()
            .map_err(|_| VmError::Io("serial", std::io::Error::other("lock poisoned")))?
            .serial_state();
        let (crc64, memory_bytes) = snapshot::write_memory(self.dir, self.mem)?;
        let state = VmSnapshot {
            lwpvmm_version: env!("CARGO_PKG_VERSION").into(),
            profile: self.profile.name().into(),
            guest: match self.guest {
                GuestLwpSupport::Shim => "shim",
                GuestLwpSupport::Stock => "stock",
            }
            .into(),
            memory: MemoryLayout {
                regions: snapshot::layout(self.mem),
                crc64,
            },
            vm,
            serial,
            vcpus,
        };
        let state_bytes = snapshot::write_state(self.dir, &state)?;
        Ok((state_bytes, memory_bytes))
    }
}

/// How the threads of a running VM behave.
#[derive(Debug, Clone, Copy)]
struct Threads {
    seccomp: SeccompMode,
    stop_on_signals: bool,
}

fn run_machine(
    machine: Machine,
    outputs: Outputs,
    plan: &SnapshotPlan,
    profiling: &Profiling,
    threads: Threads,
) -> Result<RunOutcome, VmError> {
    register_signal_handler(SIGRTMIN(), kick_handler)
        .map_err(|e| VmError::Io("kick signal", e.into()))?;
    // Registered before any vCPU runs, so that no stop signal is lost.
    let stop_signals = threads
        .stop_on_signals
        .then(StopSignals::register)
        .transpose()
        .map_err(|e| VmError::Io("SIGINT and SIGTERM handlers", e))?;
    let Machine {
        vm,
        mem,
        bus,
        vcpus,
        xsave_size,
        msr_indices,
        profile,
        guest,
    } = machine;
    let Outputs {
        metrics: metrics_file,
        trace,
    } = outputs;
    let trace = trace.map(|t| Arc::new(Mutex::new(t)));
    let mut vcpus = vcpus;
    if trace.is_some() {
        vcpus.iter_mut().for_each(Vcpu::trace_records);
    }
    let sampled = profile
        .caps()
        .is_some_and(|c| c.supported.intersects(LwpFeatures::CNH | LwpFeatures::RNH));
    let sample_period = (sampled && profiling.sample_hz > 0)
        .then(|| Duration::from_nanos(1_000_000_000 / u64::from(profiling.sample_hz)));
    let sample_flags: Vec<Arc<AtomicBool>> = vcpus.iter().map(Vcpu::sample_flag).collect();
    let all_metrics: Vec<Arc<Metrics>> =
        vcpus.iter().map(|_| Arc::new(Metrics::default())).collect();
    let metrics = Arc::clone(&all_metrics[0]);
    let stop = Arc::new(AtomicBool::new(false));
    let pause = Arc::new(PauseGate::new(vcpus.len()));
    let msr_indices = Arc::new(msr_indices);
    let exit = EventFd::new(EFD_NONBLOCK).map_err(|e| VmError::Io("exit eventfd", e))?;
    let mut handles = Vec::new();
    for (mut vcpu, vcpu_metrics) in vcpus.into_iter().zip(&all_metrics) {
        let shared = Shared {
            vm: Arc::clone(&vm),
            mem: Arc::clone(&mem),
            bus: Arc::clone(&bus),
            stop: Arc::clone(&stop),
            metrics: Arc::clone(vcpu_metrics),
            pause: Arc::clone(&pause),
            xsave_size,
            msr_indices: Arc::clone(&msr_indices),
            trace: trace.clone(),
        };
        let exit = exit
            .try_clone()
            .map_err(|e| VmError::Io("exit eventfd", e))?;
        let name = format!("vcpu{}", vcpu.id());
        let handle = thread::Builder::new()
            .name(format!("lwpvmm-{name}"))
            .spawn(move || {
                let result = match seccomp::install(ThreadKind::Vcpu, threads.seccomp, &name) {
                    Err(e) => Err(VcpuError::Seccomp(e)),
                    Ok(()) => vcpu.run_loop(&shared),
                };
                shared.stop.store(true, Ordering::Release);
                let _ = exit.write(1);
                (result, vcpu.unit().map(LwpUnit::stats).unwrap_or_default())
            })
            .map_err(|e| VmError::Io("spawning a vCPU thread", e))?;
        handles.push(handle);
    }

    let control = ControlThread {
        vm,
        mem,
        bus,
        pause,
        stop,
        metrics,
        all_metrics,
        metrics_file,
        exit,
        handles,
        plan: plan.clone(),
        profile,
        guest,
        trace,
        sample_period,
        sample_flags,
        stop_signals,
    };
    thread::Builder::new()
        .name("lwpvmm-control".into())
        .spawn(move || control.run(threads.seccomp))
        .map_err(|e| VmError::Io("spawning the control thread", e))?
        .join()
        .map_err(|_| VmError::Io("control thread", std::io::Error::other("panicked")))?
}

/// The control thread's share of a running VM.
struct ControlThread {
    vm: Arc<VmFd>,
    mem: Arc<GuestMemory>,
    bus: Arc<Mutex<PortBus>>,
    pause: Arc<PauseGate>,
    stop: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
    all_metrics: Vec<Arc<Metrics>>,
    metrics_file: Option<RewriteFile>,
    exit: EventFd,
    handles: Vec<thread::JoinHandle<VcpuThreadResult>>,
    plan: SnapshotPlan,
    profile: LwpProfile,
    guest: GuestLwpSupport,
    trace: Option<Arc<Mutex<TraceWriter>>>,
    sample_period: Option<Duration>,
    sample_flags: Vec<Arc<AtomicBool>>,
    stop_signals: Option<StopSignals>,
}

/// What a vCPU thread hands back.
type VcpuThreadResult = (Result<VcpuStop, VcpuError>, UnitStats);

/// Writes the metrics document, or says why it could not.
fn write_metrics(file: &RewriteFile, document: &serde_json::Value) -> Result<(), String> {
    serde_json::to_vec_pretty(document)
        .map_err(std::io::Error::other)
        .and_then(|bytes| file.replace(&bytes))
        .map_err(|e| format!("cannot write the metrics to {}: {e}", file.path().display()))
}

impl ControlThread {
    /// The event loop, snapshots, and the shutdown of every vCPU thread. The
    /// seccomp filter goes on once the loop's descriptors exist.
    fn run(self, seccomp: SeccompMode) -> Result<RunOutcome, VmError> {
        let ControlThread {
            vm,
            mem,
            bus,
            pause,
            stop,
            metrics,
            all_metrics,
            metrics_file,
            exit,
            handles,
            plan,
            profile,
            guest,
            trace,
            sample_period,
            sample_flags,
            stop_signals,
        } = self;
        let plan = &plan;
        let timer = match (&plan.dir, plan.after) {
            (Some(_), Some(after)) => {
                let mut t = TimerFd::new().map_err(|e| VmError::Io("snapshot timer", e.into()))?;
                t.reset(after.max(Duration::from_millis(1)), None)
                    .map_err(|e| VmError::Io("snapshot timer", e.into()))?;
                Some(t)
            }
            _ => None,
        };
        let sigusr2 = match &plan.dir {
            Some(_) => Some(signal_pipe(signal_hook::consts::SIGUSR2)?),
            None => None,
        };
        let sigusr1 = match &metrics_file {
            Some(_) => Some(signal_pipe(signal_hook::consts::SIGUSR1)?),
            None => None,
        };
        let sampler = match sample_period {
            Some(period) => {
                let mut t = TimerFd::new().map_err(|e| VmError::Io("sampler timer", e.into()))?;
                t.reset(period, Some(period))
                    .map_err(|e| VmError::Io("sampler timer", e.into()))?;
                Some(t)
            }
            None => None,
        };
        let mut manager = EventManager::<Arc<Mutex<dyn MutEventSubscriber + Send>>>::new()
            .map_err(event_error("event manager"))?;
        let control = Arc::new(Mutex::new(Control {
            exit: exit
                .try_clone()
                .map_err(|e| VmError::Io("exit eventfd", e))?,
            stdin: stdin_is_terminal().then(std::io::stdin),
            bus: Arc::clone(&bus),
            timer,
            sigusr2,
            sampler,
            samples_due: 0,
            sigusr1,
            stop_signals,
            metrics_due: false,
            snapshot_due: false,
            signal: None,
            done: false,
        }));
        manager.add_subscriber(control.clone());
        seccomp::install(ThreadKind::Control, seccomp, "control")?;
        let snapshotter = plan.dir.as_deref().map(|dir| Snapshotter {
            dir,
            vm: &vm,
            mem: &mem,
            bus: &bus,
            pause: &pause,
            stop: &stop,
            profile,
            guest,
        });
        let mut errors = Vec::new();
        let signal = loop {
            let (done, due, samples, dump, signal) =
                control
                    .lock()
                    .map_or((true, false, 0, false, None), |mut c| {
                        (
                            c.done,
                            std::mem::take(&mut c.snapshot_due),
                            std::mem::take(&mut c.samples_due),
                            std::mem::take(&mut c.metrics_due),
                            c.signal,
                        )
                    });
            if done {
                break signal;
            }
            if let (true, Some(file)) = (dump, &metrics_file) {
                let json = metrics_document(None, &metrics::vm_json(&all_metrics), &[]);
                if let Err(e) = write_metrics(file, &json) {
                    log::error!("{e}");
                }
            }
            if samples > 0 {
                for (flag, h) in sample_flags.iter().zip(&handles) {
                    flag.store(true, Ordering::Release);
                    let _ = h.kill(SIGRTMIN());
                }
            }
            if let (true, Some(snap)) = (due, &snapshotter) {
                let started = Instant::now();
                pause.request();
                for h in &handles {
                    let _ = h.kill(SIGRTMIN());
                }
                match snap.take() {
                    Ok((state, memory)) => {
                        metrics.snapshots.fetch_add(1, Ordering::Relaxed);
                        log::info!(
                            "snapshot written to {} in {:.1} ms ({state} bytes of state, {memory} bytes of memory)",
                            snap.dir.display(),
                            started.elapsed().as_secs_f64() * 1e3
                        );
                    }
                    Err(e) => {
                        let e = format!("the snapshot to {} failed: {e}", snap.dir.display());
                        log::error!("{e}");
                        errors.push(e);
                    }
                }
                continue;
            }
            manager.run().map_err(event_error("event loop"))?;
        };

        stop.store(true, Ordering::Release);
        for h in &handles {
            let _ = h.kill(SIGRTMIN());
        }
        let mut first: Option<Result<GuestEnd, VmError>> = None;
        let mut lwp = Vec::new();
        for (id, h) in handles.into_iter().enumerate() {
            let (result, stats) = h.join().map_err(|_| VmError::Panicked(id as u8))?;
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
        if let Ok(mut b) = bus.lock() {
            b.flush();
        }
        if let Some(t) = &trace
            && t.lock().map_or(true, |mut t| t.flush().is_err())
        {
            metrics.trace_errors.fetch_add(1, Ordering::Relaxed);
        }
        let end = match (first, signal) {
            (Some(Err(e)), _) => return Err(e),
            (Some(Ok(end)), _) => VmEnd::Guest(end),
            (None, Some(signal)) => {
                log::info!("{} received: the VM was stopped", signals::name(signal));
                VmEnd::Signal(signal)
            }
            (None, None) => VmEnd::Guest(GuestEnd::ExitPort(0)),
        };
        let vm_metrics = metrics::vm_json(&all_metrics);
        if let Some(file) = &metrics_file
            && let Err(e) = write_metrics(file, &metrics_document(Some(end), &vm_metrics, &lwp))
        {
            errors.push(e);
        }
        Ok(RunOutcome {
            end,
            metrics: vm_metrics,
            lwp,
            errors,
        })
    }
}
