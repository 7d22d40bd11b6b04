//! The architectural exceptions the emulated LWP unit can raise, in the form
//! the VMM injects them into the guest, and the one the VMM raises for an
//! instruction kvm_pvm's emulator cannot run (a CPL0 INT3).

use std::fmt;

/// #PF error-code bit: the page was present (a protection violation).
pub const PF_PRESENT: u32 = 1 << 0;
/// #PF error-code bit: the access was a write.
pub const PF_WRITE: u32 = 1 << 1;
/// #PF error-code bit: the access was made at CPL3.
pub const PF_USER: u32 = 1 << 2;
/// #PF error-code bit: a reserved bit was set in a paging entry.
pub const PF_RESERVED: u32 = 1 << 3;
/// #PF error-code bit: the access was an instruction fetch.
pub const PF_FETCH: u32 = 1 << 4;
/// #PF error code: a protection key forbade the access.
pub const PF_PROTECTION_KEY: u32 = 1 << 5;

/// An exception the guest receives as if the LWP instruction had raised it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GuestFault {
    /// #BP: not an LWP fault, the trap of a CPL0 INT3 that KVM's emulator
    /// could not run (injected with RIP past the INT3, as the CPU pushes it).
    Breakpoint,
    /// #UD.
    InvalidOpcode,
    /// #NM: not an LWP fault, an SSE instruction at CPL0 that lwpvmm
    /// carries out for a kernel while CR0.TS is set.
    DeviceNotAvailable,
    /// #GP(0).
    GeneralProtection,
    /// #PF with the faulting linear address (CR2) and the error code.
    PageFault {
        /// The linear address that faulted (goes to CR2).
        address: u64,
        /// The #PF error code (`PF_*` bits).
        error_code: u32,
    },
}

impl GuestFault {
    /// The exception vector.
    pub fn vector(self) -> u8 {
        match self {
            GuestFault::Breakpoint => 3,
            GuestFault::InvalidOpcode => 6,
            GuestFault::DeviceNotAvailable => 7,
            GuestFault::GeneralProtection => 13,
            GuestFault::PageFault { .. } => 14,
        }
    }

    /// The error code pushed with the exception, if the vector has one.
    pub fn error_code(self) -> Option<u32> {
        match self {
            GuestFault::Breakpoint | GuestFault::InvalidOpcode | GuestFault::DeviceNotAvailable => {
                None
            }
            GuestFault::GeneralProtection => Some(0),
            GuestFault::PageFault { error_code, .. } => Some(error_code),
        }
    }
}

impl fmt::Display for GuestFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GuestFault::Breakpoint => f.write_str("#BP"),
            GuestFault::InvalidOpcode => f.write_str("#UD"),
            GuestFault::DeviceNotAvailable => f.write_str("#NM"),
            GuestFault::GeneralProtection => f.write_str("#GP(0)"),
            GuestFault::PageFault {
                address,
                error_code,
            } => write!(f, "#PF(address {address:#x}, error code {error_code:#x})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_and_error_codes() {
        let pf = GuestFault::PageFault {
            address: 0x1000,
            error_code: PF_USER | PF_WRITE,
        };
        let table = [
            (GuestFault::Breakpoint, 3, None, "#BP"),
            (GuestFault::InvalidOpcode, 6, None, "#UD"),
            (GuestFault::DeviceNotAvailable, 7, None, "#NM"),
            (GuestFault::GeneralProtection, 13, Some(0), "#GP(0)"),
            (pf, 14, Some(6), "#PF(address 0x1000, error code 0x6)"),
        ];
        for (fault, vector, code, text) in table {
            assert_eq!(fault.vector(), vector);
            assert_eq!(fault.error_code(), code);
            assert_eq!(fault.to_string(), text);
        }
    }
}
