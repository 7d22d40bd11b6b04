//! Firecracker's API on lwpvmm's API thread: the pre-boot endpoints
//! configure a [`Setup`]; `InstanceStart` and `PUT /snapshot/load` ask the
//! main thread ([`super::launch`]) to build the VM and wait for its handle;
//! after that, Firecracker's own endpoints are answered here and the rest
//! (`PATCH /vm`, `/metrics`, `/debug/pprof/profile`, `/capture`) by
//! lwpvmm's. Statuses are Firecracker's: 204 for a configuration taken,
//! 400 with a `fault_message` for every refusal.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{Sender, channel};

use serde::Deserialize;

use super::launch::{Launch, LaunchError, LoadPlan};
use super::model::{
    API_VERSION, Action, ActionType, BootSource, Drive, InstanceInfo, Logger, Lwp,
    MachineConfigBody, Metrics, NetworkInterface, PartialDrive, SnapshotCreate, SnapshotLoad,
    Version, Vsock,
};
use super::setup::{Setup, SetupError};
use crate::vmm::api::frontend::{Before, Frontend};
use crate::vmm::api::http::{Request, Response};
use crate::vmm::base::request::{SnapshotKind, VmmHandle};
use crate::vmm::snapshot::MEMORY_FILE;

/// Firecracker's answer to a pre-boot request after the start.
const AFTER_START: &str = "The requested operation is not supported after starting the microVM.";

/// Paths only a VM not yet started takes (besides `/drives/…` and
/// `/network-interfaces/…`).
const PRE_BOOT: &[&str] = &[
    "/boot-source",
    "/machine-config",
    "/logger",
    "/metrics",
    "/lwp",
    "/vsock",
    "/snapshot/load",
];

/// What lwpvmm does not offer at all, by path prefix, and why.
const NOT_OFFERED: &[(&str, &str)] = &[
    (
        "/balloon",
        "lwpvmm has no balloon device; size mem_size_mib for the guest",
    ),
    (
        "/mmds",
        "lwpvmm has no metadata service (MMDS); pass data on the kernel command line or a drive",
    ),
    (
        "/entropy",
        "lwpvmm has no virtio-rng device; the guest seeds its RNG from RDRAND and RDSEED",
    ),
    (
        "/cpu-config",
        "lwpvmm builds the CPUID table for the LWP profile itself (`lwpvmm cpuid` prints it)",
    ),
    (
        "/pmem",
        "lwpvmm has no virtio-pmem device; give the image as a drive",
    ),
    (
        "/hotplug",
        "lwpvmm has no virtio-mem device; size mem_size_mib for the guest",
    ),
    (
        "/serial",
        "the guest's serial console is lwpvmm's standard output, as Firecracker's default",
    ),
];

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
                app_name: "lwpvmm",
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
            Ok(Err(e)) => Err(Response::fault(400, &e.to_string())),
            Err(_) => Err(Response::fault(503, "lwpvmm is stopping")),
        }
    }

    fn configure(&mut self, r: &Request) -> Result<Response, Response> {
        let id_of = |prefix: &str| r.path.strip_prefix(prefix).filter(|id| valid_id(id));
        match (r.method.as_str(), r.path.as_str()) {
            ("PUT", "/boot-source") => applied(self.setup.boot_source(body::<BootSource>(r)?)),
            ("PUT", "/machine-config") => applied(
                self.setup
                    .machine_config(body::<MachineConfigBody>(r)?, true),
            ),
            ("PATCH", "/machine-config") => applied(
                self.setup
                    .machine_config(body::<MachineConfigBody>(r)?, false),
            ),
            ("PUT", "/metrics") => applied(self.setup.metrics(body::<Metrics>(r)?)),
            ("PUT", "/lwp") => applied(self.setup.lwp(body::<Lwp>(r)?)),
            ("PUT", "/logger") => {
                let logger = body::<Logger>(r)?;
                Setup::check_logger(&logger).map_err(refused)?;
                if let Some(path) = &logger.log_path {
                    let path = PathBuf::from(path);
                    self.ask(|reply| Launch::Logger(path, reply))?;
                }
                set_level(logger.level.as_deref());
                self.setup.logger = Some(logger);
                Ok(Response::no_content())
            }
            ("PUT", "/vsock") => applied(self.setup.vsock(body::<Vsock>(r)?)),
            ("PUT", _) if id_of("/drives/").is_some() => {
                let id = id_of("/drives/").unwrap_or_default().to_owned();
                applied(self.setup.drive(&id, body::<Drive>(r)?))
            }
            ("PUT", _) if id_of("/network-interfaces/").is_some() => {
                let id = id_of("/network-interfaces/").unwrap_or_default().to_owned();
                applied(self.setup.network(&id, body::<NetworkInterface>(r)?))
            }
            _ => Err(unknown(r)),
        }
    }

    fn load_plan(&self, r: &Request) -> Result<LoadPlan, Response> {
        let load = body::<SnapshotLoad>(r)?;
        let dir = PathBuf::from(&load.snapshot_path);
        let not = |field, why| refused(SetupError::NotOffered { field, why });
        if load.network_overrides.is_some() {
            return Err(not(
                "network_overrides",
                "a loaded VM uses the taps its snapshot names",
            ));
        }
        if load.vsock_override.is_some() {
            return Err(not(
                "vsock_override",
                "lwpvmm has no virtio-vsock device yet",
            ));
        }
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

/// Firecracker's answer to a path or method it has not.
fn unknown(r: &Request) -> Response {
    if let Some((_, why)) = NOT_OFFERED.iter().find(|(p, _)| r.path.starts_with(p)) {
        return Response::fault(
            400,
            &format!(
                "{} is not offered by lwpvmm: {why}",
                r.path.chars().take(64).collect::<String>()
            ),
        );
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

impl Frontend for FirecrackerApi {
    fn before_start(&mut self, r: &Request) -> Before {
        let answer = match (r.method.as_str(), r.path.as_str()) {
            ("GET", "/") => Ok(self.info("Not started")),
            ("GET", "/version") => Ok(version()),
            ("GET", "/machine-config") => Ok(Response::json(200, &self.setup.machine)),
            ("GET", "/vm/config") => Ok(Response::json(200, &self.setup.full())),
            ("PUT", "/actions") => match body::<Action>(r) {
                Ok(Action {
                    action_type: ActionType::InstanceStart,
                }) => {
                    if self.setup.boot.is_none() {
                        Err(refused(SetupError::NoKernel))
                    } else {
                        let setup = Box::new(self.setup.clone());
                        match self.ask(|reply| Launch::Boot(setup, reply)) {
                            Ok(started) => return Before::Started(Response::no_content(), started),
                            Err(r) => Err(r),
                        }
                    }
                }
                Ok(Action { action_type }) => Err(Response::fault(
                    400,
                    &format!("{action_type:?} needs a running microVM: send InstanceStart first"),
                )),
                Err(r) => Err(r),
            },
            ("PUT", "/snapshot/load") => match self.load_plan(r) {
                Ok(plan) => match self
                    .ask(|reply| Launch::Load(plan, Box::new(self.setup.clone()), reply))
                {
                    Ok(started) => return Before::Started(Response::no_content(), started),
                    Err(r) => Err(r),
                },
                Err(r) => Err(r),
            },
            ("PUT", "/snapshot/create") | ("PATCH", "/vm") => Err(Response::fault(
                400,
                "The requested operation is not supported before starting the microVM.",
            )),
            _ => self.configure(r),
        };
        Before::Now(answer.unwrap_or_else(|e| e))
    }

    fn after_start(&mut self, r: &Request, vm: &VmmHandle) -> Option<Response> {
        let pre_boot = PRE_BOOT.contains(&r.path.as_str())
            || r.path.starts_with("/network-interfaces/")
            || (r.path.starts_with("/drives/") && r.method == "PUT");
        let answer = match (r.method.as_str(), r.path.as_str()) {
            ("GET", "/") => match vm.is_paused() {
                Ok(paused) => self.info(if paused { "Paused" } else { "Running" }),
                Err(e) => Response::fault(e.status(), &e.to_string()),
            },
            ("GET", "/version") => version(),
            ("GET", "/machine-config") => Response::json(200, &self.setup.machine),
            ("GET", "/vm/config") => Response::json(200, &self.setup.full()),
            (_, _) if pre_boot && r.method != "GET" => Response::fault(400, AFTER_START),
            ("PATCH", _) if r.path.starts_with("/drives/") => {
                let id = r.path.trim_start_matches("/drives/").to_owned();
                match body::<PartialDrive>(r) {
                    Ok(patch) => self.patch_drive(&id, patch, vm),
                    Err(e) => e,
                }
            }
            ("PUT", "/actions") => match body::<Action>(r) {
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
                    ActionType::Stop => return None,
                },
                Err(e) => e,
            },
            ("PUT", "/snapshot/create") => return self.snapshot(r, vm),
            _ if NOT_OFFERED.iter().any(|(p, _)| r.path.starts_with(p)) => unknown(r),
            _ => return None,
        };
        Some(answer)
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
    fn snapshot(&self, r: &Request, vm: &VmmHandle) -> Option<Response> {
        let create = match body::<SnapshotCreate>(r) {
            Ok(c) => c,
            Err(e) => return Some(e),
        };
        let dir = PathBuf::from(&create.snapshot_path);
        if let Some(memory) = &create.mem_file_path
            && let Err(e) = memory_in(&dir, memory)
        {
            return Some(e);
        }
        let kind = match create.snapshot_type.as_deref() {
            None | Some("Full") => SnapshotKind::Full,
            Some("Diff") => SnapshotKind::Diff,
            Some(other) => {
                return Some(Response::fault(
                    400,
                    &format!(
                        "snapshot_type `{}` is not Full or Diff",
                        other.chars().take(32).collect::<String>()
                    ),
                ));
            }
        };
        Some(match vm.snapshot_of(&dir, kind) {
            Ok(_) => Response::no_content(),
            Err(e) => Response::fault(e.status(), &e.to_string()),
        })
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
