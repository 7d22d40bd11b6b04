//! `cargo bench --bench vmm -- precise`: single-stepping's cost per instruction
//! with IRE, and with IRE and BRE, against the bare trap-flag step. Shared
//! helpers are the bench root's (vmm.rs).

use super::*;

/// Guest TSC cycles per trap-flag step of the bare floor guest (no LWP, a
/// #DB handler that rings a bare port), on the stepping guest's loop.
fn bare_tf_step() -> f64 {
    let console = Arc::new(Mutex::new(Vec::new()));
    let config = VmConfig {
        kernel: lwpvmm::guests::get("tfstep").expect("guest").to_vec(),
        cmdline: "iterations=4000".into(),
        memory_mib: 64,
        profile: LwpProfile::Off,
        host: captured(&console, Profiling::default()),
        ..VmConfig::default()
    };
    vmm::run(&config).expect("tfstep guest");
    let text = String::from_utf8_lossy(&console.lock().unwrap()).into_owned();
    let v: Vec<f64> = text
        .lines()
        .find_map(|l| l.strip_prefix("tfstep "))
        .unwrap_or_else(|| panic!("no tfstep line in:\n{text}"))
        .split(' ')
        .map(|x| x.trim().parse().unwrap())
        .collect();
    v[0] / v[1]
}

pub fn precise() {
    // Interleaved, the fastest of three each: host noise only slows a run.
    let (mut ire, mut both, mut bare) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        bare.push(bare_tf_step());
        ire.push(stepping(false));
        both.push(stepping(true));
    }
    let low = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let firsts = |v: &[(f64, f64)]| v.iter().map(|p| p.0).collect::<Vec<_>>();
    let seconds = |v: &[(f64, f64)]| v.iter().map(|p| p.1).collect::<Vec<_>>();
    let cycles_per_ns = tsc_hz() / 1e9;
    let (ire_host, both_host) = (
        low(&seconds(&ire)) * cycles_per_ns,
        low(&seconds(&both)) * cycles_per_ns,
    );
    let (ire, both, bare) = (low(&firsts(&ire)), low(&firsts(&both)), low(&bare));
    println!("precise stepping (trap-flag backend, guest TSC cycles per stepped instruction):");
    println!("  bare TF step      {bare:>10.0}  (#DB to a handler that rings a bare port, IRET)");
    println!(
        "  IRE only          {ire:>10.0}  ({ire_host:.0} of them in lwpvmm after KVM_RUN returns)"
    );
    println!(
        "  IRE + BRE         {both:>10.0}  ({both_host:.0} in lwpvmm: every instruction also decoded)"
    );
    println!(
        "  the rest of a step is the guest's #DB delivery, its handler's port exit and IRET, as in the bare step"
    );
    println!("  IRE+BRE steps/s relative to IRE-only = {:.2}", ire / both);
    println!("  IRE+BRE step / bare TF step = {:.2}", both / bare);
    println!("precise step / bare TF step = {:.2}", ire / bare);
}
