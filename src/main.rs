//! The lwpvmm binary: sets up logging, parses the command line and runs the
//! command.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use clap::Parser;

use lwpvmm::cli::{Cli, run};

/// The exit status for a VMM error: even, so it never looks like an
/// isa-debug-exit status, which is always odd.
const ERROR_STATUS: u8 = 2;

/// Log lines go to stderr. Whether to colour them is decided here, once: the
/// logger's default asks the terminal on every line, a system call the
/// seccomp filters of lwpvmm's threads rightly do not allow. `RUST_LOG`
/// sets the level (default: warnings), `RUST_LOG_STYLE` (`auto`, `always`,
/// `never`) the colours, and `NO_COLOR` turns them off. The virtio-queue
/// crate's own log lines are off whatever `RUST_LOG` says: a guest triggers
/// them (a bad ring address, a descriptor index past the queue) and the
/// crate does not limit them; lwpvmm counts those events (`device_errors`)
/// and logs a device's failure itself, rate-limited.
///
/// Under Firecracker's command line the level is `--level` or `PUT /logger`'s,
/// set at run time, so the logger passes every level and the global maximum
/// (warnings until then) decides.
fn init_logging(firecracker: bool) {
    let colour = match std::env::var("RUST_LOG_STYLE").as_deref() {
        Ok("always") => true,
        Ok("never") => false,
        _ => std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
    };
    let runtime_level = firecracker && std::env::var_os("RUST_LOG").is_none();
    env_logger::Builder::from_env(
        env_logger::Env::default().default_filter_or(if runtime_level { "trace" } else { "warn" }),
    )
    .write_style(if colour {
        env_logger::WriteStyle::Always
    } else {
        env_logger::WriteStyle::Never
    })
    .target(env_logger::Target::Pipe(Box::new(lwpvmm::log_sink::Sink)))
    .filter_module("virtio_queue", log::LevelFilter::Off)
    .init();
    if runtime_level {
        log::set_max_level(log::LevelFilter::Warn);
    }
}

/// Whether lwpvmm runs under the name `firecracker` (a symlink or a copy):
/// then its arguments are Firecracker's.
fn as_firecracker() -> bool {
    std::env::args_os()
        .next()
        .map(std::path::PathBuf::from)
        .is_some_and(|p| p.file_name() == Some("firecracker".as_ref()))
}

fn main() -> ExitCode {
    let firecracker = as_firecracker();
    init_logging(
        firecracker
            || std::env::args_os()
                .nth(1)
                .is_some_and(|a| a == "firecracker"),
    );
    let cli = if firecracker {
        Cli {
            command: lwpvmm::cli::Command::Firecracker {
                args: std::env::args_os()
                    .skip(1)
                    .map(|a| a.to_string_lossy().into_owned())
                    .collect(),
            },
        }
    } else {
        Cli::parse()
    };
    // Not locked for the whole run: the guest's serial console writes to
    // stdout from the vCPU threads meanwhile.
    match run(cli, &mut std::io::stdout()) {
        Ok(status) => ExitCode::from(status),
        // The reader of our output went away (`lwpvmm cpuid | head -1`):
        // that is the end of the output, not an error.
        Err(lwpvmm::cli::CliError::Output(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            ExitCode::SUCCESS
        }
        Err(e) => {
            // A closed terminal must not turn an error into a panic.
            let _ = writeln!(std::io::stderr(), "lwpvmm: {e}");
            ExitCode::from(ERROR_STATUS)
        }
    }
}
