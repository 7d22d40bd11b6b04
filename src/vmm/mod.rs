//! The KVM shell around the pure core. A [`Vmm`] owns a machine for its
//! whole life: the builder makes one (booted, or restored from a snapshot),
//! `run` runs it, a [`VmmHandle`] drives it. Below it: the machine (KVM,
//! memory, irqchip, vCPUs with their CPUID), the vCPU threads and their exit
//! handling, the control thread, the paravirtual ABI, devices, boot,
//! snapshots, metrics and the host-side hardening.

pub mod api;
pub mod base;
pub mod boot;
pub mod builder;
pub mod config;
pub mod control;
mod control_events;
#[cfg(test)]
mod control_tests;
pub mod devices;
pub mod error;
pub mod machine;
pub mod outcome;
pub mod output;
pub mod snapshot;
pub mod vcpu;
#[allow(clippy::module_inception)]
pub mod vmm;

pub use base::request::{SnapshotInfo, VmmHandle};
pub use base::signals::name as signal_name;
pub use builder::{build_for_boot, build_from_snapshot};
pub use config::{HostConfig, Profiling, RestoreConfig, SnapshotPlan, VmConfig};
pub use error::VmError;
pub use machine::cpuid_table;
pub use outcome::{REBOOT_STATUS, RunOutcome, VmEnd, end_line, exit_status};
pub use output::{OutputError, OutputKind};
pub use vmm::Vmm;

/// Boots `config.kernel` and runs the VM to its end.
pub fn run(config: &VmConfig) -> Result<RunOutcome, VmError> {
    build_for_boot(config)?.run()
}

/// Restores the snapshot of `config.dir` and runs the VM to its end. The
/// guest's RAM maps the memory file: if the file shrank while the VM ran
/// (another program truncated it), that is the error, whatever the guest
/// made of the pages it lost. (A file removed or renamed over is no harm:
/// the mapping keeps the inode it mapped.)
pub fn restore(config: &RestoreConfig) -> Result<RunOutcome, VmError> {
    restore_with(config, Vmm::run)
}

/// [`restore`], with `run` running the restored VM (a front end's, which
/// serves its API around the run).
pub fn restore_with(
    config: &RestoreConfig,
    run: impl FnOnce(Vmm) -> Result<RunOutcome, VmError>,
) -> Result<RunOutcome, VmError> {
    let memory = config.dir.join(snapshot::MEMORY_FILE);
    let before = std::fs::metadata(&memory).map(|m| m.len()).ok();
    let outcome = run(build_from_snapshot(config)?);
    let after = std::fs::metadata(&memory).map(|m| m.len()).ok();
    match (before, after) {
        (Some(b), Some(a)) if a < b => Err(snapshot::SnapshotError::Memory(format!(
            "{} was truncated while the VM ran ({b} bytes at the start, {a} now): the guest lost the pages it had not touched yet, so the run is not valid",
            memory.display()
        ))
        .into()),
        _ => outcome,
    }
}
