//! `cargo bench --bench vmm -- smp`: LWPINS records per second of one process
//! on one vCPU against two processes on two vCPUs (the Linux guest's lwp-rate),
//! and the boot on two vCPUs against one. Shared helpers are the bench root's
//! (vmm.rs).

use super::*;

/// Records per second of the Linux guest's `lwp-rate` with `procs`
/// processes on `vcpus` vCPUs, from its own line.
fn lwp_rate(kernel: &str, initramfs: &str, vcpus: u8, procs: u8) -> Option<f64> {
    let cmdline = format!("{} lwprate={procs}", lwpvmm::vmm::boot::LINUX_CMDLINE);
    let args = lwpvmm_linux(kernel, initramfs, vcpus, &["--cmdline", &cmdline]);
    let out = Command::new(&args[0]).args(&args[1..]).output().ok()?;
    let console = String::from_utf8_lossy(&out.stdout);
    let line = console.lines().find_map(|l| l.strip_prefix("lwp-rate: "))?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "records")?;
    let records: f64 = words.get(at - 1)?.parse().ok()?;
    let us: f64 = words.get(at + 2)?.parse().ok()?;
    (us > 0.0).then(|| records / (us / 1e6))
}

pub fn smp() {
    let Some((kernel, initramfs)) = linux_guest() else {
        println!("smp: resources/linux/build.sh failed: skipped");
        return;
    };
    // The control: two single-vCPU VMs at once share nothing in lwpvmm, so
    // their sum is what this host's two cores give two recording vCPUs.
    let apart = std::thread::scope(|s| {
        let runs: Vec<_> = (0..2)
            .map(|_| s.spawn(|| lwp_rate(&kernel, &initramfs, 1, 1)))
            .collect();
        runs.into_iter()
            .map(|r| r.join().ok().flatten())
            .sum::<Option<f64>>()
    });
    match (
        lwp_rate(&kernel, &initramfs, 1, 1),
        lwp_rate(&kernel, &initramfs, 2, 2),
        apart,
    ) {
        (Some(one), Some(two), Some(apart)) => {
            println!(
                "smp records/s: 1p1v {one:.0}, 2p2v {two:.0}, ratio {:.2}",
                two / one
            );
            println!(
                "  control: two 1-vCPU VMs at once {apart:.0} records/s together, ratio {:.2} \
                 (what the host's cores allow without anything shared in lwpvmm)",
                apart / one
            );
        }
        _ => println!("smp records/s: no lwp-rate line on the console"),
    }
    let one = to_userspace(&lwpvmm_linux(&kernel, &initramfs, 1, &[]));
    let two = to_userspace(&lwpvmm_linux(&kernel, &initramfs, 2, &[]));
    let qemu = has_qemu()
        .then(|| to_userspace(&qemu_pc_linux(&kernel, &initramfs, 2)))
        .flatten();
    println!("Linux boot to userspace, seconds from start (the kernel's own clock):");
    println!("  lwpvmm 1 vCPU       {}", show_boot(one));
    println!("  lwpvmm 2 vCPUs      {}", show_boot(two));
    if has_qemu() {
        println!("  qemu -M pc -smp 2   {}", show_boot(qemu));
    } else {
        println!("  qemu not installed (apt-get install qemu-system-x86): no comparison");
    }
    let ratio = |a: Option<Boot>, b: Option<Boot>| match (a, b) {
        (Some(a), Some(b)) => format!("{:.2}", a.wall / b.wall),
        _ => "-".into(),
    };
    println!(
        "linux boot vcpus2/vcpus1 = {}, lwpvmm/qemu(-smp 2) = {}",
        ratio(two, one),
        ratio(two, qemu)
    );
    if let (Some(two), Some(q)) = (two, qemu) {
        println!(
            "  (QEMU's time includes SeaBIOS; by the kernel's own clock lwpvmm/qemu = {:.2})",
            two.kernel / q.kernel
        );
    }
}
