//! The shell's lowest part: the services and definitions every other part
//! uses and none of which imports a part above it. The paravirtual ABI
//! (ports, leaves, frames) that both the vCPUs and the devices speak; the
//! counters; the recorder of LWP records; the seccomp filters; the rate
//! limit on guest-triggered log lines; the stop signals; and the control
//! plane's vocabulary (what may be asked of a running VM, and why a request
//! failed), spoken by the API above and answered by the `Vmm` on top.

pub mod control_error;
pub mod metrics;
pub mod pv;
pub mod ratelimit;
pub mod recorder;
pub mod request;
pub mod seccomp;
pub mod signals;
