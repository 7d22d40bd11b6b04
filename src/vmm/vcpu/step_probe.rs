//! Which stepping backend this host supports, read from a vCPU running the
//! `stepprobe` guest (the builder boots it on a throwaway VM): KVM's
//! single-step is turned on at its CPL3 port write; a Debug exit at CPL3
//! means the guest-debug backend works, the guest's #DB doorbell (or the
//! exit port) means the trap flag went to the guest instead. Capabilities
//! cannot tell: kvm_pvm reports SET_GUEST_DEBUG and ROBUST_SINGLESTEP yet
//! never exits for CPL3 steps.

use kvm_ioctls::{SyncReg, VcpuExit};

use crate::vmm::base::pv::{DB_PORT, EXIT_PORT};
use crate::vmm::devices::port_bus::POST_PORT;
use crate::vmm::vcpu::privilege;
use crate::vmm::vcpu::step::StepBackend;
use crate::vmm::vcpu::{KvmVcpu, VcpuError, VcpuOps};

/// How many exits the probe waits through before it settles on the trap
/// flag (the guest makes a handful).
const MAX_EXITS: usize = 10_000;

/// Runs the booted `stepprobe` guest on `vcpu` until it shows which backend
/// works.
pub fn watch(vcpu: &mut KvmVcpu) -> Result<StepBackend, VcpuError> {
    vcpu.fd_mut().set_sync_valid_reg(SyncReg::SystemRegister);
    let mut enabled = false;
    for _ in 0..MAX_EXITS {
        // None: a Debug exit; Some(port): a port write; other exits end
        // the probe.
        let seen = match vcpu.fd_mut().run() {
            Ok(VcpuExit::IoOut(port, _)) => Some(Some(port)),
            Ok(VcpuExit::IoIn(_, data)) => {
                data.fill(0xff);
                Some(Some(0))
            }
            Ok(VcpuExit::Debug(_)) => Some(None),
            Err(e) if e.errno() == libc::EINTR => Some(Some(0)),
            _ => None,
        };
        match seen {
            None => return Ok(StepBackend::TrapFlag),
            Some(None) if privilege::is_user(&vcpu.sregs()) => {
                return Ok(StepBackend::GuestDebug);
            }
            Some(Some(POST_PORT)) if !enabled => {
                enabled = true;
                vcpu.single_step(true)?;
            }
            Some(Some(DB_PORT | EXIT_PORT)) => return Ok(StepBackend::TrapFlag),
            Some(_) => {}
        }
    }
    Ok(StepBackend::TrapFlag)
}
