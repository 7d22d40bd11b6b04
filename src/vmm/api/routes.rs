//! What each endpoint of the control API does, on a [`VmmHandle`]. Named
//! after Firecracker's API (`PATCH /vm`, `PUT /snapshot/create`,
//! `PUT /actions`). Control endpoints answer only on the Unix socket; the
//! TCP listener serves the read-only `GET /metrics` alone. docs/profiling.md
//! lists them with curl examples.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::http::{Request, Response};
use crate::vmm::error::VmError;
use crate::vmm::vmm::VmmHandle;

/// Where a request came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The owner-only Unix socket (`--api-sock`): every endpoint.
    Unix,
    /// The TCP listener (`--api-listen`): the read-only endpoints.
    Tcp,
}

/// An endpoint: its path, method and whether TCP may reach it.
struct Endpoint {
    path: &'static str,
    method: &'static str,
    read_only: bool,
    answer: fn(&Request, &VmmHandle) -> Response,
}

const ENDPOINTS: &[Endpoint] = &[
    Endpoint {
        path: "/",
        method: "GET",
        read_only: false,
        answer: info,
    },
    Endpoint {
        path: "/vm",
        method: "PATCH",
        read_only: false,
        answer: vm_state,
    },
    Endpoint {
        path: "/snapshot/create",
        method: "PUT",
        read_only: false,
        answer: snapshot,
    },
    Endpoint {
        path: "/vm/metrics",
        method: "GET",
        read_only: false,
        answer: metrics_json,
    },
    Endpoint {
        path: "/actions",
        method: "PUT",
        read_only: false,
        answer: action,
    },
    Endpoint {
        path: "/metrics",
        method: "GET",
        read_only: true,
        answer: metrics_prometheus,
    },
];

/// The answer to `request` from `origin`.
pub fn route(request: &Request, origin: Origin, vm: &VmmHandle) -> Response {
    let at_path: Vec<&Endpoint> = ENDPOINTS
        .iter()
        .filter(|e| e.path == request.path)
        .collect();
    let Some(first) = at_path.first() else {
        let paths: Vec<&str> = ENDPOINTS
            .iter()
            .filter(|e| origin == Origin::Unix || e.read_only)
            .map(|e| e.path)
            .collect();
        return Response::fault(
            404,
            &format!(
                "no endpoint {}; there are: {}",
                printable(&request.path),
                paths.join(", ")
            ),
        );
    };
    if origin == Origin::Tcp && !first.read_only {
        return Response::fault(
            403,
            "control endpoints are served only on the Unix socket (--api-sock); TCP serves GET /metrics",
        );
    }
    match at_path.iter().find(|e| e.method == request.method) {
        Some(endpoint) => (endpoint.answer)(request, vm),
        None => {
            let mut r = Response::fault(
                405,
                &format!(
                    "{} takes {}, not {}",
                    first.path,
                    first.method,
                    printable(&request.method)
                ),
            );
            r.allow = Some(first.method);
            r
        }
    }
}

/// At most 64 characters of client text, for a message.
fn printable(text: &str) -> String {
    text.chars().take(64).collect()
}

/// The answer when the VM refused or has ended.
fn vm_error(e: VmError) -> Response {
    match e {
        VmError::NotRunning => Response::fault(503, "the VM is not running"),
        e => Response::fault(500, &e.to_string()),
    }
}

/// The body as `T`, or a 400 that says what is wrong with it.
fn body<'a, T: Deserialize<'a>>(request: &'a Request, example: &str) -> Result<T, Response> {
    serde_json::from_slice(&request.body).map_err(|e| {
        Response::fault(
            400,
            &format!(
                "the body is not what {} takes ({e}); send e.g. {example}",
                request.path
            ),
        )
    })
}

#[derive(Serialize)]
struct Info {
    state: &'static str,
    vmm_version: &'static str,
}

fn info(_: &Request, vm: &VmmHandle) -> Response {
    match vm.is_paused() {
        Ok(paused) => Response::json(
            200,
            &Info {
                state: if paused { "Paused" } else { "Running" },
                vmm_version: env!("CARGO_PKG_VERSION"),
            },
        ),
        Err(e) => vm_error(e),
    }
}

#[derive(Deserialize)]
enum VmStateName {
    Paused,
    Resumed,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VmState {
    state: VmStateName,
}

fn vm_state(request: &Request, vm: &VmmHandle) -> Response {
    let state: VmState = match body(request, r#"{"state": "Paused"} or {"state": "Resumed"}"#) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let done = match state.state {
        VmStateName::Paused => vm.pause(),
        VmStateName::Resumed => vm.resume(),
    };
    done.map_or_else(vm_error, |()| Response::no_content())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SnapshotCreate {
    snapshot_path: PathBuf,
}

#[derive(Serialize)]
struct SnapshotWritten {
    snapshot_path: PathBuf,
    state_bytes: u64,
    memory_bytes: u64,
    pause_ms: f64,
    total_ms: f64,
}

fn snapshot(request: &Request, vm: &VmmHandle) -> Response {
    let create: SnapshotCreate = match body(request, r#"{"snapshot_path": "/var/lib/lwpvmm/snap"}"#)
    {
        Ok(c) => c,
        Err(r) => return r,
    };
    match vm.snapshot(&create.snapshot_path) {
        Ok(info) => Response::json(
            200,
            &SnapshotWritten {
                snapshot_path: info.dir,
                state_bytes: info.state_bytes,
                memory_bytes: info.memory_bytes,
                pause_ms: info.pause_time.as_secs_f64() * 1e3,
                total_ms: info.total_time.as_secs_f64() * 1e3,
            },
        ),
        Err(VmError::EventLoop(why)) => Response::fault(400, &why),
        Err(e) => vm_error(e),
    }
}

fn metrics_json(_: &Request, vm: &VmmHandle) -> Response {
    vm.metrics()
        .map_or_else(vm_error, |m| Response::json(200, &m))
}

fn metrics_prometheus(_: &Request, vm: &VmmHandle) -> Response {
    vm.metrics().map_or_else(vm_error, |m| {
        Response::ok("text/plain; version=0.0.4", m.prometheus().into_bytes())
    })
}

#[derive(Deserialize)]
enum ActionType {
    Stop,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Action {
    action_type: ActionType,
}

fn action(request: &Request, vm: &VmmHandle) -> Response {
    match body::<Action>(request, r#"{"action_type": "Stop"}"#) {
        Ok(Action {
            action_type: ActionType::Stop,
        }) => {
            vm.stop();
            Response::no_content()
        }
        Err(r) => r,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::vmm::metrics::{VcpuMetrics, VmCounters};
    use crate::vmm::vmm::{Request as VmRequest, SnapshotInfo};

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
                    VmRequest::Snapshot(dir, r) => {
                        let _ = r.send(if dir.starts_with("/refused") {
                            Err("cannot create /refused".into())
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
                        let _ = r.send(VmCounters::of(&[Arc::new(VcpuMetrics::default())]));
                    }
                    VmRequest::Paused(r) => {
                        let _ = r.send(true);
                    }
                    VmRequest::Stop => {}
                }
            }
        });
        handle
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
            (
                Unix,
                "PUT",
                "/snapshot/create",
                r#"{"snapshot_path":"/refused/s"}"#,
                400,
                "cannot create",
            ),
            (Unix, "PUT", "/snapshot/create", "[]", 400, "snapshot_path"),
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
            (Tcp, "GET", "/nowhere", "", 404, "there are: /metrics"),
        ];
        let vm = vm();
        for &(origin, method, path, body, status, text) in table {
            let request = Request {
                method: method.into(),
                path: path.into(),
                query: None,
                body: body.as_bytes().to_vec(),
            };
            let answer = route(&request, origin, &vm);
            let shown = String::from_utf8_lossy(&answer.body);
            assert_eq!(answer.status, status, "{origin:?} {method} {path}: {shown}");
            assert!(shown.contains(text), "{origin:?} {method} {path}: {shown}");
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
        assert_eq!(route(&request, Origin::Tcp, &vm).status, 503);
    }
}
