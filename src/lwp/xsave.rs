//! XSAVE state component 62: the 128-byte LWP save area (fact sheet §2.1).
//!
//! KVM refuses XSTATE_BV bit 62, so lwpvmm never puts this image inside
//! KVM's XSAVE buffer: it travels beside it, in paravirtual save/restore
//! calls and in snapshots.

use vm_memory::ByteValued;

use super::record::RECORD_SIZE;

/// The XSAVE component index (and XCR0 bit) of LWP state.
pub const XSAVE_COMPONENT_LWP: u32 = 62;
/// Size of the save area.
pub const XSAVE_LWP_SIZE: usize = 128;
/// The standard-format offset on Family 15h (informational: on Zen the range
/// belongs to other state, which is why lwpvmm keeps the image apart).
pub const XSAVE_LWP_FAM15H_OFFSET: usize = 0x340;

/// The LWP save area, byte for byte.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LwpXsaveArea {
    /// LWP_CBADDR (0 in the init state: LWP off).
    pub lwpcb_address: u64,
    /// The enables in force.
    pub flags: u32,
    /// BufferHeadOffset.
    pub head: u32,
    /// BufferBase.
    pub buffer_base: u64,
    /// BufferSize (with Random in 31:28, as in the LWPCB).
    pub buffer_size: u32,
    /// Filters.
    pub filters: u32,
    /// A record not yet stored to the ring.
    pub saved_record: [u8; RECORD_SIZE],
    /// EventCounter1 to EventCounter16 (counter n at index n - 1).
    pub counters: [u32; 16],
}

const _: () = assert!(std::mem::size_of::<LwpXsaveArea>() == XSAVE_LWP_SIZE);

// SAFETY: LwpXsaveArea is repr(C) and made only of integers and byte arrays
// with no padding (the size assertion pins 128 bytes, the sum of the
// fields), so every byte pattern is a valid value.
unsafe impl ByteValued for LwpXsaveArea {}

impl Default for LwpXsaveArea {
    fn default() -> Self {
        LwpXsaveArea::INIT
    }
}

impl LwpXsaveArea {
    /// The init state: all zero, LWP disabled.
    pub const INIT: LwpXsaveArea = LwpXsaveArea {
        lwpcb_address: 0,
        flags: 0,
        head: 0,
        buffer_base: 0,
        buffer_size: 0,
        filters: 0,
        saved_record: [0; RECORD_SIZE],
        counters: [0; 16],
    };

    /// Decodes the 128 bytes.
    pub fn from_bytes(bytes: &[u8; XSAVE_LWP_SIZE]) -> Self {
        let mut area = LwpXsaveArea::INIT;
        area.as_mut_slice().copy_from_slice(bytes);
        area
    }

    /// Encodes the 128 bytes.
    pub fn to_bytes(&self) -> [u8; XSAVE_LWP_SIZE] {
        let mut out = [0u8; XSAVE_LWP_SIZE];
        out.copy_from_slice(self.as_slice());
        out
    }

    /// True in the init state (LWP off).
    pub fn is_init(&self) -> bool {
        self.lwpcb_address == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Piledriver dump from rr issue 1552 (fact sheet §2.1).
    fn piledriver_bytes() -> [u8; XSAVE_LWP_SIZE] {
        let mut b = [0u8; XSAVE_LWP_SIZE];
        b[0x00..0x08].copy_from_slice(&0x7000_1000u64.to_le_bytes());
        b[0x08..0x0C].copy_from_slice(&0x8000_0008u32.to_le_bytes());
        b[0x0C..0x10].copy_from_slice(&0u32.to_le_bytes());
        b[0x10..0x18].copy_from_slice(&0x7000_2000u64.to_le_bytes());
        b[0x18..0x1C].copy_from_slice(&0x2000u32.to_le_bytes());
        b[0x1C..0x20].copy_from_slice(&0x2800_0000u32.to_le_bytes());
        b[0x48..0x4C].copy_from_slice(&0x2702Au32.to_le_bytes());
        b
    }

    #[test]
    fn decodes_the_piledriver_dump() {
        let bytes = piledriver_bytes();
        let area = LwpXsaveArea::from_bytes(&bytes);
        assert_eq!(area.lwpcb_address, 0x7000_1000);
        assert_eq!(area.flags, 0x8000_0008);
        assert_eq!(area.head, 0);
        assert_eq!(area.buffer_base, 0x7000_2000);
        assert_eq!(area.buffer_size, 0x2000);
        assert_eq!(area.filters, 0x2800_0000);
        assert_eq!(area.saved_record, [0; RECORD_SIZE]);
        assert_eq!(area.counters[2], 0x2702A, "EventCounter3 at 0x48");
        assert!(
            area.counters
                .iter()
                .enumerate()
                .all(|(i, &c)| i == 2 || c == 0)
        );
        assert_eq!(area.to_bytes(), bytes, "byte-for-byte round trip");
    }

    #[test]
    fn init_state() {
        assert!(LwpXsaveArea::INIT.is_init());
        assert_eq!(LwpXsaveArea::default().to_bytes(), [0; XSAVE_LWP_SIZE]);
        assert!(!LwpXsaveArea::from_bytes(&piledriver_bytes()).is_init());
    }

    #[test]
    fn every_byte_round_trips() {
        let mut bytes = [0u8; XSAVE_LWP_SIZE];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(37).wrapping_add(11);
        }
        assert_eq!(LwpXsaveArea::from_bytes(&bytes).to_bytes(), bytes);
    }
}
