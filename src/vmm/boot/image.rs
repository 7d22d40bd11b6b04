//! Kernel images: reading one a user named, telling what it is (ELF with a
//! PVH note, ELF64, bzImage; another architecture; a truncated file; a
//! kernel that declares native supervisor mode) and loading it, a bzImage
//! from its payload decompressed here (`payload`); and `lwpvmm profile`'s
//! programs.

use std::io::Cursor;

use linux_loader::loader::{BzImage, Elf, KernelLoader, PvhBootCapability};
use vm_memory::{Address, ByteValued, GuestAddress};

use super::cpu::Entry;
use super::error::BootError;
use super::payload::{self, Format, PayloadError};
use crate::guard::GuestMemory;

/// A bzImage's setup header magic, "HdrS".
pub(super) const KERNEL_HDR_MAGIC: u32 = 0x5372_6448;

/// Reads a kernel or initramfs a user or an API client named, for a guest
/// of `memory_mib` MiB: a regular file (`crate::hostfs`), refused before
/// any byte is read when it is larger than the guest's RAM, which could not
/// hold it. Both front ends read their images here.
pub fn read_image(
    path: &std::path::Path,
    memory_mib: u64,
) -> Result<Vec<u8>, crate::hostfs::HostFsError> {
    crate::hostfs::read_input(
        path,
        memory_mib.saturating_mul(1 << 20),
        "the guest's RAM, which must hold it",
    )
}

/// Where the kernel image starts (1 MiB); lower memory holds boot data.
pub const KERNEL_START: u64 = 0x10_0000;

/// What loading put in memory.
#[derive(Debug, Clone, Copy)]
pub struct LoadedKernel {
    /// How to enter it.
    pub entry: Entry,
    /// First byte after the image.
    pub end: u64,
    /// A bzImage's setup header, which the zero page carries.
    pub(super) setup_header: Option<linux_loader::loader::bootparam::setup_header>,
    /// A bzImage whose payload the host decompressed: its format.
    pub decompressed: Option<Format>,
    /// The kernel takes virtio-mmio devices from its command line
    /// (`virtio_mmio.device=`, CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES, as the
    /// project's kernel): it names that parameter. One that does not finds
    /// them in the DSDT, as Debian's does. Describing them both ways would
    /// have a kernel that reads both register each device twice.
    pub cmdline_devices: bool,
    /// The kernel runs in the host's native supervisor mode: it declares
    /// itself able ([`declares_native`]) when loaded, and the builder
    /// clears this when the VM runs emulated. Its boot page tables are
    /// then user-accessible, as the mode needs.
    pub native: bool,
}

/// The ELF note by which a kernel declares that it runs in native
/// supervisor mode (docs/pv-abi.md, "Native supervisor mode"): name
/// `lwpvmm`, this type, a 4-byte description holding the version of the
/// mode's contract it follows.
pub const NATIVE_NOTE_TYPE: u32 = 0x4c57_4e01;
/// The note's name.
pub const NATIVE_NOTE_NAME: &[u8] = b"lwpvmm";
/// The contract's version a kernel's note must name.
pub const NATIVE_NOTE_VERSION: u32 = 1;

/// Whether an ELF kernel declares native supervisor mode: the lwpvmm note
/// with version 1 in one of its PT_NOTE segments. Only a 64-bit entry
/// (an ELF without a PVH note) can run native: the PVH entry starts with
/// paging off.
pub fn declares_native(image: &[u8]) -> bool {
    use object::read::elf::{FileHeader, ProgramHeader};
    let Ok(header) = object::elf::FileHeader64::<object::Endianness>::parse(image) else {
        return false;
    };
    let Ok(endian) = header.endian() else {
        return false;
    };
    let Ok(segments) = header.program_headers(endian, image) else {
        return false;
    };
    segments.iter().any(|segment| {
        let Ok(Some(mut notes)) = segment.notes(endian, image) else {
            return false;
        };
        while let Ok(Some(note)) = notes.next() {
            if note.name() == NATIVE_NOTE_NAME
                && note.n_type(endian) == object::elf::NoteType(NATIVE_NOTE_TYPE)
                && note.desc() == NATIVE_NOTE_VERSION.to_le_bytes()
            {
                return true;
            }
        }
        false
    })
}

/// Whether a kernel's bytes name the `virtio_mmio.device` parameter.
pub(super) fn names_cmdline_devices(kernel: &[u8]) -> bool {
    memchr::memmem::find(kernel, b"virtio_mmio.device").is_some()
}

/// Bytes an ELF's program headers and loadable segments need, when the
/// image is an ELF64 (`None` otherwise: another loader will say why).
pub(super) fn elf_needs(image: &[u8]) -> Option<u64> {
    use object::read::elf::{FileHeader, ProgramHeader};
    let header = object::elf::FileHeader64::<object::Endianness>::parse(image).ok()?;
    let endian = header.endian().ok()?;
    let phdrs_end = header
        .e_phoff(endian)
        .checked_add(u64::from(header.e_phnum(endian)) * u64::from(header.e_phentsize(endian)))?;
    let segments = header.program_headers(endian, image).ok();
    let data_end = segments
        .into_iter()
        .flatten()
        .filter(|p| p.p_type(endian) == object::elf::PT_LOAD)
        .map(|p| p.p_offset(endian).saturating_add(p.p_filesz(endian)))
        .max()
        .unwrap_or(0);
    Some(phdrs_end.max(data_end))
}

/// Bytes a bzImage's setup header says the image has (setup sectors plus
/// the protected-mode part), when the image carries the header.
pub(super) fn bzimage_needs(image: &[u8]) -> Option<u64> {
    let header = image.get(0x1f1..0x206)?;
    if u32::from_le_bytes(header[0x11..0x15].try_into().ok()?) != KERNEL_HDR_MAGIC {
        return None;
    }
    let setup_sects = match header[0] {
        0 => 4,
        n => u64::from(n),
    };
    let syssize = u64::from(u32::from_le_bytes(header[3..7].try_into().ok()?));
    Some((setup_sects + 1) * 512 + syssize * 16)
}

/// Refuses an image shorter than its headers say, before a loader blames
/// something else for the short read.
pub(super) fn check_complete(image: &[u8]) -> Result<(), BootError> {
    let size = image.len() as u64;
    match elf_needs(image).or_else(|| bzimage_needs(image)) {
        Some(needed) if needed > size => Err(BootError::Truncated { needed, size }),
        _ => Ok(()),
    }
}

/// The ELF machines a kernel is most often built for, by `e_machine`.
pub(super) const ELF_MACHINES: &[(u16, &str)] = &[
    (3, "i386 (32-bit x86)"),
    (8, "MIPS"),
    (20, "PowerPC"),
    (21, "PowerPC64"),
    (22, "s390"),
    (40, "32-bit ARM"),
    (62, "x86-64"),
    (183, "arm64 (AArch64)"),
    (243, "RISC-V"),
    (258, "LoongArch"),
];
pub(super) const EM_X86_64: u16 = 62;
/// A bzImage's setup header: the boot protocol version and xloadflags.
pub(super) const SETUP_VERSION: usize = 0x206;
pub(super) const SETUP_XLOADFLAGS: usize = 0x236;
/// xloadflags: the kernel has the 64-bit entry point at 0x200.
pub(super) const XLF_KERNEL_64: u16 = 1;
/// An arm64 Image's magic ("ARM\x64" at offset 0x38).
pub(super) const ARM64_IMAGE_MAGIC: &[u8; 4] = b"ARM\x64";

/// Refuses a kernel built for another machine or one that has no 64-bit
/// entry, naming what it is, before a loader blames guest memory.
pub(super) fn check_architecture(image: &[u8]) -> Result<(), BootError> {
    let wrong = |what: String| Err(BootError::WrongArchitecture(what));
    if image.starts_with(b"\x7fELF") {
        let class = match image.get(4) {
            Some(1) => "32-bit",
            Some(2) => "64-bit",
            _ => "unknown-class",
        };
        let machine = image
            .get(18..20)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .unwrap_or(0);
        let name = ELF_MACHINES
            .iter()
            .find(|(m, _)| *m == machine)
            .map_or_else(|| format!("machine {machine}"), |(_, n)| (*n).to_owned());
        return match (machine, class) {
            (EM_X86_64, "64-bit") => Ok(()),
            _ => wrong(format!("is a {class} ELF for {name}")),
        };
    }
    if image.get(0x38..0x3c) == Some(ARM64_IMAGE_MAGIC) {
        return wrong("is an arm64 (AArch64) Image".into());
    }
    let header = image
        .get(0x202..0x206)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    if header == Some(KERNEL_HDR_MAGIC) {
        let u16_at = |o: usize| {
            image
                .get(o..o + 2)
                .map_or(0, |b| u16::from_le_bytes([b[0], b[1]]))
        };
        let version = u16_at(SETUP_VERSION);
        if version < 0x020c {
            return wrong(format!(
                "is a bzImage of boot protocol {}.{:02}, older than 2.12: it says nothing of a 64-bit entry",
                version >> 8,
                version & 0xff
            ));
        }
        if u16_at(SETUP_XLOADFLAGS) & XLF_KERNEL_64 == 0 {
            return wrong(
                "is a bzImage without a 64-bit entry (XLF_KERNEL_64 is clear in its setup header: a 32-bit kernel)".into(),
            );
        }
    }
    Ok(())
}

/// Loads `image` (ELF first, bzImage when it is not an ELF).
pub fn load_kernel(mem: &GuestMemory, image: &[u8]) -> Result<LoadedKernel, BootError> {
    check_architecture(image)?;
    check_complete(image)?;
    let start = Some(GuestAddress(KERNEL_START));
    let elf = match Elf::load(mem, None, &mut Cursor::new(image), start) {
        Ok(r) => {
            let entry = match r.pvh_boot_cap {
                PvhBootCapability::PvhEntryPresent(addr) => Entry::Pvh(addr.raw_value()),
                _ => Entry::Linux64(r.kernel_load.raw_value()),
            };
            return Ok(LoadedKernel {
                native: matches!(entry, Entry::Linux64(_)) && declares_native(image),
                entry,
                end: r.kernel_end,
                setup_header: None,
                decompressed: None,
                cmdline_devices: names_cmdline_devices(image),
            });
        }
        Err(linux_loader::loader::Error::Elf(
            e @ (linux_loader::loader::elf::Error::InvalidElfMagicNumber
            | linux_loader::loader::elf::Error::ReadElfHeader),
        )) => linux_loader::loader::Error::Elf(e),
        Err(e) => return Err(BootError::KernelLoad(e)),
    };
    // A bzImage: its payload is decompressed here, in milliseconds, rather
    // than by its own decompressor in the guest, which a host that
    // emulates guest CPL0 runs for minutes.
    match payload::decompress(image) {
        Ok(kernel) => return load_payload(mem, image, kernel),
        Err(PayloadError::NotBzImage) => {}
        Err(e @ PayloadError::UnknownFormat { .. }) => log::warn!(
            "the bzImage's kernel is left to its own decompressor in the guest ({e}); where KVM emulates guest CPL0 that takes minutes"
        ),
        Err(e) => return Err(e.into()),
    }
    match BzImage::load(mem, None, &mut Cursor::new(image), start) {
        Ok(r) => Ok(LoadedKernel {
            entry: Entry::Linux64(r.kernel_load.raw_value() + 0x200),
            end: r.kernel_end,
            setup_header: r.setup_header,
            decompressed: None,
            // What its payload holds is not known here: the command line,
            // as before.
            cmdline_devices: true,
            native: false,
        }),
        Err(bzimage) => Err(BootError::KernelFormat { elf, bzimage }),
    }
}

/// Loads the ELF a bzImage's payload held, to be entered at its
/// `startup_64` through the 64-bit boot protocol with the bzImage's own
/// setup header, as its decompressor would have entered it (at the
/// physical address it is linked for: no KASLR without the decompressor).
pub(super) fn load_payload(
    mem: &GuestMemory,
    image: &[u8],
    kernel: payload::Kernel,
) -> Result<LoadedKernel, BootError> {
    let format = kernel.format;
    let r = Elf::load(
        mem,
        None,
        &mut Cursor::new(&kernel.bytes),
        Some(GuestAddress(KERNEL_START)),
    )
    .map_err(|source| BootError::PayloadElf { format, source })?;
    let mut header = linux_loader::loader::bootparam::setup_header::default();
    let at = SETUP_HEADER_OFFSET;
    let len = header.as_slice().len();
    if let Some(bytes) = image.get(at..at + len) {
        header.as_mut_slice().copy_from_slice(bytes);
    }
    log::info!(
        "the bzImage's {format} payload was decompressed on the host ({} bytes)",
        kernel.bytes.len()
    );
    Ok(LoadedKernel {
        entry: Entry::Linux64(r.kernel_load.raw_value()),
        end: r.kernel_end,
        setup_header: Some(header),
        decompressed: Some(format),
        cmdline_devices: names_cmdline_devices(&kernel.bytes),
        native: declares_native(&kernel.bytes),
    })
}

/// Where a bzImage's setup header starts.
pub(super) const SETUP_HEADER_OFFSET: usize = 0x1f1;

/// Where a program for `lwpvmm profile` may start: above the guest runtime
/// and its 4 KiB test window.
pub const PROGRAM_START: u64 = 0x100_0000;
/// Where it must end: the runtime maps user pages up to 1 GiB.
pub const PROGRAM_END: u64 = 0x4000_0000;

/// Loads a user's freestanding program (an x86-64 ELF linked between 16 MiB
/// and 1 GiB) for the profile host guest; returns its entry point.
pub fn load_program(mem: &GuestMemory, image: &[u8]) -> Result<u64, BootError> {
    check_linkage(image)?;
    let r = Elf::load(
        mem,
        None,
        &mut Cursor::new(image),
        Some(GuestAddress(PROGRAM_START)),
    )
    .map_err(BootError::Program)?;
    if r.kernel_end > PROGRAM_END {
        return Err(BootError::ProgramPlacement(r.kernel_end));
    }
    Ok(r.kernel_load.raw_value())
}

/// Refuses a program whose loadable segments are linked at other virtual
/// addresses than where they load: the runtime's identity map would run it
/// at the wrong place.
pub(super) fn check_linkage(image: &[u8]) -> Result<(), BootError> {
    use object::read::elf::{FileHeader, ProgramHeader};
    let Ok(header) = object::elf::FileHeader64::<object::Endianness>::parse(image) else {
        return Ok(());
    };
    let Ok(endian) = header.endian() else {
        return Ok(());
    };
    let segments = header.program_headers(endian, image).unwrap_or(&[]);
    match segments
        .iter()
        .filter(|p| p.p_type(endian) == object::elf::PT_LOAD)
        .map(|p| (p.p_vaddr(endian), p.p_paddr(endian)))
        .find(|(v, p)| v != p)
    {
        Some((vaddr, paddr)) => Err(BootError::ProgramLinkage { vaddr, paddr }),
        None => Ok(()),
    }
}
