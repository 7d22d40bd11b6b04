//! Guest RAM as one guard operation reaches it: the region the last access
//! hit is remembered, because a page walk and the range it checks keep to
//! one or two regions, and looking the region up anew for every paging entry
//! and every page cost more than the walk's own logic. Every access is still
//! bounds-checked against the region it lands in; an access no single region
//! holds falls back to the whole memory's checked path.

use std::sync::atomic::Ordering;

use portable_atomic::AtomicU128;

use vm_memory::bitmap::{AtomicBitmap, Bitmap};
use vm_memory::{
    Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion, GuestRegionMmap,
    MemoryRegionAddress,
};

type Region = GuestRegionMmap<AtomicBitmap>;

/// The guest memory type the VMM uses. Each region keeps a bitmap of the
/// pages lwpvmm itself wrote (vm-memory marks it on every write), which
/// diff snapshots merge with KVM's dirty log of the guest's own writes.
pub type GuestMemory = vm_memory::GuestMemoryMmap<vm_memory::bitmap::AtomicBitmap>;

/// One operation's accesses to guest RAM.
pub(crate) struct Ram<'m> {
    mem: &'m GuestMemory,
    last: Option<&'m Region>,
}

impl<'m> Ram<'m> {
    pub(crate) fn new(mem: &'m GuestMemory) -> Self {
        Ram { mem, last: None }
    }

    /// The region holding all of `[gpa, gpa + len)`, and the offset of
    /// `gpa` in it; `None` when no single region does.
    pub(crate) fn region(
        &mut self,
        gpa: u64,
        len: usize,
    ) -> Option<(&'m Region, MemoryRegionAddress)> {
        let holds = |r: &Region| {
            let offset = gpa.checked_sub(r.start_addr().0)?;
            let end = offset.checked_add(len as u64)?;
            (end <= r.len()).then_some(MemoryRegionAddress(offset))
        };
        if let Some(r) = self.last
            && let Some(offset) = holds(r)
        {
            return Some((r, offset));
        }
        let r = self.mem.find_region(GuestAddress(gpa))?;
        self.last = Some(r);
        holds(r).map(|offset| (r, offset))
    }

    /// The aligned 64-bit paging entry at `gpa`, read atomically (an atomic
    /// access never spans regions, in vm-memory either).
    pub(crate) fn load_u64(&mut self, gpa: u64) -> Option<u64> {
        let (r, offset) = self.region(gpa, 8)?;
        r.load(offset, Ordering::Acquire).ok()
    }

    /// True when `[gpa, gpa + len)` lies in guest RAM.
    pub(crate) fn contains(&mut self, gpa: u64, len: usize) -> bool {
        self.region(gpa, len).is_some()
            || GuestMemoryBackend::check_range(self.mem, GuestAddress(gpa), len)
    }

    /// Reads `buf.len()` bytes at `gpa`; false when they are not all RAM.
    pub(crate) fn read(&mut self, gpa: u64, buf: &mut [u8]) -> bool {
        match self.region(gpa, buf.len()) {
            Some((r, offset)) => r.read_slice(buf, offset).is_ok(),
            None => self.mem.read_slice(buf, GuestAddress(gpa)).is_ok(),
        }
    }

    /// Compares the 16 bytes at `gpa` with `expected` and stores `new` there
    /// when they are equal, as one atomic operation of the host CPU, as a
    /// guest's locked CMPXCHG16B would; returns what was there. The range
    /// is marked dirty, since the CPU writes the operand back either way.
    /// `None` when `gpa` is not 16-byte aligned or not RAM.
    pub(crate) fn compare_exchange_u128(
        &mut self,
        gpa: u64,
        expected: u128,
        new: u128,
    ) -> Option<u128> {
        if !gpa.is_multiple_of(16) {
            return None;
        }
        let (r, offset) = self.region(gpa, 16)?;
        let slice = r.get_slice(offset, 16).ok()?;
        let guard = slice.ptr_guard_mut();
        let target = guard.as_ptr().cast::<u128>();
        // SAFETY: `target` is the host mapping of 16 bytes of guest RAM that
        // the region holds (get_slice checked the range), 16-byte aligned
        // because the region's mapping is page aligned and `gpa` is 16-byte
        // aligned, and the guard keeps the mapping alive while it is used.
        // Other vCPUs and the guest access the bytes concurrently, only
        // ever through atomic instructions or plain stores, as guest code
        // on real hardware would.
        let atomic = unsafe { AtomicU128::from_ptr(target) };
        let found = match atomic.compare_exchange(expected, new, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(v) | Err(v) => v,
        };
        slice.bitmap().mark_dirty(0, 16);
        Some(found)
    }

    /// Writes `buf` at `gpa`, marking the pages dirty for diff snapshots;
    /// false when they are not all RAM.
    pub(crate) fn write(&mut self, gpa: u64, buf: &[u8]) -> bool {
        match self.region(gpa, buf.len()) {
            Some((r, offset)) => r.write_slice(buf, offset).is_ok(),
            None => self.mem.write_slice(buf, GuestAddress(gpa)).is_ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two adjacent regions, then a hole: RAM is [0, 0x3000) and
    /// [0x4000, 0x5000).
    fn mem() -> GuestMemory {
        GuestMemory::from_ranges(&[
            (GuestAddress(0), 0x2000),
            (GuestAddress(0x2000), 0x1000),
            (GuestAddress(0x4000), 0x1000),
        ])
        .unwrap()
    }

    #[test]
    fn ranges_are_ram_only_where_regions_hold_them() {
        let mem = mem();
        let mut ram = Ram::new(&mem);
        for (gpa, len, ram_holds) in [
            (0x0, 0x2000, true),
            (0x1ff8, 8, true),
            (0x1ffc, 8, true),
            (0x1000, 0x2000, true),
            (0x2ff8, 16, false),
            (0x3000, 1, false),
            (0x4000, 0x1000, true),
            (0x4ff9, 8, false),
            (u64::MAX - 3, 8, false),
        ] {
            assert_eq!(ram.contains(gpa, len), ram_holds, "{gpa:#x}+{len:#x}");
            let mut buf = vec![0u8; len];
            assert_eq!(ram.read(gpa, &mut buf), ram_holds, "read {gpa:#x}");
            assert_eq!(ram.write(gpa, &buf), ram_holds, "write {gpa:#x}");
        }
    }

    #[test]
    fn writes_land_where_the_whole_memory_sees_them_and_are_marked_dirty() {
        use vm_memory::bitmap::Bitmap;
        let mem = mem();
        let mut ram = Ram::new(&mem);
        for (gpa, value) in [
            (0x1ffcu64, 0x1122_3344_5566_7788u64),
            (0x4010, 7),
            (0x10, 9),
        ] {
            assert!(ram.write(gpa, &value.to_le_bytes()));
            assert_eq!(mem.read_obj::<u64>(GuestAddress(gpa)).unwrap(), value);
            let (region, offset) = mem.to_region_addr(GuestAddress(gpa)).unwrap();
            assert!(
                region.bitmap().dirty_at(offset.0 as usize),
                "{gpa:#x} dirty"
            );
        }
        assert_eq!(ram.load_u64(0x4010), Some(7));
        assert_eq!(ram.load_u64(0x10), Some(9));
        assert_eq!(ram.load_u64(0x3000), None);
    }
}
