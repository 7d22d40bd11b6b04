//! Counters by owner, read as typed, serializable snapshots: each vCPU's
//! ([`VcpuMetrics`]), each virtio device's ([`DeviceMetrics`]) and the VM's
//! own ([`VmMetrics`]), each set with its names, values and help generated
//! from one declaration; a VM's figures are their totals
//! ([`VmCounters`]), rendered as the metrics file's JSON and as Prometheus
//! text. Guest-triggered warnings are counted here even when the rate
//! limiter keeps them out of the log.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use crate::lwp::fault::{GuestFault, PF_PRESENT, PF_RESERVED};

macro_rules! counters {
    (
        $(#[doc = $ldoc:literal])* $live:ident,
        $(#[doc = $vdoc:literal])* $values:ident,
        $help:ident,
        { $($(#[doc = $doc:literal])* $name:ident),* $(,)? }
    ) => {
        $(#[doc = $ldoc])*
        #[derive(Debug, Default)]
        pub struct $live {
            $($(#[doc = $doc])* pub $name: AtomicU64,)*
        }

        $(#[doc = $vdoc])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
        pub struct $values {
            $($(#[doc = $doc])* pub $name: u64,)*
        }

        /// Each counter's name and its documentation, for Prometheus's
        /// `# HELP` lines.
        const $help: &[(&str, &str)] = &[$((stringify!($name), concat!($($doc),*)),)*];

        impl $live {
            /// The values now.
            pub fn counters(&self) -> $values {
                $values { $($name: self.$name.load(Ordering::Relaxed),)* }
            }
        }

        impl $values {
            /// Adds `other`'s counts to these: a sum over owners.
            pub fn add(&mut self, other: &$values) {
                $(self.$name += other.$name;)*
            }

            /// Each counter's name and value, in the order they are
            /// declared (the metrics file's, and Prometheus's).
            pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
                [$((stringify!($name), self.$name)),*].into_iter()
            }
        }
    };
}

counters! {
    /// One vCPU's live counters, updated by its thread.
    VcpuMetrics,
    /// A vCPU's counters at one moment (or their sums over a VM's vCPUs).
    Counters,
    VCPU_HELP,
    {
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
    /// Faults not injected because KVM already had an event in flight: the
    /// instruction restarts after that event and faults again.
    fault_restarts,
    /// LWP instructions emulated after a CPL0 emulation failure.
    cpl0_lwp,
    /// FWAITs at CPL0 that KVM's emulator failed on, skipped.
    cpl0_fwait,
    /// INT3s at CPL0 that KVM's emulator failed on, delivered as #BP.
    cpl0_int3,
    /// LDMXCSR and STMXCSR at CPL0 that KVM's emulator failed on, carried
    /// out by lwpvmm.
    cpl0_mxcsr,
    /// VERR and VERW at CPL0 that KVM's emulator failed on, carried out.
    cpl0_verw,
    /// CMPXCHG16B at CPL0 that KVM's emulator failed on, carried out.
    cpl0_cmpxchg16b,
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
    /// MMIO exits (virtio registers; queue notifications do not exit).
    exits_mmio,
    /// Records the vCPU's LWP unit stored into guest rings.
    records_stored,
    /// Records it counted in MissedEvents instead.
    records_missed,
    /// Single steps for precise IRE/BRE.
    steps,
    /// Nanoseconds vCPU threads spent on the exits that took a step,
    /// between KVM_RUN's return and the next entry: decoding, counting,
    /// the guard's walks for the ring, the trace.
    step_ns,
    /// 1 when precise events use KVM's single-step (guest debug).
    step_backend_guest_debug,
    /// 1 when precise events use the trap flag and the #DB doorbell.
    step_backend_trap_flag,
    /// Sampling kicks handled by vCPUs.
    sampler_kicks,
    /// Samples charged to CNH/RNH (CPL3, in the LWPCB's address space).
    samples_charged,
    /// Cycles of vCPU time between kicks charged to no CPL3 sample: the
    /// intervals of kicks that found the guest elsewhere (its kernel, the
    /// VMM on its behalf), and the part of an interval past one sampling
    /// period, which is where a CPL3 sample's own time cannot have been.
    sampler_cycles_dropped,
    /// Host-side samples of the whole guest taken in its kernel
    /// (`--profile-kernel`).
    guest_kernel_samples,
    /// Host-side samples of the whole guest taken in its processes.
    guest_user_samples,
    /// Nanoseconds vCPU threads spent on sampling kicks between KVM_RUN's
    /// return and the next entry: the charge, the stack, the trace.
    sampler_ns,
    /// Stops at the guest kernel's #PF handler (the SYSCALL quirk's
    /// breakpoint): one per guest page fault while the fixup is on.
    pf_entry_stops,
    /// SYSCALLs kvm_pvm left at CPL3 that lwpvmm completed.
    syscalls_completed,
    /// Trace writes that failed.
    trace_errors,
    /// Records not written to the trace because it reached its size limit.
    trace_dropped,
    /// LWP instructions and state calls refused with #PF, page not present.
    denied_not_present,
    /// LWP instructions and state calls refused with #PF, a protection
    /// check (user/supervisor, read-only, NX, protection key).
    denied_protection,
    /// LWP instructions and state calls refused with #PF, a reserved bit
    /// in a paging entry.
    denied_reserved_bit,
    /// LWP instructions and state calls refused with #GP(0)
    /// (non-canonical, wrapping, not RAM, invalid block).
    denied_gp,
    }
}

counters! {
    /// One virtio device's live counters, updated by the device thread.
    DeviceMetrics,
    /// A device's counters at one moment (or their sums over a VM's
    /// devices).
    DeviceCounters,
    DEVICE_HELP,
    {
    /// virtio block reads completed.
    disk_reads,
    /// virtio block writes completed.
    disk_writes,
    /// virtio block flushes completed (counted once fdatasync returned).
    disk_flushes,
    /// Frames the network devices handed to the guest.
    net_rx_frames,
    /// Frames the network devices took from the guest.
    net_tx_frames,
    /// Frames for the guest dropped: a receive buffer too small.
    net_rx_dropped,
    /// Frames from the guest dropped: a tap that refused one.
    net_tx_dropped,
    /// vsock receive buffers too small for a header and any payload (44
    /// bytes or fewer), handed back to the guest empty.
    vsock_rx_small_buffers,
    /// Requests a device could not make sense of (malformed chains,
    /// out-of-range sectors, queues outside RAM).
    device_errors,
    /// Random bytes the entropy device gave the guest.
    entropy_bytes,
    /// Requests to the entropy device its rate limiter held back (each
    /// waited for its tokens in the ring).
    entropy_rate_limited,
    }
}

counters! {
    /// The VM's own live counters: what no one vCPU or device does.
    VmMetrics,
    /// The VM's own counters at one moment.
    VmWideCounters,
    VM_HELP,
    {
    /// Snapshots written.
    snapshots,
    }
}

impl VcpuMetrics {
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
            GuestFault::Breakpoint | GuestFault::DeviceNotAvailable => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// A VM's counters: the totals over its vCPUs, its devices and its own,
/// then each vCPU's and each virtio device's. The metrics file's shape
/// ([`METRICS_VERSION`] 2): the totals flat (every counter once), `vcpus`
/// with each vCPU's own counters, `devices` with each device's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct VmCounters {
    /// The sums of the vCPUs' counters.
    #[serde(flatten)]
    pub total: Counters,
    /// The sums of the devices' counters.
    #[serde(flatten)]
    pub device_total: DeviceCounters,
    /// The VM's own.
    #[serde(flatten)]
    pub vm: VmWideCounters,
    /// Each vCPU's counters, by index.
    pub vcpus: Vec<Counters>,
    /// Each virtio device's counters, by slot (disks first, then network
    /// devices, vsock and entropy).
    pub devices: Vec<DeviceCounters>,
}

/// The metrics document's version: 2 since each vCPU and device lists only
/// the counters it keeps (version 1 gave every vCPU the devices' counters
/// at zero, and every device the vCPUs').
pub const METRICS_VERSION: u32 = 2;

impl VmCounters {
    /// The VM's counters now.
    pub fn of(vcpus: &[Arc<VcpuMetrics>], devices: &[Arc<DeviceMetrics>], vm: &VmMetrics) -> Self {
        let vcpus: Vec<Counters> = vcpus.iter().map(|m| m.counters()).collect();
        let devices: Vec<DeviceCounters> = devices.iter().map(|m| m.counters()).collect();
        let mut total = Counters::default();
        vcpus.iter().for_each(|c| total.add(c));
        let mut device_total = DeviceCounters::default();
        devices.iter().for_each(|c| device_total.add(c));
        VmCounters {
            total,
            device_total,
            vm: vm.counters(),
            vcpus,
            devices,
        }
    }

    /// The counters in the Prometheus text format (version 0.0.4), each
    /// owner's under its own label: `lwpvmm_<name>_total{vcpu="N"}` for a
    /// vCPU's, `{device="N"}` for a device's, and the VM's own without one;
    /// a sum over a counter's labels is the VM's total. The step backend
    /// flags are gauges (0 or 1), without the `_total`; a count of
    /// nanoseconds is `_seconds_total` in seconds.
    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        let Some(first) = self.vcpus.first() else {
            return out;
        };
        for (name, _) in first.iter() {
            let values = self
                .vcpus
                .iter()
                .enumerate()
                .map(|(i, c)| (format!("vcpu=\"{i}\""), value_of(c.iter(), name)));
            series(&mut out, name, VCPU_HELP, values);
        }
        if let Some(first) = self.devices.first() {
            for (name, _) in first.iter() {
                let values = self
                    .devices
                    .iter()
                    .enumerate()
                    .map(|(i, c)| (format!("device=\"{i}\""), value_of(c.iter(), name)));
                series(&mut out, name, DEVICE_HELP, values);
            }
        }
        for (name, value) in self.vm.iter() {
            series(
                &mut out,
                name,
                VM_HELP,
                std::iter::once((String::new(), value)),
            );
        }
        out
    }
}

/// The value of counter `name` among `values`.
fn value_of(mut values: impl Iterator<Item = (&'static str, u64)>, name: &str) -> u64 {
    values.find(|(n, _)| *n == name).map_or(0, |(_, v)| v)
}

/// Appends one counter's HELP, TYPE and a line for each of its `values`
/// (labels and value).
fn series(
    out: &mut String,
    name: &str,
    help: &[(&str, &str)],
    values: impl Iterator<Item = (String, u64)>,
) {
    // Prometheus names a time in seconds: a counter of nanoseconds becomes
    // `_seconds_total`, its values divided (promtool refuses abbreviated
    // units in a name).
    let seconds = name.strip_suffix("_ns");
    let (series, kind) = if name.starts_with("step_backend_") {
        (format!("lwpvmm_{name}"), "gauge")
    } else if let Some(stem) = seconds {
        (format!("lwpvmm_{stem}_seconds_total"), "counter")
    } else {
        (format!("lwpvmm_{name}_total"), "counter")
    };
    let text = help
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(String::new(), |(_, h)| {
            h.split_whitespace().collect::<Vec<_>>().join(" ")
        });
    out.push_str(&format!("# HELP {series} {text}\n"));
    out.push_str(&format!("# TYPE {series} {kind}\n"));
    for (labels, v) in values {
        let shown = match seconds {
            Some(_) => format!("{}", v as f64 / 1e9),
            None => v.to_string(),
        };
        if labels.is_empty() {
            out.push_str(&format!("{series} {shown}\n"));
        } else {
            out.push_str(&format!("{series}{{{labels}}} {shown}\n"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lwp::fault::PF_USER;

    #[test]
    fn totals_sum_the_vcpus_and_serialise_flat() {
        let a = Arc::new(VcpuMetrics::default());
        let b = Arc::new(VcpuMetrics::default());
        a.lwpins.fetch_add(3, Ordering::Relaxed);
        b.lwpins.fetch_add(4, Ordering::Relaxed);
        b.steps.fetch_add(1, Ordering::Relaxed);
        let disk = Arc::new(DeviceMetrics::default());
        disk.disk_reads.fetch_add(5, Ordering::Relaxed);
        let own = VmMetrics::default();
        own.snapshots.fetch_add(2, Ordering::Relaxed);
        let vm = VmCounters::of(&[a, b], &[disk], &own);
        assert_eq!((vm.total.lwpins, vm.total.steps), (7, 1));
        assert_eq!(vm.vcpus[1].lwpins, 4);
        let json = serde_json::to_value(&vm).unwrap();
        // Every total once, flat; each owner lists its own counters only.
        assert_eq!(
            (&json["lwpins"], &json["disk_reads"], &json["snapshots"]),
            (&7.into(), &5.into(), &2.into())
        );
        assert_eq!(json["vcpus"][0]["lwpins"], 3);
        assert!(json["vcpus"][0].get("disk_reads").is_none());
        assert!(json["vcpus"][0].get("snapshots").is_none());
        assert_eq!(json["devices"][0]["disk_reads"], 5);
        assert!(json["devices"][0].get("lwpins").is_none());
    }

    #[test]
    fn prometheus_has_a_series_per_vcpu_and_types() {
        let a = Arc::new(VcpuMetrics::default());
        let b = Arc::new(VcpuMetrics::default());
        b.lwpins.fetch_add(4, Ordering::Relaxed);
        b.sampler_ns.fetch_add(1_500_000_000, Ordering::Relaxed);
        a.step_backend_trap_flag.store(1, Ordering::Relaxed);
        let disk = Arc::new(DeviceMetrics::default());
        disk.disk_reads.fetch_add(5, Ordering::Relaxed);
        let own = VmMetrics::default();
        own.snapshots.fetch_add(1, Ordering::Relaxed);
        let vm = VmCounters::of(&[a, b], &[disk], &own);
        assert_eq!(vm.device_total.disk_reads, 5);
        let text = vm.prometheus();
        for line in [
            "# HELP lwpvmm_lwpins_total LWPINS executed.",
            "# TYPE lwpvmm_lwpins_total counter",
            "lwpvmm_lwpins_total{vcpu=\"0\"} 0",
            "lwpvmm_lwpins_total{vcpu=\"1\"} 4",
            "lwpvmm_disk_reads_total{device=\"0\"} 5",
            "lwpvmm_snapshots_total 1",
            "lwpvmm_vsock_rx_small_buffers_total{device=\"0\"} 0",
            "# TYPE lwpvmm_step_backend_trap_flag gauge",
            "lwpvmm_step_backend_trap_flag{vcpu=\"0\"} 1",
            "# TYPE lwpvmm_sampler_seconds_total counter",
            "lwpvmm_sampler_seconds_total{vcpu=\"1\"} 1.5",
            "lwpvmm_step_seconds_total{vcpu=\"0\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        // Every series has help text (Prometheus shows it beside the
        // series), taken from the counter's documentation.
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines
            .iter()
            .enumerate()
            .filter(|(_, l)| l.starts_with("# TYPE"))
        {
            let help = lines[i - 1];
            assert!(
                help.starts_with("# HELP") && help.len() > "# HELP lwpvmm_x_total ".len() + 5,
                "{help} before {l}"
            );
        }
        assert!(
            !text.contains("_ns"),
            "no abbreviated unit in a name (promtool refuses them)"
        );
        // Each counter under its owner's label only.
        for wrong in [
            "lwpvmm_disk_reads_total{vcpu=",
            "lwpvmm_lwpins_total{device=",
        ] {
            assert!(!text.contains(wrong), "{wrong} in\n{text}");
        }
        assert!(VmCounters::default().prometheus().is_empty());
    }

    #[test]
    fn denials_are_counted_by_check() {
        let m = VcpuMetrics::default();
        // (fault, the counter it lands in)
        type Case = (GuestFault, fn(&Counters) -> u64);
        let table: [Case; 4] = [
            (
                GuestFault::PageFault {
                    address: 0,
                    error_code: PF_USER,
                },
                |c| c.denied_not_present,
            ),
            (
                GuestFault::PageFault {
                    address: 0,
                    error_code: PF_PRESENT | PF_USER,
                },
                |c| c.denied_protection,
            ),
            (
                GuestFault::PageFault {
                    address: 0,
                    error_code: PF_PRESENT | PF_RESERVED,
                },
                |c| c.denied_reserved_bit,
            ),
            (GuestFault::GeneralProtection, |c| c.denied_gp),
        ];
        for (fault, counter) in table {
            let before = counter(&m.counters());
            m.count_denial(fault);
            assert_eq!(counter(&m.counters()), before + 1, "{fault:?}");
        }
    }
}
