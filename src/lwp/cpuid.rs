//! CPUID as LWP software sees it: leaf 0x8000_001C as typed fields, the LWP
//! feature flag in 0x8000_0001.ECX, and the named profiles lwpvmm offers.
//!
//! Bit positions and the Bulldozer values come from the fact sheet
//! (`lwp-architecture.md` §1); the choices lwpvmm makes where the hardware
//! gives no answer are recorded in `docs/lwp-model.md`.

use std::fmt;
use std::str::FromStr;

use bitflags::bitflags;
use thiserror::Error;

/// The extended leaf that carries the LWP feature flag.
pub const LEAF_EXT_FEATURES: u32 = 0x8000_0001;
/// The LWP capabilities leaf.
pub const LEAF_LWP: u32 = 0x8000_001C;
/// The leaf whose EAX names the highest extended leaf.
pub const LEAF_EXT_MAX: u32 = 0x8000_0000;
/// 0x8000_0001.ECX bit 15: LWP is implemented.
pub const EXT_FEATURES_ECX_LWP: u32 = 1 << 15;

bitflags! {
    /// The LWP feature bits, laid out alike in CPUID 0x8000_001C.EAX (enabled
    /// by the OS), 0x8000_001C.EDX (supported), LWP_CFG[31:0] and LWPCB Flags.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
    #[serde(transparent)]
    pub struct LwpFeatures: u32 {
        /// LWP is available to applications (CPUID only).
        const AVAIL = 1 << 0;
        /// EventId 1: LWPVAL programmed samples.
        const VAL = 1 << 1;
        /// EventId 2: instructions retired.
        const IRE = 1 << 2;
        /// EventId 3: branches retired.
        const BRE = 1 << 3;
        /// EventId 4: data-cache misses.
        const DME = 1 << 4;
        /// EventId 5: CPU clocks not halted.
        const CNH = 1 << 5;
        /// EventId 6: CPU reference clocks not halted.
        const RNH = 1 << 6;
        /// Continuous (overwriting) ring mode.
        const CONT = 1 << 29;
        /// Performance time-stamp counter in event records.
        const PTSC = 1 << 30;
        /// Threshold interrupt.
        const INT = 1 << 31;
    }
}

impl LwpFeatures {
    /// The event-enable bits (EventIds 1 to 6).
    pub const EVENTS: LwpFeatures = LwpFeatures::VAL
        .union(LwpFeatures::IRE)
        .union(LwpFeatures::BRE)
        .union(LwpFeatures::DME)
        .union(LwpFeatures::CNH)
        .union(LwpFeatures::RNH);
    /// The mode bits that follow the event enables.
    pub const MODES: LwpFeatures = LwpFeatures::CONT
        .union(LwpFeatures::PTSC)
        .union(LwpFeatures::INT);

    /// The enable bit of hardware or programmed event `id` (1 to 6).
    pub fn for_event(id: u8) -> Option<LwpFeatures> {
        match id {
            1..=6 => Some(LwpFeatures::from_bits_retain(1 << id)),
            _ => None,
        }
    }

    /// The enable bits of EventIds 1 to `max_events`.
    pub fn events_up_to(max_events: u8) -> LwpFeatures {
        let mask = (1u32 << (u32::from(max_events.min(6)) + 1)).wrapping_sub(2);
        LwpFeatures::from_bits_retain(mask) & LwpFeatures::EVENTS
    }
}

/// CPUID 0x8000_001C.EBX: sizes and offsets of the LWPCB and records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LwpEbx {
    /// LwpCbSize: LWPCB size in quadwords.
    pub cb_size_qwords: u8,
    /// LwpEventSize: event record size in bytes.
    pub event_size: u8,
    /// LwpMaxEvents: highest EventId supported, not counting 255.
    pub max_events: u8,
    /// LwpEventOffset: offset of EventInterval1 from the start of the LWPCB.
    pub event_offset: u8,
}

impl LwpEbx {
    /// Decodes the register.
    pub fn from_raw(raw: u32) -> Self {
        let [cb_size_qwords, event_size, max_events, event_offset] = raw.to_le_bytes();
        LwpEbx {
            cb_size_qwords,
            event_size,
            max_events,
            event_offset,
        }
    }

    /// Encodes the register.
    pub fn raw(self) -> u32 {
        u32::from_le_bytes([
            self.cb_size_qwords,
            self.event_size,
            self.max_events,
            self.event_offset,
        ])
    }
}

/// CPUID 0x8000_001C.ECX: implementation properties.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LwpEcx {
    /// LwpLatencyMax (4:0): width of the cache-latency counters.
    pub latency_max: u8,
    /// LwpDataAddress (5): cache-miss records carry the data address.
    pub data_address: bool,
    /// LwpLatencyRnd (8:6): rounding of cache latencies.
    pub latency_rnd: u8,
    /// LwpVersion (15:9).
    pub version: u8,
    /// LwpMinBufferSize (23:16): minimum ring size in units of 32 records.
    pub min_buffer_size: u8,
    /// Reserved bits 27:24, kept so that a decode and encode round trip.
    pub reserved: u8,
    /// LwpBranchPrediction (28).
    pub branch_prediction: bool,
    /// LwpIpFiltering (29).
    pub ip_filtering: bool,
    /// LwpCacheLevels (30).
    pub cache_levels: bool,
    /// LwpCacheLatency (31).
    pub cache_latency: bool,
}

impl LwpEcx {
    /// Decodes the register.
    pub fn from_raw(raw: u32) -> Self {
        let bit = |n: u32| raw & (1 << n) != 0;
        LwpEcx {
            latency_max: (raw & 0x1f) as u8,
            data_address: bit(5),
            latency_rnd: ((raw >> 6) & 0x7) as u8,
            version: ((raw >> 9) & 0x7f) as u8,
            min_buffer_size: (raw >> 16) as u8,
            reserved: ((raw >> 24) & 0xf) as u8,
            branch_prediction: bit(28),
            ip_filtering: bit(29),
            cache_levels: bit(30),
            cache_latency: bit(31),
        }
    }

    /// Encodes the register.
    pub fn raw(self) -> u32 {
        u32::from(self.latency_max & 0x1f)
            | u32::from(self.data_address) << 5
            | u32::from(self.latency_rnd & 0x7) << 6
            | u32::from(self.version & 0x7f) << 9
            | u32::from(self.min_buffer_size) << 16
            | u32::from(self.reserved & 0xf) << 24
            | u32::from(self.branch_prediction) << 28
            | u32::from(self.ip_filtering) << 29
            | u32::from(self.cache_levels) << 30
            | u32::from(self.cache_latency) << 31
    }
}

/// CPUID leaf 0x8000_001C, all four registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LwpLeaf {
    /// EAX: the features the OS has enabled (LwpAvail in bit 0).
    pub enabled: LwpFeatures,
    /// EBX: sizes and offsets.
    pub ebx: LwpEbx,
    /// ECX: implementation properties.
    pub ecx: LwpEcx,
    /// EDX: the features the (emulated) hardware supports.
    pub supported: LwpFeatures,
}

impl LwpLeaf {
    /// The leaf of a processor without LWP: all zero.
    pub const EMPTY: LwpLeaf = LwpLeaf {
        enabled: LwpFeatures::empty(),
        ebx: LwpEbx {
            cb_size_qwords: 0,
            event_size: 0,
            max_events: 0,
            event_offset: 0,
        },
        ecx: LwpEcx {
            latency_max: 0,
            data_address: false,
            latency_rnd: 0,
            version: 0,
            min_buffer_size: 0,
            reserved: 0,
            branch_prediction: false,
            ip_filtering: false,
            cache_levels: false,
            cache_latency: false,
        },
        supported: LwpFeatures::empty(),
    };

    /// Decodes EAX, EBX, ECX and EDX; every bit survives a round trip.
    pub fn from_regs([eax, ebx, ecx, edx]: [u32; 4]) -> Self {
        LwpLeaf {
            enabled: LwpFeatures::from_bits_retain(eax),
            ebx: LwpEbx::from_raw(ebx),
            ecx: LwpEcx::from_raw(ecx),
            supported: LwpFeatures::from_bits_retain(edx),
        }
    }

    /// Encodes EAX, EBX, ECX and EDX.
    pub fn regs(&self) -> [u32; 4] {
        [
            self.enabled.bits(),
            self.ebx.raw(),
            self.ecx.raw(),
            self.supported.bits(),
        ]
    }
}

/// What the emulated LWP unit of one profile can do, as the unit uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LwpCaps {
    /// The supported feature set (CPUID EDX).
    pub supported: LwpFeatures,
    /// Sizes and offsets (CPUID EBX).
    pub ebx: LwpEbx,
    /// Implementation properties (CPUID ECX).
    pub ecx: LwpEcx,
}

impl LwpCaps {
    /// Size of one event record in bytes.
    pub fn event_size(&self) -> u32 {
        u32::from(self.ebx.event_size)
    }

    /// Highest hardware EventId.
    pub fn max_events(&self) -> u8 {
        self.ebx.max_events
    }

    /// Offset of EventInterval1 in the LWPCB.
    pub fn event_offset(&self) -> u32 {
        u32::from(self.ebx.event_offset)
    }

    /// Size of the whole LWPCB in bytes.
    pub fn cb_size(&self) -> u32 {
        u32::from(self.ebx.cb_size_qwords) * 8
    }

    /// The smallest ring LLWPCB accepts, in bytes.
    pub fn min_buffer_bytes(&self) -> u32 {
        u32::from(self.ecx.min_buffer_size.max(1)) * 32 * self.event_size()
    }

    /// The Flags bits an LWPCB may carry with this profile: the supported
    /// event enables up to MaxEvents and the supported modes.
    pub fn flag_mask(&self) -> LwpFeatures {
        self.supported & (LwpFeatures::events_up_to(self.max_events()) | LwpFeatures::MODES)
    }
}

/// Which value CPUID 0x8000_001C.EAX (the OS-enabled set) carries. KVM fixes
/// CPUID at the first KVM_RUN, so the dynamic register becomes a boot option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GuestLwpSupport {
    /// The guest carries lwpvmm's paravirtual shim: EAX is the profile's whole
    /// supported set, the value an OS that enabled everything would produce.
    #[default]
    Shim,
    /// A stock guest that cannot run LWP instructions: EAX is 0, so software
    /// that checks LwpAvail leaves LWP alone.
    Stock,
}

impl fmt::Display for GuestLwpSupport {
    /// The name `--guest` takes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GuestLwpSupport::Shim => "shim",
            GuestLwpSupport::Stock => "stock",
        })
    }
}

/// A named LWP profile: what the guest is told and what the unit emulates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LwpProfile {
    /// No LWP at all.
    Off,
    /// What the software unit produces honestly on a host with no PMU.
    #[default]
    Emulated,
    /// `Emulated` plus instructions and branches retired, by single-stepping.
    Precise,
    /// The AMD Opteron 6272 values, byte for byte.
    Bulldozer,
}

/// An unknown profile name.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("unknown LWP profile `{0}`: expected one of off, emulated, precise, bulldozer")]
pub struct UnknownProfile(pub String);

impl LwpProfile {
    /// Every profile, in the order the docs list them.
    pub const ALL: [LwpProfile; 4] = [
        LwpProfile::Off,
        LwpProfile::Emulated,
        LwpProfile::Precise,
        LwpProfile::Bulldozer,
    ];

    /// The profile's name on the command line and in snapshots.
    pub fn name(self) -> &'static str {
        match self {
            LwpProfile::Off => "off",
            LwpProfile::Emulated => "emulated",
            LwpProfile::Precise => "precise",
            LwpProfile::Bulldozer => "bulldozer",
        }
    }

    /// The unit's capabilities, or `None` for `off`.
    pub fn caps(self) -> Option<LwpCaps> {
        let emulated = LwpFeatures::AVAIL
            | LwpFeatures::VAL
            | LwpFeatures::CNH
            | LwpFeatures::RNH
            | LwpFeatures::CONT
            | LwpFeatures::PTSC
            | LwpFeatures::INT;
        let six_events = LwpEbx {
            cb_size_qwords: 22,
            event_size: 32,
            max_events: 6,
            event_offset: 128,
        };
        let version_one = LwpEcx {
            version: 1,
            min_buffer_size: 1,
            ..LwpLeaf::EMPTY.ecx
        };
        match self {
            LwpProfile::Off => None,
            LwpProfile::Emulated => Some(LwpCaps {
                supported: emulated,
                ebx: six_events,
                ecx: version_one,
            }),
            LwpProfile::Precise => Some(LwpCaps {
                supported: emulated | LwpFeatures::IRE | LwpFeatures::BRE,
                ebx: six_events,
                ecx: version_one,
            }),
            LwpProfile::Bulldozer => Some(LwpCaps {
                supported: LwpFeatures::from_bits_retain(0x8000_000F),
                ebx: LwpEbx::from_raw(0x8003_2013),
                ecx: LwpEcx::from_raw(0x0001_0200),
            }),
        }
    }

    /// Leaf 0x8000_001C as the guest sees it.
    pub fn leaf(self, guest: GuestLwpSupport) -> LwpLeaf {
        match self.caps() {
            None => LwpLeaf::EMPTY,
            Some(caps) => LwpLeaf {
                enabled: match guest {
                    GuestLwpSupport::Shim => caps.supported,
                    GuestLwpSupport::Stock => LwpFeatures::empty(),
                },
                ebx: caps.ebx,
                ecx: caps.ecx,
                supported: caps.supported,
            },
        }
    }
}

impl fmt::Display for LwpProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for LwpProfile {
    type Err = UnknownProfile;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        LwpProfile::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| UnknownProfile(s.to_owned()))
    }
}

/// One CPUID entry as lwpvmm reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CpuidEntry {
    /// The leaf (EAX input).
    pub leaf: u32,
    /// The subleaf (ECX input).
    pub subleaf: u32,
    /// Output EAX.
    pub eax: u32,
    /// Output EBX.
    pub ebx: u32,
    /// Output ECX.
    pub ecx: u32,
    /// Output EDX.
    pub edx: u32,
}

/// The LWP-related CPUID values a profile puts in front of the guest: the
/// highest extended leaf it needs, the feature flag and the LWP leaf. Only
/// the LWP bits are set; the VM merges them into KVM's supported table.
pub fn lwp_entries(profile: LwpProfile, guest: GuestLwpSupport) -> [CpuidEntry; 3] {
    let lwp = profile.leaf(guest).regs();
    let has_lwp = profile.caps().is_some();
    [
        CpuidEntry {
            leaf: LEAF_EXT_MAX,
            subleaf: 0,
            eax: if has_lwp { LEAF_LWP } else { 0 },
            ebx: 0,
            ecx: 0,
            edx: 0,
        },
        CpuidEntry {
            leaf: LEAF_EXT_FEATURES,
            subleaf: 0,
            eax: 0,
            ebx: 0,
            ecx: if has_lwp { EXT_FEATURES_ECX_LWP } else { 0 },
            edx: 0,
        },
        CpuidEntry {
            leaf: LEAF_LWP,
            subleaf: 0,
            eax: lwp[0],
            ebx: lwp[1],
            ecx: lwp[2],
            edx: lwp[3],
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real Family 15h values (fact sheet §1.4, hwloc dumps).
    #[test]
    fn decodes_hardware_dumps() {
        struct Dump {
            name: &'static str,
            regs: [u32; 4],
            avail: bool,
        }
        let dumps = [
            Dump {
                name: "Opteron 6272 (Bulldozer)",
                regs: [0, 0x8003_2013, 0x0001_0200, 0x8000_000F],
                avail: false,
            },
            Dump {
                name: "Opteron 6348 (Piledriver)",
                regs: [1, 0x8003_2013, 0x0001_0200, 0x8000_000F],
                avail: true,
            },
        ];
        for d in dumps {
            let leaf = LwpLeaf::from_regs(d.regs);
            assert_eq!(
                leaf.enabled.contains(LwpFeatures::AVAIL),
                d.avail,
                "{}",
                d.name
            );
            assert_eq!(leaf.ebx.cb_size_qwords, 19, "{}", d.name);
            assert_eq!(leaf.ebx.event_size, 32, "{}", d.name);
            assert_eq!(leaf.ebx.max_events, 3, "{}", d.name);
            assert_eq!(leaf.ebx.event_offset, 128, "{}", d.name);
            assert_eq!(leaf.ecx.version, 1, "{}", d.name);
            assert_eq!(leaf.ecx.min_buffer_size, 1, "{}", d.name);
            assert_eq!(leaf.ecx.latency_max, 0, "{}", d.name);
            assert!(!leaf.ecx.ip_filtering, "{}", d.name);
            assert_eq!(
                leaf.supported,
                LwpFeatures::AVAIL
                    | LwpFeatures::VAL
                    | LwpFeatures::IRE
                    | LwpFeatures::BRE
                    | LwpFeatures::INT,
                "{}",
                d.name
            );
            assert_eq!(leaf.regs(), d.regs, "{} round trip", d.name);
        }
    }

    #[test]
    fn every_bit_round_trips() {
        for regs in [
            [u32::MAX; 4],
            [0x5555_5555, 0xaaaa_aaaa, 0x0f0f_0f0f, 0xf0f0_f0f0],
            [0; 4],
        ] {
            assert_eq!(LwpLeaf::from_regs(regs).regs(), regs);
        }
    }

    #[test]
    fn profile_registers() {
        // (profile, EAX for a shim guest, EBX, ECX, EDX)
        let table = [
            (LwpProfile::Off, 0, 0, 0, 0),
            (
                LwpProfile::Emulated,
                0xE000_0063,
                0x8006_2016,
                0x0001_0200,
                0xE000_0063,
            ),
            (
                LwpProfile::Precise,
                0xE000_006F,
                0x8006_2016,
                0x0001_0200,
                0xE000_006F,
            ),
            (
                LwpProfile::Bulldozer,
                0x8000_000F,
                0x8003_2013,
                0x0001_0200,
                0x8000_000F,
            ),
        ];
        for (profile, eax, ebx, ecx, edx) in table {
            assert_eq!(
                profile.leaf(GuestLwpSupport::Shim).regs(),
                [eax, ebx, ecx, edx],
                "{profile}"
            );
            let stock = profile.leaf(GuestLwpSupport::Stock).regs();
            assert_eq!(stock, [0, ebx, ecx, edx], "{profile} stock");
        }
    }

    #[test]
    fn profiles_are_self_consistent() {
        for profile in LwpProfile::ALL {
            let Some(caps) = profile.caps() else { continue };
            let events_end = caps.event_offset() + 8 * u32::from(caps.max_events());
            assert_eq!(events_end, caps.cb_size(), "{profile}: LWPCB size");
            assert!(caps.event_offset() >= 88, "{profile}: fixed part fits");
            assert_eq!(caps.event_size(), 32, "{profile}");
            assert_eq!(caps.min_buffer_bytes(), 1024, "{profile}");
            assert!(caps.supported.contains(LwpFeatures::AVAIL), "{profile}");
        }
    }

    #[test]
    fn names_round_trip() {
        for p in LwpProfile::ALL {
            assert_eq!(p.name().parse::<LwpProfile>(), Ok(p));
        }
        assert_eq!(
            "zen".parse::<LwpProfile>(),
            Err(UnknownProfile("zen".into()))
        );
    }

    #[test]
    fn event_masks() {
        assert_eq!(LwpFeatures::events_up_to(3).bits(), 0b1110);
        assert_eq!(LwpFeatures::events_up_to(6), LwpFeatures::EVENTS);
        assert_eq!(LwpFeatures::events_up_to(9), LwpFeatures::EVENTS);
        assert_eq!(LwpFeatures::events_up_to(0), LwpFeatures::empty());
        assert_eq!(LwpFeatures::for_event(3), Some(LwpFeatures::BRE));
        assert_eq!(LwpFeatures::for_event(0), None);
        assert_eq!(LwpFeatures::for_event(7), None);
    }

    #[test]
    fn lwp_entries_follow_profile() {
        let on = lwp_entries(LwpProfile::Bulldozer, GuestLwpSupport::Shim);
        assert_eq!(on[0].eax, LEAF_LWP);
        assert_eq!(on[1].ecx, EXT_FEATURES_ECX_LWP);
        assert_eq!(
            [on[2].ebx, on[2].ecx, on[2].edx],
            [0x8003_2013, 0x0001_0200, 0x8000_000F]
        );
        let off = lwp_entries(LwpProfile::Off, GuestLwpSupport::Shim);
        assert!(off.iter().all(|e| e.eax | e.ebx | e.ecx | e.edx == 0));
    }
}
