//! The KVM machine: /dev/kvm with every capability lwpvmm relies on
//! checked, the VM with its memory slots, KVM's split irqchip (local APICs
//! in the kernel) and lwpvmm's IOAPIC, the LWP MSRs routed to userspace, the
//! port bus, and the vCPUs with their CPUID, paging source and LWP state.
//! Nothing runs yet. Also the table `lwpvmm cpuid` prints.

use std::io::Write;
use std::sync::Arc;

use kvm_bindings::{
    CpuId, KVM_MAX_CPUID_ENTRIES, KVM_MSR_EXIT_REASON_FILTER, Msrs, kvm_cpuid_entry2,
    kvm_enable_cap, kvm_msr_entry, kvm_userspace_memory_region,
};
use kvm_ioctls::{
    Cap, Kvm, MsrFilterDefaultAction, MsrFilterRange, MsrFilterRangeFlags, VcpuFd, VmFd,
};
use vm_memory::{Address, GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::guard::GuestMemory;
use crate::lwp::cpuid::{CpuidEntry, GuestLwpSupport, LwpProfile};
use crate::lwp::msr::MSR_LWP_CFG;
use crate::vmm::base::pv::{THRESHOLD_GSI, THRESHOLD_LINES};
use crate::vmm::boot;
use crate::vmm::devices::ioapic::{IOAPIC_PINS, IoapicDevice, IoapicState};
use crate::vmm::devices::pm::PmState;
use crate::vmm::devices::port_bus::{PortBus, SERIAL_IRQ, SerialSnapshot};
use crate::vmm::error::{VmError, setup};
use crate::vmm::snapshot::SnapshotError;
use crate::vmm::vcpu::cpuid;
use crate::vmm::vcpu::guest_paging::PagingSource;
use crate::vmm::vcpu::step::StepBackend;
use crate::vmm::vcpu::{KvmVcpu, LwpState, Vcpu, VcpuLwp};

const MSR_IA32_TSC: u32 = 0x10;
/// Where KVM keeps its real-mode TSS: the top of the MMIO hole, below the
/// IOAPIC.
const TSS_ADDRESS: usize = 0xfffb_d000;
/// xAPIC IDs go to 254 (255 is the broadcast).
const MAX_XAPIC_VCPUS: usize = 254;

/// What a machine is made of.
#[derive(Debug, Clone, Copy)]
pub struct MachineSpec {
    /// Guest RAM in MiB.
    pub memory_mib: u64,
    /// vCPUs.
    pub vcpus: u8,
    /// The LWP profile.
    pub profile: LwpProfile,
    /// Whether the guest carries the paravirtual shim.
    pub guest: GuestLwpSupport,
}

/// A created VM whose vCPUs have not run yet.
pub struct Machine {
    /// The VM.
    pub vm: Arc<VmFd>,
    /// Guest RAM.
    pub mem: Arc<GuestMemory>,
    /// The port bus.
    pub bus: PortBus,
    /// The IOAPIC.
    pub ioapic: Arc<IoapicDevice>,
    /// The vCPUs.
    pub vcpus: Vec<Vcpu>,
    /// KVM_CAP_XSAVE2 of this VM.
    pub xsave_size: usize,
    /// The MSRs KVM lists as saveable.
    pub msr_indices: Vec<u32>,
    /// What it was made of.
    pub spec: MachineSpec,
    /// Its kernel runs in the host's native supervisor mode (set when the
    /// kernel is booted).
    pub native: bool,
}

/// Opens KVM and checks every capability lwpvmm relies on.
pub fn open_kvm() -> Result<Kvm, VmError> {
    let kvm = Kvm::new().map_err(VmError::NoKvm)?;
    for (cap, name) in [
        (Cap::Irqchip, "KVM_CAP_IRQCHIP"),
        (Cap::SplitIrqchip, "KVM_CAP_SPLIT_IRQCHIP"),
        (Cap::IrqRouting, "KVM_CAP_IRQ_ROUTING"),
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

/// Where a machine's state comes from.
pub enum Origin<'a> {
    /// A fresh boot: anonymous RAM, every device in its reset state.
    Boot,
    /// A snapshot: what it saved of the machine below the vCPUs' registers.
    Restore(Restored<'a>),
}

/// What a snapshot gives a machine as it is created.
pub struct Restored<'a> {
    /// The memory file guest RAM is mapped from.
    pub memory_file: &'a std::fs::File,
    /// The serial port's registers.
    pub serial: &'a SerialSnapshot,
    /// The power-management registers.
    pub pm: PmState,
    /// The IOAPIC's registers.
    pub ioapic: &'a IoapicState,
    /// Each vCPU's LWP state.
    pub lwp: &'a [Option<&'a LwpState>],
}

/// The VM without its vCPUs: memory, interrupt controllers and the port bus.
pub struct VmParts {
    /// The VM.
    pub vm: Arc<VmFd>,
    /// Guest RAM.
    pub mem: Arc<GuestMemory>,
    /// The port bus, its serial port writing to the console.
    pub bus: PortBus,
    /// The IOAPIC.
    pub ioapic: Arc<IoapicDevice>,
}

/// Creates the machine from `origin`: the VM (`create_vm`), then its vCPUs
/// (`create_vcpus`). `console` takes the serial output; `backend` is how
/// vCPUs single-step, when the VM offers precise events to a shim guest.
pub fn create(
    kvm: &Kvm,
    spec: MachineSpec,
    console: Box<dyn Write + Send>,
    origin: &Origin<'_>,
    backend: Option<StepBackend>,
) -> Result<Machine, VmError> {
    let max = kvm.get_max_vcpus().min(MAX_XAPIC_VCPUS);
    if spec.vcpus == 0 || usize::from(spec.vcpus) > max {
        return Err(VmError::VcpuCount {
            requested: spec.vcpus,
            max,
        });
    }
    let VmParts {
        vm,
        mem,
        bus,
        ioapic,
    } = create_vm(kvm, spec.memory_mib, console, origin)?;
    let lwp = match origin {
        Origin::Boot => &[][..],
        Origin::Restore(saved) => saved.lwp,
    };
    let xsave_size = usize::try_from(vm.check_extension_int(Cap::Xsave2))
        .ok()
        .filter(|&n| n >= 4096)
        .unwrap_or(4096);
    let vcpus = create_vcpus(kvm, &vm, spec, backend, lwp, xsave_size)?;
    let msr_indices = kvm
        .get_msr_index_list()
        .map_err(setup("KVM_GET_MSR_INDEX_LIST"))?
        .as_slice()
        .to_vec();
    Ok(Machine {
        vm,
        mem,
        bus,
        ioapic,
        vcpus,
        xsave_size,
        msr_indices,
        spec,
        native: false,
    })
}

/// The VM: its memory slots (fresh or mapped from a snapshot's file), the
/// LWP MSRs routed to userspace, KVM's split irqchip with lwpvmm's IOAPIC,
/// and the port bus with the serial irqfd.
pub fn create_vm(
    kvm: &Kvm,
    memory_mib: u64,
    console: Box<dyn Write + Send>,
    origin: &Origin<'_>,
) -> Result<VmParts, VmError> {
    let vm = Arc::new(kvm.create_vm().map_err(setup("KVM_CREATE_VM"))?);
    // First, while the VM's SRCU is idle: after a device has registered on
    // one of its buses, the filter's synchronize_srcu waits out a full
    // grace period.
    route_lwp_msrs(&vm)?;
    let mem = Arc::new(match origin {
        Origin::Boot => boot::create_memory(memory_mib)?,
        Origin::Restore(saved) => boot::memory_from_file(memory_mib, saved.memory_file)?,
    });
    register_memory(&vm, &mem)?;
    vm.set_tss_address(TSS_ADDRESS)
        .map_err(setup("KVM_SET_TSS_ADDR"))?;
    // Not KVM's IOAPIC, PIC and PIT: their teardown waits out SRCU grace
    // periods, most of a short run (ioapic.rs).
    let split = kvm_enable_cap {
        cap: kvm_bindings::KVM_CAP_SPLIT_IRQCHIP,
        args: [IOAPIC_PINS as u64, 0, 0, 0],
        ..Default::default()
    };
    vm.enable_cap(&split)
        .map_err(setup("enabling KVM_CAP_SPLIT_IRQCHIP"))?;
    let ioapic_state = match origin {
        Origin::Boot => IoapicState::default(),
        Origin::Restore(saved) => *saved.ioapic,
    };
    let ioapic = Arc::new(
        IoapicDevice::new(ioapic_state, IoapicDevice::kvm_sink(Arc::clone(&vm))).map_err(|e| {
            VmError::Setup {
                what: "KVM_SET_GSI_ROUTING",
                source: e.0,
            }
        })?,
    );
    let serial_irq = EventFd::new(EFD_NONBLOCK).map_err(|source| VmError::Thread {
        what: "serial interrupt",
        source,
    })?;
    vm.register_irqfd(&serial_irq, SERIAL_IRQ)
        .map_err(setup("KVM_IRQFD"))?;
    let bus = match origin {
        Origin::Boot => PortBus::new(console, serial_irq),
        Origin::Restore(saved) => PortBus::from_state(console, serial_irq, saved.serial, saved.pm)
            .map_err(|e| SnapshotError::Mismatch(format!("the serial port's state: {e}")))?,
    };
    Ok(VmParts {
        vm,
        mem,
        bus,
        ioapic,
    })
}

/// `spec.vcpus` vCPUs of `vm`, each with the CPUID table lwpvmm builds for
/// it and its LWP state (`lwp[i]` from a snapshot, or fresh); `xsave_size`
/// is the VM's KVM_CAP_XSAVE2.
pub fn create_vcpus(
    kvm: &Kvm,
    vm: &Arc<VmFd>,
    spec: MachineSpec,
    backend: Option<StepBackend>,
    lwp: &[Option<&LwpState>],
    xsave_size: usize,
) -> Result<Vec<Vcpu>, VmError> {
    let supported = supported_cpuid(kvm)?;
    let shim = spec.guest == GuestLwpSupport::Shim;
    let mut vcpus = Vec::new();
    for id in 0..spec.vcpus {
        let fd = vm
            .create_vcpu(u64::from(id))
            .map_err(setup("KVM_CREATE_VCPU"))?;
        let table = cpuid::build(&supported, spec.profile, spec.guest, id, spec.vcpus);
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
        let tsc_offset = tsc_offset(&fd)?;
        // Without the rate the sampler charges TSC time instead of run time.
        let tsc_khz = fd.get_tsc_khz().unwrap_or(0);
        let lwp = VcpuLwp::new(
            spec.profile.caps(),
            shim,
            backend,
            lwp.get(usize::from(id)).copied().flatten(),
        )
        .map_err(|reason| SnapshotError::Lwp { vcpu: id, reason })?;
        let kvm_vcpu = KvmVcpu::new(
            fd,
            Arc::clone(vm),
            id,
            tsc_offset,
            PagingSource::new(&seen),
            (u32::from(id) < THRESHOLD_LINES).then(|| THRESHOLD_GSI + u32::from(id)),
            xsave_size,
        );
        vcpus.push(Vcpu::new(kvm_vcpu, table, lwp, tsc_khz));
    }
    Ok(vcpus)
}

/// KVM's supported CPUID.
pub fn supported_cpuid(kvm: &Kvm) -> Result<Vec<CpuidEntry>, VmError> {
    let supported = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(setup("KVM_GET_SUPPORTED_CPUID"))?;
    Ok(supported.as_slice().iter().map(from_kvm).collect())
}

/// Gives KVM every region of `mem` as a memory slot, without a dirty log.
pub fn register_memory(vm: &VmFd, mem: &GuestMemory) -> Result<(), VmError> {
    set_memory_slots(vm, mem, 0)
}

/// Turns KVM's dirty log on for every memory slot (diff snapshots): each
/// KVM_GET_DIRTY_LOG then names the pages the guest wrote since the last.
pub fn log_dirty_pages(vm: &VmFd, mem: &GuestMemory) -> Result<(), VmError> {
    set_memory_slots(vm, mem, kvm_bindings::KVM_MEM_LOG_DIRTY_PAGES)
}

fn set_memory_slots(vm: &VmFd, mem: &GuestMemory, flags: u32) -> Result<(), VmError> {
    for (slot, region) in mem.iter().enumerate() {
        let host = mem
            .get_host_address(region.start_addr())
            .map_err(|_| VmError::MissingCap("a host mapping of guest memory"))?;
        let region = kvm_userspace_memory_region {
            slot: slot as u32,
            flags,
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

/// A CPUID entry as KVM gives it, in lwpvmm's form.
pub fn from_kvm(e: &kvm_cpuid_entry2) -> CpuidEntry {
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
    Ok(cpuid::build(&supported_cpuid(&kvm)?, profile, guest, 0, 1))
}
