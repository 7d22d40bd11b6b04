//! The guard's view of a vCPU's paging: what its processor offers (its
//! vendor and features, from the CPUID table the guest sees), its control
//! registers, and, under CR4.PKE, its PKRU, taken from the vCPU's XSAVE
//! state at each check (the guest changes PKRU with WRPKRU at CPL3, without
//! an exit).

use kvm_bindings::kvm_sregs;

use crate::guard::{GuardError, Paging, PagingCaps};
use crate::lwp::cpuid::CpuidEntry;

const CR4_PKE: u64 = 1 << 22;
/// The XSAVE state component of PKRU.
const PKRU_COMPONENT: u32 = 9;
/// XSTATE_BV, in the XSAVE header at byte 512.
const XSTATE_BV_OFFSET: usize = 512;

/// How to find a vCPU's PKRU, from its CPUID table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagingSource {
    caps: PagingCaps,
    /// PKRU's offset in the standard XSAVE layout (CPUID 0xD.9 EBX).
    pkru_offset: Option<usize>,
}

impl PagingSource {
    /// From the CPUID table the vCPU sees.
    pub fn new(cpuid: &[CpuidEntry]) -> Self {
        let caps = PagingCaps::from_cpuid(cpuid);
        let pkru_offset = cpuid
            .iter()
            .find(|e| e.leaf == 0xD && e.subleaf == PKRU_COMPONENT)
            .map(|e| e.ebx as usize)
            .filter(|&o| o > XSTATE_BV_OFFSET);
        PagingSource { caps, pkru_offset }
    }

    /// What the processor offers.
    pub fn caps(&self) -> PagingCaps {
        self.caps
    }

    /// True when a check needs PKRU: CR4.PKE on a processor with PKU.
    pub fn needs_pkru(&self, sregs: &kvm_sregs) -> bool {
        self.caps.pku && sregs.cr4 & CR4_PKE != 0
    }

    /// The paging of `sregs`, with PKRU taken from `xsave` (the vCPU's XSAVE
    /// image) when protection keys apply.
    pub fn paging(&self, sregs: &kvm_sregs, xsave: Option<&[u8]>) -> Result<Paging, GuardError> {
        let pkru = if self.needs_pkru(sregs) {
            self.pkru_offset
                .zip(xsave)
                .and_then(|(offset, image)| pkru_in(image, offset))
                .ok_or(GuardError::UnsupportedPaging(
                    "CR4.PKE is set but the vCPU's PKRU cannot be read",
                ))?
        } else {
            0
        };
        Paging::from_regs(sregs.cr0, sregs.cr3, sregs.cr4, sregs.efer, self.caps, pkru)
    }
}

/// PKRU in a standard-format XSAVE image: 0 (its init state) when XSTATE_BV
/// says the component is in its init state.
pub fn pkru_in(image: &[u8], offset: usize) -> Option<u32> {
    let bv = u64::from_le_bytes(
        image
            .get(XSTATE_BV_OFFSET..XSTATE_BV_OFFSET + 8)?
            .try_into()
            .ok()?,
    );
    if bv & (1 << PKRU_COMPONENT) == 0 {
        return Some(0);
    }
    Some(u32::from_le_bytes(
        image.get(offset..offset + 4)?.try_into().ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::Vendor;

    fn entry(leaf: u32, subleaf: u32, eax: u32, ebx: u32, ecx: u32, edx: u32) -> CpuidEntry {
        CpuidEntry {
            leaf,
            subleaf,
            eax,
            ebx,
            ecx,
            edx,
        }
    }

    #[test]
    fn capabilities_come_from_the_cpuid_table() {
        // Leaf 0: "AuthenticAMD" in EBX, EDX, ECX.
        let full = [
            entry(0, 0, 0x10, 0x6874_7541, 0x444d_4163, 0x6974_6e65),
            entry(0x8000_0001, 0, 0, 0, 0, 1 << 26 | 1 << 20),
            entry(0x8000_0008, 0, 0x3030, 0, 0, 0),
            entry(7, 0, 0, 0, 1 << 3, 0),
            entry(0xD, 9, 8, 0xa80, 0, 0),
        ];
        let s = PagingSource::new(&full);
        assert_eq!(
            s.caps(),
            PagingCaps {
                vendor: Vendor::Amd,
                maxphyaddr: 48,
                page_1g: true,
                nx: true,
                pku: true
            }
        );
        assert_eq!(s.pkru_offset, Some(0xa80));
        let none = PagingSource::new(&[]);
        assert_eq!(
            none.caps(),
            PagingCaps {
                vendor: Vendor::Intel,
                maxphyaddr: 36,
                page_1g: false,
                nx: false,
                pku: false
            }
        );
    }

    #[test]
    fn pkru_is_read_where_xsave_keeps_it() {
        let mut image = vec![0u8; 4096];
        image[0xa80..0xa84].copy_from_slice(&0x5555_5554u32.to_le_bytes());
        assert_eq!(
            pkru_in(&image, 0xa80),
            Some(0),
            "XSTATE_BV bit 9 clear: init"
        );
        image[512] = 1 << 1;
        image[513] = 1 << 1;
        assert_eq!(pkru_in(&image, 0xa80), Some(0x5555_5554));
        assert_eq!(pkru_in(&image[..600], 0xa80), None, "short image");
        let source =
            PagingSource::new(&[entry(7, 0, 0, 0, 1 << 3, 0), entry(0xD, 9, 8, 0xa80, 0, 0)]);
        let mut sregs = kvm_sregs {
            cr0: 0x8000_0001,
            cr4: 0x20 | CR4_PKE,
            efer: 0x500,
            ..Default::default()
        };
        assert!(
            source.paging(&sregs, None).is_err(),
            "PKE without PKRU fails closed"
        );
        assert!(source.paging(&sregs, Some(&image)).unwrap().keys_enabled());
        sregs.cr4 = 0x20;
        assert!(!source.paging(&sregs, None).unwrap().keys_enabled());
    }
}
