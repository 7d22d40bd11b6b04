//! `cargo bench --bench vmm -- linux_boot`: the Linux guest's boot to
//! userspace, to the self-test's last line and to the end, against the kernel
//! before the tuning and against QEMU's pc machine when installed. Shared
//! helpers are the bench root's (vmm.rs).

use super::*;

/// The Linux guest as it was before issue 32's work: the same sources and
/// programs, its kernel configured by resources/linux/before.config (a
/// copy of resources/linux with that fragment, built into its own
/// directory; minutes the first time, cached after).
fn linux_guest_before() -> Option<(String, String)> {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let sources = tmp.join("linux-before-src");
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("resources/linux");
    let _ = std::fs::remove_dir_all(&sources);
    let copied = Command::new("cp")
        .arg("-r")
        .arg(&here)
        .arg(&sources)
        .status()
        .is_ok_and(|s| s.success())
        && std::fs::copy(here.join("before.config"), sources.join("lwpvmm.config")).is_ok();
    if !copied {
        return None;
    }
    build_linux(&sources.join("build.sh"), &[], &tmp.join("linux-before"))
}

/// lwpvmm's default command line for its Linux guest before issue 32's
/// work, for the linux_boot bench's "before". Keep it as it is.
const BEFORE_CMDLINE: &str = "console=ttyS0 reboot=k panic=-1 rdinit=/init nopti nokaslr \
     clearcpuid=141,145,150,151,154,288,291,296,297,298,308,534,580 \
     no_timer_check nompscan rodata=off";

pub fn linux_boot() {
    let Some((kernel, initramfs)) = linux_guest() else {
        println!("Linux boot: resources/linux/build.sh failed: skipped");
        return;
    };
    let lwpvmm_run = lwpvmm_linux(&kernel, &initramfs, 1, &[]);
    // The kernel prints "reboot: Power down" as its last line.
    // The first line, userspace, the self-test's end, the kernel's last
    // line (console_times stops at the last marker).
    let markers: [fn(&str) -> bool; 4] = [
        |_| true,
        |l| l.contains("Run /init"),
        |l| l.starts_with("lwp-linux-selftest: ") && l.contains(" passed, "),
        |l| l.contains("reboot: "),
    ];
    println!("Linux guest, seconds from start to userspace / self-test done / kernel's last line:");
    let (l, console) = console_times(&lwpvmm_run, &markers);
    let show = |t: &[Option<f64>]| {
        t.iter()
            .map(|t| t.map_or("-".into(), |t| format!("{t:.2}")))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    println!("  lwpvmm  {}", show(&l[1..]));
    match l[0] {
        Some(first) => println!("first console line = {first:.2} s"),
        None => println!("first console line: none"),
    }
    // The same run of the kernel and command line as they were before
    // issue 32's work.
    match linux_guest_before() {
        Some((k, i)) => {
            let before = lwpvmm_linux(&k, &i, 1, &["--cmdline", BEFORE_CMDLINE]);
            let (b, _) = console_times(&before, &markers);
            println!("  before  {}", show(&b[1..]));
            let ratio = |now: Option<f64>, before: Option<f64>| match (now, before) {
                (Some(n), Some(b)) if b > 0.0 => format!("{:.2}", n / b),
                _ => "-".into(),
            };
            println!(
                "linux boot to userspace now / before = {}",
                ratio(l[1], b[1])
            );
            println!("linux selftest now / before = {}", ratio(l[2], b[2]));
        }
        None => println!("linux now / before: the before kernel did not build"),
    }
    let linux_lwpins = cycles_after(&console, "lwpins from a Linux process: ");
    match (linux_lwpins, BARE_LWPINS.get()) {
        (Some(linux), Some(bare)) => println!(
            "one LWPINS: Linux process {linux:.0} guest TSC cycles, bare guest {bare:.0}: ratio {:.2}",
            linux / bare
        ),
        (Some(linux), None) => println!(
            "one LWPINS from a Linux process: {linux:.0} guest TSC cycles (run round_trips too for the ratio)"
        ),
        (None, _) => println!("no LWPINS timing on the Linux console"),
    }
    if !has_qemu() {
        println!("  qemu    not installed (apt-get install qemu-system-x86): no comparison");
        return;
    }
    // QEMU's KVM stops at the first CPL0 FWAIT that kvm_pvm's emulator
    // fails on (lwpvmm skips it), so only the boot compares; on kvm_pvm it
    // already stops at the kernel's boot-time INT3 self-test (lwpvmm
    // delivers that INT3), so QEMU's column is empty there.
    let ours = boot_of(l[1], &console);
    let qemu = to_userspace(&qemu_pc_linux(&kernel, &initramfs, 1));
    println!("Linux boot to userspace, seconds from start (the kernel's own clock):");
    println!("  lwpvmm        {}", show_boot(ours));
    println!("  qemu -M pc    {}", show_boot(qemu));
    if let (Some(l), Some(q)) = (ours, qemu) {
        println!(
            "ratios lwpvmm/qemu: from start = {:.2}, kernel's clock = {:.2}",
            l.wall / q.wall,
            l.kernel / q.kernel
        );
    }
}
