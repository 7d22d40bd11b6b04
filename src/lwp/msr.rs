//! The LWP MSRs: LWP_CFG (0xC000_0105) and LWP_CBADDR (0xC000_0106), their
//! fields, and what a WRMSR may set.
//!
//! The write rules follow the only probes of real hardware we have (Xen's
//! check against CPUID EDX, VirtualBox's FX-8150 masks); docs/lwp-model.md
//! gives the reasoning for each.

use thiserror::Error;

use super::cpuid::{LwpCaps, LwpFeatures};

/// LWP_CFG: the OS's LWP configuration.
pub const MSR_LWP_CFG: u32 = 0xC000_0105;
/// LWP_CBADDR: the linear address of the active LWPCB.
pub const MSR_LWP_CBADDR: u32 = 0xC000_0106;

/// Bits of LWP_CFG a write may never set: reserved 28:7 (and, through the
/// supported-set check, every feature bit the profile lacks).
const CFG_RESERVED_GP: u64 = 0x1FFF_FF80;
/// Bits hardware ignores on write and reads back as zero: bit 0 and 63:48.
const CFG_IGNORED: u64 = 0xFFFF_0000_0000_0001;
/// The low-half bits that name features.
const CFG_FEATURE_BITS: u64 = 0xE000_007E;

/// Why a WRMSR to an LWP MSR raises #GP(0).
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum MsrError {
    /// A reserved bit of LWP_CFG[28:7] is set.
    #[error("LWP_CFG write {value:#x} sets reserved bits {bits:#x}")]
    Reserved {
        /// The value written.
        value: u64,
        /// The offending bits.
        bits: u64,
    },
    /// A feature the profile does not support is enabled.
    #[error("LWP_CFG write {value:#x} enables unsupported features {bits:#x}")]
    Unsupported {
        /// The value written.
        value: u64,
        /// The offending bits.
        bits: u64,
    },
    /// LWP_CBADDR can only be cleared by WRMSR; LLWPCB loads a block.
    #[error("LWP_CBADDR write {0:#x}: only 0 may be written")]
    CbaddrNonZero(u64),
}

/// A value of LWP_CFG as the guest last wrote it (ignored bits cleared).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct LwpCfg(u64);

impl LwpCfg {
    /// The power-on value.
    pub const RESET: LwpCfg = LwpCfg(0);

    /// Validates a WRMSR of `value` against the profile and returns the
    /// value the MSR then holds.
    pub fn write(caps: &LwpCaps, value: u64) -> Result<LwpCfg, MsrError> {
        let reserved = value & CFG_RESERVED_GP;
        if reserved != 0 {
            return Err(MsrError::Reserved {
                value,
                bits: reserved,
            });
        }
        let unsupported = value & CFG_FEATURE_BITS & !u64::from(caps.flag_mask().bits());
        if unsupported != 0 {
            return Err(MsrError::Unsupported {
                value,
                bits: unsupported,
            });
        }
        Ok(LwpCfg(value & !CFG_IGNORED))
    }

    /// Rebuilds a value that was valid when saved (a snapshot), checking it
    /// again because the file is untrusted.
    pub fn from_saved(caps: &LwpCaps, value: u64) -> Result<LwpCfg, MsrError> {
        let cfg = LwpCfg::write(caps, value)?;
        if cfg.0 != value {
            return Err(MsrError::Reserved {
                value,
                bits: value & CFG_IGNORED,
            });
        }
        Ok(cfg)
    }

    /// The value RDMSR returns.
    pub fn raw(self) -> u64 {
        self.0
    }

    /// The features the OS enabled: event enables and modes.
    pub fn features(self) -> LwpFeatures {
        LwpFeatures::from_bits_truncate(self.0 as u32) & (LwpFeatures::EVENTS | LwpFeatures::MODES)
    }

    /// CoreId (39:32), copied into byte 1 of every record.
    pub fn core_id(self) -> u8 {
        (self.0 >> 32) as u8
    }

    /// The threshold-interrupt vector (47:40).
    pub fn vector(self) -> u8 {
        (self.0 >> 40) as u8
    }
}

/// Validates a WRMSR to LWP_CBADDR: only 0 (disable without a flush) is
/// accepted.
pub fn check_cbaddr_write(value: u64) -> Result<(), MsrError> {
    if value == 0 {
        Ok(())
    } else {
        Err(MsrError::CbaddrNonZero(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lwp::cpuid::LwpProfile;

    #[test]
    fn cfg_write_table() {
        enum Want {
            Reads(u64),
            Reserved,
            Unsupported,
        }
        use Want::*;
        // (profile, value written, outcome)
        let table = [
            (LwpProfile::Emulated, 0, Reads(0)),
            (LwpProfile::Emulated, 0xE000_0062, Reads(0xE000_0062)),
            // Bit 0 and 63:48 are ignored and read back as 0.
            (LwpProfile::Emulated, 0x1, Reads(0)),
            (LwpProfile::Emulated, 0xFFFF_0000_0000_0002, Reads(0x2)),
            // CoreId and vector are kept, including vectors 0-31.
            (
                LwpProfile::Emulated,
                0x0000_F0AB_8000_0000,
                Reads(0x0000_F0AB_8000_0000),
            ),
            (
                LwpProfile::Emulated,
                0x0000_1F00_8000_0000,
                Reads(0x0000_1F00_8000_0000),
            ),
            (
                LwpProfile::Emulated,
                0x0000_0000_8000_0000,
                Reads(0x0000_0000_8000_0000),
            ),
            // Reserved 28:7.
            (LwpProfile::Emulated, 1 << 7, Reserved),
            (LwpProfile::Emulated, 1 << 28, Reserved),
            // Features the profile lacks.
            (LwpProfile::Emulated, 1 << 2, Unsupported),
            (LwpProfile::Emulated, 1 << 3, Unsupported),
            (LwpProfile::Emulated, 1 << 4, Unsupported),
            (LwpProfile::Precise, 0xE000_006E, Reads(0xE000_006E)),
            (LwpProfile::Precise, 1 << 4, Unsupported),
            (LwpProfile::Bulldozer, 0x8000_000E, Reads(0x8000_000E)),
            (LwpProfile::Bulldozer, 1 << 5, Unsupported),
            (LwpProfile::Bulldozer, 1 << 6, Unsupported),
            (LwpProfile::Bulldozer, 1 << 29, Unsupported),
            (LwpProfile::Bulldozer, 1 << 30, Unsupported),
        ];
        for (profile, value, want) in table {
            let caps = profile.caps().unwrap();
            let got = LwpCfg::write(&caps, value);
            match want {
                Reads(v) => assert_eq!(got.map(LwpCfg::raw), Ok(v), "{profile} {value:#x}"),
                Reserved => assert!(
                    matches!(got, Err(MsrError::Reserved { .. })),
                    "{profile} {value:#x}: {got:?}"
                ),
                Unsupported => assert!(
                    matches!(got, Err(MsrError::Unsupported { .. })),
                    "{profile} {value:#x}: {got:?}"
                ),
            }
        }
    }

    #[test]
    fn cfg_fields() {
        let caps = LwpProfile::Emulated.caps().unwrap();
        let cfg = LwpCfg::write(&caps, 0x0000_EE07_C000_0022).unwrap();
        assert_eq!(cfg.core_id(), 0x07);
        assert_eq!(cfg.vector(), 0xEE);
        assert_eq!(
            cfg.features(),
            LwpFeatures::VAL | LwpFeatures::CNH | LwpFeatures::INT | LwpFeatures::PTSC
        );
    }

    #[test]
    fn saved_cfg_must_be_exact() {
        let caps = LwpProfile::Emulated.caps().unwrap();
        assert!(LwpCfg::from_saved(&caps, 0x8000_0002).is_ok());
        assert!(LwpCfg::from_saved(&caps, 0x8000_0003).is_err());
        assert!(LwpCfg::from_saved(&caps, 1 << 60).is_err());
    }

    #[test]
    fn cbaddr_writes() {
        assert_eq!(check_cbaddr_write(0), Ok(()));
        assert_eq!(
            check_cbaddr_write(0x7000_1000),
            Err(MsrError::CbaddrNonZero(0x7000_1000))
        );
    }
}
