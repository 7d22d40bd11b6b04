//! A vCPU's LWP state in one place: its LWP unit, whether the guest's LWP
//! instructions reach it (a shim guest), the address space that loaded the
//! LWPCB, and the stepper of precise events. A snapshot saves it whole
//! ([`LwpState`]) and it is rebuilt through one constructor, which also
//! decides what the unit withholds. The LWP MSRs read and write it here.

use serde::{Deserialize, Serialize};

use super::step_state::{StepState, Stepper};
use crate::lwp::cpuid::{LwpCaps, LwpFeatures};
use crate::lwp::msr::{MSR_LWP_CBADDR, MSR_LWP_CFG};
use crate::lwp::unit::{LwpUnit, UnitState};
use crate::profile::stack::UnwindStart;
use crate::vmm::vcpu::step::StepBackend;

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
    pub(super) threshold_line: bool,
    crossings_in_reply: bool,
    /// The trace gets the call stacks of sampled, LWPINS and LWPVAL records.
    pub(super) stacks: bool,
    /// Where the stack of the CPL3 context this exit stored records for
    /// starts, when it is known.
    pub(super) unwind: Option<UnwindStart>,
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
