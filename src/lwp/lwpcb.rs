//! The LWP control block (LWPCB) in guest user memory: the fixed part as a
//! plain-old-data struct, the per-event interval/counter pairs, and the rules
//! LLWPCB applies when it loads a block (fact sheet §4).

use thiserror::Error;
use vm_memory::ByteValued;

use super::cpuid::{LwpCaps, LwpFeatures};

/// Offset of Flags.
pub const OFF_FLAGS: u64 = 0;
/// Offset of BufferSize (27:0) and Random (31:28).
pub const OFF_BUFFER_SIZE: u64 = 4;
/// Offset of BufferHeadOffset.
pub const OFF_HEAD: u64 = 16;
/// Offset of MissedEvents.
pub const OFF_MISSED: u64 = 24;
/// Offset of Threshold.
pub const OFF_THRESHOLD: u64 = 32;
/// Offset of BufferTailOffset (owned by software).
pub const OFF_TAIL: u64 = 64;
/// Size of the fixed part, up to the first possible EventOffset.
pub const FIXED_SIZE: usize = 88;
/// The highest hardware EventId any LWP implementation defines.
pub const MAX_EVENT_ID: usize = 6;
/// The largest positive value of a signed 26-bit field.
pub const S26_MAX: i32 = (1 << 25) - 1;

const S26_MASK: u32 = (1 << 26) - 1;
const BUFFER_SIZE_MASK: u32 = (1 << 28) - 1;

/// The fixed part of an LWPCB, byte for byte as it lies in guest memory.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LwpcbFixed {
    /// Requested (and, after LLWPCB, granted) enables.
    pub flags: u32,
    /// BufferSize in bits 27:0, Random in bits 31:28.
    pub buffer_size_random: u32,
    /// Linear address of the ring.
    pub buffer_base: u64,
    /// BufferHeadOffset: next record slot, owned by the unit.
    pub head: u32,
    /// Reserved.
    pub reserved0: u32,
    /// MissedEvents.
    pub missed_events: u64,
    /// Threshold (bytes of unread data that raise the interrupt).
    pub threshold: u32,
    /// Filters.
    pub filters: u32,
    /// BaseIP of the IP filter.
    pub base_ip: u64,
    /// LimitIP of the IP filter.
    pub limit_ip: u64,
    /// Reserved.
    pub reserved1: u64,
    /// BufferTailOffset: oldest unread record, owned by software.
    pub tail: u32,
    /// Reserved.
    pub reserved2: u32,
    /// Reserved for software.
    pub software: [u64; 2],
}

const _: () = assert!(std::mem::size_of::<LwpcbFixed>() == FIXED_SIZE);

// SAFETY: LwpcbFixed is repr(C), made only of integers laid out with no
// padding (the size assertion above pins 88 bytes, the sum of the fields),
// so every byte pattern is a valid value.
unsafe impl ByteValued for LwpcbFixed {}

/// Sign-extends a signed 26-bit field; bits 31:26 are reserved and ignored.
pub fn s26(raw: u32) -> i32 {
    (((raw & S26_MASK) << 6) as i32) >> 6
}

/// Encodes a signed 26-bit field with the reserved bits clear.
pub fn to_s26(value: i32) -> u32 {
    (value as u32) & S26_MASK
}

/// Why LLWPCB refuses a block (the guest gets #GP(0)).
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum LwpcbError {
    /// BufferSize, rounded down to whole records, is below the minimum.
    #[error("ring of {size} bytes is smaller than the minimum of {min} bytes")]
    BufferTooSmall {
        /// BufferSize after rounding.
        size: u32,
        /// The profile's minimum.
        min: u32,
    },
    /// A block read from a snapshot or save area does not hold together.
    #[error("inconsistent LWP state: {0}")]
    Inconsistent(&'static str),
}

/// The lowest interval LLWPCB accepts for each EventId (index 0 unused).
/// EventId 1 may be 0; the others are lwpvmm's choice (docs/lwp-model.md).
pub const MIN_INTERVAL: [i32; MAX_EVENT_ID + 1] = [0, 0, 0xF, 0xF, 0xF, 0xFFFF, 0xFFFF];

/// One event's interval and counter as the unit uses them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EventSlot {
    /// Events per record, minus one.
    pub interval: i32,
    /// Events left before the next record, minus one.
    pub counter: i32,
}

/// An LWPCB after LLWPCB's normalisation: what the unit runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LoadedLwpcb {
    /// Linear address of the LWPCB.
    pub address: u64,
    /// Granted enables (requested Flags ANDed with LWP_CFG and the profile).
    pub flags: LwpFeatures,
    /// Linear address of the ring.
    pub buffer_base: u64,
    /// Ring size in bytes, a whole number of records.
    pub buffer_size: u32,
    /// The Random field (kept and written back; lwpvmm does not randomise).
    pub random: u8,
    /// Next record slot.
    pub head: u32,
    /// Records lost since the block was loaded (and before).
    pub missed_events: u64,
    /// Threshold in bytes, a whole number of records.
    pub threshold: u32,
    /// Filters, kept as given.
    pub filters: u32,
    /// BaseIP.
    pub base_ip: u64,
    /// LimitIP.
    pub limit_ip: u64,
    /// Interval and counter per EventId; index 0 unused, beyond MaxEvents zero.
    pub events: [EventSlot; MAX_EVENT_ID + 1],
}

impl LoadedLwpcb {
    /// Applies LLWPCB's rules to a block read from memory. `grant` is what
    /// the OS allows (LWP_CFG's features for LLWPCB); `pairs` holds the raw
    /// (interval, counter) words of EventIds 1 to MaxEvents.
    pub fn normalize(
        caps: &LwpCaps,
        grant: LwpFeatures,
        address: u64,
        fixed: &LwpcbFixed,
        pairs: &[(u32, u32)],
    ) -> Result<LoadedLwpcb, LwpcbError> {
        let es = caps.event_size();
        let requested = LwpFeatures::from_bits_retain(fixed.flags);
        let flags = requested & caps.flag_mask() & grant;
        let size = fixed.buffer_size_random & BUFFER_SIZE_MASK;
        let size = size - size % es;
        if size < caps.min_buffer_bytes() {
            return Err(LwpcbError::BufferTooSmall {
                size,
                min: caps.min_buffer_bytes(),
            });
        }
        let head = if fixed.head >= size {
            0
        } else {
            fixed.head - fixed.head % es
        };
        let mut events = [EventSlot::default(); MAX_EVENT_ID + 1];
        for (id, &(interval, counter)) in pairs
            .iter()
            .enumerate()
            .take(usize::from(caps.max_events()).min(MAX_EVENT_ID))
            .map(|(i, p)| (i + 1, p))
        {
            events[id] = EventSlot {
                interval: s26(interval).max(MIN_INTERVAL[id]),
                counter: s26(counter).max(0),
            };
        }
        Ok(LoadedLwpcb {
            address,
            flags,
            buffer_base: fixed.buffer_base,
            buffer_size: size,
            random: (fixed.buffer_size_random >> 28) as u8,
            head,
            missed_events: fixed.missed_events,
            threshold: fixed.threshold - fixed.threshold % es,
            filters: fixed.filters,
            base_ip: fixed.base_ip,
            limit_ip: fixed.limit_ip,
            events,
        })
    }

    /// Checks a block that claims to be normalised already (snapshots): the
    /// same invariants LLWPCB establishes.
    pub fn check(&self, caps: &LwpCaps) -> Result<(), LwpcbError> {
        let es = caps.event_size();
        let invariant = |ok: bool, what: &'static str| {
            if ok {
                Ok(())
            } else {
                Err(LwpcbError::Inconsistent(what))
            }
        };
        invariant(self.address != 0, "LWPCB address is 0")?;
        invariant(
            caps.flag_mask().contains(self.flags),
            "flags outside the profile",
        )?;
        invariant(
            self.buffer_size >= caps.min_buffer_bytes()
                && self.buffer_size.is_multiple_of(es)
                && self.buffer_size <= BUFFER_SIZE_MASK,
            "buffer size",
        )?;
        invariant(
            self.head < self.buffer_size && self.head.is_multiple_of(es),
            "head offset",
        )?;
        invariant(self.threshold.is_multiple_of(es), "threshold")?;
        invariant(self.random < 16, "random")?;
        for (id, slot) in self.events.iter().enumerate().skip(1) {
            let in_profile = id <= usize::from(caps.max_events());
            let ok = if in_profile {
                (MIN_INTERVAL[id]..=S26_MAX).contains(&slot.interval)
                    && (0..=S26_MAX).contains(&slot.counter)
            } else {
                *slot == EventSlot::default()
            };
            invariant(ok, "event interval or counter")?;
        }
        Ok(())
    }

    /// The BufferSize word as written back (size and Random).
    pub fn buffer_size_word(&self) -> u32 {
        self.buffer_size | u32::from(self.random) << 28
    }

    /// Offset of EventInterval `id` in the block.
    pub fn interval_offset(caps: &LwpCaps, id: usize) -> u64 {
        u64::from(caps.event_offset()) + 8 * (id as u64 - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lwp::cpuid::LwpProfile;
    use crate::lwp::msr::LwpCfg;

    fn emulated() -> LwpCaps {
        LwpProfile::Emulated.caps().unwrap()
    }

    fn all_cfg(caps: &LwpCaps) -> LwpFeatures {
        LwpCfg::write(caps, u64::from(caps.flag_mask().bits()))
            .unwrap()
            .features()
    }

    #[test]
    fn field_offsets() {
        let f = LwpcbFixed {
            head: 0x1111_1111,
            missed_events: 0x2222_2222_2222_2222,
            threshold: 0x3333_3333,
            tail: 0x4444_4444,
            buffer_size_random: 0x5555_5555,
            ..Default::default()
        };
        let b = f.as_slice();
        let u32_at = |o: u64| u32::from_le_bytes(b[o as usize..o as usize + 4].try_into().unwrap());
        assert_eq!(u32_at(OFF_HEAD), 0x1111_1111);
        assert_eq!(u32_at(OFF_MISSED), 0x2222_2222);
        assert_eq!(u32_at(OFF_THRESHOLD), 0x3333_3333);
        assert_eq!(u32_at(OFF_TAIL), 0x4444_4444);
        assert_eq!(u32_at(OFF_BUFFER_SIZE), 0x5555_5555);
    }

    #[test]
    fn s26_values() {
        let table = [
            (0u32, 0i32),
            (1, 1),
            (0x1FF_FFFF, S26_MAX),
            (0x200_0000, -(1 << 25)),
            (0x3FF_FFFF, -1),
            (0xFC00_0005, 5),
            (0x2702A, 0x2702A),
        ];
        for (raw, value) in table {
            assert_eq!(s26(raw), value, "{raw:#x}");
            assert_eq!(s26(to_s26(value)), value);
        }
    }

    #[test]
    fn normalisation_table() {
        struct Case {
            name: &'static str,
            flags: u32,
            size: u32,
            head: u32,
            threshold: u32,
            pairs: [(u32, u32); 6],
            cfg: Option<u64>,
            want: Result<(u32, u32, u32, u32), LwpcbError>,
            want_events: Option<[(i32, i32); 6]>,
        }
        let zero = [(0, 0); 6];
        let cases = [
            Case {
                name: "plain block",
                flags: 0x8000_0002,
                size: 4096,
                head: 64,
                threshold: 1024,
                pairs: zero,
                cfg: None,
                want: Ok((0x8000_0002, 4096, 64, 1024)),
                want_events: None,
            },
            Case {
                name: "flags not in the profile are dropped",
                flags: 0xFFFF_FFFF,
                size: 4096,
                head: 0,
                threshold: 0,
                pairs: zero,
                cfg: None,
                want: Ok((0xE000_0062, 4096, 0, 0)),
                want_events: None,
            },
            Case {
                name: "flags ANDed with LWP_CFG",
                flags: 0xE000_0062,
                size: 4096,
                head: 0,
                threshold: 0,
                pairs: zero,
                cfg: Some(0x2),
                want: Ok((0x2, 4096, 0, 0)),
                want_events: None,
            },
            Case {
                name: "size rounded down to records, Random kept apart",
                flags: 2,
                size: 0x6000_0000 | 4100,
                head: 0,
                threshold: 0,
                pairs: zero,
                cfg: None,
                want: Ok((2, 4096, 0, 0)),
                want_events: None,
            },
            Case {
                name: "minimum size accepted",
                flags: 2,
                size: 1024,
                head: 0,
                threshold: 0,
                pairs: zero,
                cfg: None,
                want: Ok((2, 1024, 0, 0)),
                want_events: None,
            },
            Case {
                name: "below minimum refused",
                flags: 2,
                size: 1023,
                head: 0,
                threshold: 0,
                pairs: zero,
                cfg: None,
                want: Err(LwpcbError::BufferTooSmall {
                    size: 992,
                    min: 1024,
                }),
                want_events: None,
            },
            Case {
                name: "zero size refused",
                flags: 2,
                size: 0xF000_0000,
                head: 0,
                threshold: 0,
                pairs: zero,
                cfg: None,
                want: Err(LwpcbError::BufferTooSmall { size: 0, min: 1024 }),
                want_events: None,
            },
            Case {
                name: "head at size becomes 0",
                flags: 2,
                size: 4096,
                head: 4096,
                threshold: 0,
                pairs: zero,
                cfg: None,
                want: Ok((2, 4096, 0, 0)),
                want_events: None,
            },
            Case {
                name: "head past size becomes 0",
                flags: 2,
                size: 4096,
                head: 0xFFFF_FFFF,
                threshold: 0,
                pairs: zero,
                cfg: None,
                want: Ok((2, 4096, 0, 0)),
                want_events: None,
            },
            Case {
                name: "head and threshold rounded down",
                flags: 2,
                size: 4096,
                head: 95,
                threshold: 1055,
                pairs: zero,
                cfg: None,
                want: Ok((2, 4096, 64, 1024)),
                want_events: None,
            },
            Case {
                name: "negative counters become 0, intervals raised, EventId 1 exempt",
                flags: 0x62,
                size: 4096,
                head: 0,
                threshold: 0,
                pairs: [
                    (0, 0x3FF_FFFF),
                    (0, 5),
                    (3, 0),
                    (0x3FF_FFFF, 0),
                    (7, 0x200_0000),
                    (0x20_0000, 9),
                ],
                cfg: None,
                want: Ok((0x62, 4096, 0, 0)),
                want_events: Some([
                    (0, 0),
                    (0xF, 5),
                    (0xF, 0),
                    (0xF, 0),
                    (0xFFFF, 0),
                    (0x20_0000, 9),
                ]),
            },
        ];
        let caps = emulated();
        for c in cases {
            let cfg = match c.cfg {
                Some(v) => LwpCfg::write(&caps, v).unwrap().features(),
                None => all_cfg(&caps),
            };
            let fixed = LwpcbFixed {
                flags: c.flags,
                buffer_size_random: c.size,
                buffer_base: 0x10_0000,
                head: c.head,
                threshold: c.threshold,
                ..Default::default()
            };
            let got = LoadedLwpcb::normalize(&caps, cfg, 0x1000, &fixed, &c.pairs)
                .map(|l| (l.flags.bits(), l.buffer_size, l.head, l.threshold));
            assert_eq!(got, c.want, "{}", c.name);
            if let Some(want) = c.want_events {
                let l = LoadedLwpcb::normalize(&caps, cfg, 0x1000, &fixed, &c.pairs).unwrap();
                let got: Vec<_> = l.events[1..]
                    .iter()
                    .map(|s| (s.interval, s.counter))
                    .collect();
                assert_eq!(got, want, "{}", c.name);
                l.check(&caps).unwrap();
            }
        }
    }

    #[test]
    fn random_survives_and_profile_limits_events() {
        let caps = LwpProfile::Bulldozer.caps().unwrap();
        let fixed = LwpcbFixed {
            flags: 0xFFFF_FFFF,
            buffer_size_random: 0x6000_2000,
            ..Default::default()
        };
        let l =
            LoadedLwpcb::normalize(&caps, all_cfg(&caps), 0x1000, &fixed, &[(20, 20); 3]).unwrap();
        assert_eq!(l.flags.bits(), 0x8000_000E);
        assert_eq!(l.buffer_size_word(), 0x6000_2000);
        assert_eq!(l.events[4], EventSlot::default());
        l.check(&caps).unwrap();
    }

    #[test]
    fn check_rejects_broken_blocks() {
        let caps = emulated();
        let fixed = LwpcbFixed {
            flags: 2,
            buffer_size_random: 4096,
            ..Default::default()
        };
        let good =
            LoadedLwpcb::normalize(&caps, all_cfg(&caps), 0x1000, &fixed, &[(0, 0); 6]).unwrap();
        good.check(&caps).unwrap();
        type Breaker = fn(&mut LoadedLwpcb);
        let breakers: [(&str, Breaker); 7] = [
            ("address 0", |l| l.address = 0),
            ("head past size", |l| l.head = l.buffer_size),
            ("head misaligned", |l| l.head = 33),
            ("flags", |l| l.flags = LwpFeatures::IRE),
            ("size", |l| l.buffer_size = 100),
            ("interval", |l| l.events[5].interval = 1),
            ("counter", |l| l.events[1].counter = -1),
        ];
        for (name, breaker) in breakers {
            let mut bad = good;
            breaker(&mut bad);
            assert!(bad.check(&caps).is_err(), "{name}");
        }
    }
}
