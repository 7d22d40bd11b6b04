//! The boot vCPU: the boot GDT, the identity map of the Linux 64-bit
//! protocol, and the first registers for each entry.

use kvm_bindings::{kvm_regs, kvm_sregs};
use vm_memory::{Bytes, GuestAddress};

use super::error::BootError;
use super::memory::{GDT_ADDR, PAGE_TABLES, PVH_INFO_ADDR, ZERO_PAGE_ADDR};
use crate::guard::GuestMemory;
use crate::guard::pagetable::PteFlags;
use crate::vmm::vcpu::segment::segment;

/// How the boot vCPU enters the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// PVH: 32-bit protected mode, paging off, RBX = start_info.
    Pvh(u64),
    /// Linux 64-bit boot protocol: long mode, identity map, RSI = boot_params.
    Linux64(u64),
}

/// The boot GDT: null, 64-bit code (0x08), data (0x10), 32-bit code (0x18).
pub(super) const GDT: [u64; 4] = [
    0,
    0x00af_9b00_0000_ffff,
    0x00cf_9300_0000_ffff,
    0x00cf_9b00_0000_ffff,
];
pub(super) const SEL_CODE64: u16 = 0x08;
pub(super) const SEL_DATA: u16 = 0x10;
pub(super) const SEL_CODE32: u16 = 0x18;

pub(super) fn build_identity_map(mem: &GuestMemory, native: bool) -> Result<(), BootError> {
    // A PML4, a PDPT and four page directories of 2 MiB pages, each table
    // written whole: a walk through guest memory for each of the 2048
    // pages was most of a small kernel's start.
    const TABLE: u64 = 0x1000;
    const PAGE_SIZE_BIT: u64 = 1 << 7;
    const GIB: usize = 4;
    // Native supervisor mode runs the kernel in hardware ring 3: a page it
    // touches without U=1 spins KVM_RUN forever.
    let rw = if native {
        PteFlags::USER_RW.bits()
    } else {
        PteFlags::KERNEL_RW.bits()
    };
    let (pml4, pdpt, first_pd) = (PAGE_TABLES, PAGE_TABLES + TABLE, PAGE_TABLES + 2 * TABLE);
    let write = |at: u64, table: [u64; 512]| {
        let bytes: Vec<u8> = table.iter().flat_map(|e| e.to_le_bytes()).collect();
        mem.write_slice(&bytes, GuestAddress(at))
            .map_err(|e| BootError::BootData(format!("the boot page tables: {e}")))
    };
    let mut table = [0u64; 512];
    table[0] = pdpt | rw;
    write(pml4, table)?;
    let mut table = [0u64; 512];
    for (gib, entry) in table.iter_mut().enumerate().take(GIB) {
        *entry = (first_pd + gib as u64 * TABLE) | rw;
    }
    write(pdpt, table)?;
    for gib in 0..GIB as u64 {
        let table: [u64; 512] =
            std::array::from_fn(|i| (gib << 30) | ((i as u64) << 21) | PAGE_SIZE_BIT | rw);
        write(first_pd + gib * TABLE, table)?;
    }
    Ok(())
}

/// Writes the boot GDT.
pub fn write_gdt(mem: &GuestMemory) -> Result<(), BootError> {
    for (i, d) in GDT.iter().enumerate() {
        mem.write_obj(*d, GuestAddress(GDT_ADDR + 8 * i as u64))
            .map_err(|e| BootError::BootData(e.to_string()))?;
    }
    Ok(())
}

/// The boot vCPU's registers for `entry`, starting from KVM's `sregs`.
pub fn initial_state(entry: Entry, mut sregs: kvm_sregs) -> (kvm_regs, kvm_sregs) {
    let data = segment(SEL_DATA, GDT[2]);
    sregs.gdt.base = GDT_ADDR;
    sregs.gdt.limit = (GDT.len() * 8 - 1) as u16;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    let mut regs = kvm_regs {
        rflags: 0x2,
        ..Default::default()
    };
    match entry {
        Entry::Pvh(rip) => {
            sregs.cs = segment(SEL_CODE32, GDT[3]);
            sregs.cr0 = 0x11;
            sregs.cr4 = 0;
            sregs.efer = 0;
            regs.rip = rip;
            regs.rbx = PVH_INFO_ADDR;
        }
        Entry::Linux64(rip) => {
            sregs.cs = segment(SEL_CODE64, GDT[1]);
            sregs.cr0 = 0x8000_0011;
            sregs.cr3 = PAGE_TABLES;
            sregs.cr4 = 0x20;
            sregs.efer = 0x500;
            regs.rip = rip;
            regs.rsi = ZERO_PAGE_ADDR;
        }
    }
    (regs, sregs)
}
