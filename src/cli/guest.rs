//! The commands that run one of lwpvmm's own guests: `lwpvmm demo` (the
//! embedded demo guest) and `lwpvmm profile` (a user's program as the CPL3
//! task of the profile host guest), each followed by the host-side report
//! of its trace.

use std::io::Write;
use std::sync::{Arc, Mutex};

use crate::lwp::cpuid::{GuestLwpSupport, LwpProfile};
use crate::vmm::config::{GuestEnd, SeccompMode, SerialOut};
use crate::vmm::{self, HostConfig, Profiling, VmConfig, VmEnd};

use super::report::trace_report;
use super::{CliError, MAX_NAMED_FILE, ProfileArgs, exit_status, finish, read};
use crate::hostfs::TempDir;

/// Traces of lwpvmm's own guests are small; the limit only guards the disk.
const GUEST_TRACE_MAX: u64 = 256 << 20;

/// A config for one of lwpvmm's own guests, traced to `trace`.
fn guest_config(
    kernel: Vec<u8>,
    profile: LwpProfile,
    memory_mib: u64,
    serial: SerialOut,
    sample_hz: u32,
    trace: std::path::PathBuf,
) -> VmConfig {
    VmConfig {
        kernel,
        memory_mib,
        profile,
        guest: GuestLwpSupport::Shim,
        host: HostConfig {
            serial,
            seccomp: SeccompMode::On,
            stop_on_signals: true,
            profiling: Profiling {
                sample_hz,
                trace: Some(trace),
                trace_max: GUEST_TRACE_MAX,
                metrics: None,
                ..Profiling::default()
            },
            ..HostConfig::default()
        },
        ..VmConfig::default()
    }
}

/// What the profile host's exit value means (its runtime ends the VM with
/// `0x80 | vector` on an exception the program did not expect).
fn explain_exit(value: u8) -> String {
    let vector = value & 0x7f;
    let name = match vector {
        0 => "a divide error (#DE)",
        3 => "a breakpoint (#BP)",
        6 => "an invalid opcode (#UD)",
        13 => "a general-protection fault (#GP)",
        14 => "a page fault (#PF)",
        _ => "an exception",
    };
    if value & 0x80 != 0 {
        format!(
            "the program raised {name}, vector {vector}, and the guest runtime stopped it (is it a freestanding program built like resources/examples/hot.c?)"
        )
    } else {
        format!("the program ended the VM with exit value {value}")
    }
}

/// `lwpvmm profile`.
pub fn profile(out: &mut dyn Write, args: &ProfileArgs) -> Result<u8, CliError> {
    let program = read(
        "program",
        &args.program,
        MAX_NAMED_FILE,
        "the most read of a program",
    )?;
    let scratch = TempDir::new("lwpvmm-profile").map_err(|source| CliError::Read {
        what: "a temporary directory",
        source,
    })?;
    let trace_file = scratch.path().join("profile.trace");
    let mut config = guest_config(
        crate::guests::get("profile_host")
            .unwrap_or_default()
            .to_vec(),
        args.lwp.into(),
        args.memory,
        SerialOut::Stdout,
        args.sample_hz,
        trace_file.clone(),
    );
    config.program = Some(program.clone());
    let outcome = vmm::run(&config);
    let result = outcome.map_err(CliError::from).and_then(|o| {
        writeln!(
            out,
            "--- lwpvmm profile: {} (LWP profile `{}`, {} Hz)",
            args.program.display(),
            config.profile,
            args.sample_hz
        )?;
        Ok(o)
    });
    let report = result
        .is_ok()
        .then(|| trace_report(out, &trace_file, &program, args.top));
    drop(scratch);
    let outcome = result?;
    report.transpose()?;
    match outcome.end {
        VmEnd::Guest(GuestEnd::ExitPort(0)) => finish(outcome).map(|_| 0),
        VmEnd::Guest(GuestEnd::ExitPort(value)) => {
            eprintln!("lwpvmm profile: {}", explain_exit(value));
            Ok(exit_status(outcome.end))
        }
        _ => finish(outcome),
    }
}

/// `lwpvmm demo`.
pub fn demo(out: &mut dyn Write, profile: LwpProfile) -> Result<u8, CliError> {
    let console = Arc::new(Mutex::new(Vec::new()));
    let scratch = TempDir::new("lwpvmm-demo").map_err(|source| CliError::Read {
        what: "a temporary directory",
        source,
    })?;
    let trace_file = scratch.path().join("demo.trace");
    let config = guest_config(
        crate::guests::get("demo").unwrap_or_default().to_vec(),
        profile,
        64,
        SerialOut::Capture(Arc::clone(&console)),
        1000,
        trace_file.clone(),
    );
    let started = std::time::Instant::now();
    let outcome = vmm::run(&config)?;
    let elapsed = started.elapsed();
    let text = console.lock().map(|c| c.clone()).unwrap_or_default();
    out.write_all(&text)?;
    let m = &outcome.metrics.total;
    let stats = outcome.lwp.first().copied().unwrap_or_default();
    writeln!(out, "---")?;
    writeln!(
        out,
        "lwpvmm demo: the VM ended ({}) after {:.1} ms (LWP profile `{profile}`)",
        outcome.end,
        elapsed.as_secs_f64() * 1e3
    )?;
    writeln!(
        out,
        "  LWP instructions emulated through the #UD doorbell: {} (llwpcb {}, slwpcb {}, lwpins {}, lwpval {})",
        m.ud_handled, m.llwpcb, m.slwpcb, m.lwpins, m.lwpval
    )?;
    writeln!(
        out,
        "  records stored into the guest's ring: {}, missed: {}, LWP MSR exits: {}",
        stats.records_stored, stats.records_missed, m.exits_msr
    )?;
    writeln!(
        out,
        "  sampler kicks: {}, samples charged to CNH/RNH: {}",
        m.sampler_kicks, m.samples_charged
    )?;
    writeln!(out, "host-side report from the trace (lwpvmm report):")?;
    trace_report(out, &trace_file, &config.kernel, 5)?;
    if let VmEnd::Signal(_) = outcome.end {
        return finish(outcome);
    }
    let ok = outcome.end == VmEnd::Guest(GuestEnd::ExitPort(0));
    writeln!(out, "  result: {}", if ok { "success" } else { "FAILURE" })?;
    Ok(if ok { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_values_are_explained() {
        // (exit value, words the explanation must hold)
        let table = [
            (0x8d, "general-protection fault (#GP), vector 13"),
            (0x8e, "page fault (#PF), vector 14"),
            (0x86, "invalid opcode (#UD), vector 6"),
            (3, "exit value 3"),
        ];
        for (value, want) in table {
            let text = explain_exit(value);
            assert!(text.contains(want), "{value:#x}: {text}");
        }
    }
}
