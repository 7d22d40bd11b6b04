//! Builds 4-level page tables in guest memory: the boot identity map the VMM
//! gives a 64-bit guest, and the address spaces the guard's tests and
//! benchmarks walk.

use bitflags::bitflags;
use thiserror::Error;
use vm_memory::{Bytes, GuestAddress};

use super::error::Level;
use super::ram::GuestMemory;

bitflags! {
    /// Paging-entry bits the builder sets.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct PteFlags: u64 {
        /// Present.
        const PRESENT = 1 << 0;
        /// Writable.
        const WRITABLE = 1 << 1;
        /// User-accessible.
        const USER = 1 << 2;
        /// Accessed.
        const ACCESSED = 1 << 5;
        /// Dirty.
        const DIRTY = 1 << 6;
        /// No-execute.
        const NX = 1 << 63;
    }
}

impl PteFlags {
    /// A user page CPL3 may read and write.
    pub const USER_RW: PteFlags = PteFlags::PRESENT
        .union(PteFlags::WRITABLE)
        .union(PteFlags::USER);
    /// A user page CPL3 may only read.
    pub const USER_RO: PteFlags = PteFlags::PRESENT.union(PteFlags::USER);
    /// A supervisor-only writable page.
    pub const KERNEL_RW: PteFlags = PteFlags::PRESENT.union(PteFlags::WRITABLE);
}

/// The size of a mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageSize {
    /// 4 KiB, mapped by a PTE.
    Size4K,
    /// 2 MiB, mapped by a PDE with PS set.
    Size2M,
    /// 1 GiB, mapped by a PDPTE with PS set.
    Size1G,
}

impl PageSize {
    /// Bytes in the page.
    pub fn bytes(self) -> u64 {
        1 << self.leaf().shift()
    }

    fn leaf(self) -> Level {
        match self {
            PageSize::Size4K => Level::Pt,
            PageSize::Size2M => Level::Pd,
            PageSize::Size1G => Level::Pdpt,
        }
    }
}

/// Why a mapping could not be built.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum BuildError {
    /// The pool for new tables is used up.
    #[error("no room left for page tables in the pool {start:#x}..{end:#x}")]
    PoolExhausted {
        /// Start of the pool.
        start: u64,
        /// End of the pool.
        end: u64,
    },
    /// An address is not aligned to the page size.
    #[error("{what} {address:#x} is not aligned to the {size:#x}-byte page")]
    Misaligned {
        /// Which address.
        what: &'static str,
        /// The address.
        address: u64,
        /// The page size.
        size: u64,
    },
    /// A larger page already maps part of the range.
    #[error("{address:#x} is already covered by a larger page")]
    Overlap {
        /// The address.
        address: u64,
    },
    /// Guest memory refused a table write.
    #[error("page table at {0:#x} is not in guest RAM")]
    Memory(u64),
}

const TABLE: u64 = 4096;
const ADDR_MASK: u64 = 0x000F_FFFF_FFFF_F000;
const LARGE: u64 = 1 << 7;

/// Page tables rooted at one PML4, with new tables taken from a pool.
#[derive(Debug)]
pub struct PageTables<'a> {
    mem: &'a GuestMemory,
    root: u64,
    next: u64,
    pool: (u64, u64),
}

impl<'a> PageTables<'a> {
    /// Empty tables whose PML4 is the first page of the pool
    /// `[pool_start, pool_end)`.
    pub fn new(mem: &'a GuestMemory, pool_start: u64, pool_end: u64) -> Result<Self, BuildError> {
        let mut pt = PageTables {
            mem,
            root: 0,
            next: pool_start,
            pool: (pool_start, pool_end),
        };
        pt.root = pt.alloc()?;
        Ok(pt)
    }

    /// The value for CR3.
    pub fn cr3(&self) -> u64 {
        self.root
    }

    /// Maps `[gva, gva + size)` to `[gpa, gpa + size)` with `flags` on the
    /// leaf. Tables on the way are created present, writable and
    /// user-accessible so that the leaf decides.
    pub fn map(
        &mut self,
        gva: u64,
        gpa: u64,
        size: PageSize,
        flags: PteFlags,
    ) -> Result<(), BuildError> {
        let bytes = size.bytes();
        for (what, address) in [("linear address", gva), ("physical address", gpa)] {
            if address % bytes != 0 {
                return Err(BuildError::Misaligned {
                    what,
                    address,
                    size: bytes,
                });
            }
        }
        let mut table = self.root;
        for level in Level::WALK {
            let slot = table + ((gva >> level.shift()) & 0x1ff) * 8;
            if level == size.leaf() {
                let large = if size == PageSize::Size4K { 0 } else { LARGE };
                return self.put(slot, gpa | large | flags.bits());
            }
            let entry = self.get(slot)?;
            table = if entry & PteFlags::PRESENT.bits() == 0 {
                let new = self.alloc()?;
                self.put(slot, new | PteFlags::USER_RW.bits())?;
                new
            } else if entry & LARGE != 0 {
                return Err(BuildError::Overlap { address: gva });
            } else {
                entry & ADDR_MASK
            };
        }
        Err(BuildError::Overlap { address: gva })
    }

    /// Maps `len` bytes at `gva` to `gpa` with 4 KiB pages.
    pub fn map_range(
        &mut self,
        gva: u64,
        gpa: u64,
        len: u64,
        flags: PteFlags,
    ) -> Result<(), BuildError> {
        for off in (0..len).step_by(TABLE as usize) {
            self.map(gva + off, gpa + off, PageSize::Size4K, flags)?;
        }
        Ok(())
    }

    /// Replaces the raw entry the walk for `gva` uses at `level`; returns
    /// the old value. Lets tests and adversarial guests build what a sane
    /// builder never would.
    pub fn set_entry(&mut self, gva: u64, level: Level, value: u64) -> Result<u64, BuildError> {
        let mut table = self.root;
        for l in Level::WALK {
            let slot = table + ((gva >> l.shift()) & 0x1ff) * 8;
            let entry = self.get(slot)?;
            if l == level {
                self.put(slot, value)?;
                return Ok(entry);
            }
            table = entry & ADDR_MASK;
        }
        Err(BuildError::Overlap { address: gva })
    }

    fn alloc(&mut self) -> Result<u64, BuildError> {
        let table = self.next;
        if table.checked_add(TABLE).is_none_or(|end| end > self.pool.1) {
            return Err(BuildError::PoolExhausted {
                start: self.pool.0,
                end: self.pool.1,
            });
        }
        self.mem
            .write_slice(&[0u8; TABLE as usize], GuestAddress(table))
            .map_err(|_| BuildError::Memory(table))?;
        self.next += TABLE;
        Ok(table)
    }

    fn get(&self, slot: u64) -> Result<u64, BuildError> {
        self.mem
            .read_obj(GuestAddress(slot))
            .map_err(|_| BuildError::Memory(slot))
    }

    fn put(&self, slot: u64, value: u64) -> Result<(), BuildError> {
        self.mem
            .write_obj(value, GuestAddress(slot))
            .map_err(|_| BuildError::Memory(slot))
    }
}
