//! The boot information each protocol hands the kernel: PVH's start_info
//! with its memory map and module list, Linux's boot_params (zero page)
//! with its e820 map, the command line and the initramfs.

use linux_loader::configurator::linux::LinuxBootConfigurator;
use linux_loader::configurator::pvh::PvhBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::bootparam::{boot_e820_entry, boot_params};
use linux_loader::loader::elf::start_info::{
    hvm_memmap_table_entry, hvm_modlist_entry, hvm_start_info,
};
use linux_loader::loader::{Cmdline, load_cmdline};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend};

use crate::guard::GuestMemory;
use crate::vmm::devices::acpi::{ACPI_END, ACPI_START, AcpiTables, MmioDevice, RSDP_ADDR};

use super::cpu::{Entry, build_identity_map};
use super::error::BootError;
use super::image::{KERNEL_HDR_MAGIC, LoadedKernel};
use super::memory::{
    CMDLINE_ADDR, CMDLINE_MAX, MMIO_HOLE_START, PVH_INFO_ADDR, PVH_MEMMAP_ADDR, PVH_MODLIST_ADDR,
    ZERO_PAGE_ADDR,
};

pub(super) const E820_RAM: u32 = 1;
pub(super) const E820_RESERVED: u32 = 2;
/// Where the extended BIOS data area usually starts: RAM below 1 MiB ends
/// there.
pub(super) const EBDA_START: u64 = 0x9_FC00;
pub(super) const PVH_MAGIC: u32 = 0x336e_c578;
pub(super) const BOOT_LOADER_UNDEFINED: u8 = 0xff;
pub(super) const KERNEL_LOADED_HIGH: u8 = 0x01;
pub(super) const KERNEL_BOOT_FLAG_MAGIC: u16 = 0xaa55;

/// Writes the command line, the initramfs, the ACPI tables describing
/// `vcpus` vCPUs and the virtio-mmio `devices` (those the command line does
/// not name) and the boot information the kernel's entry protocol expects.
pub fn write_boot_info(
    mem: &GuestMemory,
    kernel: &LoadedKernel,
    cmdline: &str,
    initramfs: Option<&[u8]>,
    vcpus: u8,
    devices: &[MmioDevice],
) -> Result<(), BootError> {
    let mut cl = Cmdline::new(CMDLINE_MAX).map_err(BootError::Cmdline)?;
    if !cmdline.is_empty() {
        cl.insert_str(cmdline).map_err(BootError::Cmdline)?;
    }
    load_cmdline(mem, GuestAddress(CMDLINE_ADDR), &cl)
        .map_err(|e| BootError::BootData(e.to_string()))?;
    let cmdline_size = cmdline.len() as u32 + 1;
    let initrd = match initramfs {
        Some(data) => Some(place_initramfs(mem, kernel.end, data)?),
        None => None,
    };
    for (addr, table) in &AcpiTables::new(vcpus, devices).tables {
        mem.write_slice(table, GuestAddress(*addr))
            .map_err(|e| BootError::BootData(e.to_string()))?;
    }
    let ram: Vec<(u64, u64)> = mem
        .iter()
        .map(|r| {
            use vm_memory::GuestMemoryRegion;
            (r.start_addr().raw_value(), r.len())
        })
        .collect();
    let map = memory_map(&ram);
    match kernel.entry {
        Entry::Pvh(_) => write_pvh(mem, &map, initrd),
        Entry::Linux64(_) => {
            write_linux(mem, &map, kernel, cmdline_size, initrd)?;
            build_identity_map(mem, kernel.native)
        }
    }
}

/// The memory map a kernel gets, as (address, size, E820 type): RAM with
/// the legacy hole below 1 MiB cut out (from the EBDA's usual start to the
/// ACPI area, which is reserved).
pub(super) fn memory_map(ram: &[(u64, u64)]) -> Vec<(u64, u64, u32)> {
    let mut map = Vec::new();
    for &(addr, size) in ram {
        let end = addr + size;
        if addr < ACPI_END && end > ACPI_END {
            map.push((addr, EBDA_START.saturating_sub(addr), E820_RAM));
            map.push((ACPI_START, ACPI_END - ACPI_START, E820_RESERVED));
            map.push((ACPI_END, end - ACPI_END, E820_RAM));
        } else {
            map.push((addr, size, E820_RAM));
        }
    }
    map
}

pub(super) fn place_initramfs(
    mem: &GuestMemory,
    kernel_end: u64,
    data: &[u8],
) -> Result<(u64, u64), BootError> {
    let size = data.len() as u64;
    let limit = mem.last_addr().raw_value().min(MMIO_HOLE_START - 1) + 1;
    let addr = limit.checked_sub(size).map(|a| a & !0xfff);
    match addr {
        Some(a) if a >= kernel_end => {
            mem.write_slice(data, GuestAddress(a))
                .map_err(|e| BootError::BootData(e.to_string()))?;
            Ok((a, size))
        }
        _ => Err(BootError::InitramfsTooLarge { size, limit }),
    }
}

pub(super) fn write_pvh(
    mem: &GuestMemory,
    map: &[(u64, u64, u32)],
    initrd: Option<(u64, u64)>,
) -> Result<(), BootError> {
    let info = hvm_start_info {
        magic: PVH_MAGIC,
        version: 1,
        cmdline_paddr: CMDLINE_ADDR,
        rsdp_paddr: RSDP_ADDR,
        memmap_paddr: PVH_MEMMAP_ADDR,
        memmap_entries: map.len() as u32,
        nr_modules: u32::from(initrd.is_some()),
        modlist_paddr: if initrd.is_some() {
            PVH_MODLIST_ADDR
        } else {
            0
        },
        ..Default::default()
    };
    let memmap: Vec<hvm_memmap_table_entry> = map
        .iter()
        .map(|&(addr, size, type_)| hvm_memmap_table_entry {
            addr,
            size,
            type_,
            reserved: 0,
        })
        .collect();
    let mut params = BootParams::new(&info, GuestAddress(PVH_INFO_ADDR));
    params.set_sections(&memmap, GuestAddress(PVH_MEMMAP_ADDR));
    if let Some((paddr, size)) = initrd {
        let module = hvm_modlist_entry {
            paddr,
            size,
            ..Default::default()
        };
        params.set_modules(&[module], GuestAddress(PVH_MODLIST_ADDR));
    }
    PvhBootConfigurator::write_bootparams(&params, mem)
        .map_err(|e| BootError::BootData(e.to_string()))
}

pub(super) fn write_linux(
    mem: &GuestMemory,
    map: &[(u64, u64, u32)],
    kernel: &LoadedKernel,
    cmdline_size: u32,
    initrd: Option<(u64, u64)>,
) -> Result<(), BootError> {
    let mut params = boot_params::default();
    if let Some(hdr) = kernel.setup_header {
        params.hdr = hdr;
    }
    params.hdr.type_of_loader = BOOT_LOADER_UNDEFINED;
    params.hdr.boot_flag = KERNEL_BOOT_FLAG_MAGIC;
    params.hdr.header = KERNEL_HDR_MAGIC;
    params.hdr.loadflags |= KERNEL_LOADED_HIGH;
    params.hdr.cmd_line_ptr = CMDLINE_ADDR as u32;
    params.hdr.cmdline_size = cmdline_size;
    if let Some((addr, size)) = initrd {
        params.hdr.ramdisk_image = addr as u32;
        params.hdr.ramdisk_size = size as u32;
    }
    params.acpi_rsdp_addr = RSDP_ADDR;
    for (i, &(addr, size, r#type)) in map.iter().take(params.e820_table.len()).enumerate() {
        params.e820_table[i] = boot_e820_entry { addr, size, r#type };
    }
    params.e820_entries = map.len().min(params.e820_table.len()) as u8;
    LinuxBootConfigurator::write_bootparams(
        &BootParams::new(&params, GuestAddress(ZERO_PAGE_ADDR)),
        mem,
    )
    .map_err(|e| BootError::BootData(e.to_string()))
}
