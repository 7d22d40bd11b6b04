//! `cargo bench --bench vmm -- linux_lwp`: LWP in a Linux process through the
//! guest module: one LWPINS and one stepped instruction against the bare
//! guests'. Shared helpers are the bench root's (vmm.rs).

use super::*;

/// Guest TSC cycles of one LWPINS in the bare round-trip guest.
fn bare_lwpins() -> f64 {
    round_trip_cycles()[0]
}

/// One LWPINS and one stepped instruction from a Linux process (through the
/// guest module, `--lwp precise`, one vCPU) against the bare guests', all
/// measured in this run.
pub fn linux_lwp() {
    let Some((kernel, initramfs)) = linux_guest() else {
        println!("linux_lwp: resources/linux/build.sh failed: skipped");
        return;
    };
    let bare_lwpins = bare_lwpins();
    let bare_step = stepping(false).0;
    let args = lwpvmm_linux(&kernel, &initramfs, 1, &["--lwp", "precise"]);
    let out = Command::new(&args[0])
        .args(&args[1..])
        .output()
        .expect("run lwpvmm");
    let console = String::from_utf8_lossy(&out.stdout);
    let lwpins = cycles_after(&console, "lwpins from a Linux process: ");
    let step = cycles_after(&console, "step from a Linux process: ");
    println!("guest TSC cycles: bare LWPINS {bare_lwpins:.0}, bare step {bare_step:.0}");
    let ratio = |linux: Option<f64>, bare: f64| {
        linux.map_or("- (no timing on the Linux console)".into(), |l| {
            format!("{:.2}  ({l:.0} cycles)", l / bare)
        })
    };
    println!("linux lwpins/bare = {}", ratio(lwpins, bare_lwpins));
    println!("linux step/bare step = {}", ratio(step, bare_step));
}
