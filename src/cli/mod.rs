//! The command line: argument parsing and the commands it dispatches to.

mod cpuid;

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use clap::{Parser, Subcommand, ValueEnum};
use thiserror::Error;

use crate::lwp::cpuid::{GuestLwpSupport, LwpProfile};
use crate::profile::report::{self, ReportError, Symbols};
use crate::profile::trace::{self, TraceError};
use crate::vmm::devices::{GuestEnd, SerialOut};
use crate::vmm::vm::{self, Profiling, RestoreConfig, RunOutcome, SnapshotPlan, VmConfig, VmError};

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
    /// of resources/linux (docs/linux-guest.md says why each part is there);
    /// lwpvmm's own test guests ignore it.
    #[arg(long, default_value = crate::vmm::boot::LINUX_CMDLINE)]
    pub cmdline: String,
    /// Guest RAM in MiB.
    #[arg(long, default_value_t = 128)]
    pub memory: u64,
    /// Number of vCPUs.
    #[arg(long, default_value_t = 1)]
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
    /// Run without seccomp filters (they are on by default).
    #[arg(long)]
    pub no_seccomp: bool,
    /// Sampling kicks per second for the clock events (CNH, RNH); 0 turns
    /// the sampler off.
    #[arg(long, default_value_t = 1000)]
    pub sample_hz: u32,
    /// Write every LWP record the VM stores to this trace file (JSON lines;
    /// read it with `lwpvmm report`).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Directory for snapshots (state.bin and memory.bin). With it, SIGUSR2
    /// takes a snapshot while the VM runs; the VM continues afterwards.
    #[arg(long)]
    pub snapshot_dir: Option<PathBuf>,
    /// Take a snapshot this many milliseconds after the start (needs
    /// --snapshot-dir).
    #[arg(long, requires = "snapshot_dir")]
    pub snapshot_after: Option<u64>,
}

impl From<&HostArgs> for Profiling {
    fn from(a: &HostArgs) -> Self {
        Profiling {
            sample_hz: a.sample_hz,
            trace: a.trace.clone(),
            metrics: a.metrics.clone(),
        }
    }
}

impl From<&HostArgs> for SnapshotPlan {
    fn from(a: &HostArgs) -> Self {
        SnapshotPlan {
            dir: a.snapshot_dir.clone(),
            after: a.snapshot_after.map(std::time::Duration::from_millis),
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
    /// Sampling kicks per second.
    #[arg(long, default_value_t = 1000)]
    pub sample_hz: u32,
    /// Guest RAM in MiB.
    #[arg(long, default_value_t = 128)]
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
    /// The guest ELF whose symbol table names the functions.
    #[arg(long)]
    pub symbols: Option<PathBuf>,
    /// Count only records of this EventId (default: CNH if the trace has
    /// it, else RNH, else every record).
    #[arg(long)]
    pub event: Option<u8>,
    /// How many functions to list.
    #[arg(long, default_value_t = 20)]
    pub top: usize,
    /// Write folded stacks (one frame deep) to this file.
    #[arg(long)]
    pub folded: Option<PathBuf>,
    /// Write a flamegraph SVG to this file.
    #[arg(long)]
    pub svg: Option<PathBuf>,
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
    #[error("cannot read {what} {path}: {source}")]
    Read {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The VM failed.
    #[error(transparent)]
    Vm(#[from] VmError),
    /// The trace could not be read.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// The report could not be made.
    #[error(transparent)]
    Report(#[from] ReportError),
}

/// Exit status of `lwpvmm run` when the guest asked for a reboot (lwpvmm
/// does not restart guests; a kernel that panics with `panic=-1` ends here).
pub const REBOOT_STATUS: u8 = 4;

/// Exit status of `lwpvmm run` for how the guest ended: `(value << 1) | 1`
/// for a write of `value` to port 0xf4, exactly as QEMU's isa-debug-exit;
/// 0 for a power-off; [`REBOOT_STATUS`] for a reboot.
pub fn exit_status(end: GuestEnd) -> u8 {
    match end {
        GuestEnd::ExitPort(value) => (value << 1) | 1,
        GuestEnd::PowerOff => 0,
        GuestEnd::Reboot => REBOOT_STATUS,
    }
}

fn read(what: &'static str, path: &PathBuf) -> Result<Vec<u8>, CliError> {
    std::fs::read(path).map_err(|source| CliError::Read {
        what,
        path: path.clone(),
        source,
    })
}

/// Runs a parsed command line, writing to `out`; returns the exit status.
pub fn run(cli: Cli, out: &mut dyn Write) -> Result<u8, CliError> {
    match cli.command {
        Command::Run(args) => {
            let serial = serial_out(&args.host.serial);
            let config = VmConfig {
                kernel: read("kernel", &args.kernel)?,
                initramfs: args
                    .initramfs
                    .as_ref()
                    .map(|p| read("initramfs", p))
                    .transpose()?,
                cmdline: args.cmdline,
                memory_mib: args.memory,
                vcpus: args.vcpus,
                profile: args.lwp.into(),
                guest: args.guest.into(),
                serial,
                snapshots: (&args.host).into(),
                seccomp: !args.host.no_seccomp,
                profiling: (&args.host).into(),
                program: None,
            };
            let outcome = vm::run(&config)?;
            finish(&outcome, args.host.metrics.as_ref())
        }
        Command::Restore(args) => {
            let config = RestoreConfig {
                dir: args.dir.clone(),
                serial: serial_out(&args.host.serial),
                profile: args.lwp.map(Into::into),
                snapshots: (&args.host).into(),
                seccomp: !args.host.no_seccomp,
                profiling: (&args.host).into(),
            };
            let outcome = vm::restore(&config)?;
            finish(&outcome, args.host.metrics.as_ref())
        }
        Command::Report(args) => report(out, &args),
        Command::Profile(args) => profile(out, &args),
        Command::Demo { lwp } => demo(out, lwp.into()),
        Command::Cpuid { lwp, guest, json } => {
            cpuid::print(out, lwp.into(), guest.into(), json)?;
            Ok(0)
        }
    }
}

fn report(out: &mut dyn Write, args: &ReportArgs) -> Result<u8, CliError> {
    use std::io::IsTerminal;
    let terminal = std::io::stderr().is_terminal();
    let (header, records) = trace::read(&args.trace, |n| {
        if terminal {
            eprint!("\rreading {}: {n} records", args.trace.display());
        }
    })?;
    if terminal && records.len() >= 100_000 {
        eprintln!();
    }
    let symbols = match &args.symbols {
        Some(path) => Some(Symbols::from_elf(&read("symbol file", path)?)?),
        None => None,
    };
    let event = args.event.or_else(|| report::default_event(&records));
    let rows = report::aggregate(&records, symbols.as_ref(), event);
    writeln!(
        out,
        "# trace {} (profile `{}`, sampler {} Hz)",
        args.trace.display(),
        header.profile,
        header.sample_hz
    )?;
    report::print_table(out, &rows, event, args.top)?;
    let folded = report::folded(&rows);
    if let Some(path) = &args.folded {
        std::fs::write(path, folded.join("\n") + "\n")?;
    }
    if let Some(path) = &args.svg {
        let title = format!("lwpvmm: {}", args.trace.display());
        report::flamegraph(&folded, &title, std::fs::File::create(path)?)?;
    }
    Ok(0)
}

/// Prints the report of a trace, named with `elf`'s symbols.
fn trace_report(
    out: &mut dyn Write,
    trace_file: &std::path::Path,
    elf: &[u8],
    top: usize,
) -> Result<(), CliError> {
    let (_, records) = trace::read(trace_file, |_| {})?;
    let symbols = Symbols::from_elf(elf).ok();
    let event = report::default_event(&records);
    let rows = report::aggregate(&records, symbols.as_ref(), event);
    report::print_table(out, &rows, event, top)?;
    Ok(())
}

fn profile(out: &mut dyn Write, args: &ProfileArgs) -> Result<u8, CliError> {
    let program = read("program", &args.program)?;
    let trace_file =
        std::env::temp_dir().join(format!("lwpvmm-profile-{}.trace", std::process::id()));
    let config = VmConfig {
        kernel: crate::guests::get("profile_host")
            .unwrap_or_default()
            .to_vec(),
        initramfs: None,
        cmdline: String::new(),
        memory_mib: args.memory,
        vcpus: 1,
        profile: args.lwp.into(),
        guest: GuestLwpSupport::Shim,
        serial: SerialOut::Stdout,
        snapshots: SnapshotPlan::default(),
        seccomp: true,
        profiling: Profiling {
            sample_hz: args.sample_hz,
            trace: Some(trace_file.clone()),
            metrics: None,
        },
        program: Some(program.clone()),
    };
    let outcome = vm::run(&config);
    let result = outcome.and_then(|o| {
        writeln!(
            out,
            "--- lwpvmm profile: {} (LWP profile `{}`, {} Hz)",
            args.program.display(),
            config.profile,
            args.sample_hz
        )
        .map_err(|e| VmError::Io("output", e))?;
        Ok(o)
    });
    let report = trace_report(out, &trace_file, &program, args.top);
    let _ = std::fs::remove_file(&trace_file);
    let outcome = result?;
    report?;
    Ok(match outcome.end {
        GuestEnd::ExitPort(0) => 0,
        end => exit_status(end),
    })
}

fn serial_out(arg: &str) -> SerialOut {
    match arg {
        "stdout" => SerialOut::Stdout,
        path => SerialOut::File(path.into()),
    }
}

fn finish(outcome: &RunOutcome, metrics: Option<&PathBuf>) -> Result<u8, CliError> {
    if let Some(path) = metrics {
        std::fs::write(path, serde_json::to_vec_pretty(&summary(outcome))?)?;
    }
    Ok(exit_status(outcome.end))
}

fn summary(outcome: &RunOutcome) -> serde_json::Value {
    let lwp: Vec<serde_json::Value> = outcome
        .lwp
        .iter()
        .map(|s| {
            serde_json::json!({
                "records_stored": s.records_stored,
                "records_missed": s.records_missed,
                "store_faults": s.store_faults,
                "flush_faults": s.flush_faults,
                "interrupts_due": s.interrupts_due,
                "interrupts_suppressed": s.interrupts_suppressed,
            })
        })
        .collect();
    serde_json::json!({
        "end": end_json(outcome.end),
        "vm": outcome.metrics,
        "lwp_units": lwp,
    })
}

fn end_json(end: GuestEnd) -> serde_json::Value {
    match end {
        GuestEnd::ExitPort(value) => serde_json::json!({ "exit_port": value }),
        GuestEnd::PowerOff => serde_json::json!("power_off"),
        GuestEnd::Reboot => serde_json::json!("reboot"),
    }
}

fn demo(out: &mut dyn Write, profile: LwpProfile) -> Result<u8, CliError> {
    let kernel = crate::guests::get("demo").unwrap_or_default().to_vec();
    let console = Arc::new(Mutex::new(Vec::new()));
    let trace_file = std::env::temp_dir().join(format!("lwpvmm-demo-{}.trace", std::process::id()));
    let config = VmConfig {
        kernel,
        initramfs: None,
        cmdline: String::new(),
        memory_mib: 64,
        vcpus: 1,
        profile,
        guest: GuestLwpSupport::Shim,
        serial: SerialOut::Capture(Arc::clone(&console)),
        snapshots: SnapshotPlan::default(),
        seccomp: true,
        profiling: Profiling {
            sample_hz: 1000,
            trace: Some(trace_file.clone()),
            metrics: None,
        },
        program: None,
    };
    let started = std::time::Instant::now();
    let outcome = vm::run(&config)?;
    let elapsed = started.elapsed();
    let text = console.lock().map(|c| c.clone()).unwrap_or_default();
    out.write_all(&text)?;
    let m = &outcome.metrics;
    let stats = outcome.lwp.first().copied().unwrap_or_default();
    writeln!(out, "---")?;
    writeln!(
        out,
        "lwpvmm demo: guest ended ({:?}) after {:.1} ms (LWP profile `{profile}`)",
        outcome.end,
        elapsed.as_secs_f64() * 1e3
    )?;
    writeln!(
        out,
        "  LWP instructions emulated through the #UD doorbell: {} (llwpcb {}, slwpcb {}, lwpins {}, lwpval {})",
        m["ud_handled"], m["llwpcb"], m["slwpcb"], m["lwpins"], m["lwpval"]
    )?;
    writeln!(
        out,
        "  records stored into the guest's ring: {}, missed: {}, LWP MSR exits: {}",
        stats.records_stored, stats.records_missed, m["exits_msr"]
    )?;
    writeln!(
        out,
        "  sampler kicks: {}, samples charged to CNH/RNH: {}",
        m["sampler_kicks"], m["samples_charged"]
    )?;
    writeln!(out, "host-side report from the trace (lwpvmm report):")?;
    trace_report(out, &trace_file, &config.kernel, 5)?;
    let _ = std::fs::remove_file(&trace_file);
    let ok = outcome.end == GuestEnd::ExitPort(0);
    writeln!(out, "  result: {}", if ok { "success" } else { "FAILURE" })?;
    Ok(if ok { 0 } else { 1 })
}
