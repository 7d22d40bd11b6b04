//! The vCPU thread's run states and the events that move it between them,
//! as a table the thread follows ([`on_event`]): pure, so the protocol the
//! control thread drives is tested without /dev/kvm.
//!
//! - Running: the thread is in or around KVM_RUN. `Pause` settles the vCPU
//!   (one KVM_RUN with `immediate_exit`, which completes pending I/O and
//!   applies dirty registers) and answers `Paused`; `SaveState` is refused
//!   (a running vCPU's state is not consistent); `Resume` is answered;
//!   `Finish` stops.
//! - Paused: the thread blocks on its channel. `SaveState` captures the
//!   state, `Pause` answers again, `Resume` answers and runs, `Finish`
//!   stops (a stop that arrives while paused needs no resume first).
//! - Stopped: nothing more is read.
//!
//! A snapshot point (the guest's write to the snapshot port) settles and
//! pauses without being asked, and answers nothing ([`on_hold`]).

use super::protocol::VcpuEvent;

/// Where the vCPU thread is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunState {
    /// Running the guest.
    Running,
    /// Settled at a consistent point, waiting for events.
    Paused,
    /// Out of its loop.
    Stopped,
}

/// What the thread answers the control thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// `Paused`.
    Paused,
    /// `Resumed`.
    Resumed,
    /// Its captured state.
    State,
    /// A refusal to capture its state: it is running.
    StateRefused,
}

/// What an event does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// The state after it.
    pub next: RunState,
    /// Settle the vCPU first (entering Paused from Running).
    pub settle: bool,
    /// The answer, after settling.
    pub reply: Option<Reply>,
}

const fn to(next: RunState, settle: bool, reply: Option<Reply>) -> Transition {
    Transition {
        next,
        settle,
        reply,
    }
}

/// What `event` does in `state`.
pub fn on_event(state: RunState, event: VcpuEvent) -> Transition {
    use RunState::{Paused, Running, Stopped};
    match (state, event) {
        (Running, VcpuEvent::Pause) => to(Paused, true, Some(Reply::Paused)),
        (Running, VcpuEvent::Resume) => to(Running, false, Some(Reply::Resumed)),
        (Running, VcpuEvent::SaveState) => to(Running, false, Some(Reply::StateRefused)),
        (Paused, VcpuEvent::Pause) => to(Paused, false, Some(Reply::Paused)),
        (Paused, VcpuEvent::Resume) => to(Running, false, Some(Reply::Resumed)),
        (Paused, VcpuEvent::SaveState) => to(Paused, false, Some(Reply::State)),
        (_, VcpuEvent::Finish) | (Stopped, _) => to(Stopped, false, None),
    }
}

/// A snapshot point while running: settle and pause, unasked.
pub fn on_hold() -> Transition {
    to(RunState::Paused, true, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use RunState::{Paused, Running, Stopped};

    /// Plays `events` from Running: the states, settles and replies seen.
    fn play(events: &[VcpuEvent]) -> (Vec<RunState>, usize, Vec<Reply>) {
        let (mut state, mut settles, mut replies, mut states) =
            (Running, 0, Vec::new(), Vec::new());
        for &e in events {
            let t = on_event(state, e);
            settles += usize::from(t.settle);
            replies.extend(t.reply);
            state = t.next;
            states.push(state);
        }
        (states, settles, replies)
    }

    #[test]
    fn the_control_threads_sequences() {
        use VcpuEvent::{Finish, Pause, Resume, SaveState};
        // (events, states after each, settles, replies)
        type Row = (
            &'static [VcpuEvent],
            &'static [RunState],
            usize,
            &'static [Reply],
        );
        let table: &[Row] = &[
            // A snapshot: pause, save, resume.
            (
                &[Pause, SaveState, Resume],
                &[Paused, Paused, Running],
                1,
                &[Reply::Paused, Reply::State, Reply::Resumed],
            ),
            // A pause the API asked for twice, then a stop while paused.
            (
                &[Pause, Pause, Finish],
                &[Paused, Paused, Stopped],
                1,
                &[Reply::Paused, Reply::Paused],
            ),
            // A snapshot that arrives while stopping: nothing is read.
            (
                &[Finish, SaveState, Resume],
                &[Stopped, Stopped, Stopped],
                0,
                &[],
            ),
            // A state asked of a running vCPU is refused, the run goes on.
            (
                &[SaveState, Resume],
                &[Running, Running],
                0,
                &[Reply::StateRefused, Reply::Resumed],
            ),
            // Pause and resume twice: each pause settles once.
            (
                &[Pause, Resume, Pause, Resume],
                &[Paused, Running, Paused, Running],
                2,
                &[Reply::Paused, Reply::Resumed, Reply::Paused, Reply::Resumed],
            ),
        ];
        for (events, states, settles, replies) in table {
            assert_eq!(
                play(events),
                (states.to_vec(), *settles, replies.to_vec()),
                "{events:?}"
            );
        }
    }

    #[test]
    fn a_snapshot_point_pauses_unasked() {
        let t = on_hold();
        assert_eq!((t.next, t.settle, t.reply), (Paused, true, None));
        // Then the control thread's pause is answered without settling
        // again, and its save captures.
        assert_eq!(
            on_event(t.next, VcpuEvent::Pause).reply,
            Some(Reply::Paused)
        );
        assert!(!on_event(t.next, VcpuEvent::Pause).settle);
        assert_eq!(
            on_event(t.next, VcpuEvent::SaveState).reply,
            Some(Reply::State)
        );
    }
}
