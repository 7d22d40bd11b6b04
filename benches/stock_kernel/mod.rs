//! `cargo bench --bench vmm -- stock_kernel`: Debian's stock kernel and its own
//! kind of image: the bzImage, its payload decompressed by lwpvmm, against the
//! same kernel's ELF to `Run /init`; and whether a KVM guest-debug hardware
//! breakpoint fires in CPL0 code the host's emulator runs
//! (`stock_kernel_breakpoint`). Shared helpers are the bench root's (vmm.rs).

use super::*;

/// Issue 31's lines: the Linux guest's bzImage, its payload decompressed
/// by lwpvmm, against the same kernel's ELF, to the kernel's `Run /init`
/// (wall time from the start, the median of three runs each, alternating).
pub fn stock_kernel() {
    let Some((kernel, initramfs)) = linux_guest() else {
        println!("stock_kernel: resources/linux/build.sh failed: skipped");
        return;
    };
    let vmlinuz = Path::new(&kernel).with_file_name("vmlinuz");
    let vmlinuz = vmlinuz.to_str().expect("UTF-8 path");
    let markers: [fn(&str) -> bool; 1] = [|l| l.contains("Run /init")];
    let (mut elf, mut bz) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        elf.extend(console_times(&lwpvmm_linux(&kernel, &initramfs, 1, &[]), &markers).0[0]);
        bz.extend(console_times(&lwpvmm_linux(vmlinuz, &initramfs, 1, &[]), &markers).0[0]);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    let ours = median(&mut elf);
    match (ours, median(&mut bz)) {
        (Some(e), Some(b)) => {
            println!("  to Run /init: ELF {e:.2} s, bzImage {b:.2} s");
            println!("bzImage host-decompressed / ELF boot = {:.2}", b / e);
        }
        _ => println!("bzImage host-decompressed / ELF boot: a boot did not reach /init"),
    }
    // What completing the SYSCALL quirk's system calls in lwpvmm costs
    // against patch 0001 doing it in the kernel: our kernel's self-test
    // (one vCPU) either way, to its summary line.
    // The self-test's own summary, not a program's indented one.
    let summary: [fn(&str) -> bool; 1] =
        [|l| l.starts_with("lwp-linux-selftest: ") && l.contains(" passed, ")];
    let selftest = |fixup: &str| {
        console_times(
            &lwpvmm_linux(&kernel, &initramfs, 1, &["--syscall-fixup", fixup]),
            &summary,
        )
        .0[0]
    };
    match (selftest("on"), selftest("off")) {
        (Some(on), Some(off)) => {
            println!(
                "  our kernel's self-test: SYSCALLs completed by lwpvmm {on:.1} s, by patch 0001 {off:.1} s"
            );
            println!("syscall fixup: lwpvmm / patch 0001 = {:.2}", on / off);
        }
        _ => println!("syscall fixup: lwpvmm / patch 0001: a self-test did not finish"),
    }
    // Debian's kernel (resources/linux/stock.sh), one vCPU, 256 MiB, the
    // default command line lwpvmm gives a kernel that is not ours, through
    // the self-test (lwpvmm completes its processes' SYSCALLs).
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("resources/linux/stock.sh");
    let fetched = Command::new(&script)
        .arg(tmp.join("stock"))
        .arg(Path::new(&kernel).parent().expect("the guest's directory"))
        .status()
        .is_ok_and(|s| s.success());
    if !fetched {
        println!("stock kernel to /init: resources/linux/stock.sh failed: not measured");
        return;
    }
    let dir = tmp.join("stock");
    let args: Vec<String> = [
        env!("CARGO_BIN_EXE_lwpvmm"),
        "run",
        "--kernel",
        dir.join("vmlinuz").to_str().expect("UTF-8 path"),
        "--initramfs",
        dir.join("initramfs.cpio").to_str().expect("UTF-8 path"),
        "--memory",
        "256",
    ]
    .map(String::from)
    .to_vec();
    let markers: [fn(&str) -> bool; 2] = [markers[0], summary[0]];
    let (t, console) = console_times_within(&args, &markers, Duration::from_secs(1800));
    match (t[0], ours) {
        (Some(stock), Some(ours)) => {
            println!("stock kernel to /init = {stock:.0} s");
            println!("stock / ours to /init = {:.1}", stock / ours);
        }
        _ => {
            let last = console.lines().last().unwrap_or("");
            println!("stock kernel to /init: not reached in 1800 s; its last line: {last}");
        }
    }
    let result = console
        .lines()
        .find(|l| l.starts_with("lwp-linux-selftest:") && l.contains("passed,"));
    match (result, t[1]) {
        (Some(line), Some(at)) => println!("stock kernel self-test: {line} at {at:.0} s"),
        _ => println!("stock kernel self-test: no summary line"),
    }
}

/// Issue 31's item 6 asks first whether a KVM guest-debug hardware
/// breakpoint fires in CPL0 code that the host's emulator runs.
pub fn stock_kernel_breakpoint() {
    let hit = |at: bool| if at { "hit" } else { "missed" };
    match hw_breakpoints() {
        Some((cpl0, cpl3)) => println!(
            "guest-debug hardware breakpoint: CPL0 (emulated here) {}, CPL3 {}",
            hit(cpl0),
            hit(cpl3)
        ),
        None => println!("guest-debug hardware breakpoint: the probe did not run"),
    }
}

/// Whether a KVM guest-debug hardware breakpoint (DR0, execute) stops the
/// `cplprobe` guest at its first CPL0 instruction (`kernel_hook`) and at
/// its first CPL3 one (`main`): each run on a bare VM as tests/cpl.rs
/// drives it, to the guest's end.
fn hw_breakpoints() -> Option<(bool, bool)> {
    use kvm_ioctls::{Kvm, VcpuExit};
    use lwpvmm::vmm::boot;
    let image = lwpvmm::guests::get("cplprobe")?;
    let symbols = lwpvmm::profile::objects::Symbols::from_elf(image).ok()?;
    let run = |at: u64| -> Option<bool> {
        let kvm = Kvm::new().ok()?;
        let vm = kvm.create_vm().ok()?;
        let mem = boot::create_memory(64).ok()?;
        lwpvmm::vmm::machine::register_memory(&vm, &mem).ok()?;
        vm.set_tss_address(0xfffb_d000).ok()?;
        vm.create_irq_chip().ok()?;
        let mut vcpu = vm.create_vcpu(0).ok()?;
        let cpuid = kvm
            .get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
            .ok()?;
        vcpu.set_cpuid2(&cpuid).ok()?;
        let kernel = boot::load_kernel(&mem, image).ok()?;
        boot::write_boot_info(&mem, &kernel, "", None, 1, &[]).ok()?;
        boot::write_gdt(&mem).ok()?;
        let (regs, sregs) = boot::initial_state(kernel.entry, vcpu.get_sregs().ok()?);
        vcpu.set_sregs(&sregs).ok()?;
        vcpu.set_regs(&regs).ok()?;
        let mut debug = kvm_bindings::kvm_guest_debug {
            control: kvm_bindings::KVM_GUESTDBG_ENABLE | kvm_bindings::KVM_GUESTDBG_USE_HW_BP,
            ..Default::default()
        };
        debug.arch.debugreg[0] = at;
        // DR7: L0, an execute breakpoint of one byte.
        debug.arch.debugreg[7] = 0x401;
        vcpu.set_guest_debug(&debug).ok()?;
        let mut hit = false;
        loop {
            match vcpu.run().ok()? {
                VcpuExit::Debug(d) => {
                    hit |= d.pc == at;
                    vcpu.set_guest_debug(&kvm_bindings::kvm_guest_debug::default())
                        .ok()?;
                }
                VcpuExit::IoOut(0xf4, _) => return Some(hit),
                VcpuExit::IoOut(..) | VcpuExit::IoIn(..) => {}
                _ => return None,
            }
        }
    };
    Some((
        run(symbols.address_of("kernel_hook")?)?,
        run(symbols.address_of("main")?)?,
    ))
}
