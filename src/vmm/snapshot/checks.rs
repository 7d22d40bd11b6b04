//! What a restore checks of a snapshot before any vCPU runs, beside its
//! format's own checks: its vCPUs in order, their CPUID tables the ones
//! this host gives the same profile, and each restored LWPCB reachable by
//! a CPL3 store of its vCPU.

use crate::guard::{Access, GuestMemory, GuestView};
use crate::lwp::cpuid::CpuidEntry;
use crate::vmm::snapshot::{SnapshotError, VmSnapshot};
use crate::vmm::vcpu::Vcpu;
use crate::vmm::vcpu::cpuid;
use crate::vmm::vcpu::guest_paging::PagingSource;
use crate::vmm::vcpu::vcpu_state::VcpuSnapshot;

/// The snapshot's vCPU count, refusing ids that are not 0..n in order.
pub fn vcpu_count(snap: &VmSnapshot) -> Result<u8, SnapshotError> {
    let count = u8::try_from(snap.vcpus.len())
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| SnapshotError::Mismatch(format!("{} vCPUs", snap.vcpus.len())))?;
    if snap
        .vcpus
        .iter()
        .enumerate()
        .any(|(i, v)| usize::from(v.id) != i)
    {
        return Err(SnapshotError::Mismatch(
            "vCPU ids are not 0..n in order".into(),
        ));
    }
    Ok(count)
}

/// Refuses a snapshot whose CPUID tables differ from what this host gives
/// the same profile on `count` vCPUs (from [`vcpu_count`]), `supported`
/// being what its KVM supports.
pub fn cpuid_matches(
    supported: &[CpuidEntry],
    snap: &VmSnapshot,
    count: u8,
) -> Result<(), SnapshotError> {
    for v in &snap.vcpus {
        let here = cpuid::build(supported, snap.profile, snap.guest, v.id, count);
        if here != v.cpuid {
            let differing: Vec<String> = here
                .iter()
                .filter(|e| !v.cpuid.contains(e))
                .chain(v.cpuid.iter().filter(|e| !here.contains(e)))
                .map(|e| format!("{:#x}.{}", e.leaf, e.subleaf))
                .take(6)
                .collect();
            return Err(SnapshotError::Mismatch(format!(
                "vCPU {}: the CPUID table differs from the one this host gives profile `{}` (leaves {})",
                v.id,
                snap.profile,
                differing.join(", ")
            )));
        }
    }
    Ok(())
}

/// Refuses a restored LWPCB the vCPU could not reach as a CPL3 store.
pub fn lwpcb_reachable(
    mem: &GuestMemory,
    vcpu: &Vcpu,
    saved: &VcpuSnapshot,
) -> Result<(), SnapshotError> {
    let Some(unit) = vcpu.lwp().unit() else {
        return Ok(());
    };
    let Some(address) = unit.block().map(|b| b.address) else {
        return Ok(());
    };
    let bad = |reason: String| SnapshotError::Lwp {
        vcpu: saved.id,
        reason,
    };
    let xsave: Vec<u8> = saved.xsave.iter().flat_map(|w| w.to_le_bytes()).collect();
    let paging = PagingSource::new(&saved.cpuid)
        .paging(&saved.sregs, Some(&xsave))
        .map_err(|e| bad(e.to_string()))?;
    let size = u64::from(unit.caps().cb_size());
    GuestView::new(mem, paging)
        .check(address, size, Access::UserWrite)
        .map_err(|e| {
            bad(format!(
                "the LWPCB at {address:#x} is not in guest RAM the vCPU can reach: {e}"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lwp::cpuid::{GuestLwpSupport, LwpProfile};

    #[test]
    fn vcpus_in_order_with_this_hosts_cpuid() {
        let table_of =
            |id, count| cpuid::build(&[], LwpProfile::Emulated, GuestLwpSupport::Shim, id, count);
        let snap = |vcpus: Vec<VcpuSnapshot>| VmSnapshot {
            vcpus,
            ..super::super::tests::sample()
        };
        // (what, the vCPUs, their count or the words of the refusal)
        let table: Vec<(&str, Vec<VcpuSnapshot>, Result<u8, &str>)> = vec![
            (
                "two in order",
                vec![
                    VcpuSnapshot::blank(0, table_of(0, 2)),
                    VcpuSnapshot::blank(1, table_of(1, 2)),
                ],
                Ok(2),
            ),
            ("none", Vec::new(), Err("0 vCPUs")),
            (
                "out of order",
                vec![
                    VcpuSnapshot::blank(1, table_of(1, 2)),
                    VcpuSnapshot::blank(0, table_of(0, 2)),
                ],
                Err("not 0..n in order"),
            ),
        ];
        for (what, vcpus, want) in table {
            let got = vcpu_count(&snap(vcpus)).map_err(|e| e.to_string());
            match (got, want) {
                (Ok(n), Ok(m)) => assert_eq!(n, m, "{what}"),
                (Err(e), Err(text)) => assert!(e.contains(text), "{what}: {e}"),
                (got, want) => panic!("{what}: {got:?}, want {want:?}"),
            }
        }
        // A table this host would not give: refused, naming the leaf.
        let mut other = table_of(0, 1);
        other[0].eax ^= 1;
        let leaf = other[0].leaf;
        let err = cpuid_matches(&[], &snap(vec![VcpuSnapshot::blank(0, other)]), 1).unwrap_err();
        assert!(err.to_string().contains(&format!("{leaf:#x}.")), "{err}");
        assert!(cpuid_matches(&[], &snap(vec![VcpuSnapshot::blank(0, table_of(0, 1))]), 1).is_ok());
    }
}
