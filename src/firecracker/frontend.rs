//! Firecracker's API on lwpvmm's API thread: the pre-boot endpoints
//! configure a [`Setup`]; `InstanceStart` and `PUT /snapshot/load` ask the
//! main thread ([`super::launch`]) to build the VM and wait for its handle;
//! after that, Firecracker's own endpoints are answered here and the rest
//! (`GET /metrics`, `GET /vm/metrics`, `/debug/pprof/profile`, `/capture`)
//! by lwpvmm's. A request is routed as Firecracker's API server routes it,
//! on its path's first segment (`Target`), through one table of endpoints
//! (`ENDPOINTS`) that says what each does before the start and after it. Statuses are Firecracker's: 204 for a configuration taken,
//! 400 with a `fault_message` for every refusal.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{Sender, channel};

use serde::Deserialize;

use super::launch::{Launch, LaunchError, LoadPlan};
use super::model::{
    API_VERSION, APP_NAME, Action, ActionType, BootSource, Drive, Entropy, InstanceInfo, Logger,
    Lwp, MachineConfigBody, Metrics, NetworkInterface, PartialDrive, PartialNetworkInterface,
    SnapshotCreate, SnapshotLoad, Version, Vm, VmState, Vsock,
};
use super::setup::{Setup, SetupError};
use crate::vmm::VmmHandle;
use crate::vmm::api::frontend::{Before, Frontend};
use crate::vmm::api::http::{Request, Response};
use crate::vmm::config::{DeviceOverrides, MAX_DEVICES, MEMORY_FILE, SnapshotKind};

/// Firecracker's answer to a pre-boot request after the start.
const AFTER_START: &str = "The requested operation is not supported after starting the microVM.";
/// Firecracker's answer to a request for a running microVM before the
/// start.
const BEFORE_START: &str = "The requested operation is not supported before starting the microVM.";

/// What lwpvmm does not offer at all, by resource (every method, both
/// phases), and why.
const NOT_OFFERED: &[(&str, &str)] = &[
    (
        "balloon",
        "lwpvmm has no balloon device; size mem_size_mib for the guest",
    ),
    (
        "mmds",
        "lwpvmm has no metadata service (MMDS); pass data on the kernel command line or a drive",
    ),
    (
        "cpu-config",
        "lwpvmm builds the CPUID table for the LWP profile itself (`lwpvmm cpuid` prints it)",
    ),
    (
        "pmem",
        "lwpvmm has no virtio-pmem device; give the image as a drive",
    ),
    (
        "hotplug",
        "lwpvmm has no virtio-mem device; size mem_size_mib for the guest",
    ),
    (
        "serial",
        "the guest's serial console is lwpvmm's standard output, as Firecracker's default",
    ),
];

/// A request's path as Firecracker's API server splits it: leading slashes
/// dropped, the first segment the resource, the second its id or operation
/// (`/drives/{id}`, `/snapshot/load`); a trailing slash and any further
/// segment change nothing. So `PUT /vsock/vsock0` is `PUT /vsock` and
/// `PUT /machine-config/` is `PUT /machine-config`, as clients send them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Target<'a> {
    resource: &'a str,
    sub: Option<&'a str>,
}

impl<'a> Target<'a> {
    fn of(path: &'a str) -> Self {
        let mut parts = path.trim_start_matches('/').split_terminator('/');
        Target {
            resource: parts.next().unwrap_or(""),
            sub: parts.next(),
        }
    }
}

/// A request and the segment after its resource.
struct Call<'a> {
    r: &'a Request,
    sub: Option<&'a str>,
}

/// One endpoint: a method on a resource, what it does before the start,
/// and after it (`None`: lwpvmm's own endpoints answer).
struct Endpoint {
    method: &'static str,
    resource: &'static str,
    before: fn(&mut FirecrackerApi, &Call<'_>) -> Before,
    after: fn(&mut FirecrackerApi, &Call<'_>, &VmmHandle) -> Option<Response>,
}

/// Every endpoint Firecracker routes that lwpvmm offers, and lwpvmm's
/// `PUT /lwp`; a (method, resource) not here is Firecracker's "Invalid
/// request method and/or path" before the start, lwpvmm's endpoints' after.
const ENDPOINTS: &[Endpoint] = &[
    Endpoint {
        method: "GET",
        resource: "",
        before: |api, _| Before::Now(api.info("Not started")),
        after: |api, _, vm| {
            Some(match vm.is_paused() {
                Ok(paused) => api.info(if paused { "Paused" } else { "Running" }),
                Err(e) => Response::fault(e.status(), &e.to_string()),
            })
        },
    },
    Endpoint {
        method: "GET",
        resource: "version",
        before: |_, _| Before::Now(version()),
        after: |_, _, _| Some(version()),
    },
    Endpoint {
        method: "GET",
        resource: "machine-config",
        before: |api, _| Before::Now(Response::json(200, &api.setup.machine)),
        after: |api, _, _| Some(Response::json(200, &api.setup.machine)),
    },
    Endpoint {
        method: "GET",
        resource: "vm",
        before: |api, c| {
            Before::Now(match c.sub {
                Some("config") => Response::json(200, &api.setup.full()),
                _ => unknown(c.r),
            })
        },
        // Else lwpvmm's GET /vm/metrics.
        after: |api, c, _| {
            (c.sub == Some("config")).then(|| Response::json(200, &api.setup.full()))
        },
    },
    Endpoint {
        method: "PUT",
        resource: "actions",
        before: FirecrackerApi::start,
        after: |_, c, vm| Some(running_action(c.r, vm)),
    },
    Endpoint {
        method: "PUT",
        resource: "boot-source",
        before: |api, c| {
            now(body::<BootSource>(c.r).and_then(|b| applied(api.setup.boot_source(b))))
        },
        after: after_start,
    },
    Endpoint {
        method: "PUT",
        resource: "machine-config",
        before: |api, c| {
            now(body::<MachineConfigBody>(c.r)
                .and_then(|m| applied(api.setup.machine_config(m, true))))
        },
        after: after_start,
    },
    Endpoint {
        method: "PATCH",
        resource: "machine-config",
        before: |api, c| {
            now(body::<MachineConfigBody>(c.r)
                .and_then(|m| applied(api.setup.machine_config(m, false))))
        },
        after: after_start,
    },
    Endpoint {
        method: "PUT",
        resource: "metrics",
        before: |api, c| now(body::<Metrics>(c.r).and_then(|m| applied(api.setup.metrics(m)))),
        after: after_start,
    },
    Endpoint {
        method: "PUT",
        resource: "lwp",
        before: |api, c| now(body::<Lwp>(c.r).and_then(|l| applied(api.setup.lwp(l)))),
        after: after_start,
    },
    Endpoint {
        method: "PUT",
        resource: "logger",
        before: |api, c| now(api.logger(c.r)),
        after: after_start,
    },
    Endpoint {
        method: "PUT",
        resource: "entropy",
        before: |api, c| {
            now(body::<Entropy>(c.r).map(|e| {
                api.setup.entropy(e);
                Response::no_content()
            }))
        },
        after: after_start,
    },
    Endpoint {
        method: "PUT",
        resource: "vsock",
        before: |api, c| now(body::<Vsock>(c.r).and_then(|v| applied(api.setup.vsock(v)))),
        after: after_start,
    },
    Endpoint {
        method: "PUT",
        resource: "drives",
        before: |api, c| {
            now(path_id(c).and_then(|id| {
                let drive = body::<Drive>(c.r)?;
                applied(api.setup.drive(id, drive))
            }))
        },
        after: after_start,
    },
    Endpoint {
        method: "PATCH",
        resource: "drives",
        before: before_start,
        after: |api, c, vm| {
            Some(
                path_id(c)
                    .and_then(|id| Ok((id, body::<PartialDrive>(c.r)?)))
                    .map_or_else(|e| e, |(id, patch)| api.patch_drive(id, patch, vm)),
            )
        },
    },
    Endpoint {
        method: "PUT",
        resource: "network-interfaces",
        before: |api, c| {
            now(path_id(c).and_then(|id| {
                let net = body::<NetworkInterface>(c.r)?;
                applied(api.setup.network(id, net))
            }))
        },
        after: after_start,
    },
    Endpoint {
        method: "PATCH",
        resource: "network-interfaces",
        before: before_start,
        after: |api, c, _| {
            Some(
                path_id(c)
                    .and_then(|id| {
                        let patch = body::<PartialNetworkInterface>(c.r)?;
                        applied(api.setup.patch_network(id, &patch))
                    })
                    .unwrap_or_else(|e| e),
            )
        },
    },
    Endpoint {
        method: "PUT",
        resource: "snapshot",
        before: |api, c| match c.sub {
            Some("load") => api.load(c.r),
            Some("create") => Before::Now(Response::fault(400, BEFORE_START)),
            _ => Before::Now(unknown(c.r)),
        },
        after: |api, c, vm| {
            Some(match c.sub {
                Some("create") => api.snapshot(c.r, vm),
                Some("load") => Response::fault(400, AFTER_START),
                _ => unknown(c.r),
            })
        },
    },
    Endpoint {
        method: "PATCH",
        resource: "vm",
        before: before_start,
        after: |_, c, vm| Some(vm_state(c.r, vm)),
    },
];

/// A pre-boot endpoint's answer after the start.
fn after_start(_: &mut FirecrackerApi, _: &Call<'_>, _: &VmmHandle) -> Option<Response> {
    Some(Response::fault(400, AFTER_START))
}

/// A running microVM's endpoint's answer before the start.
fn before_start(_: &mut FirecrackerApi, _: &Call<'_>) -> Before {
    Before::Now(Response::fault(400, BEFORE_START))
}

/// An answer that starts nothing.
fn now(answer: Result<Response, Response>) -> Before {
    Before::Now(answer.unwrap_or_else(|e| e))
}

/// The id the path names after its resource (`/drives/{id}`), as
/// Firecracker takes ids.
fn path_id<'a>(c: &Call<'a>) -> Result<&'a str, Response> {
    match c.sub {
        Some(id) if valid_id(id) => Ok(id),
        Some(id) if !id.is_empty() => Err(Response::fault(
            400,
            &format!(
                "`{}` is not an id: an id is 1 to 64 letters, digits or underscores",
                id.chars().take(64).collect::<String>()
            ),
        )),
        _ => Err(Response::fault(
            400,
            &format!(
                "{} names no id: the path is {}/{{id}}",
                c.r.path.chars().take(64).collect::<String>(),
                c.r.path
                    .trim_end_matches('/')
                    .chars()
                    .take(64)
                    .collect::<String>()
            ),
        )),
    }
}

/// `PUT /actions` once the microVM runs.
fn running_action(r: &Request, vm: &VmmHandle) -> Response {
    match body::<Action>(r) {
        Ok(Action { action_type }) => match action_type {
            ActionType::InstanceStart => Response::fault(
                400,
                "The microVM is already running: InstanceStart is taken once.",
            ),
            ActionType::FlushMetrics => match vm.flush_metrics() {
                Ok(()) => Response::no_content(),
                Err(e) => Response::fault(400, &e.to_string()),
            },
            ActionType::SendCtrlAltDel => Response::fault(
                400,
                "SendCtrlAltDel is not offered by lwpvmm: its machine has no i8042 keyboard to press Ctrl+Alt+Del on; PUT /actions {\"action_type\": \"Stop\"} stops the VM",
            ),
            ActionType::Stop => {
                vm.stop();
                Response::no_content()
            }
        },
        Err(e) => e,
    }
}

/// `PATCH /vm`: pauses or resumes the microVM.
fn vm_state(r: &Request, vm: &VmmHandle) -> Response {
    let done = match body::<Vm>(r) {
        Ok(Vm {
            state: VmState::Paused,
        }) => vm.pause(),
        Ok(Vm {
            state: VmState::Resumed,
        }) => vm.resume(),
        Err(e) => return e,
    };
    done.map_or_else(
        |e| Response::fault(e.status(), &e.to_string()),
        |()| Response::no_content(),
    )
}

/// Firecracker's API for one VM.
pub struct FirecrackerApi {
    setup: Setup,
    id: String,
    launcher: Sender<Launch>,
}

impl FirecrackerApi {
    /// The API of a VM configured as `setup` (a config file's, or the
    /// defaults), the main thread reached through `launcher`.
    pub fn new(setup: Setup, id: String, launcher: Sender<Launch>) -> Self {
        FirecrackerApi {
            setup,
            id,
            launcher,
        }
    }

    fn info(&self, state: &'static str) -> Response {
        Response::json(
            200,
            &InstanceInfo {
                app_name: APP_NAME,
                id: self.id.clone(),
                state,
                vmm_version: API_VERSION,
            },
        )
    }

    /// Asks the main thread and waits for its answer.
    fn ask<T>(
        &self,
        launch: impl FnOnce(Sender<Result<T, LaunchError>>) -> Launch,
    ) -> Result<T, Response> {
        let (reply, answer) = channel();
        if self.launcher.send(launch(reply)).is_err() {
            return Err(Response::fault(503, "lwpvmm is stopping"));
        }
        match answer.recv() {
            Ok(Ok(t)) => Ok(t),
            Ok(Err(e)) => Err(Response::fault(e.status(), &e.to_string())),
            Err(_) => Err(Response::fault(503, "lwpvmm is stopping")),
        }
    }

    /// `PUT /logger`: the log file is opened by the main thread (the API
    /// thread may not open files for writing).
    fn logger(&mut self, r: &Request) -> Result<Response, Response> {
        let logger = body::<Logger>(r)?;
        Setup::check_logger(&logger).map_err(refused)?;
        if let Some(path) = &logger.log_path {
            let path = PathBuf::from(path);
            self.ask(|reply| Launch::Logger(path, reply))?;
        }
        set_level(Some(logger.level.as_deref().unwrap_or(DEFAULT_LOG_LEVEL)));
        self.setup.logger = Some(logger);
        Ok(Response::no_content())
    }

    /// `PUT /actions` before the start: `InstanceStart` builds the VM.
    fn start(&mut self, c: &Call<'_>) -> Before {
        match body::<Action>(c.r) {
            Ok(Action {
                action_type: ActionType::InstanceStart,
            }) => {
                if self.setup.boot.is_none() {
                    return Before::Now(refused(SetupError::NoKernel));
                }
                let setup = Box::new(self.setup.clone());
                match self.ask(|reply| Launch::Boot(setup, reply)) {
                    Ok(started) => Before::Started(Response::no_content(), started),
                    Err(r) => Before::Now(r),
                }
            }
            Ok(Action { action_type }) => Before::Now(Response::fault(
                400,
                &format!("{action_type:?} needs a running microVM: send InstanceStart first"),
            )),
            Err(r) => Before::Now(r),
        }
    }

    /// `PUT /snapshot/load`: the VM is built from the snapshot.
    fn load(&mut self, r: &Request) -> Before {
        match self.load_plan(r) {
            Ok(plan) => {
                match self.ask(|reply| Launch::Load(plan, Box::new(self.setup.clone()), reply)) {
                    Ok(started) => Before::Started(Response::no_content(), started),
                    Err(r) => Before::Now(r),
                }
            }
            Err(r) => Before::Now(r),
        }
    }

    fn load_plan(&self, r: &Request) -> Result<LoadPlan, Response> {
        let load = body::<SnapshotLoad>(r)?;
        let dir = PathBuf::from(&load.snapshot_path);
        let not = |field, why| refused(SetupError::NotOffered { field, why });
        let overrides = self.overrides(&load)?;
        if load.clock_realtime == Some(true) {
            return Err(not(
                "clock_realtime",
                "lwpvmm restores the guest's kvmclock as the snapshot holds it (docs/snapshot.md)",
            ));
        }
        if let Some(h) = load.huge_pages.as_deref()
            && h != "None"
            && h != "Snapshot"
        {
            return Err(not("huge_pages", "guest memory is backed by 4 KiB pages"));
        }
        let memory = match (&load.mem_file_path, &load.mem_backend) {
            (Some(_), Some(_)) => {
                return Err(Response::fault(
                    400,
                    "give mem_backend or mem_file_path, not both",
                ));
            }
            (Some(path), None) => Some(path.clone()),
            (None, Some(b)) if b.backend_type == "File" => Some(b.backend_path.clone()),
            (None, Some(b)) if b.backend_type == "Uffd" => {
                return Err(not(
                    "mem_backend Uffd",
                    "lwpvmm maps the memory file and pages it in as the guest touches it; give {\"backend_type\": \"File\"}",
                ));
            }
            (None, Some(b)) => {
                return Err(Response::fault(
                    400,
                    &format!(
                        "backend_type `{}` is not File or Uffd",
                        b.backend_type.chars().take(32).collect::<String>()
                    ),
                ));
            }
            (None, None) => None,
        };
        if let Some(memory) = memory {
            memory_in(&dir, &memory)?;
        }
        Ok(LoadPlan {
            dir,
            track_dirty_pages: load
                .track_dirty_pages
                .or(load.enable_diff_snapshots)
                .unwrap_or(false),
            resume: load.resume_vm.unwrap_or(false),
            overrides,
        })
    }

    /// A load's `network_overrides` and `vsock_override`, checked as the
    /// PUTs before a start are: each tap exists and is a tap, no interface
    /// is named twice, and the socket's path is not empty. Whether the
    /// snapshot has those interfaces is checked when it is loaded
    /// (`DeviceOverrides::check`).
    fn overrides(&self, load: &SnapshotLoad) -> Result<DeviceOverrides, Response> {
        let asked = load.network_overrides.as_deref().unwrap_or_default();
        if asked.len() > MAX_DEVICES {
            return Err(refused(SetupError::TooMany("network overrides")));
        }
        let twice = asked.iter().enumerate().find_map(|(i, o)| {
            asked[..i]
                .iter()
                .any(|p| p.iface_id == o.iface_id)
                .then_some(o)
        });
        if let Some(o) = twice {
            return Err(refused(SetupError::Invalid {
                field: "network_overrides",
                why: format!(
                    "the interface `{}` is named twice",
                    o.iface_id.chars().take(64).collect::<String>()
                ),
            }));
        }
        let mut taps: Vec<(String, String)> = Vec::new();
        for o in asked {
            self.setup
                .check_override_tap(&o.host_dev_name)
                .map_err(refused)?;
            taps.push((o.iface_id.clone(), o.host_dev_name.clone()));
        }
        let vsock_uds_path = match &load.vsock_override {
            Some(v) if v.uds_path.is_empty() => {
                return Err(refused(SetupError::Invalid {
                    field: "vsock_override uds_path",
                    why: "give the path of the host socket to bind".into(),
                }));
            }
            Some(v) => Some(PathBuf::from(&v.uds_path)),
            None => None,
        };
        Ok(DeviceOverrides {
            taps,
            vsock_uds_path,
        })
    }
}

/// Checks that `memory` is the memory file of lwpvmm's snapshot `dir`:
/// lwpvmm's snapshot is one directory, which holds it.
fn memory_in(dir: &Path, memory: &str) -> Result<(), Response> {
    if Path::new(memory) == dir.join(MEMORY_FILE) {
        return Ok(());
    }
    Err(Response::fault(
        400,
        &format!(
            "the memory file of an lwpvmm snapshot is {}: snapshot_path names lwpvmm's snapshot directory, which holds its state and memory; give that path (or leave the memory path out)",
            dir.join(MEMORY_FILE).display()
        ),
    ))
}

/// An id as Firecracker takes it: 1 to 64 alphanumerics or underscores.
fn valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn refused(e: SetupError) -> Response {
    Response::fault(e.status(), &e.to_string())
}

fn applied(result: Result<(), SetupError>) -> Result<Response, Response> {
    result.map(|()| Response::no_content()).map_err(refused)
}

/// The body as `T`, or Firecracker's 400.
fn body<'a, T: Deserialize<'a>>(r: &'a Request) -> Result<T, Response> {
    serde_json::from_slice(&r.body).map_err(|e| {
        Response::fault(
            400,
            &format!("An error occurred when deserializing the json body of a request: {e}."),
        )
    })
}

/// The refusal of a request to a resource lwpvmm does not offer.
fn not_offered(r: &Request) -> Option<Response> {
    let resource = Target::of(&r.path).resource;
    let (_, why) = NOT_OFFERED.iter().find(|(p, _)| *p == resource)?;
    Some(Response::fault(
        400,
        &format!(
            "{} is not offered by lwpvmm: {why}",
            r.path.chars().take(64).collect::<String>()
        ),
    ))
}

/// Firecracker's answer to a path or method it has not.
fn unknown(r: &Request) -> Response {
    if let Some(refusal) = not_offered(r) {
        return refusal;
    }
    Response::fault(
        400,
        &format!(
            "Invalid request method and/or path: {} {}.",
            r.method.chars().take(16).collect::<String>(),
            r.path.chars().take(64).collect::<String>()
        ),
    )
}

/// The level of a logger set up without one: Firecracker's `Logger`
/// default (firecracker.yaml), at which every API request and the boot's
/// milestones are logged.
pub const DEFAULT_LOG_LEVEL: &str = "Info";

/// Logs a request as Firecracker's API server does, at Info (the method
/// capitalised as Firecracker writes it; the body is left out: it may hold
/// a guest's secrets, such as MMDS data).
fn log_request(r: &Request) {
    let method = r.method.to_ascii_lowercase();
    let mut chars = method.chars();
    let method: String = chars
        .next()
        .map(|c| c.to_ascii_uppercase())
        .into_iter()
        .chain(chars)
        .collect();
    log::info!(
        "The API server received a {method} request on {:?}.",
        r.path
    );
}

/// Sets the log level Firecracker's way (`Warning`, any case).
pub fn set_level(level: Option<&str>) {
    let filter = match level.map(str::to_ascii_lowercase).as_deref() {
        Some("off") => log::LevelFilter::Off,
        Some("error") => log::LevelFilter::Error,
        Some("warning" | "warn") => log::LevelFilter::Warn,
        Some("info") => log::LevelFilter::Info,
        Some("debug") => log::LevelFilter::Debug,
        Some("trace") => log::LevelFilter::Trace,
        _ => return,
    };
    log::set_max_level(filter);
}

/// The endpoint `r` asks for, and the segment after its resource.
fn endpoint(r: &Request) -> (Option<&'static Endpoint>, Call<'_>) {
    let target = Target::of(&r.path);
    let found = ENDPOINTS
        .iter()
        .find(|e| e.method == r.method && e.resource == target.resource);
    (found, Call { r, sub: target.sub })
}

impl Frontend for FirecrackerApi {
    fn before_start(&mut self, r: &Request) -> Before {
        log_request(r);
        match endpoint(r) {
            (Some(e), call) => (e.before)(self, &call),
            (None, _) => Before::Now(unknown(r)),
        }
    }

    fn after_start(&mut self, r: &Request, vm: &VmmHandle) -> Option<Response> {
        log_request(r);
        match endpoint(r) {
            (Some(e), call) => (e.after)(self, &call, vm),
            (None, _) => not_offered(r),
        }
    }
}

impl FirecrackerApi {
    /// `PATCH /drives/{id}` after the start: a new backing file, in the
    /// drive's mode; the guest is told its capacity may have changed.
    fn patch_drive(&mut self, id: &str, patch: PartialDrive, vm: &VmmHandle) -> Response {
        let result = self
            .setup
            .patch_drive(id, &patch)
            .map_err(refused)
            .and_then(|(index, path)| {
                vm.replace_disk(index, Path::new(&path))
                    .map_err(|e| Response::fault(e.status(), &e.to_string()))
                    .map(|()| (index, path))
            });
        match result {
            Ok((_, path)) => {
                if let Some(d) = self.setup.drives.iter_mut().find(|d| d.drive_id == id) {
                    d.path_on_host = Some(path);
                }
                Response::no_content()
            }
            Err(e) => e,
        }
    }

    /// `PUT /snapshot/create` in Firecracker's shape.
    fn snapshot(&self, r: &Request, vm: &VmmHandle) -> Response {
        let create = match body::<SnapshotCreate>(r) {
            Ok(c) => c,
            Err(e) => return e,
        };
        let dir = PathBuf::from(&create.snapshot_path);
        if let Some(memory) = &create.mem_file_path
            && let Err(e) = memory_in(&dir, memory)
        {
            return e;
        }
        let kind = match create.snapshot_type.as_deref() {
            None | Some("Full") => SnapshotKind::Full,
            Some("Diff") => SnapshotKind::Diff,
            Some(other) => {
                return Response::fault(
                    400,
                    &format!(
                        "snapshot_type `{}` is not Full or Diff",
                        other.chars().take(32).collect::<String>()
                    ),
                );
            }
        };
        match vm.snapshot_of(&dir, kind) {
            Ok(_) => Response::no_content(),
            Err(e) => Response::fault(e.status(), &e.to_string()),
        }
    }
}

fn version() -> Response {
    Response::json(
        200,
        &Version {
            firecracker_version: API_VERSION,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_as_firecracker_splits_them() {
        // (path, resource, the segment after it)
        let table = [
            ("/", "", None),
            ("", "", None),
            ("/machine-config", "machine-config", None),
            ("/machine-config/", "machine-config", None),
            ("//machine-config", "machine-config", None),
            ("/vsock/vsock0", "vsock", Some("vsock0")),
            ("/drives/rootfs/extra", "drives", Some("rootfs")),
            ("/drives/", "drives", None),
            ("/drives//", "drives", Some("")),
            ("/vm/config/", "vm", Some("config")),
        ];
        for (path, resource, sub) in table {
            assert_eq!(Target::of(path), Target { resource, sub }, "{path}");
        }
    }

    #[test]
    fn each_method_and_resource_has_one_endpoint() {
        for (i, e) in ENDPOINTS.iter().enumerate() {
            assert!(
                !ENDPOINTS[..i]
                    .iter()
                    .any(|o| o.method == e.method && o.resource == e.resource),
                "{} /{} twice",
                e.method,
                e.resource
            );
            assert!(
                !NOT_OFFERED.iter().any(|(r, _)| *r == e.resource),
                "/{} is offered and not",
                e.resource
            );
        }
    }
}
