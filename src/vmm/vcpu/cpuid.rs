//! The CPUID table a VM receives: KVM's supported CPUID with the LWP profile
//! applied, the topology of each vCPU (topology.rs), and lwpvmm's hypervisor leaves at
//! 0x4000_0100-0x4000_0102. KVM's own 0x4000_0000 signature leaf stays as
//! KVM reports it; its 0x4000_0001 feature leaf keeps only the clock bits
//! (KVM_PV_CLOCK_FEATURES).
//!
//! Pure policy: it works on plain entries, so it is tested without KVM.

use crate::lwp::cpuid::{
    CpuidEntry, EXT_FEATURES_ECX_LWP, GuestLwpSupport, LEAF_EXT_FEATURES, LEAF_EXT_MAX, LEAF_LWP,
    LwpFeatures, LwpProfile,
};
use crate::vmm::base::pv::{EXIT_PORT, UD_PORT};
use crate::vmm::base::pv::{
    LEAF_PV_BASE, LEAF_PV_INFO, LEAF_PV_LINES, PV_ABI_VERSION, PV_SIGNATURE, PvFeatures,
    THRESHOLD_GSI, THRESHOLD_LINES,
};
use crate::vmm::vcpu::topology;

/// CPUID 0x4000_0001 EAX bits a guest may see: the kvmclock MSRs (0 and 3),
/// the stable-clock flag (24) and NOP_IO_DELAY (1). kvmclock gives a Linux
/// guest its TSC frequency without calibrating against the PM timer, which
/// fails and hangs boot when the host is loaded (no PIT to calibrate against
/// on the split irqchip). The other paravirtual features (PV IPIs, PV
/// spinlocks, async page faults, steal time, PV EOI, PV TLB flush) hung a
/// 2-vCPU guest's AP bring-up on kvm_pvm when they were offered, and
/// lwpvmm saves none of their guest-registered state.
pub const KVM_PV_CLOCK_FEATURES: u32 = 1 << 0 | 1 << 1 | 1 << 3 | 1 << 24;

/// KVM's paravirtual feature leaf.
const LEAF_KVM_FEATURES: u32 = 0x4000_0001;

/// The advanced power management leaf, and its EDX bit 8: the invariant
/// TSC. lwpvmm hides it, as QEMU does unless asked (`+invtsc` blocks
/// migration there): with it, Linux rates its TSC clocksource above
/// kvm-clock and reads time from the raw TSC, which a snapshot cannot
/// carry on hosts that cannot offset it (kvm_pvm): a guest restored 30 s
/// later jumped by the whole pause and reported RCU stalls. Without it Linux keeps
/// kvm-clock, which KVM_SET_CLOCK restores (docs/snapshot.md).
const LEAF_POWER_MGMT: u32 = 0x8000_0007;
const POWER_MGMT_EDX_INVARIANT_TSC: u32 = 1 << 8;

/// The whole table for vCPU `vcpu_id` of `vcpus`, from KVM's supported
/// entries.
pub fn build(
    supported: &[CpuidEntry],
    profile: LwpProfile,
    guest: GuestLwpSupport,
    vcpu_id: u8,
    vcpus: u8,
) -> Vec<CpuidEntry> {
    let mut table: Vec<CpuidEntry> = supported
        .iter()
        .filter(|e| e.leaf != LEAF_LWP && !(LEAF_PV_BASE..=LEAF_PV_LINES).contains(&e.leaf))
        .copied()
        .collect();
    let has_lwp = profile.caps().is_some();
    let precise = profile
        .caps()
        .is_some_and(|c| c.supported.intersects(LwpFeatures::IRE | LwpFeatures::BRE));
    topology::apply(&mut table, vcpu_id, vcpus);
    for e in &mut table {
        match e.leaf {
            LEAF_EXT_MAX if has_lwp => e.eax = e.eax.max(LEAF_LWP),
            LEAF_KVM_FEATURES => {
                e.eax &= KVM_PV_CLOCK_FEATURES;
                e.edx = 0;
            }
            LEAF_POWER_MGMT => e.edx &= !POWER_MGMT_EDX_INVARIANT_TSC,
            LEAF_EXT_FEATURES => {
                e.ecx = if has_lwp {
                    e.ecx | EXT_FEATURES_ECX_LWP
                } else {
                    e.ecx & !EXT_FEATURES_ECX_LWP
                }
            }
            _ => {}
        }
    }
    if has_lwp {
        let [eax, ebx, ecx, edx] = profile.leaf(guest).regs();
        table.push(CpuidEntry {
            leaf: LEAF_LWP,
            subleaf: 0,
            eax,
            ebx,
            ecx,
            edx,
        });
    }
    let shim = guest == GuestLwpSupport::Shim;
    let mut features = PvFeatures::EXIT_PORT | PvFeatures::POWER;
    features.set(PvFeatures::UD_DOORBELL, has_lwp && shim);
    features.set(PvFeatures::LWP_STATE, has_lwp);
    features.set(PvFeatures::DB_DOORBELL, precise && shim);
    features.set(PvFeatures::REGS_CALLS, has_lwp && shim);
    features.set(PvFeatures::THRESHOLD_LINES, has_lwp && shim);
    // Mappings name the processes of a whole-guest profile too, LWP or not.
    features.set(PvFeatures::EXEC_MAPPINGS, shim);
    features.set(PvFeatures::RESTORE_RING_AT_STORE, has_lwp);
    table.push(CpuidEntry {
        leaf: LEAF_PV_BASE,
        subleaf: 0,
        eax: LEAF_PV_LINES,
        ebx: PV_SIGNATURE[0],
        ecx: PV_SIGNATURE[1],
        edx: PV_SIGNATURE[2],
    });
    table.push(CpuidEntry {
        leaf: LEAF_PV_INFO,
        subleaf: 0,
        eax: PV_ABI_VERSION,
        ebx: features.bits(),
        ecx: u32::from(UD_PORT),
        edx: u32::from(EXIT_PORT),
    });
    let lines = features.contains(PvFeatures::THRESHOLD_LINES);
    table.push(CpuidEntry {
        leaf: LEAF_PV_LINES,
        subleaf: 0,
        eax: if lines { THRESHOLD_GSI } else { 0 },
        ebx: if lines {
            u32::from(vcpus).min(THRESHOLD_LINES)
        } else {
            0
        },
        ecx: 0,
        edx: 0,
    });
    table.sort_by_key(|e| (e.leaf, e.subleaf));
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(leaf: u32, regs: [u32; 4]) -> CpuidEntry {
        CpuidEntry {
            leaf,
            subleaf: 0,
            eax: regs[0],
            ebx: regs[1],
            ecx: regs[2],
            edx: regs[3],
        }
    }

    /// A host like ours: extended leaves up to 0x8000_0021, no LWP, a
    /// leftover all-zero 0x8000_001C and KVM's own 0x4000_0000 leaves.
    fn host() -> Vec<CpuidEntry> {
        vec![
            entry(1, [0x00B4_0F00, 0x0A20_0800, 0x8120_2000, 0x178B_FBFF]),
            entry(0x4000_0000, [0x4000_0001, 0x4B4D_564B, 0x564B_4D56, 0x4D]),
            entry(LEAF_KVM_FEATURES, [0x0100_7AFB, 0, 0, 1]),
            entry(LEAF_EXT_MAX, [0x8000_0021, 0, 0, 0]),
            entry(LEAF_EXT_FEATURES, [0, 0, 0x0040_0393, 0]),
            entry(LEAF_POWER_MGMT, [0, 0, 0, 0x0000_0100 | 0x0000_0200]),
            entry(LEAF_LWP, [0; 4]),
        ]
    }

    fn find(t: &[CpuidEntry], leaf: u32) -> CpuidEntry {
        *t.iter().find(|e| e.leaf == leaf).expect("leaf present")
    }

    #[test]
    fn profiles_patch_the_lwp_leaves() {
        for profile in LwpProfile::ALL {
            for guest in [GuestLwpSupport::Shim, GuestLwpSupport::Stock] {
                let t = build(&host(), profile, guest, 0, 1);
                let lwp = profile.caps().is_some();
                let ext = find(&t, LEAF_EXT_FEATURES);
                assert_eq!(ext.ecx & EXT_FEATURES_ECX_LWP != 0, lwp, "{profile}");
                assert_eq!(
                    ext.ecx & !EXT_FEATURES_ECX_LWP,
                    0x0040_0393,
                    "{profile}: other bits kept"
                );
                assert_eq!(find(&t, LEAF_EXT_MAX).eax, 0x8000_0021, "never lowered");
                let leaf = t.iter().filter(|e| e.leaf == LEAF_LWP).collect::<Vec<_>>();
                if lwp {
                    let want = profile.leaf(guest).regs();
                    assert_eq!(leaf.len(), 1);
                    assert_eq!([leaf[0].eax, leaf[0].ebx, leaf[0].ecx, leaf[0].edx], want);
                } else {
                    assert!(leaf.is_empty(), "{profile}: no LWP leaf");
                }
                let pv = find(&t, LEAF_PV_INFO);
                let doorbell = lwp && guest == GuestLwpSupport::Shim;
                assert_eq!(
                    PvFeatures::from_bits_truncate(pv.ebx).contains(PvFeatures::UD_DOORBELL),
                    doorbell,
                    "{profile} {guest:?}"
                );
            }
        }
    }

    #[test]
    fn max_extended_leaf_is_raised_when_needed() {
        let mut h = host();
        h[2].eax = 0x8000_0008;
        let t = build(&h, LwpProfile::Emulated, GuestLwpSupport::Shim, 0, 1);
        assert!(find(&t, LEAF_EXT_MAX).eax >= LEAF_LWP);
    }

    #[test]
    fn hypervisor_leaves_and_topology() {
        let t = build(&host(), LwpProfile::Emulated, GuestLwpSupport::Shim, 3, 4);
        let kvm = find(&t, 0x4000_0000);
        assert_eq!(kvm.ebx, 0x4B4D_564B, "KVM's signature untouched");
        let kvm_features = find(&t, LEAF_KVM_FEATURES);
        assert_eq!(
            (kvm_features.eax, kvm_features.edx),
            (0x0100_000B, 0),
            "only the clock bits and NOP_IO_DELAY survive"
        );
        assert_eq!(
            find(&t, LEAF_POWER_MGMT).edx,
            0x0000_0200,
            "the invariant TSC is hidden, the rest kept"
        );
        let base = find(&t, LEAF_PV_BASE);
        assert_eq!(base.eax, LEAF_PV_LINES);
        let sig: Vec<u8> = [base.ebx, base.ecx, base.edx]
            .iter()
            .flat_map(|r| r.to_le_bytes())
            .collect();
        assert_eq!(&sig, b"LwpVmmLwpVmm");
        let info = find(&t, LEAF_PV_INFO);
        assert_eq!((info.eax, info.ecx, info.edx), (PV_ABI_VERSION, 0x5c, 0xf4));
        assert_eq!(find(&t, 1).ebx >> 24, 3, "APIC ID of vCPU 3");
        // (profile, guest, vCPUs, lines leaf EAX and EBX)
        let lines = [
            (LwpProfile::Emulated, GuestLwpSupport::Shim, 4, (16, 4)),
            (LwpProfile::Emulated, GuestLwpSupport::Shim, 12, (16, 8)),
            (LwpProfile::Emulated, GuestLwpSupport::Stock, 4, (0, 0)),
            (LwpProfile::Off, GuestLwpSupport::Shim, 4, (0, 0)),
        ];
        for (profile, guest, vcpus, want) in lines {
            let t = build(&host(), profile, guest, 0, vcpus);
            let l = find(&t, LEAF_PV_LINES);
            assert_eq!((l.eax, l.ebx), want, "{profile} {guest:?} {vcpus}");
            let f = PvFeatures::from_bits_truncate(find(&t, LEAF_PV_INFO).ebx);
            assert_eq!(f.contains(PvFeatures::THRESHOLD_LINES), want.1 > 0);
            assert_eq!(f.contains(PvFeatures::REGS_CALLS), want.1 > 0);
            assert_eq!(
                f.contains(PvFeatures::EXEC_MAPPINGS),
                guest == GuestLwpSupport::Shim
            );
            assert_eq!(
                f.contains(PvFeatures::RESTORE_RING_AT_STORE),
                profile != LwpProfile::Off
            );
        }
        assert!(
            t.windows(2)
                .all(|w| (w[0].leaf, w[0].subleaf) < (w[1].leaf, w[1].subleaf))
        );
    }
}
