//! What a vCPU thread and the VMM say to each other, and how handling an
//! exit ends: the events the VMM sends (pause, resume, save your state,
//! finish), the thread's answers, how it leaves its loop, and why it failed.

use thiserror::Error;

use crate::lwp::unit::UnitStats;
use crate::vmm::base::seccomp::SeccompError;
use crate::vmm::devices::port_bus::GuestEnd;
use crate::vmm::vcpu::vcpu_state::VcpuSnapshot;

/// Why a vCPU stopped the VM with an error.
#[derive(Debug, Error)]
pub enum VcpuError {
    /// A native guest's vCPU spins inside KVM_RUN on a supervisor-only page.
    #[error(
        "vCPU {vcpu} stopped making progress at RIP {rip:#x} in the host's native supervisor mode: the kernel maps that page without U=1 (its {level:?} entry), which the mode cannot run (KVM_RUN spins there with no exit); a kernel for the mode maps every page it touches user-accessible (docs/pv-abi.md, \"Native supervisor mode\")"
    )]
    NativeStuck {
        /// The vCPU.
        vcpu: u8,
        /// Where it spins.
        rip: u64,
        /// The level of the entry without U.
        level: crate::guard::Level,
    },
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
    /// A KVM buffer could not be built.
    #[error("vCPU {vcpu}: cannot build the {what} buffer")]
    Buffer {
        /// The vCPU.
        vcpu: u8,
        /// The buffer.
        what: &'static str,
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
    Seccomp(#[from] SeccompError),
    /// The guest triple-faulted or KVM shut it down.
    #[error("vCPU {vcpu}: the guest shut down (triple fault or KVM shutdown) at RIP {rip:#x}")]
    Shutdown {
        /// The vCPU.
        vcpu: u8,
        /// RIP at the exit.
        rip: u64,
    },
}

/// What handling one exit leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VcpuStep {
    /// Run on.
    Continue,
    /// KVM_RUN returned early: a kick (sampling, events, stop).
    Interrupted,
    /// The guest ended the VM.
    End(GuestEnd),
    /// The guest asked for a snapshot here (`--snapshot-on-port`).
    SnapshotPoint,
}

/// How a vCPU left its loop without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VcpuStop {
    /// The guest ended the VM.
    Ended(GuestEnd),
    /// The VMM stopped it.
    Stopped,
}

/// What the VMM asks of a vCPU thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VcpuEvent {
    /// Stop at a consistent point (pending I/O completed) and wait.
    Pause,
    /// Run again (while paused).
    Resume,
    /// Capture the vCPU's state (while paused).
    SaveState,
    /// Leave the loop.
    Finish,
}

/// What a vCPU thread answers.
#[derive(Debug)]
pub enum VcpuResponse {
    /// It is paused.
    Paused,
    /// It runs again.
    Resumed,
    /// Its state, or why it could not be captured.
    State(Box<Result<VcpuSnapshot, crate::vmm::base::control_error::ControlError>>),
}

/// What a vCPU thread hands back when it ends.
pub type VcpuThreadResult = (Result<VcpuStop, VcpuError>, UnitStats);
