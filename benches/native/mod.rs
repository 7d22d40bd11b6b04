//! `cargo bench --bench vmm -- native`: what the host's native supervisor
//! mode gives (docs/pv-abi.md, "Native supervisor mode"), measured side by
//! side in one run with the `native` guest: its CPL0 loop native against
//! its CPL3 loop (entered by SYSRETQ) and against the same loop emulated,
//! and a CPL0 port exit from each mode. Every figure is the guest's own
//! RDTSC count, medians of interleaved rounds; the ratios do not depend on
//! the TSC's frequency. The Linux lines say what is not built yet.

use std::process::Command;

use super::{embedded_guest, median};

/// Rounds of each mode, interleaved.
const ROUNDS: usize = 3;
/// Loop turns of a native run (a second or so), of an emulated one (the
/// emulator takes about 2,500 cycles a turn), and port exits of each.
const NATIVE_TURNS: u64 = 1_000_000_000;
const EMULATED_TURNS: u64 = 200_000;
const EXITS: u64 = 2_000;

/// What one run of the guest printed: cycles of its CPL0 loop, of its CPL3
/// loop (native runs), of its port exits.
struct Counts {
    cpl0: f64,
    cpl3: Option<f64>,
    exits: f64,
}

fn cycles(console: &str, prefix: &str) -> Option<f64> {
    let line = console.lines().find(|l| l.starts_with(prefix))?;
    line.strip_suffix(" cycles")?
        .rsplit(' ')
        .next()?
        .parse()
        .ok()
}

fn run(supervisor: &str, turns: u64) -> Counts {
    let elf = embedded_guest("native");
    let user = u8::from(supervisor == "native");
    let out = Command::new(env!("CARGO_BIN_EXE_lwpvmm"))
        .args(["run", "--kernel", elf.to_str().unwrap(), "--memory", "64"])
        .args(["--supervisor", supervisor, "--cmdline"])
        .arg(format!("iterations={turns} exits={EXITS} user={user}"))
        .output()
        .unwrap();
    let console = String::from_utf8_lossy(&out.stdout);
    let counts = Counts {
        cpl0: cycles(&console, "native: cpl0 loop ").expect("the cpl0 loop line") / turns as f64,
        cpl3: cycles(&console, "native: cpl3 loop ").map(|c| c / turns as f64),
        exits: cycles(&console, "native: port exits ").expect("the port exits line") / EXITS as f64,
    };
    assert_eq!(out.status.code(), Some(1), "{console}");
    counts
}

pub fn native() {
    println!("native supervisor mode (the native guest, medians of {ROUNDS} interleaved rounds):");
    let kvm = kvm_ioctls::Kvm::new().unwrap();
    let vm = kvm.create_vm().unwrap();
    if !lwpvmm::vmm::vcpu::native::host_offers(&vm.create_vcpu(0).unwrap()) {
        println!("  this host's KVM offers no native supervisor mode: nothing to measure");
        return;
    }
    let (mut native, mut emulated) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        native.push(run("native", NATIVE_TURNS));
        emulated.push(run("emulated", EMULATED_TURNS));
    }
    let m = |v: &[Counts], f: fn(&Counts) -> f64| median(v.iter().map(f).collect());
    let cpl0 = m(&native, |c| c.cpl0);
    let cpl3 = m(&native, |c| c.cpl3.expect("the native run's cpl3 line"));
    let emulated_cpl0 = m(&emulated, |c| c.cpl0);
    let (native_exit, emulated_exit) = (m(&native, |c| c.exits), m(&emulated, |c| c.exits));
    println!(
        "  cycles per loop turn: native cpl0 {cpl0:.2}, native cpl3 {cpl3:.2}, emulated cpl0 {emulated_cpl0:.0}"
    );
    println!("native cpl0 loop / cpl3 loop = {:.2}", cpl3 / cpl0);
    println!(
        "native cpl0 loop / emulated cpl0 loop = {:.0}",
        emulated_cpl0 / cpl0
    );
    println!("  cycles per CPL0 port exit: native {native_exit:.0}, emulated {emulated_exit:.0}");
    println!(
        "native exit / emulated exit = {:.2}",
        native_exit / emulated_exit
    );
    for line in [
        "linux boot to userspace native / emulated",
        "linux selftest native / emulated",
        "linux lwpins via module native / bare round trip",
        "net tcp host->guest native / emulated",
    ] {
        println!(
            "{line}: not measured (the Linux guest has no native patch set yet: docs/linux-guest.md, \"Native supervisor mode\")"
        );
    }
}
