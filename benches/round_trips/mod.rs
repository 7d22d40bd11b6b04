//! `cargo bench --bench vmm -- round_trips`: the paravirtual LWPINS round trip
//! from CPL3 against a CPL3 port exit and a CPL3 UD2 through the same doorbell,
//! and an LWP_CFG RDMSR exit against a CPL0 port exit. Shared helpers are the
//! bench root's (vmm.rs).

use super::*;

pub fn round_trips() {
    let [lwpins, out, ud2, rdmsr, cpl0_out] = round_trip_cycles();
    let _ = BARE_LWPINS.set(lwpins);
    println!("round trips (guest TSC cycles per iteration, {ROUND_TRIP_ITERATIONS} iterations):");
    println!("  CPL3 lwpins via #UD doorbell      {lwpins:>10.0}");
    println!("  CPL3 out (port 0x80)              {out:>10.0}");
    println!("  CPL3 ud2 via #UD doorbell         {ud2:>10.0}");
    println!("  CPL0 rdmsr LWP_CFG                {rdmsr:>10.0}");
    println!("  CPL0 out (port 0x80)              {cpl0_out:>10.0}");
    println!("ratios:");
    println!("  lwpins / CPL3 out   = {:.2}  (goal <= 1.5)", lwpins / out);
    println!("  lwpins / ud2        = {:.2}  (goal <= 1.1)", lwpins / ud2);
    println!(
        "  rdmsr / CPL0 out    = {:.2}  (goal <= 1.2)",
        rdmsr / cpl0_out
    );
}
