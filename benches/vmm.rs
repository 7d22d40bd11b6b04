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
//! Each section is a folder of benches/ named as the section (the
//! helpers several share stay here).
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
mod devices;
mod firecracker;
mod kernel_profile;
mod linux_boot;
mod linux_lwp;
mod native;
mod precise;
mod profile_truth;
mod round_trips;
mod sampler;
mod smp;
mod snapshots;
mod starts;
mod stock_kernel;

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
        ("round_trips", round_trips::round_trips),
        ("starts", starts::starts),
        ("snapshots", snapshots::snapshots),
        ("sampler", sampler::sampler),
        ("kernel_profile", kernel_profile::kernel_profile),
        ("precise", precise::precise),
        ("linux_boot", linux_boot::linux_boot),
        ("linux_lwp", linux_lwp::linux_lwp),
        ("smp", smp::smp),
        ("devices", devices::devices),
        ("stock_kernel", stock_kernel::stock_kernel),
        (
            "stock_kernel_breakpoint",
            stock_kernel::stock_kernel_breakpoint,
        ),
        ("firecracker", firecracker::firecracker),
        ("native", native::native),
        ("profile_truth", profile_truth::profile_truth),
    ];
    for (name, section) in sections {
        if filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())) {
            section();
        }
    }
}
