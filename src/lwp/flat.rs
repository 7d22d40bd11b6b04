//! An in-memory user address space that implements [`UserMemory`] without a
//! guest: pages with permissions, and a log of every store. The unit's tests,
//! property tests, benchmarks and fuzz targets drive the unit through it.

use std::collections::BTreeMap;

use super::fault::{GuestFault, PF_PRESENT, PF_USER, PF_WRITE};
use super::memory::UserMemory;

/// Page size of the fake address space.
pub const PAGE: u64 = 4096;

/// What a page of the fake allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PagePerm {
    /// CPL3 may read and write.
    ReadWrite,
    /// CPL3 may read only.
    ReadOnly,
    /// Supervisor-only: CPL3 may not touch it.
    Supervisor,
}

/// A sparse, page-granular user address space.
#[derive(Debug, Default, Clone)]
pub struct FlatMemory {
    pages: BTreeMap<u64, (PagePerm, Box<[u8; PAGE as usize]>)>,
    writes: Vec<(u64, u64)>,
}

impl FlatMemory {
    /// An empty address space.
    pub fn new() -> Self {
        FlatMemory::default()
    }

    /// Maps the pages covering `[address, address + len)` with `perm`,
    /// zero-filled; pages already mapped keep their bytes.
    pub fn map(&mut self, address: u64, len: u64, perm: PagePerm) {
        let first = address / PAGE;
        let last = address.saturating_add(len.max(1) - 1) / PAGE;
        for page in first..=last {
            self.pages
                .entry(page)
                .and_modify(|p| p.0 = perm)
                .or_insert_with(|| (perm, Box::new([0; PAGE as usize])));
        }
    }

    /// Removes the page holding `address`.
    pub fn unmap(&mut self, address: u64) {
        self.pages.remove(&(address / PAGE));
    }

    /// Every successful store so far, as `(address, length)`.
    pub fn writes(&self) -> &[(u64, u64)] {
        &self.writes
    }

    /// Forgets the store log.
    pub fn clear_writes(&mut self) {
        self.writes.clear();
    }

    /// Copies bytes out without permission checks (what a test inspects).
    /// Unmapped bytes read as zero.
    pub fn peek(&self, address: u64, buf: &mut [u8]) {
        for (i, b) in buf.iter_mut().enumerate() {
            let a = address.wrapping_add(i as u64);
            *b = self
                .pages
                .get(&(a / PAGE))
                .map_or(0, |p| p.1[(a % PAGE) as usize]);
        }
    }

    /// Copies bytes in without permission checks or logging (test setup).
    /// Bytes that fall on unmapped pages are dropped.
    pub fn poke(&mut self, address: u64, bytes: &[u8]) {
        for (i, b) in bytes.iter().enumerate() {
            let a = address.wrapping_add(i as u64);
            if let Some(p) = self.pages.get_mut(&(a / PAGE)) {
                p.1[(a % PAGE) as usize] = *b;
            }
        }
    }

    fn check(&self, address: u64, len: u64, write: bool) -> Result<(), GuestFault> {
        if len == 0 {
            return Ok(());
        }
        let end = address
            .checked_add(len - 1)
            .ok_or(GuestFault::GeneralProtection)?;
        let write_bit = if write { PF_WRITE } else { 0 };
        for page in address / PAGE..=end / PAGE {
            let fault_at = (page * PAGE).max(address);
            match self.pages.get(&page).map(|p| p.0) {
                None => {
                    return Err(GuestFault::PageFault {
                        address: fault_at,
                        error_code: PF_USER | write_bit,
                    });
                }
                Some(PagePerm::Supervisor) => {
                    return Err(GuestFault::PageFault {
                        address: fault_at,
                        error_code: PF_PRESENT | PF_USER | write_bit,
                    });
                }
                Some(PagePerm::ReadOnly) if write => {
                    return Err(GuestFault::PageFault {
                        address: fault_at,
                        error_code: PF_PRESENT | PF_USER | PF_WRITE,
                    });
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}

impl UserMemory for FlatMemory {
    fn read_user(&mut self, address: u64, buf: &mut [u8]) -> Result<(), GuestFault> {
        self.check(address, buf.len() as u64, false)?;
        self.peek(address, buf);
        Ok(())
    }

    fn write_user(&mut self, address: u64, buf: &[u8]) -> Result<(), GuestFault> {
        self.check(address, buf.len() as u64, true)?;
        self.poke(address, buf);
        self.writes.push((address, buf.len() as u64));
        Ok(())
    }

    fn check_user_write(&mut self, address: u64, len: u64) -> Result<(), GuestFault> {
        self.check(address, len, true)
    }

    fn check_user_read(&mut self, address: u64, len: u64) -> Result<(), GuestFault> {
        self.check(address, len, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permissions() {
        let mut m = FlatMemory::new();
        m.map(0x1000, PAGE, PagePerm::ReadWrite);
        m.map(0x2000, PAGE, PagePerm::ReadOnly);
        m.map(0x3000, PAGE, PagePerm::Supervisor);
        let mut b = [0u8; 8];
        let table: [(u64, bool, Result<(), GuestFault>); 7] = [
            (0x1000, true, Ok(())),
            (0x2000, false, Ok(())),
            (
                0x2000,
                true,
                Err(GuestFault::PageFault {
                    address: 0x2000,
                    error_code: 7,
                }),
            ),
            (
                0x3000,
                false,
                Err(GuestFault::PageFault {
                    address: 0x3000,
                    error_code: 5,
                }),
            ),
            (
                0x4000,
                true,
                Err(GuestFault::PageFault {
                    address: 0x4000,
                    error_code: 6,
                }),
            ),
            (
                0x1ffc,
                true,
                Err(GuestFault::PageFault {
                    address: 0x2000,
                    error_code: 7,
                }),
            ),
            (u64::MAX - 3, false, Err(GuestFault::GeneralProtection)),
        ];
        for (addr, write, want) in table {
            let got = if write {
                m.write_user(addr, &b)
            } else {
                m.read_user(addr, &mut b)
            };
            assert_eq!(got, want, "{addr:#x} write={write}");
        }
        assert_eq!(m.writes(), &[(0x1000, 8)]);
    }
}
