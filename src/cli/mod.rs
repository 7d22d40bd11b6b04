//! The command line: argument parsing and the commands it dispatches to.

mod cpuid;

use std::io::Write;

use clap::{Parser, Subcommand, ValueEnum};
use thiserror::Error;

use crate::lwp::cpuid::{GuestLwpSupport, LwpProfile};

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
    /// Print the LWP-related CPUID leaves a guest gets for an LWP profile.
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
}

/// Runs a parsed command line, writing to `out`.
pub fn run(cli: Cli, out: &mut dyn Write) -> Result<(), CliError> {
    match cli.command {
        Command::Cpuid { lwp, guest, json } => cpuid::print(out, lwp.into(), guest.into(), json),
    }
}
