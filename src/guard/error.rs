//! What the guard refuses, each variant naming the check that failed, and the
//! architectural fault the guest receives for it.

use std::fmt;

use thiserror::Error;

use crate::lwp::fault::{
    GuestFault, PF_FETCH, PF_PRESENT, PF_PROTECTION_KEY, PF_RESERVED, PF_USER, PF_WRITE,
};

use super::access::Access;

/// A level of the 4-level page-table walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Level {
    /// Page-map level 4 (bits 47:39).
    Pml4,
    /// Page-directory-pointer table (bits 38:30); may map a 1 GiB page.
    Pdpt,
    /// Page directory (bits 29:21); may map a 2 MiB page.
    Pd,
    /// Page table (bits 20:12).
    Pt,
}

impl Level {
    /// The walk order.
    pub const WALK: [Level; 4] = [Level::Pml4, Level::Pdpt, Level::Pd, Level::Pt];

    /// The lowest address bit this level indexes.
    pub fn shift(self) -> u32 {
        match self {
            Level::Pml4 => 39,
            Level::Pdpt => 30,
            Level::Pd => 21,
            Level::Pt => 12,
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Level::Pml4 => "PML4E",
            Level::Pdpt => "PDPTE",
            Level::Pd => "PDE",
            Level::Pt => "PTE",
        })
    }
}

/// Why the guard refused an access.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum GuardError {
    /// The guest is not in 4-level long-mode paging.
    #[error("unsupported paging mode: {0}")]
    UnsupportedPaging(&'static str),
    /// The linear address is not canonical.
    #[error("linear address {address:#x} is not canonical")]
    NonCanonical {
        /// The address.
        address: u64,
    },
    /// The range runs past the end of the address space.
    #[error("range of {len:#x} bytes at {address:#x} wraps past 2^64")]
    RangeWraps {
        /// Start of the range.
        address: u64,
        /// Its length.
        len: u64,
    },
    /// A paging entry is not present.
    #[error("{level} for {address:#x} is not present")]
    NotPresent {
        /// The address being translated.
        address: u64,
        /// The level whose entry is clear.
        level: Level,
        /// The access.
        access: Access,
    },
    /// A paging entry sets a reserved bit.
    #[error("{level} for {address:#x} sets a reserved bit")]
    ReservedBit {
        /// The address being translated.
        address: u64,
        /// The level with the bad entry.
        level: Level,
        /// The access.
        access: Access,
    },
    /// A CPL3 access to a supervisor-only page.
    #[error("{address:#x} is supervisor-only ({level} U/S clear)")]
    SupervisorOnly {
        /// The address.
        address: u64,
        /// The first level with U/S clear.
        level: Level,
        /// The access.
        access: Access,
    },
    /// A write to a read-only page.
    #[error("{address:#x} is read-only ({level} R/W clear)")]
    ReadOnly {
        /// The address.
        address: u64,
        /// The first level with R/W clear.
        level: Level,
        /// The access.
        access: Access,
    },
    /// An instruction fetch from a no-execute page.
    #[error("{address:#x} is not executable")]
    NoExecute {
        /// The address.
        address: u64,
        /// The access.
        access: Access,
    },
    /// A data access to a user page its protection key forbids (PKRU).
    #[error("{address:#x} has protection key {key}, which PKRU forbids for this access")]
    ProtectionKey {
        /// The address.
        address: u64,
        /// The page's key.
        key: u8,
        /// The access.
        access: Access,
    },
    /// A supervisor access to a user page under SMAP or SMEP.
    #[error("supervisor access to user page {address:#x} under SMAP/SMEP")]
    UserPageFromSupervisor {
        /// The address.
        address: u64,
        /// The access.
        access: Access,
    },
    /// A paging structure lies outside guest RAM.
    #[error("{level} for {address:#x} lies at {gpa:#x}, outside guest RAM")]
    TableOutsideRam {
        /// The address being translated.
        address: u64,
        /// The level whose table is outside RAM.
        level: Level,
        /// Physical address of the entry.
        gpa: u64,
    },
    /// The page itself is not guest RAM (a hole, MMIO, past the end).
    #[error("{address:#x} maps to {gpa:#x}, outside guest RAM")]
    PageOutsideRam {
        /// The linear address.
        address: u64,
        /// The physical address it maps to.
        gpa: u64,
    },
    /// Other vCPUs kept changing the entries while the walk set A/D bits.
    #[error("page tables for {address:#x} changed under the walk too often")]
    Contended {
        /// The address.
        address: u64,
    },
    /// An atomic 16-byte access to an address that is not 16-byte aligned.
    #[error("atomic 16-byte access to {address:#x}, which is not 16-byte aligned")]
    Misaligned {
        /// The address.
        address: u64,
    },
}

impl GuardError {
    /// The fault the guest receives for this refusal: #PF with the error code
    /// the CPU would push for a page-table refusal, #GP(0) for a
    /// non-canonical or wrapping address and for anything that is not guest
    /// RAM (LWP only ever stores to RAM).
    pub fn fault(&self) -> GuestFault {
        let pf = |address: u64, access: Access, extra: u32| GuestFault::PageFault {
            address,
            error_code: access.error_code() | extra,
        };
        match *self {
            GuardError::NotPresent {
                address, access, ..
            } => pf(address, access, 0),
            GuardError::ReservedBit {
                address, access, ..
            } => pf(address, access, PF_PRESENT | PF_RESERVED),
            GuardError::SupervisorOnly {
                address, access, ..
            }
            | GuardError::ReadOnly {
                address, access, ..
            }
            | GuardError::NoExecute { address, access }
            | GuardError::UserPageFromSupervisor { address, access } => {
                pf(address, access, PF_PRESENT)
            }
            GuardError::ProtectionKey {
                address, access, ..
            } => pf(address, access, PF_PRESENT | PF_PROTECTION_KEY),
            GuardError::UnsupportedPaging(_)
            | GuardError::NonCanonical { .. }
            | GuardError::RangeWraps { .. }
            | GuardError::TableOutsideRam { .. }
            | GuardError::PageOutsideRam { .. }
            | GuardError::Contended { .. }
            | GuardError::Misaligned { .. } => GuestFault::GeneralProtection,
        }
    }
}

impl Access {
    /// The W, U and I/D bits of a #PF error code for this access.
    pub fn error_code(self) -> u32 {
        let mut code = 0;
        if self.is_write() {
            code |= PF_WRITE;
        }
        if self.is_user() {
            code |= PF_USER;
        }
        if self.is_fetch() {
            code |= PF_FETCH;
        }
        code
    }
}
