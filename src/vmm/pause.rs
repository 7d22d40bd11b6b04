//! Pausing every vCPU at a consistent point for a snapshot. The main thread
//! requests a pause and kicks the vCPUs; each vCPU, right after a KVM_RUN
//! that returned on `immediate_exit` (so KVM has completed pending I/O and
//! applied dirty registers), saves its own state and parks; the main thread
//! collects the states, writes the snapshot and releases them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use super::snapshot::VcpuSnapshot;

const POLL: Duration = Duration::from_millis(50);

#[derive(Debug, Default)]
struct Parked {
    generation: u64,
    states: Vec<Option<Result<VcpuSnapshot, String>>>,
}

/// The rendezvous between the main thread and the vCPU threads.
#[derive(Debug, Default)]
pub struct PauseGate {
    requested: AtomicBool,
    parked: Mutex<Parked>,
    cv: Condvar,
}

impl PauseGate {
    /// A gate for `vcpus` vCPUs.
    pub fn new(vcpus: usize) -> Self {
        PauseGate {
            requested: AtomicBool::new(false),
            parked: Mutex::new(Parked {
                generation: 0,
                states: vec![None; vcpus],
            }),
            cv: Condvar::new(),
        }
    }

    /// True while a pause is requested.
    pub fn requested(&self) -> bool {
        self.requested.load(Ordering::Acquire)
    }

    /// Asks every vCPU to park (the caller then kicks them).
    pub fn request(&self) {
        self.requested.store(true, Ordering::Release);
    }

    /// vCPU side: hands over this vCPU's state and waits for the release
    /// (or for the VM to stop).
    pub fn park(&self, id: u8, state: Result<VcpuSnapshot, String>, stop: &AtomicBool) {
        let Ok(mut p) = self.parked.lock() else {
            return;
        };
        if let Some(slot) = p.states.get_mut(usize::from(id)) {
            *slot = Some(state);
        }
        let generation = p.generation;
        self.cv.notify_all();
        while p.generation == generation && !stop.load(Ordering::Acquire) {
            p = match self.cv.wait_timeout(p, POLL) {
                Ok((guard, _)) => guard,
                Err(_) => return,
            };
        }
    }

    /// Main side: waits until every vCPU has parked and returns their
    /// states; `Err` when the VM stopped first or a vCPU could not save.
    pub fn collect(&self, stop: &AtomicBool) -> Result<Vec<VcpuSnapshot>, String> {
        let mut p = self
            .parked
            .lock()
            .map_err(|_| "pause lock poisoned".to_owned())?;
        while p.states.iter().any(Option::is_none) {
            if stop.load(Ordering::Acquire) {
                return Err("the VM stopped before every vCPU paused".into());
            }
            p = self
                .cv
                .wait_timeout(p, POLL)
                .map_err(|_| "pause lock poisoned".to_owned())?
                .0;
        }
        p.states
            .iter()
            .map(|s| s.clone().unwrap_or_else(|| Err("missing".into())))
            .collect()
    }

    /// Main side: lets every parked vCPU run again.
    pub fn release(&self) {
        self.requested.store(false, Ordering::Release);
        if let Ok(mut p) = self.parked.lock() {
            p.generation += 1;
            p.states.iter_mut().for_each(|s| *s = None);
        }
        self.cv.notify_all();
    }
}
