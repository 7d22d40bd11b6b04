//! What a VM is built from, the front ends' way in (as Firecracker's
//! `vmm_config`): [`VmConfig`] to boot a kernel, [`RestoreConfig`] to resume
//! a snapshot, the host-side settings both share ([`HostConfig`]), and every
//! type and limit a front end hands the VMM or checks a request against,
//! re-exported from the part that owns it (the devices' configurations, the
//! console, the seccomp and syscall-fixup modes, the default command lines,
//! the errors a front end turns into its own messages). `src/cli` and
//! `src/firecracker` import the VMM through here, the root's `Vmm`,
//! `VmmHandle` and run functions, and the API's entry only
//! (`tests/layers.rs` checks it). Every part has a default, so a caller
//! states only what it changes.

use std::path::PathBuf;
use std::time::Duration;

pub use crate::vmm::api::routes::MAX_SAMPLE_HZ;
pub use crate::vmm::base::control_error::Fault;
pub use crate::vmm::base::request::SnapshotKind;
pub use crate::vmm::base::seccomp::SeccompMode;
pub use crate::vmm::boot::{
    BootError, KERNEL_BUILTIN_CMDLINE, LINUX_CMDLINE, MAX_MEMORY_MIB, MIN_MEMORY_MIB,
    STOCK_CMDLINE, default_cmdline, disk_cmdline, read_image,
};
pub use crate::vmm::devices::port_bus::{GuestEnd, SerialOut};
pub use crate::vmm::devices::virtio::rate_limiter::{BucketConfig, RateLimit};
pub use crate::vmm::devices::virtio::rng::EntropyConfig;
pub use crate::vmm::devices::virtio::vsock::VsockConfig;
pub use crate::vmm::devices::virtio::{
    DeviceOverrides, DiskConfig, MAX_DEVICES, NetConfig, VirtioError,
};
pub use crate::vmm::snapshot::{
    FORMAT_VERSION, MEMORY_FILE, STATE_FILE, SnapshotError, read_state,
};

use crate::lwp::cpuid::{GuestLwpSupport, LwpProfile};

/// Guest RAM unless the caller sets it, in MiB.
pub const DEFAULT_MEMORY_MIB: u64 = 128;
/// The trace's size limit unless the caller sets one: 1 GiB.
pub const DEFAULT_TRACE_MAX: u64 = 1 << 30;

/// A kernel to boot.
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
    /// A user's program for the profile host guest (`lwpvmm profile`),
    /// loaded beside the kernel; its entry goes on the command line.
    pub program: Option<Vec<u8>>,
    /// virtio block devices, in order (/dev/vda, /dev/vdb, ...).
    pub disks: Vec<DiskConfig>,
    /// virtio network devices on host taps.
    pub nets: Vec<NetConfig>,
    /// A virtio vsock device, after the disks and network devices.
    pub vsock: Option<VsockConfig>,
    /// A virtio entropy device, last.
    pub entropy: Option<EntropyConfig>,
    /// Console, snapshots, seccomp, signals, sampler and trace.
    pub host: HostConfig,
}

impl Default for VmConfig {
    fn default() -> Self {
        VmConfig {
            kernel: Vec::new(),
            initramfs: None,
            cmdline: String::new(),
            memory_mib: DEFAULT_MEMORY_MIB,
            vcpus: 1,
            profile: LwpProfile::Emulated,
            guest: GuestLwpSupport::Shim,
            program: None,
            disks: Vec::new(),
            nets: Vec::new(),
            vsock: None,
            entropy: None,
            host: HostConfig::default(),
        }
    }
}

/// A snapshot to resume.
#[derive(Debug, Clone, Default)]
pub struct RestoreConfig {
    /// The snapshot directory.
    pub dir: PathBuf,
    /// The profile the caller expects, if any: a snapshot taken with
    /// another is refused.
    pub profile: Option<LwpProfile>,
    /// Read the whole memory file and check its CRC-64 before the VM runs
    /// (`restore --verify`); without it pages are read as the guest
    /// touches them.
    pub verify: bool,
    /// The taps and vsock socket the restored VM uses instead of the
    /// snapshot's (a clone of a golden snapshot).
    pub overrides: DeviceOverrides,
    /// Console, snapshots of the restored VM, seccomp, signals, sampler and
    /// trace.
    pub host: HostConfig,
}

/// What a running VM does on the host side, for both ways in.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// Where serial output goes.
    pub serial: SerialOut,
    /// When and where to take snapshots.
    pub snapshots: SnapshotPlan,
    /// The seccomp filters of the vCPU and control threads.
    pub seccomp: SeccompMode,
    /// Stop the VM cleanly on SIGINT, SIGTERM and SIGHUP (a second one ends the
    /// process at once). For programs that own their signals, as the CLI.
    pub stop_on_signals: bool,
    /// The sampler, the trace and the metrics file.
    pub profiling: Profiling,
    /// A control API serves this VM (the front end starts it, with
    /// `ApiListeners::start`): the recorder keeps each address space's
    /// executable mappings and takes captures.
    pub api_served: bool,
    /// Whether lwpvmm completes the SYSCALLs kvm_pvm leaves at CPL3.
    pub syscall_fixup: SyscallFixupMode,
    /// Whether the guest kernel runs in the host's native supervisor mode.
    pub supervisor: SupervisorMode,
}

/// Where the guest's supervisor code runs on a kvm_pvm host: in KVM's
/// instruction emulator, or on the CPU in its native supervisor mode
/// (docs/pv-abi.md, "Native supervisor mode"), which only a kernel written
/// for it survives (every page it touches user-accessible, interrupts
/// masked through its page, user mode entered through SYSRETQ).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SupervisorMode {
    /// Native where the host offers the mode and the kernel declares
    /// itself able; emulated otherwise.
    #[default]
    Auto,
    /// Native, or an error that says why not.
    Native,
    /// Always emulated, as on a host without the mode.
    Emulated,
}

/// Why the guest kernel cannot run in native supervisor mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NativeRefusal {
    /// The host's KVM has no native supervisor mode.
    #[error(
        "this host's KVM offers no native supervisor mode (MSR 0x4b564d11 does not read \"PVM\"): run with --supervisor auto or emulated"
    )]
    HostLacks,
    /// The kernel does not declare that it was written for the mode.
    #[error(
        "the kernel does not declare native supervisor mode (no lwpvmm native note, docs/pv-abi.md): a kernel not written for the mode hangs in it; run with --supervisor auto or emulated"
    )]
    KernelLacks,
    /// More vCPUs than the mode's reserved pages.
    #[error("native supervisor mode takes at most {max} vCPUs (asked for {asked})")]
    TooManyVcpus {
        /// vCPUs asked for.
        asked: u8,
        /// The most it takes.
        max: u8,
    },
}

impl SupervisorMode {
    /// Whether the guest runs native, given what the host offers, what the
    /// kernel declares and how many vCPUs it has (at most `max_vcpus` in
    /// native mode).
    pub fn resolve(
        self,
        host_offers: bool,
        kernel_declares: bool,
        vcpus: u8,
        max_vcpus: u8,
    ) -> Result<bool, NativeRefusal> {
        let refusal = if !host_offers {
            Some(NativeRefusal::HostLacks)
        } else if !kernel_declares {
            Some(NativeRefusal::KernelLacks)
        } else if vcpus > max_vcpus {
            Some(NativeRefusal::TooManyVcpus {
                asked: vcpus,
                max: max_vcpus,
            })
        } else {
            None
        };
        match (self, refusal) {
            (SupervisorMode::Emulated, _) => Ok(false),
            (SupervisorMode::Auto, Some(_)) => Ok(false),
            (SupervisorMode::Native, Some(why)) => Err(why),
            (_, None) => Ok(true),
        }
    }
}

/// Whether lwpvmm completes the SYSCALLs kvm_pvm leaves at CPL3
/// (vcpu/syscall_quirk.rs): an unmodified Linux needs it there to run a
/// single process; our own kernel carries the same rule as patch 0001.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SyscallFixupMode {
    /// On where the host's KVM is kvm_pvm, the one host known to have
    /// the quirk; off elsewhere, where it would cost an exit per guest
    /// page fault for nothing.
    #[default]
    Auto,
    /// Always.
    On,
    /// Never.
    Off,
}

/// Where the kvm_pvm module shows itself when it is loaded.
const KVM_PVM_MODULE: &str = "/sys/module/kvm_pvm";

/// Whether the host's KVM is kvm_pvm, which runs guest CPL0 in its
/// instruction emulator (unless the kernel runs in its native mode).
pub fn host_is_kvm_pvm() -> bool {
    std::path::Path::new(KVM_PVM_MODULE).exists()
}

impl SyscallFixupMode {
    /// Whether the fixup runs for a guest whose kernel runs in native
    /// supervisor mode (`native`) or emulated: `auto` leaves it off in
    /// native mode, where SYSCALL enters the kernel as it should.
    pub fn enabled_for(self, native: bool) -> bool {
        match self {
            SyscallFixupMode::Auto if native => false,
            mode => mode.enabled(),
        }
    }

    /// Whether the fixup runs on this host.
    pub fn enabled(self) -> bool {
        match self {
            SyscallFixupMode::Auto => host_is_kvm_pvm(),
            SyscallFixupMode::On => true,
            SyscallFixupMode::Off => false,
        }
    }
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            serial: SerialOut::Stdout,
            snapshots: SnapshotPlan::default(),
            seccomp: SeccompMode::On,
            stop_on_signals: false,
            profiling: Profiling::default(),
            api_served: false,
            syscall_fixup: SyscallFixupMode::default(),
            supervisor: SupervisorMode::default(),
        }
    }
}

/// Sampled events, the host-side trace and the metrics file.
#[derive(Debug, Clone)]
pub struct Profiling {
    /// Sampling kicks per second and vCPU (0: no sampler). The sampler runs
    /// only when the profile has CNH or RNH, or with `kernel`.
    pub sample_hz: u32,
    /// Kick every vCPU at `sample_hz` and store a host-side sample of what
    /// each kick found, kernel or process (`--profile-kernel`): a profile of
    /// the whole guest, with or without LWP.
    pub kernel: bool,
    /// Write every stored LWP record to this trace file.
    pub trace: Option<PathBuf>,
    /// The trace's size limit in bytes: records past it are counted in the
    /// metrics (`trace_dropped`), not written, and the trace says so.
    pub trace_max: u64,
    /// The trace gets each sampled, LWPINS and LWPVAL record's call stack,
    /// unwound by the guest's frame pointers.
    pub stacks: bool,
    /// Where the counters go as JSON at the end, and on SIGUSR1 while the
    /// VM runs.
    pub metrics: Option<PathBuf>,
}

impl Default for Profiling {
    fn default() -> Self {
        Profiling {
            sample_hz: 0,
            kernel: false,
            trace: None,
            trace_max: DEFAULT_TRACE_MAX,
            stacks: true,
            metrics: None,
        }
    }
}

/// When and where a running VM writes snapshots.
#[derive(Debug, Clone, Default)]
pub struct SnapshotPlan {
    /// The snapshot directory; without it no snapshot is taken (SIGUSR2
    /// and the options below need it).
    pub dir: Option<PathBuf>,
    /// Take one this long after the start.
    pub after: Option<Duration>,
    /// Take one whenever the guest writes to the snapshot debug port
    /// (docs/pv-abi.md): at an exact point of the guest's, for tests.
    pub on_port: bool,
    /// Track the pages written (KVM's dirty log and lwpvmm's own writes) so
    /// that snapshots after the first are diffs: planned ones go to `dir`'s
    /// numbered subdirectories (0 full, then diffs), the API's when asked.
    pub diff: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_supervisor_mode_follows_the_host_the_kernel_and_the_choice() {
        use NativeRefusal::*;
        use SupervisorMode::*;
        let many = TooManyVcpus { asked: 65, max: 64 };
        // (choice, host offers, kernel declares, vCPUs, native or why not)
        let table = [
            (Auto, true, true, 1, Ok(true)),
            (Auto, false, true, 1, Ok(false)),
            (Auto, true, false, 1, Ok(false)),
            (Auto, true, true, 65, Ok(false)),
            (Native, true, true, 64, Ok(true)),
            (Native, false, true, 1, Err(HostLacks)),
            (Native, true, false, 1, Err(KernelLacks)),
            (Native, false, false, 1, Err(HostLacks)),
            (Native, true, true, 65, Err(many)),
            (Emulated, true, true, 1, Ok(false)),
        ];
        for (choice, host, kernel, vcpus, want) in table {
            assert_eq!(
                choice.resolve(host, kernel, vcpus, 64),
                want,
                "{choice:?} host {host} kernel {kernel} vCPUs {vcpus}"
            );
        }
    }

    #[test]
    fn the_syscall_fixup_is_off_for_a_native_kernel_unless_asked() {
        // (mode, native, on): `auto` elsewhere depends on the host.
        let table = [
            (SyscallFixupMode::Auto, true, false),
            (SyscallFixupMode::On, true, true),
            (SyscallFixupMode::Off, false, false),
            (SyscallFixupMode::On, false, true),
        ];
        for (mode, native, on) in table {
            assert_eq!(mode.enabled_for(native), on, "{mode:?} native {native}");
        }
    }
}
