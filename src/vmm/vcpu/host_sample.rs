//! Host-side samples of the whole guest (`--profile-kernel`): at a sampler
//! kick, what the vCPU was running, kernel or process, with its call stack
//! by frame pointers, stored as a trace line of EventId 0 (`GUEST_CPU`).
//! The guest's LWP unit, rings and counters are not touched: this is the
//! host looking, as `perf kvm --guest record` looks on a host with a PMU.
//!
//! A kernel stack is read through the guard as supervisor loads, through
//! the vCPU's own page tables, and goes on into the stack of the process
//! the kernel works for; a read that faults ends the stack, never the run.
//! Each sample stands for the guest time since its vCPU's last one, in
//! whole sampling periods. A vCPU the guest has not started (paging off,
//! waiting for its startup IPI) is not sampled.

use std::sync::atomic::Ordering;

use kvm_bindings::kvm_sregs;

use super::context::ExitCx;
use super::lwp_state::CR3_ADDR;
use super::ops::MSR_LSTAR;
use crate::guard::{Access, GuestView};
use crate::profile::objects::KERNEL_HALF;
use crate::profile::stack::{self, StackMemory, UnwindStart, Unwound};
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

/// The words of x86-64 Linux's `struct pt_regs`, and where RBP, RIP, CS,
/// RSP and SS lie in it.
const PT_REGS_WORDS: usize = 21;
const PT_RBP: usize = 4;
const PT_RIP: usize = 16;
const PT_CS: usize = 17;
const PT_RSP: usize = 19;
const PT_SS: usize = 20;

/// How far past LSTAR a return address still lies in the kernel's
/// SYSCALL entry (Linux's `entry_SYSCALL_64` calls `do_syscall_64` within
/// its first 0x100 bytes).
const SYSCALL_ENTRY_SPAN: u64 = 0x200;

/// Where the process a kernel sample works for was when it entered the
/// kernel (a system call, a fault, an interrupt): its RIP, and where its
/// stack unwinds from. A Linux built with frame pointers enters the kernel
/// from an exception or interrupt with RBP holding the address of the
/// registers it saved (`struct pt_regs`) with bit 0 set
/// (`ENCODE_FRAME_POINTER`), so the kernel's walk ends there (`last_fp`).
/// Its SYSCALL entry encodes nothing: there the walk's last frame returns
/// into the entry (within [`SYSCALL_ENTRY_SPAN`] of `lstar`), and the
/// registers lie right above that frame. The registers are read as
/// supervisor memory and believed only when the saved CS and SS are user
/// selectors and RIP a user address: a kernel thread, or a kernel without
/// either shape, adds no frames.
fn entered_from(
    view: &GuestView<'_>,
    sregs: &kvm_sregs,
    found: &Unwound,
    lstar: Option<u64>,
) -> Option<(u64, UnwindStart)> {
    let in_syscall_entry =
        |ret: &u64| lstar.is_some_and(|l| ret.wrapping_sub(l) < SYSCALL_ENTRY_SPAN);
    let at = if found.last_fp & 1 == 1 {
        found.last_fp & !1
    } else if found.last_frame != 0 && found.frames.last().is_some_and(in_syscall_entry) {
        found.last_frame.checked_add(16)?
    } else {
        return None;
    };
    let mut raw = [0u8; PT_REGS_WORDS * 8];
    view.read(at, &mut raw, Access::SupervisorRead).ok()?;
    let reg = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&raw[i * 8..i * 8 + 8]);
        u64::from_le_bytes(w)
    };
    let (rip, cs, ss) = (reg(PT_RIP), reg(PT_CS), reg(PT_SS));
    if cs & 3 != 3 || ss & 3 != 3 || rip == 0 || rip >= KERNEL_HALF {
        return None;
    }
    let long_mode =
        privilege::load_segment(view, sregs, u16::try_from(cs).ok()?).is_some_and(|s| s.l == 1);
    Some((
        rip,
        UnwindStart {
            fp: reg(PT_RBP),
            sp: reg(PT_RSP),
            long_mode,
        },
    ))
}

/// Reads where the guest kernel put its system-call entry (LSTAR), for
/// the report to place a randomised kernel (KASLR) by its symbols: once the
/// kernel has set it to a kernel address. A kernel without SYSCALL (LSTAR
/// still 0) is read again at its next sample.
fn note_kernel_entry(cx: &mut ExitCx<'_>) {
    let Ok(lstar) = cx.vcpu.msr(MSR_LSTAR) else {
        return;
    };
    if lstar >= KERNEL_HALF && !cx.recorder.note_kernel_entry(lstar) {
        cx.metrics.trace_errors.fetch_add(1, Ordering::Relaxed);
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
    if kernel && recorder.kernel_entry().is_none() {
        note_kernel_entry(cx);
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
        // Under the kernel's frames, the process it works for, if any.
        let entered = kernel
            .then(|| entered_from(&view, &sregs, &found, recorder.kernel_entry()))
            .flatten();
        sample.stack = found.frames;
        sample.top = found.top;
        if let Some((rip, user)) = entered {
            sample.stack.push(rip);
            sample
                .stack
                .extend(stack::unwind(&mut { view }, user).frames);
        }
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
    /// A frame whose caller is the kernel's entry: its saved frame pointer
    /// is the address of the saved user registers, with bit 0 set.
    const ENTERED_FP: u64 = FRAME_AT - 0x80;
    /// A frame that returns into the SYSCALL entry, right below the saved
    /// user registers (at AREA); its saved frame pointer is the process's.
    const SYSCALL_FP: u64 = AREA - 16;
    const SYSCALL_LSTAR: u64 = KERNEL_CODE + 0x100;

    #[test]
    fn the_kernels_syscall_entry_is_noted_once_from_a_kernel_sample() {
        // (where the vCPU was, LSTAR, what the recorder then knows)
        let table = [
            ("a process", false, 0xffff_ffff_9e40_0040, None),
            ("the kernel before SYSCALL is set up", true, 0, None),
            (
                "the kernel",
                true,
                0xffff_ffff_9e40_0040,
                Some(0xffff_ffff_9e40_0040),
            ),
        ];
        for (what, kernel, lstar, want) in table {
            let mut r = Rig::new(LwpProfile::Off, None);
            r.recorder = Recorder::new(None, true, 1000);
            let _id = r
                .recorder
                .start_capture(CaptureOwner::Owner)
                .expect("a capture");
            if kernel {
                r.at_cpl0();
            } else {
                r.at_cpl3(false);
            }
            r.vcpu.lstar = lstar;
            take(&mut r.cx(), 0);
            assert_eq!(r.recorder.kernel_entry(), want, "{what}");
            // A kernel that moves LSTAR later does not move the note.
            r.vcpu.lstar = 0xffff_ffff_8140_0040;
            take(&mut r.cx(), 0);
            let again = if kernel && want.is_none() {
                Some(r.vcpu.lstar)
            } else {
                want
            };
            assert_eq!(r.recorder.kernel_entry(), again, "{what}, again");
        }
    }

    #[test]
    fn a_kick_is_sampled_where_it_lands_and_its_stack_read_with_that_privilege() {
        // (where the vCPU was, the frame pointer, kernel sample?, the stack
        // found, the counter it counts in)
        type Case = (&'static str, u64, bool, Vec<u64>);
        let table: [Case; 5] = [
            ("the kernel", KERNEL_FP, true, vec![RET]),
            // The frame above ends in the registers the entry saved (bit 0
            // set): the process's RIP goes under the kernel's frames.
            (
                "the kernel, entered from a process",
                ENTERED_FP,
                true,
                vec![RET, USER_CODE],
            ),
            // The frame above returns into the SYSCALL entry, which encodes
            // nothing: the registers lie right above it.
            (
                "the kernel, in a system call",
                SYSCALL_FP,
                true,
                vec![SYSCALL_LSTAR + 0x50, USER_CODE],
            ),
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
            r.mem
                .write_obj(AREA | 1, GuestAddress(ENTERED_FP))
                .expect("kernel stack");
            r.mem
                .write_obj(RET, GuestAddress(ENTERED_FP + 8))
                .expect("kernel stack");
            r.mem
                .write_obj(USER_STACK - 0x40, GuestAddress(SYSCALL_FP))
                .expect("kernel stack");
            r.mem
                .write_obj(SYSCALL_LSTAR + 0x50, GuestAddress(SYSCALL_FP + 8))
                .expect("kernel stack");
            assert!(r.recorder.note_kernel_entry(SYSCALL_LSTAR));
            // struct pt_regs at AREA: a process at USER_CODE without a frame.
            let mut regs = [0u64; PT_REGS_WORDS];
            regs[PT_RIP] = USER_CODE;
            regs[PT_CS] = USER_CS;
            regs[PT_SS] = USER_DS;
            regs[PT_RSP] = USER_STACK - 0x100;
            r.mem
                .write_obj(regs, GuestAddress(AREA))
                .expect("saved registers");
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
