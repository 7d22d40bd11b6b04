//! Fixtures for the exit handlers' tests: a fake vCPU (registers held in
//! memory, injected faults, MSIs and single-step switches recorded) over
//! real guest memory laid out as lwpvmm's test guests lay it out: a GDT,
//! a supervisor-only kernel area with a stack for exception frames and
//! state-call areas, and user pages for code, an LWPCB and its ring. The
//! handlers under test are the functions the run loop calls.

use crate::vmm::base::recorder::Recorder;
use std::cell::{Cell, RefCell};

use kvm_bindings::{kvm_msi, kvm_regs, kvm_sregs};
use vm_memory::{ByteValued, Bytes, GuestAddress};

use super::context::ExitCx;
use super::lwp_state::VcpuLwp;
use super::ops::{
    Delivery, EmulationFailure, MSR_KERNEL_GS_BASE, MSR_LSTAR, MSR_STAR, MSR_SYSCALL_MASK, VcpuOps,
};
use super::protocol::VcpuError;
use super::syscall_quirk::SyscallFixup;
use crate::guard::GuestMemory;
use crate::guard::pagetable::{PageSize, PageTables, PteFlags};
use crate::lwp::cpuid::{CpuidEntry, LwpProfile};
use crate::lwp::fault::GuestFault;
use crate::lwp::lwpcb::LwpcbFixed;
use crate::lwp::record::EventRecord;
use crate::vmm::base::metrics::VcpuMetrics;
use crate::vmm::base::pv::Frame;
use crate::vmm::vcpu::guest_paging::PagingSource;
use crate::vmm::vcpu::segment::segment;
use crate::vmm::vcpu::step::StepBackend;

pub const KERNEL_CS: u64 = 0x08;
pub const KERNEL_DS: u64 = 0x10;
pub const USER_DS: u64 = 0x1b;
pub const USER_CS: u64 = 0x23;
pub const CONFORMING_CPL3: u64 = 0x53;
/// User code 32 (compatibility mode).
pub const USER_CS32: u64 = 0x43;

/// The GDT (supervisor memory): null, kernel code 64, kernel data, user
/// data, user code 64, a data descriptor, a non-present code descriptor
/// (0x30), a kernel code 32 (0x38), user code 32 (0x40), unused (0x48),
/// conforming code 64 at DPL 0 (0x50).
pub const GDT: u64 = 0x1000;
const DESCRIPTORS: [u64; 11] = [
    0,
    0x00af_9b00_0000_ffff,
    0x00cf_9300_0000_ffff,
    0x00cf_f300_0000_ffff,
    0x00af_fb00_0000_ffff,
    0x00cf_9300_0000_ffff,
    0x00af_1b00_0000_ffff,
    0x00cf_9b00_0000_ffff,
    0x00cf_fb00_0000_ffff,
    0,
    0x00af_9e00_0000_ffff,
];
/// The #UD/#DB frame the doorbells read (kernel stack).
pub const FRAME_AT: u64 = 0x8fd8;
/// A supervisor state-call area.
pub const AREA: u64 = 0x9000;
/// Kernel text (an LWP instruction run at CPL0).
pub const KERNEL_CODE: u64 = 0xa000;
/// User pages: code, the LWPCB, its ring (two pages), a read-only page, the
/// stack's top.
pub const USER_CODE: u64 = 0x40_0000;
pub const LWPCB: u64 = 0x40_1000;
pub const RING: u64 = 0x40_2000;
pub const READ_ONLY: u64 = 0x40_4000;
pub const USER_STACK: u64 = 0x40_8000;
/// Unmapped.
pub const UNMAPPED: u64 = 0x50_0000;

/// A fake vCPU.
pub struct FakeVcpu {
    pub regs: kvm_regs,
    pub sregs: kvm_sregs,
    pub regs_set: usize,
    pub injected: Vec<(kvm_regs, kvm_sregs, GuestFault)>,
    /// Whether KVM has an event in flight (faults then restart).
    pub event_in_flight: bool,
    pub msis: RefCell<Vec<kvm_msi>>,
    /// Halts asked for (the power port's halt).
    pub halts: usize,
    /// Edges raised on the threshold line.
    pub lines: Cell<u32>,
    pub kernel_gs_base: u64,
    pub lstar: u64,
    /// MXCSR (its reset value 0x1F80 at the start).
    pub mxcsr: u32,
    /// MXCSR_MASK (0xFFFF: DAZ supported).
    pub mxcsr_mask: u32,
    pub single_step: Option<bool>,
    /// STAR and SFMASK.
    pub star: u64,
    pub fmask: u64,
    /// The guest-debug breakpoint.
    pub breakpoint: Option<u64>,
    pub failure: EmulationFailure,
    pub tsc: u64,
    paging: PagingSource,
}

impl VcpuOps for FakeVcpu {
    fn id(&self) -> u8 {
        0
    }

    fn regs(&self) -> kvm_regs {
        self.regs
    }

    fn sregs(&self) -> kvm_sregs {
        self.sregs
    }

    fn set_regs(&mut self, regs: &kvm_regs) {
        self.regs = *regs;
        self.regs_set += 1;
    }

    fn inject(
        &mut self,
        regs: &kvm_regs,
        sregs: &kvm_sregs,
        fault: GuestFault,
    ) -> Result<Delivery, VcpuError> {
        self.regs = *regs;
        self.sregs = *sregs;
        if self.event_in_flight {
            return Ok(Delivery::Restarted);
        }
        self.injected.push((*regs, *sregs, fault));
        Ok(Delivery::Injected)
    }

    fn single_step(&mut self, on: bool) -> Result<(), VcpuError> {
        self.single_step = Some(on);
        Ok(())
    }

    fn set_breakpoint(&mut self, at: Option<u64>) -> Result<(), VcpuError> {
        self.breakpoint = at;
        Ok(())
    }

    fn breakpoint(&self) -> Option<u64> {
        self.breakpoint
    }

    fn guest_tsc(&self) -> u64 {
        self.tsc
    }

    fn raise_threshold_line(&self) -> Result<(), String> {
        self.lines.set(self.lines.get() + 1);
        Ok(())
    }

    fn mxcsr(&self) -> Result<(u32, u32), VcpuError> {
        Ok((self.mxcsr, self.mxcsr_mask))
    }

    fn set_mxcsr(&mut self, value: u32) -> Result<(), VcpuError> {
        self.mxcsr = value;
        Ok(())
    }

    fn msr(&self, index: u32) -> Result<u64, String> {
        match index {
            MSR_KERNEL_GS_BASE => Ok(self.kernel_gs_base),
            MSR_LSTAR => Ok(self.lstar),
            MSR_STAR => Ok(self.star),
            MSR_SYSCALL_MASK => Ok(self.fmask),
            _ => Err(format!("the fake has no MSR {index:#x}")),
        }
    }

    fn signal_msi(&self, msi: &kvm_msi) -> Result<(), String> {
        self.msis.borrow_mut().push(*msi);
        Ok(())
    }

    fn halt(&mut self) -> Result<(), VcpuError> {
        self.halts += 1;
        Ok(())
    }

    fn emulation_failure(&mut self) -> EmulationFailure {
        self.failure
    }

    fn paging_source(&self) -> &PagingSource {
        &self.paging
    }

    fn xsave(&self) -> Option<Vec<u8>> {
        None
    }
}

/// Guest memory, a fake vCPU and its LWP state.
pub struct Rig {
    pub mem: GuestMemory,
    pub vcpu: FakeVcpu,
    pub lwp: VcpuLwp,
    pub metrics: VcpuMetrics,
    /// Where its records go (nowhere: no trace, no API).
    pub recorder: Recorder,
    pub syscall_fixup: Option<SyscallFixup>,
}

impl Rig {
    /// A vCPU of a VM with `profile` (a shim guest); `stepping` is the
    /// host's stepping backend.
    pub fn new(profile: LwpProfile, stepping: Option<StepBackend>) -> Rig {
        let mem = GuestMemory::from_ranges(&[(GuestAddress(0), 8 << 20)]).unwrap();
        for (i, d) in DESCRIPTORS.iter().enumerate() {
            mem.write_obj(*d, GuestAddress(GDT + 8 * i as u64)).unwrap();
        }
        let cr3 = {
            let mut pt = PageTables::new(&mem, 0x60_0000, 0x70_0000).unwrap();
            pt.map(0, 0, PageSize::Size2M, PteFlags::KERNEL_RW).unwrap();
            pt.map_range(USER_CODE, USER_CODE, 0x4000, PteFlags::USER_RW)
                .unwrap();
            pt.map_range(READ_ONLY, READ_ONLY, 0x1000, PteFlags::USER_RO)
                .unwrap();
            pt.map_range(
                USER_STACK - 0x1000,
                USER_STACK - 0x1000,
                0x1000,
                PteFlags::USER_RW,
            )
            .unwrap();
            pt.cr3()
        };
        let mut sregs = kvm_sregs {
            cr0: 0x8001_0033,
            cr3,
            cr4: 0x20,
            efer: 0xd00,
            ..Default::default()
        };
        sregs.gdt.base = GDT;
        sregs.gdt.limit = (DESCRIPTORS.len() * 8 - 1) as u16;
        // A processor with 1 GiB pages, NX and 48 physical-address bits.
        let cpuid = [
            CpuidEntry {
                leaf: 0x8000_0001,
                subleaf: 0,
                eax: 0,
                ebx: 0,
                ecx: 0,
                edx: 1 << 26 | 1 << 20,
            },
            CpuidEntry {
                leaf: 0x8000_0008,
                subleaf: 0,
                eax: 48,
                ebx: 0,
                ecx: 0,
                edx: 0,
            },
        ];
        let vcpu = FakeVcpu {
            regs: kvm_regs {
                rflags: 0x2,
                ..Default::default()
            },
            sregs,
            regs_set: 0,
            injected: Vec::new(),
            event_in_flight: false,
            msis: RefCell::default(),
            halts: 0,
            lines: Cell::new(0),
            kernel_gs_base: 0,
            lstar: 0,
            mxcsr: 0x1f80,
            mxcsr_mask: 0xffff,
            single_step: None,
            breakpoint: None,
            star: 0,
            fmask: 0,
            failure: EmulationFailure {
                suberror: 1,
                bytes: None,
            },
            tsc: 1000,
            paging: PagingSource::new(&cpuid),
        };
        let lwp = VcpuLwp::new(profile.caps(), true, stepping, None).unwrap();
        let mut rig = Rig {
            mem,
            vcpu,
            lwp,
            metrics: VcpuMetrics::default(),
            recorder: Recorder::new(None, false, 0),
            syscall_fixup: None,
        };
        rig.at_cpl0();
        rig
    }

    /// The handlers' context.
    pub fn cx(&mut self) -> ExitCx<'_> {
        ExitCx {
            vcpu: &mut self.vcpu,
            lwp: &mut self.lwp,
            mem: &self.mem,
            metrics: &self.metrics,
            recorder: &self.recorder,
            syscall_fixup: self.syscall_fixup.as_ref(),
        }
    }

    /// Puts the vCPU at CPL0 in the kernel code segment with RSP at the
    /// frame, as a doorbell's `out` finds it.
    pub fn at_cpl0(&mut self) {
        self.vcpu.sregs.cs = segment(KERNEL_CS as u16, DESCRIPTORS[1]);
        self.vcpu.sregs.ss = segment(KERNEL_DS as u16, DESCRIPTORS[2]);
        self.vcpu.regs.rsp = FRAME_AT;
    }

    /// Puts the vCPU at CPL3: in the user code segment, or in the DPL-0
    /// conforming segment (where CS.DPL reads 0).
    pub fn at_cpl3(&mut self, conforming: bool) {
        self.vcpu.sregs.cs = if conforming {
            segment(CONFORMING_CPL3 as u16, DESCRIPTORS[10])
        } else {
            segment(USER_CS as u16, DESCRIPTORS[4])
        };
        self.vcpu.sregs.ss = segment(USER_DS as u16, DESCRIPTORS[3]);
        self.vcpu.regs.rsp = USER_STACK - 0x100;
    }

    /// An exception frame at [`FRAME_AT`], and the vCPU at CPL0 in the
    /// handler that reads it.
    pub fn frame(&mut self, rip: u64, cs: u64, ss: u64, rflags: u64) {
        let f = Frame {
            rip,
            cs,
            rflags,
            rsp: USER_STACK - 0x80,
            ss,
        };
        self.mem
            .write_slice(f.as_slice(), GuestAddress(FRAME_AT))
            .unwrap();
        self.at_cpl0();
    }

    /// The frame now in memory.
    pub fn read_frame(&self) -> Frame {
        self.mem.read_obj(GuestAddress(FRAME_AT)).unwrap()
    }

    /// Writes instruction bytes at `at`.
    pub fn code(&self, at: u64, bytes: &[u8]) {
        self.mem.write_slice(bytes, GuestAddress(at)).unwrap();
    }

    /// A valid LWPCB at [`LWPCB`] with `flags`, its ring at [`RING`] (8
    /// KiB); LWP_CFG enables the same.
    pub fn lwpcb(&mut self, flags: u32) {
        self.lwpcb_with(flags, 0);
    }

    /// As [`lwpcb`](Self::lwpcb), with a threshold (bytes).
    pub fn lwpcb_with(&mut self, flags: u32, threshold: u32) {
        let fixed = LwpcbFixed {
            flags,
            buffer_size_random: 8192,
            buffer_base: RING,
            threshold,
            ..Default::default()
        };
        self.mem
            .write_slice(fixed.as_slice(), GuestAddress(LWPCB))
            .unwrap();
        if let Some(unit) = self.lwp.unit_mut() {
            unit.write_cfg(u64::from(flags)).unwrap();
        }
    }

    /// A record of the ring.
    pub fn record(&self, slot: u64) -> EventRecord {
        self.mem.read_obj(GuestAddress(RING + 32 * slot)).unwrap()
    }
}

/// `llwpcb rax`.
pub const LLWPCB_RAX: [u8; 5] = [0x8f, 0xe9, 0xf8, 0x12, 0xc0];
/// `lwpins rax, ecx, 0x1234`.
pub const LWPINS: [u8; 9] = [0x8f, 0xea, 0xf8, 0x12, 0xc1, 0x34, 0x12, 0, 0];
