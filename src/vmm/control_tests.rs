//! The control thread, run over vCPUs that exit on cue (vcpu/cued.rs) and a
//! VM without KVM: what its requests do (pause, resume, snapshots, the
//! sampler's rate, stop), whose fault a refused one is, and how the run
//! ends when the guest, a vCPU or a handle ends it, without /dev/kvm.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::channel;
use std::thread::JoinHandle;

use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::lwp::cpuid::{GuestLwpSupport, LwpProfile};
use crate::vmm::base::control_error::{ControlError, Fault};
use crate::vmm::base::pv::{EXIT_PORT, SNAPSHOT_PORT};
use crate::vmm::base::request::{SnapshotKind, VmmHandle};
use crate::vmm::base::seccomp::SeccompMode;
use crate::vmm::config::SnapshotPlan;
use crate::vmm::control::{ControlSetup, ControlThread, RunningThreads, VmOps};
use crate::vmm::devices::port_bus::{GuestEnd, POST_PORT};
use crate::vmm::error::VmError;
use crate::vmm::machine::MachineSpec;
use crate::vmm::outcome::{RunOutcome, VmEnd};
use crate::vmm::snapshot::{self, SnapshotError, VmKvmState};
use crate::vmm::vcpu::cued::{Cue, CuedVcpu, Cues, kicks_handled, shared};
use crate::vmm::vcpu::{VcpuError, VcpuRun};

/// A VM without KVM: kvmclock reads 0 and no page is ever dirty.
struct NoKvm;

impl VmOps for NoKvm {
    fn kvm_state(&self) -> Result<VmKvmState, SnapshotError> {
        Ok(VmKvmState {
            clock: Default::default(),
        })
    }

    fn dirty_log(&self, _slot: u32, len: usize) -> Result<Vec<u64>, kvm_ioctls::Error> {
        Ok(vec![0; len.div_ceil(4096).div_ceil(64)])
    }
}

/// A running control thread over cued vCPUs.
struct Running {
    handle: VmmHandle,
    cues: Vec<Cues>,
    settled: Vec<Arc<AtomicU32>>,
    control: JoinHandle<Result<RunOutcome, VmError>>,
}

impl Running {
    /// `vcpus` cued vCPUs under a control thread following `plan`.
    fn start(vcpus: u8, plan: SnapshotPlan) -> Running {
        kicks_handled();
        let shared = shared(plan.on_port);
        let (mut cues, mut settled, mut handles, mut metrics) = (vec![], vec![], vec![], vec![]);
        for id in 0..vcpus {
            let c = Cues::default();
            let (vcpu, s) = CuedVcpu::vcpu(id, c.clone());
            metrics.push(vcpu.metrics());
            handles.push(
                vcpu.start(Arc::clone(&shared), SeccompMode::Off)
                    .expect("a vCPU thread"),
            );
            cues.push(c);
            settled.push(s);
        }
        let (sender, requests) = channel();
        let wake = Arc::new(EventFd::new(EFD_NONBLOCK).expect("an eventfd"));
        let handle = VmmHandle::new(sender, Arc::clone(&wake), Arc::clone(&shared.recorder));
        let threads = RunningThreads {
            vcpus: handles,
            vcpu_metrics: metrics,
            devices: None,
            device_metrics: Vec::new(),
        };
        let spec = MachineSpec {
            memory_mib: 2,
            vcpus,
            profile: LwpProfile::Off,
            guest: GuestLwpSupport::Shim,
        };
        let setup = ControlSetup {
            metrics_file: None,
            plan,
            sample_hz: None,
            requests: (requests, wake.try_clone().expect("an eventfd")),
            stop_signals: None,
            parent: None,
        };
        let control = ControlThread::new(Arc::new(NoKvm), shared, threads, spec, setup);
        let control = std::thread::spawn(move || control.run(SeccompMode::Off));
        Running {
            handle,
            cues,
            settled,
            control,
        }
    }

    /// How many times each vCPU was settled for a pause.
    fn settled(&self) -> Vec<u32> {
        self.settled
            .iter()
            .map(|s| s.load(Ordering::Relaxed))
            .collect()
    }

    fn end(self) -> Result<RunOutcome, VmError> {
        self.control.join().expect("the control thread")
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lwpvmm-control-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The vCPU IDs a snapshot directory's state file holds.
fn saved_vcpus(dir: &Path) -> Vec<u8> {
    let path = dir.join(snapshot::STATE_FILE);
    let bytes = std::fs::read(&path).expect("the state file");
    let state = snapshot::decode(&bytes, &path).expect("a valid state file");
    state.vcpus.iter().map(|v| v.id).collect()
}

#[test]
fn pause_snapshot_resume_and_stop() {
    let vm = Running::start(2, SnapshotPlan::default());
    vm.cues[1].push(Cue::Out(POST_PORT, vec![1]));
    vm.handle.pause().expect("a pause");
    assert!(vm.handle.is_paused().expect("an answer"));
    assert_eq!(vm.settled(), [1, 1], "a pause settles every vCPU once");
    let dir = scratch("paused");
    let info = vm.handle.snapshot(&dir).expect("a snapshot");
    assert_eq!(info.memory_bytes, 2 << 20);
    assert_eq!(saved_vcpus(&dir), [0, 1]);
    assert!(
        vm.handle.is_paused().expect("an answer"),
        "a paused VM stays paused"
    );
    vm.handle.resume().expect("a resume");
    assert!(!vm.handle.is_paused().expect("an answer"));
    // Unpaused, a snapshot pauses the VM for itself and resumes it.
    let dir2 = scratch("running");
    vm.handle.snapshot(&dir2).expect("a snapshot");
    assert_eq!(saved_vcpus(&dir2), [0, 1]);
    assert!(!vm.handle.is_paused().expect("an answer"));
    assert_eq!(vm.settled(), [2, 2]);
    vm.handle.stop();
    let outcome = vm.end().expect("the run");
    assert_eq!(outcome.end, VmEnd::Stopped);
    assert!(outcome.errors.is_empty(), "{:?}", outcome.errors);
    for d in [dir, dir2] {
        let _ = std::fs::remove_dir_all(d);
    }
}

#[test]
fn a_stop_while_paused_ends_the_run() {
    let vm = Running::start(2, SnapshotPlan::default());
    vm.handle.pause().expect("a pause");
    vm.handle.stop();
    assert_eq!(vm.end().expect("the run").end, VmEnd::Stopped);
}

#[test]
fn refused_requests_say_whose_fault_they_were() {
    let vm = Running::start(1, SnapshotPlan::default());
    let dir = scratch("refused");
    // (what was asked, its error, whose fault)
    let table: Vec<(&str, ControlError, Fault)> = vec![
        (
            "the sampler's rate",
            vm.handle.set_sample_hz(100).expect_err("no sampler"),
            Fault::Conflict,
        ),
        (
            "a diff snapshot",
            vm.handle
                .snapshot_of(&dir, SnapshotKind::Diff)
                .expect_err("no dirty-page tracking"),
            Fault::Conflict,
        ),
    ];
    for (asked, error, fault) in table {
        assert_eq!(error.fault(), fault, "{asked}: {error}");
    }
    // The VM runs on after a refusal.
    assert!(!vm.handle.is_paused().expect("an answer"));
    // A snapshot that arrives while the VM stops is answered: stopping.
    vm.handle.stop();
    let late = vm.handle.snapshot(&dir).expect_err("the VM stops");
    assert_eq!(late.fault(), Fault::Stopping, "{late}");
    let handle = vm.handle.clone();
    assert_eq!(vm.end().expect("the run").end, VmEnd::Stopped);
    assert_eq!(
        handle.pause().expect_err("the VM ended"),
        ControlError::NotRunning
    );
    assert!(!dir.join(snapshot::STATE_FILE).exists());
}

#[test]
fn the_guest_or_a_vcpu_ends_the_run() {
    let vm = Running::start(2, SnapshotPlan::default());
    vm.cues[1].push(Cue::Out(EXIT_PORT, vec![7]));
    assert_eq!(
        vm.end().expect("the run").end,
        VmEnd::Guest(GuestEnd::ExitPort(7))
    );
    let vm = Running::start(2, SnapshotPlan::default());
    vm.cues[0].push(Cue::Fail(libc::EFAULT));
    match vm.end() {
        Err(VmError::Vcpu(VcpuError::Run { vcpu: 0, .. })) => {}
        other => panic!("a failed KVM_RUN ended the run with {other:?}"),
    }
}

#[test]
fn a_snapshot_point_is_taken_and_the_guest_runs_on() {
    let dir = scratch("point");
    let vm = Running::start(
        2,
        SnapshotPlan {
            dir: Some(dir.clone()),
            on_port: true,
            ..SnapshotPlan::default()
        },
    );
    vm.cues[0].push(Cue::Out(SNAPSHOT_PORT, vec![0]));
    vm.cues[0].push(Cue::Out(EXIT_PORT, vec![5]));
    let outcome = vm.end().expect("the run");
    assert_eq!(outcome.end, VmEnd::Guest(GuestEnd::ExitPort(5)));
    assert!(outcome.errors.is_empty(), "{:?}", outcome.errors);
    assert_eq!(saved_vcpus(&dir), [0, 1]);
    let _ = std::fs::remove_dir_all(dir);
}

/// The fake these tests stand on: it takes its cues in order, and with
/// none queued it runs on (EINTR, as a guest the host interrupts).
#[test]
fn cues_are_taken_in_order() {
    let cues = Cues::default();
    cues.push(Cue::Out(POST_PORT, vec![1]));
    cues.push(Cue::Fail(libc::EIO));
    let mut vcpu = CuedVcpu::new(0, cues.clone());
    assert!(matches!(
        vcpu.run(),
        Ok(kvm_ioctls::VcpuExit::IoOut(POST_PORT, [1]))
    ));
    assert_eq!(
        vcpu.run().map(|_| ()).map_err(|e| e.errno()),
        Err(libc::EIO)
    );
    assert_eq!(
        vcpu.run().map(|_| ()).map_err(|e| e.errno()),
        Err(libc::EINTR)
    );
    assert!(cues.is_empty());
}
