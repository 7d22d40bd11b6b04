//! The exit-side work on a vCPU's LWP state (lwp_state.rs): the sampler's
//! charge, and what follows every exit (the trace, a due threshold
//! interrupt, stepping).

use std::sync::atomic::Ordering;

use kvm_bindings::kvm_msi;

use super::context::ExitCx;
use super::lwp_state::CR3_ADDR;
use super::stepper;
use crate::guard::GuestView;
use crate::guest_warn;
use crate::lwp::record::EventId;
use crate::lwp::unit::{LwpUnit, ThresholdInterrupt};
use crate::profile::stack::{self, UnwindStart};
use crate::profile::trace::TraceRecord;
use crate::vmm::vcpu::privilege;

use super::protocol::VcpuError;

/// A sampling kick: charges `cycles` (what the vCPU ran since the last
/// sample, at most one sampling period) to CNH and RNH, but only while the
/// vCPU runs at CPL3 in the address space that loaded the LWPCB; returns
/// whether it charged them. docs/profiling.md.
pub fn sample(cx: &mut ExitCx<'_>, cycles: u64) -> bool {
    cx.metrics.sampler_kicks.fetch_add(1, Ordering::Relaxed);
    let (regs, sregs) = (cx.vcpu.regs(), cx.vcpu.sregs());
    let rip = regs.rip;
    if !privilege::is_user(&sregs) || !cx.lwp.in_lwpcb_space(sregs.cr3) {
        return false;
    }
    let (paging, now) = (cx.vcpu.paging(&sregs), cx.vcpu.guest_tsc());
    let (Some(unit), Ok(paging)) = (cx.lwp.unit_mut(), paging) else {
        return false;
    };
    let mut view = GuestView::new(cx.mem, paging);
    unit.count(&mut view, EventId::Cnh, cycles, rip, now);
    unit.count(&mut view, EventId::Rnh, cycles, rip, now);
    cx.lwp.note_unwind(UnwindStart {
        fp: regs.rbp,
        sp: regs.rsp,
        long_mode: sregs.cs.l == 1,
    });
    cx.metrics.samples_charged.fetch_add(1, Ordering::Relaxed);
    cx.recorder.charged_kick();
    true
}

/// After every exit: the unit's counters into the metrics, its new records
/// into the trace, a due threshold interrupt, and stepping armed where the
/// stepped context lost its trap flag.
pub fn after_exit(cx: &mut ExitCx<'_>) -> Result<(), VcpuError> {
    if let Some(u) = cx.lwp.unit() {
        let stats = u.stats();
        let m = cx.metrics;
        m.records_stored
            .store(stats.records_stored, Ordering::Relaxed);
        m.records_missed
            .store(stats.records_missed, Ordering::Relaxed);
    }
    let unwind = cx.lwp.unwind.take();
    record(cx, unwind);
    deliver_interrupt(cx);
    stepper::arm(cx)
}

/// Records that get the call stack of the context they were stored for:
/// the sampled clocks and the program's own LWPINS and LWPVAL.
fn stacked(event: u8) -> bool {
    [EventId::Val, EventId::Cnh, EventId::Rnh, EventId::Ins]
        .iter()
        .any(|e| *e as u8 == event)
}

/// The unit's new records to the recorder, those of the EventIds it
/// records, with their call stacks; nothing is unwound for records that go
/// nowhere.
fn record(cx: &mut ExitCx<'_>, unwind: Option<UnwindStart>) {
    let recorder = cx.recorder;
    let Some(unit) = cx.lwp.unit_mut() else {
        return;
    };
    let records = unit.drain_log();
    if records.is_empty() || !recorder.wants_records() {
        return;
    }
    let sregs = cx.vcpu.sregs();
    let (id, cr3) = (cx.vcpu.id(), sregs.cr3 & CR3_ADDR);
    let mut lines: Vec<TraceRecord> = records
        .iter()
        .filter(|r| recorder.wants(r.event_id))
        .map(|r| TraceRecord::new(id, cr3, r))
        .collect();
    if lines.is_empty() {
        return;
    }
    if let Some(start) = unwind.filter(|_| cx.lwp.stacks)
        && lines.iter().any(|l| stacked(l.event))
        && let Ok(paging) = cx.vcpu.paging(&sregs)
    {
        let found = stack::unwind(&mut GuestView::new(cx.mem, paging), start);
        for line in lines.iter_mut().filter(|l| stacked(l.event)) {
            line.stack.clone_from(&found.frames);
            line.top = found.top;
        }
    }
    let written = recorder.records(&lines);
    cx.metrics
        .trace_dropped
        .fetch_add(written.trace_dropped, Ordering::Relaxed);
    if written.trace_failed {
        cx.metrics.trace_errors.fetch_add(1, Ordering::Relaxed);
    }
}

/// The xAPIC MSI address of a local APIC.
fn msi_address(apic_id: u8) -> u32 {
    0xfee0_0000 | (u32::from(apic_id) << 12)
}

fn deliver_interrupt(cx: &mut ExitCx<'_>) {
    let Some(irq) = cx.lwp.unit_mut().and_then(LwpUnit::take_interrupt) else {
        return;
    };
    let id = cx.vcpu.id();
    match irq {
        // On the line, LWP_CFG's vector is not used: the guest's IOAPIC
        // entry for the line says which vector arrives.
        ThresholdInterrupt::Deliver(_) | ThresholdInterrupt::Suppressed(_)
            if cx.lwp.threshold_line =>
        {
            match cx.vcpu.raise_threshold_line() {
                Ok(()) => {
                    cx.metrics.lwp_interrupts.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => guest_warn!(
                    cx.metrics.guest_warnings,
                    "vCPU {id}: LWP threshold line not raised: {e}"
                ),
            }
        }
        ThresholdInterrupt::Deliver(vector) => {
            let msi = kvm_msi {
                address_lo: msi_address(id),
                data: u32::from(vector),
                ..Default::default()
            };
            match cx.vcpu.signal_msi(&msi) {
                Ok(()) => {
                    cx.metrics.lwp_interrupts.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => guest_warn!(
                    cx.metrics.guest_warnings,
                    "vCPU {id}: LWP threshold interrupt {vector:#x} not delivered: {e}"
                ),
            }
        }
        ThresholdInterrupt::Suppressed(vector) => guest_warn!(
            cx.metrics.lwp_interrupts_suppressed,
            "vCPU {id}: LWP threshold interrupt on exception vector {vector:#x} suppressed"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lwp::cpuid::LwpProfile;
    use crate::vmm::vcpu::doorbell::ud_doorbell;
    use crate::vmm::vcpu::testing::*;

    const CNH: u32 = 1 << 5;

    /// A vCPU whose CPL3 context loaded an LWPCB with CNH through the
    /// doorbell, then runs at CPL3 at `rip` in `cr3`.
    fn sampled(cr3_after: Option<u64>) -> Rig {
        let mut r = Rig::new(LwpProfile::Emulated, None);
        r.lwpcb(CNH);
        r.code(USER_CODE, &LLWPCB_RAX);
        r.frame(USER_CODE, USER_CS, USER_DS, 0x202);
        r.vcpu.regs.rax = LWPCB;
        ud_doorbell(&mut r.cx()).unwrap();
        r.at_cpl3(false);
        r.vcpu.regs.rip = USER_CODE + 0x40;
        if let Some(cr3) = cr3_after {
            r.vcpu.sregs.cr3 = cr3;
        }
        r
    }

    #[test]
    fn samples_are_charged_only_at_cpl3_in_the_lwpcbs_space() {
        // (what, other CR3, at CPL0, charged)
        let table = [
            ("CPL3, same address space", None, false, true),
            ("another address space", Some(0x1234_5000), false, false),
            ("at CPL0", None, true, false),
        ];
        for (what, cr3, cpl0, charged) in table {
            let mut r = sampled(cr3);
            if cpl0 {
                r.at_cpl0();
            }
            sample(&mut r.cx(), 1 << 20);
            let c = r.metrics.counters();
            assert_eq!(
                (c.sampler_kicks, c.samples_charged),
                (1, u64::from(charged)),
                "{what}"
            );
            let stored = r.lwp.unit().unwrap().stats().records_stored;
            assert_eq!(stored > 0, charged, "{what}");
            if charged {
                assert_eq!(r.record(0).instruction_address, USER_CODE + 0x40);
            }
        }
    }

    #[test]
    fn threshold_interrupts_go_to_the_vcpu_or_are_suppressed() {
        // (LWP_CFG vector, on the threshold line, MSI delivered, line
        // raised)
        let table = [
            (0x40u64, false, true, false),
            (0x10, false, false, false),
            (0x40, true, false, true),
            (0, true, false, true),
        ];
        for (vector, line, delivered, raised) in table {
            let mut r = Rig::new(LwpProfile::Emulated, None);
            r.lwp.set_threshold_line(line, false);
            let int = 1u32 << 31;
            r.lwpcb_with(int | CNH, 32);
            let cfg = u64::from(int | CNH) | vector << 40;
            r.lwp.unit_mut().unwrap().write_cfg(cfg).unwrap();
            r.code(USER_CODE, &LLWPCB_RAX);
            r.frame(USER_CODE, USER_CS, USER_DS, 0x202);
            r.vcpu.regs.rax = LWPCB;
            ud_doorbell(&mut r.cx()).unwrap();
            r.code(USER_CODE + 5, &LWPINS);
            r.frame(USER_CODE + 5, USER_CS, USER_DS, 0x202);
            ud_doorbell(&mut r.cx()).unwrap();
            after_exit(&mut r.cx()).unwrap();
            let msis = r.vcpu.msis.borrow().clone();
            let c = r.metrics.counters();
            assert_eq!(r.vcpu.lines.get(), u32::from(raised), "{vector:#x} {line}");
            if raised {
                assert!(msis.is_empty());
                assert_eq!(c.lwp_interrupts, 1);
            } else if delivered {
                assert_eq!(msis.len(), 1);
                assert_eq!((msis[0].address_lo, msis[0].data), (0xfee0_0000, 0x40));
                assert_eq!(c.lwp_interrupts, 1);
            } else {
                assert!(msis.is_empty());
                assert_eq!(c.lwp_interrupts_suppressed, 1);
            }
        }
    }
}
