//! The KVM shell around the pure core: VM setup and boot, the vCPU loop,
//! CPUID, the LWP MSRs, the paravirtual #UD path, devices and metrics.

pub mod boot;
pub mod cpuid;
pub mod devices;
pub mod guest_paging;
pub mod lwp_insn;
pub mod metrics;
pub mod output;
pub mod pause;
pub mod privilege;
pub mod ratelimit;
pub mod seccomp;
pub mod signals;
pub mod snapshot;
pub mod step;
pub mod vcpu;
pub mod vcpu_state;
pub mod vm;
