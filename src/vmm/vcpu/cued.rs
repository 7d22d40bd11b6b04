//! A vCPU that exits on cue, for the tests of the vCPU thread and of the
//! control thread: it runs no guest. Each KVM_RUN takes the next cue the
//! test queued (a port write, KVM_RUN failing); with none queued it
//! returns EINTR after a millisecond, as a guest the host interrupts does,
//! so the thread goes round its loop and sees its events. A run with
//! immediate_exit set (the pause's settling run) returns EINTR at once and
//! is counted. Beside it, what every vCPU of a VM shares, built without
//! /dev/kvm: guest RAM, the port bus, an IOAPIC whose routes go nowhere.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvm_bindings::{kvm_msi, kvm_regs, kvm_run, kvm_sregs};
use kvm_ioctls::VcpuExit;
use vm_memory::GuestAddress;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};
use vmm_sys_util::signal::{SIGRTMIN, register_signal_handler};

use super::lwp_state::VcpuLwp;
use super::ops::{Delivery, EmulationFailure, VcpuOps, VcpuRun};
use super::protocol::VcpuError;
use super::thread::{Vcpu, VcpuShared, VmDevices, kick_handler};
use super::vcpu_state::{VcpuSnapshot, VcpuStateError};
use crate::guard::GuestMemory;
use crate::lwp::cpuid::CpuidEntry;
use crate::lwp::fault::GuestFault;
use crate::vmm::base::recorder::Recorder;
use crate::vmm::devices::ioapic::{IoapicDevice, IoapicState};
use crate::vmm::devices::port_bus::PortBus;
use crate::vmm::devices::virtio::VirtioBus;
use crate::vmm::vcpu::guest_paging::PagingSource;

/// What the next KVM_RUN does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cue {
    /// The guest writes `data` to a port.
    Out(u16, Vec<u8>),
    /// KVM_RUN fails with this errno.
    Fail(i32),
}

/// The cues a test queues for one vCPU, while its thread runs.
#[derive(Debug, Clone, Default)]
pub struct Cues(Arc<Mutex<VecDeque<Cue>>>);

impl Cues {
    /// Queues `cue`.
    pub fn push(&self, cue: Cue) {
        self.0.lock().expect("the cue queue").push_back(cue);
    }

    /// Whether every cue was taken.
    pub fn is_empty(&self) -> bool {
        self.0.lock().map(|q| q.is_empty()).unwrap_or(true)
    }

    fn next(&self) -> Option<Cue> {
        self.0.lock().ok().and_then(|mut q| q.pop_front())
    }
}

/// A vCPU that exits on cue.
pub struct CuedVcpu {
    id: u8,
    cues: Cues,
    /// The data of the port write being answered.
    out: Vec<u8>,
    immediate_exit: bool,
    /// Runs made with immediate_exit set: a pause's settling.
    pub settled: Arc<AtomicU32>,
    paging: PagingSource,
}

impl CuedVcpu {
    /// vCPU `id`, taking its exits from `cues`.
    pub fn new(id: u8, cues: Cues) -> Self {
        CuedVcpu {
            id,
            cues,
            out: Vec::new(),
            immediate_exit: false,
            settled: Arc::default(),
            paging: PagingSource::new(&[]),
        }
    }

    /// The vCPU, ready to start, of a VM without LWP.
    pub fn vcpu(id: u8, cues: Cues) -> (Vcpu<CuedVcpu>, Arc<AtomicU32>) {
        let cued = CuedVcpu::new(id, cues);
        let settled = Arc::clone(&cued.settled);
        let lwp = VcpuLwp::new(None, false, None, None).expect("a VM without LWP");
        (Vcpu::new(cued, Vec::new(), lwp, 0), settled)
    }
}

impl VcpuRun for CuedVcpu {
    fn prepare_thread(&mut self) -> *mut kvm_run {
        std::ptr::null_mut()
    }

    fn run(&mut self) -> Result<VcpuExit<'_>, kvm_ioctls::Error> {
        if self.immediate_exit {
            self.settled.fetch_add(1, Ordering::Relaxed);
            return Err(kvm_ioctls::Error::new(libc::EINTR));
        }
        match self.cues.next() {
            Some(Cue::Out(port, data)) => {
                self.out = data;
                Ok(VcpuExit::IoOut(port, &self.out))
            }
            Some(Cue::Fail(errno)) => Err(kvm_ioctls::Error::new(errno)),
            None => {
                std::thread::sleep(Duration::from_millis(1));
                Err(kvm_ioctls::Error::new(libc::EINTR))
            }
        }
    }

    fn set_immediate_exit(&mut self, on: bool) {
        self.immediate_exit = on;
    }

    fn save_state(
        &self,
        cpuid: &[CpuidEntry],
        xsave_size: usize,
        _msr_indices: &[u32],
    ) -> Result<(VcpuSnapshot, Vec<u32>), VcpuStateError> {
        let snapshot = VcpuSnapshot {
            xsave_size: u32::try_from(xsave_size).unwrap_or(u32::MAX),
            ..VcpuSnapshot::blank(self.id, cpuid.to_vec())
        };
        Ok((snapshot, Vec::new()))
    }
}

impl VcpuOps for CuedVcpu {
    fn id(&self) -> u8 {
        self.id
    }

    fn regs(&self) -> kvm_regs {
        kvm_regs::default()
    }

    fn sregs(&self) -> kvm_sregs {
        kvm_sregs::default()
    }

    fn set_regs(&mut self, _: &kvm_regs) {}

    fn inject(
        &mut self,
        _: &kvm_regs,
        _: &kvm_sregs,
        _: GuestFault,
    ) -> Result<Delivery, VcpuError> {
        Ok(Delivery::Injected)
    }

    fn single_step(&mut self, _: bool) -> Result<(), VcpuError> {
        Ok(())
    }

    fn set_breakpoint(&mut self, _: Option<u64>) -> Result<(), VcpuError> {
        Ok(())
    }

    fn breakpoint(&self) -> Option<u64> {
        None
    }

    fn guest_tsc(&self) -> u64 {
        0
    }

    fn signal_msi(&self, _: &kvm_msi) -> Result<(), String> {
        Ok(())
    }

    fn raise_threshold_line(&self) -> Result<(), String> {
        Ok(())
    }

    fn halt(&mut self) -> Result<(), VcpuError> {
        Ok(())
    }

    fn mxcsr(&self) -> Result<(u32, u32), VcpuError> {
        Ok((0x1f80, 0xffff))
    }

    fn set_mxcsr(&mut self, _value: u32) -> Result<(), VcpuError> {
        Ok(())
    }

    fn msr(&self, _index: u32) -> Result<u64, String> {
        Ok(0)
    }

    fn emulation_failure(&mut self) -> EmulationFailure {
        EmulationFailure {
            suberror: 0,
            bytes: None,
        }
    }

    fn paging_source(&self) -> &PagingSource {
        &self.paging
    }

    fn xsave(&self) -> Option<Vec<u8>> {
        None
    }
}

/// Installs the kick's handler, as `Vmm::run` does: a kick is SIGRTMIN,
/// which would otherwise end the test process.
pub fn kicks_handled() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| register_signal_handler(SIGRTMIN(), kick_handler).expect("the kick handler"));
}

/// What the vCPUs of a VM share, without KVM: 2 MiB of RAM, a port bus
/// whose console goes nowhere, no virtio devices, an IOAPIC whose routes
/// are dropped; the snapshot port claimed when `snapshot_port`.
pub fn shared(snapshot_port: bool) -> Arc<VcpuShared> {
    let eventfd = || EventFd::new(EFD_NONBLOCK).expect("an eventfd");
    let mut bus = PortBus::new(Box::new(std::io::sink()), eventfd());
    if snapshot_port {
        bus.claim_snapshot_port();
    }
    let ioapic = IoapicDevice::new(IoapicState::default(), Box::new(|_| Ok(())))
        .expect("an IOAPIC whose routes go nowhere");
    let devices = VmDevices {
        mem: Arc::new(GuestMemory::from_ranges(&[(GuestAddress(0), 2 << 20)]).expect("guest RAM")),
        bus,
        virtio: VirtioBus::default(),
        ioapic: Arc::new(ioapic),
    };
    let recorder = Arc::new(Recorder::new(None, false, 1000));
    Arc::new(VcpuShared::new(devices, 4096, Vec::new(), recorder, None, false).expect("eventfds"))
}
