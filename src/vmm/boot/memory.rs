//! Guest RAM: its layout around the MMIO hole below 4 GiB, fresh (an
//! anonymous mapping) or from a snapshot's memory file (mapped private, so
//! pages come in as the guest touches them).

use vm_memory::GuestAddress;

use crate::guard::GuestMemory;

use super::error::BootError;

/// Start of the MMIO hole below 4 GiB (LAPIC, IOAPIC and friends live there).
pub const MMIO_HOLE_START: u64 = 0xC000_0000;
/// End of the MMIO hole.
pub const MMIO_HOLE_END: u64 = 0x1_0000_0000;
/// The smallest guest lwpvmm boots.
pub const MIN_MEMORY_MIB: u64 = 16;
/// The largest guest RAM lwpvmm accepts.
pub const MAX_MEMORY_MIB: u64 = 1 << 20;

/// Where the boot data lies in low memory, below the kernel at 1 MiB: the
/// GDT, PVH's start_info, its module list and memory map, Linux's zero
/// page, the boot page tables (six pages, below 0x10000) and the command
/// line.
pub(super) const GDT_ADDR: u64 = 0x500;
pub(super) const PVH_INFO_ADDR: u64 = 0x6000;
pub(super) const PVH_MODLIST_ADDR: u64 = 0x6040;
pub(super) const PVH_MEMMAP_ADDR: u64 = 0x6080;
pub(super) const ZERO_PAGE_ADDR: u64 = 0x7000;
pub(super) const PAGE_TABLES: u64 = 0x9000;
pub(super) const CMDLINE_ADDR: u64 = 0x20000;
/// The longest command line, with its NUL.
pub(super) const CMDLINE_MAX: usize = 4096;

/// RAM ranges for `mib` MiB: below the MMIO hole, then above 4 GiB.
pub fn ram_ranges(mib: u64) -> Result<Vec<(GuestAddress, usize)>, BootError> {
    if !(MIN_MEMORY_MIB..=MAX_MEMORY_MIB).contains(&mib) {
        return Err(BootError::MemorySize {
            mib,
            min: MIN_MEMORY_MIB,
            max: MAX_MEMORY_MIB,
        });
    }
    let bytes = mib << 20;
    let low = bytes.min(MMIO_HOLE_START);
    let mut ranges = vec![(GuestAddress(0), low as usize)];
    if bytes > low {
        ranges.push((GuestAddress(MMIO_HOLE_END), (bytes - low) as usize));
    }
    Ok(ranges)
}

/// Allocates guest RAM.
pub fn create_memory(mib: u64) -> Result<GuestMemory, BootError> {
    GuestMemory::from_ranges(&ram_ranges(mib)?).map_err(|e| BootError::MemoryAlloc(mib, e))
}

/// Guest RAM of `mib` MiB mapped from a snapshot's memory file (see
/// [`map_file`]).
pub fn memory_from_file(mib: u64, file: &std::fs::File) -> Result<GuestMemory, BootError> {
    map_file(&ram_ranges(mib)?, file).map_err(BootError::MemoryFile)
}

/// Guest RAM of `ranges` mapped private and copy-on-write from `file`, the
/// ranges one after the other from its start: pages are read when first
/// touched, and the guest's writes never reach the file.
pub fn map_file(
    ranges: &[(GuestAddress, usize)],
    file: &std::fs::File,
) -> Result<GuestMemory, std::io::Error> {
    let mut regions = Vec::with_capacity(ranges.len());
    let mut offset = 0u64;
    for &(start, size) in ranges {
        let region = vm_memory::MmapRegion::build(
            Some(vm_memory::FileOffset::new(file.try_clone()?, offset)),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_NORESERVE,
        )
        .map_err(|e| std::io::Error::other(e.to_string()))?;
        regions.push(
            vm_memory::GuestRegionMmap::new(region, start)
                .ok_or_else(|| std::io::Error::other("a region overflows"))?,
        );
        offset += size as u64;
    }
    GuestMemory::from_regions(regions).map_err(|e| std::io::Error::other(e.to_string()))
}
