//! A VM from configuration to exit: opening KVM and checking the capabilities
//! lwpvmm needs, guest memory, the in-kernel irqchip and PIT, the LWP MSR
//! filter, CPUID, boot, one thread per vCPU, the event loop that waits for
//! the end, and the clean shutdown of every thread.

use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use event_manager::{EventManager, EventOps, Events, MutEventSubscriber, SubscriberOps};
use kvm_bindings::{
    CpuId, KVM_MAX_CPUID_ENTRIES, KVM_MSR_EXIT_REASON_FILTER, Msrs, kvm_cpuid_entry2,
    kvm_enable_cap, kvm_msr_entry, kvm_pit_config, kvm_userspace_memory_region,
};
use kvm_ioctls::{
    Cap, Kvm, MsrFilterDefaultAction, MsrFilterRange, MsrFilterRangeFlags, VcpuFd, VmFd,
};
use thiserror::Error;
use vm_memory::{Address, GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};
use vmm_sys_util::signal::{Killable, SIGRTMIN, register_signal_handler};

use super::boot::{self, BootError};
use super::cpuid;
use super::devices::{PortBus, SERIAL_IRQ, SerialOut};
use super::metrics::Metrics;
use super::vcpu::{Shared, Vcpu, VcpuError, VcpuStop, kick_handler};
use crate::guard::GuestMemory;
use crate::lwp::cpuid::{CpuidEntry, GuestLwpSupport, LwpProfile};
use crate::lwp::msr::MSR_LWP_CFG;
use crate::lwp::unit::{LwpUnit, UnitStats};

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
    /// Host-side I/O (serial file, event loop) failed.
    #[error("{0}: {1}")]
    Io(&'static str, std::io::Error),
    /// A vCPU thread panicked.
    #[error("vCPU {0} thread panicked")]
    Panicked(u8),
}

/// How a VM ended.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// The value the guest wrote to the exit port.
    pub exit_value: u8,
    /// The counters.
    pub metrics: serde_json::Value,
    /// Each vCPU's LWP unit counters.
    pub lwp: Vec<UnitStats>,
}

fn setup(what: &'static str) -> impl Fn(kvm_ioctls::Error) -> VmError {
    move |source| VmError::Setup { what, source }
}

/// Runs a VM to its end.
pub fn run(config: &VmConfig) -> Result<RunOutcome, VmError> {
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
    let max_vcpus = kvm.get_max_vcpus().min(255);
    if config.vcpus == 0 || usize::from(config.vcpus) > max_vcpus {
        return Err(VmError::VcpuCount(config.vcpus, max_vcpus));
    }
    let vm = Arc::new(kvm.create_vm().map_err(setup("KVM_CREATE_VM"))?);
    let mem = Arc::new(boot::create_memory(config.memory_mib)?);
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

    let kernel = boot::load_kernel(&mem, &config.kernel)?;
    boot::write_boot_info(&mem, &kernel, &config.cmdline, config.initramfs.as_deref())?;
    boot::write_gdt(&mem)?;

    let serial_irq = EventFd::new(EFD_NONBLOCK).map_err(|e| VmError::Io("serial eventfd", e))?;
    vm.register_irqfd(&serial_irq, SERIAL_IRQ)
        .map_err(setup("KVM_IRQFD"))?;
    let bus = Arc::new(Mutex::new(
        PortBus::new(&config.serial, serial_irq).map_err(|e| VmError::Io("serial output", e))?,
    ));

    let supported = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(setup("KVM_GET_SUPPORTED_CPUID"))?;
    let supported: Vec<CpuidEntry> = supported.as_slice().iter().map(from_kvm).collect();
    let mut vcpus = Vec::new();
    for id in 0..config.vcpus {
        let fd = vm
            .create_vcpu(u64::from(id))
            .map_err(setup("KVM_CREATE_VCPU"))?;
        let table = cpuid::build(&supported, config.profile, config.guest, id);
        let kvm_table: Vec<kvm_cpuid_entry2> = table.iter().map(to_kvm).collect();
        let cpuid = CpuId::from_entries(&kvm_table)
            .map_err(|_| VmError::MissingCap("room for the CPUID table"))?;
        fd.set_cpuid2(&cpuid).map_err(setup("KVM_SET_CPUID2"))?;
        if id == 0 {
            let sregs = fd.get_sregs().map_err(setup("KVM_GET_SREGS"))?;
            let (regs, sregs) = boot::initial_state(kernel.entry, sregs);
            fd.set_sregs(&sregs).map_err(setup("KVM_SET_SREGS"))?;
            fd.set_regs(&regs).map_err(setup("KVM_SET_REGS"))?;
        }
        let unit = config.profile.caps().map(LwpUnit::new);
        let tsc_offset = tsc_offset(&fd)?;
        let instructions = config.guest == GuestLwpSupport::Shim;
        vcpus.push(Vcpu::new(fd, id, unit, instructions, tsc_offset));
    }
    run_vcpus(vm, mem, bus, vcpus)
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
    let supported = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(setup("KVM_GET_SUPPORTED_CPUID"))?;
    let supported: Vec<CpuidEntry> = supported.as_slice().iter().map(from_kvm).collect();
    Ok(cpuid::build(&supported, profile, guest, 0))
}

/// Waits for the VM's end on the event loop: the exit eventfd (a vCPU
/// stopped) and console input.
struct Control {
    exit: EventFd,
    stdin: Option<std::io::Stdin>,
    bus: Arc<Mutex<PortBus>>,
    done: bool,
}

impl MutEventSubscriber for Control {
    fn process(&mut self, events: Events, ops: &mut EventOps) {
        if events.fd() == self.exit.as_raw_fd() {
            self.done = true;
            return;
        }
        let mut buf = [0u8; 64];
        let n = match &self.stdin {
            Some(s) => {
                use std::io::Read;
                s.lock().read(&mut buf).unwrap_or(0)
            }
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

    fn init(&mut self, ops: &mut EventOps) {
        let _ = ops.add(Events::new(&self.exit, EventSet::IN));
        if let Some(s) = &self.stdin
            && ops
                .add(Events::new_raw(s.as_raw_fd(), EventSet::IN))
                .is_err()
        {
            self.stdin = None;
        }
    }
}

fn stdin_is_terminal() -> bool {
    use std::io::IsTerminal;
    std::io::stdin().is_terminal()
}

fn run_vcpus(
    vm: Arc<VmFd>,
    mem: Arc<GuestMemory>,
    bus: Arc<Mutex<PortBus>>,
    vcpus: Vec<Vcpu>,
) -> Result<RunOutcome, VmError> {
    register_signal_handler(SIGRTMIN(), kick_handler)
        .map_err(|e| VmError::Io("kick signal", e.into()))?;
    let metrics = Arc::new(Metrics::default());
    let stop = Arc::new(AtomicBool::new(false));
    let exit = EventFd::new(EFD_NONBLOCK).map_err(|e| VmError::Io("exit eventfd", e))?;
    let mut handles = Vec::new();
    for mut vcpu in vcpus {
        let shared = Shared {
            vm: Arc::clone(&vm),
            mem: Arc::clone(&mem),
            bus: Arc::clone(&bus),
            stop: Arc::clone(&stop),
            metrics: Arc::clone(&metrics),
        };
        let exit = exit
            .try_clone()
            .map_err(|e| VmError::Io("exit eventfd", e))?;
        let handle = thread::Builder::new()
            .name("lwpvmm-vcpu".into())
            .spawn(move || {
                let result = vcpu.run_loop(&shared);
                shared.stop.store(true, Ordering::Release);
                let _ = exit.write(1);
                (result, vcpu.unit().map(LwpUnit::stats).unwrap_or_default())
            })
            .map_err(|e| VmError::Io("spawning a vCPU thread", e))?;
        handles.push(handle);
    }

    let mut manager = EventManager::<Arc<Mutex<dyn MutEventSubscriber + Send>>>::new()
        .map_err(|e| VmError::Io("event manager", std::io::Error::other(format!("{e:?}"))))?;
    let control = Arc::new(Mutex::new(Control {
        exit: exit
            .try_clone()
            .map_err(|e| VmError::Io("exit eventfd", e))?,
        stdin: stdin_is_terminal().then(std::io::stdin),
        bus: Arc::clone(&bus),
        done: false,
    }));
    manager.add_subscriber(control.clone());
    while !control.lock().map_or(true, |c| c.done) {
        manager
            .run()
            .map_err(|e| VmError::Io("event loop", std::io::Error::other(format!("{e:?}"))))?;
    }

    for h in &handles {
        let _ = h.kill(SIGRTMIN());
    }
    let mut first: Option<Result<u8, VmError>> = None;
    let mut lwp = Vec::new();
    for (id, h) in handles.into_iter().enumerate() {
        let (result, stats) = h.join().map_err(|_| VmError::Panicked(id as u8))?;
        lwp.push(stats);
        let r = match result {
            Ok(VcpuStop::ExitPort(v)) => Some(Ok(v)),
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
    let exit_value = first.unwrap_or(Ok(0))?;
    Ok(RunOutcome {
        exit_value,
        metrics: metrics.to_json(),
        lwp,
    })
}
