//! The CPU topology a guest sees: one package of `count` cores with one
//! thread each, the APIC ID of each being its vCPU index (what KVM gives
//! its local APICs and the MADT lists, acpi.rs). Written into every CPUID
//! leaf that describes topology (1, 4, 0xB, 0x1F, 0x8000_0008 and
//! 0x8000_001E) so that they agree with each other whatever the host's
//! vendor and topology are.
//!
//! Pure policy on plain entries, tested without KVM.

use crate::lwp::cpuid::{CpuidEntry, LEAF_EXT_MAX};

const LEAF_CACHE: u32 = 4;
const LEAF_TOPOLOGY: u32 = 0xB;
const LEAF_TOPOLOGY_V2: u32 = 0x1F;
const LEAF_ADDRESS_SIZES: u32 = 0x8000_0008;
const LEAF_AMD_TOPOLOGY: u32 = 0x8000_001E;
/// CPUID.1:EDX.HTT: EBX[23:16] is valid (more than one logical processor).
const EDX_HTT: u32 = 1 << 28;
/// Level types of leaves 0xB and 0x1F.
const LEVEL_SMT: u32 = 1;
const LEVEL_CORE: u32 = 2;

/// Bits of the APIC ID that number the cores of the package.
pub fn core_bits(count: u8) -> u32 {
    u32::from(count).next_power_of_two().trailing_zeros()
}

fn is_amd(table: &[CpuidEntry]) -> bool {
    table.iter().find(|e| e.leaf == 0).is_some_and(|e| {
        let vendor = [e.ebx, e.edx, e.ecx].map(u32::to_le_bytes).concat();
        vendor == *b"AuthenticAMD" || vendor == *b"HygonGenuine"
    })
}

fn entry(leaf: u32, subleaf: u32, regs: [u32; 4]) -> CpuidEntry {
    CpuidEntry {
        leaf,
        subleaf,
        eax: regs[0],
        ebx: regs[1],
        ecx: regs[2],
        edx: regs[3],
    }
}

/// The three subleaves of leaf 0xB or 0x1F for `vcpu`: threads, cores, end.
fn levels(leaf: u32, vcpu: u32, count: u8) -> [CpuidEntry; 3] {
    let shift = core_bits(count);
    [
        entry(leaf, 0, [0, 1, LEVEL_SMT << 8, vcpu]),
        entry(
            leaf,
            1,
            [shift, u32::from(count), 1 | LEVEL_CORE << 8, vcpu],
        ),
        entry(leaf, 2, [0, 0, 2, vcpu]),
    ]
}

/// Writes the topology of vCPU `vcpu` of `count` into `table`.
pub fn apply(table: &mut Vec<CpuidEntry>, vcpu: u8, count: u8) {
    let id = u32::from(vcpu);
    let shift = core_bits(count);
    let ids_in_package = (1u32 << shift) - 1;
    let amd = is_amd(table);
    let max_basic = table.iter().find(|e| e.leaf == 0).map_or(0, |e| e.eax);
    for e in table.iter_mut() {
        match e.leaf {
            1 => {
                e.ebx = (e.ebx & 0xFFFF) | u32::from(count) << 16 | id << 24;
                e.edx = if count > 1 {
                    e.edx | EDX_HTT
                } else {
                    e.edx & !EDX_HTT
                };
            }
            LEAF_CACHE if e.eax & 0x1F != 0 => {
                let level = (e.eax >> 5) & 7;
                let sharing = if level >= 3 { ids_in_package } else { 0 };
                e.eax = (e.eax & 0x3FFF) | ids_in_package.min(63) << 26 | sharing.min(0xFFF) << 14;
            }
            LEAF_ADDRESS_SIZES if amd => {
                e.ecx = (e.ecx & !0xF0FF) | shift << 12 | u32::from(count).saturating_sub(1);
            }
            LEAF_EXT_MAX => e.eax = e.eax.max(LEAF_AMD_TOPOLOGY),
            _ => {}
        }
    }
    table.retain(|e| !matches!(e.leaf, LEAF_TOPOLOGY | LEAF_TOPOLOGY_V2 | LEAF_AMD_TOPOLOGY));
    for leaf in [LEAF_TOPOLOGY, LEAF_TOPOLOGY_V2] {
        if max_basic >= leaf {
            table.extend(levels(leaf, id, count));
        }
    }
    // Core ID in EBX[7:0], one thread per core (EBX[15:8] = 0), node 0 of 1.
    table.push(entry(LEAF_AMD_TOPOLOGY, 0, [id, id, 0, 0]));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vendor(name: &[u8; 12]) -> CpuidEntry {
        let r = |i: usize| u32::from_le_bytes(name[i..i + 4].try_into().unwrap());
        entry(0, 0, [0x20, r(0), r(8), r(4)])
    }

    /// Hosts as KVM reports them: an Intel one (leaf 4 caches, zeroed 0xB
    /// and 0x1F, two cores) and an AMD one (no leaf 4 data, 0x8000_001E of
    /// its own core 5).
    fn host(amd: bool) -> Vec<CpuidEntry> {
        let mut t = vec![
            vendor(if amd {
                b"AuthenticAMD"
            } else {
                b"GenuineIntel"
            }),
            entry(1, 0, [0x000c_06f2, 0x0002_0800, 0x8120_2000, 0x0f8b_fbff]),
            entry(LEAF_TOPOLOGY, 0, [0; 4]),
            entry(LEAF_TOPOLOGY_V2, 0, [0; 4]),
            entry(LEAF_EXT_MAX, 0, [0x8000_0008, 0, 0, 0]),
            entry(LEAF_ADDRESS_SIZES, 0, [0x3030, 0, 0x0000_7001, 0]),
        ];
        if amd {
            t.push(entry(LEAF_AMD_TOPOLOGY, 0, [5, 0x105, 0, 0]));
        } else {
            t.extend([
                entry(LEAF_CACHE, 0, [0x0400_0121, 0x02c0_003f, 0x3f, 0]),
                entry(LEAF_CACHE, 3, [0x0400_4163, 0x04c0_003f, 0x3_bfff, 4]),
                entry(LEAF_CACHE, 4, [0; 4]),
            ]);
        }
        t
    }

    fn find(t: &[CpuidEntry], leaf: u32, subleaf: u32) -> Option<CpuidEntry> {
        t.iter()
            .find(|e| e.leaf == leaf && e.subleaf == subleaf)
            .copied()
    }

    #[test]
    fn every_leaf_tells_the_same_topology() {
        for amd in [false, true] {
            for count in [1u8, 2, 3, 4, 64, 254] {
                for vcpu in [0, count / 2, count - 1] {
                    let mut t = host(amd);
                    apply(&mut t, vcpu, count);
                    let what = format!("amd={amd} count={count} vcpu={vcpu}");
                    let id = u32::from(vcpu);
                    let shift = core_bits(count);
                    assert!(1u32 << shift >= u32::from(count), "{what}");
                    let l1 = find(&t, 1, 0).unwrap();
                    assert_eq!(l1.ebx >> 24, id, "{what}: leaf 1 APIC ID");
                    assert_eq!((l1.ebx >> 16) & 0xFF, u32::from(count), "{what}");
                    assert_eq!(l1.edx & EDX_HTT != 0, count > 1, "{what}: HTT");
                    assert_eq!(l1.ebx & 0xFFFF, 0x0800, "{what}: other fields kept");
                    for leaf in [LEAF_TOPOLOGY, LEAF_TOPOLOGY_V2] {
                        let smt = find(&t, leaf, 0).unwrap();
                        let core = find(&t, leaf, 1).unwrap();
                        let end = find(&t, leaf, 2).unwrap();
                        assert_eq!([smt.edx, core.edx, end.edx], [id; 3], "{what}");
                        assert_eq!((smt.eax, smt.ebx, (smt.ecx >> 8) & 0xFF), (0, 1, 1));
                        assert_eq!(core.eax & 0x1F, shift, "{what}");
                        assert_eq!(core.ebx & 0xFFFF, u32::from(count), "{what}");
                        assert_eq!((core.ecx >> 8) & 0xFF, 2, "{what}");
                        assert_eq!(core.ecx & 0xFF, 1, "{what}: level number");
                        assert_eq!((end.ebx, (end.ecx >> 8) & 0xFF), (0, 0));
                        assert_eq!(id >> shift, 0, "{what}: one package");
                    }
                    let amd_topo = find(&t, LEAF_AMD_TOPOLOGY, 0).unwrap();
                    assert_eq!((amd_topo.eax, amd_topo.ebx), (id, id), "{what}");
                    assert!(find(&t, LEAF_EXT_MAX, 0).unwrap().eax >= LEAF_AMD_TOPOLOGY);
                    let sizes = find(&t, LEAF_ADDRESS_SIZES, 0).unwrap();
                    if amd {
                        assert_eq!(sizes.ecx & 0xFF, u32::from(count) - 1, "{what}: NC");
                        assert_eq!((sizes.ecx >> 12) & 0xF, shift, "{what}");
                        assert_eq!(sizes.ecx & 0xF00, 0, "{what}: other fields kept");
                    } else {
                        assert_eq!(sizes.ecx, 0x7001, "{what}: Intel's reserved ECX kept");
                        let l1d = find(&t, LEAF_CACHE, 0).unwrap();
                        let l3 = find(&t, LEAF_CACHE, 3).unwrap();
                        let cores = (l1d.eax >> 26) + 1;
                        assert!(cores >= u32::from(count).min(64), "{what}");
                        assert_eq!((l1d.eax >> 14) & 0xFFF, 0, "{what}: L1 per core");
                        assert_eq!((l3.eax >> 14) & 0xFFF, (1 << shift) - 1, "{what}");
                        assert_eq!(l3.eax & 0x3FFF, 0x0163, "{what}: cache fields kept");
                        assert_eq!(find(&t, LEAF_CACHE, 4).unwrap().eax, 0, "{what}");
                    }
                    let mut keys: Vec<(u32, u32)> = t.iter().map(|e| (e.leaf, e.subleaf)).collect();
                    keys.sort();
                    keys.dedup();
                    assert_eq!(keys.len(), t.len(), "{what}: no duplicate entries");
                }
            }
        }
    }

    #[test]
    fn leaves_beyond_the_basic_maximum_stay_absent() {
        let mut t = host(true);
        t[0].eax = 0xD;
        apply(&mut t, 1, 2);
        assert!(find(&t, LEAF_TOPOLOGY, 0).is_some());
        assert!(
            t.iter().all(|e| e.leaf != LEAF_TOPOLOGY_V2),
            "0x1F above the maximum"
        );
        t[0].eax = 0xA;
        apply(&mut t, 1, 2);
        assert!(t.iter().all(|e| e.leaf != LEAF_TOPOLOGY));
    }
}
