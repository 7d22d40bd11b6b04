//! The paravirtual interface between a guest and lwpvmm, defined once
//! (docs/pv-abi.md is its prose): the CPUID leaves that announce it and
//! their feature bits, the ports, the LWP state-call operations and
//! statuses, the power-port values, the 64-bit exception frame the
//! doorbells read, and the RFLAGS.CF reply protocol. Pure: no KVM, no I/O.

use bitflags::bitflags;
use vm_memory::ByteValued;

/// First leaf of lwpvmm's hypervisor range.
pub const LEAF_PV_BASE: u32 = 0x4000_0100;
/// The paravirtual-interface leaf.
pub const LEAF_PV_INFO: u32 = 0x4000_0101;
/// The signature in EBX, ECX, EDX of [`LEAF_PV_BASE`]: "LwpVmmLwpVmm".
pub const PV_SIGNATURE: [u32; 3] = [
    u32::from_le_bytes(*b"LwpV"),
    u32::from_le_bytes(*b"mmLw"),
    u32::from_le_bytes(*b"pVmm"),
];
/// The interface version.
pub const PV_ABI_VERSION: u32 = 1;

bitflags! {
    /// The features in EBX of [`LEAF_PV_INFO`].
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct PvFeatures: u32 {
        /// The #UD doorbell serves LWP instructions.
        const UD_DOORBELL = 1 << 0;
        /// The isa-debug-exit port ends the VM.
        const EXIT_PORT = 1 << 1;
        /// The LWP state calls (component 62 save and restore).
        const LWP_STATE = 1 << 2;
        /// The #DB doorbell, for precise events by single-stepping.
        const DB_DOORBELL = 1 << 3;
        /// The power port.
        const POWER = 1 << 4;
    }
}

/// The debug port of `--snapshot-on-port` (off by default): a write asks
/// for a snapshot at that exact point. For tests; not announced in CPUID.
pub const SNAPSHOT_PORT: u16 = 0x5a;
/// The port the guest's #DB handler writes to (its first instruction).
pub const DB_PORT: u16 = 0x5b;
/// The port the guest's #UD handler writes to (its first instruction).
pub const UD_PORT: u16 = 0x5c;
/// The port of the LWP state calls.
pub const STATE_PORT: u16 = 0x5d;
/// The power port: how a guest without ACPI powers off.
pub const POWER_PORT: u16 = 0x5e;
/// QEMU's isa-debug-exit port.
pub const EXIT_PORT: u16 = 0xf4;

/// RFLAGS.CF: the doorbells' reply, and LWPINS's result.
pub const RFLAGS_CF: u64 = 1 << 0;
/// RFLAGS.TF: the trap flag lwpvmm steps with.
pub const RFLAGS_TF: u64 = 1 << 8;

/// What a doorbell answers in the handler's RFLAGS.CF.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// CF clear: done, the handler returns with IRETQ.
    Handled,
    /// CF set: not lwpvmm's; the guest's own handling runs.
    NotOurs,
}

impl Reply {
    /// The handler's RFLAGS with this reply.
    pub fn apply(self, rflags: u64) -> u64 {
        match self {
            Reply::Handled => rflags & !RFLAGS_CF,
            Reply::NotOurs => rflags | RFLAGS_CF,
        }
    }
}

/// An LWP state call's operation (AL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateOp {
    /// Save component 62 into the area at RDI.
    Save = 1,
    /// Restore component 62 from the area at RDI.
    Restore = 2,
    /// The guest's #DB handler starts with the #DB doorbell.
    DeclareDb = 3,
}

impl TryFrom<u8> for StateOp {
    type Error = u8;

    fn try_from(op: u8) -> Result<Self, u8> {
        match op {
            1 => Ok(StateOp::Save),
            2 => Ok(StateOp::Restore),
            3 => Ok(StateOp::DeclareDb),
            other => Err(other),
        }
    }
}

/// The status an LWP state call returns in RAX.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateStatus {
    /// Done.
    Ok = 0,
    /// The VM has no LWP.
    NoLwp = 1,
    /// The area cannot be read or written as supervisor memory.
    BadArea = 2,
    /// The image was refused (invalid, or its LWPCB or ring faults); LWP is
    /// now off. RDX holds the fault's vector, RCX the #PF address.
    Refused = 3,
    /// Unknown operation, or called from outside CPL0.
    BadCall = 4,
}

/// A value written to the power port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerOp {
    /// Power off: `lwpvmm run` exits 0.
    Off = 0,
    /// Reboot: the VM ends, `lwpvmm run` exits 4.
    Reboot = 1,
}

impl TryFrom<u8> for PowerOp {
    type Error = u8;

    fn try_from(value: u8) -> Result<Self, u8> {
        match value {
            0 => Ok(PowerOp::Off),
            1 => Ok(PowerOp::Reboot),
            other => Err(other),
        }
    }
}

/// The bytes of a 64-bit exception frame without an error code.
pub const FRAME_SIZE: u64 = 40;

/// A 64-bit exception frame without an error code, as the CPU pushes it
/// for #UD and #DB: what the doorbells find at RSP.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Frame {
    /// The interrupted instruction (a fault) or the next one (a trap).
    pub rip: u64,
    /// The interrupted context's CS.
    pub cs: u64,
    /// Its RFLAGS.
    pub rflags: u64,
    /// Its RSP.
    pub rsp: u64,
    /// Its SS.
    pub ss: u64,
}

// SAFETY: Frame is repr(C) and made only of u64 fields, so it has no padding
// and every byte pattern is a valid value.
unsafe impl ByteValued for Frame {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_and_values_decode() {
        // (byte, state operation, power operation)
        let table = [
            (0, Err(0), Ok(PowerOp::Off)),
            (1, Ok(StateOp::Save), Ok(PowerOp::Reboot)),
            (2, Ok(StateOp::Restore), Err(2)),
            (3, Ok(StateOp::DeclareDb), Err(3)),
            (4, Err(4), Err(4)),
            (0xff, Err(0xff), Err(0xff)),
        ];
        for (byte, state, power) in table {
            assert_eq!(StateOp::try_from(byte), state, "{byte}");
            assert_eq!(PowerOp::try_from(byte), power, "{byte}");
        }
    }

    #[test]
    fn replies_set_or_clear_cf_only() {
        // (RFLAGS before, reply, after)
        let table = [
            (0x2, Reply::NotOurs, 0x3),
            (0x3, Reply::Handled, 0x2),
            (0x246, Reply::Handled, 0x246),
            (0x247, Reply::NotOurs, 0x247),
        ];
        for (before, reply, after) in table {
            assert_eq!(reply.apply(before), after, "{before:#x} {reply:?}");
        }
    }

    #[test]
    fn the_frame_is_forty_bytes_in_push_order() {
        let f = Frame {
            rip: 1,
            cs: 2,
            rflags: 3,
            rsp: 4,
            ss: 5,
        };
        assert_eq!(f.as_slice().len() as u64, FRAME_SIZE);
        assert_eq!(&f.as_slice()[8..16], &2u64.to_le_bytes(), "CS second");
        assert_eq!(&f.as_slice()[32..40], &5u64.to_le_bytes(), "SS last");
    }
}
