//! Firecracker's API, endpoint by endpoint, against the OpenAPI description
//! Firecracker publishes (tests/data/firecracker/firecracker.yaml): each
//! request body of the table is first checked against the yaml's schema
//! (so that it is a request a Firecracker client sends), then answered by
//! lwpvmm's front end before and after the start; every answer's status is
//! the table's, and every answer's body fits the schema the yaml gives for
//! it. Every path and method of the yaml is in the table, as supported or
//! refused: a Firecracker release that adds one fails here until lwpvmm
//! says what it does with it. No KVM: the VM is a handle whose requests a
//! thread answers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{Sender, channel};

use serde_json::{Value, json};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};
use yaml_rust2::{Yaml, YamlLoader};

use lwpvmm::firecracker::frontend::FirecrackerApi;
use lwpvmm::firecracker::launch::{Launch, LaunchError};
use lwpvmm::firecracker::setup::Setup;
use lwpvmm::vmm::api::frontend::{Before, Frontend};
use lwpvmm::vmm::api::http::{Request, Response};
use lwpvmm::vmm::base::control_error::ControlError;
use lwpvmm::vmm::base::metrics::VmCounters;
use lwpvmm::vmm::base::recorder::Recorder;
use lwpvmm::vmm::base::request::{Request as VmRequest, SnapshotInfo, VmmHandle};

fn to_json(y: &Yaml) -> Value {
    match y {
        Yaml::Real(s) => s.parse::<f64>().map_or(Value::Null, |f| json!(f)),
        Yaml::Integer(i) => json!(i),
        Yaml::String(s) => json!(s),
        Yaml::Boolean(b) => json!(b),
        Yaml::Array(a) => Value::Array(a.iter().map(to_json).collect()),
        Yaml::Hash(h) => Value::Object(
            h.iter()
                .map(|(k, v)| {
                    let key = match k {
                        Yaml::String(s) => s.clone(),
                        Yaml::Integer(i) => i.to_string(),
                        other => format!("{other:?}"),
                    };
                    (key, to_json(v))
                })
                .collect(),
        ),
        _ => Value::Null,
    }
}

/// The vendored description, as JSON.
fn spec() -> Value {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/firecracker/firecracker.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let docs = YamlLoader::load_from_str(&text).unwrap();
    to_json(&docs[0])
}

/// What `value` breaks of `schema` (Swagger 2.0's subset the yaml uses):
/// types, required and undeclared properties, enums, bounds.
fn check(spec: &Value, schema: &Value, value: &Value, at: &str, wrong: &mut Vec<String>) {
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        let name = r.trim_start_matches("#/definitions/");
        let def = &spec["definitions"][name];
        assert!(!def.is_null(), "no definition {name}");
        return check(spec, def, value, &format!("{at}({name})"), wrong);
    }
    let kind = schema.get("type").and_then(Value::as_str);
    match (kind, value) {
        (Some("object") | None, Value::Object(map)) => {
            let props = schema.get("properties").and_then(Value::as_object);
            for req in schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let req = req.as_str().unwrap();
                if !map.contains_key(req) {
                    wrong.push(format!("{at}: required {req} missing"));
                }
            }
            let open = schema.get("additionalProperties").is_some();
            for (k, v) in map {
                match props.and_then(|p| p.get(k)) {
                    Some(s) => check(spec, s, v, &format!("{at}.{k}"), wrong),
                    None if open => {}
                    None => wrong.push(format!("{at}: {k} is not in the schema")),
                }
            }
        }
        (Some("array"), Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                check(spec, &schema["items"], item, &format!("{at}[{i}]"), wrong);
            }
        }
        (Some("string") | None, Value::String(s)) => {
            if let Some(choices) = schema.get("enum").and_then(Value::as_array)
                && !choices.iter().any(|c| c.as_str() == Some(s))
            {
                wrong.push(format!("{at}: {s} is not one of {choices:?}"));
            }
        }
        (Some("integer"), Value::Number(n)) if n.is_u64() || n.is_i64() => {
            let n = n.as_f64().unwrap();
            if schema
                .get("minimum")
                .and_then(Value::as_f64)
                .is_some_and(|m| n < m)
                || schema
                    .get("maximum")
                    .and_then(Value::as_f64)
                    .is_some_and(|m| n > m)
            {
                wrong.push(format!("{at}: {n} is out of bounds"));
            }
        }
        (Some("boolean"), Value::Bool(_)) => {}
        (kind, value) => wrong.push(format!("{at}: {value} is not a {kind:?}")),
    }
}

/// The yaml's schema for `method path`'s body, and for its answer of
/// `status` (its own, or `default`).
fn schemas(
    spec: &Value,
    template: &str,
    method: &str,
    status: u16,
) -> (Option<Value>, Option<Value>) {
    let op = &spec["paths"][template][method.to_ascii_lowercase()];
    assert!(!op.is_null(), "the yaml has no {method} {template}");
    let body = op["parameters"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["in"] == "body")
        .map(|p| p["schema"].clone());
    let responses = &op["responses"];
    let answer = responses
        .get(status.to_string())
        .or_else(|| responses.get("default"))
        .and_then(|r| r.get("schema"))
        .cloned();
    (body, answer)
}

/// A request.
fn request(method: &str, path: &str, body: &Value) -> Request {
    Request {
        method: method.into(),
        path: path.into(),
        query: None,
        body: if body.is_null() {
            Vec::new()
        } else {
            serde_json::to_vec(body).unwrap()
        },
    }
}

/// The main thread's part, as it answers when it cannot start a VM.
fn launcher() -> Sender<Launch> {
    let (sender, launches) = channel();
    std::thread::spawn(move || {
        for launch in launches {
            match launch {
                Launch::Boot(_, reply) | Launch::Load(_, _, reply) => {
                    let _ = reply.send(Err(LaunchError::Setup(
                        lwpvmm::firecracker::setup::SetupError::NoKernel,
                    )));
                }
                Launch::Logger(_, reply) => {
                    let _ = reply.send(Ok(()));
                }
            }
        }
    });
    sender
}

/// A running VM's handle, answered by a thread: metrics flush, snapshots
/// taken, running.
fn vm() -> VmmHandle {
    let (sender, requests) = channel();
    let wake = Arc::new(EventFd::new(EFD_NONBLOCK).unwrap());
    let handle = VmmHandle::new(sender, wake, Arc::new(Recorder::new(None, true, 1000)));
    std::thread::spawn(move || {
        for request in requests {
            match request {
                VmRequest::Pause(r) | VmRequest::Resume(r) | VmRequest::SampleHz(_, r) => {
                    let _ = r.send(Ok(()));
                }
                VmRequest::FlushMetrics(r) => {
                    let _ = r.send(Err(ControlError::NoMetricsFile));
                }
                VmRequest::ReplaceDisk(_, path, r) => {
                    let _ = r.send(if path.exists() {
                        Ok(())
                    } else {
                        Err(ControlError::Drive("no such file".into()))
                    });
                }
                VmRequest::Snapshot(dir, _, r) => {
                    let _ = r.send(Ok(SnapshotInfo {
                        dir,
                        state_bytes: 1,
                        memory_bytes: 1,
                        pause_time: Default::default(),
                        total_time: Default::default(),
                    }));
                }
                VmRequest::Metrics(r) => {
                    let _ = r.send(VmCounters::of(&[], &[], &Default::default()));
                }
                VmRequest::Paused(r) => {
                    let _ = r.send(false);
                }
                VmRequest::Stop => {}
            }
        }
    });
    handle
}

/// A row: method, concrete path, the yaml's path template, body, the
/// status, and a piece of the fault message (or of the body); a piece that
/// starts with `!` marks a body that breaks the yaml's schema on purpose.
type Row = (
    &'static str,
    &'static str,
    &'static str,
    Value,
    u16,
    &'static str,
);

/// The pre-boot table, answered in order by one API.
fn before_rows(kernel: &str, image: &str) -> Vec<Row> {
    vec![
        ("GET", "/", "/", Value::Null, 200, "Not started"),
        (
            "GET",
            "/version",
            "/version",
            Value::Null,
            200,
            "\"1.17.0\"",
        ),
        (
            "PUT",
            "/actions",
            "/actions",
            json!({"action_type": "InstanceStart"}),
            400,
            "without a kernel",
        ),
        (
            "PUT",
            "/actions",
            "/actions",
            json!({"action_type": "FlushMetrics"}),
            400,
            "needs a running microVM",
        ),
        (
            "PUT",
            "/boot-source",
            "/boot-source",
            json!({"kernel_image_path": "/no/such/kernel"}),
            400,
            "kernel_image_path /no/such/kernel",
        ),
        (
            "PUT",
            "/boot-source",
            "/boot-source",
            json!({"kernel_image_path": kernel, "boot_args": "console=ttyS0 reboot=k panic=1"}),
            204,
            "",
        ),
        (
            "PUT",
            "/machine-config",
            "/machine-config",
            json!({"vcpu_count": 2, "mem_size_mib": 256}),
            204,
            "",
        ),
        // Routed on the first segment, as Firecracker routes: a trailing
        // slash, extra slashes or a segment more change nothing.
        (
            "PUT",
            "/machine-config/",
            "/machine-config",
            json!({"vcpu_count": 2, "mem_size_mib": 256}),
            204,
            "",
        ),
        (
            "PATCH",
            "//machine-config",
            "/machine-config",
            json!({"vcpu_count": 2}),
            204,
            "!",
        ),
        (
            "PUT",
            "/boot-source/",
            "/boot-source",
            json!({"kernel_image_path": kernel, "boot_args": "console=ttyS0 reboot=k panic=1"}),
            204,
            "",
        ),
        (
            "PUT",
            "/machine-config",
            "/machine-config",
            json!({"vcpu_count": 2, "mem_size_mib": 256, "cpu_template": "T2"}),
            400,
            "cpu_template is not offered",
        ),
        (
            "PUT",
            "/machine-config",
            "/machine-config",
            json!({"vcpu_count": 2, "mem_size_mib": 256, "huge_pages": "2M"}),
            400,
            "huge_pages is not offered",
        ),
        (
            "PUT",
            "/machine-config",
            "/machine-config",
            json!({"vcpu_count": 33, "mem_size_mib": 256}),
            400,
            "!33 is not between 1 and 32",
        ),
        // Firecracker's PATCH takes some fields, whatever the yaml requires.
        (
            "PATCH",
            "/machine-config",
            "/machine-config",
            json!({"track_dirty_pages": true}),
            204,
            "!",
        ),
        (
            "GET",
            "/machine-config",
            "/machine-config",
            Value::Null,
            200,
            "\"track_dirty_pages\": true",
        ),
        (
            "PUT",
            "/drives/rootfs",
            "/drives/{drive_id}",
            json!({"drive_id": "rootfs", "path_on_host": image, "is_root_device": true, "is_read_only": false}),
            204,
            "",
        ),
        (
            "PUT",
            "/drives/scratch",
            "/drives/{drive_id}",
            json!({"drive_id": "scratch", "path_on_host": image, "is_root_device": true}),
            400,
            "a root block device is already added (rootfs)",
        ),
        (
            "PUT",
            "/drives/scratch",
            "/drives/{drive_id}",
            json!({"drive_id": "other", "path_on_host": image, "is_root_device": false}),
            400,
            "does not match",
        ),
        (
            "PUT",
            "/drives/scratch",
            "/drives/{drive_id}",
            json!({"drive_id": "scratch", "path_on_host": image, "is_root_device": false, "rate_limiter": {"bandwidth": {"size": 1, "refill_time": 100}}}),
            400,
            "rate_limiter is not offered",
        ),
        // bandsox always sends Async; Writeback is what lwpvmm's drives do.
        (
            "PUT",
            "/drives/scratch",
            "/drives/{drive_id}",
            json!({"drive_id": "scratch", "path_on_host": image, "is_root_device": false, "cache_type": "Writeback", "io_engine": "Sync"}),
            204,
            "",
        ),
        (
            "PUT",
            "/drives/scratch",
            "/drives/{drive_id}",
            json!({"drive_id": "scratch", "path_on_host": image, "is_root_device": false, "cache_type": "Unsafe"}),
            204,
            "",
        ),
        (
            "PUT",
            "/drives/scratch",
            "/drives/{drive_id}",
            json!({"drive_id": "scratch", "path_on_host": image, "is_root_device": false, "io_engine": "Async"}),
            204,
            "",
        ),
        (
            "PUT",
            "/drives/scratch",
            "/drives/{drive_id}",
            json!({"drive_id": "scratch", "path_on_host": image, "is_root_device": false, "io_engine": "Uring"}),
            400,
            "!`Uring` is not Sync or Async",
        ),
        (
            "PUT",
            "/drives/scratch",
            "/drives/{drive_id}",
            json!({"drive_id": "scratch", "path_on_host": image, "is_root_device": false, "cache_type": "None"}),
            400,
            "!`None` is not Unsafe or Writeback",
        ),
        (
            "PUT",
            "/drives/",
            "/drives/{drive_id}",
            json!({"drive_id": "scratch", "path_on_host": image, "is_root_device": false}),
            400,
            "/drives/ names no id",
        ),
        (
            "PUT",
            "/drives/scr-atch",
            "/drives/{drive_id}",
            json!({"drive_id": "scr-atch", "path_on_host": image, "is_root_device": false}),
            400,
            "`scr-atch` is not an id",
        ),
        (
            "PUT",
            "/drives/scratch",
            "/drives/{drive_id}",
            json!({"drive_id": "scratch", "socket": "/run/vhost.sock", "is_root_device": false}),
            400,
            "socket is not offered",
        ),
        (
            "PUT",
            "/drives/scratch",
            "/drives/{drive_id}",
            json!({"drive_id": "scratch", "path_on_host": "/no/such/image", "is_root_device": false}),
            400,
            "path_on_host /no/such/image",
        ),
        (
            "PATCH",
            "/drives/rootfs",
            "/drives/{drive_id}",
            json!({"drive_id": "rootfs", "path_on_host": image}),
            400,
            "not supported before starting",
        ),
        (
            "PUT",
            "/network-interfaces/eth0",
            "/network-interfaces/{iface_id}",
            json!({"iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": "06:00:ac:10:00:02"}),
            204,
            "",
        ),
        (
            "PUT",
            "/network-interfaces/eth1",
            "/network-interfaces/{iface_id}",
            json!({"iface_id": "eth1", "host_dev_name": "tap1", "guest_mac": "06:00:zz:10:00:02"}),
            400,
            "is not a MAC address",
        ),
        (
            "PUT",
            "/network-interfaces/eth1",
            "/network-interfaces/{iface_id}",
            json!({"iface_id": "eth1", "host_dev_name": "tap1", "mtu": 9000}),
            400,
            "mtu is not offered",
        ),
        // The tap is looked for when it is PUT, as Firecracker looks.
        (
            "PUT",
            "/network-interfaces/eth1",
            "/network-interfaces/{iface_id}",
            json!({"iface_id": "eth1", "host_dev_name": "lwpvmm-notap"}),
            400,
            "host_dev_name lwpvmm-notap: no network interface of that name",
        ),
        (
            "PUT",
            "/network-interfaces/eth1",
            "/network-interfaces/{iface_id}",
            json!({"iface_id": "eth1", "host_dev_name": "tun0"}),
            400,
            "a tun device (IP packets), not a tap",
        ),
        (
            "PUT",
            "/network-interfaces/eth1",
            "/network-interfaces/{iface_id}",
            json!({"iface_id": "eth1", "host_dev_name": "eth9"}),
            400,
            "not a tap (a tun/tap device has tun_flags)",
        ),
        (
            "PUT",
            "/network-interfaces/eth1",
            "/network-interfaces/{iface_id}",
            json!({"iface_id": "eth1", "host_dev_name": "../tap0"}),
            400,
            "without `/`",
        ),
        (
            "PATCH",
            "/network-interfaces/eth0",
            "/network-interfaces/{iface_id}",
            json!({"iface_id": "eth0"}),
            400,
            "not supported before starting",
        ),
        (
            "PUT",
            "/logger",
            "/logger",
            json!({"level": "Info", "show_level": true, "show_log_origin": true}),
            204,
            "",
        ),
        (
            "PUT",
            "/logger",
            "/logger",
            json!({"level": "Info", "module": "api_server"}),
            400,
            "module is not offered",
        ),
        (
            "PUT",
            "/metrics",
            "/metrics",
            json!({"metrics_path": "/no/such/dir/metrics.json"}),
            400,
            "metrics_path /no/such/dir/metrics.json: not a file in a directory that exists",
        ),
        (
            "PUT",
            "/metrics",
            "/metrics",
            json!({"metrics_path": "/tmp/lwpvmm-fc-metrics.json"}),
            204,
            "",
        ),
        (
            "PUT",
            "/metrics",
            "/metrics",
            json!({"metrics_path": "/tmp/again.json"}),
            400,
            "configured already",
        ),
        (
            "PUT",
            "/vsock",
            "/vsock",
            json!({"guest_cid": 2, "uds_path": "/tmp/lwpvmm-no-such.sock"}),
            400,
            "!2 is not a guest's context ID",
        ),
        (
            "PUT",
            "/vsock",
            "/vsock",
            json!({"guest_cid": 3, "uds_path": image}),
            400,
            "exists already",
        ),
        (
            "PUT",
            "/vsock",
            "/vsock",
            json!({"guest_cid": 3, "uds_path": "/tmp/lwpvmm-no-such.sock"}),
            204,
            "",
        ),
        // bandsox names the device in the path.
        (
            "PUT",
            "/vsock/vsock0",
            "/vsock",
            json!({"guest_cid": 3, "uds_path": "/tmp/lwpvmm-no-such.sock", "vsock_id": "vsock0"}),
            204,
            "",
        ),
        (
            "PUT",
            "/balloon",
            "/balloon",
            json!({"amount_mib": 0, "deflate_on_oom": true}),
            400,
            "no balloon device",
        ),
        (
            "PATCH",
            "/balloon",
            "/balloon",
            json!({"amount_mib": 0}),
            400,
            "no balloon device",
        ),
        (
            "GET",
            "/balloon",
            "/balloon",
            Value::Null,
            400,
            "no balloon device",
        ),
        (
            "GET",
            "/balloon/statistics",
            "/balloon/statistics",
            Value::Null,
            400,
            "no balloon device",
        ),
        (
            "PATCH",
            "/balloon/statistics",
            "/balloon/statistics",
            json!({"stats_polling_interval_s": 1}),
            400,
            "no balloon device",
        ),
        (
            "PATCH",
            "/balloon/hinting/start",
            "/balloon/hinting/start",
            json!({}),
            400,
            "no balloon device",
        ),
        (
            "GET",
            "/balloon/hinting/status",
            "/balloon/hinting/status",
            Value::Null,
            400,
            "no balloon device",
        ),
        (
            "PATCH",
            "/balloon/hinting/stop",
            "/balloon/hinting/stop",
            Value::Null,
            400,
            "no balloon device",
        ),
        (
            "PUT",
            "/mmds",
            "/mmds",
            json!({"latest": {}}),
            400,
            "no metadata service",
        ),
        (
            "PATCH",
            "/mmds",
            "/mmds",
            json!({"latest": {}}),
            400,
            "no metadata service",
        ),
        (
            "GET",
            "/mmds",
            "/mmds",
            Value::Null,
            400,
            "no metadata service",
        ),
        (
            "PUT",
            "/mmds/config",
            "/mmds/config",
            json!({"network_interfaces": ["eth0"]}),
            400,
            "no metadata service",
        ),
        (
            "PUT",
            "/entropy",
            "/entropy",
            json!({"rate_limiter": {"bandwidth": {"size": 4096, "refill_time": 1000}, "ops": {"size": 100, "one_time_burst": 10, "refill_time": 1000}}}),
            204,
            "",
        ),
        (
            "PUT",
            "/cpu-config",
            "/cpu-config",
            json!({"cpuid_modifiers": []}),
            400,
            "CPUID table",
        ),
        (
            "PUT",
            "/pmem/p0",
            "/pmem/{id}",
            json!({"id": "p0", "path_on_host": image}),
            400,
            "no virtio-pmem",
        ),
        (
            "PATCH",
            "/pmem/p0",
            "/pmem/{id}",
            json!({"id": "p0"}),
            400,
            "no virtio-pmem",
        ),
        (
            "PUT",
            "/serial",
            "/serial",
            json!({"serial_out_path": "/tmp/serial"}),
            400,
            "standard output",
        ),
        (
            "PUT",
            "/hotplug/memory",
            "/hotplug/memory",
            json!({"total_size_mib": 1024}),
            400,
            "no virtio-mem",
        ),
        (
            "PATCH",
            "/hotplug/memory",
            "/hotplug/memory",
            json!({"requested_size_mib": 512}),
            400,
            "no virtio-mem",
        ),
        (
            "GET",
            "/hotplug/memory",
            "/hotplug/memory",
            Value::Null,
            400,
            "no virtio-mem",
        ),
        (
            "PUT",
            "/snapshot/create",
            "/snapshot/create",
            json!({"snapshot_path": "/tmp/s", "mem_file_path": "/tmp/s/memory.bin"}),
            400,
            "not supported before starting",
        ),
        (
            "PATCH",
            "/vm",
            "/vm",
            json!({"state": "Paused"}),
            400,
            "not supported before starting",
        ),
        (
            "PUT",
            "/snapshot/load",
            "/snapshot/load",
            json!({"snapshot_path": "/tmp/s", "mem_backend": {"backend_type": "Uffd", "backend_path": "/tmp/uffd.sock"}}),
            400,
            "mem_backend Uffd is not offered",
        ),
        (
            "PUT",
            "/snapshot/unpack",
            "/snapshot/load",
            json!({"snapshot_path": "/tmp/s"}),
            400,
            "Invalid request method and/or path: PUT /snapshot/unpack.",
        ),
        (
            "PUT",
            "/snapshot/load",
            "/snapshot/load",
            json!({"snapshot_path": "/tmp/s", "mem_file_path": "/tmp/s.mem"}),
            400,
            "the memory file of an lwpvmm snapshot is /tmp/s/memory.bin",
        ),
        (
            "PUT",
            "/snapshot/load",
            "/snapshot/load",
            json!({"snapshot_path": "/tmp/s", "mem_backend": {"backend_type": "File", "backend_path": "/tmp/s/memory.bin"}, "network_overrides": [{"iface_id": "eth0", "host_dev_name": "lwpnotap9"}]}),
            400,
            "host_dev_name lwpnotap9: no network interface of that name",
        ),
        (
            "PUT",
            "/snapshot/load",
            "/snapshot/load",
            json!({"snapshot_path": "/tmp/s", "network_overrides": [{"iface_id": "eth0", "host_dev_name": "lo"}, {"iface_id": "eth0", "host_dev_name": "lo"}]}),
            400,
            "the interface `eth0` is named twice",
        ),
        (
            "PUT",
            "/snapshot/load",
            "/snapshot/load",
            json!({"snapshot_path": "/tmp/s", "vsock_override": {"uds_path": ""}}),
            400,
            "give the path of the host socket",
        ),
        (
            "PUT",
            "/snapshot/load",
            "/snapshot/load",
            json!({"snapshot_path": "/tmp/s", "mem_backend": {"backend_type": "File", "backend_path": "/tmp/s/memory.bin"}, "resume_vm": true}),
            400,
            "without a kernel",
        ),
        (
            "GET",
            "/vm/config",
            "/vm/config",
            Value::Null,
            200,
            "\"path_on_host\"",
        ),
        (
            "GET",
            "/vm/config/",
            "/vm/config",
            Value::Null,
            200,
            "\"io_engine\": \"Async\"",
        ),
        (
            "GET",
            "/vm/config",
            "/vm/config",
            Value::Null,
            200,
            "\"one_time_burst\": 10",
        ),
    ]
}

/// The table after the start, answered by one API over a running VM;
/// status 0 is a request lwpvmm's own endpoints answer.
fn after_rows(kernel: &str) -> Vec<Row> {
    vec![
        ("GET", "/", "/", Value::Null, 200, "Running"),
        (
            "GET",
            "/version",
            "/version",
            Value::Null,
            200,
            "firecracker_version",
        ),
        (
            "GET",
            "/machine-config",
            "/machine-config",
            Value::Null,
            200,
            "vcpu_count",
        ),
        (
            "GET",
            "/vm/config",
            "/vm/config",
            Value::Null,
            200,
            "boot-source",
        ),
        (
            "PUT",
            "/boot-source",
            "/boot-source",
            json!({"kernel_image_path": kernel}),
            400,
            "not supported after starting",
        ),
        (
            "PUT",
            "/machine-config",
            "/machine-config",
            json!({"vcpu_count": 1, "mem_size_mib": 64}),
            400,
            "not supported after starting",
        ),
        (
            "PATCH",
            "/machine-config",
            "/machine-config",
            json!({"vcpu_count": 1}),
            400,
            "!not supported after starting",
        ),
        (
            "PUT",
            "/drives/rootfs",
            "/drives/{drive_id}",
            json!({"drive_id": "rootfs", "path_on_host": kernel, "is_root_device": true}),
            400,
            "not supported after starting",
        ),
        (
            "PATCH",
            "/drives/rootfs",
            "/drives/{drive_id}",
            json!({"drive_id": "rootfs", "path_on_host": kernel}),
            204,
            "",
        ),
        (
            "PATCH",
            "/drives/rootfs",
            "/drives/{drive_id}",
            json!({"drive_id": "rootfs", "path_on_host": "/no/such/image"}),
            400,
            "path_on_host /no/such/image",
        ),
        (
            "PATCH",
            "/drives/data",
            "/drives/{drive_id}",
            json!({"drive_id": "data", "path_on_host": kernel}),
            400,
            "no drive `data` was added before the start",
        ),
        (
            "PATCH",
            "/drives/rootfs",
            "/drives/{drive_id}",
            json!({"drive_id": "rootfs", "path_on_host": kernel, "rate_limiter": {"ops": {"size": 1, "refill_time": 1}}}),
            400,
            "rate_limiter is not offered",
        ),
        (
            "PUT",
            "/network-interfaces/eth0",
            "/network-interfaces/{iface_id}",
            json!({"iface_id": "eth0", "host_dev_name": "tap0"}),
            400,
            "not supported after starting",
        ),
        // It changes rate limiters, which lwpvmm has not: without one it
        // changes nothing, as in Firecracker.
        (
            "PATCH",
            "/network-interfaces/eth0",
            "/network-interfaces/{iface_id}",
            json!({"iface_id": "eth0"}),
            204,
            "",
        ),
        (
            "PATCH",
            "/network-interfaces/eth0",
            "/network-interfaces/{iface_id}",
            json!({"iface_id": "eth0", "rx_rate_limiter": {"bandwidth": {"size": 1, "refill_time": 100}}}),
            400,
            "rx_rate_limiter is not offered by lwpvmm: lwpvmm has no rate limiters",
        ),
        (
            "PATCH",
            "/network-interfaces/eth7",
            "/network-interfaces/{iface_id}",
            json!({"iface_id": "eth7"}),
            400,
            "no network interface `eth7` was added before the start",
        ),
        (
            "PUT",
            "/logger",
            "/logger",
            json!({"level": "Debug"}),
            400,
            "not supported after starting",
        ),
        (
            "PUT",
            "/metrics",
            "/metrics",
            json!({"metrics_path": "/tmp/m"}),
            400,
            "not supported after starting",
        ),
        (
            "PUT",
            "/vsock",
            "/vsock",
            json!({"guest_cid": 3, "uds_path": "/tmp/v.sock"}),
            400,
            "not supported after starting",
        ),
        (
            "PUT",
            "/vsock/vsock0",
            "/vsock",
            json!({"guest_cid": 3, "uds_path": "/tmp/v.sock"}),
            400,
            "not supported after starting",
        ),
        (
            "PUT",
            "/snapshot/load",
            "/snapshot/load",
            json!({"snapshot_path": "/tmp/s", "mem_file_path": "/tmp/s/memory.bin"}),
            400,
            "not supported after starting",
        ),
        (
            "PUT",
            "/actions",
            "/actions",
            json!({"action_type": "InstanceStart"}),
            400,
            "already running",
        ),
        (
            "PUT",
            "/actions",
            "/actions",
            json!({"action_type": "FlushMetrics"}),
            400,
            "no metrics file",
        ),
        (
            "PUT",
            "/actions",
            "/actions",
            json!({"action_type": "SendCtrlAltDel"}),
            400,
            "no i8042 keyboard",
        ),
        (
            "PUT",
            "/snapshot/create",
            "/snapshot/create",
            json!({"snapshot_path": "/tmp/s", "mem_file_path": "/tmp/s.mem", "snapshot_type": "Full"}),
            400,
            "the memory file of an lwpvmm snapshot is /tmp/s/memory.bin",
        ),
        (
            "PUT",
            "/snapshot/create",
            "/snapshot/create",
            json!({"snapshot_path": "/tmp/s", "mem_file_path": "/tmp/s/memory.bin", "snapshot_type": "Diff"}),
            204,
            "",
        ),
        (
            "PUT",
            "/snapshot/create/",
            "/snapshot/create",
            json!({"snapshot_path": "/tmp/s", "mem_file_path": "/tmp/s/memory.bin"}),
            204,
            "",
        ),
        (
            "PUT",
            "/balloon",
            "/balloon",
            json!({"amount_mib": 0, "deflate_on_oom": true}),
            400,
            "no balloon device",
        ),
        ("PATCH", "/vm", "/vm", json!({"state": "Paused"}), 204, ""),
        ("PATCH", "/vm/", "/vm", json!({"state": "Resumed"}), 204, ""),
        (
            "PATCH",
            "/vm",
            "/vm",
            json!({"state": "Asleep"}),
            400,
            "!unknown variant `Asleep`",
        ),
        // lwpvmm's own action, not in the yaml.
        (
            "PUT",
            "/actions/",
            "/actions",
            json!({"action_type": "Stop"}),
            204,
            "!",
        ),
    ]
}

/// Checks `answer` against the row and the yaml; the failures.
fn judge(spec: &Value, row: &Row, answer: Option<Response>) -> Vec<String> {
    let (method, path, template, body, status, text) = row;
    let mut wrong = Vec::new();
    let at = format!("{method} {path}");
    let (body_schema, _) = schemas(spec, template, method, 204);
    let (text, on_purpose) = match text.strip_prefix('!') {
        Some(t) => (t, true),
        None => (*text, false),
    };
    if let Some(schema) = &body_schema
        && !body.is_null()
        && !on_purpose
    {
        check(spec, schema, body, &format!("{at} request"), &mut wrong);
    }
    let Some(answer) = answer else {
        if *status != 0 {
            wrong.push(format!(
                "{at}: left to lwpvmm's endpoints, expected {status}"
            ));
        }
        return wrong;
    };
    let shown = String::from_utf8_lossy(&answer.body).into_owned();
    if answer.status != *status || !shown.contains(text) {
        wrong.push(format!(
            "{at}: answered {} {shown}, expected {status} with {text:?}",
            answer.status
        ));
    }
    let (_, answer_schema) = schemas(spec, template, method, answer.status);
    match (answer_schema, answer.body.is_empty()) {
        (Some(schema), false) => {
            let value: Value = serde_json::from_slice(&answer.body).unwrap();
            check(
                spec,
                &schema,
                &value,
                &format!("{at} answer {}", answer.status),
                &mut wrong,
            );
        }
        (None, true) => {}
        (Some(_), true) => wrong.push(format!("{at}: an empty answer where the yaml has a body")),
        (None, false) => wrong.push(format!("{at}: a body where the yaml has none: {shown}")),
    }
    wrong
}

#[test]
fn every_endpoint_answers_as_firecracker_yaml_describes_it() {
    let spec = spec();
    let dir = std::env::temp_dir().join(format!("lwpvmm-fc-api-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kernel = dir.join("vmlinux");
    let image = dir.join("rootfs.ext4");
    std::fs::write(&kernel, b"kernel").unwrap();
    std::fs::write(&image, vec![0u8; 4096]).unwrap();
    let (kernel, image) = (kernel.to_str().unwrap(), image.to_str().unwrap());

    // The host's interfaces, as /sys/class/net lists them: a tap, a tun,
    // and an interface that is neither.
    let interfaces = dir.join("net");
    for (name, flags) in [
        ("tap0", Some("0x1002\n")),
        ("tun0", Some("0x1001\n")),
        ("eth9", None),
    ] {
        std::fs::create_dir_all(interfaces.join(name)).unwrap();
        if let Some(flags) = flags {
            std::fs::write(interfaces.join(name).join("tun_flags"), flags).unwrap();
        }
    }
    let setup = Setup {
        interfaces,
        ..Setup::default()
    };
    let mut api = FirecrackerApi::new(setup, "vm-1".into(), launcher());
    let mut wrong = Vec::new();
    let before = before_rows(kernel, image);
    for row in &before {
        let answer = match api.before_start(&request(row.0, row.1, &row.3)) {
            Before::Now(r) => r,
            Before::Started(..) => panic!("{} {} started a VM", row.0, row.1),
        };
        wrong.extend(judge(&spec, row, Some(answer)));
    }
    let vm = vm();
    let after = after_rows(kernel);
    for row in &after {
        let answer = api.after_start(&request(row.0, row.1, &row.3), &vm);
        wrong.extend(judge(&spec, row, answer));
    }
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));

    // Every path and method of the yaml is in a table.
    let covered: BTreeSet<(String, String)> = before
        .iter()
        .chain(&after)
        .map(|r| (r.2.to_string(), r.0.to_ascii_lowercase()))
        .collect();
    let mut missing = Vec::new();
    for (path, ops) in spec["paths"].as_object().unwrap() {
        for method in ops.as_object().unwrap().keys() {
            if !covered.contains(&(path.clone(), method.clone())) {
                missing.push(format!("{method} {path}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "endpoints of firecracker.yaml no row covers: {missing:?}"
    );
}

#[test]
fn the_config_file_format_is_firecrackers_full_vm_configuration() {
    let spec = spec();
    // Firecracker's getting-started config, plus lwpvmm's `lwp`.
    let config = json!({
        "boot-source": {"kernel_image_path": "/k", "boot_args": "console=ttyS0 reboot=k panic=1 pci=off", "initrd_path": "/i"},
        "drives": [{"drive_id": "rootfs", "path_on_host": "/r", "is_root_device": true, "is_read_only": false}],
        "machine-config": {"vcpu_count": 2, "mem_size_mib": 1024, "smt": false, "track_dirty_pages": false},
        "network-interfaces": [{"iface_id": "eth0", "guest_mac": "06:00:AC:10:00:02", "host_dev_name": "tap0"}],
        "logger": {"log_path": "/tmp/log", "level": "Info"},
        "metrics": {"metrics_path": "/tmp/m"}
    });
    let mut wrong = Vec::new();
    check(
        &spec,
        &json!({"$ref": "#/definitions/FullVmConfiguration"}),
        &config,
        "config",
        &mut wrong,
    );
    assert!(wrong.is_empty(), "{wrong:?}");
    let mut with_lwp = config.clone();
    with_lwp["vsock"] = json!({"guest_cid": 3, "uds_path": "/tmp/lwpvmm-fc-config.sock"});
    with_lwp["lwp"] = json!({"profile": "precise", "sample_hz": 500});
    let parsed: lwpvmm::firecracker::model::FullConfig = serde_json::from_value(with_lwp).unwrap();
    assert_eq!(parsed.drives[0].drive_id, "rootfs");
    assert_eq!(parsed.lwp.unwrap().profile.as_deref(), Some("precise"));
    assert_eq!(parsed.vsock.unwrap().guest_cid, 3);
    // (a section lwpvmm refuses or whose value it refuses, the words that say so)
    let refused: &[(&str, Value, &str)] = &[
        (
            "balloon",
            json!({"amount_mib": 0, "deflate_on_oom": false}),
            "balloon is not offered",
        ),
        (
            "mmds-config",
            json!({"network_interfaces": ["eth0"]}),
            "mmds-config is not offered",
        ),
        ("cpu-config", json!({}), "cpu-config is not offered"),
        ("pmem", json!([]), "pmem is not offered"),
        ("memory-hotplug", json!({}), "memory-hotplug is not offered"),
        (
            "logger",
            json!({"module": "api_server"}),
            "module is not offered",
        ),
        ("logger", json!({"level": "Loud"}), "`Loud` is not a level"),
        (
            "vsock",
            json!({"guest_cid": 2, "uds_path": "/tmp/v"}),
            "2 is not a guest's context ID",
        ),
    ];
    for (section, value, text) in refused {
        let mut c = json!({});
        c[*section] = value.clone();
        let parsed: lwpvmm::firecracker::model::FullConfig = serde_json::from_value(c).unwrap();
        let e = Setup::from_file(parsed).unwrap_err().to_string();
        assert!(e.contains(text), "{section}: {e}");
    }
    assert!(
        serde_json::from_value::<lwpvmm::firecracker::model::FullConfig>(json!({"bogus": 1}))
            .is_err()
    );
}

#[test]
fn the_version_is_the_yamls_release_which_semver_checks_take() {
    let yaml = spec()["info"]["version"].as_str().unwrap().to_owned();
    // The release the yaml describes, without its pre-release suffix
    // (`-dev` sorts below the release, and clients' checks refuse it).
    let release = yaml.split('-').next().unwrap();
    let numbers: Vec<u64> = release.split('.').map(|n| n.parse().unwrap()).collect();
    assert_eq!(numbers.len(), 3, "{yaml}");
    let mut api = FirecrackerApi::new(Setup::default(), "vm-1".into(), launcher());
    let mut get = |path: &str| match api.before_start(&request("GET", path, &Value::Null)) {
        Before::Now(r) => serde_json::from_slice::<Value>(&r.body).unwrap(),
        Before::Started(..) => panic!("GET {path} started a VM"),
    };
    assert_eq!(get("/version")["firecracker_version"], release);
    let info = get("/");
    assert_eq!(info["vmm_version"], release);
    assert_eq!(
        info["app_name"], "lwpvmm",
        "how a client tells lwpvmm apart"
    );
}
