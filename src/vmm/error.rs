//! Why a VM could not be built or run. Each variant carries the values and
//! the source it needs; none names a command-line option (the CLI adds
//! those where a user set the value).

use thiserror::Error;

use crate::vmm::base::control_error::Fault;
use crate::vmm::base::seccomp::SeccompError;
use crate::vmm::boot::BootError;
use crate::vmm::output::OutputError;
use crate::vmm::snapshot::SnapshotError;
use crate::vmm::vcpu::VcpuError;
use crate::vmm::vcpu::vcpu_state::VcpuStateError;

/// Why a VM could not be built or run.
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
    #[error("{requested} vCPUs is out of range: this KVM takes 1 to {max}")]
    VcpuCount {
        /// What was asked for.
        requested: u8,
        /// The most this host (and xAPIC) allows.
        max: usize,
    },
    /// A setting that needs another one.
    #[error("{0}")]
    Config(&'static str),
    /// `--supervisor native` where the VM cannot run native.
    #[error("--supervisor native: {0}")]
    NativeRefused(#[from] crate::vmm::config::NativeRefusal),
    /// Native supervisor mode could not be set up.
    #[error(transparent)]
    Native(#[from] crate::vmm::vcpu::native::NativeError),
    /// A virtio device could not be set up.
    #[error(transparent)]
    Virtio(#[from] crate::vmm::devices::virtio::VirtioError),
    /// A vCPU ended the VM with an error.
    #[error(transparent)]
    Vcpu(#[from] VcpuError),
    /// An output file or directory cannot be created or written.
    #[error(transparent)]
    Output(#[from] OutputError),
    /// The control thread's seccomp filter could not be installed.
    #[error("control thread: {0}")]
    Seccomp(#[from] SeccompError),
    /// A signal handler could not be installed.
    #[error("cannot handle {what}: {source}")]
    Signal {
        /// Which signal.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// The control thread's event loop failed.
    #[error("the event loop failed: {0}")]
    EventLoop(String),
    /// The guest's console could not be written: the VM was stopped at
    /// the first byte lost (`GuestEnd::ConsoleFailed`).
    #[error(
        "writing the guest's console failed: {0}; the VM was stopped at the first write it lost (make room where --serial writes, or give another --serial)"
    )]
    Console(std::io::Error),
    /// A request to the running VM failed.
    #[error("{0}")]
    Control(#[from] crate::vmm::base::control_error::ControlError),
    /// A thread could not be started.
    #[error("cannot start the {what} thread: {source}")]
    Thread {
        /// Which thread.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// The control API could not start.
    #[error(transparent)]
    Api(#[from] crate::vmm::api::ApiError),
    /// A thread panicked.
    #[error("the {0} thread panicked")]
    Panicked(String),
    /// A snapshot could not be read, written, or was refused.
    #[error("snapshot: {0}")]
    Snapshot(#[from] SnapshotError),
    /// A vCPU's saved state could not be restored.
    #[error("vCPU {0}: {1}")]
    VcpuState(u8, VcpuStateError),
}

impl VmError {
    /// Whose fault it was: what the caller asked for (a kernel that is not
    /// one, a size out of range, a disk or snapshot that does not fit), or
    /// the host (KVM, a thread, a tap that would not open).
    pub fn fault(&self) -> Fault {
        match self {
            VmError::Boot(e) => e.fault(),
            VmError::Virtio(e) => e.fault(),
            VmError::Control(e) => e.fault(),
            VmError::VcpuCount { .. }
            | VmError::Config(_)
            | VmError::NativeRefused(_)
            | VmError::Snapshot(_) => Fault::Request,
            VmError::NoKvm(_)
            | VmError::MissingCap(_)
            | VmError::Setup { .. }
            | VmError::Native(_)
            | VmError::Vcpu(_)
            | VmError::Output(_)
            | VmError::Seccomp(_)
            | VmError::Signal { .. }
            | VmError::EventLoop(_)
            | VmError::Console(_)
            | VmError::Thread { .. }
            | VmError::Api(_)
            | VmError::Panicked(_)
            | VmError::VcpuState(..) => Fault::Host,
        }
    }
}

/// A KVM setup ioctl's error, named.
pub fn setup(what: &'static str) -> impl Fn(kvm_ioctls::Error) -> VmError {
    move |source| VmError::Setup { what, source }
}
