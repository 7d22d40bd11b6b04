//! The command line: argument parsing, the commands it dispatches to, the
//! exit statuses, and errors that name the option to fix.

mod cpuid;
mod devices;
mod guest;
mod report;

use std::io::Write;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use thiserror::Error;

use crate::hostfs::HostFsError;

use crate::lwp::cpuid::{GuestLwpSupport, LwpProfile};
use crate::profile::report::ReportError;
use crate::profile::trace::TraceError;
use crate::vmm::api::frontend::Started;
use crate::vmm::api::{ApiConfig, ApiListeners, ApiPhase};
use crate::vmm::config::{
    BootError, DiskConfig, NetConfig, SeccompMode, SerialOut, SnapshotError, SupervisorMode,
    SyscallFixupMode,
};
use crate::vmm::{
    self, HostConfig, OutputError, OutputKind, Profiling, RestoreConfig, RunOutcome, SnapshotPlan,
    VmConfig, VmError, Vmm,
};

/// lwpvmm: AMD Lightweight Profiling for KVM guests on hosts without LWP.
#[derive(Debug, Parser)]
#[command(name = "lwpvmm", version, about)]
pub struct Cli {
    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Boot a kernel (ELF, with or without a PVH note, or a Linux bzImage).
    Run(RunArgs),
    /// Restore a snapshot and run the VM to its end.
    Restore(RestoreArgs),
    /// Run your own freestanding program (an x86-64 ELF linked at 16 MiB,
    /// resources/examples) as the CPL3 task of lwpvmm's guest runtime, with
    /// LWP and the sampler on, and print its profile.
    Profile(ProfileArgs),
    /// Report a trace written by --trace: records per function, folded
    /// stacks, a flamegraph.
    Report(ReportArgs),
    /// Boot the embedded demo guest: a CPL3 program that profiles itself with
    /// LWP. Exits 0 when the guest reports success.
    Demo {
        /// The LWP profile.
        #[arg(long, value_enum, default_value_t = ProfileArg::Emulated)]
        lwp: ProfileArg,
    },
    /// Take Firecracker's command line and serve its API (the same as
    /// running lwpvmm under the name `firecracker`): README, "Running under
    /// a Firecracker orchestrator".
    #[command(disable_help_flag = true)]
    Firecracker {
        /// Firecracker's options: --api-sock PATH, --config-file FILE,
        /// --no-api, --id, --log-path, --level, --metrics-path, ...
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Print the CPUID table a guest gets for an LWP profile (what lwpvmm
    /// passes to KVM_SET_CPUID2 for vCPU 0; needs /dev/kvm).
    Cpuid {
        /// The LWP profile.
        #[arg(long, value_enum, default_value_t = ProfileArg::Emulated)]
        lwp: ProfileArg,
        /// Which guest the table is for: `shim` (carries lwpvmm's paravirtual
        /// LWP shim; CPUID 0x8000001C.EAX = the profile's set) or `stock`
        /// (EAX = 0, so LWP-aware software leaves LWP alone).
        #[arg(long, value_enum, default_value_t = GuestArg::Shim)]
        guest: GuestArg,
        /// Print a JSON array of {leaf, subleaf, eax, ebx, ecx, edx}.
        #[arg(long)]
        json: bool,
    },
}

/// `lwpvmm run` options.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The kernel image.
    #[arg(long)]
    pub kernel: PathBuf,
    /// An initramfs to pass to the kernel.
    #[arg(long)]
    pub initramfs: Option<PathBuf>,
    /// The kernel command line. The default suits the Linux guest kernel
    /// of resources/linux, or, for any other kernel (a distribution's), one
    /// that keeps it off what this host's emulated CPL0 makes slow
    /// (docs/linux-guest.md says why each part is there); with --disk it
    /// boots from the first disk (`root=/dev/vda`); lwpvmm's own test
    /// guests ignore it. For a kernel that takes them there, lwpvmm appends
    /// the `virtio_mmio.device=` entries of the devices to any command
    /// line; others find the devices in the ACPI DSDT.
    #[arg(long)]
    pub cmdline: Option<String>,
    /// Words to add to the end of the kernel command line, the default one
    /// or --cmdline's (repeatable, in order): one option, such as
    /// `lwpvsock=5000`, without copying the whole default line.
    #[arg(long, value_name = "WORDS")]
    pub cmdline_append: Vec<String>,
    /// A raw disk image as a virtio block device: PATH, or PATH,ro to
    /// attach it read-only. Repeatable: the first is /dev/vda, the next
    /// /dev/vdb, ...
    #[arg(long = "disk", value_name = "PATH[,ro]", value_parser = devices::parse_disk)]
    pub disks: Vec<DiskConfig>,
    /// A virtio network device on an existing host tap: tap=NAME, or
    /// tap=NAME,mac=MAC. Repeatable. lwpvmm neither creates the tap nor
    /// bridges or routes it (README: "Disks and networks").
    #[arg(long = "net", value_name = "tap=NAME[,mac=MAC]", value_parser = devices::parse_net)]
    pub nets: Vec<NetConfig>,
    /// A virtio entropy device (virtio-rng) fed from the host's getrandom,
    /// so that the guest's CRNG is ready early in its boot; with a value,
    /// at most that many bytes a second (a token bucket of that size,
    /// refilled each second).
    #[arg(long, value_name = "BYTES_PER_S", num_args = 0..=1, default_missing_value = "0")]
    pub entropy: Option<u64>,
    /// Guest RAM in MiB (`512`), or with a suffix (`512M`, `2G`).
    #[arg(long, default_value_t = crate::vmm::config::DEFAULT_MEMORY_MIB, value_parser = parse_mib)]
    pub memory: u64,
    /// Number of vCPUs (1 to 254, the xAPIC limit).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=254))]
    pub vcpus: u8,
    /// The LWP profile.
    #[arg(long, value_enum, default_value_t = ProfileArg::Emulated)]
    pub lwp: ProfileArg,
    /// `shim`: the guest carries lwpvmm's paravirtual LWP shim; `stock`: it
    /// does not (CPUID 0x8000001C.EAX = 0 and LWP instructions #UD).
    #[arg(long, value_enum, default_value_t = GuestArg::Shim)]
    pub guest: GuestArg,
    /// Console, metrics, snapshots, seccomp.
    #[command(flatten)]
    pub host: HostArgs,
}

/// Host-side options of `run` and `restore`.
#[derive(Debug, clap::Args)]
pub struct HostArgs {
    /// Where the serial console goes: `stdout` or a file path.
    #[arg(long, default_value = "stdout")]
    pub serial: String,
    /// Write the run's counters as JSON to this file at exit, and whenever
    /// lwpvmm receives SIGUSR1.
    #[arg(long)]
    pub metrics: Option<PathBuf>,
    /// The seccomp filters of lwpvmm's threads: `on` (a call outside a
    /// thread's allowlist stops lwpvmm with a message naming it), `log` (the
    /// kernel logs such calls and lets them through: to find what a list
    /// lacks), `off`.
    #[arg(long, value_enum, default_value_t = SeccompArg::On)]
    pub seccomp: SeccompArg,
    /// The same as `--seccomp off`.
    #[arg(long, conflicts_with = "seccomp")]
    pub no_seccomp: bool,
    /// Sampling kicks per second for the clock events (CNH, RNH), 0 to
    /// 100000; 0 turns the sampler off.
    #[arg(long, default_value_t = 1000, allow_negative_numbers = true, value_parser = sample_hz())]
    pub sample_hz: u32,
    /// Profile the whole guest: kick every vCPU at --sample-hz and keep what
    /// each kick found, the guest kernel's stack or a process's, in the
    /// trace and the API's profiles (host-side samples, EventId 0; the
    /// guest's LWP state is untouched). Works with --lwp off.
    #[arg(long)]
    pub profile_kernel: bool,
    /// Write every LWP record the VM stores to this trace file (JSON lines;
    /// read it with `lwpvmm report`).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// The trace's size limit (bytes, or with a K, M, G or T suffix); records
    /// past it are counted in the metrics, not written.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub trace_max: u64,
    /// Leave call stacks out of the trace (by default each sampled, LWPINS
    /// and LWPVAL record has the stack of the context it was stored for,
    /// unwound by the guest's frame pointers).
    #[arg(long)]
    pub no_stacks: bool,
    /// Directory for snapshots (state.bin and memory.bin). With it, SIGUSR2
    /// takes a snapshot while the VM runs; the VM continues afterwards.
    #[arg(long)]
    pub snapshot_dir: Option<PathBuf>,
    /// Take a snapshot this many milliseconds after the start (needs
    /// --snapshot-dir).
    #[arg(long, requires = "snapshot_dir")]
    pub snapshot_after: Option<u64>,
    /// Serve the control API (HTTP/1.1, JSON) on this Unix socket, created
    /// owner-only: pause, resume, snapshot, metrics, stop. lwpvmm refuses
    /// a path that exists and removes the socket at exit. docs/profiling.md
    /// lists the endpoints.
    #[arg(long, value_name = "PATH")]
    pub api_sock: Option<PathBuf>,
    /// Also serve the read-only `GET /metrics` (Prometheus text) and
    /// `GET /debug/pprof/profile` over TCP on this address, e.g.
    /// 127.0.0.1:9100. Control endpoints stay on --api-sock.
    #[arg(long, value_name = "ADDR", value_parser = parse_listen)]
    pub api_listen: Option<std::net::SocketAddr>,
    /// The guest's files, a directory or the initramfs it booted, that
    /// name the frames of the API's profiles (with `run`, the
    /// `--initramfs` unless given).
    #[arg(long, value_name = "DIR|INITRAMFS")]
    pub sysroot: Option<PathBuf>,
    /// The guest kernel's symbols, naming the kernel frames of the API's
    /// whole-guest profiles: its vmlinux, or a copy of its /proc/kallsyms
    /// (with `run`, the `--kernel` ELF unless given).
    #[arg(long, value_name = "FILE")]
    pub kernel_symbols: Option<PathBuf>,
    /// Diff snapshots: track the pages written, and write the snapshots of
    /// --snapshot-dir DIR to DIR/0 (full), DIR/1, DIR/2, ... (each only
    /// the pages written since the one before); with the API,
    /// `"snapshot_type": "Diff"`. Restore the newest: lwpvmm follows the
    /// chain (docs/snapshot.md).
    #[arg(long)]
    pub snapshot_diff: bool,
    /// For tests: take a snapshot whenever the guest writes to the snapshot
    /// debug port 0x5A (docs/pv-abi.md), at that exact point (needs
    /// --snapshot-dir).
    #[arg(long, requires = "snapshot_dir")]
    pub snapshot_on_port: bool,
    /// Complete the SYSCALLs kvm_pvm leaves at CPL3 (its SYSCALL quirk),
    /// so that an unmodified Linux can run processes there: `auto` (on where
    /// the host's KVM is kvm_pvm), `on`, `off`. It costs one exit per guest
    /// page fault (docs/linux-guest.md).
    #[arg(long, value_enum, default_value_t = SyscallFixupArg::Auto)]
    pub syscall_fixup: SyscallFixupArg,
    /// Where the guest kernel's supervisor code runs on a kvm_pvm host:
    /// `auto` (on the CPU in the host's native supervisor mode when the
    /// host offers it and the kernel declares itself written for it, else
    /// in KVM's emulator), `native` (or an error saying why not),
    /// `emulated` (docs/pv-abi.md, "Native supervisor mode").
    #[arg(long, value_enum, default_value_t = SupervisorArg::Auto)]
    pub supervisor: SupervisorArg,
}

/// `--sample-hz`: 0 (off) to the rate the control API also allows. Negative
/// numbers reach it (clap would take `-5` for an option) so that the
/// message gives the range.
fn sample_hz() -> clap::builder::RangedI64ValueParser<u32> {
    clap::value_parser!(u32).range(0..=i64::from(crate::vmm::config::MAX_SAMPLE_HZ))
}

/// A size: bytes, or a number with a K, M, G or T suffix (powers of 1024).
fn parse_size(text: &str) -> Result<u64, String> {
    let (digits, shift) = match text.as_bytes().last() {
        Some(b'K' | b'k') => (&text[..text.len() - 1], 10),
        Some(b'M' | b'm') => (&text[..text.len() - 1], 20),
        Some(b'G' | b'g') => (&text[..text.len() - 1], 30),
        Some(b'T' | b't') => (&text[..text.len() - 1], 40),
        _ => (text, 0),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| format!("`{text}` is not a size (give bytes, or e.g. 512M or 2G)"))
}

/// A memory size in MiB: a plain number is MiB, a suffix (K, M, G, T, as
/// for sizes) says the unit; whole MiB only, in the range lwpvmm boots
/// (checked here, so that the message gives the range in the units the
/// user wrote rather than in MiB after the kernel was read).
fn parse_mib(text: &str) -> Result<u64, String> {
    use crate::vmm::config::{MAX_MEMORY_MIB, MIN_MEMORY_MIB};
    let range = format!(
        "give {MIN_MEMORY_MIB} MiB to {} TiB (`{MIN_MEMORY_MIB}` to `{MAX_MEMORY_MIB}`, or with a suffix: `512M`, `2G`, `1T`)",
        MAX_MEMORY_MIB >> 20
    );
    let mib = if text.bytes().all(|b| b.is_ascii_digit()) {
        text.parse()
            .map_err(|_| format!("`{text}` is out of range: {range}"))?
    } else {
        let bytes = parse_size(text).map_err(|_| {
            format!("`{text}` is not a memory size (give MiB, e.g. 512, or 512M, 2G or 1T)")
        })?;
        if bytes % (1 << 20) != 0 {
            return Err(format!("`{text}` is not a whole number of MiB"));
        }
        bytes >> 20
    };
    if !(MIN_MEMORY_MIB..=MAX_MEMORY_MIB).contains(&mib) {
        return Err(format!("`{text}` is out of range: {range}"));
    }
    Ok(mib)
}

/// A TCP address to listen on: `IP:PORT`, or `HOST:PORT` with a host name
/// (`localhost:9100`), resolved now; the first address it resolves to.
fn parse_listen(text: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(addr) = text.parse() {
        return Ok(addr);
    }
    let mut addrs = text.to_socket_addrs().map_err(|e| {
        format!(
            "`{text}` is not an address to listen on (give HOST:PORT, e.g. 127.0.0.1:9100): {e}"
        )
    })?;
    addrs
        .next()
        .ok_or_else(|| format!("`{text}` resolves to no address"))
}

impl HostArgs {
    fn seccomp(&self) -> SeccompMode {
        if self.no_seccomp {
            SeccompMode::Off
        } else {
            self.seccomp.into()
        }
    }
}

impl From<&HostArgs> for HostConfig {
    fn from(a: &HostArgs) -> Self {
        HostConfig {
            serial: match a.serial.as_str() {
                "stdout" => SerialOut::Stdout,
                path => SerialOut::File(path.into()),
            },
            snapshots: SnapshotPlan {
                dir: a.snapshot_dir.clone(),
                after: a.snapshot_after.map(std::time::Duration::from_millis),
                on_port: a.snapshot_on_port,
                diff: a.snapshot_diff,
            },
            seccomp: a.seccomp(),
            stop_on_signals: true,
            profiling: Profiling {
                sample_hz: a.sample_hz,
                kernel: a.profile_kernel,
                trace: a.trace.clone(),
                trace_max: a.trace_max,
                stacks: !a.no_stacks,
                metrics: a.metrics.clone(),
            },
            api_served: a.api_sock.is_some() || a.api_listen.is_some(),
            syscall_fixup: a.syscall_fixup.into(),
            supervisor: a.supervisor.into(),
        }
    }
}

/// `lwpvmm restore` options.
#[derive(Debug, clap::Args)]
pub struct RestoreArgs {
    /// The snapshot directory (written by --snapshot-dir).
    pub dir: PathBuf,
    /// Refuse the snapshot unless it was taken with this LWP profile.
    #[arg(long, value_enum)]
    pub lwp: Option<ProfileArg>,
    /// Read the whole memory file and check its CRC-64 before the guest
    /// runs (by default the file is mapped and its pages read as the guest
    /// first touches them; docs/snapshot.md).
    #[arg(long)]
    pub verify: bool,
    /// Console, metrics, snapshots of the restored VM, seccomp.
    #[command(flatten)]
    pub host: HostArgs,
}

/// `lwpvmm profile` options.
#[derive(Debug, clap::Args)]
pub struct ProfileArgs {
    /// The program: a static x86-64 ELF linked at 16 MiB or above.
    pub program: PathBuf,
    /// The LWP profile.
    #[arg(long, value_enum, default_value_t = ProfileArg::Emulated)]
    pub lwp: ProfileArg,
    /// Sampling kicks per second, 0 to 100000.
    #[arg(long, default_value_t = 1000, allow_negative_numbers = true, value_parser = sample_hz())]
    pub sample_hz: u32,
    /// Guest RAM in MiB (`512`), or with a suffix (`512M`, `2G`).
    #[arg(long, default_value_t = crate::vmm::config::DEFAULT_MEMORY_MIB, value_parser = parse_mib)]
    pub memory: u64,
    /// How many functions to list.
    #[arg(long, default_value_t = 20)]
    pub top: usize,
}

/// `lwpvmm report` options.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// The trace file.
    pub trace: PathBuf,
    /// The guest ELF whose symbol table names the functions (every
    /// address no reported mapping covers).
    #[arg(long)]
    pub symbols: Option<PathBuf>,
    /// The guest's files, a directory holding them or the initramfs it
    /// booted (newc cpio, plain or gzipped): the executables the guest
    /// reported for each address space (the lwpvmm guest module does) are
    /// read from it, and each process's frames named with its own.
    #[arg(long)]
    pub sysroot: Option<PathBuf>,
    /// Count only records of this EventId (default: CNH if the trace has
    /// it, else RNH, else the whole-guest samples, EventId 0, if it has
    /// them, else every record).
    #[arg(long)]
    pub event: Option<u8>,
    /// Count the whole-guest samples (`run --profile-kernel`): kernel and
    /// process functions by the time the guest spent in them. The same as
    /// `--event 0`.
    #[arg(long, conflicts_with = "event")]
    pub kernel: bool,
    /// The guest kernel's symbols, for the whole-guest samples' kernel
    /// frames: its vmlinux (an ELF with a symbol table), or a copy of its
    /// /proc/kallsyms. Without it kernel frames are addresses.
    #[arg(long, value_name = "FILE")]
    pub kernel_symbols: Option<PathBuf>,
    /// How many functions to list.
    #[arg(long, default_value_t = 20)]
    pub top: usize,
    /// Write folded stacks (outermost frame first) to this file.
    #[arg(long)]
    pub folded: Option<PathBuf>,
    /// Write a flamegraph SVG to this file.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Write a pprof profile (gzipped profile.proto, every EventId a sample
    /// type) to this file, for `go tool pprof`, Pyroscope, Parca or Grafana.
    #[arg(long)]
    pub pprof: Option<PathBuf>,
}

/// `--lwp` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProfileArg {
    /// No LWP.
    Off,
    /// LWPVAL, LWPINS, sampled clock events, continuous mode, PTSC, interrupt.
    Emulated,
    /// `emulated` plus instructions and branches retired (single-stepped).
    Precise,
    /// The AMD Opteron 6272 (Bulldozer) values exactly.
    Bulldozer,
}

impl From<ProfileArg> for LwpProfile {
    fn from(p: ProfileArg) -> Self {
        match p {
            ProfileArg::Off => LwpProfile::Off,
            ProfileArg::Emulated => LwpProfile::Emulated,
            ProfileArg::Precise => LwpProfile::Precise,
            ProfileArg::Bulldozer => LwpProfile::Bulldozer,
        }
    }
}

/// `--guest` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GuestArg {
    /// The guest carries lwpvmm's paravirtual LWP shim.
    Shim,
    /// A stock guest.
    Stock,
}

impl From<GuestArg> for GuestLwpSupport {
    fn from(g: GuestArg) -> Self {
        match g {
            GuestArg::Shim => GuestLwpSupport::Shim,
            GuestArg::Stock => GuestLwpSupport::Stock,
        }
    }
}

/// `--seccomp` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SeccompArg {
    /// Filters on; a call outside an allowlist stops lwpvmm, named.
    On,
    /// Filters log what they would refuse (kernel audit log) and allow it.
    Log,
    /// No filters.
    Off,
}

impl From<SeccompArg> for SeccompMode {
    fn from(a: SeccompArg) -> Self {
        match a {
            SeccompArg::On => SeccompMode::On,
            SeccompArg::Log => SeccompMode::Log,
            SeccompArg::Off => SeccompMode::Off,
        }
    }
}

/// `--syscall-fixup` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SyscallFixupArg {
    /// On where the host's KVM is kvm_pvm.
    Auto,
    /// Always.
    On,
    /// Never.
    Off,
}

impl From<SyscallFixupArg> for SyscallFixupMode {
    fn from(a: SyscallFixupArg) -> Self {
        match a {
            SyscallFixupArg::Auto => SyscallFixupMode::Auto,
            SyscallFixupArg::On => SyscallFixupMode::On,
            SyscallFixupArg::Off => SyscallFixupMode::Off,
        }
    }
}

/// `--supervisor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SupervisorArg {
    /// Native where the host offers it and the kernel declares it.
    Auto,
    /// Native, or an error.
    Native,
    /// Emulated.
    Emulated,
}

impl From<SupervisorArg> for SupervisorMode {
    fn from(a: SupervisorArg) -> Self {
        match a {
            SupervisorArg::Auto => SupervisorMode::Auto,
            SupervisorArg::Native => SupervisorMode::Native,
            SupervisorArg::Emulated => SupervisorMode::Emulated,
        }
    }
}

/// Why a command failed.
#[derive(Debug, Error)]
pub enum CliError {
    /// Writing the output failed.
    #[error("cannot write output: {0}")]
    Output(#[from] std::io::Error),
    /// Encoding JSON failed.
    #[error("cannot encode JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// A file named on the command line cannot be read.
    #[error("cannot read {what}: {source}")]
    Read {
        /// Which file.
        what: &'static str,
        /// Why (the path is in it).
        source: HostFsError,
    },
    /// An output named on the command line cannot be written.
    #[error("{flag} {source}")]
    OutputFile {
        /// The option.
        flag: &'static str,
        /// Why (the path is in it).
        source: HostFsError,
    },
    /// The VM failed.
    #[error(transparent)]
    Vm(VmError),
    /// The VM refused a value the user gave with an option.
    #[error("{flag}: {source}")]
    Option {
        /// The option.
        flag: &'static str,
        /// Why.
        source: VmError,
    },
    /// The trace could not be read.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// The report could not be made.
    #[error(transparent)]
    Report(#[from] ReportError),
    /// `report --event` names no LWP event.
    #[error(
        "--event {0} is not an LWP EventId: give 1 (LWPVAL), 2 (instructions retired), 3 (branches retired), 4 (data-cache misses), 5 (CPU clocks), 6 (reference clocks) or 255 (LWPINS), or 0 for the whole-guest samples of --profile-kernel"
    )]
    UnknownEvent(u8),
    /// `--kernel-symbols` names a file that cannot name kernel frames.
    #[error(
        "--kernel-symbols {}: {source} (give the guest kernel's vmlinux or a copy of its /proc/kallsyms)",
        path.display()
    )]
    KernelSymbols {
        /// The file.
        path: PathBuf,
        /// Why.
        source: crate::profile::objects::KernelSymbolsError,
    },
    /// A flamegraph or folded stacks were asked for, with nothing to draw.
    #[error(
        "the trace has no records of {0}: there is no flamegraph, folded stack or profile to write, so nothing was written (choose another --event)"
    )]
    NothingToDraw(String),
    /// `--sysroot` is neither a directory nor an initramfs.
    #[error("--sysroot {0}")]
    Sysroot(#[from] crate::profile::sysroot::SysrootError),
    /// Options that do not go together.
    #[error("{0}")]
    Usage(String),
    /// Firecracker's command line failed.
    #[error(transparent)]
    Firecracker(#[from] crate::firecracker::run::RunError),
    /// The run went on, but something it was asked to do failed.
    #[error("{}", .0.join("; "))]
    Incomplete(Vec<String>),
}

impl From<VmError> for CliError {
    fn from(e: VmError) -> Self {
        let flag = match e {
            VmError::Output(OutputError { kind, source }) => {
                return CliError::OutputFile {
                    flag: match kind {
                        OutputKind::Serial => "--serial",
                        OutputKind::Metrics => "--metrics",
                        OutputKind::Trace => "--trace",
                        OutputKind::SnapshotDir => "--snapshot-dir",
                    },
                    source,
                };
            }
            VmError::VcpuCount { .. } => "--vcpus",
            VmError::Boot(
                BootError::MemorySize { .. }
                | BootError::KernelLoad(_)
                | BootError::InitramfsTooLarge { .. },
            ) => "--memory",
            VmError::Snapshot(SnapshotError::ProfileMismatch { .. }) => "--lwp",
            e => return CliError::Vm(e),
        };
        CliError::Option { flag, source: e }
    }
}

pub use crate::vmm::{REBOOT_STATUS, exit_status};

/// The most bytes of a file `lwpvmm profile` or `report` reads whole (a
/// program, a symbol file).
const MAX_NAMED_FILE: u64 = 1 << 30;

/// Reads a file named on the command line (`crate::hostfs`): a regular
/// file of at most `max` bytes, `limit` saying why.
fn read(
    what: &'static str,
    path: &std::path::Path,
    max: u64,
    limit: &'static str,
) -> Result<Vec<u8>, CliError> {
    crate::hostfs::read_input(path, max, limit).map_err(|source| CliError::Read { what, source })
}

/// Reads the kernel or initramfs of a guest of `memory_mib` MiB.
fn read_image(
    what: &'static str,
    path: &std::path::Path,
    memory_mib: u64,
) -> Result<Vec<u8>, CliError> {
    crate::vmm::config::read_image(path, memory_mib)
        .map_err(|source| CliError::Read { what, source })
}

/// The host settings of `host`; with the API on, profiles are named from
/// `--sysroot`, else from the initramfs the guest boots.
fn api_config(
    host: &HostArgs,
    initramfs: Option<&PathBuf>,
    kernel: Option<&PathBuf>,
) -> Result<Option<ApiConfig>, CliError> {
    let api = host.api_sock.is_some() || host.api_listen.is_some();
    if host.sysroot.is_some() && !api {
        return Err(CliError::Usage(
            "--sysroot names the frames of the control API's profiles: give --api-sock or --api-listen too (for a trace, pass --sysroot to `lwpvmm report`)".into(),
        ));
    }
    if host.kernel_symbols.is_some() && !api {
        return Err(CliError::Usage(
            "--kernel-symbols names the kernel frames of the control API's profiles: give --api-sock or --api-listen too (for a trace, pass --kernel-symbols to `lwpvmm report`)".into(),
        ));
    }
    Ok(api.then(|| ApiConfig {
        sock: host.api_sock.clone(),
        listen: host.api_listen,
        sysroot: host.sysroot.clone().or_else(|| initramfs.cloned()),
        kernel_symbols: host.kernel_symbols.clone(),
        kernel_image: kernel.cloned(),
    }))
}

/// Binds the control API `config` asks for, before the VM is built: a wrong
/// path or port fails the command at once.
fn bind_api(config: Option<&ApiConfig>) -> Result<Option<ApiListeners>, VmError> {
    Ok(match config {
        Some(c) => ApiListeners::bind(c)?,
        None => None,
    })
}

/// Runs `vmm` to its end, served by the control API on `listeners` if
/// any: the API starts before the VM runs and finishes after it ended, so
/// that the profiles still due go out.
fn served(
    vmm: Vmm,
    listeners: Option<ApiListeners>,
    seccomp: SeccompMode,
) -> Result<RunOutcome, VmError> {
    let Some(listeners) = listeners else {
        return vmm.run();
    };
    let started = Started {
        vm: vmm.handle(),
        sysroot: None,
        kernel: None,
    };
    let api = listeners.start(
        ApiPhase::Running {
            started,
            frontend: None,
        },
        seccomp,
    )?;
    let outcome = vmm.run();
    api.finish();
    outcome
}

/// Runs a parsed command line, writing to `out`; returns the exit status.
pub fn run(cli: Cli, out: &mut dyn Write) -> Result<u8, CliError> {
    match cli.command {
        Command::Run(args) => {
            let kernel = read_image("kernel", &args.kernel, args.memory)?;
            let mut cmdline = args.cmdline.clone().unwrap_or_else(|| {
                let root = args.disks.first().map(|d| d.read_only);
                crate::vmm::config::default_cmdline(&kernel, root)
            });
            for words in &args.cmdline_append {
                if !cmdline.is_empty() {
                    cmdline.push(' ');
                }
                cmdline.push_str(words);
            }
            let config = VmConfig {
                kernel,
                initramfs: args
                    .initramfs
                    .as_ref()
                    .map(|p| read_image("initramfs", p, args.memory))
                    .transpose()?,
                cmdline,
                memory_mib: args.memory,
                vcpus: args.vcpus,
                profile: args.lwp.into(),
                guest: args.guest.into(),
                program: None,
                disks: args.disks.clone(),
                nets: args.nets.clone(),
                vsock: None,
                entropy: args.entropy.map(devices::entropy),
                host: HostConfig::from(&args.host),
            };
            let api = api_config(&args.host, args.initramfs.as_ref(), Some(&args.kernel))?;
            let listeners = bind_api(api.as_ref())?;
            let vmm = vmm::build_for_boot(&config)?;
            finish(served(vmm, listeners, config.host.seccomp)?)
        }
        Command::Restore(args) => {
            let config = RestoreConfig {
                dir: args.dir.clone(),
                profile: args.lwp.map(Into::into),
                verify: args.verify,
                overrides: Default::default(),
                host: HostConfig::from(&args.host),
            };
            let api = api_config(&args.host, None, None)?;
            let listeners = bind_api(api.as_ref())?;
            let seccomp = config.host.seccomp;
            finish(vmm::restore_with(&config, |vmm| {
                served(vmm, listeners, seccomp)
            })?)
        }
        Command::Report(args) => report::report(out, &args),
        Command::Profile(args) => guest::profile(out, &args),
        Command::Firecracker { args } => Ok(crate::firecracker::run::main(&args, out)?),
        Command::Demo { lwp } => guest::demo(out, lwp.into()),
        Command::Cpuid { lwp, guest, json } => {
            cpuid::print(out, lwp.into(), guest.into(), json)?;
            Ok(0)
        }
    }
}

/// The exit status of a finished run: a signal's stop is said in one line;
/// a requested snapshot or metrics write that failed fails the command.
fn finish(outcome: RunOutcome) -> Result<u8, CliError> {
    if let Some(line) = crate::vmm::end_line(outcome.end) {
        // Not eprintln!, which panics when stderr is gone: after SIGHUP the
        // terminal usually is.
        let _ = writeln!(std::io::stderr(), "lwpvmm: {line}");
    }
    if !outcome.errors.is_empty() {
        return Err(CliError::Incomplete(outcome.errors));
    }
    Ok(exit_status(outcome.end))
}
