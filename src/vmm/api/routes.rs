//! What each endpoint of the control API does, on a [`VmmHandle`]. Named
//! after Firecracker's API (`PATCH /vm`, `PUT /snapshot/create`,
//! `PUT /actions`), and for profiles after Go's `net/http/pprof`
//! (`GET /debug/pprof/profile?seconds=N`). Control endpoints answer only
//! on the Unix socket; the TCP listener serves the read-only `GET /metrics`
//! and `GET /debug/pprof/profile` alone. docs/profiling.md lists them with
//! curl examples.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::http::{Request, Response};
use crate::profile::capture::Capture;
use crate::profile::objects::Resolver;
use crate::profile::pprof;
use crate::profile::sysroot::Sysroot;
use crate::vmm::base::control_error::ControlError;
use crate::vmm::base::recorder::{CaptureError, CaptureId, CaptureOwner, EVENT_IDS};
use crate::vmm::base::request::{SnapshotKind, VmmHandle};

/// A pprof request's capture length unless it names one (Go's default).
pub const DEFAULT_PROFILE_SECONDS: u64 = 30;
/// The longest capture a pprof request may ask for.
pub const MAX_PROFILE_SECONDS: u64 = 300;

/// What the routes work on: the VM, the guest's files that name the
/// profiles' frames, and the capture `PUT /capture/start` began.
pub struct Context<'a> {
    /// The VM.
    pub vm: &'a VmmHandle,
    /// `--sysroot`, when given.
    pub sysroot: Option<Arc<Sysroot>>,
    /// The guest kernel's symbols, when known.
    pub kernel: Option<KernelSymbols>,
    /// The started capture, until `PUT /capture/stop`.
    pub started: Option<CaptureId>,
    /// Where the request being answered came from.
    pub origin: Origin,
}

/// The guest kernel's symbol file, read once: its path and bytes.
pub type KernelSymbols = (String, Arc<Vec<u8>>);

/// What a request gets.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    /// This response, now.
    Now(Response),
    /// The profile of capture `id`, once `due` comes (or the VM ends).
    Profile {
        /// The capture.
        id: CaptureId,
        /// When it ends.
        due: Instant,
    },
}

impl From<Response> for Answer {
    fn from(r: Response) -> Self {
        Answer::Now(r)
    }
}

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
    answer: fn(&Request, &mut Context<'_>) -> Answer,
}

const ENDPOINTS: &[Endpoint] = &[
    Endpoint {
        path: "/",
        method: "GET",
        read_only: false,
        answer: |r, cx| info(r, cx).into(),
    },
    Endpoint {
        path: "/vm",
        method: "PATCH",
        read_only: false,
        answer: |r, cx| vm_state(r, cx).into(),
    },
    Endpoint {
        path: "/snapshot/create",
        method: "PUT",
        read_only: false,
        answer: |r, cx| snapshot(r, cx).into(),
    },
    Endpoint {
        path: "/vm/metrics",
        method: "GET",
        read_only: false,
        answer: |r, cx| metrics_json(r, cx).into(),
    },
    Endpoint {
        path: "/actions",
        method: "PUT",
        read_only: false,
        answer: |r, cx| action(r, cx).into(),
    },
    Endpoint {
        path: "/capture",
        method: "GET",
        read_only: false,
        answer: |r, cx| capture_status(r, cx).into(),
    },
    Endpoint {
        path: "/capture",
        method: "PATCH",
        read_only: false,
        answer: |r, cx| capture_config(r, cx).into(),
    },
    Endpoint {
        path: "/capture/start",
        method: "PUT",
        read_only: false,
        answer: |r, cx| capture_start(r, cx).into(),
    },
    Endpoint {
        path: "/capture/stop",
        method: "PUT",
        read_only: false,
        answer: |r, cx| capture_stop(r, cx).into(),
    },
    Endpoint {
        path: "/metrics",
        method: "GET",
        read_only: true,
        answer: |r, cx| metrics_prometheus(r, cx).into(),
    },
    Endpoint {
        path: "/debug/pprof/profile",
        method: "GET",
        read_only: true,
        answer: pprof_profile,
    },
];

/// The answer to `request` from `origin`.
pub fn route(request: &Request, origin: Origin, cx: &mut Context<'_>) -> Answer {
    cx.origin = origin;
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
        let mut unique = paths;
        unique.dedup();
        return Response::fault(
            404,
            &format!(
                "no endpoint {}; there are: {}",
                printable(&request.path),
                unique.join(", ")
            ),
        )
        .into();
    };
    if origin == Origin::Tcp && !first.read_only {
        return Response::fault(
            403,
            "control endpoints are served only on the Unix socket (--api-sock); TCP serves GET /metrics and GET /debug/pprof/profile",
        )
        .into();
    }
    // HEAD is GET without the body, for the read-only GETs (a monitor's
    // probe of /metrics); never a capture.
    if request.method == "HEAD"
        && let Some(get) = at_path
            .iter()
            .find(|e| e.method == "GET" && e.path != "/debug/pprof/profile")
    {
        return match (get.answer)(request, cx) {
            Answer::Now(mut r) => {
                r.head_only = true;
                Answer::Now(r)
            }
            other => other,
        };
    }
    match at_path.iter().find(|e| e.method == request.method) {
        Some(endpoint) => (endpoint.answer)(request, cx),
        None => {
            let methods: Vec<&str> = at_path.iter().map(|e| e.method).collect();
            let mut r = Response::fault(
                405,
                &format!(
                    "{} takes {}, not {}",
                    first.path,
                    methods.join(" or "),
                    printable(&request.method)
                ),
            );
            r.allow = Some(first.method);
            r.into()
        }
    }
}

/// At most 64 characters of client text, for a message.
fn printable(text: &str) -> String {
    text.chars().take(64).collect()
}

/// The answer when the VM refused or has ended.
/// A failed request as an answer: whose fault it was sets the status (a
/// request's 400, a conflict's 409, a stopping VM's 503, the host's 500).
fn vm_error(e: ControlError) -> Response {
    Response::fault(e.status(), &e.to_string())
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

fn info(_: &Request, cx: &mut Context<'_>) -> Response {
    let vm = cx.vm;
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

fn vm_state(request: &Request, cx: &mut Context<'_>) -> Response {
    let vm = cx.vm;
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
    /// `Full` (the default) or `Diff`, as Firecracker names them.
    #[serde(default)]
    snapshot_type: SnapshotKind,
}

#[derive(Serialize)]
struct SnapshotWritten {
    snapshot_path: PathBuf,
    state_bytes: u64,
    memory_bytes: u64,
    pause_ms: f64,
    total_ms: f64,
}

fn snapshot(request: &Request, cx: &mut Context<'_>) -> Response {
    let vm = cx.vm;
    let create: SnapshotCreate = match body(request, r#"{"snapshot_path": "/var/lib/lwpvmm/snap"}"#)
    {
        Ok(c) => c,
        Err(r) => return r,
    };
    match vm.snapshot_of(&create.snapshot_path, create.snapshot_type) {
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
        Err(e) => vm_error(e),
    }
}

fn metrics_json(_: &Request, cx: &mut Context<'_>) -> Response {
    let vm = cx.vm;
    vm.metrics()
        .map_or_else(vm_error, |m| Response::json(200, &m))
}

fn metrics_prometheus(_: &Request, cx: &mut Context<'_>) -> Response {
    let vm = cx.vm;
    vm.metrics().map_or_else(vm_error, |m| {
        let mut text = m.prometheus();
        if let Some(root) = &cx.sysroot {
            text.push_str(&format!(
                "# HELP lwpvmm_sysroot_refused_total Guest-named files --sysroot refused (links, devices, FIFOs, too large).\n# TYPE lwpvmm_sysroot_refused_total counter\nlwpvmm_sysroot_refused_total {}\n",
                root.refused()
            ));
        }
        Response::ok("text/plain; version=0.0.4", text.into_bytes())
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

fn action(request: &Request, cx: &mut Context<'_>) -> Response {
    let vm = cx.vm;
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

/// What `GET /capture` says.
#[derive(Serialize)]
struct CaptureStatus {
    /// The sampler's rate (0: stopped).
    sample_hz: u32,
    /// The EventIds recorded into the trace and the captures.
    events: Vec<u8>,
    /// Whether the trace is written (`null`: no `--trace`).
    trace: Option<bool>,
    /// Whether `PUT /capture/start` began a capture, and its records.
    started: Option<u64>,
    /// Captures running (pprof requests included).
    running: usize,
}

fn capture_status(_: &Request, cx: &mut Context<'_>) -> Response {
    let r = cx.vm.recorder();
    Response::json(
        200,
        &CaptureStatus {
            sample_hz: r.sample_hz(),
            events: r.events(),
            trace: r.trace_on(),
            started: cx.started.and_then(|id| r.capture_records(id)),
            running: r.running(),
        },
    )
}

/// `PATCH /capture`: what the host side records from now on. The guest's
/// LWP state is not touched: the sampler's rate is how often lwpvmm looks,
/// the EventIds what it keeps of what the guest's LWPCB asked for.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CaptureConfig {
    sample_hz: Option<u32>,
    events: Option<Vec<u8>>,
    trace: Option<bool>,
    kernel: Option<bool>,
}

/// Why whole-guest samples cannot be had: the VM has no sampler.
const NO_SAMPLER_FOR_KERNEL: &str = "whole-guest samples need the sampler: this VM has none (start it with --profile-kernel, or with a profile that has CNH or RNH, and a --sample-hz above 0)";

/// The sampler's highest rate through the API (as `--sample-hz` allows).
pub const MAX_SAMPLE_HZ: u32 = 100_000;

fn capture_config(request: &Request, cx: &mut Context<'_>) -> Response {
    let config: CaptureConfig = match body(
        request,
        r#"{"sample_hz": 1000, "events": [5, 255], "trace": true, "kernel": true}"#,
    ) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let r = cx.vm.recorder();
    if config.sample_hz.is_some_and(|hz| hz > MAX_SAMPLE_HZ) {
        return Response::fault(400, &format!("sample_hz is at most {MAX_SAMPLE_HZ}"));
    }
    // Everything is checked before anything changes.
    if let Some(events) = &config.events
        && let Some(bad) = events.iter().find(|e| !EVENT_IDS.contains(e))
    {
        return Response::fault(
            400,
            &format!(
                "{bad} is not an LWP EventId: events takes 1 (LWPVAL), 2 (IRE), 3 (BRE), 4 (DME), 5 (CNH), 6 (RNH) and 255 (LWPINS)"
            ),
        );
    }
    if config.trace == Some(true) && r.trace_on().is_none() {
        return Response::fault(
            400,
            "this VM writes no trace (start it with --trace PATH to have one)",
        );
    }
    if config.kernel == Some(true)
        && r.sample_hz() == 0
        && config.sample_hz.is_none_or(|hz| hz == 0)
    {
        return Response::fault(409, NO_SAMPLER_FOR_KERNEL);
    }
    if let Some(hz) = config.sample_hz
        && let Err(e) = cx.vm.set_sample_hz(hz)
    {
        return vm_error(e);
    }
    if let Some(on) = config.kernel {
        r.set_whole_guest(on);
    }
    if let Some(events) = &config.events {
        r.set_events(events);
    }
    if let Some(on) = config.trace {
        r.set_trace(on);
    }
    Response::no_content()
}

fn capture_refused(e: CaptureError) -> Response {
    Response::fault(409, &e.to_string())
}

fn capture_start(_: &Request, cx: &mut Context<'_>) -> Response {
    if cx.started.is_some() {
        return Response::fault(
            409,
            "a capture is running already: PUT /capture/stop ends it and returns its profile",
        );
    }
    match cx.vm.recorder().start_capture(CaptureOwner::Owner) {
        Ok(id) => {
            cx.started = Some(id);
            Response::no_content()
        }
        Err(e) => capture_refused(e),
    }
}

fn capture_stop(_: &Request, cx: &mut Context<'_>) -> Response {
    let capture = cx
        .started
        .take()
        .and_then(|id| cx.vm.recorder().finish_capture(id));
    match capture {
        Some(c) => profile_response(c, cx),
        None => Response::fault(409, "no capture is running: PUT /capture/start begins one"),
    }
}

/// The seconds a pprof request asks for, and whether it asks for the whole
/// guest (`kernel=1`), from its query.
fn profile_query(query: Option<&str>) -> Result<(u64, bool), String> {
    let mut seconds = DEFAULT_PROFILE_SECONDS;
    let mut kernel = false;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key == "kernel" {
            kernel = match value {
                "1" | "true" => true,
                "0" | "false" => false,
                other => {
                    return Err(format!("kernel={} is not 1 or 0", printable(other)));
                }
            };
        } else if key == "seconds" {
            seconds = value
                .parse()
                .ok()
                .filter(|s| (1..=MAX_PROFILE_SECONDS).contains(s))
                .ok_or_else(|| {
                    format!(
                        "seconds={} is not a whole number from 1 to {MAX_PROFILE_SECONDS}",
                        printable(value)
                    )
                })?;
        }
    }
    Ok((seconds, kernel))
}

fn pprof_profile(request: &Request, cx: &mut Context<'_>) -> Answer {
    let (seconds, kernel) = match profile_query(request.query.as_deref()) {
        Ok(q) => q,
        Err(why) => return Response::fault(400, &why).into(),
    };
    if kernel && cx.vm.recorder().sample_hz() == 0 {
        return Response::fault(409, NO_SAMPLER_FOR_KERNEL).into();
    }
    let owner = match cx.origin {
        Origin::Unix => CaptureOwner::Owner,
        Origin::Tcp => CaptureOwner::Tcp,
    };
    match cx.vm.recorder().start_capture_with(owner, kernel) {
        Ok(id) => Answer::Profile {
            id,
            due: Instant::now() + Duration::from_secs(seconds),
        },
        Err(e) => capture_refused(e).into(),
    }
}

/// The answer to a pprof request whose capture `id` is due (or whose VM
/// ended).
pub fn finish_profile(id: CaptureId, cx: &Context<'_>) -> Response {
    match cx.vm.recorder().finish_capture(id) {
        Some(c) => profile_response(c, cx),
        None => Response::fault(500, "the capture was lost"),
    }
}

/// A capture as a gzipped pprof profile, its frames named from `sysroot`,
/// its clock samples timed at `sample_hz`.
fn profile_response(capture: Capture, cx: &Context<'_>) -> Response {
    let mut resolver = Resolver::new(None, cx.sysroot.clone());
    if let Some((path, bytes)) = &cx.kernel {
        resolver.set_kernel(path, bytes);
    }
    if let Some(entry) = cx.vm.recorder().kernel_entry() {
        resolver.kernel_entry(entry);
    }
    let vcpus = cx
        .vm
        .metrics()
        .map_or(0, |m| u32::try_from(m.vcpus.len()).unwrap_or(u32::MAX));
    let profile = capture.profile(resolver, cx.vm.recorder().sample_hz(), vcpus);
    let mut body = Vec::new();
    match pprof::write(&profile, &mut body) {
        Ok(()) => Response::ok("application/octet-stream", body),
        Err(e) => Response::fault(500, &format!("cannot encode the profile: {e}")),
    }
}

#[cfg(test)]
#[path = "routes_tests.rs"]
mod tests;
