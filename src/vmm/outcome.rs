//! How a run ended, as the `Vmm` returns it and the metrics file records
//! it: why the VM stopped, its counters, each LWP unit's. Below the control
//! thread that decides it and the `Vmm` that returns it.

use serde::Serialize;

use crate::lwp::unit::UnitStats;
use crate::vmm::base::metrics::{METRICS_VERSION, VmCounters};
use crate::vmm::base::signals;
use crate::vmm::devices::port_bus::GuestEnd;

/// Why a VM stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmEnd {
    /// The guest ended it.
    Guest(GuestEnd),
    /// lwpvmm received this signal (SIGINT, SIGTERM) and stopped it.
    Signal(i32),
    /// A `VmmHandle` stopped it.
    Stopped,
}

impl std::fmt::Display for VmEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VmEnd::Guest(end) => end.fmt(f),
            VmEnd::Signal(signal) => {
                write!(f, "{} received", signals::name(*signal))
            }
            VmEnd::Stopped => f.write_str("stopped through the API or a VmmHandle"),
        }
    }
}

/// Exit status of `a run` when the guest asked for a reboot (lwpvmm
/// does not restart guests; a kernel that panics with `panic=-1` ends here).
pub const REBOOT_STATUS: u8 = 4;

/// Exit status of `a run` for how the VM ended: `(value << 1) | 1`
/// for a write of `value` to port 0xf4, exactly as QEMU's isa-debug-exit;
/// 0 for a power-off; [`REBOOT_STATUS`] for a reboot; 2 (a VMM error's)
/// for a console that could not be written; 128 + N when signal
/// N stopped it, as a shell reports a process a signal ended.
pub fn exit_status(end: VmEnd) -> u8 {
    match end {
        VmEnd::Guest(GuestEnd::ExitPort(value)) => (value << 1) | 1,
        VmEnd::Guest(GuestEnd::PowerOff) => 0,
        VmEnd::Guest(GuestEnd::Reboot) => REBOOT_STATUS,
        VmEnd::Guest(GuestEnd::OutputClosed) => 0,
        // A run that lost its console failed: the status of a VMM error
        // (the run's errors say which).
        VmEnd::Guest(GuestEnd::ConsoleFailed) => 2,
        VmEnd::Signal(signal) => 128u8.saturating_add(u8::try_from(signal).unwrap_or(0)),
        VmEnd::Stopped => 0,
    }
}

/// What a command says of how the VM ended, when the status alone would
/// not say it: a signal, its standard output closed, or a reboot (which a
/// panicking Linux also asks for, and which would otherwise end the run
/// with status 4 and no word from lwpvmm after the guest's last line).
pub fn end_line(end: VmEnd) -> Option<String> {
    match end {
        VmEnd::Guest(GuestEnd::Reboot) => Some(format!(
            "the guest reset the machine: a reboot, or a kernel panic (Linux resets on panic=-1, which lwpvmm's default command line sets; the console's last lines say which); lwpvmm does not restart guests: exit status {REBOOT_STATUS}"
        )),
        VmEnd::Signal(signal) => Some(format!(
            "{} received: the VM was stopped; console, trace and metrics are written",
            signals::name(signal)
        )),
        VmEnd::Guest(GuestEnd::OutputClosed) => Some(
            "standard output was closed: the VM was stopped; trace and metrics are written".into(),
        ),
        _ => None,
    }
}

/// How a VM ended.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// Why it stopped.
    pub end: VmEnd,
    /// The counters.
    pub metrics: VmCounters,
    /// Each vCPU's LWP unit counters.
    pub lwp: Vec<UnitStats>,
    /// What failed on the way without stopping the VM (a requested
    /// snapshot, a metrics write): the caller should report it and fail.
    pub errors: Vec<String>,
}

/// The metrics file's document: how the run ended (`null` while it runs),
/// the VM's counters, and each LWP unit's.
#[derive(Debug, Serialize)]
pub struct MetricsDocument<'a> {
    /// The document's shape ([`METRICS_VERSION`]).
    version: u32,
    end: Option<serde_json::Value>,
    /// Why the run failed, when it ended on a VMM error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    vm: &'a VmCounters,
    lwp_units: &'a [UnitStats],
}

/// The metrics document for `end`.
pub fn metrics_document<'a>(
    end: Option<VmEnd>,
    vm: &'a VmCounters,
    lwp_units: &'a [UnitStats],
) -> MetricsDocument<'a> {
    let end = end.map(|end| match end {
        VmEnd::Guest(GuestEnd::ExitPort(value)) => serde_json::json!({ "exit_port": value }),
        VmEnd::Guest(GuestEnd::PowerOff) => serde_json::json!("power_off"),
        VmEnd::Guest(GuestEnd::Reboot) => serde_json::json!("reboot"),
        VmEnd::Guest(GuestEnd::OutputClosed) => serde_json::json!("output_closed"),
        VmEnd::Guest(GuestEnd::ConsoleFailed) => serde_json::json!("console_failed"),
        VmEnd::Signal(signal) => serde_json::json!({ "signal": signal }),
        VmEnd::Stopped => serde_json::json!("stopped"),
    });
    MetricsDocument {
        version: METRICS_VERSION,
        end,
        error: None,
        vm,
        lwp_units,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_lines_say_what_the_status_does_not() {
        // (how the VM ended, what its line says, or None for no line)
        let table = [
            (
                VmEnd::Guest(GuestEnd::Reboot),
                Some("kernel panic (Linux resets on panic=-1"),
            ),
            (VmEnd::Guest(GuestEnd::Reboot), Some("exit status 4")),
            (VmEnd::Signal(15), Some("SIGTERM received")),
            (
                VmEnd::Guest(GuestEnd::OutputClosed),
                Some("standard output was closed"),
            ),
            (VmEnd::Guest(GuestEnd::PowerOff), None),
            (VmEnd::Guest(GuestEnd::ExitPort(3)), None),
            (VmEnd::Stopped, None),
        ];
        for (end, want) in table {
            let line = end_line(end);
            match want {
                Some(text) => assert!(
                    line.as_deref().is_some_and(|l| l.contains(text)),
                    "{end:?}: {line:?} lacks {text:?}"
                ),
                None => assert_eq!(line, None, "{end:?}"),
            }
        }
    }
}
