//! The guard against page tables built in a GuestMemoryMmap with holes:
//! every rejection path, pages straddling regions, large pages, A/D bits and
//! a self-referencing page table. No KVM needed.

// A test: a failed setup or expectation stops it with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lwpvmm::guard::pagetable::{PageSize, PageTables, PteFlags};
use lwpvmm::guard::paging::{entry_at, is_canonical};
use lwpvmm::guard::reserved::RULES;
use lwpvmm::guard::{
    Access, GuardError, GuestMemory, GuestView, Level, Paging, PagingCaps, Vendor,
};

use lwpvmm::lwp::cpuid::CpuidEntry;
use lwpvmm::lwp::fault::{
    GuestFault, PF_FETCH, PF_PRESENT, PF_PROTECTION_KEY, PF_RESERVED, PF_USER, PF_WRITE,
};
use lwpvmm::lwp::memory::UserMemory;
use vm_memory::{Bytes, GuestAddress};

const MIB: u64 = 1 << 20;
const CR0_PE: u64 = 1;
const CR0_WP: u64 = 1 << 16;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const CR4_LA57: u64 = 1 << 12;
const CR4_SMEP: u64 = 1 << 20;
const CR4_SMAP: u64 = 1 << 21;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;
const EFER_NXE: u64 = 1 << 11;
const CR0: u64 = CR0_PE | CR0_WP | CR0_PG;
const EFER: u64 = EFER_LME | EFER_LMA | EFER_NXE;

// Linear addresses of the test address space.
const USER_RW: u64 = 0x40_0000;
const USER_RO: u64 = 0x40_1000;
const KERNEL_RW: u64 = 0x40_2000;
const UNMAPPED_PT: u64 = 0x40_3000;
const ACROSS_REGIONS: u64 = 0x50_0000;
const INTO_HOLE: u64 = 0x60_0000;
const ACROSS_INTO_HOLE: u64 = 0x60_1000;
const PAST_END: u64 = 0x61_0000;
const LAST_RAM_PAGE: u64 = 0x62_0000;
const NO_EXEC: u64 = 0x70_0000;
const LARGE_2M: u64 = 0x8000_0000;
const PD_NOT_USER: u64 = 0xC000_0000;
const PDPT_READ_ONLY: u64 = 0x1_0000_0000;
const UNMAPPED_PD: u64 = 0x1_0020_0000;
const UNMAPPED_PDPT: u64 = 0x1_4000_0000;
const TABLE_IN_HOLE: u64 = 0x1_8000_0000;
const LARGE_1G: u64 = 0x40_0000_0000;
const UNMAPPED_PML4: u64 = 0x7F00_0000_0000;

/// RAM: [0, 2 MiB), a hole to 3 MiB, then [3, 8) and [8, 16) MiB as two
/// adjacent regions.
fn memory() -> GuestMemory {
    GuestMemory::from_ranges(&[
        (GuestAddress(0), 2 * MIB as usize),
        (GuestAddress(3 * MIB), 5 * MIB as usize),
        (GuestAddress(8 * MIB), 8 * MIB as usize),
    ])
    .unwrap()
}

struct Space {
    mem: GuestMemory,
    cr3: u64,
}

fn space() -> Space {
    let mem = memory();
    let cr3 = {
        let mut pt = PageTables::new(&mem, 0x1000, 0x10_0000).unwrap();
        let k = PageSize::Size4K;
        pt.map(USER_RW, 0x30_0000, k, PteFlags::USER_RW).unwrap();
        pt.map(USER_RO, 0x30_1000, k, PteFlags::USER_RO).unwrap();
        pt.map(KERNEL_RW, 0x30_2000, k, PteFlags::KERNEL_RW)
            .unwrap();
        pt.map(ACROSS_REGIONS, 0x7F_F000, k, PteFlags::USER_RW)
            .unwrap();
        pt.map(ACROSS_REGIONS + 0x1000, 0x80_0000, k, PteFlags::USER_RW)
            .unwrap();
        pt.map(INTO_HOLE, 0x20_0000, k, PteFlags::USER_RW).unwrap();
        pt.map(ACROSS_INTO_HOLE, 0x1F_F000, k, PteFlags::USER_RW)
            .unwrap();
        pt.map(ACROSS_INTO_HOLE + 0x1000, 0x20_0000, k, PteFlags::USER_RW)
            .unwrap();
        pt.map(PAST_END, 0x100_0000, k, PteFlags::USER_RW).unwrap();
        pt.map(LAST_RAM_PAGE, 0xFF_F000, k, PteFlags::USER_RW)
            .unwrap();
        pt.map(NO_EXEC, 0x30_3000, k, PteFlags::USER_RW | PteFlags::NX)
            .unwrap();
        pt.map(LARGE_2M, 0x40_0000, PageSize::Size2M, PteFlags::USER_RW)
            .unwrap();
        pt.map(PD_NOT_USER, 0x30_4000, k, PteFlags::USER_RW)
            .unwrap();
        pt.map(PDPT_READ_ONLY, 0x30_5000, k, PteFlags::USER_RW)
            .unwrap();
        pt.map(TABLE_IN_HOLE, 0x30_6000, k, PteFlags::USER_RW)
            .unwrap();
        pt.map(LARGE_1G, 0, PageSize::Size1G, PteFlags::USER_RW)
            .unwrap();
        let pde = pt.set_entry(PD_NOT_USER, Level::Pd, 0).unwrap();
        pt.set_entry(PD_NOT_USER, Level::Pd, pde & !PteFlags::USER.bits())
            .unwrap();
        let pdpte = pt.set_entry(PDPT_READ_ONLY, Level::Pdpt, 0).unwrap();
        pt.set_entry(
            PDPT_READ_ONLY,
            Level::Pdpt,
            pdpte & !PteFlags::WRITABLE.bits(),
        )
        .unwrap();
        pt.set_entry(
            TABLE_IN_HOLE,
            Level::Pdpt,
            0x20_0000 | PteFlags::USER_RW.bits(),
        )
        .unwrap();
        pt.cr3()
    };
    Space { mem, cr3 }
}

impl Space {
    fn paging_with(&self, cr0: u64, cr4: u64, efer: u64) -> Paging {
        Paging::from_regs(cr0, self.cr3, cr4 | CR4_PAE, efer, PagingCaps::COMMON, 0).unwrap()
    }
    fn view(&self) -> GuestView<'_> {
        GuestView::new(&self.mem, self.paging_with(CR0, 0, EFER))
    }
    fn phys(&self, gpa: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0; len];
        self.mem.read_slice(&mut b, GuestAddress(gpa)).unwrap();
        b
    }
}

#[test]
fn translations() {
    let s = space();
    let v = s.view();
    // (linear address, access, physical address)
    let table = [
        (USER_RW + 0x123, Access::UserWrite, 0x30_0123),
        (USER_RO + 8, Access::UserRead, 0x30_1008),
        (KERNEL_RW, Access::SupervisorWrite, 0x30_2000),
        (NO_EXEC, Access::UserRead, 0x30_3000),
        (LARGE_2M + 0x1_2345, Access::UserWrite, 0x41_2345),
        (LARGE_1G + 0x10, Access::UserRead, 0x10),
        (LARGE_1G + 0x3F_FFF0, Access::UserFetch, 0x3F_FFF0),
        (USER_RW, Access::UserFetch, 0x30_0000),
    ];
    for (gva, access, gpa) in table {
        assert_eq!(v.translate(gva, access), Ok(gpa), "{gva:#x} {access:?}");
    }
}

#[test]
fn every_rejection_names_its_check() {
    let s = space();
    let v = s.view();
    type Want = fn(&GuardError) -> bool;
    let table: [(&str, u64, u64, Access, Want); 16] = [
        (
            "non-canonical",
            0x0000_8000_0000_0000,
            8,
            Access::UserRead,
            |e| {
                matches!(
                    e,
                    GuardError::NonCanonical {
                        address: 0x0000_8000_0000_0000
                    }
                )
            },
        ),
        (
            "range end non-canonical",
            0x7FFF_FFFF_FFF8,
            16,
            Access::UserRead,
            |e| {
                matches!(
                    e,
                    GuardError::NonCanonical {
                        address: 0x0000_8000_0000_0007
                    }
                )
            },
        ),
        (
            "wraps past 2^64",
            u64::MAX - 7,
            16,
            Access::UserWrite,
            |e| matches!(e, GuardError::RangeWraps { .. }),
        ),
        (
            "PML4E not present",
            UNMAPPED_PML4,
            8,
            Access::UserRead,
            |e| {
                matches!(
                    e,
                    GuardError::NotPresent {
                        level: Level::Pml4,
                        ..
                    }
                )
            },
        ),
        (
            "PDPTE not present",
            UNMAPPED_PDPT,
            8,
            Access::UserRead,
            |e| {
                matches!(
                    e,
                    GuardError::NotPresent {
                        level: Level::Pdpt,
                        ..
                    }
                )
            },
        ),
        ("PDE not present", UNMAPPED_PD, 8, Access::UserRead, |e| {
            matches!(
                e,
                GuardError::NotPresent {
                    level: Level::Pd,
                    ..
                }
            )
        }),
        ("PTE not present", UNMAPPED_PT, 8, Access::UserRead, |e| {
            matches!(
                e,
                GuardError::NotPresent {
                    level: Level::Pt,
                    ..
                }
            )
        }),
        (
            "supervisor-only leaf",
            KERNEL_RW,
            8,
            Access::UserRead,
            |e| {
                matches!(
                    e,
                    GuardError::SupervisorOnly {
                        level: Level::Pt,
                        ..
                    }
                )
            },
        ),
        (
            "supervisor-only PDE",
            PD_NOT_USER,
            8,
            Access::UserRead,
            |e| {
                matches!(
                    e,
                    GuardError::SupervisorOnly {
                        level: Level::Pd,
                        ..
                    }
                )
            },
        ),
        ("read-only leaf", USER_RO, 8, Access::UserWrite, |e| {
            matches!(
                e,
                GuardError::ReadOnly {
                    level: Level::Pt,
                    ..
                }
            )
        }),
        (
            "read-only PDPTE",
            PDPT_READ_ONLY,
            8,
            Access::UserWrite,
            |e| {
                matches!(
                    e,
                    GuardError::ReadOnly {
                        level: Level::Pdpt,
                        ..
                    }
                )
            },
        ),
        ("no-execute", NO_EXEC, 1, Access::UserFetch, |e| {
            matches!(e, GuardError::NoExecute { .. })
        }),
        (
            "table in a hole",
            TABLE_IN_HOLE,
            8,
            Access::UserRead,
            |e| matches!(e, GuardError::TableOutsideRam { level: Level::Pd, gpa, .. } if (0x20_0000..0x20_1000).contains(gpa)),
        ),
        ("page in a hole", INTO_HOLE, 8, Access::UserRead, |e| {
            matches!(e, GuardError::PageOutsideRam { gpa: 0x20_0000, .. })
        }),
        (
            "page past the end of RAM",
            PAST_END,
            8,
            Access::UserWrite,
            |e| {
                matches!(
                    e,
                    GuardError::PageOutsideRam {
                        gpa: 0x100_0000,
                        ..
                    }
                )
            },
        ),
        (
            "1 GiB page beyond RAM",
            LARGE_1G + 0x20_0000,
            8,
            Access::UserRead,
            |e| matches!(e, GuardError::PageOutsideRam { gpa: 0x20_0000, .. }),
        ),
    ];
    for (name, gva, len, access, want) in table {
        let got = v.check(gva, len, access).expect_err(name);
        assert!(want(&got), "{name}: got {got:?}");
        assert!(!got.to_string().is_empty());
    }
}

#[test]
fn reserved_bits() {
    // (what to do to the entry, level, NX enabled)
    type Change = fn(u64) -> u64;
    let table: [(&str, u64, Level, Change, bool); 4] = [
        (
            "physical bit above MAXPHYADDR",
            USER_RW,
            Level::Pt,
            |e| e | 1 << 50,
            true,
        ),
        ("NX without EFER.NXE", NO_EXEC, Level::Pt, |e| e, false),
        ("PS in a PML4E", USER_RW, Level::Pml4, |e| e | 1 << 7, true),
        (
            "2 MiB PDE with bit 13",
            LARGE_2M,
            Level::Pd,
            |e| e | 1 << 13,
            true,
        ),
    ];
    for (name, gva, level, change, nxe) in table {
        let s = space();
        let paging = s.paging_with(CR0, 0, if nxe { EFER } else { EFER & !EFER_NXE });
        let (slot, old) = entry_at(&s.mem, &paging, gva, level).unwrap();
        s.mem.write_obj(change(old), GuestAddress(slot)).unwrap();
        let v = GuestView::new(&s.mem, paging);
        let err = v.check(gva, 8, Access::UserRead).unwrap_err();
        assert!(
            matches!(err, GuardError::ReservedBit { level: l, .. } if l == level),
            "{name}: {err:?}"
        );
        assert_eq!(
            err.fault(),
            GuestFault::PageFault {
                address: gva,
                error_code: PF_PRESENT | PF_RESERVED | PF_USER,
            },
            "{name}"
        );
    }
}

#[test]
fn supervisor_accesses_follow_wp_smap_smep() {
    let s = space();
    // (CR0, CR4, address, access, allowed)
    let table = [
        (CR0, 0, USER_RO, Access::SupervisorWrite, false),
        (CR0 & !CR0_WP, 0, USER_RO, Access::SupervisorWrite, true),
        (CR0, 0, USER_RW, Access::SupervisorRead, true),
        (CR0, CR4_SMAP, USER_RW, Access::SupervisorRead, false),
        (CR0, CR4_SMAP, USER_RW, Access::SupervisorFetch, true),
        (CR0, CR4_SMEP, USER_RW, Access::SupervisorFetch, false),
        (
            CR0,
            CR4_SMAP | CR4_SMEP,
            KERNEL_RW,
            Access::SupervisorWrite,
            true,
        ),
        (CR0, 0, KERNEL_RW, Access::SupervisorFetch, true),
    ];
    for (cr0, cr4, gva, access, allowed) in table {
        let v = GuestView::new(&s.mem, s.paging_with(cr0, cr4, EFER));
        assert_eq!(
            v.check(gva, 8, access).is_ok(),
            allowed,
            "cr0 {cr0:#x} cr4 {cr4:#x} {gva:#x} {access:?}"
        );
    }
}

#[test]
fn unsupported_paging_modes() {
    let s = space();
    let table = [
        (CR0 & !CR0_PG, CR4_PAE, EFER),
        (CR0, 0, EFER),
        (CR0, CR4_PAE, EFER & !EFER_LMA),
        (CR0, CR4_PAE | CR4_LA57, EFER),
    ];
    for (cr0, cr4, efer) in table {
        let err = Paging::from_regs(cr0, s.cr3, cr4, efer, PagingCaps::COMMON, 0).unwrap_err();
        assert!(matches!(err, GuardError::UnsupportedPaging(_)), "{err}");
        assert_eq!(err.fault(), GuestFault::GeneralProtection);
    }
}

#[test]
fn pcid_and_flag_bits_of_cr3_are_masked() {
    let s = space();
    let plain = s.view().translate(USER_RW, Access::UserRead).unwrap();
    let cr3 = s.cr3 | 0x5 | 1 << 63;
    let p = Paging::from_regs(CR0, cr3, CR4_PAE | 1 << 17, EFER, PagingCaps::COMMON, 0).unwrap();
    assert_eq!(p.pml4(), s.cr3);
    assert_eq!(
        GuestView::new(&s.mem, p).translate(USER_RW, Access::UserRead),
        Ok(plain)
    );
}

#[test]
fn writes_straddle_adjacent_regions() {
    let s = space();
    let v = s.view();
    let data: Vec<u8> = (0..32).collect();
    v.write(ACROSS_REGIONS + 0xFF0, &data, Access::UserWrite)
        .unwrap();
    assert_eq!(s.phys(0x7F_FFF0, 16), &data[..16]);
    assert_eq!(s.phys(0x80_0000, 16), &data[16..]);
    let mut back = [0u8; 32];
    v.read(ACROSS_REGIONS + 0xFF0, &mut back, Access::UserRead)
        .unwrap();
    assert_eq!(&back[..], &data[..]);
}

#[test]
fn refused_writes_store_nothing() {
    let s = space();
    let v = s.view();
    let table = [
        ("second page in a hole", ACROSS_INTO_HOLE + 0xFF0, 0x1F_FFF0),
        ("second page unmapped", LAST_RAM_PAGE + 0xFF0, 0xFF_FFF0),
    ];
    for (name, gva, first_gpa) in table {
        assert!(
            v.write(gva, &[0xAA; 32], Access::UserWrite).is_err(),
            "{name}"
        );
        assert_eq!(s.phys(first_gpa, 16), vec![0; 16], "{name}");
    }
    v.write(LAST_RAM_PAGE + 0xFE0, &[0xBB; 32], Access::UserWrite)
        .unwrap();
    assert_eq!(
        s.phys(0xFF_FFE0, 32),
        vec![0xBB; 32],
        "the last bytes of RAM"
    );
}

#[test]
fn accessed_and_dirty_bits() {
    let s = space();
    let v = s.view();
    let p = *v.paging();
    let ad = |gva| {
        let (_, e) = entry_at(&s.mem, &p, gva, Level::Pt).unwrap();
        (e & 1 << 5 != 0, e & 1 << 6 != 0)
    };
    assert_eq!(ad(USER_RW), (false, false));
    v.check(USER_RW, 8, Access::UserWrite).unwrap();
    assert_eq!(ad(USER_RW), (false, false), "a probe marks nothing");
    v.read(USER_RW, &mut [0; 8], Access::UserRead).unwrap();
    assert_eq!(ad(USER_RW), (true, false), "a read sets Accessed");
    v.write(USER_RW, &[1; 8], Access::UserWrite).unwrap();
    assert_eq!(ad(USER_RW), (true, true), "a write sets Dirty");
    for level in [Level::Pml4, Level::Pdpt, Level::Pd] {
        let (_, e) = entry_at(&s.mem, &p, USER_RW, level).unwrap();
        assert_ne!(e & 1 << 5, 0, "{level} accessed");
        assert_eq!(e & 1 << 6, 0, "{level}: Dirty only on the leaf");
    }
    let before = entry_at(&s.mem, &p, USER_RO, Level::Pt).unwrap().1;
    let _ = v.write(USER_RO, &[1; 8], Access::UserWrite);
    assert_eq!(
        entry_at(&s.mem, &p, USER_RO, Level::Pt).unwrap().1,
        before,
        "a refused write marks nothing"
    );
}

#[test]
fn self_referencing_page_table_terminates() {
    let s = space();
    let v = s.view();
    s.mem
        .write_obj(
            s.cr3 | PteFlags::USER_RW.bits(),
            GuestAddress(s.cr3 + 511 * 8),
        )
        .unwrap();
    let recursive = 0xFFFF_FFFF_FFFF_F000;
    assert!(is_canonical(recursive));
    assert_eq!(v.translate(recursive, Access::UserRead), Ok(s.cr3));
    let mut pml4e0 = [0u8; 8];
    v.read(recursive, &mut pml4e0, Access::UserRead).unwrap();
    let expected: u64 = s.mem.read_obj(GuestAddress(s.cr3)).unwrap();
    assert_eq!(u64::from_le_bytes(pml4e0), expected);
    let pdpt = expected & 0x000F_FFFF_FFFF_F000;
    assert_eq!(
        v.translate(0xFFFF_FFFF_FFE0_0000, Access::UserRead),
        Ok(pdpt)
    );
    // The walk through the loop ends after four levels, here at an empty PDE.
    let err = v
        .check(0xFFFF_FF80_0000_0000, 4096, Access::UserRead)
        .unwrap_err();
    assert!(
        matches!(
            err,
            GuardError::NotPresent {
                level: Level::Pt,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn faults_the_guest_receives() {
    let s = space();
    let mut v = s.view();
    let mut b = [0u8; 8];
    let table: [(u64, bool, GuestFault); 6] = [
        (
            UNMAPPED_PT,
            false,
            GuestFault::PageFault {
                address: UNMAPPED_PT,
                error_code: PF_USER,
            },
        ),
        (
            UNMAPPED_PT,
            true,
            GuestFault::PageFault {
                address: UNMAPPED_PT,
                error_code: PF_USER | PF_WRITE,
            },
        ),
        (
            KERNEL_RW,
            false,
            GuestFault::PageFault {
                address: KERNEL_RW,
                error_code: PF_PRESENT | PF_USER,
            },
        ),
        (
            USER_RO,
            true,
            GuestFault::PageFault {
                address: USER_RO,
                error_code: PF_PRESENT | PF_USER | PF_WRITE,
            },
        ),
        (INTO_HOLE, true, GuestFault::GeneralProtection),
        (0x0000_8000_0000_0000, false, GuestFault::GeneralProtection),
    ];
    for (gva, write, want) in table {
        let got = if write {
            v.write_user(gva, &b)
        } else {
            v.read_user(gva, &mut b)
        };
        assert_eq!(got, Err(want), "{gva:#x} write={write}");
    }
    let fetch = GuardError::NoExecute {
        address: NO_EXEC,
        access: Access::UserFetch,
    };
    assert_eq!(
        fetch.fault(),
        GuestFault::PageFault {
            address: NO_EXEC,
            error_code: PF_PRESENT | PF_USER | PF_FETCH
        }
    );
    assert_eq!(v.check_user_write(USER_RW, 4096), Ok(()));
}

/// The walk follows what the guest's processor offers, from a fabricated
/// CPUID: a PDPTE with PS is a 1 GiB page only with Page1GB (a reserved bit
/// otherwise, as the CPU says), NX only with NX, physical bits up to
/// MAXPHYADDR, and protection keys (with CR4.PKE and PKRU) only with PKU.
#[test]
fn page_walks_follow_the_guests_cpuid() {
    const KEY: u64 = 5;
    const KEYED: u64 = 0x40_5000;
    const HIGH_BIT: u64 = 0x40_6000;
    const CR4_PKE: u64 = 1 << 22;
    let mem = memory();
    let cr3 = {
        let mut pt = PageTables::new(&mem, 0x1000, 0x10_0000).unwrap();
        let k = PageSize::Size4K;
        pt.map(NO_EXEC, 0x30_3000, k, PteFlags::USER_RW | PteFlags::NX)
            .unwrap();
        pt.map(LARGE_1G, 0, PageSize::Size1G, PteFlags::USER_RW)
            .unwrap();
        pt.map(KEYED, 0x30_5000, k, PteFlags::USER_RW).unwrap();
        let keyed = 0x30_5000 | PteFlags::USER_RW.bits() | KEY << 59;
        pt.set_entry(KEYED, Level::Pt, keyed).unwrap();
        pt.map(HIGH_BIT, 0x30_6000, k, PteFlags::USER_RW).unwrap();
        let high = 0x30_6000 | 1 << 44 | PteFlags::USER_RW.bits();
        pt.set_entry(HIGH_BIT, Level::Pt, high).unwrap();
        pt.cr3()
    };
    let none = PagingCaps {
        vendor: Vendor::Intel,
        maxphyaddr: 40,
        page_1g: false,
        nx: false,
        pku: false,
    };
    let all = PagingCaps {
        vendor: Vendor::Intel,
        maxphyaddr: 48,
        page_1g: true,
        nx: true,
        pku: true,
    };
    let wd = 1u32 << (2 * KEY + 1);
    let ad = 1u32 << (2 * KEY);
    let rsvd = |a: u64, access: Access| {
        Err(GuestFault::PageFault {
            address: a,
            error_code: access.error_code() | PF_PRESENT | PF_RESERVED,
        })
    };
    let pk = |a: u64, access: Access| {
        Err(GuestFault::PageFault {
            address: a,
            error_code: access.error_code() | PF_PRESENT | PF_PROTECTION_KEY,
        })
    };
    let nx = |a: u64| {
        Err(GuestFault::PageFault {
            address: a,
            error_code: PF_USER | PF_FETCH | PF_PRESENT,
        })
    };
    // (what, caps, CR0, CR4, PKRU, address, access, result)
    type Case = (
        &'static str,
        PagingCaps,
        u64,
        u64,
        u32,
        u64,
        Access,
        Result<(), GuestFault>,
    );
    let table: [Case; 16] = [
        (
            "1 GiB page with Page1GB",
            all,
            CR0,
            0,
            0,
            LARGE_1G,
            Access::UserWrite,
            Ok(()),
        ),
        (
            "1 GiB page without Page1GB",
            none,
            CR0,
            0,
            0,
            LARGE_1G,
            Access::UserWrite,
            rsvd(LARGE_1G, Access::UserWrite),
        ),
        (
            "NX page fetched with NX",
            all,
            CR0,
            0,
            0,
            NO_EXEC,
            Access::UserFetch,
            nx(NO_EXEC),
        ),
        (
            "XD bit without NX is reserved",
            none,
            CR0,
            0,
            0,
            NO_EXEC,
            Access::UserRead,
            rsvd(NO_EXEC, Access::UserRead),
        ),
        (
            "bit 44 under MAXPHYADDR 48",
            all,
            CR0,
            0,
            0,
            HIGH_BIT,
            Access::UserRead,
            Ok(()),
        ),
        (
            "bit 44 above MAXPHYADDR 40",
            none,
            CR0,
            0,
            0,
            HIGH_BIT,
            Access::UserRead,
            rsvd(HIGH_BIT, Access::UserRead),
        ),
        (
            "write-disabled key: user write",
            all,
            CR0,
            CR4_PKE,
            wd,
            KEYED,
            Access::UserWrite,
            pk(KEYED, Access::UserWrite),
        ),
        (
            "write-disabled key: user read",
            all,
            CR0,
            CR4_PKE,
            wd,
            KEYED,
            Access::UserRead,
            Ok(()),
        ),
        (
            "access-disabled key: user read",
            all,
            CR0,
            CR4_PKE,
            ad,
            KEYED,
            Access::UserRead,
            pk(KEYED, Access::UserRead),
        ),
        (
            "access-disabled key: fetch is not data",
            all,
            CR0,
            CR4_PKE,
            ad,
            KEYED,
            Access::UserFetch,
            Ok(()),
        ),
        (
            "write-disabled key: supervisor write, CR0.WP",
            all,
            CR0,
            CR4_PKE,
            wd,
            KEYED,
            Access::SupervisorWrite,
            pk(KEYED, Access::SupervisorWrite),
        ),
        (
            "write-disabled key: supervisor write, no WP",
            all,
            CR0 & !CR0_WP,
            CR4_PKE,
            wd,
            KEYED,
            Access::SupervisorWrite,
            Ok(()),
        ),
        (
            "access-disabled key: supervisor read",
            all,
            CR0,
            CR4_PKE,
            ad,
            KEYED,
            Access::SupervisorRead,
            pk(KEYED, Access::SupervisorRead),
        ),
        (
            "other keys' bits do not matter",
            all,
            CR0,
            CR4_PKE,
            !(wd | ad),
            KEYED,
            Access::UserWrite,
            Ok(()),
        ),
        (
            "keys without CR4.PKE",
            all,
            CR0,
            0,
            wd | ad,
            KEYED,
            Access::UserWrite,
            Ok(()),
        ),
        (
            "CR4.PKE without PKU",
            none,
            CR0,
            CR4_PKE,
            wd | ad,
            KEYED,
            Access::UserWrite,
            Ok(()),
        ),
    ];
    for (what, caps, cr0, cr4, pkru, address, access, want) in table {
        let paging = Paging::from_regs(cr0, cr3, CR4_PAE | cr4, EFER, caps, pkru).unwrap();
        let view = GuestView::new(&mem, paging);
        let got = view
            .translate(address, access)
            .map(|_| ())
            .map_err(|e| e.fault());
        assert_eq!(got, want, "{what}");
    }
}

/// Reserved bits follow the CPU the guest sees, from fabricated CPUIDs
/// (leaf 0's vendor string, 0x8000_0001's NX and Page1GB, 0x8000_0008's
/// MAXPHYADDR) and EFER.NXE: each row of the guard's table
/// (`lwpvmm::guard::reserved::RULES`) and the ignored bits beside them, at
/// every level, leaf and table, under each vendor string, reserved exactly
/// where KVM's MMU (and so the CPU a guest runs on) faults with PFEC.RSVD.
/// `tests/reserved_bits.rs` has the CPU itself answer the same rows.
#[test]
fn reserved_bits_follow_the_guests_vendor() {
    const MAXPHYADDR: u32 = 40;
    const XD: u64 = 1 << 63;
    let mem = memory();
    let cr3 = {
        let mut pt = PageTables::new(&mem, 0x1000, 0x10_0000).unwrap();
        pt.map(USER_RW, 0x30_0000, PageSize::Size4K, PteFlags::USER_RW)
            .unwrap();
        pt.map(LARGE_2M, 0x40_0000, PageSize::Size2M, PteFlags::USER_RW)
            .unwrap();
        pt.map(LARGE_1G, 0, PageSize::Size1G, PteFlags::USER_RW)
            .unwrap();
        pt.cr3()
    };
    let cpuid = |vendor: &[u8; 12], page_1g: bool| {
        let reg = |i: usize| u32::from_le_bytes(vendor[i..i + 4].try_into().unwrap());
        let leaf = |leaf: u32, eax: u32, ebx: u32, ecx: u32, edx: u32| CpuidEntry {
            leaf,
            subleaf: 0,
            eax,
            ebx,
            ecx,
            edx,
        };
        let ext_edx = 1 << 20 | if page_1g { 1 << 26 } else { 0 };
        [
            leaf(0, 0xd, reg(0), reg(8), reg(4)),
            leaf(0x8000_0001, 0, 0, 0, ext_edx),
            leaf(0x8000_0008, MAXPHYADDR, 0, 0, 0),
        ]
    };
    // (vendor string, whose rules: 0 Intel's, 1 AMD's)
    let vendors: [(&[u8; 12], usize); 5] = [
        (b"GenuineIntel", 0),
        (b"AuthenticAMD", 1),
        (b"HygonGenuine", 1),
        (b"AMDisbetter!", 1),
        (b"CentaurHauls", 0),
    ];
    // Where a case sets its bits: (address, level).
    const PML4E: (u64, Level) = (USER_RW, Level::Pml4);
    const PDPTE: (u64, Level) = (USER_RW, Level::Pdpt);
    const PDPTE_1G: (u64, Level) = (LARGE_1G, Level::Pdpt);
    const PDE: (u64, Level) = (USER_RW, Level::Pd);
    const PDE_2M: (u64, Level) = (LARGE_2M, Level::Pd);
    const PTE: (u64, Level) = (USER_RW, Level::Pt);
    // The processor and EFER: (EFER.NXE, Page1GB).
    const NXE: (bool, bool) = (true, true);
    const NO_NXE: (bool, bool) = (false, true);
    const NO_1G: (bool, bool) = (true, false);
    // Reserved with Intel's rules, with AMD's.
    const RSVD: [bool; 2] = [true, true];
    const AMD_ONLY: [bool; 2] = [false, true];
    const IGNORED: [bool; 2] = [false, false];
    // (what, the RULES row it shows or None, where, bits set, processor
    // and EFER, reserved)
    type Case = (
        &'static str,
        Option<usize>,
        (u64, Level),
        u64,
        (bool, bool),
        [bool; 2],
    );
    let table: [Case; 40] = [
        ("PML4E: PS", Some(2), PML4E, 1 << 7, NXE, RSVD),
        ("PML4E: bit 8", Some(3), PML4E, 1 << 8, NXE, AMD_ONLY),
        (
            "PML4E: bit 40 (MAXPHYADDR)",
            Some(0),
            PML4E,
            1 << 40,
            NXE,
            RSVD,
        ),
        ("PML4E: bit 51", Some(0), PML4E, 1 << 51, NXE, RSVD),
        ("PML4E: bit 52", None, PML4E, 1 << 52, NXE, IGNORED),
        (
            "PML4E: XD without EFER.NXE",
            Some(1),
            PML4E,
            XD,
            NO_NXE,
            RSVD,
        ),
        ("PML4E: XD with EFER.NXE", None, PML4E, XD, NXE, IGNORED),
        ("PDPTE: bit 8", None, PDPTE, 1 << 8, NXE, IGNORED),
        ("PDPTE: bit 40", Some(0), PDPTE, 1 << 40, NXE, RSVD),
        ("PDPTE: bit 58", None, PDPTE, 1 << 58, NXE, IGNORED),
        (
            "PDPTE: XD without EFER.NXE",
            Some(1),
            PDPTE,
            XD,
            NO_NXE,
            RSVD,
        ),
        ("PDPTE: XD with EFER.NXE", None, PDPTE, XD, NXE, IGNORED),
        (
            "1 GiB PDPTE: PS with Page1GB",
            None,
            PDPTE_1G,
            0,
            NXE,
            IGNORED,
        ),
        (
            "1 GiB PDPTE: PS without Page1GB",
            Some(4),
            PDPTE_1G,
            0,
            NO_1G,
            RSVD,
        ),
        ("1 GiB PDPTE: bit 13", Some(5), PDPTE_1G, 1 << 13, NXE, RSVD),
        ("1 GiB PDPTE: bit 29", Some(5), PDPTE_1G, 1 << 29, NXE, RSVD),
        (
            "1 GiB PDPTE: bit 8 (G)",
            None,
            PDPTE_1G,
            1 << 8,
            NXE,
            IGNORED,
        ),
        ("1 GiB PDPTE: bit 40", Some(0), PDPTE_1G, 1 << 40, NXE, RSVD),
        (
            "1 GiB PDPTE: XD without EFER.NXE",
            Some(1),
            PDPTE_1G,
            XD,
            NO_NXE,
            RSVD,
        ),
        ("PDE: bit 8", None, PDE, 1 << 8, NXE, IGNORED),
        ("PDE: bit 40", Some(0), PDE, 1 << 40, NXE, RSVD),
        ("PDE: XD without EFER.NXE", Some(1), PDE, XD, NO_NXE, RSVD),
        ("PDE: XD with EFER.NXE", None, PDE, XD, NXE, IGNORED),
        ("2 MiB PDE: bit 13", Some(6), PDE_2M, 1 << 13, NXE, RSVD),
        ("2 MiB PDE: bit 20", Some(6), PDE_2M, 1 << 20, NXE, RSVD),
        ("2 MiB PDE: bit 8 (G)", None, PDE_2M, 1 << 8, NXE, IGNORED),
        (
            "2 MiB PDE: bit 12 (PAT)",
            None,
            PDE_2M,
            1 << 12,
            NXE,
            IGNORED,
        ),
        ("2 MiB PDE: bit 40", Some(0), PDE_2M, 1 << 40, NXE, RSVD),
        (
            "2 MiB PDE: XD without EFER.NXE",
            Some(1),
            PDE_2M,
            XD,
            NO_NXE,
            RSVD,
        ),
        ("PTE: bit 8 (G)", None, PTE, 1 << 8, NXE, IGNORED),
        ("PTE: bit 7 (PAT)", None, PTE, 1 << 7, NXE, IGNORED),
        (
            "PTE: bit 39, an address bit",
            None,
            PTE,
            1 << 39,
            NXE,
            IGNORED,
        ),
        ("PTE: bit 40", Some(0), PTE, 1 << 40, NXE, RSVD),
        ("PTE: bit 47", Some(0), PTE, 1 << 47, NXE, RSVD),
        ("PTE: bit 51", Some(0), PTE, 1 << 51, NXE, RSVD),
        ("PTE: bit 52", None, PTE, 1 << 52, NXE, IGNORED),
        (
            "PTE: bit 62 without CR4.PKE",
            None,
            PTE,
            1 << 62,
            NXE,
            IGNORED,
        ),
        ("PTE: XD without EFER.NXE", Some(1), PTE, XD, NO_NXE, RSVD),
        ("PTE: XD with EFER.NXE", None, PTE, XD, NXE, IGNORED),
        ("PTE: nothing set", None, PTE, 0, NO_NXE, IGNORED),
    ];
    for (name, rules) in vendors {
        let vendor = String::from_utf8_lossy(name);
        for (what, _, (address, level), bits, (nxe, page_1g), want) in table {
            let caps = PagingCaps::from_cpuid(&cpuid(name, page_1g));
            let efer = if nxe { EFER } else { EFER & !EFER_NXE };
            let paging = Paging::from_regs(CR0, cr3, CR4_PAE, efer, caps, 0).unwrap();
            let (slot, old) = entry_at(&mem, &paging, address, level).unwrap();
            mem.write_obj(old | bits, GuestAddress(slot)).unwrap();
            let got = GuestView::new(&mem, paging).translate(address, Access::UserWrite);
            mem.write_obj(old, GuestAddress(slot)).unwrap();
            if want[rules] {
                assert!(
                    matches!(got, Err(GuardError::ReservedBit { level: l, .. }) if l == level),
                    "{vendor}, {what}: {got:?}"
                );
                assert_eq!(
                    got.unwrap_err().fault(),
                    GuestFault::PageFault {
                        address,
                        error_code: PF_PRESENT | PF_RESERVED | PF_USER | PF_WRITE,
                    },
                    "{vendor}, {what}"
                );
            } else {
                assert!(got.is_ok(), "{vendor}, {what}: {got:?}");
            }
        }
        assert_eq!(
            Vendor::from_cpuid(&cpuid(name, true)),
            [Vendor::Intel, Vendor::Amd][rules],
            "{vendor}"
        );
    }
    for (row, rule) in RULES.iter().enumerate() {
        assert!(
            table.iter().any(|case| case.1 == Some(row)),
            "no case shows row {row}: {}",
            rule.what
        );
    }
}

/// A range check reads each upper-level entry once for the pages that
/// share it (the LLWPCB's ring walk): its answer is still the first page's
/// that fails alone, across page tables, PD and PDPT boundaries, and
/// entries that differ only in the lower levels.
#[test]
fn a_range_check_answers_as_its_pages_do() {
    const BASE: u64 = 0x2_3FE0_0000;
    let mem = memory();
    let cr3 = {
        let mut pt = PageTables::new(&mem, 0x1000, 0x10_0000).unwrap();
        // 4 MiB + 8 KiB across a 1 GiB (PDPT) boundary at BASE + 2 MiB,
        // every page aliasing one RAM page, one read-only, one supervisor.
        for page in 0..1026u64 {
            let flags = match page {
                700 => PteFlags::USER_RO,
                900 => PteFlags::KERNEL_RW,
                _ => PteFlags::USER_RW,
            };
            pt.map(BASE + page * 0x1000, 0x30_0000, PageSize::Size4K, flags)
                .unwrap();
        }
        pt.cr3()
    };
    let view = GuestView::new(
        &mem,
        Paging::from_regs(CR0, cr3, CR4_PAE, EFER, PagingCaps::COMMON, 0).unwrap(),
    );
    // (first page, pages, access)
    let table = [
        (0, 1026, Access::UserRead),
        (0, 1026, Access::UserWrite),
        (0, 700, Access::UserWrite),
        (500, 300, Access::UserWrite),
        (701, 199, Access::UserWrite),
        (701, 325, Access::UserRead),
        (510, 4, Access::UserWrite),
        (1020, 10, Access::UserRead),
    ];
    for (first, pages, access) in table {
        let (start, len) = (BASE + first * 0x1000, pages * 0x1000);
        let alone = (first..first + pages)
            .map(|p| view.check(BASE + p * 0x1000, 0x1000, access))
            .find(Result::is_err)
            .unwrap_or(Ok(()));
        assert_eq!(
            view.check(start, len, access),
            alone,
            "pages {first}..{} as {access:?}",
            first + pages
        );
    }
}

/// LLWPCB's write-back: fields stored where they are and nothing between,
/// across two pages in two RAM regions, with each page's Dirty bit set; a
/// span with a page that may not be stored stores no field.
#[test]
fn fields_are_stored_all_or_none() {
    let s = space();
    let mut v = s.view();
    let base = ACROSS_REGIONS + 0xFF8;
    v.write_user_fields(base, 24, &[(0, &[1; 4]), (6, &[2; 4]), (20, &[3; 4])])
        .unwrap();
    assert_eq!(s.phys(0x7F_FFF8, 8), [1, 1, 1, 1, 0, 0, 2, 2]);
    assert_eq!(
        s.phys(0x80_0000, 16),
        [2, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 3, 3, 3]
    );
    for page in [ACROSS_REGIONS, ACROSS_REGIONS + 0x1000] {
        let (_, pte) = entry_at(&s.mem, v.paging(), page, Level::Pt).unwrap();
        assert_ne!(pte & (1 << 6), 0, "{page:#x}: Dirty");
    }
    // (what, base, span)
    let refused = [
        ("a read-only page in the span", USER_RO - 8, 16),
        ("the span runs into a hole", ACROSS_INTO_HOLE + 0xFF8, 16),
    ];
    for (what, base, span) in refused {
        let before = v.read_user(base, &mut [0u8; 8]);
        assert!(
            v.write_user_fields(base, span, &[(0, &[9; 8])]).is_err(),
            "{what}"
        );
        let mut after = [0u8; 8];
        if before.is_ok() {
            v.read_user(base, &mut after).unwrap();
            assert_eq!(after, [0; 8], "{what}: stored nothing");
        }
    }
}
