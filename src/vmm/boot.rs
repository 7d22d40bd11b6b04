//! Booting a guest: guest RAM with the MMIO hole, kernel loading through
//! linux-loader (ELF with a PVH note, ELF64 without one, Linux bzImage), the
//! boot information each protocol needs (PVH start_info, Linux boot_params),
//! and the initial register state of the boot vCPU.

use std::io::Cursor;

use kvm_bindings::{kvm_regs, kvm_sregs};

use crate::vmm::vcpu::segment::segment;
use linux_loader::configurator::linux::LinuxBootConfigurator;
use linux_loader::configurator::pvh::PvhBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::bootparam::{boot_e820_entry, boot_params};
use linux_loader::loader::elf::start_info::{
    hvm_memmap_table_entry, hvm_modlist_entry, hvm_start_info,
};
use linux_loader::loader::{BzImage, Cmdline, Elf, KernelLoader, PvhBootCapability, load_cmdline};
use thiserror::Error;
use vm_memory::{Address, ByteValued, Bytes, GuestAddress, GuestMemoryBackend};

use crate::guard::GuestMemory;
use crate::guard::pagetable::PteFlags;
use crate::vmm::devices::acpi::{ACPI_END, ACPI_START, AcpiTables, MmioDevice, RSDP_ADDR};
use crate::vmm::payload::{self, Format, PayloadError};
use crate::vmm::snapshot;

/// Start of the MMIO hole below 4 GiB (LAPIC, IOAPIC and friends live there).
pub const MMIO_HOLE_START: u64 = 0xC000_0000;
/// End of the MMIO hole.
pub const MMIO_HOLE_END: u64 = 0x1_0000_0000;
/// The smallest guest lwpvmm boots.
pub const MIN_MEMORY_MIB: u64 = 16;
/// The largest guest RAM lwpvmm accepts.
pub const MAX_MEMORY_MIB: u64 = 1 << 20;

const GDT_ADDR: u64 = 0x500;
const PVH_INFO_ADDR: u64 = 0x6000;
const PVH_MODLIST_ADDR: u64 = 0x6040;
const PVH_MEMMAP_ADDR: u64 = 0x6080;
const ZERO_PAGE_ADDR: u64 = 0x7000;
/// The Linux 64-bit entry's page tables: six pages, below 0x10000.
const PAGE_TABLES: u64 = 0x9000;
const CMDLINE_ADDR: u64 = 0x20000;
const CMDLINE_MAX: usize = 4096;
/// The default command line of `lwpvmm run`, for the Linux guest kernel
/// built by resources/linux/build.sh. The console is the 8250 at 0x3f8;
/// `reboot=k` reboots through the keyboard controller, which lwpvmm turns
/// into the end of the VM, as it does `panic=-1`'s reboot. The rest works
/// around kvm_pvm, whose CPL0 emulation is slow and incomplete: clearcpuid
/// hides features whose instructions its emulator cannot run (XSAVE is the
/// one that matters; CLAC/STAC, POPCNT and friends would otherwise need
/// emulating in lwpvmm). What the kernel needs on lwpvmm whatever the host
/// is built into it ([`KERNEL_BUILTIN_CMDLINE`]), not here. `noreplace-smp`
/// and `percpu_alloc=page` answer the whole-guest
/// profile of a boot: one vCPU's kernel rewrote every LOCK prefix
/// (`alternatives_smp_module_add`, 6% of it), and each vCPU's per-CPU area
/// was a zeroed 2 MiB unit (`pcpu_embed_first_chunk`, 6%). docs/linux-guest.md
/// has the details.
pub const LINUX_CMDLINE: &str = "console=ttyS0 reboot=k panic=-1 rdinit=/init \
     clearcpuid=145,150,151,154,288,291,296,297,298,308,534,580 \
     no_timer_check rodata=off noreplace-smp percpu_alloc=page";
/// The command line built into the project's kernel (CONFIG_CMDLINE in
/// resources/linux/lwpvmm.config), ahead of the boot loader's, whose words
/// then win: what it needs on lwpvmm on any host, so that a command line
/// of a user's own keeps it. Only `nompscan` (patch 0003: lwpvmm has no MP
/// table). The host's words cannot be built in: Linux 6.1 reads
/// `clearcpuid=` in `early_cpu_init`, before `setup_arch` merges the
/// built-in line, so lwpvmm adds them ([`host_words`]).
pub const KERNEL_BUILTIN_CMDLINE: &str = "nompscan";
/// The default command line of `lwpvmm run` for any other kernel (a
/// distribution's): the console and the VM's end as for ours, and what keeps
/// it off the paths a host that emulates guest CPL0 makes slow or cannot
/// run: no crypto self-tests (`cryptomgr.notests`: over 20 minutes of
/// emulated generic C), the CPU features whose instructions the emulator
/// lacks hidden (ours, and the SIMD extensions a distribution kernel's
/// built-in crypto would use at CPL0: its emulator runs no SSE), and the
/// command-line choices of our own kernel that cost nothing on ordinary
/// KVM; two boot-time checks of the tracing code that its whole-guest
/// profile put at 16% of a boot are left out (`initcall_blacklist`).
/// docs/linux-guest.md ("The command line") has each part.
pub const STOCK_CMDLINE: &str = "console=ttyS0 reboot=k panic=-1 cryptomgr.notests \
     clearcpuid=129,137,145,147,148,150,151,153,154,288,291,296,297,298,307,308,317,520,534,580 \
     no_timer_check rodata=off noreplace-smp percpu_alloc=page \
     initcall_blacklist=ftrace_check_for_weak_functions,trace_eval_init,cubictcp_register,\
     bpf_tcp_ca_kfunc_init,bpf_key_sig_kfuncs_init,bpf_rstat_kfunc_init,kfunc_init,\
     bpf_prog_test_run_init";

/// What the project's build of its Linux guest leaves in the kernel's
/// banner (resources/linux/build.sh's KBUILD_BUILD_USER and _HOST), in a
/// vmlinux and in a bzImage's uncompressed `kernel_version` string alike.
const OUR_BUILD: &[u8] = b"(lwpvmm@lwpvmm)";

/// Whether `image` is the project's own kernel build.
pub fn is_our_build(image: &[u8]) -> bool {
    memchr::memmem::find(image, OUR_BUILD).is_some()
}

/// The words of a command line that are the user's choice whatever the
/// host: [`host_words`] never adds them.
const CLIENT_KEYS: [&str; 4] = ["console", "reboot", "panic", "rdinit"];

/// The words of [`LINUX_CMDLINE`] that `cmdline` lacks and that our kernel
/// needs on a host that emulates its CPL0 (kvm_pvm): the CPU features whose
/// instructions the emulator lacks hidden (`clearcpuid=`: without it the
/// kernel dies on XRSTOR), and the boot-time paths the emulator makes slow
/// left out. A word whose key (before `=`) the line has already is the
/// user's, as are the console and the VM's end ([`CLIENT_KEYS`]): a
/// Firecracker client's `boot_args` still count.
pub fn host_words(cmdline: &str) -> Vec<&'static str> {
    let key = |word: &str| word.split('=').next().unwrap_or(word).to_owned();
    let given: std::collections::HashSet<String> = cmdline.split_whitespace().map(key).collect();
    LINUX_CMDLINE
        .split_whitespace()
        .filter(|w| {
            let k = key(w);
            !CLIENT_KEYS.contains(&k.as_str()) && !given.contains(&k)
        })
        .collect()
}

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

/// `lwpvmm run`'s default command line for `image`: ours for the project's
/// kernel, [`STOCK_CMDLINE`] for any other; with a root disk, booting from
/// the first disk (/dev/vda), read-only when the disk is.
pub fn default_cmdline(image: &[u8], root: Option<bool>) -> String {
    match (is_our_build(image), root) {
        (true, None) => LINUX_CMDLINE.to_owned(),
        (true, Some(read_only)) => disk_cmdline(read_only),
        (false, None) => STOCK_CMDLINE.to_owned(),
        // Another kernel's root boots its own init.
        (false, Some(read_only)) => format!("{STOCK_CMDLINE} {}", root_args(read_only)),
    }
}

/// The command line that boots the project's kernel from the first disk
/// (/dev/vda) instead of an initramfs, mounted read-only when the disk is;
/// its /init is the self-test.
pub fn disk_cmdline(read_only: bool) -> String {
    format!("{LINUX_CMDLINE} {} init=/init", root_args(read_only))
}

/// The root file system on the first disk, read-only when the disk is.
fn root_args(read_only: bool) -> &'static str {
    if read_only {
        "root=/dev/vda ro"
    } else {
        "root=/dev/vda rw"
    }
}
/// Where the kernel image starts (1 MiB); lower memory holds boot data.
pub const KERNEL_START: u64 = 0x10_0000;

const E820_RAM: u32 = 1;
const E820_RESERVED: u32 = 2;
/// Where the extended BIOS data area usually starts: RAM below 1 MiB ends
/// there.
const EBDA_START: u64 = 0x9_FC00;
const PVH_MAGIC: u32 = 0x336e_c578;
const BOOT_LOADER_UNDEFINED: u8 = 0xff;
const KERNEL_LOADED_HIGH: u8 = 0x01;
const KERNEL_BOOT_FLAG_MAGIC: u16 = 0xaa55;
const KERNEL_HDR_MAGIC: u32 = 0x5372_6448;

/// Why a guest could not be set up.
#[derive(Debug, Error)]
pub enum BootError {
    /// Guest memory size out of range.
    #[error(
        "guest memory of {0} MiB is out of range: give {MIN_MEMORY_MIB} to {MAX_MEMORY_MIB} MiB"
    )]
    MemorySize(u64),
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

/// How the boot vCPU enters the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// PVH: 32-bit protected mode, paging off, RBX = start_info.
    Pvh(u64),
    /// Linux 64-bit boot protocol: long mode, identity map, RSI = boot_params.
    Linux64(u64),
}

/// RAM ranges for `mib` MiB: below the MMIO hole, then above 4 GiB.
pub fn ram_ranges(mib: u64) -> Result<Vec<(GuestAddress, usize)>, BootError> {
    if !(MIN_MEMORY_MIB..=MAX_MEMORY_MIB).contains(&mib) {
        return Err(BootError::MemorySize(mib));
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
/// [`snapshot::map_file`]).
pub fn memory_from_file(mib: u64, file: &std::fs::File) -> Result<GuestMemory, BootError> {
    snapshot::map_file(&ram_ranges(mib)?, file).map_err(BootError::MemoryFile)
}

/// What loading put in memory.
#[derive(Debug, Clone, Copy)]
pub struct LoadedKernel {
    /// How to enter it.
    pub entry: Entry,
    /// First byte after the image.
    pub end: u64,
    setup_header: Option<linux_loader::loader::bootparam::setup_header>,
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
fn names_cmdline_devices(kernel: &[u8]) -> bool {
    memchr::memmem::find(kernel, b"virtio_mmio.device").is_some()
}

/// Bytes an ELF's program headers and loadable segments need, when the
/// image is an ELF64 (`None` otherwise: another loader will say why).
fn elf_needs(image: &[u8]) -> Option<u64> {
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
fn bzimage_needs(image: &[u8]) -> Option<u64> {
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
fn check_complete(image: &[u8]) -> Result<(), BootError> {
    let size = image.len() as u64;
    match elf_needs(image).or_else(|| bzimage_needs(image)) {
        Some(needed) if needed > size => Err(BootError::Truncated { needed, size }),
        _ => Ok(()),
    }
}

/// The ELF machines a kernel is most often built for, by `e_machine`.
const ELF_MACHINES: &[(u16, &str)] = &[
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
const EM_X86_64: u16 = 62;
/// A bzImage's setup header: the boot protocol version and xloadflags.
const SETUP_VERSION: usize = 0x206;
const SETUP_XLOADFLAGS: usize = 0x236;
/// xloadflags: the kernel has the 64-bit entry point at 0x200.
const XLF_KERNEL_64: u16 = 1;
/// An arm64 Image's magic ("ARM\x64" at offset 0x38).
const ARM64_IMAGE_MAGIC: &[u8; 4] = b"ARM\x64";

/// Refuses a kernel built for another machine or one that has no 64-bit
/// entry, naming what it is, before a loader blames guest memory.
fn check_architecture(image: &[u8]) -> Result<(), BootError> {
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
fn load_payload(
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
const SETUP_HEADER_OFFSET: usize = 0x1f1;

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
fn check_linkage(image: &[u8]) -> Result<(), BootError> {
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
fn memory_map(ram: &[(u64, u64)]) -> Vec<(u64, u64, u32)> {
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

fn place_initramfs(
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

fn write_pvh(
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

fn write_linux(
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

/// The boot GDT: null, 64-bit code (0x08), data (0x10), 32-bit code (0x18).
const GDT: [u64; 4] = [
    0,
    0x00af_9b00_0000_ffff,
    0x00cf_9300_0000_ffff,
    0x00cf_9b00_0000_ffff,
];
const SEL_CODE64: u16 = 0x08;
const SEL_DATA: u16 = 0x10;
const SEL_CODE32: u16 = 0x18;

fn build_identity_map(mem: &GuestMemory, native: bool) -> Result<(), BootError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::{Access, GuestView, Paging, PagingCaps};

    #[test]
    fn ram_layout_skips_the_mmio_hole() {
        let table: [(u64, Vec<(u64, usize)>); 3] = [
            (64, vec![(0, 64 << 20)]),
            (3072, vec![(0, 3 << 30)]),
            (4096, vec![(0, 3 << 30), (1 << 32, 1 << 30)]),
        ];
        for (mib, want) in table {
            let got: Vec<(u64, usize)> = ram_ranges(mib)
                .unwrap()
                .into_iter()
                .map(|(a, s)| (a.raw_value(), s))
                .collect();
            assert_eq!(got, want, "{mib} MiB");
        }
        for bad in [0, 15, MAX_MEMORY_MIB + 1] {
            let err = ram_ranges(bad).unwrap_err();
            assert!(matches!(err, BootError::MemorySize(n) if n == bad), "{err}");
        }
    }

    #[test]
    fn the_memory_map_reserves_the_acpi_area() {
        // (RAM ranges, e820 entries as (start, length, type))
        type Row = (Vec<(u64, u64)>, Vec<(u64, u64, u32)>);
        let table: [Row; 2] = [
            (
                vec![(0, 64 << 20)],
                vec![
                    (0, EBDA_START, E820_RAM),
                    (ACPI_START, ACPI_END - ACPI_START, E820_RESERVED),
                    (ACPI_END, (64 << 20) - ACPI_END, E820_RAM),
                ],
            ),
            (
                vec![(0, MMIO_HOLE_START), (MMIO_HOLE_END, 1 << 30)],
                vec![
                    (0, EBDA_START, E820_RAM),
                    (ACPI_START, ACPI_END - ACPI_START, E820_RESERVED),
                    (ACPI_END, MMIO_HOLE_START - ACPI_END, E820_RAM),
                    (MMIO_HOLE_END, 1 << 30, E820_RAM),
                ],
            ),
        ];
        for (ram, want) in table {
            assert_eq!(memory_map(&ram), want);
        }
    }

    #[test]
    fn a_users_line_gets_the_words_the_host_needs_and_keeps_its_own() {
        let clear = LINUX_CMDLINE
            .split_whitespace()
            .find(|w| w.starts_with("clearcpuid="))
            .unwrap();
        // (the line, a word it must get, a word it must not)
        let table = [
            ("console=ttyS0 reboot=k panic=1 pci=off", clear, "panic=-1"),
            (
                "console=ttyS0 reboot=k panic=1 pci=off",
                "no_timer_check",
                "console=ttyS0",
            ),
            (
                "clearcpuid=154 quiet",
                "rodata=off",
                "clearcpuid=145,150,151,154,288,291,296,297,298,308,534,580",
            ),
            ("", "percpu_alloc=page", "rdinit=/init"),
        ];
        for (line, added, kept_out) in table {
            let words = host_words(line);
            assert!(words.contains(&added), "{line:?}: {words:?}");
            assert!(!words.contains(&kept_out), "{line:?}: {words:?}");
        }
        assert!(host_words(LINUX_CMDLINE).is_empty());
    }

    #[test]
    fn the_kernels_built_in_line_is_the_configs_and_not_repeated() {
        let config = include_str!("../../resources/linux/lwpvmm.config");
        let line = format!("CONFIG_CMDLINE=\"{KERNEL_BUILTIN_CMDLINE}\"");
        assert!(
            config.lines().any(|l| l == line),
            "lwpvmm.config lacks {line}"
        );
        assert!(config.lines().any(|l| l == "CONFIG_CMDLINE_BOOL=y"));
        for word in KERNEL_BUILTIN_CMDLINE.split_whitespace() {
            assert!(
                !LINUX_CMDLINE.split_whitespace().any(|w| w == word),
                "{word} is built in and also in LINUX_CMDLINE"
            );
        }
    }

    #[test]
    fn a_kernel_declares_native_mode_by_its_note_and_a_64_bit_entry() {
        // (guest, declares native supervisor mode)
        let table = [("native", true), ("minimal", false), ("demo", false)];
        for (name, native) in table {
            let image = crate::guests::get(name).unwrap();
            assert_eq!(declares_native(image), native, "{name}");
            let mem = create_memory(64).unwrap();
            assert_eq!(load_kernel(&mem, image).unwrap().native, native, "{name}");
        }
        // The note's version must be 1: a later contract is not this one.
        let mut image = crate::guests::get("native").unwrap().to_vec();
        let at = image
            .windows(8)
            .position(|w| w == b"lwpvmm\0\0")
            .expect("the note's name")
            + 8;
        image[at..at + 4].copy_from_slice(&2u32.to_le_bytes());
        assert!(!declares_native(&image));
        assert!(!declares_native(b"not an ELF"));
    }

    #[test]
    fn the_native_pages_are_not_ram_in_the_memory_map() {
        use crate::vmm::vcpu::native::{PAGES_END, PAGES_START};
        for (start, size, kind) in memory_map(&[(0, 64 << 20)]) {
            let overlaps = start < PAGES_END && start + size > PAGES_START;
            assert!(
                !(overlaps && kind == E820_RAM),
                "{start:#x}+{size:#x} is RAM over the native pages"
            );
        }
    }

    #[test]
    fn embedded_guest_boots_through_pvh() {
        let mem = create_memory(64).unwrap();
        let k = load_kernel(&mem, crate::guests::get("minimal").unwrap()).unwrap();
        assert!(matches!(k.entry, Entry::Pvh(0x10_0000)), "{:?}", k.entry);
        write_boot_info(&mem, &k, "console=ttyS0", Some(&[7u8; 4096]), 2, &[]).unwrap();
        let info: hvm_start_info = mem.read_obj(GuestAddress(PVH_INFO_ADDR)).unwrap();
        assert_eq!(info.magic, PVH_MAGIC);
        assert_eq!(info.rsdp_paddr, RSDP_ADDR);
        assert_eq!(info.memmap_entries, 3);
        let mut signature = [0u8; 8];
        mem.read_slice(&mut signature, GuestAddress(RSDP_ADDR))
            .unwrap();
        assert_eq!(&signature, b"RSD PTR ");
        assert_eq!(info.nr_modules, 1);
        let module: hvm_modlist_entry = mem.read_obj(GuestAddress(info.modlist_paddr)).unwrap();
        assert_eq!(module.size, 4096);
        assert_eq!(mem.read_obj::<u8>(GuestAddress(module.paddr)).unwrap(), 7);
        let mut cl = [0u8; 14];
        mem.read_slice(&mut cl, GuestAddress(info.cmdline_paddr))
            .unwrap();
        assert_eq!(&cl, b"console=ttyS0\0");
        let (regs, sregs) = initial_state(k.entry, kvm_sregs::default());
        assert_eq!((regs.rip, regs.rbx), (0x10_0000, PVH_INFO_ADDR));
        assert_eq!(
            (sregs.cs.db, sregs.cs.l, sregs.cr0 & 0x8000_0001),
            (1, 0, 1)
        );
    }

    /// A bzImage with a 4-sector setup and a 4 KiB "kernel" of 0xC3 bytes.
    fn synthetic_bzimage() -> Vec<u8> {
        let mut img = vec![0u8; 5 * 512 + 4096];
        img[0x1F1] = 4;
        img[0x1FE..0x200].copy_from_slice(&KERNEL_BOOT_FLAG_MAGIC.to_le_bytes());
        img[0x202..0x206].copy_from_slice(&KERNEL_HDR_MAGIC.to_le_bytes());
        img[0x206..0x208].copy_from_slice(&0x020Fu16.to_le_bytes());
        img[0x211] = KERNEL_LOADED_HIGH;
        img[0x214..0x218].copy_from_slice(&(KERNEL_START as u32).to_le_bytes());
        img[SETUP_XLOADFLAGS] = XLF_KERNEL_64 as u8;
        img[5 * 512..].fill(0xC3);
        img
    }

    #[test]
    fn kernels_for_other_machines_are_named() {
        let elf = |class: u8, machine: u16| {
            let mut h = vec![0u8; 64];
            h[..4].copy_from_slice(b"\x7fELF");
            h[4] = class;
            h[5] = 1;
            h[18..20].copy_from_slice(&machine.to_le_bytes());
            h
        };
        let bz = |version: u16, flags: u8| {
            let mut img = synthetic_bzimage();
            img[SETUP_VERSION..SETUP_VERSION + 2].copy_from_slice(&version.to_le_bytes());
            img[SETUP_XLOADFLAGS] = flags;
            img
        };
        let mut arm64_image = vec![0u8; 0x1000];
        arm64_image[0x38..0x3c].copy_from_slice(ARM64_IMAGE_MAGIC);
        // (image, what the error says, or None when the check passes)
        let table: Vec<(Vec<u8>, Option<&str>)> = vec![
            (elf(2, 62), None),
            (elf(2, 183), Some("is a 64-bit ELF for arm64 (AArch64)")),
            (elf(1, 3), Some("is a 32-bit ELF for i386 (32-bit x86)")),
            (elf(1, 62), Some("is a 32-bit ELF for x86-64")),
            (elf(2, 999), Some("machine 999")),
            (arm64_image, Some("is an arm64 (AArch64) Image")),
            (bz(0x020f, 1), None),
            (bz(0x020f, 0), Some("XLF_KERNEL_64 is clear")),
            (bz(0x020a, 1), Some("boot protocol 2.10, older than 2.12")),
        ];
        for (image, want) in table {
            match (check_architecture(&image), want) {
                (Ok(()), None) => {}
                (Err(e), Some(text)) => assert!(e.to_string().contains(text), "{e}"),
                (got, want) => panic!("{want:?}: {got:?}"),
            }
        }
    }

    #[test]
    fn bzimage_boots_through_the_linux_protocol() {
        let mem = create_memory(64).unwrap();
        let k = load_kernel(&mem, &synthetic_bzimage()).unwrap();
        assert_eq!(
            k.entry,
            Entry::Linux64(KERNEL_START + 0x200),
            "64-bit entry"
        );
        assert_eq!(k.end, KERNEL_START + 4096);
        assert_eq!(
            mem.read_obj::<u8>(GuestAddress(KERNEL_START)).unwrap(),
            0xC3
        );
        write_boot_info(&mem, &k, "console=ttyS0", None, 1, &[]).unwrap();
        let params: boot_params = mem.read_obj(GuestAddress(ZERO_PAGE_ADDR)).unwrap();
        assert_eq!({ params.hdr.header }, KERNEL_HDR_MAGIC);
        assert_eq!(
            { params.hdr.version },
            0x020F,
            "the kernel's own setup header"
        );
        assert_eq!(params.hdr.type_of_loader, BOOT_LOADER_UNDEFINED);
        assert_eq!({ params.hdr.cmdline_size }, 14);
        assert_eq!({ params.hdr.ramdisk_size }, 0);
    }

    #[test]
    fn elf_without_pvh_note_boots_in_long_mode() {
        let mut elf = crate::guests::get("minimal").unwrap().to_vec();
        let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
        let phentsize = usize::from(u16::from_le_bytes([elf[0x36], elf[0x37]]));
        let phnum = usize::from(u16::from_le_bytes([elf[0x38], elf[0x39]]));
        let mut notes = 0;
        for i in 0..phnum {
            let at = phoff + i * phentsize;
            if elf[at..at + 4] == 4u32.to_le_bytes() {
                elf[at..at + 4].copy_from_slice(&0u32.to_le_bytes());
                notes += 1;
            }
        }
        assert_eq!(notes, 1, "the guest has one PT_NOTE");
        let mem = create_memory(64).unwrap();
        let k = load_kernel(&mem, &elf).unwrap();
        assert_eq!(
            k.entry,
            Entry::Linux64(KERNEL_START),
            "e_entry, 64-bit protocol"
        );
    }

    #[test]
    fn programs_load_above_the_runtime() {
        let mem = create_memory(64).unwrap();
        let entry = load_program(&mem, crate::guests::get("example-hot").unwrap()).unwrap();
        assert_eq!(entry, PROGRAM_START);
        let low = load_program(&mem, crate::guests::get("minimal").unwrap()).unwrap_err();
        assert!(matches!(low, BootError::Program(_)), "{low}");
        assert!(low.to_string().contains("16 MiB"));
    }

    /// Offsets of each PT_LOAD program header in an ELF64.
    fn load_headers(elf: &[u8]) -> Vec<usize> {
        let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
        let phentsize = usize::from(u16::from_le_bytes([elf[0x36], elf[0x37]]));
        let phnum = usize::from(u16::from_le_bytes([elf[0x38], elf[0x39]]));
        (0..phnum)
            .map(|i| phoff + i * phentsize)
            .filter(|&at| elf[at..at + 4] == 1u32.to_le_bytes())
            .collect()
    }

    #[test]
    fn truncated_images_are_called_truncated() {
        let elf = crate::guests::get("minimal").unwrap().to_vec();
        let mut bz = synthetic_bzimage();
        bz[0x1F4..0x1F8].copy_from_slice(&(4096u32 / 16).to_le_bytes());
        // (image, refused as truncated)
        let table: [(Vec<u8>, bool); 5] = [
            (elf.clone(), false),
            (elf[..elf.len() / 2].to_vec(), true),
            (elf[..0x50].to_vec(), true),
            (bz.clone(), false),
            (bz[..3000].to_vec(), true),
        ];
        for (i, (image, truncated)) in table.into_iter().enumerate() {
            let mem = create_memory(64).unwrap();
            let result = load_kernel(&mem, &image);
            assert_eq!(
                matches!(result, Err(BootError::Truncated { .. })),
                truncated,
                "case {i}: {:?}",
                result.err().map(|e| e.to_string())
            );
        }
    }

    #[test]
    fn programs_linked_elsewhere_are_refused_with_the_reason() {
        let mut elf = crate::guests::get("example-hot").unwrap().to_vec();
        for at in load_headers(&elf) {
            let vaddr = u64::from_le_bytes(elf[at + 0x10..at + 0x18].try_into().unwrap());
            let kernel_half = vaddr | 0xffff_ffff_8000_0000;
            elf[at + 0x10..at + 0x18].copy_from_slice(&kernel_half.to_le_bytes());
        }
        let mem = create_memory(64).unwrap();
        let err = load_program(&mem, &elf).unwrap_err();
        assert!(matches!(err, BootError::ProgramLinkage { .. }), "{err}");
        assert!(err.to_string().contains("lwpvmm run --kernel"), "{err}");
    }

    #[test]
    fn a_bzimage_is_booted_from_its_payload_decompressed_here() {
        use crate::vmm::payload::tests::{bzimage, compress};
        let elf = crate::guests::get("demo").unwrap();
        let entry = {
            let mem = create_memory(64).unwrap();
            match load_kernel(&mem, elf).unwrap().entry {
                Entry::Pvh(e) | Entry::Linux64(e) => e,
            }
        };
        let mem = create_memory(64).unwrap();
        let image = bzimage(&compress(Format::Zstd, elf));
        let k = load_kernel(&mem, &image).unwrap();
        assert_eq!(k.decompressed, Some(Format::Zstd));
        assert_eq!(
            k.entry,
            Entry::Linux64(entry),
            "the ELF's own entry, 64-bit"
        );
        // The bzImage's setup header goes to the zero page.
        write_boot_info(&mem, &k, "", None, 1, &[]).unwrap();
        let params: boot_params = mem.read_obj(GuestAddress(ZERO_PAGE_ADDR)).unwrap();
        assert_eq!({ params.hdr.version }, 0x020f);
        assert_eq!({ params.hdr.xloadflags }, 1);
        // A payload lwpvmm cannot read fails with the reason; an unknown
        // compression is left to the guest (and this fake has no
        // decompressor: the bzImage loader then loads its code).
        let mut cut = compress(Format::Gzip, elf);
        cut.truncate(cut.len() / 2);
        let err = load_kernel(&mem, &bzimage(&cut)).unwrap_err();
        assert!(matches!(err, BootError::Payload(_)), "{err}");
        let unknown = load_kernel(&mem, &bzimage(b"\x01\x02\x03\x04\x05")).unwrap();
        assert_eq!(unknown.decompressed, None);
    }

    #[test]
    fn another_kernel_gets_a_command_line_of_its_own() {
        let ours = [b"Linux version 6.1.1 ".as_slice(), OUR_BUILD, b" (gcc)"].concat();
        let debian = b"Linux version 6.1.0-57-amd64 (debian-kernel@lists.debian.org)".to_vec();
        // (kernel, root disk, the line)
        let table = [
            (&ours, None, LINUX_CMDLINE.to_owned()),
            (&ours, Some(true), disk_cmdline(true)),
            (&debian, None, STOCK_CMDLINE.to_owned()),
            (
                &debian,
                Some(false),
                format!("{STOCK_CMDLINE} root=/dev/vda rw"),
            ),
        ];
        for (kernel, root, want) in table {
            assert_eq!(default_cmdline(kernel, root), want);
        }
    }

    #[test]
    fn a_kernel_that_names_cmdline_devices_gets_them_there() {
        // (kernel bytes, whether it takes virtio devices from its command
        // line)
        let ours = [b"\x7fELF...".as_slice(), b"virtio_mmio.device", b"..."].concat();
        let table: [(&[u8], bool); 3] = [
            (&ours, true),
            (crate::guests::get("demo").unwrap(), false),
            (b"virtio_mmio.devic", false),
        ];
        for (bytes, want) in table {
            assert_eq!(names_cmdline_devices(bytes), want);
        }
    }

    #[test]
    fn rejects_what_is_not_a_kernel() {
        let mem = create_memory(16).unwrap();
        let err = load_kernel(&mem, b"definitely not a kernel image, just text").unwrap_err();
        assert!(matches!(err, BootError::KernelFormat { .. }), "{err}");
        assert!(err.to_string().contains("neither"), "{err}");
    }

    #[test]
    fn linux64_entry_gets_boot_params_and_an_identity_map() {
        let mem = create_memory(64).unwrap();
        let k = LoadedKernel {
            entry: Entry::Linux64(0x100_0000),
            end: 0x200_0000,
            setup_header: None,
            decompressed: None,
            cmdline_devices: true,
            native: false,
        };
        write_boot_info(&mem, &k, "quiet", Some(&[1u8; 8192]), 1, &[]).unwrap();
        let params: boot_params = mem.read_obj(GuestAddress(ZERO_PAGE_ADDR)).unwrap();
        assert_eq!({ params.hdr.cmd_line_ptr } as u64, CMDLINE_ADDR);
        assert_eq!({ params.hdr.ramdisk_size }, 8192);
        assert_eq!({ params.acpi_rsdp_addr }, RSDP_ADDR);
        assert_eq!(params.e820_entries, 3);
        assert_eq!({ params.e820_table[2].size }, (64 << 20) - ACPI_END);
        let (regs, sregs) = initial_state(k.entry, kvm_sregs::default());
        assert_eq!((regs.rip, regs.rsi), (0x100_0000, ZERO_PAGE_ADDR));
        let paging = Paging::from_regs(
            sregs.cr0,
            sregs.cr3,
            sregs.cr4,
            0x500 | 0x400,
            PagingCaps::COMMON,
            0,
        )
        .unwrap();
        let view = GuestView::new(&mem, paging);
        for addr in [0u64, 0x100_0000, 0x3ff_f000] {
            assert_eq!(view.translate(addr, Access::SupervisorWrite), Ok(addr));
        }
    }

    #[test]
    fn initramfs_that_does_not_fit_is_refused() {
        let mem = create_memory(16).unwrap();
        let k = LoadedKernel {
            entry: Entry::Pvh(0x10_0000),
            end: 0x80_0000,
            setup_header: None,
            decompressed: None,
            cmdline_devices: true,
            native: false,
        };
        let big = vec![0u8; 12 << 20];
        let err = write_boot_info(&mem, &k, "", Some(&big), 1, &[]).unwrap_err();
        assert!(matches!(err, BootError::InitramfsTooLarge { .. }), "{err}");
    }
}
