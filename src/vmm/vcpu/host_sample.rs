//! Host-side samples of the whole guest (`--profile-kernel`): at a sampler
//! kick, what the vCPU was running, kernel or process, with its call stack
//! by frame pointers, stored as a trace line of EventId 0 (`GUEST_CPU`).
//! The guest's LWP unit, rings and counters are not touched: this is the
//! host looking, as `perf kvm --guest record` looks on a host with a PMU.
//!
//! A kernel stack is read through the guard as supervisor loads, through
//! the vCPU's own page tables; a read that faults ends the stack, never the
//! run. Each sample stands for one sampling period of guest time. A vCPU
//! the guest has not started (paging off, waiting for its startup IPI) is
//! not sampled.

use std::sync::atomic::Ordering;

use super::context::ExitCx;
use super::lwp_state::CR3_ADDR;
use crate::guard::{Access, GuestView};
use crate::profile::stack::{self, StackMemory, UnwindStart};
use crate::profile::trace::TraceRecord;
use crate::vmm::vcpu::privilege;

/// CR0.PG: paging on.
const CR0_PG: u64 = 1 << 31;

/// The guest kernel's memory as a stack walk reads it: supervisor loads.
struct Supervisor<'a>(GuestView<'a>);

impl StackMemory for Supervisor<'_> {
    fn read_stack(&mut self, address: u64, buf: &mut [u8]) -> bool {
        self.0.read(address, buf, Access::SupervisorRead).is_ok()
    }
}

/// Takes the sample of a kick: the vCPU's RIP and stack, to the trace and
/// the running captures. It stands for the guest time since the vCPU's
/// last sample, `elapsed_ns` (0 when unknown: one period), in whole
/// sampling periods, at least one and at most a second's worth.
pub fn take(cx: &mut ExitCx<'_>, elapsed_ns: u64) {
    let (regs, sregs) = (cx.vcpu.regs(), cx.vcpu.sregs());
    // A vCPU the guest has not started yet waits at the reset vector with
    // paging off: it runs nothing to sample.
    if sregs.cr0 & CR0_PG == 0 {
        return;
    }
    let kernel = !privilege::is_user(&sregs);
    let counter = if kernel {
        &cx.metrics.guest_kernel_samples
    } else {
        &cx.metrics.guest_user_samples
    };
    counter.fetch_add(1, Ordering::Relaxed);
    let recorder = cx.recorder;
    if !recorder.wants_records() {
        return;
    }
    let hz = u64::from(recorder.sample_hz().max(1));
    let period_ns = 1_000_000_000 / hz;
    let periods = if elapsed_ns == 0 {
        1
    } else {
        (elapsed_ns + period_ns / 2) / period_ns
    }
    .clamp(1, hz);
    let mut sample = TraceRecord::guest_cpu(
        cx.vcpu.id(),
        sregs.cr3 & CR3_ADDR,
        regs.rip,
        kernel,
        u32::try_from(periods).unwrap_or(u32::MAX),
        period_ns,
        cx.vcpu.guest_tsc(),
    );
    if let Ok(paging) = cx.vcpu.paging(&sregs) {
        let view = GuestView::new(cx.mem, paging);
        let start = UnwindStart {
            fp: regs.rbp,
            sp: regs.rsp,
            long_mode: sregs.cs.l == 1,
        };
        let found = if kernel {
            stack::unwind(&mut Supervisor(view), start)
        } else {
            stack::unwind(&mut { view }, start)
        };
        sample.stack = found.frames;
        sample.top = found.top;
    }
    let written = recorder.records(&[sample]);
    cx.metrics
        .trace_dropped
        .fetch_add(written.trace_dropped, Ordering::Relaxed);
    if written.trace_failed {
        cx.metrics.trace_errors.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use vm_memory::{Bytes, GuestAddress};

    use super::*;
    use crate::lwp::cpuid::LwpProfile;
    use crate::profile::objects::Resolver;
    use crate::vmm::base::recorder::{CaptureOwner, Recorder};
    use crate::vmm::vcpu::testing::*;

    /// A frame-pointer chain in kernel memory (supervisor-only): the frame
    /// at `fp` saves no caller frame and returns to `ret`.
    const KERNEL_FP: u64 = FRAME_AT - 0x100;
    const RET: u64 = KERNEL_CODE + 0x10;

    #[test]
    fn a_kick_is_sampled_where_it_lands_and_its_stack_read_with_that_privilege() {
        // (where the vCPU was, the frame pointer, kernel sample?, the stack
        // found, the counter it counts in)
        type Case = (&'static str, u64, bool, Vec<u64>);
        let table: [Case; 3] = [
            ("the kernel", KERNEL_FP, true, vec![RET]),
            // A process whose frame pointer names kernel memory: a CPL3
            // read faults and the stack ends there, empty.
            ("a process", KERNEL_FP, false, vec![]),
            ("a process, no frame", 0, false, vec![]),
        ];
        for (what, fp, kernel, stack) in table {
            let mut r = Rig::new(LwpProfile::Off, None);
            r.recorder = Recorder::new(None, true, 1000);
            r.mem
                .write_obj(0u64, GuestAddress(KERNEL_FP))
                .expect("kernel stack");
            r.mem
                .write_obj(RET, GuestAddress(KERNEL_FP + 8))
                .expect("kernel stack");
            if kernel {
                r.at_cpl0();
                r.vcpu.regs.rsp = KERNEL_FP;
            } else {
                r.at_cpl3(false);
            }
            r.vcpu.regs.rbp = fp;
            r.vcpu.regs.rip = 0x1234;
            let id = r
                .recorder
                .start_capture(CaptureOwner::Owner)
                .expect("a capture");
            take(&mut r.cx(), 0);
            let capture = r.recorder.finish_capture(id).expect("the capture");
            assert_eq!(capture.records, 1, "{what}");
            let tally = capture.tally(&mut Resolver::default());
            let c = tally.stacks(Some(0)).next().expect("a whole-guest sample");
            let found: Vec<u64> = c.frames[1..].iter().map(|f| f.address).collect();
            assert_eq!((c.frames[0].address, found), (0x1234, stack), "{what}");
            let counted = (
                r.metrics.guest_kernel_samples.load(Ordering::Relaxed),
                r.metrics.guest_user_samples.load(Ordering::Relaxed),
            );
            assert_eq!(counted, if kernel { (1, 0) } else { (0, 1) }, "{what}");
            // Nothing of LWP was touched: no unit, no record stored.
            assert_eq!(r.metrics.records_stored.load(Ordering::Relaxed), 0);
        }
    }

    #[test]
    fn without_a_trace_or_capture_a_sample_is_only_counted() {
        let mut r = Rig::new(LwpProfile::Off, None);
        r.recorder = Recorder::new(None, true, 1000);
        take(&mut r.cx(), 0);
        assert_eq!(r.metrics.guest_kernel_samples.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_vcpu_not_started_yet_is_not_sampled() {
        let mut r = Rig::new(LwpProfile::Off, None);
        r.recorder = Recorder::new(None, true, 1000);
        let id = r
            .recorder
            .start_capture(CaptureOwner::Owner)
            .expect("a capture");
        r.vcpu.sregs.cr0 = 0x10;
        take(&mut r.cx(), 0);
        assert_eq!(
            r.recorder.finish_capture(id).expect("the capture").records,
            0
        );
        assert_eq!(r.metrics.guest_kernel_samples.load(Ordering::Relaxed), 0);
    }
}
