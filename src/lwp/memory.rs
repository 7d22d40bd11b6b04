//! The one door through which the LWP unit reaches guest memory: linear
//! addresses accessed as a CPL3 access would be. The VMM implements it with
//! the guard (page walk plus RAM check); tests implement it with a fake.

use super::fault::GuestFault;

/// User-mode (CPL3) access to guest-linear memory.
///
/// Every call is checked on its own: an implementation must not cache a
/// translation between calls, because the guest may change its page tables
/// at any time.
pub trait UserMemory {
    /// Reads `buf.len()` bytes at `address` as a CPL3 load.
    fn read_user(&mut self, address: u64, buf: &mut [u8]) -> Result<(), GuestFault>;

    /// Writes `buf` at `address` as a CPL3 store.
    fn write_user(&mut self, address: u64, buf: &[u8]) -> Result<(), GuestFault>;

    /// Checks that `len` bytes at `address` could be stored at CPL3, without
    /// storing anything.
    fn check_user_write(&mut self, address: u64, len: u64) -> Result<(), GuestFault>;

    /// Checks that `len` bytes at `address` could be loaded at CPL3, without
    /// reading anything.
    fn check_user_read(&mut self, address: u64, len: u64) -> Result<(), GuestFault>;

    /// Stores each `(offset, bytes)` of `fields` at `base + offset` as CPL3
    /// stores, after checking the `span` bytes at `base` that hold them all:
    /// a refused span stores nothing. One call, so an implementation may
    /// translate each page of the span once (the guard does, for LLWPCB's
    /// write-back); the fields are written where they are, nothing between.
    fn write_user_fields(
        &mut self,
        base: u64,
        span: u64,
        fields: &[(u64, &[u8])],
    ) -> Result<(), GuestFault> {
        self.check_user_write(base, span)?;
        for &(offset, bytes) in fields {
            let at = base
                .checked_add(offset)
                .ok_or(GuestFault::GeneralProtection)?;
            self.write_user(at, bytes)?;
        }
        Ok(())
    }
}

/// Reads a little-endian `u32`.
pub(crate) fn read_u32(mem: &mut dyn UserMemory, address: u64) -> Result<u32, GuestFault> {
    let mut b = [0u8; 4];
    mem.read_user(address, &mut b)?;
    Ok(u32::from_le_bytes(b))
}
