//! VMM benchmarks on real KVM, reported as ratios measured in one run:
//! - the paravirtual LWPINS round trip from CPL3 against a CPL3 port-I/O
//!   exit and against a CPL3 UD2 taken through the same #UD doorbell;
//! - an LWP_CFG RDMSR exit against a CPL0 port-I/O exit;
//! - process start to exit under lwpvmm of a guest that exits at once
//!   against the bare floor (this binary creating a VM and a vCPU and
//!   running one instruction), and of the minimal guest against QEMU's
//!   microvm when `qemu-system-x86_64` is installed: wall time by the
//!   monotonic clock, medians of interleaved runs;
//! - snapshot and restore time of a 256 MiB guest, and the snapshot's size;
//! - the sampler: CPL3 throughput lost per kick against the bare exit (a
//!   CPL3 port-I/O round trip) and where the rest goes; a sample with its
//!   call stack against one without;
//! - single-stepping cost per instruction with IRE, and with IRE and BRE;
//! - the Linux guest of resources/linux (built on first use): time to
//!   userspace, to the self-test's last line and to the process's end under
//!   lwpvmm, and boot to userspace against QEMU's pc machine, when
//!   installed, on the same kernel, initramfs and command line;
//! - LWP in a Linux process through the guest module under `--lwp precise`:
//!   one LWPINS against the bare round-trip guest's, and one stepped
//!   instruction against the bare stepping guest's;
//! - SMP: LWPINS records per second of one process on one vCPU against two
//!   processes on two vCPUs (the Linux guest's lwp-rate), and Linux boot to
//!   userspace on two vCPUs against one and against QEMU's pc machine with
//!   -smp 2.
//!
//! - Firecracker's API: the Linux guest to its first self-test line
//!   configured through the API against `lwpvmm run`, the vsock echo round
//!   trip, and 64 MiB over vsock against 64 MiB of TCP over a tap.
//!
//! - the host's native supervisor mode (benches/native): the native
//!   guest's CPL0 loop against its CPL3 loop and against the same loop
//!   emulated, and a port exit from each mode.
//!
//! - profile truth (benches/profile_truth): the shares of the Linux
//!   guest's hot functions and of the demo's against their work, and a
//!   pprof profile's CPU time against its span.
//!
//! `cargo bench --bench vmm [-- WORD...]` (not run by CI; the words pick
//! sections by name: round_trips, starts, snapshots, sampler, precise,
//! linux_boot, linux_lwp, smp, devices, stock_kernel, firecracker, native,
//! profile_truth). Cycle counts come from the
//! guest's RDTSC, so the ratios do not depend on the TSC frequency. QEMU
//! comes from `apt-get install qemu-system-x86`.

// A benchmark: a failed setup or expectation stops it with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod native;
mod profile_truth;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::median;
use lwpvmm::lwp::cpuid::LwpProfile;
use lwpvmm::vmm::devices::port_bus::{GuestEnd, SerialOut};
use lwpvmm::vmm::{self, HostConfig, Profiling, VmConfig, VmEnd};

/// Host settings that capture the console and otherwise keep the defaults.
fn captured(console: &Arc<Mutex<Vec<u8>>>, profiling: Profiling) -> HostConfig {
    HostConfig {
        serial: SerialOut::Capture(Arc::clone(console)),
        profiling,
        ..HostConfig::default()
    }
}

const ROUND_TRIP_ITERATIONS: u64 = 5000;
const STARTS: usize = 20;

/// Guest TSC cycles of one LWPINS in the bare round-trip guest, when the
/// round_trips section ran, for the Linux comparison.
static BARE_LWPINS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();

/// Guest TSC cycles per iteration of the round-trip guest's loops: CPL3
/// LWPINS, CPL3 OUT, CPL3 UD2, CPL0 RDMSR, CPL0 OUT.
fn round_trip_cycles() -> [f64; 5] {
    let console = Arc::new(Mutex::new(Vec::new()));
    let config = VmConfig {
        kernel: lwpvmm::guests::get("roundtrip").expect("guest").to_vec(),
        cmdline: format!("iterations={ROUND_TRIP_ITERATIONS}"),
        memory_mib: 64,
        host: captured(&console, Profiling::default()),
        ..VmConfig::default()
    };
    let outcome = vmm::run(&config).expect("round-trip guest");
    assert_eq!(outcome.end, VmEnd::Guest(GuestEnd::ExitPort(0)));
    let text = String::from_utf8_lossy(&console.lock().unwrap()).into_owned();
    let per_iter = |name: &str| -> f64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("bench {name} ")))
            .unwrap_or_else(|| panic!("no `{name}` result in:\n{text}"));
        let v: Vec<f64> = line
            .split(' ')
            .skip(2)
            .map(|x| x.parse().unwrap())
            .collect();
        v[1] / v[0]
    };
    ["lwpins", "out", "ud2", "rdmsr", "cpl0_out"].map(per_iter)
}

/// Guest TSC cycles of one LWPINS in the bare round-trip guest.
fn bare_lwpins() -> f64 {
    round_trip_cycles()[0]
}

fn round_trips() {
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

/// Milliseconds from spawning `args` to its exit, with `env` set; it must
/// exit with `status`.
fn wall_ms(args: &[&str], env: Option<(&str, &str)>, status: i32) -> f64 {
    let mut cmd = Command::new(args[0]);
    cmd.args(&args[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some((k, v)) = env {
        cmd.env(k, v);
    }
    let started = Instant::now();
    let done = cmd.status().expect("spawn");
    let ms = started.elapsed().as_secs_f64() * 1e3;
    assert_eq!(done.code(), Some(status), "{args:?}");
    ms
}

/// The bare floor of a VMM's start: this process (the bench binary, run
/// again with `BARE_VM` set) opens /dev/kvm, creates a VM with 64 MiB of
/// memory (as lwpvmm's run is given) and one vCPU, and runs a guest whose
/// first instruction is HLT, which exits to userspace at once. Nothing
/// else: no irqchip, no MSR filter, no CPUID table, no devices, no
/// threads. `Split` adds KVM's split irqchip (local APICs in the kernel,
/// no IOAPIC, PIC or PIT there) as lwpvmm's VM has it, `Irqchip` KVM's
/// in-kernel irqchip and PIT, as lwpvmm's VM had them; with either the
/// guest runs an OUT instead, since an in-kernel local APIC keeps a HLT to
/// itself. Their difference is KVM's own price for the in-kernel devices,
/// mostly SRCU grace periods when the VM is torn down.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Bare {
    Plain,
    Irqchip,
    Split,
}

impl Bare {
    /// The `BARE_VM` value that selects it.
    fn env(self) -> &'static str {
        match self {
            Bare::Plain => "1",
            Bare::Irqchip => "irqchip",
            Bare::Split => "split",
        }
    }
}

fn bare_vm(kind: Bare) {
    use kvm_ioctls::{Kvm, VcpuExit};
    let kvm = Kvm::new().expect("/dev/kvm");
    let vm = kvm.create_vm().expect("KVM_CREATE_VM");
    let mem = lwpvmm::guard::GuestMemory::from_ranges(&[(vm_memory::GuestAddress(0), 64 << 20)])
        .expect("64 MiB");
    use vm_memory::{Bytes, GuestMemoryBackend};
    let code: &[u8] = if kind == Bare::Plain {
        &[0xf4]
    } else {
        &[0xe6, 0x80]
    };
    mem.write_slice(code, vm_memory::GuestAddress(0x1000))
        .expect("the guest's one instruction");
    let host = mem
        .get_host_address(vm_memory::GuestAddress(0))
        .expect("host address");
    let region = kvm_bindings::kvm_userspace_memory_region {
        slot: 0,
        flags: 0,
        guest_phys_addr: 0,
        memory_size: 64 << 20,
        userspace_addr: host as u64,
    };
    // SAFETY: the region is `mem`'s own mapping, which outlives the VM in
    // this function.
    unsafe { vm.set_user_memory_region(region) }.expect("KVM_SET_USER_MEMORY_REGION");
    match kind {
        Bare::Plain => {}
        Bare::Irqchip => {
            vm.set_tss_address(0xfffb_d000).expect("KVM_SET_TSS_ADDR");
            vm.create_irq_chip().expect("KVM_CREATE_IRQCHIP");
            let pit = kvm_bindings::kvm_pit_config {
                flags: kvm_bindings::KVM_PIT_SPEAKER_DUMMY,
                ..Default::default()
            };
            vm.create_pit2(pit).expect("KVM_CREATE_PIT2");
        }
        Bare::Split => {
            let split = kvm_bindings::kvm_enable_cap {
                cap: kvm_bindings::KVM_CAP_SPLIT_IRQCHIP,
                args: [24, 0, 0, 0],
                ..Default::default()
            };
            vm.enable_cap(&split).expect("KVM_CAP_SPLIT_IRQCHIP");
        }
    }
    let mut vcpu = vm.create_vcpu(0).expect("KVM_CREATE_VCPU");
    let mut sregs = vcpu.get_sregs().expect("KVM_GET_SREGS");
    sregs.cs.base = 0;
    sregs.cs.selector = 0;
    vcpu.set_sregs(&sregs).expect("KVM_SET_SREGS");
    let regs = kvm_bindings::kvm_regs {
        rip: 0x1000,
        rflags: 2,
        ..Default::default()
    };
    vcpu.set_regs(&regs).expect("KVM_SET_REGS");
    match vcpu.run().expect("KVM_RUN") {
        VcpuExit::Hlt if kind == Bare::Plain => {}
        VcpuExit::IoOut(0x80, _) if kind != Bare::Plain => {}
        other => panic!("the bare guest exited with {other:?}"),
    }
}

/// QEMU with KVM on `machine`, 64 MiB, the console on stdio and no
/// display, followed by `extra`.
fn qemu(machine: &str, extra: &[&str]) -> Vec<String> {
    [
        "qemu-system-x86_64",
        "-M",
        machine,
        "-enable-kvm",
        "-cpu",
        "host,arch-capabilities=off",
        "-m",
        "64",
        "-nodefaults",
        "-no-user-config",
        "-serial",
        "stdio",
        "-display",
        "none",
    ]
    .iter()
    .chain(extra)
    .map(|a| a.to_string())
    .collect()
}

/// QEMU microvm followed by `extra`: the start-up comparison's machine.
fn qemu_microvm(extra: &[&str]) -> Vec<String> {
    qemu("microvm,x-option-roms=off,rtc=off", extra)
}

/// QEMU's pc machine (SeaBIOS) booting the Linux guest with `smp` CPUs and
/// lwpvmm's default command line. Not microvm: its hardware-reduced ACPI
/// has no PM timer, and on this host the kernel's PIT calibration fails,
/// so without the pc machine's HPET the kernel finds no TSC reference and
/// hangs.
fn qemu_pc_linux(kernel: &str, initramfs: &str, smp: u8) -> Vec<String> {
    let smp = smp.to_string();
    qemu(
        "pc",
        &[
            "-smp",
            &smp,
            "-no-reboot",
            "-kernel",
            kernel,
            "-initrd",
            initramfs,
            "-append",
            lwpvmm::vmm::boot::LINUX_CMDLINE,
        ],
    )
}

/// Boot to userspace (the kernel's `Run /init` line): seconds from the
/// process's start, and the kernel's own printk timestamp of that line
/// (which leaves out the VMM's and the firmware's start, and the kernel's
/// first steps before its clock runs).
#[derive(Clone, Copy)]
struct Boot {
    wall: f64,
    kernel: f64,
}

fn to_userspace(args: &[String]) -> Option<Boot> {
    let (seen, console) = console_times(args, &[|l| l.contains("Run /init")]);
    boot_of(seen[0], &console)
}

/// The boot a console shows, `wall` being when its `Run /init` line came.
fn boot_of(wall: Option<f64>, console: &str) -> Option<Boot> {
    let line = console.lines().find(|l| l.contains("Run /init"))?;
    let stamp = line.split_once('[')?.1.split_once(']')?.0.trim();
    Some(Boot {
        wall: wall?,
        kernel: stamp.parse().ok()?,
    })
}

fn has_qemu() -> bool {
    Command::new("qemu-system-x86_64")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A 64-bit ELF kernel whose first instruction exits through the exit port
/// (lwpvmm's 64-bit entry: long mode, identity-mapped), the guest of the
/// bare harness's kind: the start-up ratio then compares VMMs, not guests.
fn exit_at_once_elf() -> Vec<u8> {
    const BASE: u64 = 0x10_0000;
    const EHDR: u64 = 64;
    const PHDR: u64 = 56;
    // mov $0, %al; out %al, $0xf4; hlt
    let code = [0xb0, 0x00, 0xe6, 0xf4, 0xf4];
    let entry = BASE + EHDR + PHDR;
    let size = EHDR + PHDR + code.len() as u64;
    let mut elf = vec![0x7f, b'E', b'L', b'F', 2, 1, 1, 0];
    elf.resize(16, 0);
    let half = |v: u16| v.to_le_bytes().to_vec();
    let word = |v: u32| v.to_le_bytes().to_vec();
    let quad = |v: u64| v.to_le_bytes().to_vec();
    for field in [
        half(2),    // ET_EXEC
        half(0x3e), // x86-64
        word(1),
        quad(entry),
        quad(EHDR), // program headers
        quad(0),    // no section headers
        word(0),
        half(EHDR as u16),
        half(PHDR as u16),
        half(1),
        half(0),
        half(0),
        half(0),
    ] {
        elf.extend(field);
    }
    for field in [
        word(1), // PT_LOAD
        word(5), // R+X
        quad(0),
        quad(BASE),
        quad(BASE),
        quad(size),
        quad(size),
        quad(0x1000),
    ] {
        elf.extend(field);
    }
    elf.extend(code);
    elf
}

/// Writes the kernel image `bytes` to this run's `name`.elf in the
/// temporary directory, for lwpvmm's `--kernel`.
fn guest_file(name: &str, bytes: &[u8]) -> PathBuf {
    let path = std::env::temp_dir().join(format!("lwpvmm-bench-{}-{name}.elf", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    path
}

/// The embedded guest `name`, written by [`guest_file`].
fn embedded_guest(name: &str) -> PathBuf {
    guest_file(name, lwpvmm::guests::get(name).expect("an embedded guest"))
}

fn starts() {
    let minimal = embedded_guest("minimal");
    let at_once = guest_file("exit", &exit_at_once_elf());
    let lwpvmm_bin = env!("CARGO_BIN_EXE_lwpvmm");
    let run = |kernel: &PathBuf| -> Vec<String> {
        [
            lwpvmm_bin,
            "run",
            "--kernel",
            kernel.to_str().unwrap(),
            "--memory",
            "64",
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let (lwpvmm_minimal, lwpvmm_at_once) = (run(&minimal), run(&at_once));
    let qemu_args = qemu_microvm(&[
        "-device",
        "isa-debug-exit,iobase=0xf4,iosize=0x04",
        "-kernel",
        minimal.to_str().unwrap(),
    ]);
    let me = std::env::current_exe().expect("the bench binary");
    let bare: Vec<&str> = vec![me.to_str().expect("UTF-8 path")];
    fn args(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    // Interleaved, so that a slow spell of the host weighs on all alike.
    let (mut at_once_ms, mut minimal_ms, mut qemu_ms) = (Vec::new(), Vec::new(), Vec::new());
    let kinds = [Bare::Plain, Bare::Irqchip, Bare::Split];
    let mut bare_ms: [Vec<f64>; 3] = Default::default();
    let qemu = has_qemu();
    for _ in 0..STARTS {
        at_once_ms.push(wall_ms(&args(&lwpvmm_at_once), None, 1));
        minimal_ms.push(wall_ms(&args(&lwpvmm_minimal), None, 1));
        for (kind, times) in kinds.iter().zip(bare_ms.iter_mut()) {
            times.push(wall_ms(&bare, Some(("BARE_VM", kind.env())), 0));
        }
        if qemu {
            qemu_ms.push(wall_ms(&args(&qemu_args), None, 1));
        }
    }
    let (lw, lm) = (median(at_once_ms), median(minimal_ms));
    let [bw, iw, sw] = bare_ms.map(median);
    println!(
        "process start to exit ({STARTS} runs each, interleaved, median wall by the monotonic clock):"
    );
    println!("  lwpvmm, a guest that exits at once {lw:>8.2} ms");
    println!("  lwpvmm, the minimal guest          {lm:>8.2} ms  (it prints a line first)");
    println!("  bare harness: VM, vCPU, one HLT    {bw:>8.2} ms");
    println!("  the same + a split irqchip         {sw:>8.2} ms  (lwpvmm's irqchip)");
    println!("  the same + KVM's irqchip and PIT   {iw:>8.2} ms  (what lwpvmm no longer has)");
    println!("start lwpvmm/bare harness = {:.2}", lw / bw);
    println!(
        "start lwpvmm/bare harness with a split irqchip = {:.2}",
        lw / sw
    );
    println!("start lwpvmm minimal guest/bare harness = {:.2}", lm / bw);
    if qemu {
        let qw = median(qemu_ms);
        println!("  qemu -M microvm, the minimal guest {qw:>8.2} ms");
        println!("start lwpvmm/qemu = {:.2}", lm / qw);
    } else {
        println!("start lwpvmm/qemu = not measured (apt-get install qemu-system-x86)");
    }
    let _ = std::fs::remove_file(minimal);
    let _ = std::fs::remove_file(at_once);
}

/// Milliseconds in an info log line such as "... in 12.3 ms ...".
fn logged_ms(stderr: &str, marker: &str) -> f64 {
    let line = stderr
        .lines()
        .find(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("no `{marker}` line in:\n{stderr}"));
    let after = &line[line.find(" in ").expect("timing") + 4..];
    after.split(' ').next().unwrap().parse().unwrap()
}

/// A snapshot of the replay guest with `mib` MiB of RAM, taken at its
/// snapshot point after it wrote `fill` MiB; returns the directory and
/// lwpvmm's log.
fn snapshot_of(name: &str, mib: u32, fill: u32, touch: u32) -> (PathBuf, String) {
    let dir = std::env::temp_dir().join(format!("lwpvmm-bench-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let elf = embedded_guest("replay");
    let run = Command::new(env!("CARGO_BIN_EXE_lwpvmm"))
        .env("RUST_LOG", "info")
        .args(["run", "--kernel", elf.to_str().unwrap()])
        .args(["--memory", &mib.to_string()])
        .args([
            "--cmdline",
            &format!("iterations=20000 snap=10000 fill={fill} touch={touch}"),
        ])
        .args([
            "--snapshot-dir",
            dir.to_str().unwrap(),
            "--snapshot-on-port",
        ])
        .output()
        .expect("run");
    let _ = std::fs::remove_file(elf);
    (dir, String::from_utf8_lossy(&run.stderr).into_owned())
}

/// MiB of pages a diff snapshot writes after the replay guest (256 MiB)
/// wrote 1 MiB since its full snapshot (with its ring and stack, and the
/// records lwpvmm stored).
fn diff_written() -> (f64, f64) {
    let dir = std::env::temp_dir().join(format!("lwpvmm-bench-{}-diff", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let elf = embedded_guest("replay");
    let run = Command::new(env!("CARGO_BIN_EXE_lwpvmm"))
        .env("RUST_LOG", "info")
        .args(["run", "--kernel", elf.to_str().unwrap(), "--memory", "256"])
        .args([
            "--cmdline",
            "iterations=20000 snap=10000 snap2=10001 touch=1",
        ])
        .args(["--snapshot-dir", dir.to_str().unwrap()])
        .args(["--snapshot-diff", "--snapshot-on-port"])
        .output()
        .expect("run");
    let log = String::from_utf8_lossy(&run.stderr);
    let bytes: f64 = log
        .lines()
        .filter(|l| l.contains("diff snapshot written"))
        .find_map(|l| {
            let at = l.find(" bytes of memory")?;
            l[..at].rsplit(' ').next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no diff snapshot in:\n{log}"));
    let paused = logged_ms(&log, "diff snapshot written");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(elf);
    (bytes / f64::from(1 << 20), paused)
}

/// Milliseconds until one restore of `dir` runs its vCPUs, and its console.
fn restore_once(dir: &Path, extra: &[&str]) -> (f64, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_lwpvmm"))
        .env("RUST_LOG", "info")
        .args(["restore", dir.to_str().unwrap()])
        .args(extra)
        .output()
        .expect("restore");
    let ms = logged_ms(&String::from_utf8_lossy(&out.stderr), "restored");
    (ms, String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Milliseconds until a restore of `dir` runs its vCPUs (the median of
/// five), and the last run's console.
fn restore_ms(dir: &Path, extra: &[&str]) -> (f64, String) {
    let mut console = String::new();
    let times = (0..5)
        .map(|_| {
            let (ms, out) = restore_once(dir, extra);
            console = out;
            ms
        })
        .collect();
    (median(times), console)
}

fn snapshots() {
    let (small, _) = snapshot_of("64m", 64, 0, 0);
    let (big, _) = snapshot_of("1g", 1024, 0, 0);
    let (mid, log) = snapshot_of("256m", 256, 0, 0);
    // Restores of a few milliseconds: the two sizes alternate, so a burst
    // of a noisy neighbour lands on both halves of a round.
    let rounds: Vec<(f64, f64)> = (0..9)
        .map(|_| (restore_once(&small, &[]).0, restore_once(&big, &[]).0))
        .collect();
    let size_ratio = median(rounds.iter().map(|(s, b)| b / s).collect());
    let (r64, r1g) = {
        let (s, b): (Vec<f64>, Vec<f64>) = rounds.into_iter().unzip();
        (median(s), median(b))
    };
    let (r256, _) = restore_ms(&mid, &[]);
    let (verified, _) = restore_ms(&mid, &["--verify"]);
    let taken = logged_ms(&log, "snapshot written");
    println!(
        "snapshots of the replay guest (restore: until the vCPUs run; 64 MiB and 1 GiB: medians of 9 alternating rounds, the others of 5):"
    );
    println!(
        "  restore 64 MiB {r64:.1} ms, 1 GiB {r1g:.1} ms, 256 MiB {r256:.1} ms, 256 MiB --verify {verified:.1} ms"
    );
    println!("restore 1GiB/64MiB = {size_ratio:.2}");
    println!(
        "restore 256MiB / restore --verify 256MiB = {:.3}",
        r256 / verified
    );

    let (touched, _) = snapshot_of("touch", 256, 0, 64);
    let (restored, console) = restore_ms(&touched, &[]);
    let cycles: f64 = console
        .lines()
        .find_map(|l| l.strip_prefix("replay: touched 64 MiB in "))
        .and_then(|l| l.split(' ').next())
        .and_then(|c| c.parse().ok())
        .expect("the touch line");
    let touch_ms = cycles / tsc_hz() * 1e3;
    println!(
        "  a 256 MiB guest restored, then writing a page of each 4 KiB of 64 MiB: {restored:.1} + {touch_ms:.1} ms"
    );
    println!(
        "restore + touch 64MiB working set = {:.1} ms",
        restored + touch_ms
    );

    let (filled, _) = snapshot_of("fill", 1024, 16, 0);
    use std::os::unix::fs::MetadataExt;
    let blocks = std::fs::metadata(filled.join(lwpvmm::vmm::snapshot::MEMORY_FILE))
        .map_or(0, |m| m.blocks() * 512);
    println!(
        "  a 1 GiB guest that wrote 16 MiB: memory file {} MiB long, {:.1} MiB allocated",
        1024,
        blocks as f64 / f64::from(1 << 20)
    );
    println!(
        "snapshot file blocks / touched = {:.2}",
        blocks as f64 / f64::from(16 << 20)
    );
    let (diff, diff_pause) = diff_written();
    println!(
        "  a 256 MiB guest: a full snapshot, then 1 MiB written, then a diff snapshot ({diff:.2} MiB of pages)"
    );
    println!("diff after 1MiB touched: written = {diff:.2} MiB");
    println!(
        "  256 MiB guest: the VM stays paused while the files are written: {taken:.1} ms for a full snapshot, {diff_pause:.1} ms for the diff"
    );
    println!("pause time = {diff_pause:.1} ms");
    for d in [small, big, mid, touched, filled] {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// One run of the throughput guest.
struct Throughput {
    /// Guest TSC cycles its loop took.
    cycles: f64,
    /// Sampling kicks the vCPU handled.
    kicks: u64,
    /// Host nanoseconds spent on them after KVM_RUN returned.
    sampler_ns: u64,
}

/// Runs the throughput guest: CNH armed with `interval` (or no LWP at
/// all), kicked at `sample_hz`, traced with or without stacks when `trace`.
fn throughput(sample_hz: u32, interval: Option<u32>, trace: Option<bool>) -> Throughput {
    throughput_of(sample_hz, interval, trace, false)
}

/// [`throughput`], with whole-guest samples (`--profile-kernel`) when
/// `kernel`.
fn throughput_of(
    sample_hz: u32,
    interval: Option<u32>,
    trace: Option<bool>,
    kernel: bool,
) -> Throughput {
    let console = Arc::new(Mutex::new(Vec::new()));
    let file = std::env::temp_dir().join(format!("lwpvmm-bench-{}.trace", std::process::id()));
    let cmdline = match interval {
        Some(i) => format!("lwp=1 interval={i}"),
        None => "lwp=0".to_owned(),
    };
    let config = VmConfig {
        kernel: lwpvmm::guests::get("throughput").expect("guest").to_vec(),
        cmdline,
        memory_mib: 64,
        host: captured(
            &console,
            Profiling {
                sample_hz,
                kernel,
                trace: trace.map(|_| file.clone()),
                stacks: trace.unwrap_or(false),
                ..Profiling::default()
            },
        ),
        ..VmConfig::default()
    };
    let outcome = vmm::run(&config).expect("throughput guest");
    let _ = std::fs::remove_file(&file);
    let text = String::from_utf8_lossy(&console.lock().unwrap()).into_owned();
    Throughput {
        cycles: text
            .lines()
            .find_map(|l| l.strip_prefix("throughput "))
            .expect("result")
            .trim()
            .parse()
            .unwrap(),
        kicks: outcome.metrics.total.sampler_kicks,
        sampler_ns: outcome.metrics.total.sampler_ns,
    }
}

/// The guest TSC rate KVM gives a new vCPU, in Hz.
fn tsc_hz() -> f64 {
    let kvm = kvm_ioctls::Kvm::new().expect("/dev/kvm");
    let vm = kvm.create_vm().expect("a VM");
    let vcpu = vm.create_vcpu(0).expect("a vCPU");
    f64::from(vcpu.get_tsc_khz().expect("KVM_GET_TSC_KHZ")) * 1000.0
}

/// Guest TSC cycles per stepped instruction, and host nanoseconds lwpvmm
/// spent per step between KVM_RUN's return and the next entry.
fn stepping(bre: bool) -> (f64, f64) {
    let console = Arc::new(Mutex::new(Vec::new()));
    let config = VmConfig {
        kernel: lwpvmm::guests::get("stepping").expect("guest").to_vec(),
        cmdline: format!("bre={} iterations=4000", u8::from(bre)),
        memory_mib: 64,
        profile: LwpProfile::Precise,
        host: captured(&console, Profiling::default()),
        ..VmConfig::default()
    };
    let outcome = vmm::run(&config).expect("stepping guest");
    let text = String::from_utf8_lossy(&console.lock().unwrap()).into_owned();
    let v: Vec<f64> = text
        .lines()
        .find_map(|l| l.strip_prefix("stepping "))
        .expect("result")
        .split(' ')
        .map(|x| x.trim().parse().unwrap())
        .collect();
    let t = &outcome.metrics.total;
    (v[0] / v[1], t.step_ns as f64 / t.steps.max(1) as f64)
}

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

fn precise() {
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

/// The sampler's cost against its floor, measured in one run: the bare exit
/// (a CPL3 port-I/O round trip, the cheapest exit to lwpvmm) is what a kick
/// cannot go below; the rest of a kick is shown piece by piece.
fn sampler() {
    const DEFAULT_INTERVAL: u32 = 0x1ff_ffff;
    const SMALL_INTERVAL: u32 = 0xffff;
    let hz = tsc_hz();
    let bare_exit = round_trip_cycles()[1];
    // The fastest of three runs each: host noise only ever slows a run.
    let best = |hz: u32, interval: Option<u32>, trace: Option<bool>| {
        (0..3)
            .map(|_| throughput(hz, interval, trace))
            .min_by(|a, b| a.cycles.total_cmp(&b.cycles))
            .expect("three runs")
    };
    let off = best(0, Some(DEFAULT_INTERVAL), None);
    let unarmed = throughput(1000, None, None);
    let k1 = best(1000, Some(DEFAULT_INTERVAL), None);
    let per_kick = (k1.cycles - off.cycles) / k1.kicks.max(1) as f64;
    let in_lwpvmm = k1.sampler_ns as f64 * hz / 1e9 / k1.kicks.max(1) as f64;
    println!(
        "sampler at 1 kHz (guest TSC cycles; TSC {:.0} MHz): {} kicks; an unarmed guest got {}",
        hz / 1e6,
        k1.kicks,
        unarmed.kicks
    );
    println!("  CPL3 throughput lost per kick          {per_kick:>10.0}");
    println!("  bare exit (CPL3 port-I/O round trip)   {bare_exit:>10.0}");
    println!("  in lwpvmm after KVM_RUN returns        {in_lwpvmm:>10.0}  (charge, stack, trace)");
    println!(
        "  the rest                               {:>10.0}  (the kick signal, and KVM's exit and entry beyond a port exit's)",
        per_kick - bare_exit - in_lwpvmm
    );
    println!(
        "charged kick / bare kick exit = {:.2}",
        per_kick / bare_exit
    );
    let loss = k1.cycles / off.cycles - 1.0;
    println!(
        "1 kHz loss / (rate x bare exit cost) = {:.2}  (loss {:.2}%)",
        loss / (1000.0 * bare_exit / hz),
        100.0 * loss
    );
    // Every kick stores a record (a small interval) into a trace.
    let cost = |t: &Throughput| (t.cycles - off.cycles) / t.kicks.max(1) as f64;
    let with = best(10_000, Some(SMALL_INTERVAL), Some(true));
    let without = best(10_000, Some(SMALL_INTERVAL), Some(false));
    println!(
        "  10 kHz, a traced record per kick: {:.0} cycles per kick with its stack, {:.0} without",
        cost(&with),
        cost(&without)
    );
    println!(
        "sample with stack / without = {:.2}",
        cost(&with) / cost(&without)
    );
    let (plain, captured, samples) = capture_loss(off.cycles / hz);
    println!(
        "  a pprof request over the API socket, 1 kHz with a record and its stack per kick: loop {:.0} M cycles without, {:.0} M during the capture ({samples} samples in the profile)",
        plain / 1e6,
        captured / 1e6
    );
    println!(
        "pprof request: CPL3 throughput loss during a 5 s capture = {:.2}%",
        100.0 * (captured / plain - 1.0)
    );
}

/// Whole-guest samples (`--profile-kernel`, issue 32) against the same
/// loop without them and against the floor of any exit, in one run: every
/// vCPU kicked, LWP armed or not (the loop runs without LWP), each kick a
/// sample with its stack, kept nowhere (no trace, no capture: the kick and
/// the look are the cost).
fn kernel_profile() {
    let bare_exit = round_trip_cycles()[1];
    // Whole-guest samples: every vCPU kicked, LWP armed or not (the loop
    // runs without LWP), each kick a sample with its stack, kept nowhere
    // (no trace, no capture: the kick and the look are the cost).
    let bare_loop = (0..3)
        .map(|_| throughput(0, None, None))
        .min_by(|a, b| a.cycles.total_cmp(&b.cycles))
        .expect("three runs");
    for rate in [1000, 10_000] {
        let on = (0..3)
            .map(|_| throughput_of(rate, None, None, true))
            .min_by(|a, b| a.cycles.total_cmp(&b.cycles))
            .expect("three runs");
        let per_kick = (on.cycles - bare_loop.cycles) / on.kicks.max(1) as f64;
        println!(
            "  whole-guest samples at {} kHz: {} kicks, {per_kick:.0} cycles of CPL3 throughput per kick",
            rate / 1000,
            on.kicks
        );
        println!(
            "kernel sampling on / off, CPL3 loop = {:.3}  ({} kHz)",
            bare_loop.cycles / on.cycles,
            rate / 1000
        );
        println!(
            "whole-guest kick / bare kick exit = {:.2}  ({} kHz)",
            per_kick / bare_exit,
            rate / 1000
        );
    }
}

/// The throughput guest's loop under the sampler at 1 kHz, every kick a
/// record, with the control API on: once alone, once while a client's
/// `GET /debug/pprof/profile?seconds=5` captures it (the loop is sized to
/// end inside the capture; the VM's end answers the request). The fastest
/// of three each, and the profile's sample count.
fn capture_loss(seconds_per_billion: f64) -> (f64, f64, i64) {
    use std::io::{Read, Write};
    // A loop of about 2.5 s unloaded, inside the 5 s capture even when
    // the kicks and a busy host slow it by half.
    let work = (2.5e9 / seconds_per_billion) as u64;
    let run = |capture: bool| -> (f64, i64) {
        let console = Arc::new(Mutex::new(Vec::new()));
        let sock = std::env::temp_dir().join(format!(
            "lwpvmm-bench-api-{}-{capture}.sock",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&sock);
        let mut host = captured(
            &console,
            Profiling {
                sample_hz: 1000,
                ..Profiling::default()
            },
        );
        host.api_served = true;
        let config = VmConfig {
            kernel: lwpvmm::guests::get("throughput").expect("guest").to_vec(),
            cmdline: format!("lwp=1 interval=65535 work={work}"),
            memory_mib: 64,
            host,
            ..VmConfig::default()
        };
        let client = capture.then(|| {
            let sock = sock.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                let mut s = loop {
                    match std::os::unix::net::UnixStream::connect(&sock) {
                        Ok(s) => break s,
                        Err(_) if started.elapsed() < Duration::from_secs(10) => {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        Err(e) => panic!("the API socket: {e}"),
                    }
                };
                s.write_all(b"GET /debug/pprof/profile?seconds=5 HTTP/1.1\r\nHost: b\r\n\r\n")
                    .expect("the request");
                let mut answer = Vec::new();
                s.read_to_end(&mut answer).expect("the answer");
                let at = answer
                    .windows(4)
                    .position(|w| w == b"\r\n\r\n")
                    .expect("an HTTP answer");
                let p = lwpvmm::profile::pprof::read(&answer[at + 4..]).expect("a profile");
                // The records: the values of the count types, not the time.
                let counts: Vec<usize> = p
                    .sample_type
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| p.string_table[t.unit as usize] == "count")
                    .map(|(i, _)| i)
                    .collect();
                p.sample
                    .iter()
                    .map(|s| counts.iter().map(|&i| s.value[i]).sum::<i64>())
                    .sum()
            })
        });
        let listeners = lwpvmm::vmm::api::ApiListeners::bind(&lwpvmm::vmm::api::ApiConfig {
            sock: Some(sock.clone()),
            ..Default::default()
        })
        .expect("the API socket")
        .expect("listeners");
        let vm = vmm::build_for_boot(&config).expect("throughput guest");
        let started = lwpvmm::vmm::api::frontend::Started {
            vm: vm.handle(),
            sysroot: None,
            kernel: None,
        };
        let api = listeners
            .start(
                lwpvmm::vmm::api::ApiPhase::Running {
                    started,
                    frontend: None,
                },
                config.host.seccomp,
            )
            .expect("the API");
        vm.run().expect("throughput guest");
        api.finish();
        let samples = client.map_or(0, |c| c.join().expect("the pprof client"));
        let text = String::from_utf8_lossy(&console.lock().unwrap()).into_owned();
        let cycles = text
            .lines()
            .find_map(|l| l.strip_prefix("throughput "))
            .expect("result")
            .trim()
            .parse()
            .unwrap();
        (cycles, samples)
    };
    let best = |capture: bool| {
        (0..3)
            .map(|_| run(capture))
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .expect("three runs")
    };
    let (plain, _) = best(false);
    let (with, samples) = best(true);
    (plain, with, samples)
}

/// Seconds from spawning `args` to the first console line holding each
/// marker, and the console. The last marker ends the run: the VMM is killed
/// there, because QEMU keeps a halted guest running (lwpvmm has exited by
/// then). A guest that never gets there is killed after two minutes.
fn console_times(args: &[String], markers: &[fn(&str) -> bool]) -> (Vec<Option<f64>>, String) {
    console_times_within(args, markers, Duration::from_secs(300))
}

/// As [`console_times`], the run stopped at `limit`.
fn console_times_within(
    args: &[String],
    markers: &[fn(&str) -> bool],
    limit: Duration,
) -> (Vec<Option<f64>>, String) {
    let started = Instant::now();
    let child = Arc::new(Mutex::new(
        Command::new(&args[0])
            .args(&args[1..])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the VMM"),
    ));
    let stdout = child.lock().unwrap().stdout.take().expect("piped stdout");
    let stderr = child.lock().unwrap().stderr.take().expect("piped stderr");
    // QEMU pauses the VM on a KVM internal error instead of exiting (on
    // kvm_pvm: the CPL0 INT3 of the kernel's self-test, which lwpvmm
    // delivers and QEMU cannot): end the run there.
    let stuck = Arc::clone(&child);
    let name = args[0].clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("KVM internal error") {
                eprintln!("  ({name}: {line})");
                let _ = stuck.lock().unwrap().kill();
            }
        }
    });
    let watchdog = Arc::clone(&child);
    // Long enough for the devices section's boot and three disk runs
    // (about 120 s for lwpvmm here), which a 120 s limit cut short.
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        let _ = watchdog.lock().unwrap().kill();
    });
    let mut seen = vec![None; markers.len()];
    let mut console = String::new();
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        console.push_str(&line);
        console.push('\n');
        for (i, m) in markers.iter().enumerate() {
            if seen[i].is_none() && m(&line) {
                seen[i] = Some(started.elapsed().as_secs_f64());
            }
        }
        if seen.last().is_some_and(Option::is_some) {
            break;
        }
    }
    let mut child = child.lock().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    (seen, console)
}

/// The Linux guest of resources/linux (kernel, initramfs), the tests' one
/// (`$LWPVMM_LINUX`, else target/tmp/linux), built on first use as the
/// tests build it, with the test images, so that neither builds it again
/// for the other; None when build.sh failed.
fn linux_guest() -> Option<(String, String)> {
    let dir = std::env::var_os("LWPVMM_LINUX")
        .filter(|d| !d.is_empty())
        .map_or_else(
            || PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("linux"),
            PathBuf::from,
        );
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("resources/linux/build.sh");
    build_linux(&script, &["--test-images"], &dir)
}

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

/// Builds the Linux guest with `script` and its `options` into `dir`: its
/// kernel and initramfs.
fn build_linux(script: &Path, options: &[&str], dir: &Path) -> Option<(String, String)> {
    let built = Command::new(script)
        .args(options)
        .arg(dir)
        .status()
        .is_ok_and(|s| s.success());
    built.then(|| {
        (
            dir.join("vmlinux").display().to_string(),
            dir.join("initramfs.cpio").display().to_string(),
        )
    })
}

/// `lwpvmm run` of the Linux guest with `vcpus` vCPUs and `extra` options.
fn lwpvmm_linux(kernel: &str, initramfs: &str, vcpus: u8, extra: &[&str]) -> Vec<String> {
    let vcpus = vcpus.to_string();
    let mut args: Vec<String> = [
        env!("CARGO_BIN_EXE_lwpvmm"),
        "run",
        "--kernel",
        kernel,
        "--initramfs",
        initramfs,
        "--memory",
        "64",
        "--vcpus",
        &vcpus,
    ]
    .map(String::from)
    .to_vec();
    args.extend(extra.iter().map(|a| a.to_string()));
    args
}

/// lwpvmm's default command line for its Linux guest before issue 32's
/// work, for the linux_boot bench's "before". Keep it as it is.
const BEFORE_CMDLINE: &str = "console=ttyS0 reboot=k panic=-1 rdinit=/init nopti nokaslr \
     clearcpuid=141,145,150,151,154,288,291,296,297,298,308,534,580 \
     no_timer_check nompscan rodata=off";

fn linux_boot() {
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

fn show_boot(boot: Option<Boot>) -> String {
    boot.map_or("-".into(), |b| format!("{:.2} ({:.2})", b.wall, b.kernel))
}

/// The guest TSC cycles a Linux self-test line gives after `prefix`.
fn cycles_after(console: &str, prefix: &str) -> Option<f64> {
    console.lines().find_map(|l| {
        l.trim()
            .strip_prefix(prefix)?
            .split(' ')
            .next()?
            .parse::<f64>()
            .ok()
    })
}

/// One LWPINS and one stepped instruction from a Linux process (through the
/// guest module, `--lwp precise`, one vCPU) against the bare guests', all
/// measured in this run.
fn linux_lwp() {
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

/// Issue 31's lines: the Linux guest's bzImage, its payload decompressed
/// by lwpvmm, against the same kernel's ELF, to the kernel's `Run /init`
/// (wall time from the start, the median of three runs each, alternating).
fn stock_kernel() {
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
fn stock_kernel_breakpoint() {
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

fn smp() {
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

/// The host's TSC rate in kHz as /proc/cpuinfo gives it: QEMU microvm's
/// guest needs it on the command line (`tsc_early_khz=`), because it has
/// neither a PM timer nor an HPET and on kvm_pvm its PIT calibration fails.
fn host_tsc_khz() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let mhz: f64 = info
        .lines()
        .find_map(|l| l.strip_prefix("cpu MHz"))?
        .trim_start_matches([' ', '\t', ':'])
        .trim()
        .parse()
        .ok()?;
    Some((mhz * 1000.0) as u64)
}

/// One VMM of the devices comparison: the command that boots the Linux
/// guest from `root` with `data` as the second disk (and `tap` as its
/// network device, when given) on `cmdline`.
#[derive(Clone, Copy, PartialEq)]
enum Vmm {
    Lwpvmm,
    Qemu,
}

fn device_vm(
    vmm: Vmm,
    kernel: &str,
    disks: &[&Path],
    tap: Option<&str>,
    extra: &str,
) -> Vec<String> {
    let cmdline = format!("{} {extra}", lwpvmm::vmm::boot::disk_cmdline(false));
    match vmm {
        Vmm::Lwpvmm => {
            let mut args: Vec<String> = [
                env!("CARGO_BIN_EXE_lwpvmm"),
                "run",
                "--kernel",
                kernel,
                "--memory",
                "64",
                "--cmdline",
                &cmdline,
            ]
            .map(String::from)
            .to_vec();
            for d in disks {
                args.extend(["--disk".into(), d.display().to_string()]);
            }
            if let Some(tap) = tap {
                args.extend(["--net".into(), format!("tap={tap}")]);
            }
            args
        }
        Vmm::Qemu => {
            let khz = host_tsc_khz().unwrap_or(2_000_000);
            let append = format!("{cmdline} tsc_early_khz={khz}");
            let mut extra: Vec<String> = ["-no-reboot", "-kernel", kernel, "-append", &append]
                .map(String::from)
                .to_vec();
            for (i, d) in disks.iter().enumerate() {
                extra.extend([
                    "-drive".into(),
                    format!("id=d{i},file={},format=raw,if=none", d.display()),
                    "-device".into(),
                    format!("virtio-blk-device,drive=d{i}"),
                ]);
            }
            if let Some(tap) = tap {
                extra.extend([
                    "-netdev".into(),
                    format!("tap,id=n0,ifname={tap},script=no,downscript=no"),
                    "-device".into(),
                    "virtio-net-device,netdev=n0,mac=02:4c:57:50:00:01".into(),
                ]);
            }
            let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
            qemu("microvm,x-option-roms=off,rtc=off", &extra)
        }
    }
}

/// The disk benchmark's three timings in seconds (host clock, from the
/// guest's `start` line to its result line): seq-write, seq-read,
/// randread.
fn disk_times(vmm: Vmm, kernel: &str, root: &Path, dir: &Path) -> Option<[f64; 3]> {
    let root_copy = dir.join("root.ext4");
    let data = dir.join("data.img");
    std::fs::copy(root, &root_copy).ok()?;
    std::fs::write(&data, vec![0u8; 8 << 20]).ok()?;
    let args = device_vm(
        vmm,
        kernel,
        &[&root_copy, &data],
        None,
        "lwpdisk=seq-write,seq-read,randread",
    );
    let markers: [fn(&str) -> bool; 6] = [
        |l| l.contains("lwp-disk: start seq-write"),
        |l| l.starts_with("lwp-disk: seq-write "),
        |l| l.contains("lwp-disk: start seq-read"),
        |l| l.starts_with("lwp-disk: seq-read "),
        |l| l.contains("lwp-disk: start randread"),
        |l| l.starts_with("lwp-disk: randread "),
    ];
    let (seen, _) = console_times(&args, &markers);
    let t = |i: usize| Some(seen[i + 1]? - seen[i]?);
    Some([t(0)?, t(2)?, t(4)?])
}

/// A network namespace with a tap for the TCP benchmark, removed on drop.
struct BenchNetns(String);

impl BenchNetns {
    fn create() -> Option<BenchNetns> {
        let name = format!("lwpvmm-bench-{}", std::process::id());
        let ns = BenchNetns(name.clone());
        let steps: [&[&str]; 4] = [
            &["netns", "add", &name],
            &[
                "-n",
                &name,
                "tuntap",
                "add",
                "dev",
                "benchtap0",
                "mode",
                "tap",
            ],
            &[
                "-n",
                &name,
                "addr",
                "add",
                "172.29.0.1/24",
                "dev",
                "benchtap0",
            ],
            &["-n", &name, "link", "set", "benchtap0", "up"],
        ];
        for step in steps {
            let ok = Command::new("ip")
                .args(step)
                .output()
                .is_ok_and(|o| o.status.success());
            if !ok {
                return None;
            }
        }
        Some(ns)
    }
}

impl Drop for BenchNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.0])
            .output();
    }
}

/// Bytes the host sends the guest's TCP sink.
const TCP_BYTES: usize = 4 << 20;

/// Seconds from the host's connect to the guest's answer after it received
/// TCP_BYTES, the VMM running in `ns`.
fn tcp_time(vmm: Vmm, kernel: &str, root: &Path, dir: &Path, ns: &BenchNetns) -> Option<f64> {
    tcp_time_of(vmm, kernel, root, dir, ns, TCP_BYTES)
}

/// As [`tcp_time`], for `bytes`.
fn tcp_time_of(
    vmm: Vmm,
    kernel: &str,
    root: &Path,
    dir: &Path,
    ns: &BenchNetns,
    bytes: usize,
) -> Option<f64> {
    use std::io::{Read, Write};
    let root_copy = dir.join("net-root.ext4");
    std::fs::copy(root, &root_copy).ok()?;
    let args = device_vm(
        vmm,
        kernel,
        &[&root_copy],
        Some("benchtap0"),
        "ip=172.29.0.2::172.29.0.1:255.255.255.0::eth0:off lwpnet=7777",
    );
    let mut child = Command::new("ip")
        .args(["netns", "exec", &ns.0])
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let listening = wait_for_line(child.stdout.take()?, "lwp-net: listening");
    let file = std::fs::File::open(format!("/run/netns/{}", ns.0)).ok()?;
    let result = listening
        .then(|| {
            std::thread::spawn(move || -> Option<f64> {
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).ok()?;
                let addr = "172.29.0.2:7777".parse().ok()?;
                let started = Instant::now();
                let mut s =
                    std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(30)).ok()?;
                s.set_read_timeout(Some(Duration::from_secs(900))).ok()?;
                s.write_all(&vec![0x42u8; bytes]).ok()?;
                s.shutdown(std::net::Shutdown::Write).ok()?;
                let mut reply = String::new();
                s.read_to_string(&mut reply).ok()?;
                reply
                    .contains(&format!("received {bytes} bytes"))
                    .then(|| started.elapsed().as_secs_f64())
            })
            .join()
            .ok()
            .flatten()
        })
        .flatten();
    let _ = child.kill();
    let _ = child.wait();
    result
}

/// Waits until the console prints a line holding `marker` (false when it
/// ends first), and goes on reading it on a thread of its own: lwpvmm stops
/// a VM whose standard output was closed, at the guest's next line.
fn wait_for_line(stdout: std::process::ChildStdout, marker: &'static str) -> bool {
    let (seen, found) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut seen = Some(seen);
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains(marker)
                && let Some(tx) = seen.take()
            {
                let _ = tx.send(());
            }
        }
    });
    found.recv().is_ok()
}

/// One request on the API socket `sock`: its status.
fn api_status(sock: &Path, raw: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(sock).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(60))).ok()?;
    s.write_all(raw.as_bytes()).ok()?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).ok()?;
    std::str::from_utf8(answer.get(9..12)?).ok()?.parse().ok()
}

/// The longest a pause through the API took while the guest kept a
/// 256-entry ring of maximal (32.5 MB) reads posted (the virtio_hostile
/// guest's storm): a pause waits for the request at hand, not the ring.
fn pause_under_storm() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-storm");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let disk = dir.join("disk.img");
    std::fs::File::create(&disk)
        .and_then(|f| f.set_len(64 << 20))
        .unwrap();
    let sock = dir.join("api.sock");
    let guest = embedded_guest("virtio_hostile");
    let mut child = Command::new(env!("CARGO_BIN_EXE_lwpvmm"))
        .args(["run", "--kernel"])
        .arg(&guest)
        .args(["--cmdline", "storm=1", "--memory", "128", "--disk"])
        .arg(&disk)
        .arg("--api-sock")
        .arg(&sock)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run lwpvmm");
    let stdout = child.stdout.take().unwrap();
    let storming = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|l| l.contains("# storm"));
    let body = |state: &str| {
        let b = format!(r#"{{"state": "{state}"}}"#);
        format!(
            "PATCH /vm HTTP/1.1\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        )
    };
    let mut worst: Option<f64> = None;
    if storming {
        for _ in 0..10 {
            std::thread::sleep(Duration::from_millis(200));
            let t = Instant::now();
            let paused = api_status(&sock, &body("Paused"));
            let ms = t.elapsed().as_secs_f64() * 1e3;
            if paused != Some(204) || api_status(&sock, &body("Resumed")) != Some(204) {
                worst = None;
                break;
            }
            worst = Some(worst.map_or(ms, |w: f64| w.max(ms)));
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    match worst {
        Some(ms) => println!("pause under a block storm = {ms:.1} ms"),
        None => println!("pause under a block storm: the storm guest did not run"),
    }
}

fn devices() {
    pause_under_storm();
    let Some((kernel, _)) = linux_guest() else {
        println!("devices: resources/linux/build.sh failed: skipped");
        return;
    };
    if !has_qemu() {
        println!("devices: qemu not installed (apt-get install qemu-system-x86): no comparison");
        return;
    }
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("linux/rootfs.ext4");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-devices");
    let _ = std::fs::create_dir_all(&dir);
    const RUNS: usize = 5;
    let mut disk: [[Vec<f64>; 3]; 2] = Default::default();
    let mut tcp: [Vec<f64>; 2] = Default::default();
    let ns = BenchNetns::create();
    for run in 0..RUNS {
        for (i, vmm) in [Vmm::Lwpvmm, Vmm::Qemu].into_iter().enumerate() {
            if let Some(times) = disk_times(vmm, &kernel, &root, &dir) {
                for (k, t) in times.into_iter().enumerate() {
                    disk[i][k].push(t);
                }
            }
            if let Some(ns) = &ns
                && let Some(t) = tcp_time(vmm, &kernel, &root, &dir, ns)
            {
                tcp[i].push(t);
            }
        }
        eprintln!("devices: run {} of {RUNS} done", run + 1);
    }
    let mb = |bytes: f64, secs: f64| bytes / secs / 1e6;
    let names = ["seq-write", "seq-read", "4k-randread"];
    let bytes = [8.0 * 1048576.0, 8.0 * 1048576.0, 512.0 * 4096.0];
    println!("devices, median of {RUNS} runs (MB/s in the guest's I/O, host clock):");
    let mut ratios = [None; 3];
    for k in 0..3 {
        if disk[0][k].is_empty() || disk[1][k].is_empty() {
            // On kvm_pvm, QEMU's guest stops at the kernel's first FWAIT at
            // CPL0 (a KVM emulation failure that lwpvmm handles itself).
            println!(
                "  disk {}: no timing from {} ({} of {RUNS} runs of lwpvmm, {} of qemu completed)",
                names[k],
                if disk[0][k].is_empty() {
                    "lwpvmm"
                } else {
                    "qemu"
                },
                disk[0][k].len(),
                disk[1][k].len()
            );
            continue;
        }
        let (l, q) = (median(disk[0][k].clone()), median(disk[1][k].clone()));
        println!(
            "  disk {:<12} lwpvmm {:7.2} MB/s  qemu microvm {:7.2} MB/s",
            names[k],
            mb(bytes[k], l),
            mb(bytes[k], q)
        );
        ratios[k] = Some(q / l);
    }
    let show = |r: Option<f64>| r.map_or("-".into(), |r| format!("{r:.2}"));
    println!("disk seq-read lwpvmm/qemu = {}", show(ratios[1]));
    println!("disk seq-write lwpvmm/qemu = {}", show(ratios[0]));
    println!("disk 4k-randread lwpvmm/qemu = {}", show(ratios[2]));
    let tcp_ratio = if tcp[0].is_empty() || tcp[1].is_empty() {
        if ns.is_none() {
            println!("  tcp: no network namespace and tap (run as root): no comparison");
        } else {
            println!(
                "  tcp: {} of {RUNS} runs of lwpvmm, {} of qemu completed",
                tcp[0].len(),
                tcp[1].len()
            );
        }
        None
    } else {
        let (l, q) = (median(tcp[0].clone()), median(tcp[1].clone()));
        println!(
            "  tcp host-to-guest {} MiB: lwpvmm {:.2} MB/s  qemu microvm {:.2} MB/s",
            TCP_BYTES >> 20,
            mb(TCP_BYTES as f64, l),
            mb(TCP_BYTES as f64, q)
        );
        Some(q / l)
    };
    println!("net tcp host-to-guest lwpvmm/qemu = {}", show(tcp_ratio));
    println!("  (ratios are throughput: lwpvmm's over QEMU's; above 1.0 lwpvmm is faster)");
}

/// One request to lwpvmm's API on `sock`, waiting for the socket first;
/// its status.
fn fc_request(sock: &Path, method: &str, path: &str, body: &str) -> Option<u16> {
    let until = Instant::now() + Duration::from_secs(30);
    while !sock.exists() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(2));
    }
    api_status(
        sock,
        &format!(
            "{method} {path} HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
}

/// Seconds from the process's start to the console's first line `marker`
/// starts, the VM configured by `configure` (on the API socket, or not at
/// all), then the process stopped.
fn first_line_at(args: &[String], marker: &str, configure: impl FnOnce() -> bool) -> Option<f64> {
    let started = Instant::now();
    let mut child = Command::new(&args[0])
        .args(&args[1..])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start lwpvmm");
    let stdout = child.stdout.take().expect("piped stdout");
    let seen = configure()
        && BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .any(|l| l.starts_with(marker));
    let at = started.elapsed().as_secs_f64();
    let _ = child.kill();
    let _ = child.wait();
    seen.then_some(at)
}

/// A vsock client of the guest's /lwp-vsock through the device's socket:
/// `CONNECT`, then `mode` (`e` echo, `s` sink).
fn vsock_connect(uds: &Path, port: u32, mode: u8) -> Option<std::os::unix::net::UnixStream> {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(uds).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(1200))).ok()?;
    s.write_all(format!("CONNECT {port}\n").as_bytes()).ok()?;
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while byte[0] != b'\n' {
        s.read_exact(&mut byte).ok()?;
        line.push(byte[0]);
    }
    line.starts_with(b"OK ").then_some(())?;
    s.write_all(&[mode]).ok()?;
    Some(s)
}

/// Firecracker's API and vsock: the same Linux guest to its first
/// self-test line configured through the API against `lwpvmm run`
/// (medians of three, interleaved), the vsock echo round trip, and 64 MiB
/// over vsock against 64 MiB of TCP over a tap (the guest idle but for
/// the receiving program either way).
fn firecracker() {
    use std::io::{Read, Write};
    let Some((kernel, initramfs)) = linux_guest() else {
        println!("firecracker: resources/linux/build.sh failed: skipped");
        return;
    };
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-firecracker");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let marker = "LWP self-test starting";
    let cmdline = lwpvmm::vmm::boot::LINUX_CMDLINE;
    let (mut api, mut cli) = (Vec::new(), Vec::new());
    for run in 0..3 {
        let sock = dir.join(format!("api-{run}.sock"));
        let fc: Vec<String> = [env!("CARGO_BIN_EXE_lwpvmm"), "firecracker", "--api-sock"]
            .map(String::from)
            .into_iter()
            .chain([sock.display().to_string()])
            .collect();
        let boot = format!(
            r#"{{"kernel_image_path": "{kernel}", "initrd_path": "{initramfs}", "boot_args": "{cmdline}"}}"#
        );
        api.extend(first_line_at(&fc, marker, || {
            [
                ("PUT", "/boot-source", boot.as_str()),
                (
                    "PUT",
                    "/machine-config",
                    r#"{"vcpu_count": 1, "mem_size_mib": 64}"#,
                ),
                ("PUT", "/actions", r#"{"action_type": "InstanceStart"}"#),
            ]
            .into_iter()
            .all(|(m, p, b)| fc_request(&sock, m, p, b) == Some(204))
        }));
        cli.extend(first_line_at(
            &lwpvmm_linux(&kernel, &initramfs, 1, &["--cmdline", cmdline]),
            marker,
            || true,
        ));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    match (median(&mut api), median(&mut cli)) {
        (Some(a), Some(c)) => {
            println!("  to \"{marker}\": API {a:.2} s, lwpvmm run {c:.2} s (medians of 3)");
            println!("api boot / cli boot = {:.2}", a / c);
        }
        _ => println!("api boot / cli boot: a boot did not reach \"{marker}\""),
    }

    // vsock: the guest runs /lwp-vsock alone.
    const PORT: u32 = 5000;
    const BYTES: usize = 64 << 20;
    let uds = dir.join("v.sock");
    let config = dir.join("vsock.json");
    std::fs::write(
        &config,
        format!(
            r#"{{"boot-source": {{"kernel_image_path": "{kernel}", "initrd_path": "{initramfs}", "boot_args": "{cmdline} lwpvsockonly={PORT}"}},
"machine-config": {{"vcpu_count": 1, "mem_size_mib": 64}},
"vsock": {{"guest_cid": 3, "uds_path": "{}"}}}}"#,
            uds.display()
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_lwpvmm"))
        .args(["firecracker", "--no-api", "--config-file"])
        .arg(&config)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start lwpvmm");
    let listening = wait_for_line(
        child.stdout.take().expect("piped stdout"),
        "lwp-vsock: listening",
    );
    let mut echo_us = None;
    let mut stream_s = None;
    if listening {
        const ROUND_TRIPS: u32 = 200;
        if let Some(mut s) = vsock_connect(&uds, PORT, b'e') {
            let mut byte = [0u8; 1];
            let t = Instant::now();
            let ok = (0..ROUND_TRIPS)
                .all(|_| s.write_all(b"x").is_ok() && s.read_exact(&mut byte).is_ok());
            echo_us = ok.then(|| t.elapsed().as_secs_f64() * 1e6 / f64::from(ROUND_TRIPS));
        }
        if let Some(mut s) = vsock_connect(&uds, PORT, b's') {
            let t = Instant::now();
            let mut reply = String::new();
            let ok = s.write_all(&vec![0x42u8; BYTES]).is_ok()
                && s.shutdown(std::net::Shutdown::Write).is_ok()
                && s.read_to_string(&mut reply).is_ok()
                && reply.contains(&format!("received {BYTES} bytes"));
            stream_s = ok.then(|| t.elapsed().as_secs_f64());
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    match echo_us {
        Some(us) => println!("vsock echo round trip = {us:.0} us"),
        None => println!("vsock echo round trip: the guest did not answer"),
    }
    if let Some(v) = stream_s {
        println!(
            "  64 MiB over vsock: {v:.1} s ({:.2} MB/s)",
            BYTES as f64 / v / 1e6
        );
    }
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("linux/rootfs.ext4");
    let tcp_s = BenchNetns::create()
        .and_then(|ns| tcp_time_of(Vmm::Lwpvmm, &kernel, &root, &dir, &ns, BYTES));
    match (stream_s, tcp_s) {
        (Some(v), Some(t)) => {
            println!(
                "  64 MiB of TCP over a tap: {t:.1} s ({:.2} MB/s)",
                BYTES as f64 / t / 1e6
            );
            println!("vsock stream 64 MiB / tcp over tap 64 MiB = {:.2}", t / v);
        }
        (v, t) => println!(
            "vsock stream 64 MiB / tcp over tap 64 MiB: not measured (vsock {v:?} s, tcp {t:?} s; TCP needs root for its network namespace)"
        ),
    }
}

fn main() {
    if let Some(bare) = std::env::var_os("BARE_VM") {
        let kind = [Bare::Irqchip, Bare::Split]
            .into_iter()
            .find(|k| bare == k.env())
            .unwrap_or(Bare::Plain);
        bare_vm(kind);
        return;
    }
    if !std::path::Path::new("/dev/kvm").exists() {
        eprintln!("the VMM benchmarks need /dev/kvm, which is missing");
        std::process::exit(1);
    }
    // `cargo test --benches` runs bench targets once as tests: keep that cheap.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    // `cargo bench --bench vmm -- linux sampler` runs only the sections
    // whose names hold one of the words.
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let sections: [(&str, fn()); 15] = [
        ("round_trips", round_trips),
        ("starts", starts),
        ("snapshots", snapshots),
        ("sampler", sampler),
        ("kernel_profile", kernel_profile),
        ("precise", precise),
        ("linux_boot", linux_boot),
        ("linux_lwp", linux_lwp),
        ("smp", smp),
        ("devices", devices),
        ("stock_kernel", stock_kernel),
        ("stock_kernel_breakpoint", stock_kernel_breakpoint),
        ("firecracker", firecracker),
        ("native", native::native),
        ("profile_truth", profile_truth::profile_truth),
    ];
    for (name, section) in sections {
        if filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())) {
            section();
        }
    }
}
