//! `firecracker ...` (lwpvmm under that name) and `lwpvmm firecracker ...`:
//! the process an orchestrator starts. It serves Firecracker's API on the
//! socket, or with `--config-file` boots at once; the main thread waits
//! for what the API asks of it ([`Launch`]), builds the VM, runs it to its
//! end, and exits as `lwpvmm run` does.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{RecvTimeoutError, channel};
use std::time::Duration;

use thiserror::Error;

use super::args::{Args, ArgsError};
use super::frontend::{DEFAULT_LOG_LEVEL, FirecrackerApi, set_level};
use super::launch::{self, HostSettings, Launch, LaunchError};
use super::model::{API_VERSION, FullConfig, Metrics};
use super::setup::{Setup, SetupError};
use crate::vmm::api::{ApiConfig, ApiError, ApiListeners, ApiPhase};
use crate::vmm::config::{self, SeccompMode, SnapshotError};
use crate::vmm::{RunOutcome, VmError, Vmm};

/// The most bytes of a `--config-file`.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Why the process could not serve or run the VM.
#[derive(Debug, Error)]
pub enum RunError {
    /// A bad command line.
    #[error("{0}")]
    Args(#[from] ArgsError),
    /// The config file cannot be read.
    #[error("--config-file {path}: {why}")]
    ConfigFile {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// The config file asks what cannot be.
    #[error("--config-file: {0}")]
    Setup(#[from] SetupError),
    /// The API could not start.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// The VM could not be built.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// The VM failed.
    #[error(transparent)]
    Vm(#[from] VmError),
    /// `--describe-snapshot`.
    #[error("--describe-snapshot: {0}")]
    Snapshot(#[from] SnapshotError),
    /// Writing to standard output failed.
    #[error("cannot write output: {0}")]
    Output(#[from] std::io::Error),
    /// Signals could not be registered.
    #[error("cannot register SIGINT and SIGTERM: {0}")]
    Signals(std::io::Error),
    /// The API thread went away before a VM started.
    #[error("the API thread stopped before the microVM started")]
    ApiGone,
}

/// Reads a config file: bounded, a regular file, not followed through a
/// symbolic link.
fn read_config(path: &Path) -> Result<FullConfig, RunError> {
    let err = |why: String| RunError::ConfigFile {
        path: path.to_owned(),
        why,
    };
    let bytes = crate::hostfs::read_input(path, MAX_CONFIG_BYTES, "a config file's limit")
        .map_err(|e| err(e.to_string()))?;
    serde_json::from_slice(&bytes).map_err(|e| err(e.to_string()))
}

/// Runs Firecracker's command line `args` (after the program's name);
/// returns the exit status.
pub fn main(args: &[String], out: &mut dyn Write) -> Result<u8, RunError> {
    let args = Args::parse(args)?;
    if args.help {
        write!(out, "{}", super::args::USAGE)?;
        return Ok(0);
    }
    if args.version {
        writeln!(
            out,
            "Firecracker v{API_VERSION} (lwpvmm {}: Firecracker's API and command line over lwpvmm)",
            env!("CARGO_PKG_VERSION")
        )?;
        return Ok(0);
    }
    if let Some(path) = &args.describe_snapshot {
        let dir = if path.file_name() == Some(config::STATE_FILE.as_ref()) {
            path.parent().unwrap_or(Path::new(".")).to_owned()
        } else {
            path.clone()
        };
        let state = config::read_state(&dir)?;
        writeln!(
            out,
            "lwpvmm snapshot format {}, written by lwpvmm {}",
            config::FORMAT_VERSION,
            state.lwpvmm_version
        )?;
        return Ok(0);
    }
    if let Some(path) = &args.log_path {
        crate::log_sink::redirect(launch::open_log(path)?);
    }
    // A log file without a level logs at Firecracker's default, Info.
    let default = args.log_path.as_ref().map(|_| DEFAULT_LOG_LEVEL);
    set_level(args.level.as_deref().or(default));
    if args.enable_pci {
        // Taken so that a client that always passes it (microheart) starts
        // lwpvmm; its guest then finds its devices on virtio-mmio,
        // Firecracker's default transport, which its guest kernels have.
        log::warn!(
            "--enable-pci: lwpvmm has no PCI transport; the microVM's devices are on virtio-mmio, as without the option"
        );
    }
    let mut setup = match &args.config_file {
        Some(path) => {
            let setup = Setup::from_file(read_config(path)?)?;
            if let Some(log_path) = setup.logger.as_ref().and_then(|l| l.log_path.as_ref()) {
                crate::log_sink::redirect(launch::open_log(Path::new(log_path))?);
            }
            if let Some(logger) = &setup.logger {
                let level = logger.level.as_deref().or(args.level.as_deref());
                set_level(Some(level.unwrap_or(DEFAULT_LOG_LEVEL)));
            }
            setup
        }
        None => Setup::default(),
    };
    if let Some(path) = &args.metrics_path {
        setup.metrics(Metrics {
            metrics_path: path.display().to_string(),
            emit_id: None,
            properties: None,
        })?;
    }
    let settings = HostSettings {
        seccomp: if args.no_seccomp {
            SeccompMode::Off
        } else {
            SeccompMode::On
        },
    };
    let Some(sock) = args.api_sock.clone() else {
        let (vmm, _) = launch::boot(&setup, settings)?;
        return finish(vmm.run()?);
    };
    let listeners = ApiListeners::bind(&ApiConfig {
        sock: Some(sock),
        ..ApiConfig::default()
    })?
    .ok_or(RunError::ApiGone)?
    .max_body(args.max_payload);
    let (launcher, launches) = channel();
    let api = FirecrackerApi::new(setup.clone(), args.id.clone(), launcher);
    if args.config_file.is_some() {
        let (vmm, started) = launch::boot(&setup, settings)?;
        let phase = ApiPhase::Running {
            started,
            frontend: Some(Box::new(api)),
        };
        let thread = listeners.start(phase, settings.seccomp)?;
        let outcome = vmm.run();
        thread.finish();
        return finish(outcome?);
    }
    let thread = listeners.start(ApiPhase::Before(Box::new(api)), settings.seccomp)?;
    // Before the start a signal ends the process at once, as Firecracker
    // ends; the socket is removed first.
    let signals = [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM]
        .map(|signal| (signal, Arc::new(AtomicBool::new(false))));
    for (signal, flag) in &signals {
        signal_hook::flag::register(*signal, Arc::clone(flag)).map_err(RunError::Signals)?;
    }
    let vmm: Vmm = loop {
        if let Some((signal, _)) = signals.iter().find(|(_, f)| f.load(Ordering::Acquire)) {
            thread.finish();
            let _ = writeln!(
                std::io::stderr(),
                "lwpvmm: {} received before the microVM started",
                crate::vmm::signal_name(*signal)
            );
            return Ok(128u8.saturating_add(u8::try_from(*signal).unwrap_or(0)));
        }
        let launch = match launches.recv_timeout(Duration::from_millis(100)) {
            Ok(l) => l,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => {
                thread.finish();
                return Err(RunError::ApiGone);
            }
        };
        match launch {
            Launch::Boot(setup, reply) => match launch::boot(&setup, settings) {
                Ok((vmm, started)) => {
                    let _ = reply.send(Ok(started));
                    break vmm;
                }
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            Launch::Load(plan, setup, reply) => match launch::load(&plan, &setup, settings) {
                Ok((vmm, started)) => {
                    let _ = reply.send(Ok(started));
                    break vmm;
                }
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            Launch::Logger(path, reply) => {
                let _ = reply.send(launch::open_log(&path).map(crate::log_sink::redirect));
            }
        }
    };
    let outcome = vmm.run();
    thread.finish();
    finish(outcome?)
}

/// The exit status of a finished run, as `lwpvmm run` gives it, and its
/// line when a signal stopped it.
fn finish(outcome: RunOutcome) -> Result<u8, RunError> {
    if let Some(line) = crate::vmm::end_line(outcome.end) {
        let _ = writeln!(std::io::stderr(), "lwpvmm: {line}");
    }
    for e in &outcome.errors {
        log::error!("{e}");
    }
    Ok(crate::vmm::exit_status(outcome.end))
}
