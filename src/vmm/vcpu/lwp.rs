//! A vCPU's LWP state in one place: its LWP unit, whether the guest's LWP
//! instructions reach it (a shim guest), the address space that loaded the
//! LWPCB, and the stepper of precise events. A snapshot saves it whole
//! ([`LwpState`]) and it is rebuilt through one constructor, which also
//! decides what the unit withholds. The exit-side work on it lives here too:
//! the LWP MSRs, the sampler's charge, and what follows every exit (the
//! trace, a due threshold interrupt, stepping).

use std::sync::atomic::Ordering;

use kvm_bindings::kvm_msi;
use serde::{Deserialize, Serialize};

use super::exit::ExitCx;
use super::stepper::{self, StepState, Stepper};
use crate::guard::GuestView;
use crate::guest_warn;
use crate::lwp::cpuid::{LwpCaps, LwpFeatures};
use crate::lwp::msr::{MSR_LWP_CBADDR, MSR_LWP_CFG};
use crate::lwp::record::EventId;
use crate::lwp::unit::{LwpUnit, ThresholdInterrupt, UnitState};
use crate::profile::stack::{self, UnwindStart};
use crate::profile::trace::TraceRecord;
use crate::vmm::vcpu::privilege;
use crate::vmm::vcpu::step::StepBackend;

use super::VcpuError;

/// The address bits of CR3 (PCID and flag bits masked).
pub const CR3_ADDR: u64 = 0x000F_FFFF_FFFF_F000;

/// A vCPU's LWP state as a snapshot carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LwpState {
    /// The unit's whole state (LWP_CFG, the loaded block with MissedEvents,
    /// Threshold, intervals, head, and a pending threshold interrupt).
    pub unit: UnitState,
    /// The component-62 image of the same state (for tools; checked against
    /// `unit` on restore).
    pub component62: Vec<u8>,
    /// CR3 (address bits) of the address space that loaded the LWPCB: the
    /// only one the sampler charges and the stepper steps.
    pub lwpcb_cr3: Option<u64>,
    /// The #DB-doorbell declaration and where stepping stands.
    pub stepping: StepState,
    /// Threshold interrupts go to the vCPU's threshold line, not as MSIs
    /// (state-call operation 6).
    #[serde(default)]
    pub threshold_line: bool,
    /// Crossings of the instructions the register calls emulate are
    /// answered in the call's reply, not on the line (operation 6, RDI bit
    /// 1).
    #[serde(default)]
    pub crossings_in_reply: bool,
}

/// A vCPU's LWP state.
#[derive(Debug)]
pub struct VcpuLwp {
    unit: Option<LwpUnit>,
    instructions: bool,
    lwpcb_cr3: Option<u64>,
    threshold_line: bool,
    crossings_in_reply: bool,
    /// The trace gets the call stacks of sampled, LWPINS and LWPVAL records.
    stacks: bool,
    /// Where the stack of the CPL3 context this exit stored records for
    /// starts, when it is known.
    unwind: Option<UnwindStart>,
    /// Precise events by single-stepping.
    pub stepper: Stepper,
}

impl VcpuLwp {
    /// The LWP state of a vCPU: `caps` is `None` when the VM has no LWP;
    /// `instructions` is false for a stock guest (its LWP instructions #UD
    /// while the MSRs work); `stepping` is the host's backend when the
    /// profile offers precise events to a shim guest. `saved` is a
    /// snapshot's state, untrusted: it is validated as LLWPCB would.
    pub fn new(
        caps: Option<LwpCaps>,
        instructions: bool,
        stepping: Option<StepBackend>,
        saved: Option<&LwpState>,
    ) -> Result<Self, String> {
        let (unit, lwpcb_cr3, steps) = match (caps, saved) {
            (None, None) => (None, None, StepState::default()),
            (Some(caps), None) => (Some(LwpUnit::new(caps)), None, StepState::default()),
            (Some(caps), Some(s)) => {
                let unit = LwpUnit::from_state(caps, &s.unit).map_err(|e| e.to_string())?;
                if unit.save_xsave().to_bytes().as_slice() != s.component62.as_slice() {
                    return Err("the component-62 image does not match the unit state".into());
                }
                (Some(unit), s.lwpcb_cr3.map(|c| c & CR3_ADDR), s.stepping)
            }
            (None, Some(_)) => return Err("an LWP section, but the profile has no LWP".into()),
        };
        let mut lwp = VcpuLwp {
            unit,
            instructions,
            lwpcb_cr3,
            threshold_line: saved.is_some_and(|s| s.threshold_line),
            crossings_in_reply: saved.is_some_and(|s| s.threshold_line && s.crossings_in_reply),
            stacks: false,
            unwind: None,
            stepper: Stepper::new(stepping, steps),
        };
        lwp.update_withheld();
        Ok(lwp)
    }

    /// The state a snapshot saves (`None` without LWP).
    pub fn state(&self) -> Option<LwpState> {
        self.unit.as_ref().map(|u| LwpState {
            unit: u.state(),
            component62: u.save_xsave().to_bytes().to_vec(),
            lwpcb_cr3: self.lwpcb_cr3,
            stepping: self.stepper.state(),
            threshold_line: self.threshold_line,
            crossings_in_reply: self.crossings_in_reply,
        })
    }

    /// Threshold interrupts go to the vCPU's threshold line (`true`) or are
    /// MSIs to the vector in LWP_CFG. With a line, `in_reply` makes the
    /// register calls (operations 4 and 5) answer their own crossings:
    /// their kernel runs with interrupts off, and the line's interrupt,
    /// pending until it turns them on, can arrive after a switch to another
    /// task.
    pub fn set_threshold_line(&mut self, on: bool, in_reply: bool) {
        self.threshold_line = on;
        self.crossings_in_reply = on && in_reply;
    }

    /// Whether a register call's reply carries a threshold crossing: takes
    /// the unit's due interrupt when the kernel asked for crossings in
    /// replies.
    pub fn take_reply_crossing(&mut self) -> bool {
        self.crossings_in_reply
            && self
                .unit
                .as_mut()
                .and_then(LwpUnit::take_interrupt)
                .is_some()
    }

    /// Precise events the stepper cannot produce yet (a trap-flag host
    /// before the guest declares its #DB doorbell) are withheld: LLWPCB
    /// grants them not.
    fn update_withheld(&mut self) {
        let withheld = if self.stepper.withholds() {
            LwpFeatures::IRE | LwpFeatures::BRE
        } else {
            LwpFeatures::empty()
        };
        if let Some(u) = self.unit.as_mut() {
            u.withhold(withheld);
        }
    }

    /// The guest declared its #DB doorbell.
    pub fn declare_db(&mut self) {
        self.stepper.declare_db();
        self.update_withheld();
    }

    /// The LWP unit, if the VM has LWP.
    pub fn unit(&self) -> Option<&LwpUnit> {
        self.unit.as_ref()
    }

    /// The LWP unit, if the VM has LWP.
    pub fn unit_mut(&mut self) -> Option<&mut LwpUnit> {
        self.unit.as_mut()
    }

    /// The unit the LWP instructions reach: none for a stock guest.
    pub fn insn_unit(&mut self) -> Option<&mut LwpUnit> {
        if self.instructions {
            self.unit.as_mut()
        } else {
            None
        }
    }

    /// Keeps a copy of every record the unit stores, for the trace, with
    /// call stacks when `stacks`.
    pub fn keep_log(&mut self, stacks: bool) {
        self.stacks = stacks;
        if let Some(u) = self.unit.as_mut() {
            u.keep_log();
        }
    }

    /// Notes where the stack of the CPL3 context whose records this exit
    /// stores starts (the sampler's charge, an emulated LWPINS or LWPVAL).
    pub fn note_unwind(&mut self, start: UnwindStart) {
        self.unwind = Some(start);
    }

    /// Notes the address space that loaded the LWPCB, after an operation
    /// that may have loaded one.
    pub fn note_lwpcb_space(&mut self, cr3: u64) {
        self.lwpcb_cr3 = self
            .unit
            .as_ref()
            .and_then(LwpUnit::block)
            .map(|_| cr3 & CR3_ADDR);
    }

    /// True when `cr3` is the address space that loaded the LWPCB.
    pub fn in_lwpcb_space(&self, cr3: u64) -> bool {
        self.lwpcb_cr3 == Some(cr3 & CR3_ADDR)
    }

    /// True when the context (CPL3 or not, CR3) runs under a live LWPCB with
    /// IRE or BRE enabled and the stepper can step it: every instruction it
    /// retires must be stepped.
    pub fn precise_live(&self, cpl3: bool, cr3: u64) -> bool {
        self.stepper.ready()
            && cpl3
            && self.in_lwpcb_space(cr3)
            && self
                .unit
                .as_ref()
                .is_some_and(|u| u.counts(LwpFeatures::IRE) || u.counts(LwpFeatures::BRE))
    }

    /// RDMSR of an LWP MSR; `None` raises #GP.
    pub fn msr_read(&self, index: u32) -> Option<u64> {
        let unit = self.unit.as_ref()?;
        match index {
            MSR_LWP_CFG => Some(unit.cfg().raw()),
            MSR_LWP_CBADDR => Some(unit.cbaddr()),
            _ => None,
        }
    }

    /// WRMSR of an LWP MSR; false raises #GP.
    pub fn msr_write(&mut self, index: u32, value: u64) -> bool {
        let Some(unit) = self.unit.as_mut() else {
            return false;
        };
        match index {
            MSR_LWP_CFG => unit.write_cfg(value).is_ok(),
            MSR_LWP_CBADDR => unit.write_cbaddr(value).is_ok(),
            _ => false,
        }
    }
}

/// A sampling kick: charges `cycles` (what the vCPU ran since the last
/// sample) to CNH and RNH, but only while the vCPU runs at CPL3 in the
/// address space that loaded the LWPCB. docs/profiling.md.
pub fn sample(cx: &mut ExitCx<'_>, cycles: u64) {
    cx.metrics.sampler_kicks.fetch_add(1, Ordering::Relaxed);
    let (regs, sregs) = (cx.vcpu.regs(), cx.vcpu.sregs());
    let rip = regs.rip;
    if !privilege::is_user(&sregs) || !cx.lwp.in_lwpcb_space(sregs.cr3) {
        return;
    }
    let (paging, now) = (cx.vcpu.paging(&sregs), cx.vcpu.guest_tsc());
    let (Some(unit), Ok(paging)) = (cx.lwp.unit_mut(), paging) else {
        return;
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

    #[test]
    fn msrs_follow_the_model() {
        let mut lwp = VcpuLwp::new(LwpProfile::Bulldozer.caps(), true, None, None).unwrap();
        // (index, value written, write accepted, value read back)
        let table = [
            (
                MSR_LWP_CFG,
                0x0000_4000_8000_000E,
                true,
                Some(0x0000_4000_8000_000E),
            ),
            (MSR_LWP_CFG, 1 << 5, false, Some(0x0000_4000_8000_000E)),
            (MSR_LWP_CFG, 1 << 7, false, Some(0x0000_4000_8000_000E)),
            (MSR_LWP_CBADDR, 0, true, Some(0)),
            (MSR_LWP_CBADDR, 0x1000, false, Some(0)),
            (0xC000_0107, 0, false, None),
        ];
        for (index, value, ok, read) in table {
            assert_eq!(lwp.msr_write(index, value), ok, "{index:#x} <- {value:#x}");
            assert_eq!(lwp.msr_read(index), read, "{index:#x}");
        }
        let mut none = VcpuLwp::new(None, true, None, None).unwrap();
        assert_eq!(none.msr_read(MSR_LWP_CFG), None, "no LWP: #GP");
        assert!(!none.msr_write(MSR_LWP_CFG, 0), "no LWP: #GP");
    }

    /// What a unit withholds is recomputed whenever the state is rebuilt:
    /// precise events wait for the #DB declaration on a trap-flag host, and
    /// a snapshot that carries the declaration grants them at once.
    #[test]
    fn withheld_events_follow_the_stepper() {
        let caps = LwpProfile::Precise.caps();
        // (backend, declared in the saved state, IRE granted)
        let table = [
            (None, false, true),
            (Some(StepBackend::GuestDebug), false, true),
            (Some(StepBackend::TrapFlag), false, false),
            (Some(StepBackend::TrapFlag), true, true),
        ];
        for (backend, declared, granted) in table {
            let fresh = VcpuLwp::new(caps, true, backend, None).unwrap();
            let mut saved = fresh.state().unwrap();
            saved.stepping.db_declared = declared;
            let lwp = VcpuLwp::new(caps, true, backend, Some(&saved)).unwrap();
            let withheld = lwp.unit().unwrap().withheld();
            assert_eq!(
                !withheld.contains(LwpFeatures::IRE),
                granted,
                "{backend:?}, declared {declared}"
            );
        }
    }

    #[test]
    fn saved_states_are_checked() {
        let caps = LwpProfile::Emulated.caps();
        let lwp = VcpuLwp::new(caps, true, None, None).unwrap();
        let good = lwp.state().unwrap();
        let mut bad = good.clone();
        bad.component62[0] ^= 1;
        let cases = [
            (caps, Some(&bad), "component-62"),
            (None, Some(&good), "no LWP"),
        ];
        for (caps, saved, want) in cases {
            let err = VcpuLwp::new(caps, true, None, saved).unwrap_err();
            assert!(err.contains(want), "{err}");
        }
    }
}

#[cfg(test)]
mod exit_side_tests {
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
