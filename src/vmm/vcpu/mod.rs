//! The vCPU part: one vCPU's KVM vCPU, its LWP state, the thread that runs
//! it and everything its exits need. Inside, files import one way, from
//! the definitions up to the thread:
//!
//! - definitions: `segment`, `topology`, `step` (what one step retires),
//!   `lwp_insn` (emulating one LWP instruction), `guest_paging`, `cpuid`,
//!   `native` (the host's native supervisor mode);
//! - state: `step_state`, `lwp_state`, `vcpu_state` (a vCPU's saved KVM
//!   state), `protocol` (what the thread and the VMM say), `ops` (the vCPU
//!   behind a trait, real or fake), `privilege`, `syscall_quirk` (kvm_pvm's
//!   SYSCALL quirk: the rule and what the vCPUs share), `context` (what a
//!   handler works with);
//! - handlers: `kernel_insn` (CPL0 instructions the host's emulator
//!   cannot run), `inject`, `stepper`, `doorbell`, `lwp`, `state_call`,
//!   `pf_entry` (the SYSCALL quirk's breakpoint),
//!   `host_sample` (whole-guest samples at a kick), then
//!   `exit`, which dispatches to them;
//! - the thread: `run_state` (its table of states), `thread`; in tests,
//!   `cued` (a vCPU that exits on cue) and `thread_tests` above them.
//!
//! Below this part: `base` and `devices` (the exits route port and MMIO
//! accesses to the devices).

mod context;
pub mod cpuid;
#[cfg(test)]
pub(crate) mod cued;
mod doorbell;
mod emulator_gap;
mod exit;
pub mod guest_paging;
mod host_sample;
mod inject;
mod kernel_insn;
mod lwp;
pub mod lwp_insn;
mod lwp_state;
pub mod native;
mod ops;
mod pf_entry;
pub mod privilege;
mod protocol;
mod run_state;
pub mod segment;
mod state_call;
pub mod step;
pub mod step_probe;
mod step_state;
mod stepper;
#[cfg(test)]
mod stepper_tests;
pub mod syscall_quirk;
#[cfg(test)]
pub(crate) mod testing;
mod thread;
#[cfg(test)]
mod thread_tests;
pub mod topology;
pub mod vcpu_state;

pub use context::ExitCx;
pub use exit::{Devices, ExitAction, act, handle_exit};
pub use lwp_state::{LwpState, VcpuLwp};
pub use ops::{EmulationFailure, KvmVcpu, VcpuOps, VcpuRun};
pub use protocol::{VcpuError, VcpuEvent, VcpuResponse, VcpuStep, VcpuStop, VcpuThreadResult};
pub use step_state::StepState;
pub use thread::{Vcpu, VcpuHandle, VcpuShared, VmDevices, kick_handler};
