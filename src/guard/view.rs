//! A vCPU's view of guest memory: linear-address reads, writes and checks,
//! split at page boundaries, each page translated and its physical range
//! checked against guest RAM on every call.

use crate::lwp::fault::GuestFault;
use crate::lwp::memory::UserMemory;

use super::access::Access;
use super::error::GuardError;
use super::paging::{
    Marking, Paging, TableCache, is_canonical, probe_cached, translate, translate_in,
};
use super::ram::GuestMemory;
use super::ram::Ram;

/// Guest memory as seen through one vCPU's page tables.
#[derive(Debug, Clone, Copy)]
pub struct GuestView<'a> {
    mem: &'a GuestMemory,
    paging: Paging,
}

impl<'a> GuestView<'a> {
    /// A view of `mem` through `paging`.
    pub fn new(mem: &'a GuestMemory, paging: Paging) -> Self {
        GuestView { mem, paging }
    }

    /// The paging state the view walks.
    pub fn paging(&self) -> &Paging {
        &self.paging
    }

    /// Translates one address for `access`, without marking any entry. This
    /// is the page walk alone: whether the result is guest RAM is what
    /// [`check`](Self::check), [`read`](Self::read) and [`write`](Self::write)
    /// add.
    pub fn translate(&self, address: u64, access: Access) -> Result<u64, GuardError> {
        let t = translate(self.mem, &self.paging, address, access, Marking::Probe)?;
        Ok(t.gpa)
    }

    /// Checks that `len` bytes at `address` may be accessed as `access` and
    /// lie in guest RAM, without touching the data.
    pub fn check(&self, address: u64, len: u64, access: Access) -> Result<(), GuardError> {
        self.each_page(address, len, access, Marking::Probe, |_, _, _, _| Ok(()))
    }

    /// Reads `buf.len()` bytes at `address` as `access`.
    pub fn read(&self, address: u64, buf: &mut [u8], access: Access) -> Result<(), GuardError> {
        let marking = Marking::SetAccessedDirty;
        self.each_page(
            address,
            buf.len() as u64,
            access,
            marking,
            |ram, gpa, at, len| {
                ram.read(gpa, &mut buf[at..at + len]).then_some(()).ok_or(
                    GuardError::PageOutsideRam {
                        address: address.wrapping_add(at as u64),
                        gpa,
                    },
                )
            },
        )
    }

    /// Writes `buf` at `address` as `access`. Every page is checked before
    /// the first byte is stored, so a refused write stores nothing (unless
    /// another vCPU changes the page tables between the check and the store;
    /// every byte stored is still one this access may store).
    pub fn write(&self, address: u64, buf: &[u8], access: Access) -> Result<(), GuardError> {
        self.check(address, buf.len() as u64, access)?;
        let marking = Marking::SetAccessedDirty;
        self.each_page(
            address,
            buf.len() as u64,
            access,
            marking,
            |ram, gpa, at, len| {
                ram.write(gpa, &buf[at..at + len])
                    .then_some(())
                    .ok_or(GuardError::PageOutsideRam {
                        address: address.wrapping_add(at as u64),
                        gpa,
                    })
            },
        )
    }

    /// Compares the 16 bytes at `address` with `expected` and stores `new`
    /// when they are equal, atomically, as `access` (a store: the CPU
    /// writes the operand back either way); returns what was there. The
    /// address must be 16-byte aligned, so the operand lies in one page.
    pub fn compare_exchange_u128(
        &self,
        address: u64,
        expected: u128,
        new: u128,
        access: Access,
    ) -> Result<u128, GuardError> {
        if !address.is_multiple_of(16) {
            return Err(GuardError::Misaligned { address });
        }
        let mut found = 0;
        self.each_page(
            address,
            16,
            access,
            Marking::SetAccessedDirty,
            |ram, gpa, _, _| {
                found = ram
                    .compare_exchange_u128(gpa, expected, new)
                    .ok_or(GuardError::PageOutsideRam { address, gpa })?;
                Ok(())
            },
        )?;
        Ok(found)
    }

    /// Walks `[address, address + len)` a page at a time; for each piece
    /// checks RAM and calls `f(ram, gpa, offset into the range, length)`.
    fn each_page(
        &self,
        address: u64,
        len: u64,
        access: Access,
        marking: Marking,
        mut f: impl FnMut(&mut Ram<'a>, u64, usize, usize) -> Result<(), GuardError>,
    ) -> Result<(), GuardError> {
        if len == 0 {
            return Ok(());
        }
        let last = address
            .checked_add(len - 1)
            .ok_or(GuardError::RangeWraps { address, len })?;
        for end in [address, last] {
            if !is_canonical(end) {
                return Err(GuardError::NonCanonical { address: end });
            }
        }
        let mut done = 0u64;
        let mut tables = TableCache::default();
        let mut ram = Ram::new(self.mem);
        while done < len {
            let at = address + done;
            let t = match marking {
                Marking::Probe => probe_cached(&mut ram, &self.paging, at, access, &mut tables)?,
                Marking::SetAccessedDirty => {
                    translate_in(&mut ram, &self.paging, at, access, marking)?
                }
            };
            let piece = t.page_remaining.min(len - done);
            let in_ram = usize::try_from(piece).is_ok_and(|n| ram.contains(t.gpa, n));
            if !in_ram {
                return Err(GuardError::PageOutsideRam {
                    address: at,
                    gpa: t.gpa,
                });
            }
            f(&mut ram, t.gpa, done as usize, piece as usize)?;
            done += piece;
        }
        Ok(())
    }
}

impl UserMemory for GuestView<'_> {
    fn read_user(&mut self, address: u64, buf: &mut [u8]) -> Result<(), GuestFault> {
        self.read(address, buf, Access::UserRead)
            .map_err(|e| e.fault())
    }

    fn write_user(&mut self, address: u64, buf: &[u8]) -> Result<(), GuestFault> {
        self.write(address, buf, Access::UserWrite)
            .map_err(|e| e.fault())
    }

    fn check_user_write(&mut self, address: u64, len: u64) -> Result<(), GuestFault> {
        self.check(address, len, Access::UserWrite)
            .map_err(|e| e.fault())
    }

    fn check_user_read(&mut self, address: u64, len: u64) -> Result<(), GuestFault> {
        self.check(address, len, Access::UserRead)
            .map_err(|e| e.fault())
    }

    fn write_user_fields(
        &mut self,
        base: u64,
        span: u64,
        fields: &[(u64, &[u8])],
    ) -> Result<(), GuestFault> {
        self.check(base, span, Access::UserWrite)
            .map_err(|e| e.fault())?;
        // Each 4 KiB page of the span translated once, with Accessed and
        // Dirty set as the stores would; the span is a block of a few
        // hundred bytes, so a page or two (a longer span's pages take turns
        // in the two slots).
        let mut pages = [(u64::MAX, 0u64); 2];
        let mut next = 0;
        let mut ram = Ram::new(self.mem);
        for &(offset, bytes) in fields {
            let start = base
                .checked_add(offset)
                .ok_or(GuestFault::GeneralProtection)?;
            let mut done = 0usize;
            while done < bytes.len() {
                let at = start.wrapping_add(done as u64);
                let page = at & !0xfff;
                let gpa_page = match pages.iter().find(|(p, _)| *p == page) {
                    Some(&(_, g)) => g,
                    None => {
                        let t = translate_in(
                            &mut ram,
                            &self.paging,
                            page,
                            Access::UserWrite,
                            Marking::SetAccessedDirty,
                        )
                        .map_err(|e| e.fault())?;
                        pages[next] = (page, t.gpa);
                        next = (next + 1) % pages.len();
                        t.gpa
                    }
                };
                let in_page = (0x1000 - (at & 0xfff)) as usize;
                let piece = in_page.min(bytes.len() - done);
                let gpa = gpa_page + (at & 0xfff);
                if !ram.write(gpa, &bytes[done..done + piece]) {
                    return Err(GuardError::PageOutsideRam { address: at, gpa }.fault());
                }
                done += piece;
            }
        }
        Ok(())
    }
}
