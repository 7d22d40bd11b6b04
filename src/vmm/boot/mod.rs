//! Booting a guest: guest RAM with the MMIO hole (`memory`), the command
//! line (`cmdline`), the kernel image and its loading through linux-loader
//! (`image`, with a bzImage's payload decompressed in `payload`), the boot
//! information each protocol needs (`params`: PVH start_info, Linux
//! boot_params), and the boot vCPU's descriptor table, page tables and
//! first registers (`cpu`), and what goes wrong (`error`). Each part is re-exported here, so a caller
//! names `boot::load_kernel` whichever file holds it.

mod cmdline;
mod cpu;
mod error;
mod image;
mod memory;
mod params;
pub mod payload;
#[cfg(test)]
mod tests;

pub use cmdline::{
    KERNEL_BUILTIN_CMDLINE, LINUX_CMDLINE, STOCK_CMDLINE, default_cmdline, disk_cmdline,
    host_words, is_our_build,
};
pub use cpu::{Entry, initial_state, write_gdt};
pub use error::BootError;
pub use image::{
    KERNEL_START, LoadedKernel, NATIVE_NOTE_NAME, NATIVE_NOTE_TYPE, NATIVE_NOTE_VERSION,
    PROGRAM_END, PROGRAM_START, declares_native, load_kernel, load_program, read_image,
};
pub use memory::{
    MAX_MEMORY_MIB, MIN_MEMORY_MIB, MMIO_HOLE_END, MMIO_HOLE_START, create_memory, map_file,
    memory_from_file, ram_ranges,
};
pub use params::write_boot_info;
