//! The lwpvmm binary: parses the command line and runs the command.

use std::process::ExitCode;

use clap::Parser;

use lwpvmm::cli::{Cli, run};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let stdout = std::io::stdout();
    match run(cli, &mut stdout.lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lwpvmm: {e}");
            ExitCode::FAILURE
        }
    }
}
