//! Counters of what the VM did, one set per vCPU, printed as JSON (totals
//! and per vCPU) at the end of a run and on SIGUSR1. Guest-triggered
//! warnings are counted here even when the rate limiter keeps them out of
//! the log.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::lwp::fault::{GuestFault, PF_PRESENT, PF_RESERVED};

macro_rules! metrics {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Counters of one VM.
        #[derive(Debug, Default)]
        pub struct Metrics {
            $($(#[$doc])* pub $name: AtomicU64,)*
        }

        impl Metrics {
            /// Every counter, by name.
            pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name.load(Ordering::Relaxed)),)*]
            }
        }
    };
}

metrics! {
    /// Port-I/O exits.
    exits_io,
    /// MSR exits (LWP_CFG, LWP_CBADDR).
    exits_msr,
    /// WRMSRs refused with #GP.
    msr_gp,
    /// #UD doorbells rung.
    ud_doorbells,
    /// Doorbells whose LWP instruction was emulated.
    ud_handled,
    /// Doorbells answered "not LWP" (the guest's own #UD path ran).
    ud_not_lwp,
    /// Doorbells whose LWP instruction raised a fault.
    ud_faults,
    /// LWP instructions emulated after a CPL0 emulation failure.
    cpl0_lwp,
    /// FWAITs at CPL0 that KVM's emulator failed on, skipped.
    cpl0_fwait,
    /// LLWPCB executed.
    llwpcb,
    /// SLWPCB executed.
    slwpcb,
    /// LWPINS executed.
    lwpins,
    /// LWPVAL executed.
    lwpval,
    /// LWP state calls (component-62 save/restore).
    lwp_state_calls,
    /// Threshold interrupts injected.
    lwp_interrupts,
    /// Threshold interrupts on exception vectors, not injected.
    lwp_interrupts_suppressed,
    /// Accesses to ports no device claims.
    unclaimed_ports,
    /// Other guest-triggered warnings.
    guest_warnings,
    /// Snapshots written.
    snapshots,
    /// Records the vCPU's LWP unit stored into guest rings.
    records_stored,
    /// Records it counted in MissedEvents instead.
    records_missed,
    /// Single steps for precise IRE/BRE.
    steps,
    /// 1 when precise events use KVM's single-step (guest debug).
    step_backend_guest_debug,
    /// 1 when precise events use the trap flag and the #DB doorbell.
    step_backend_trap_flag,
    /// Sampling kicks handled by vCPUs.
    sampler_kicks,
    /// Samples charged to CNH/RNH (CPL3, in the LWPCB's address space).
    samples_charged,
    /// Trace writes that failed.
    trace_errors,
    /// Records not written to the trace because it reached its size limit.
    trace_dropped,
    /// LWP instructions and state calls refused with #PF, page not present.
    denied_not_present,
    /// ... with #PF, a protection check (user/supervisor, read-only, NX).
    denied_protection,
    /// ... with #PF, a reserved bit in a paging entry.
    denied_reserved_bit,
    /// ... with #GP(0) (non-canonical, wrapping, not RAM, invalid block).
    denied_gp,
}

impl Metrics {
    /// The counters as a JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        to_object(self.snapshot())
    }

    /// Counts a fault an LWP instruction or state call raised, by the check
    /// that refused it.
    pub fn count_denial(&self, fault: GuestFault) {
        let counter = match fault {
            GuestFault::PageFault { error_code, .. } if error_code & PF_RESERVED != 0 => {
                &self.denied_reserved_bit
            }
            GuestFault::PageFault { error_code, .. } if error_code & PF_PRESENT != 0 => {
                &self.denied_protection
            }
            GuestFault::PageFault { .. } => &self.denied_not_present,
            GuestFault::GeneralProtection | GuestFault::InvalidOpcode => &self.denied_gp,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

fn to_object(pairs: Vec<(&'static str, u64)>) -> serde_json::Value {
    serde_json::Value::Object(
        pairs
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.into()))
            .collect(),
    )
}

/// The VM's counters: the sum over its vCPUs, then each vCPU's own.
pub fn vm_json(vcpus: &[std::sync::Arc<Metrics>]) -> serde_json::Value {
    let per: Vec<Vec<(&'static str, u64)>> = vcpus.iter().map(|m| m.snapshot()).collect();
    let total = per.first().map_or_else(Vec::new, |first| {
        first
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (*k, per.iter().map(|p| p[i].1).sum()))
            .collect()
    });
    let mut out = to_object(total);
    if let serde_json::Value::Object(map) = &mut out {
        map.insert(
            "vcpus".into(),
            serde_json::Value::Array(per.into_iter().map(to_object).collect()),
        );
    }
    out
}
