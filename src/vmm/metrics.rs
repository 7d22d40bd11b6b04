//! Counters of what the VM did, shared by the vCPU threads and printed as
//! JSON at the end of a run. Guest-triggered warnings are counted here even
//! when the rate limiter keeps them out of the log.

use std::sync::atomic::{AtomicU64, Ordering};

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
    /// Sampling kicks handled by vCPUs.
    sampler_kicks,
    /// Samples charged to CNH/RNH (CPL3, in the LWPCB's address space).
    samples_charged,
    /// Trace writes that failed.
    trace_errors,
}

impl Metrics {
    /// The counters as a JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::Value::Object(
            self.snapshot()
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.into()))
                .collect(),
        )
    }
}
