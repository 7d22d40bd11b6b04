//! The lwpvmm binary: parses the command line and runs the command.

use std::process::ExitCode;

use clap::Parser;

use lwpvmm::cli::{Cli, run};

/// The exit status for a VMM error: even, so it never looks like an
/// isa-debug-exit status, which is always odd.
const ERROR_STATUS: u8 = 2;

fn main() -> ExitCode {
    // Warnings (rate limited where a guest can trigger them) go to stderr;
    // RUST_LOG raises or lowers the level.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    // Not locked for the whole run: the guest's serial console writes to
    // stdout from the vCPU threads meanwhile.
    match run(cli, &mut std::io::stdout()) {
        Ok(status) => ExitCode::from(status),
        Err(e) => {
            eprintln!("lwpvmm: {e}");
            ExitCode::from(ERROR_STATUS)
        }
    }
}
