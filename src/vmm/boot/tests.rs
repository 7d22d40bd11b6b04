//! Boot's tests: memory, command lines, images and each protocol's boot
//! information together, as a boot uses them.

use kvm_bindings::kvm_sregs;

use linux_loader::loader::bootparam::boot_params;
use linux_loader::loader::elf::start_info::{hvm_modlist_entry, hvm_start_info};
use vm_memory::{Address, Bytes, GuestAddress};

use super::cmdline::*;
use super::cpu::*;
use super::image::*;
use super::memory::*;
use super::params::*;
use super::payload::Format;
use super::*;
use crate::guard::{Access, GuestView, Paging, PagingCaps};
use crate::vmm::devices::acpi::{ACPI_END, ACPI_START, RSDP_ADDR};

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
        assert!(
            matches!(err, BootError::MemorySize { mib, .. } if mib == bad),
            "{err}"
        );
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
    let config = include_str!("../../../resources/linux/lwpvmm.config");
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
    use super::payload::tests::{bzimage, compress};
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
