//! The page walker: guest-linear to guest-physical translation through the
//! guest's own 4-level page tables, with the checks the CPU makes for each
//! kind of access, and the Accessed/Dirty updates a CPU access would make.
//! What the walk allows depends on what the guest's processor offers (its
//! vendor, 1 GiB pages, NX, the physical-address width, protection keys),
//! taken from the guest's own CPUID table, and on its control registers and
//! PKRU; the reserved bits of each kind of entry are reserved.rs's table.

use std::sync::atomic::{AtomicU64, Ordering};

use vm_memory::bitmap::Bitmap;
use vm_memory::{Bytes, GuestAddress, GuestMemoryRegion, VolatileMemory};

use super::access::Access;
use super::error::{GuardError, Level};
use super::ram::GuestMemory;
use super::ram::Ram;
use super::reserved::{EntryKind, ReservedBits, Vendor, physical_width};
use crate::lwp::cpuid::CpuidEntry;

const PTE_PRESENT: u64 = 1 << 0;
const PTE_WRITABLE: u64 = 1 << 1;
const PTE_USER: u64 = 1 << 2;
const PTE_ACCESSED: u64 = 1 << 5;
const PTE_DIRTY: u64 = 1 << 6;
const PTE_LARGE: u64 = 1 << 7;
const PTE_NX: u64 = 1 << 63;
/// The protection key of a leaf entry (bits 62:59), with CR4.PKE.
const PTE_KEY_SHIFT: u32 = 59;
/// Address bits 51:12 of a paging entry.
const PTE_ADDR: u64 = 0x000F_FFFF_FFFF_F000;

const CR0_PG: u64 = 1 << 31;
const CR0_WP: u64 = 1 << 16;
const CR4_PAE: u64 = 1 << 5;
const CR4_LA57: u64 = 1 << 12;
const CR4_SMEP: u64 = 1 << 20;
const CR4_SMAP: u64 = 1 << 21;
const CR4_PKE: u64 = 1 << 22;
const EFER_LMA: u64 = 1 << 10;
const EFER_NXE: u64 = 1 << 11;

/// How often a walk is retried when another vCPU changes an entry between
/// the read and the Accessed/Dirty update.
const WALK_ATTEMPTS: usize = 8;

/// What the guest's processor offers that changes a page walk, from the
/// CPUID table the guest sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagingCaps {
    /// Whose reserved bits apply (CPUID leaf 0's vendor string): AMD's
    /// reserve bit 8 of a PML4E, Intel's ignore it.
    pub vendor: Vendor,
    /// The physical-address width (CPUID 0x8000_0008.EAX[7:0]).
    pub maxphyaddr: u8,
    /// 1 GiB pages (0x8000_0001.EDX[26]): without them PS in a PDPTE is a
    /// reserved bit.
    pub page_1g: bool,
    /// No-execute (0x8000_0001.EDX[20]).
    pub nx: bool,
    /// Protection keys for user pages (7.0.ECX[3]).
    pub pku: bool,
}

/// The physical-address width when CPUID has no leaf 0x8000_0008.
const DEFAULT_MAXPHYADDR: u8 = 36;

impl PagingCaps {
    /// What most x86-64 processors offer: Intel's reserved bits, 1 GiB
    /// pages, NX, 48 physical address bits, no protection keys (tests,
    /// benchmarks, fuzzing).
    pub const COMMON: PagingCaps = PagingCaps {
        vendor: Vendor::Intel,
        maxphyaddr: 48,
        page_1g: true,
        nx: true,
        pku: false,
    };

    /// The capabilities a CPUID table describes; a missing leaf offers
    /// nothing (Intel's rules without leaf 0, as KVM has them, and the
    /// architectural 36-bit physical width).
    pub fn from_cpuid(table: &[CpuidEntry]) -> Self {
        let leaf = |leaf: u32| table.iter().find(|e| e.leaf == leaf && e.subleaf == 0);
        let ext = leaf(0x8000_0001);
        PagingCaps {
            vendor: Vendor::from_cpuid(table),
            maxphyaddr: leaf(0x8000_0008).map_or(DEFAULT_MAXPHYADDR, |e| (e.eax & 0xff) as u8),
            page_1g: ext.is_some_and(|e| e.edx & (1 << 26) != 0),
            nx: ext.is_some_and(|e| e.edx & (1 << 20) != 0),
            pku: leaf(7).is_some_and(|e| e.ecx & (1 << 3) != 0),
        }
    }
}

/// The paging state of a vCPU, taken from its control registers, PKRU and
/// what its processor offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Paging {
    pml4: u64,
    reserved: ReservedBits,
    write_protect: bool,
    nx_enabled: bool,
    smep: bool,
    smap: bool,
    pkru: Option<u32>,
}

impl Paging {
    /// Paging as the CPU would do it with these registers, on a processor
    /// offering `caps`. `pkru` is the vCPU's PKRU, used when CR4.PKE is set
    /// (the caller may pass 0 otherwise). Anything but 4-level long-mode
    /// paging is refused.
    pub fn from_regs(
        cr0: u64,
        cr3: u64,
        cr4: u64,
        efer: u64,
        caps: PagingCaps,
        pkru: u32,
    ) -> Result<Paging, GuardError> {
        if cr0 & CR0_PG == 0 || cr4 & CR4_PAE == 0 || efer & EFER_LMA == 0 {
            return Err(GuardError::UnsupportedPaging(
                "not in long mode (CR0.PG, CR4.PAE and EFER.LMA are needed)",
            ));
        }
        if cr4 & CR4_LA57 != 0 {
            return Err(GuardError::UnsupportedPaging(
                "5-level paging (CR4.LA57) is not supported",
            ));
        }
        let phys_mask = (1u64 << physical_width(caps.maxphyaddr)) - 1;
        let nx_enabled = caps.nx && efer & EFER_NXE != 0;
        Ok(Paging {
            pml4: cr3 & PTE_ADDR & phys_mask,
            reserved: ReservedBits::new(caps.vendor, caps.maxphyaddr, caps.page_1g, nx_enabled),
            write_protect: cr0 & CR0_WP != 0,
            nx_enabled,
            smep: cr4 & CR4_SMEP != 0,
            smap: cr4 & CR4_SMAP != 0,
            pkru: (caps.pku && cr4 & CR4_PKE != 0).then_some(pkru),
        })
    }

    /// True when protection keys apply (CR4.PKE on a processor with PKU):
    /// the caller must then have passed the vCPU's real PKRU.
    pub fn keys_enabled(&self) -> bool {
        self.pkru.is_some()
    }

    /// Physical address of the PML4 table (CR3 with PCID and flag bits
    /// masked).
    pub fn pml4(&self) -> u64 {
        self.pml4
    }
}

/// A successful translation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Translation {
    /// The guest-physical address of the linear address.
    pub gpa: u64,
    /// Bytes from the address to the end of the page that maps it.
    pub page_remaining: u64,
}

/// True when bits 63:47 of `address` are all equal.
pub fn is_canonical(address: u64) -> bool {
    let top = (address as i64) >> 47;
    top == 0 || top == -1
}

struct Walked {
    entries: [(u64, u64); 4],
    depth: usize,
    translation: Translation,
}

/// Whether a translation marks the entries it uses as a real access does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marking {
    /// Set Accessed, and Dirty for stores (an access that happens).
    SetAccessedDirty,
    /// Leave the entries alone (a probe: nothing is accessed yet).
    Probe,
}

/// Translates `address` for `access`. With [`Marking::SetAccessedDirty`] it
/// sets Accessed (and Dirty for stores) in the entries used, atomically
/// against other vCPUs.
pub fn translate(
    mem: &GuestMemory,
    paging: &Paging,
    address: u64,
    access: Access,
    marking: Marking,
) -> Result<Translation, GuardError> {
    translate_in(&mut Ram::new(mem), paging, address, access, marking)
}

/// [`translate`] within one guard operation's RAM accesses.
pub(crate) fn translate_in(
    ram: &mut Ram<'_>,
    paging: &Paging,
    address: u64,
    access: Access,
    marking: Marking,
) -> Result<Translation, GuardError> {
    if !is_canonical(address) {
        return Err(GuardError::NonCanonical { address });
    }
    for _ in 0..WALK_ATTEMPTS {
        let walked = walk(ram, paging, address, access, None)?;
        if marking == Marking::Probe || set_accessed_dirty(ram, &walked, access)? {
            return Ok(walked.translation);
        }
    }
    Err(GuardError::Contended { address })
}

/// The upper-level entries (PML4, PDPT, PD) the last probe of a range
/// read, by their physical address: the pages of one range share them, so
/// a range check reads each page-table page's entries once, not once per
/// page.
#[derive(Debug, Default)]
pub struct TableCache {
    entries: [Option<(u64, u64)>; 3],
}

/// Translates `address` for `access` as a probe (nothing marked), reusing
/// the upper-level entries `cache` holds from the probe before it.
pub(crate) fn probe_cached(
    ram: &mut Ram<'_>,
    paging: &Paging,
    address: u64,
    access: Access,
    cache: &mut TableCache,
) -> Result<Translation, GuardError> {
    if !is_canonical(address) {
        return Err(GuardError::NonCanonical { address });
    }
    walk(ram, paging, address, access, Some(cache)).map(|w| w.translation)
}

fn walk(
    ram: &mut Ram<'_>,
    paging: &Paging,
    address: u64,
    access: Access,
    mut cache: Option<&mut TableCache>,
) -> Result<Walked, GuardError> {
    let mut table = paging.pml4;
    let mut entries = [(0u64, 0u64); 4];
    let mut supervisor_at: Option<Level> = None;
    let mut read_only_at: Option<Level> = None;
    let mut no_execute = false;
    for (depth, level) in Level::WALK.into_iter().enumerate() {
        let index = (address >> level.shift()) & 0x1ff;
        let gpa = table | (index * 8);
        let cached = cache
            .as_deref()
            .and_then(|c| c.entries.get(depth).copied().flatten())
            .filter(|&(at, _)| at == gpa)
            .map(|(_, entry)| entry);
        let entry: u64 = match cached {
            Some(entry) => entry,
            None => ram.load_u64(gpa).ok_or(GuardError::TableOutsideRam {
                address,
                level,
                gpa,
            })?,
        };
        if let Some(slot) = cache.as_deref_mut().and_then(|c| c.entries.get_mut(depth)) {
            *slot = Some((gpa, entry));
        }
        if entry & PTE_PRESENT == 0 {
            return Err(GuardError::NotPresent {
                address,
                level,
                access,
            });
        }
        let kind = EntryKind::of(level, entry);
        if entry & paging.reserved.of(kind) != 0 {
            return Err(GuardError::ReservedBit {
                address,
                level,
                access,
            });
        }
        if entry & PTE_USER == 0 && supervisor_at.is_none() {
            supervisor_at = Some(level);
        }
        if entry & PTE_WRITABLE == 0 && read_only_at.is_none() {
            read_only_at = Some(level);
        }
        no_execute |= paging.nx_enabled && entry & PTE_NX != 0;
        entries[depth] = (gpa, entry);
        if kind.is_leaf() {
            let page_size = 1u64 << level.shift();
            let offset = address & (page_size - 1);
            let base = entry & PTE_ADDR & !(page_size - 1);
            check_permissions(
                paging,
                address,
                access,
                Leaf {
                    supervisor_at,
                    read_only_at,
                    no_execute,
                    key: ((entry >> PTE_KEY_SHIFT) & 0xf) as u8,
                },
            )?;
            return Ok(Walked {
                entries,
                depth: depth + 1,
                translation: Translation {
                    gpa: base | offset,
                    page_remaining: page_size - offset,
                },
            });
        }
        table = entry & PTE_ADDR;
    }
    unreachable!("the page-table level loop always returns at Level::Pt")
}

/// What the walk gathered on the way to the leaf.
struct Leaf {
    supervisor_at: Option<Level>,
    read_only_at: Option<Level>,
    no_execute: bool,
    key: u8,
}

fn check_permissions(
    paging: &Paging,
    address: u64,
    access: Access,
    leaf: Leaf,
) -> Result<(), GuardError> {
    let Leaf {
        supervisor_at,
        read_only_at,
        no_execute,
        key,
    } = leaf;
    let user_page = supervisor_at.is_none();
    if let (true, Some(level)) = (access.is_user(), supervisor_at) {
        return Err(GuardError::SupervisorOnly {
            address,
            level,
            access,
        });
    }
    if !access.is_user() && user_page {
        let blocked = if access.is_fetch() {
            paging.smep
        } else {
            paging.smap
        };
        if blocked {
            return Err(GuardError::UserPageFromSupervisor { address, access });
        }
    }
    if let (true, Some(level)) = (access.is_write(), read_only_at)
        && (access.is_user() || paging.write_protect)
    {
        return Err(GuardError::ReadOnly {
            address,
            level,
            access,
        });
    }
    if access.is_fetch() && no_execute {
        return Err(GuardError::NoExecute { address, access });
    }
    // Protection keys govern data accesses to user pages, from either
    // privilege; write-disable binds supervisor writes only with CR0.WP.
    if let (Some(pkru), true, false) = (paging.pkru, user_page, access.is_fetch()) {
        let access_disabled = pkru >> (2 * key) & 1 != 0;
        let write_disabled = pkru >> (2 * key + 1) & 1 != 0;
        let write_blocked =
            access.is_write() && write_disabled && (access.is_user() || paging.write_protect);
        if access_disabled || write_blocked {
            return Err(GuardError::ProtectionKey {
                address,
                key,
                access,
            });
        }
    }
    Ok(())
}

/// Sets Accessed in every entry used and Dirty in the leaf for stores, with
/// a compare-and-exchange so that an entry another vCPU changed meanwhile is
/// never overwritten. Returns false when the walk must be redone.
fn set_accessed_dirty(
    ram: &mut Ram<'_>,
    walked: &Walked,
    access: Access,
) -> Result<bool, GuardError> {
    for (i, &(gpa, entry)) in walked.entries[..walked.depth].iter().enumerate() {
        let leaf = i + 1 == walked.depth;
        let mut want = entry | PTE_ACCESSED;
        if leaf && access.is_write() {
            want |= PTE_DIRTY;
        }
        if want == entry {
            continue;
        }
        let swapped = atomic_entry(ram, gpa, |e| {
            e.compare_exchange(entry, want, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        });
        match swapped {
            Some(true) => {}
            Some(false) => return Ok(false),
            None => {
                return Err(GuardError::TableOutsideRam {
                    address: gpa,
                    level: Level::WALK[i],
                    gpa,
                });
            }
        }
    }
    Ok(true)
}

/// Runs `f` on the paging entry at `gpa` as an atomic; `None` when the
/// entry is not in guest RAM.
fn atomic_entry<T>(ram: &mut Ram<'_>, gpa: u64, f: impl FnOnce(&AtomicU64) -> T) -> Option<T> {
    let (region, offset) = ram.region(gpa, 8)?;
    let slice = region.get_slice(offset, 8).ok()?;
    let atomic = slice.get_atomic_ref::<AtomicU64>(0).ok()?;
    let done = f(atomic);
    // An atomic reference bypasses vm-memory's dirty marking: the entry's
    // Accessed/Dirty update is a write the diff snapshots must see.
    region.bitmap().mark_dirty(offset.0 as usize, 8);
    Some(done)
}

/// The entry the walk for `address` uses at `level`, read without side
/// effects: `(physical address of the entry, value)`. For tests and
/// diagnostics.
pub fn entry_at(
    mem: &GuestMemory,
    paging: &Paging,
    address: u64,
    level: Level,
) -> Option<(u64, u64)> {
    let mut table = paging.pml4;
    for l in Level::WALK {
        let gpa = table | (((address >> l.shift()) & 0x1ff) * 8);
        let entry: u64 = mem.read_obj(GuestAddress(gpa)).ok()?;
        if l == level {
            return Some((gpa, entry));
        }
        if entry & PTE_PRESENT == 0 || (entry & PTE_LARGE != 0 && l != Level::Pml4) {
            return None;
        }
        table = entry & PTE_ADDR;
    }
    None
}
