//! `lwpvmm cpuid`: the CPUID table a guest gets for an LWP profile, as JSON
//! or as a table with the LWP fields decoded.

use std::io::Write;

use crate::lwp::cpuid::{GuestLwpSupport, LEAF_LWP, LwpFeatures, LwpLeaf, LwpProfile};
use crate::vmm::cpuid_table;

use super::CliError;

/// Prints the table for `profile`.
pub fn print(
    out: &mut dyn Write,
    profile: LwpProfile,
    guest: GuestLwpSupport,
    json: bool,
) -> Result<(), CliError> {
    let entries = cpuid_table(profile, guest)?;
    if json {
        serde_json::to_writer_pretty(&mut *out, &entries)?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(
        out,
        "CPUID for LWP profile `{profile}` (`--guest {guest}`), as passed to KVM_SET_CPUID2 for vCPU 0"
    )?;
    writeln!(
        out,
        "{:>10} {:>7} {:>10} {:>10} {:>10} {:>10}",
        "leaf", "subleaf", "eax", "ebx", "ecx", "edx"
    )?;
    for e in &entries {
        writeln!(
            out,
            "{:#010x} {:>7} {:#010x} {:#010x} {:#010x} {:#010x}",
            e.leaf, e.subleaf, e.eax, e.ebx, e.ecx, e.edx
        )?;
    }
    let Some(lwp) = entries.iter().find(|e| e.leaf == LEAF_LWP) else {
        writeln!(out, "\nno LWP leaf: the profile has no LWP")?;
        return Ok(());
    };
    let leaf = LwpLeaf::from_regs([lwp.eax, lwp.ebx, lwp.ecx, lwp.edx]);
    writeln!(out)?;
    writeln!(out, "0x8000001C decoded:")?;
    writeln!(out, "  EAX enabled:   {}", names(leaf.enabled))?;
    writeln!(out, "  EDX supported: {}", names(leaf.supported))?;
    writeln!(
        out,
        "  EBX: LwpCbSize {} qwords ({} bytes), LwpEventSize {}, LwpMaxEvents {}, LwpEventOffset {}",
        leaf.ebx.cb_size_qwords,
        u32::from(leaf.ebx.cb_size_qwords) * 8,
        leaf.ebx.event_size,
        leaf.ebx.max_events,
        leaf.ebx.event_offset
    )?;
    writeln!(
        out,
        "  ECX: LwpVersion {}, LwpMinBufferSize {} (x32 records), LwpLatencyMax {}, LwpDataAddress {}, LwpIpFiltering {}",
        leaf.ecx.version,
        leaf.ecx.min_buffer_size,
        leaf.ecx.latency_max,
        leaf.ecx.data_address,
        leaf.ecx.ip_filtering
    )?;
    Ok(())
}

fn names(f: LwpFeatures) -> String {
    if f.is_empty() {
        return "none".into();
    }
    f.iter_names()
        .map(|(name, _)| name)
        .collect::<Vec<_>>()
        .join(" ")
}
