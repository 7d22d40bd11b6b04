//! routes.rs's tests.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::vmm::base::control_error::ControlError;
use crate::vmm::base::metrics::{VcpuMetrics, VmCounters};
use crate::vmm::base::request::{Request as VmRequest, SnapshotInfo};

/// A handle whose requests a thread answers as a running VM would;
/// a snapshot into `/refused` fails.
fn vm() -> VmmHandle {
    let (handle, requests) = VmmHandle::for_test();
    std::thread::spawn(move || {
        for request in requests {
            match request {
                VmRequest::Pause(r) | VmRequest::Resume(r) => {
                    let _ = r.send(Ok(()));
                }
                VmRequest::Snapshot(dir, kind, r) => {
                    let _ = r.send(if dir.starts_with("/refused") {
                        Err(ControlError::Directory {
                            path: dir,
                            reason: "Permission denied".into(),
                        })
                    } else if dir.starts_with("/full") {
                        Err(ControlError::host(
                            "writing the memory file",
                            "No space left on device",
                        ))
                    } else if kind == SnapshotKind::Diff {
                        Err(ControlError::NoParent)
                    } else {
                        Ok(SnapshotInfo {
                            dir,
                            state_bytes: 1,
                            memory_bytes: 2,
                            pause_time: Duration::ZERO,
                            total_time: Duration::ZERO,
                        })
                    });
                }
                VmRequest::Metrics(r) => {
                    let _ = r.send(VmCounters::of(
                        &[Arc::new(VcpuMetrics::default())],
                        &[],
                        &Default::default(),
                    ));
                }
                VmRequest::Paused(r) => {
                    let _ = r.send(true);
                }
                VmRequest::FlushMetrics(r) => {
                    let _ = r.send(Err(ControlError::NoMetricsFile));
                }
                VmRequest::ReplaceDisk(_, _, r) => {
                    let _ = r.send(Ok(()));
                }
                VmRequest::SampleHz(hz, r) => {
                    let _ = r.send(match hz {
                        7 => Err(ControlError::NoSampler),
                        8 => Err(ControlError::Stopped("every vCPU paused")),
                        _ => Ok(()),
                    });
                }
                VmRequest::Stop => {}
            }
        }
    });
    handle
}

/// The routes' context over `vm`, without a sysroot or a capture.
fn context(vm: &VmmHandle) -> Context<'_> {
    Context {
        vm,
        sysroot: None,
        kernel: None,
        started: None,
        origin: Origin::Unix,
    }
}

#[test]
fn endpoints() {
    use Origin::{Tcp, Unix};
    // (origin, method, path, body, status, text in the answer)
    let table: &[(Origin, &str, &str, &str, u16, &str)] = &[
        (Unix, "GET", "/", "", 200, "\"Paused\""),
        (Unix, "PATCH", "/vm", r#"{"state":"Paused"}"#, 204, ""),
        (Unix, "PATCH", "/vm", r#"{"state":"Resumed"}"#, 204, ""),
        (
            Unix,
            "PATCH",
            "/vm",
            r#"{"state":"Asleep"}"#,
            400,
            "Resumed",
        ),
        (
            Unix,
            "PATCH",
            "/vm",
            r#"{"state":"Paused","x":1}"#,
            400,
            "unknown field",
        ),
        (Unix, "PATCH", "/vm", "", 400, "send e.g."),
        (
            Unix,
            "PUT",
            "/snapshot/create",
            r#"{"snapshot_path":"/s"}"#,
            200,
            "\"memory_bytes\": 2",
        ),
        // Whose fault a failure was sets its status.
        (
            Unix,
            "PUT",
            "/snapshot/create",
            r#"{"snapshot_path":"/refused/s"}"#,
            400,
            "cannot create the snapshot directory /refused/s",
        ),
        (
            Unix,
            "PUT",
            "/snapshot/create",
            r#"{"snapshot_path":"/full/s"}"#,
            500,
            "No space left on device",
        ),
        (Unix, "PUT", "/snapshot/create", "[]", 400, "snapshot_path"),
        (
            Unix,
            "PUT",
            "/snapshot/create",
            r#"{"snapshot_path":"/s","snapshot_type":"Diff"}"#,
            409,
            "take a full one first",
        ),
        (
            Unix,
            "PUT",
            "/snapshot/create",
            r#"{"snapshot_path":"/s","snapshot_type":"Half"}"#,
            400,
            "Diff",
        ),
        (Unix, "GET", "/vm/metrics", "", 200, "\"vcpus\""),
        (
            Unix,
            "GET",
            "/metrics",
            "",
            200,
            "lwpvmm_lwpins_total{vcpu=\"0\"} 0",
        ),
        (
            Unix,
            "PUT",
            "/actions",
            r#"{"action_type":"Stop"}"#,
            204,
            "",
        ),
        (
            Unix,
            "PUT",
            "/actions",
            r#"{"action_type":"Reboot"}"#,
            400,
            "Stop",
        ),
        (Unix, "POST", "/vm", "", 405, "/vm takes PATCH"),
        (Unix, "GET", "/nowhere", "", 404, "/snapshot/create"),
        (
            Tcp,
            "GET",
            "/metrics",
            "",
            200,
            "# TYPE lwpvmm_lwpins_total counter",
        ),
        // A monitor's probe: the head of GET's answer, nothing else.
        (Tcp, "HEAD", "/metrics", "", 200, ""),
        (Tcp, "HEAD", "/debug/pprof/profile", "", 405, "takes GET"),
        (
            Tcp,
            "PATCH",
            "/vm",
            r#"{"state":"Paused"}"#,
            403,
            "--api-sock",
        ),
        (
            Tcp,
            "PUT",
            "/actions",
            r#"{"action_type":"Stop"}"#,
            403,
            "only on the Unix socket",
        ),
        (
            Tcp,
            "GET",
            "/nowhere",
            "",
            404,
            "there are: /metrics, /debug/pprof/profile",
        ),
        (Unix, "GET", "/capture", "", 200, "\"sample_hz\": 1000"),
        (
            Unix,
            "PATCH",
            "/capture",
            r#"{"sample_hz":500,"events":[5]}"#,
            204,
            "",
        ),
        (
            Unix,
            "GET",
            "/capture",
            "",
            200,
            "\"events\": [\n    5\n  ]",
        ),
        (
            Unix,
            "PATCH",
            "/capture",
            r#"{"sample_hz":7}"#,
            409,
            "there is no sampler",
        ),
        (
            Unix,
            "PATCH",
            "/capture",
            r#"{"sample_hz":8}"#,
            503,
            "the VM stopped before every vCPU paused",
        ),
        (
            Unix,
            "PATCH",
            "/capture",
            r#"{"sample_hz":1000000}"#,
            400,
            "at most 100000",
        ),
        (
            Unix,
            "PATCH",
            "/capture",
            r#"{"events":[256]}"#,
            400,
            "send e.g.",
        ),
        (
            Unix,
            "PATCH",
            "/capture",
            r#"{"trace":true}"#,
            400,
            "--trace PATH",
        ),
        (
            Unix,
            "PATCH",
            "/capture",
            r#"{"rate":1}"#,
            400,
            "unknown field",
        ),
        (
            Unix,
            "PATCH",
            "/capture",
            r#"{"events":[7]}"#,
            400,
            "7 is not an LWP EventId",
        ),
        (
            Unix,
            "PUT",
            "/capture/stop",
            "",
            409,
            "no capture is running",
        ),
        (Unix, "PUT", "/capture/start", "", 204, ""),
        (Unix, "PUT", "/capture/start", "", 409, "running already"),
        (Unix, "PUT", "/capture/stop", "", 200, ""),
        (Unix, "DELETE", "/capture", "", 405, "GET or PATCH"),
        (
            Tcp,
            "PUT",
            "/capture/start",
            "",
            403,
            "only on the Unix socket",
        ),
    ];
    let vm = vm();
    let mut cx = context(&vm);
    for &(origin, method, path, body, status, text) in table {
        let request = Request {
            method: method.into(),
            path: path.into(),
            query: None,
            body: body.as_bytes().to_vec(),
        };
        let Answer::Now(answer) = route(&request, origin, &mut cx) else {
            panic!("{method} {path} answers at once");
        };
        let shown = String::from_utf8_lossy(&answer.body);
        assert_eq!(answer.status, status, "{origin:?} {method} {path}: {shown}");
        assert!(shown.contains(text), "{origin:?} {method} {path}: {shown}");
        let wire = answer.to_bytes();
        let head_only = method == "HEAD" && status == 200;
        assert_eq!(
            wire.ends_with(b"\r\n\r\n"),
            head_only || answer.body.is_empty(),
            "{method} {path}: a HEAD answer has no body, others theirs"
        );
    }
}

#[test]
fn a_vm_that_ended_is_a_503() {
    let (vm, requests) = VmmHandle::for_test();
    drop(requests);
    let request = Request {
        method: "GET".into(),
        path: "/metrics".into(),
        query: None,
        body: Vec::new(),
    };
    let mut cx = context(&vm);
    assert_eq!(
        route(&request, Origin::Tcp, &mut cx),
        Answer::Now(Response::fault(503, "the VM is not running"))
    );
}

#[test]
fn a_pprof_request_captures_for_the_seconds_it_asks() {
    // (query, Ok(seconds) or the status of the refusal)
    let table: &[(Option<&str>, Result<u64, u16>)] = &[
        (None, Ok(DEFAULT_PROFILE_SECONDS)),
        (Some("seconds=5"), Ok(5)),
        (Some("debug=1&seconds=2"), Ok(2)),
        (Some("seconds=0"), Err(400)),
        (Some("seconds=301"), Err(400)),
        (Some("seconds=-1"), Err(400)),
        (Some("seconds=5x"), Err(400)),
        (Some("seconds"), Err(400)),
        (Some("seconds=2&kernel=1"), Ok(2)),
        (Some("kernel=0"), Ok(DEFAULT_PROFILE_SECONDS)),
        (Some("kernel=yes"), Err(400)),
    ];
    let vm = vm();
    for &(query, want) in table {
        let mut cx = context(&vm);
        let request = Request {
            method: "GET".into(),
            path: "/debug/pprof/profile".into(),
            query: query.map(String::from),
            body: Vec::new(),
        };
        let before = Instant::now();
        match (route(&request, Origin::Tcp, &mut cx), want) {
            (Answer::Profile { id, due }, Ok(seconds)) => {
                let asked = due.duration_since(before).as_secs_f64();
                assert!((asked - seconds as f64).abs() < 1.0, "{query:?}: {asked}");
                // kernel=1 has the sampler take whole-guest samples
                // while its capture runs, and only then.
                let kernel = query.is_some_and(|q| q.contains("kernel=1"));
                assert_eq!(vm.recorder().whole_guest(), kernel, "{query:?}");
                let done = finish_profile(id, &cx);
                assert!(!vm.recorder().whole_guest(), "{query:?}");
                assert_eq!(done.status, 200, "{query:?}");
                let profile = pprof::read(&done.body).expect("a gzipped profile");
                assert!(profile.string_table.iter().any(|s| s.contains("lwpvmm")));
            }
            (Answer::Now(r), Err(status)) => assert_eq!(r.status, status, "{query:?}"),
            (got, _) => panic!("{query:?}: {got:?}"),
        }
    }
    assert_eq!(vm.recorder().running(), 0, "every capture ended");
}
