//! What an exit handler works with: the vCPU (real or fake, through
//! [`VcpuOps`]), its LWP state, guest memory, its counters and the
//! recorder. Below every handler, so that handlers import it and not each
//! other.

use super::lwp_state::VcpuLwp;
use super::ops::VcpuOps;
use super::syscall_quirk::SyscallFixup;

use crate::guard::GuestMemory;
use crate::vmm::base::metrics::VcpuMetrics;
use crate::vmm::base::recorder::Recorder;

/// What exit handlers work with.
pub struct ExitCx<'a> {
    /// The vCPU.
    pub vcpu: &'a mut dyn VcpuOps,
    /// Its LWP state.
    pub lwp: &'a mut VcpuLwp,
    /// Guest memory.
    pub mem: &'a GuestMemory,
    /// Its counters.
    pub metrics: &'a VcpuMetrics,
    /// Where the host side keeps stored records (trace, captures).
    pub recorder: &'a Recorder,
    /// The SYSCALL quirk's fixup, when it is on.
    pub syscall_fixup: Option<&'a SyscallFixup>,
}
