//! Saving and restoring one vCPU's KVM state for snapshots: registers,
//! special registers, the XSAVE image (sized from KVM_CAP_XSAVE2, never
//! assumed), XCRs, the MSRs KVM lists (counts checked), the local APIC,
//! pending events, debug registers and the MP state. The LWP unit travels in
//! its own section (src/vmm/snapshot/mod.rs), because KVM refuses component 62.

use kvm_bindings::{
    KVM_MAX_MSR_ENTRIES, Msrs, Xsave, kvm_debugregs, kvm_lapic_state, kvm_mp_state, kvm_msr_entry,
    kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xcrs,
};
use kvm_ioctls::VcpuFd;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::lwp_state::LwpState;
use crate::lwp::cpuid::CpuidEntry;

/// Size of `struct kvm_xsave` without its flexible array.
const XSAVE_HEADER_BYTES: usize = 4096;

/// Why a vCPU's state could not be saved or restored.
#[derive(Debug, Error)]
pub enum VcpuStateError {
    /// An ioctl failed.
    #[error("{what} failed: {source}")]
    Ioctl {
        /// The ioctl.
        what: &'static str,
        /// The error.
        source: kvm_ioctls::Error,
    },
    /// KVM_SET_MSRS stopped early.
    #[error("KVM_SET_MSRS set {set} of {total} MSRs; MSR {failed:#x} was refused")]
    MsrsIncomplete {
        /// How many were set.
        set: usize,
        /// How many there were.
        total: usize,
        /// The first one refused.
        failed: u32,
    },
    /// The saved XSAVE image does not have this host's size.
    #[error("the XSAVE image is {saved} bytes, this host's KVM uses {here}")]
    XsaveSize {
        /// In the snapshot.
        saved: u32,
        /// KVM_CAP_XSAVE2 here.
        here: usize,
    },
    /// A FAM wrapper could not be built.
    #[error("cannot build the {0} buffer")]
    Buffer(&'static str),
}

fn ioctl(what: &'static str) -> impl Fn(kvm_ioctls::Error) -> VcpuStateError {
    move |source| VcpuStateError::Ioctl { what, source }
}

/// An XSAVE buffer of the VM's XSAVE `size` (KVM_CAP_XSAVE2).
pub(crate) fn xsave_buffer(size: usize) -> Result<Xsave, VcpuStateError> {
    let fam = size.saturating_sub(XSAVE_HEADER_BYTES).div_ceil(4);
    Xsave::new(fam).map_err(|_| VcpuStateError::Buffer("XSAVE"))
}

/// MSR values as (index, value), and the indices KVM would not read.
type MsrValues = (Vec<(u32, u64)>, Vec<u32>);

/// Reads every MSR in `indices` that KVM will read. KVM stops at the first
/// MSR it cannot read; that one is skipped (and reported) and the rest read.
fn read_msrs(fd: &VcpuFd, indices: &[u32]) -> Result<MsrValues, VcpuStateError> {
    let mut out = Vec::with_capacity(indices.len());
    let mut skipped = Vec::new();
    let mut rest = indices;
    while !rest.is_empty() {
        let chunk = &rest[..rest.len().min(KVM_MAX_MSR_ENTRIES)];
        let entries: Vec<kvm_msr_entry> = chunk
            .iter()
            .map(|&index| kvm_msr_entry {
                index,
                ..Default::default()
            })
            .collect();
        let mut msrs = Msrs::from_entries(&entries).map_err(|_| VcpuStateError::Buffer("MSR"))?;
        let n = fd.get_msrs(&mut msrs).map_err(ioctl("KVM_GET_MSRS"))?;
        out.extend(msrs.as_slice()[..n].iter().map(|e| (e.index, e.data)));
        if n < chunk.len() {
            skipped.push(chunk[n]);
            rest = &rest[n + 1..];
        } else {
            rest = &rest[chunk.len()..];
        }
    }
    Ok((out, skipped))
}

/// Saves a vCPU's KVM state. Returns the snapshot (without the LWP section)
/// and the MSRs KVM listed but would not read.
pub fn capture(
    fd: &VcpuFd,
    id: u8,
    cpuid: &[CpuidEntry],
    xsave_size: usize,
    msr_indices: &[u32],
) -> Result<(VcpuSnapshot, Vec<u32>), VcpuStateError> {
    let mut xsave = xsave_buffer(xsave_size)?;
    // SAFETY: the buffer was sized from KVM_CAP_XSAVE2 on this VM, which is
    // what KVM_GET_XSAVE2 writes.
    unsafe { fd.get_xsave2(&mut xsave) }.map_err(ioctl("KVM_GET_XSAVE2"))?;
    let mut words = xsave.as_fam_struct_ref().xsave.region.to_vec();
    words.extend_from_slice(xsave.as_slice());
    let (msrs, skipped) = read_msrs(fd, msr_indices)?;
    let snapshot = VcpuSnapshot {
        id,
        cpuid: cpuid.to_vec(),
        regs: fd.get_regs().map_err(ioctl("KVM_GET_REGS"))?,
        sregs: fd.get_sregs().map_err(ioctl("KVM_GET_SREGS"))?,
        xsave_size: xsave_size as u32,
        xsave: words,
        xcrs: fd.get_xcrs().map_err(ioctl("KVM_GET_XCRS"))?,
        msrs,
        lapic: fd.get_lapic().map_err(ioctl("KVM_GET_LAPIC"))?,
        events: fd.get_vcpu_events().map_err(ioctl("KVM_GET_VCPU_EVENTS"))?,
        debugregs: fd.get_debug_regs().map_err(ioctl("KVM_GET_DEBUGREGS"))?,
        mp_state: fd.get_mp_state().map_err(ioctl("KVM_GET_MP_STATE"))?,
        lwp: None,
    };
    Ok((snapshot, skipped))
}

/// Restores a vCPU's KVM state (CPUID must already be set), in the order
/// KVM needs: MP state, registers, special registers, XSAVE, XCRs, debug
/// registers, local APIC, MSRs, and pending events last.
pub fn apply(fd: &VcpuFd, s: &VcpuSnapshot, xsave_size: usize) -> Result<(), VcpuStateError> {
    if s.xsave_size as usize != xsave_size {
        return Err(VcpuStateError::XsaveSize {
            saved: s.xsave_size,
            here: xsave_size,
        });
    }
    let mut xsave = xsave_buffer(xsave_size)?;
    let region_words = xsave.as_fam_struct_ref().xsave.region.len();
    if s.xsave.len() != region_words + xsave.as_slice().len() {
        return Err(VcpuStateError::XsaveSize {
            saved: (s.xsave.len() * 4) as u32,
            here: xsave_size,
        });
    }
    // SAFETY: only the fixed region is written through this reference; the
    // flexible array is written through `as_mut_slice`, whose length the
    // wrapper tracks.
    unsafe { xsave.as_mut_fam_struct() }
        .xsave
        .region
        .copy_from_slice(&s.xsave[..region_words]);
    xsave
        .as_mut_slice()
        .copy_from_slice(&s.xsave[region_words..]);
    fd.set_mp_state(s.mp_state)
        .map_err(ioctl("KVM_SET_MP_STATE"))?;
    fd.set_regs(&s.regs).map_err(ioctl("KVM_SET_REGS"))?;
    fd.set_sregs(&s.sregs).map_err(ioctl("KVM_SET_SREGS"))?;
    // SAFETY: the buffer has the size KVM_CAP_XSAVE2 reports for this VM.
    unsafe { fd.set_xsave2(&xsave) }.map_err(ioctl("KVM_SET_XSAVE"))?;
    fd.set_xcrs(&s.xcrs).map_err(ioctl("KVM_SET_XCRS"))?;
    fd.set_debug_regs(&s.debugregs)
        .map_err(ioctl("KVM_SET_DEBUGREGS"))?;
    fd.set_lapic(&s.lapic).map_err(ioctl("KVM_SET_LAPIC"))?;
    for chunk in s.msrs.chunks(KVM_MAX_MSR_ENTRIES) {
        let entries: Vec<kvm_msr_entry> = chunk
            .iter()
            .map(|&(index, data)| kvm_msr_entry {
                index,
                data,
                ..Default::default()
            })
            .collect();
        let msrs = Msrs::from_entries(&entries).map_err(|_| VcpuStateError::Buffer("MSR"))?;
        let n = fd.set_msrs(&msrs).map_err(ioctl("KVM_SET_MSRS"))?;
        if n != chunk.len() {
            return Err(VcpuStateError::MsrsIncomplete {
                set: n,
                total: chunk.len(),
                failed: chunk[n].0,
            });
        }
    }
    fd.set_vcpu_events(&s.events)
        .map_err(ioctl("KVM_SET_VCPU_EVENTS"))
}

/// One vCPU.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VcpuSnapshot {
    /// vCPU index (= APIC ID).
    pub id: u8,
    /// The table passed to KVM_SET_CPUID2.
    pub cpuid: Vec<CpuidEntry>,
    /// General registers.
    pub regs: kvm_regs,
    /// Special registers.
    pub sregs: kvm_sregs,
    /// The XSAVE image's size in bytes (KVM_CAP_XSAVE2).
    pub xsave_size: u32,
    /// The XSAVE image as 32-bit words (without component 62: KVM refuses it).
    pub xsave: Vec<u32>,
    /// Extended control registers.
    pub xcrs: kvm_xcrs,
    /// MSRs KVM lists as saveable, as (index, value).
    pub msrs: Vec<(u32, u64)>,
    /// Local APIC.
    pub lapic: kvm_lapic_state,
    /// Pending events.
    pub events: kvm_vcpu_events,
    /// Debug registers.
    pub debugregs: kvm_debugregs,
    /// Multiprocessing state.
    pub mp_state: kvm_mp_state,
    /// The vCPU's LWP state, when the VM has LWP.
    pub lwp: Option<LwpState>,
}

impl VcpuSnapshot {
    /// vCPU `id` with its CPUID table and every other part at its default:
    /// what a vCPU without KVM state saves (a cued replay's), and the start
    /// of a made-up one in tests.
    pub fn blank(id: u8, cpuid: Vec<CpuidEntry>) -> Self {
        VcpuSnapshot {
            id,
            cpuid,
            regs: Default::default(),
            sregs: Default::default(),
            xsave_size: 0,
            xsave: Vec::new(),
            xcrs: Default::default(),
            msrs: Vec::new(),
            lapic: Default::default(),
            events: Default::default(),
            debugregs: Default::default(),
            mp_state: Default::default(),
            lwp: None,
        }
    }
}
