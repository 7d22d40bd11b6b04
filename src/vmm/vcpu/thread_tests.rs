//! The vCPU thread's protocol, run on a vCPU that exits on cue (cued.rs):
//! the thread itself, its loop, its channels and its kick, without
//! /dev/kvm. Each test drives it as the control thread does and checks
//! what it answers, how it ends, and what it tells the other threads.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::cued::{Cue, CuedVcpu, Cues, kicks_handled, shared};
use super::protocol::{VcpuError, VcpuEvent, VcpuResponse, VcpuStop};
use super::thread::{VcpuHandle, VcpuShared};
use crate::vmm::base::control_error::ControlError;
use crate::vmm::base::pv::{EXIT_PORT, SNAPSHOT_PORT};
use crate::vmm::base::seccomp::SeccompMode;
use crate::vmm::devices::port_bus::{GuestEnd, POST_PORT};

/// vCPU 0 of `shared`, started on cue.
fn start(
    shared: &std::sync::Arc<VcpuShared>,
) -> (
    VcpuHandle,
    Cues,
    std::sync::Arc<std::sync::atomic::AtomicU32>,
) {
    kicks_handled();
    let cues = Cues::default();
    let (vcpu, settled) = CuedVcpu::vcpu(0, cues.clone());
    let handle = vcpu
        .start(std::sync::Arc::clone(shared), SeccompMode::Off)
        .expect("the vCPU thread");
    (handle, cues, settled)
}

/// What the thread answers `event`.
fn ask(h: &VcpuHandle, event: VcpuEvent) -> Option<VcpuResponse> {
    assert!(h.send(event), "the thread ended before {event:?}");
    h.recv()
}

/// Waits until the thread has taken every cue (it runs on meanwhile).
fn taken(cues: &Cues, cue: Cue) {
    cues.push(cue);
    let start = Instant::now();
    while !cues.is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the cue was never taken"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn pause_save_resume_and_finish() {
    let shared = shared(false);
    let (h, cues, settled) = start(&shared);
    taken(&cues, Cue::Out(POST_PORT, vec![1]));
    assert!(matches!(
        ask(&h, VcpuEvent::Pause),
        Some(VcpuResponse::Paused)
    ));
    assert_eq!(
        settled.load(Ordering::Relaxed),
        1,
        "a pause settles the vCPU once"
    );
    assert!(matches!(
        ask(&h, VcpuEvent::Pause),
        Some(VcpuResponse::Paused)
    ));
    match ask(&h, VcpuEvent::SaveState) {
        Some(VcpuResponse::State(state)) => assert_eq!(state.expect("its state").id, 0),
        other => panic!("asked its state, answered {other:?}"),
    }
    assert!(matches!(
        ask(&h, VcpuEvent::Resume),
        Some(VcpuResponse::Resumed)
    ));
    // Running again: it takes the guest's next exit.
    taken(&cues, Cue::Out(POST_PORT, vec![2]));
    assert_eq!(
        settled.load(Ordering::Relaxed),
        1,
        "a resume does not settle"
    );
    assert!(h.send(VcpuEvent::Finish));
    let (result, _) = h.join().expect("the thread");
    assert!(matches!(result, Ok(VcpuStop::Stopped)), "{result:?}");
    assert!(
        !shared.stop.load(Ordering::Acquire),
        "a finish asked for is not the VM's end"
    );
}

#[test]
fn events_while_running_and_while_paused_follow_the_table() {
    // (events sent in order, the answers expected, how the thread ends)
    type Case = (&'static [VcpuEvent], &'static [&'static str], &'static str);
    let table: [Case; 4] = [
        // A running vCPU's state is refused, not captured.
        (
            &[VcpuEvent::SaveState, VcpuEvent::Finish],
            &["refused"],
            "stopped",
        ),
        // A stop that arrives while paused needs no resume first.
        (
            &[VcpuEvent::Pause, VcpuEvent::Finish],
            &["paused"],
            "stopped",
        ),
        // A resume while running is answered and changes nothing.
        (
            &[
                VcpuEvent::Resume,
                VcpuEvent::Pause,
                VcpuEvent::Resume,
                VcpuEvent::Finish,
            ],
            &["resumed", "paused", "resumed"],
            "stopped",
        ),
        // A state asked for while it stops: the thread is gone and answers
        // nothing, which the control thread reads as "stopped".
        (&[VcpuEvent::Finish, VcpuEvent::SaveState], &[], "stopped"),
    ];
    for (events, answers, end) in table {
        let shared = shared(false);
        let (h, _cues, _) = start(&shared);
        let mut got = Vec::new();
        for &event in events {
            h.send(event);
            if event == VcpuEvent::Finish {
                continue;
            }
            match h.recv() {
                Some(VcpuResponse::Paused) => got.push("paused"),
                Some(VcpuResponse::Resumed) => got.push("resumed"),
                Some(VcpuResponse::State(s)) => match *s {
                    Err(ControlError::Protocol { .. }) => got.push("refused"),
                    other => panic!("{events:?}: state {other:?}"),
                },
                None => {}
            }
        }
        assert_eq!(got, answers, "{events:?}");
        let (result, _) = h.join().expect("the thread");
        let ended = match result {
            Ok(VcpuStop::Stopped) => "stopped",
            other => panic!("{events:?}: {other:?}"),
        };
        assert_eq!(ended, end, "{events:?}");
    }
}

#[test]
fn the_guest_or_a_failure_ends_the_vm() {
    // (the last exit, how the thread ends)
    let table = [
        (Cue::Out(EXIT_PORT, vec![3]), "exit port 3"),
        (Cue::Fail(libc::EFAULT), "KVM_RUN failed"),
    ];
    for (cue, end) in table {
        let shared = shared(false);
        let (h, cues, _) = start(&shared);
        cues.push(cue.clone());
        let (result, _) = h.join().expect("the thread");
        let ended = match result {
            Ok(VcpuStop::Ended(GuestEnd::ExitPort(v))) => format!("exit port {v}"),
            Err(VcpuError::Run { .. }) => "KVM_RUN failed".to_string(),
            other => panic!("{cue:?}: {other:?}"),
        };
        assert_eq!(ended, end);
        // The other threads learn of it: the stop flag and the exit eventfd.
        assert!(shared.stop.load(Ordering::Acquire), "{cue:?}");
        assert_eq!(shared.exit.read().ok(), Some(1), "{cue:?}");
    }
}

#[test]
fn a_snapshot_point_pauses_unasked_until_resumed() {
    let shared = shared(true);
    let (h, cues, settled) = start(&shared);
    cues.push(Cue::Out(SNAPSHOT_PORT, vec![0]));
    // The control thread hears of it on the snapshot-point eventfd.
    let start = Instant::now();
    while shared.snapshot_point.read().is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no snapshot point"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // Held: the guest's next exit waits, the state can be taken.
    cues.push(Cue::Out(POST_PORT, vec![1]));
    match ask(&h, VcpuEvent::SaveState) {
        Some(VcpuResponse::State(state)) => assert!(state.is_ok(), "{state:?}"),
        other => panic!("a held vCPU's state: {other:?}"),
    }
    assert_eq!(
        settled.load(Ordering::Relaxed),
        1,
        "the point settles the vCPU"
    );
    assert!(!cues.is_empty(), "a held vCPU took an exit");
    assert!(matches!(
        ask(&h, VcpuEvent::Resume),
        Some(VcpuResponse::Resumed)
    ));
    taken(&cues, Cue::Out(POST_PORT, vec![2]));
    assert!(h.send(VcpuEvent::Finish));
    assert!(matches!(
        h.join().expect("the thread").0,
        Ok(VcpuStop::Stopped)
    ));
}

#[test]
fn a_kick_leaves_a_running_vcpu_running() {
    let shared = shared(false);
    let (h, cues, _) = start(&shared);
    for _ in 0..100 {
        h.kick();
        h.kick_sample(false);
        h.kick_sample(true);
    }
    taken(&cues, Cue::Out(POST_PORT, vec![1]));
    assert!(matches!(
        ask(&h, VcpuEvent::Pause),
        Some(VcpuResponse::Paused)
    ));
    assert!(h.send(VcpuEvent::Finish));
    assert!(matches!(
        h.join().expect("the thread").0,
        Ok(VcpuStop::Stopped)
    ));
}
