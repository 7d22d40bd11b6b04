//! Why a guest could not be set up: every part of the boot fails with a
//! [`BootError`].

use thiserror::Error;

use crate::vmm::base::control_error::Fault;

use super::payload::{Format, PayloadError};

/// Why a guest could not be set up.
#[derive(Debug, Error)]
pub enum BootError {
    /// Guest memory size out of range.
    #[error("guest memory of {mib} MiB is out of range: give {min} to {max} MiB")]
    MemorySize {
        /// What was asked.
        mib: u64,
        /// The smallest guest lwpvmm boots.
        min: u64,
        /// The largest it accepts.
        max: u64,
    },
    /// The mmap of guest RAM failed.
    #[error("cannot allocate {0} MiB of guest memory: {1}")]
    MemoryAlloc(u64, vm_memory::mmap::FromRangesError),
    /// A snapshot's memory file could not be mapped.
    #[error("cannot map the snapshot's memory file: {0}")]
    MemoryFile(std::io::Error),
    /// The image is neither an ELF64 kernel nor a bzImage.
    #[error("the kernel is neither an x86-64 ELF nor a Linux bzImage ({elf}; {bzimage})")]
    KernelFormat {
        /// Why the ELF loader refused it.
        elf: linux_loader::loader::Error,
        /// Why the bzImage loader refused it.
        bzimage: linux_loader::loader::Error,
    },
    /// The image is for another architecture, or cannot run 64-bit.
    #[error(
        "the kernel {0}: lwpvmm boots x86-64 kernels (an ELF64 for x86-64, or a bzImage of a 64-bit kernel)"
    )]
    WrongArchitecture(String),
    /// The image did not fit in guest memory.
    #[error("cannot load the kernel ({0}): is guest memory large enough for it?")]
    KernelLoad(linux_loader::loader::Error),
    /// A bzImage's payload could not be decompressed on the host.
    #[error("the bzImage's kernel cannot be unpacked: {0}")]
    Payload(#[from] PayloadError),
    /// A bzImage's payload is not a 64-bit x86 ELF.
    #[error("the bzImage's {format} payload is not an x86-64 ELF: {source}")]
    PayloadElf {
        /// Its compression.
        format: Format,
        /// What the loader said.
        source: linux_loader::loader::Error,
    },
    /// The command line is invalid or too long.
    #[error("invalid kernel command line: {0}")]
    Cmdline(linux_loader::cmdline::Error),
    /// The initramfs does not fit.
    #[error(
        "the initramfs ({size} bytes) does not fit in guest memory below {limit:#x}: give the guest more memory"
    )]
    InitramfsTooLarge {
        /// Its size.
        size: u64,
        /// The highest address it may end at.
        limit: u64,
    },
    /// Writing boot data failed.
    #[error("cannot write boot data into guest memory: {0}")]
    BootData(String),
    /// A program for `lwpvmm profile` could not be loaded.
    #[error(
        "cannot load the program ({0}): it must be a static x86-64 ELF linked at 16 MiB or above (resources/examples/program.ld), and guest memory must cover it"
    )]
    Program(linux_loader::loader::Error),
    /// A program ends past what the runtime maps.
    #[error(
        "the program ends at {0:#x}, past 1 GiB: link it lower (resources/examples/program.ld)"
    )]
    ProgramPlacement(u64),
    /// A program linked at addresses other than where it loads (a kernel,
    /// or a program linked for an operating system).
    #[error(
        "the program's segment at virtual {vaddr:#x} loads at physical {paddr:#x}: the guest runtime maps programs where they load, between 16 MiB and 1 GiB, so link it there (resources/examples/program.ld); a kernel is booted with `lwpvmm run --kernel`"
    )]
    ProgramLinkage {
        /// The segment's virtual address.
        vaddr: u64,
        /// Its physical (load) address.
        paddr: u64,
    },
    /// The image file is shorter than its own headers say.
    #[error(
        "the kernel file is truncated: it has {size} bytes, its headers need {needed} (was it copied completely?)"
    )]
    Truncated {
        /// Bytes the headers describe.
        needed: u64,
        /// Bytes the file has.
        size: u64,
    },
}

impl BootError {
    /// Whose fault it was: the image or the sizes asked for, except guest
    /// RAM the host could not map or write.
    pub fn fault(&self) -> Fault {
        match self {
            BootError::MemoryAlloc(..) | BootError::MemoryFile(_) | BootError::BootData(_) => {
                Fault::Host
            }
            _ => Fault::Request,
        }
    }
}
