//! Where a vCPU's precise-event stepping stands: the backend this host
//! allows, whether the guest declared its #DB doorbell, the instruction
//! that retires at the next step, and a port instruction whose trap
//! kvm_pvm drops. A snapshot carries it ([`StepState`]); stepper.rs acts on
//! it at exits.

use serde::{Deserialize, Serialize};

use crate::vmm::vcpu::step::StepBackend;

/// The stepping state a snapshot carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepState {
    /// The guest declared that its #DB handler starts with the #DB doorbell.
    pub db_declared: bool,
    /// The instruction of the stepped context that retires at the next
    /// step, while a step is in progress.
    pub step_from: Option<u64>,
    /// A port instruction of the stepped context that exited: (its address,
    /// the address after it). kvm_pvm completes it without the single-step
    /// trap, so the next trap retires two instructions.
    pub pio_step: Option<(u64, u64)>,
}

/// A vCPU's stepper.
#[derive(Debug)]
pub struct Stepper {
    pub(super) backend: Option<StepBackend>,
    pub(super) state: StepState,
}

impl Stepper {
    /// `backend` is the host's, when the VM offers precise events to a
    /// shim guest (`None`: no stepping).
    pub fn new(backend: Option<StepBackend>, state: StepState) -> Self {
        Stepper { backend, state }
    }

    /// What a snapshot saves.
    pub fn state(&self) -> StepState {
        self.state
    }

    /// The backend, when the VM steps at all.
    pub fn backend(&self) -> Option<StepBackend> {
        self.backend
    }

    /// True when precise events can be produced now: KVM steps by itself,
    /// or the guest declared the #DB doorbell the trap-flag backend needs.
    pub fn ready(&self) -> bool {
        match self.backend {
            Some(StepBackend::GuestDebug) => true,
            Some(StepBackend::TrapFlag) => self.state.db_declared,
            None => false,
        }
    }

    /// True when the VM offers precise events it cannot produce yet.
    pub fn withholds(&self) -> bool {
        self.backend.is_some() && !self.ready()
    }

    pub(super) fn declare_db(&mut self) {
        self.state.db_declared = true;
    }

    /// Stops stepping (a task switches out): the step origin, if a step was
    /// in progress. A pending port instruction is forgotten with it.
    pub(super) fn take(&mut self) -> Option<u64> {
        self.state.pio_step = None;
        self.state.step_from.take()
    }

    /// Resumes stepping at `origin` (a task switches in whose trap flag is
    /// still set in its saved frame); only the trap-flag backend resumes
    /// this way, the guest-debug one arms at the next exit.
    pub(super) fn resume(&mut self, origin: u64) -> bool {
        if !self.trap_flag() || !self.ready() {
            return false;
        }
        self.state.step_from = Some(origin);
        true
    }

    pub(super) fn trap_flag(&self) -> bool {
        self.backend == Some(StepBackend::TrapFlag)
    }
}
