//! Which bits of a paging entry are reserved, as one table ([`RULES`]): by
//! the kind of entry (its level, and PS where the level may map a page), on
//! the processor the guest sees (its vendor, MAXPHYADDR, NX and Page1GB,
//! from the guest's own CPUID table) with its EFER.NXE. A CPU access
//! through an entry that sets a reserved bit faults with PFEC.RSVD, so an
//! LWP store through it must fault the same way.
//!
//! The rows are KVM's 4-level masks (`__reset_rsvds_bits_mask` in
//! arch/x86/kvm/mmu/mmu.c), which decide the guest's own faults wherever
//! KVM walks the guest's page tables (shadow paging, as on kvm_pvm), and
//! agree with Intel's SDM and AMD's APM. The one vendor difference is bit 8
//! of a PML4E: reserved on AMD-compatible processors, ignored on the
//! others. Every bit no row names is the CPU's to use or to ignore: bits
//! 62:52 (ignored, or protection keys in a leaf), bit 8 of every other
//! entry (G in a leaf, ignored in a table), the PAT bit of a PTE.

use super::error::Level;
use crate::lwp::cpuid::CpuidEntry;

/// PS: the entry maps a page (in a PDPTE or PDE).
const PTE_LARGE: u64 = 1 << 7;
/// Address bits 51:12 of a paging entry.
const PTE_ADDR: u64 = 0x000F_FFFF_FFFF_F000;

/// Whose paging rules the guest's processor follows, by the vendor string
/// of its CPUID leaf 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Vendor {
    /// GenuineIntel, and every vendor that is not AMD-compatible (KVM
    /// gives them Intel's rules), also when the table has no leaf 0.
    Intel,
    /// AuthenticAMD, AMDisbetter! and HygonGenuine: what KVM counts as
    /// AMD-compatible (`guest_cpuid_is_amd_compatible`).
    Amd,
}

/// The vendor strings KVM counts as AMD-compatible.
const AMD_COMPATIBLE: [&[u8; 12]; 3] = [b"AuthenticAMD", b"AMDisbetter!", b"HygonGenuine"];

impl Vendor {
    /// The vendor a 12-byte CPUID vendor string (EBX, EDX, ECX of leaf 0)
    /// names.
    pub fn from_name(name: &[u8; 12]) -> Vendor {
        if AMD_COMPATIBLE.contains(&name) {
            Vendor::Amd
        } else {
            Vendor::Intel
        }
    }

    /// The vendor leaf 0 of a CPUID table names: the table the guest sees,
    /// never the host's, since KVM keys its own checks on the guest's.
    pub fn from_cpuid(table: &[CpuidEntry]) -> Vendor {
        table
            .iter()
            .find(|e| e.leaf == 0 && e.subleaf == 0)
            .map_or(Vendor::Intel, |e| {
                let mut name = [0u8; 12];
                for (chunk, reg) in name.chunks_exact_mut(4).zip([e.ebx, e.edx, e.ecx]) {
                    chunk.copy_from_slice(&reg.to_le_bytes());
                }
                Vendor::from_name(&name)
            })
    }
}

/// A kind of paging entry: its level, and for the levels that may map a
/// page, whether PS makes it one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EntryKind {
    /// A PML4E (PS is itself a reserved bit there).
    Pml4e,
    /// A PDPTE that points at a page directory.
    Pdpte,
    /// A PDPTE with PS: a 1 GiB page.
    Pdpte1G,
    /// A PDE that points at a page table.
    Pde,
    /// A PDE with PS: a 2 MiB page.
    Pde2M,
    /// A PTE: a 4 KiB page.
    Pte,
}

impl EntryKind {
    /// Every kind, in [`EntryKind::index`] order.
    pub const ALL: [EntryKind; 6] = [
        EntryKind::Pml4e,
        EntryKind::Pdpte,
        EntryKind::Pdpte1G,
        EntryKind::Pde,
        EntryKind::Pde2M,
        EntryKind::Pte,
    ];

    /// The kind of `entry`, read at `level`.
    pub fn of(level: Level, entry: u64) -> EntryKind {
        let large = entry & PTE_LARGE != 0;
        match level {
            Level::Pml4 => EntryKind::Pml4e,
            Level::Pdpt if large => EntryKind::Pdpte1G,
            Level::Pdpt => EntryKind::Pdpte,
            Level::Pd if large => EntryKind::Pde2M,
            Level::Pd => EntryKind::Pde,
            Level::Pt => EntryKind::Pte,
        }
    }

    /// Whether the walk ends at this entry (it maps a page).
    pub fn is_leaf(self) -> bool {
        matches!(self, EntryKind::Pdpte1G | EntryKind::Pde2M | EntryKind::Pte)
    }

    fn index(self) -> usize {
        match self {
            EntryKind::Pml4e => 0,
            EntryKind::Pdpte => 1,
            EntryKind::Pdpte1G => 2,
            EntryKind::Pde => 3,
            EntryKind::Pde2M => 4,
            EntryKind::Pte => 5,
        }
    }
}

/// Which bits a rule reserves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bits {
    /// The physical-address bits the processor lacks: MAXPHYADDR to 51.
    AboveMaxPhyAddr,
    /// These bits.
    Mask(u64),
}

/// When a rule's bits are reserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// On every processor.
    Always,
    /// On AMD-compatible processors only.
    Amd,
    /// With no-execute off (EFER.NXE clear; KVM refuses NXE without NX).
    NxOff,
    /// On a processor without 1 GiB pages (CPUID 0x8000_0001.EDX[26]).
    NoPage1G,
}

/// One row of the table: these bits of these kinds of entry are reserved
/// under this condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// The row in words.
    pub what: &'static str,
    /// The kinds of entry it concerns.
    pub kinds: &'static [EntryKind],
    /// The bits.
    pub bits: Bits,
    /// When they are reserved.
    pub when: When,
}

/// The reserved bits of 4-level paging (docs/lwp-model.md G3 and G9).
pub const RULES: [Rule; 7] = [
    Rule {
        what: "physical-address bits from MAXPHYADDR to 51",
        kinds: &EntryKind::ALL,
        bits: Bits::AboveMaxPhyAddr,
        when: When::Always,
    },
    Rule {
        what: "XD (bit 63) with no-execute off",
        kinds: &EntryKind::ALL,
        bits: Bits::Mask(1 << 63),
        when: When::NxOff,
    },
    Rule {
        what: "PS (bit 7) in a PML4E",
        kinds: &[EntryKind::Pml4e],
        bits: Bits::Mask(1 << 7),
        when: When::Always,
    },
    Rule {
        what: "bit 8 in a PML4E on AMD-compatible processors",
        kinds: &[EntryKind::Pml4e],
        bits: Bits::Mask(1 << 8),
        when: When::Amd,
    },
    Rule {
        what: "PS (bit 7) in a PDPTE without 1 GiB pages",
        kinds: &[EntryKind::Pdpte1G],
        bits: Bits::Mask(1 << 7),
        when: When::NoPage1G,
    },
    Rule {
        what: "bits 29:13 of a 1 GiB page",
        kinds: &[EntryKind::Pdpte1G],
        bits: Bits::Mask(0x3FFF_E000),
        when: When::Always,
    },
    Rule {
        what: "bits 20:13 of a 2 MiB page",
        kinds: &[EntryKind::Pde2M],
        bits: Bits::Mask(0x001F_E000),
        when: When::Always,
    },
];

/// The physical-address width a walk uses for a claimed MAXPHYADDR: what
/// x86-64 allows (32 to 52 bits), so that a nonsensical CPUID value cannot
/// overflow a shift.
pub(crate) fn physical_width(maxphyaddr: u8) -> u32 {
    u32::from(maxphyaddr.clamp(32, 52))
}

/// What a walk refuses in each kind of entry, from [`RULES`] for one
/// processor and EFER.NXE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReservedBits {
    masks: [u64; 6],
}

impl ReservedBits {
    /// The reserved bits on a processor of `vendor` with physical width
    /// `maxphyaddr`, with or without 1 GiB pages, no-execute on or off.
    pub fn new(vendor: Vendor, maxphyaddr: u8, page_1g: bool, nx_enabled: bool) -> Self {
        let above = PTE_ADDR & !((1u64 << physical_width(maxphyaddr)) - 1);
        let mut masks = [0u64; 6];
        for rule in &RULES {
            let applies = match rule.when {
                When::Always => true,
                When::Amd => vendor == Vendor::Amd,
                When::NxOff => !nx_enabled,
                When::NoPage1G => !page_1g,
            };
            if !applies {
                continue;
            }
            let bits = match rule.bits {
                Bits::AboveMaxPhyAddr => above,
                Bits::Mask(mask) => mask,
            };
            for kind in rule.kinds {
                masks[kind.index()] |= bits;
            }
        }
        ReservedBits { masks }
    }

    /// The reserved bits of an entry of `kind`.
    pub fn of(&self, kind: EntryKind) -> u64 {
        self.masks[kind.index()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf0(name: &[u8; 12]) -> CpuidEntry {
        let reg = |i: usize| u32::from_le_bytes([name[i], name[i + 1], name[i + 2], name[i + 3]]);
        CpuidEntry {
            leaf: 0,
            subleaf: 0,
            eax: 0x20,
            ebx: reg(0),
            edx: reg(4),
            ecx: reg(8),
        }
    }

    #[test]
    fn the_vendor_comes_from_leaf_0_of_the_guests_table() {
        // (vendor string, the rules it gets)
        let table: [(&[u8; 12], Vendor); 6] = [
            (b"GenuineIntel", Vendor::Intel),
            (b"AuthenticAMD", Vendor::Amd),
            (b"AMDisbetter!", Vendor::Amd),
            (b"HygonGenuine", Vendor::Amd),
            (b"CentaurHauls", Vendor::Intel),
            (b"  Shanghai  ", Vendor::Intel),
        ];
        for (name, want) in table {
            let what = String::from_utf8_lossy(name);
            assert_eq!(Vendor::from_name(name), want, "{what}");
            assert_eq!(Vendor::from_cpuid(&[leaf0(name)]), want, "{what}");
        }
        assert_eq!(Vendor::from_cpuid(&[]), Vendor::Intel, "no leaf 0");
        let mut other_subleaf = leaf0(b"AuthenticAMD");
        other_subleaf.subleaf = 1;
        assert_eq!(Vendor::from_cpuid(&[other_subleaf]), Vendor::Intel);
    }

    /// KVM's 4-level masks, transcribed from `__reset_rsvds_bits_mask`
    /// (rsvd_bits_mask[PS][level - 1]) as an oracle independent of the
    /// table's shape.
    fn kvm_mask(kind: EntryKind, amd: bool, maxphyaddr: u32, page_1g: bool, nx: bool) -> u64 {
        let bits = |lo: u32, hi: u32| (u64::MAX >> (63 - hi)) & !((1u64 << lo) - 1);
        let mut high = if maxphyaddr < 52 {
            bits(maxphyaddr, 51)
        } else {
            0
        };
        if !nx {
            high |= bits(63, 63);
        }
        let gbpages = if page_1g { 0 } else { bits(7, 7) };
        let nonleaf_bit8 = if amd { bits(8, 8) } else { 0 };
        match kind {
            EntryKind::Pml4e => high | nonleaf_bit8 | bits(7, 7),
            EntryKind::Pdpte => high | gbpages,
            EntryKind::Pdpte1G => high | gbpages | bits(13, 29),
            EntryKind::Pde | EntryKind::Pte => high,
            EntryKind::Pde2M => high | bits(13, 20),
        }
    }

    #[test]
    fn the_table_gives_kvms_masks_for_every_processor() {
        for vendor in [Vendor::Intel, Vendor::Amd] {
            for maxphyaddr in [36u8, 39, 40, 46, 48, 51, 52] {
                for page_1g in [false, true] {
                    for nx in [false, true] {
                        let reserved = ReservedBits::new(vendor, maxphyaddr, page_1g, nx);
                        for kind in EntryKind::ALL {
                            let amd = vendor == Vendor::Amd;
                            let want = kvm_mask(kind, amd, maxphyaddr.into(), page_1g, nx);
                            // A PDPTE pointing at a directory has PS clear:
                            // KVM's bit 7 there never meets a set bit.
                            let want = if kind == EntryKind::Pdpte {
                                want & !PTE_LARGE
                            } else {
                                want
                            };
                            assert_eq!(
                                reserved.of(kind),
                                want,
                                "{vendor:?} MAXPHYADDR {maxphyaddr} 1G {page_1g} NX {nx} {kind:?}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_kind_of_an_entry_is_its_level_and_ps() {
        // (level, PS, kind, a leaf)
        let table = [
            (Level::Pml4, false, EntryKind::Pml4e, false),
            (Level::Pml4, true, EntryKind::Pml4e, false),
            (Level::Pdpt, false, EntryKind::Pdpte, false),
            (Level::Pdpt, true, EntryKind::Pdpte1G, true),
            (Level::Pd, false, EntryKind::Pde, false),
            (Level::Pd, true, EntryKind::Pde2M, true),
            (Level::Pt, false, EntryKind::Pte, true),
            (Level::Pt, true, EntryKind::Pte, true),
        ];
        for (level, ps, kind, leaf) in table {
            let entry = 0x1000 | 1 | if ps { PTE_LARGE } else { 0 };
            assert_eq!(EntryKind::of(level, entry), kind, "{level} PS {ps}");
            assert_eq!(kind.is_leaf(), leaf, "{kind:?}");
        }
    }
}
