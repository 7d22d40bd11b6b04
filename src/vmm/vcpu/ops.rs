//! The seam between exit handling and KVM: what a handler needs of a vCPU
//! (its registers through KVM's sync-regs area, fault injection, single
//! step, the guest TSC, MSIs, the paging the guard walks), as a trait. The
//! run loop passes the KVM vCPU; unit tests pass a fake over real guest
//! memory, so the same handler functions run without /dev/kvm.

use std::sync::Arc;

use kvm_bindings::kvm_run;
use kvm_bindings::{
    KVM_GUESTDBG_ENABLE, KVM_GUESTDBG_SINGLESTEP, KVM_GUESTDBG_USE_HW_BP, Msrs, kvm_guest_debug,
    kvm_msi, kvm_msr_entry, kvm_regs, kvm_sregs,
};
use kvm_ioctls::{SyncReg, VcpuExit, VcpuFd, VmFd};

use super::protocol::VcpuError;
use crate::guard::{GuardError, Paging};
use crate::lwp::cpuid::CpuidEntry;
use crate::lwp::fault::GuestFault;
use crate::vmm::vcpu::guest_paging::PagingSource;
use crate::vmm::vcpu::lwp_insn::MAX_INSN_LEN;
use crate::vmm::vcpu::vcpu_state::{self, VcpuSnapshot, VcpuStateError};

const KVM_INTERNAL_ERROR_EMULATION: u32 = 1;
/// The MSR holding a 64-bit context's GS base after the kernel's SWAPGS.
pub const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;
/// The MSR holding the 64-bit SYSCALL entry point.
pub const MSR_LSTAR: u32 = 0xc000_0082;
/// The MSR holding SYSCALL's code selector (bits 47:32).
pub const MSR_STAR: u32 = 0xc000_0081;
/// The MSR holding the RFLAGS bits SYSCALL clears.
pub const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
/// DR7 for one execute breakpoint of one byte in DR0 (L0).
const DR7_EXECUTE_DR0: u64 = 0x401;
const KVM_INTERNAL_ERROR_EMULATION_FLAG_INSTRUCTION_BYTES: u64 = 1;

/// What KVM says about an instruction its emulator could not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmulationFailure {
    /// The internal-error suberror.
    pub suberror: u32,
    /// The instruction bytes, when KVM gave them (the first `len`).
    pub bytes: Option<([u8; MAX_INSN_LEN], usize)>,
}

/// What became of a fault handed to [`VcpuOps::inject`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// The guest takes it at the next entry.
    Injected,
    /// KVM already had an event in flight (an interrupt being delivered):
    /// the registers are set but the fault is not, so that event is
    /// delivered first and the faulting instruction runs, and faults,
    /// again.
    Restarted,
}

/// What exit handling needs of a vCPU.
pub trait VcpuOps {
    /// The vCPU's index (its APIC ID).
    fn id(&self) -> u8;
    /// Its general registers at the exit.
    fn regs(&self) -> kvm_regs;
    /// Its special registers at the exit.
    fn sregs(&self) -> kvm_sregs;
    /// Sets the general registers for the next KVM_RUN.
    fn set_regs(&mut self, regs: &kvm_regs);
    /// Sets every register and injects `fault` (with CR2 for a #PF), unless
    /// an event is already in flight: then only the registers are set.
    fn inject(
        &mut self,
        regs: &kvm_regs,
        sregs: &kvm_sregs,
        fault: GuestFault,
    ) -> Result<Delivery, VcpuError>;
    /// Turns KVM's single-step (the guest-debug backend) on or off.
    fn single_step(&mut self, on: bool) -> Result<(), VcpuError>;
    /// Sets or clears a guest-debug execute breakpoint (DR0), kept across
    /// single-step switches; a Debug exit then stops the vCPU before the
    /// instruction at that address.
    fn set_breakpoint(&mut self, at: Option<u64>) -> Result<(), VcpuError>;
    /// The breakpoint set, if any.
    fn breakpoint(&self) -> Option<u64>;
    /// The guest's TSC now.
    fn guest_tsc(&self) -> u64;
    /// Sends an MSI (the threshold interrupt).
    fn signal_msi(&self, msi: &kvm_msi) -> Result<(), String>;
    /// Raises this vCPU's threshold line (an edge on its IOAPIC pin); an
    /// error when it has none.
    fn raise_threshold_line(&self) -> Result<(), String>;
    /// Halts the vCPU until an interrupt: the next KVM_RUN sleeps in KVM
    /// until one is pending.
    fn halt(&mut self) -> Result<(), VcpuError>;
    /// The guest's MSR `index` (KERNEL_GS_BASE, LSTAR), as KVM keeps it.
    fn msr(&self, index: u32) -> Result<u64, String>;
    /// The guest's MXCSR and MXCSR_MASK (the bits a load may set), from its
    /// XSAVE image.
    fn mxcsr(&self) -> Result<(u32, u32), VcpuError>;
    /// Sets the guest's MXCSR, keeping the rest of its FPU state.
    fn set_mxcsr(&mut self, value: u32) -> Result<(), VcpuError>;
    /// The emulation failure of an internal-error exit.
    fn emulation_failure(&mut self) -> EmulationFailure;
    /// Where the guard's paging comes from (CPUID, PKRU).
    fn paging_source(&self) -> &PagingSource;
    /// The vCPU's XSAVE image (for PKRU).
    fn xsave(&self) -> Option<Vec<u8>>;

    /// The paging the guard walks for `sregs`; PKRU is read only when
    /// protection keys apply.
    fn paging(&self, sregs: &kvm_sregs) -> Result<Paging, GuardError> {
        let source = self.paging_source();
        let xsave = source.needs_pkru(sregs).then(|| self.xsave()).flatten();
        source.paging(sregs, xsave.as_deref())
    }
}

/// What the vCPU thread needs of a vCPU beyond exit handling: entering
/// the guest, and the vCPU's whole KVM state. [`KvmVcpu`] runs KVM_RUN;
/// the thread's tests pass a vCPU that exits on cue, so the thread's
/// protocol (pause, resume, save, finish, a kick) runs without /dev/kvm.
pub trait VcpuRun: VcpuOps + Send {
    /// Readies the vCPU for its thread; returns the kvm_run area a kick's
    /// signal handler sets immediate_exit in (null when there is none).
    fn prepare_thread(&mut self) -> *mut kvm_run;
    /// Runs the guest to its next exit (KVM_RUN).
    fn run(&mut self) -> Result<VcpuExit<'_>, kvm_ioctls::Error>;
    /// Whether the next run returns before it enters the guest (kvm_run's
    /// immediate_exit), after completing pending I/O.
    fn set_immediate_exit(&mut self, on: bool);
    /// The vCPU's KVM state for a snapshot, and the MSRs KVM lists but would
    /// not read.
    fn save_state(
        &self,
        cpuid: &[CpuidEntry],
        xsave_size: usize,
        msr_indices: &[u32],
    ) -> Result<(VcpuSnapshot, Vec<u32>), VcpuStateError>;
}

/// A KVM vCPU.
pub struct KvmVcpu {
    fd: VcpuFd,
    vm: Arc<VmFd>,
    id: u8,
    tsc_offset: i64,
    paging: PagingSource,
    threshold_gsi: Option<u32>,
    /// The VM's XSAVE size (KVM_CAP_XSAVE2).
    xsave_size: usize,
    /// What KVM_SET_GUEST_DEBUG was last given: single-step, and a
    /// breakpoint.
    stepping: bool,
    breakpoint: Option<u64>,
}

/// MXCSR's and MXCSR_MASK's 32-bit words in an XSAVE image (its legacy
/// FXSAVE region, bytes 24 and 28).
const XSAVE_MXCSR: usize = 6;
/// XSTATE_BV's low 32-bit word (the XSAVE header at byte 512) and its SSE
/// component's bit.
const XSAVE_XSTATE_BV: usize = 128;
const XFEATURE_SSE: u32 = 1 << 1;
const XSAVE_MXCSR_MASK: usize = 7;

impl KvmVcpu {
    /// `tsc_offset` turns the host TSC into the guest's; `paging` comes from
    /// the CPUID the guest sees; `threshold_gsi` is the GSI of the vCPU's
    /// threshold line, when it has one; `xsave_size` is the VM's XSAVE
    /// size (KVM_CAP_XSAVE2).
    pub fn new(
        fd: VcpuFd,
        vm: Arc<VmFd>,
        id: u8,
        tsc_offset: i64,
        paging: PagingSource,
        threshold_gsi: Option<u32>,
        xsave_size: usize,
    ) -> Self {
        KvmVcpu {
            fd,
            vm,
            id,
            tsc_offset,
            paging,
            threshold_gsi,
            xsave_size,
            stepping: false,
            breakpoint: None,
        }
    }

    /// The KVM vCPU.
    pub fn fd(&self) -> &VcpuFd {
        &self.fd
    }

    /// The KVM vCPU, for KVM_RUN.
    pub fn fd_mut(&mut self) -> &mut VcpuFd {
        &mut self.fd
    }

    fn ioctl(&self, what: &'static str) -> impl Fn(kvm_ioctls::Error) -> VcpuError + use<> {
        let vcpu = self.id;
        move |source| VcpuError::Ioctl { vcpu, what, source }
    }

    /// Gives KVM single-step and the breakpoint together: one
    /// KVM_SET_GUEST_DEBUG sets both.
    fn set_guest_debug(&self) -> Result<(), VcpuError> {
        let mut debug = kvm_guest_debug::default();
        if self.stepping {
            debug.control |= KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_SINGLESTEP;
        }
        if let Some(at) = self.breakpoint {
            debug.control |= KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_USE_HW_BP;
            debug.arch.debugreg[0] = at;
            debug.arch.debugreg[7] = DR7_EXECUTE_DR0;
        }
        self.fd
            .set_guest_debug(&debug)
            .map_err(self.ioctl("KVM_SET_GUEST_DEBUG"))
    }
}

impl VcpuRun for KvmVcpu {
    fn prepare_thread(&mut self) -> *mut kvm_run {
        self.fd.set_sync_valid_reg(SyncReg::Register);
        self.fd.set_sync_valid_reg(SyncReg::SystemRegister);
        self.fd.get_kvm_run()
    }

    fn run(&mut self) -> Result<VcpuExit<'_>, kvm_ioctls::Error> {
        self.fd.run()
    }

    fn set_immediate_exit(&mut self, on: bool) {
        self.fd.set_kvm_immediate_exit(u8::from(on));
    }

    fn save_state(
        &self,
        cpuid: &[CpuidEntry],
        xsave_size: usize,
        msr_indices: &[u32],
    ) -> Result<(VcpuSnapshot, Vec<u32>), VcpuStateError> {
        vcpu_state::capture(&self.fd, self.id, cpuid, xsave_size, msr_indices)
    }
}

impl VcpuOps for KvmVcpu {
    fn id(&self) -> u8 {
        self.id
    }

    fn regs(&self) -> kvm_regs {
        self.fd.sync_regs().regs
    }

    fn sregs(&self) -> kvm_sregs {
        self.fd.sync_regs().sregs
    }

    fn set_regs(&mut self, regs: &kvm_regs) {
        self.fd.sync_regs_mut().regs = *regs;
        self.fd.set_sync_dirty_reg(SyncReg::Register);
    }

    fn inject(
        &mut self,
        regs: &kvm_regs,
        sregs: &kvm_sregs,
        fault: GuestFault,
    ) -> Result<Delivery, VcpuError> {
        let mut events = self
            .fd
            .get_vcpu_events()
            .map_err(self.ioctl("KVM_GET_VCPU_EVENTS"))?;
        let in_flight = events.exception.injected != 0
            || events.interrupt.injected != 0
            || events.nmi.injected != 0;
        let mut sregs = *sregs;
        if let GuestFault::PageFault { address, .. } = fault
            && !in_flight
        {
            sregs.cr2 = address;
        }
        self.fd.set_regs(regs).map_err(self.ioctl("KVM_SET_REGS"))?;
        self.fd
            .set_sregs(&sregs)
            .map_err(self.ioctl("KVM_SET_SREGS"))?;
        if in_flight {
            // Injected together, the event would be delivered right after
            // the fault, at the handler's first instruction: the
            // instruction restarts after the event instead.
            return Ok(Delivery::Restarted);
        }
        events.exception.injected = 1;
        events.exception.nr = fault.vector();
        events.exception.has_error_code = u8::from(fault.error_code().is_some());
        events.exception.error_code = fault.error_code().unwrap_or(0);
        self.fd
            .set_vcpu_events(&events)
            .map_err(self.ioctl("KVM_SET_VCPU_EVENTS"))?;
        Ok(Delivery::Injected)
    }

    fn single_step(&mut self, on: bool) -> Result<(), VcpuError> {
        self.stepping = on;
        self.set_guest_debug()
    }

    fn set_breakpoint(&mut self, at: Option<u64>) -> Result<(), VcpuError> {
        self.breakpoint = at;
        self.set_guest_debug()
    }

    fn breakpoint(&self) -> Option<u64> {
        self.breakpoint
    }

    fn guest_tsc(&self) -> u64 {
        // SAFETY: RDTSC has no memory effects; the host CPU has it (x86-64).
        let host = unsafe { core::arch::x86_64::_rdtsc() };
        host.wrapping_add_signed(self.tsc_offset)
    }

    fn signal_msi(&self, msi: &kvm_msi) -> Result<(), String> {
        self.vm
            .signal_msi(*msi)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    fn halt(&mut self) -> Result<(), VcpuError> {
        let halted = kvm_bindings::kvm_mp_state {
            mp_state: kvm_bindings::KVM_MP_STATE_HALTED,
        };
        self.fd
            .set_mp_state(halted)
            .map_err(|source| VcpuError::Ioctl {
                vcpu: self.id,
                what: "KVM_SET_MP_STATE",
                source,
            })
    }

    fn raise_threshold_line(&self) -> Result<(), String> {
        // KVM_IRQ_LINE, not an irqfd: an irqfd may reach the local APIC
        // from a host work queue, later, when the task that crossed the
        // threshold may no longer be the one running; this edge is pending
        // in the local APIC before the vCPU runs again. The GSI's route is
        // an MSI (ioapic.rs), which a raised level sends and a lowered one
        // does not, so raising is the whole edge.
        let gsi = self.threshold_gsi.ok_or("no threshold line")?;
        self.vm.set_irq_line(gsi, true).map_err(|e| e.to_string())
    }

    fn msr(&self, index: u32) -> Result<u64, String> {
        let mut msrs = Msrs::from_entries(&[kvm_msr_entry {
            index,
            ..Default::default()
        }])
        .map_err(|e| e.to_string())?;
        match self.fd.get_msrs(&mut msrs) {
            Ok(1) => Ok(msrs.as_slice()[0].data),
            Ok(_) => Err(format!("KVM_GET_MSRS read no MSR {index:#x}")),
            Err(e) => Err(e.to_string()),
        }
    }

    // MXCSR through the XSAVE image, not KVM_GET_FPU/KVM_SET_FPU: under
    // kvm_pvm (host 6.18) those read MXCSR as 0 and drop a new value, while
    // the XSAVE image holds the guest's.
    fn mxcsr(&self) -> Result<(u32, u32), VcpuError> {
        let x = self.fd.get_xsave().map_err(self.ioctl("KVM_GET_XSAVE"))?;
        Ok((x.region[XSAVE_MXCSR], x.region[XSAVE_MXCSR_MASK]))
    }

    fn set_mxcsr(&mut self, value: u32) -> Result<(), VcpuError> {
        let mut xsave =
            vcpu_state::xsave_buffer(self.xsave_size).map_err(|_| VcpuError::Buffer {
                vcpu: self.id,
                what: "XSAVE",
            })?;
        // SAFETY: the buffer was sized from KVM_CAP_XSAVE2 on this VM, which
        // is what KVM_GET_XSAVE2 writes and KVM_SET_XSAVE reads.
        unsafe { self.fd.get_xsave2(&mut xsave) }.map_err(self.ioctl("KVM_GET_XSAVE2"))?;
        // SAFETY: only the fixed region's MXCSR word and XSTATE_BV's low
        // word are written through this reference; the flexible array is
        // untouched.
        let region = &mut unsafe { xsave.as_mut_fam_struct() }.xsave.region;
        region[XSAVE_MXCSR] = value;
        // KVM takes MXCSR from an image only when XSTATE_BV names SSE (or
        // AVX) state. After the host saved the guest's registers in their
        // initial configuration (XSAVES's init optimisation, which a busy
        // host's context switches bring) the bit is clear and the new MXCSR
        // was dropped: a load that did not take, now and then. The image's
        // XMM registers then read as their initial zeros, so naming the
        // component changes nothing else.
        region[XSAVE_XSTATE_BV] |= XFEATURE_SSE;
        // SAFETY: as for KVM_GET_XSAVE2 above.
        unsafe { self.fd.set_xsave2(&xsave) }.map_err(self.ioctl("KVM_SET_XSAVE"))
    }

    fn emulation_failure(&mut self) -> EmulationFailure {
        let run = self.fd.get_kvm_run();
        // SAFETY: called for a KVM_EXIT_INTERNAL_ERROR exit, for which KVM
        // fills the `internal` member of the exit union; `emulation_failure`
        // is the same storage viewed with the layout KVM uses when suberror
        // is EMULATION and ndata covers it. Both are plain integers.
        let (suberror, flags, size, raw) = unsafe {
            let ef = run.__bindgen_anon_1.emulation_failure;
            let insn = ef.__bindgen_anon_1.__bindgen_anon_1;
            (ef.suberror, ef.flags, insn.insn_size, insn.insn_bytes)
        };
        let has_bytes = suberror == KVM_INTERNAL_ERROR_EMULATION
            && flags & KVM_INTERNAL_ERROR_EMULATION_FLAG_INSTRUCTION_BYTES != 0;
        let len = usize::from(size).min(MAX_INSN_LEN);
        let mut bytes = [0u8; MAX_INSN_LEN];
        bytes[..len].copy_from_slice(&raw[..len]);
        EmulationFailure {
            suberror,
            bytes: (has_bytes && len > 0).then_some((bytes, len)),
        }
    }

    fn paging_source(&self) -> &PagingSource {
        &self.paging
    }

    fn xsave(&self) -> Option<Vec<u8>> {
        let x = self.fd.get_xsave().ok()?;
        Some(x.region.iter().flat_map(|w| w.to_le_bytes()).collect())
    }
}
