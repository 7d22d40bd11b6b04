//! The request and response bodies of Firecracker's API, as its OpenAPI
//! description (tests/data/firecracker/firecracker.yaml) defines them, and
//! the `lwp` object lwpvmm adds. Unknown fields are refused, as Firecracker
//! refuses them; a field Firecracker has and lwpvmm does not offer parses,
//! so that [`super::setup`] can refuse it by name.

use serde::{Deserialize, Serialize};

/// `PUT /boot-source` (`BootSource`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootSource {
    /// The kernel (ELF or bzImage).
    pub kernel_image_path: String,
    /// The kernel command line; without it, lwpvmm's default for the
    /// kernel (docs/linux-guest.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_args: Option<String>,
    /// The initramfs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd_path: Option<String>,
}

/// `PUT|PATCH|GET /machine-config` (`MachineConfiguration`); in a PATCH
/// every field is optional.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineConfigBody {
    /// vCPUs, 1 to 32.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpu_count: Option<u64>,
    /// Guest RAM in MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_size_mib: Option<u64>,
    /// Simultaneous multithreading.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smt: Option<bool>,
    /// Dirty page tracking, for Diff snapshots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub track_dirty_pages: Option<bool>,
    /// A CPU template: only `None` here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_template: Option<String>,
    /// Huge pages: only `None` here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub huge_pages: Option<String>,
}

/// `GET /machine-config`: the whole configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MachineConfig {
    /// vCPUs.
    pub vcpu_count: u8,
    /// Guest RAM in MiB.
    pub mem_size_mib: u64,
    /// Always false here.
    pub smt: bool,
    /// Dirty page tracking.
    pub track_dirty_pages: bool,
    /// Always `None` here.
    pub huge_pages: &'static str,
}

/// `PUT /drives/{id}` (`Drive`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Drive {
    /// Its id, as in the path.
    pub drive_id: String,
    /// The raw image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_on_host: Option<String>,
    /// Whether the kernel boots from it.
    pub is_root_device: bool,
    /// Attach it read-only.
    #[serde(default)]
    pub is_read_only: bool,
    /// The root partition's UUID (`root=PARTUUID=`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partuuid: Option<String>,
    /// `Unsafe` (Firecracker's default) or `Writeback`: lwpvmm's drives
    /// are Writeback either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_type: Option<String>,
    /// `Sync` or `Async`: lwpvmm's drives are Sync either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_engine: Option<String>,
    /// Refused: lwpvmm has no rate limiters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limiter: Option<serde_json::Value>,
    /// Refused: vhost-user-block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<String>,
}

/// `PATCH /drives/{id}` (`PartialDrive`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartialDrive {
    /// Its id, as in the path.
    pub drive_id: String,
    /// A new backing file.
    #[serde(default)]
    pub path_on_host: Option<String>,
    /// Refused: lwpvmm has no rate limiters.
    #[serde(default)]
    pub rate_limiter: Option<serde_json::Value>,
}

/// `PUT /network-interfaces/{id}` (`NetworkInterface`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkInterface {
    /// Its id, as in the path.
    pub iface_id: String,
    /// The host tap.
    pub host_dev_name: String,
    /// The guest's MAC, `aa:bb:cc:dd:ee:ff`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_mac: Option<String>,
    /// Refused: lwpvmm's virtio-net does not offer VIRTIO_NET_F_MTU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Refused: no rate limiters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_rate_limiter: Option<serde_json::Value>,
    /// Refused: no rate limiters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_rate_limiter: Option<serde_json::Value>,
}

/// `PATCH /network-interfaces/{id}` (`PartialNetworkInterface`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartialNetworkInterface {
    /// Its id, as in the path.
    pub iface_id: String,
    /// Refused: no rate limiters.
    #[serde(default)]
    pub rx_rate_limiter: Option<serde_json::Value>,
    /// Refused: no rate limiters.
    #[serde(default)]
    pub tx_rate_limiter: Option<serde_json::Value>,
}

/// `PUT /logger` (`Logger`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Logger {
    /// Where log lines go (a file or a FIFO), appended to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_path: Option<String>,
    /// `Error`, `Warning`, `Info`, `Debug`, `Trace` or `Off`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<String>,
    /// Accepted when true: lwpvmm's lines always show their level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub show_level: Option<bool>,
    /// Accepted when true: lwpvmm's lines always show their module.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub show_log_origin: Option<bool>,
    /// Refused: one level for every module.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
}

/// `PUT /metrics` (`Metrics`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metrics {
    /// Where lwpvmm's counters go.
    pub metrics_path: String,
    /// Refused: Firecracker's jailer id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub emit_id: Option<bool>,
    /// Refused: operator-defined labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub properties: Option<serde_json::Value>,
}

/// `PUT /vsock` (`Vsock`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Vsock {
    /// The guest's context id.
    pub guest_cid: u64,
    /// The host socket.
    pub uds_path: String,
    /// Deprecated in Firecracker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vsock_id: Option<String>,
}

/// `PUT /entropy` (`EntropyDevice`): a virtio-rng device, with its rate
/// limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entropy {
    /// How fast the guest may draw (Firecracker's `RateLimiter`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limiter: Option<crate::vmm::config::RateLimit>,
}

/// `PUT /actions` (`InstanceActionInfo`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Action {
    /// What to do.
    pub action_type: ActionType,
}

/// Firecracker's actions, and lwpvmm's `Stop`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum ActionType {
    /// Boot the configured VM.
    InstanceStart,
    /// Press Ctrl+Alt+Del on the guest's keyboard.
    SendCtrlAltDel,
    /// Write the metrics now.
    FlushMetrics,
    /// lwpvmm's: stop the VM.
    Stop,
}

/// `PATCH /vm` (`Vm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Vm {
    /// What the microVM is to be.
    pub state: VmState,
}

/// `Vm`'s states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum VmState {
    /// Every vCPU stopped.
    Paused,
    /// Running again.
    Resumed,
}

/// An interface's new tap (`NetworkOverride`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkOverride {
    /// The snapshotted VM's interface.
    pub iface_id: String,
    /// The tap it opens instead.
    pub host_dev_name: String,
}

/// The vsock device's new socket (`VsockOverride`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VsockOverride {
    /// The host socket.
    pub uds_path: String,
}

/// `PUT /snapshot/load` (`SnapshotLoadParams`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotLoad {
    /// The snapshot (lwpvmm's snapshot directory).
    pub snapshot_path: String,
    /// The memory file (deprecated form of `mem_backend`).
    #[serde(default)]
    pub mem_file_path: Option<String>,
    /// Where the memory comes from.
    #[serde(default)]
    pub mem_backend: Option<MemoryBackend>,
    /// Track dirty pages, for Diff snapshots of the restored VM.
    #[serde(default)]
    pub track_dirty_pages: Option<bool>,
    /// The deprecated name of `track_dirty_pages`.
    #[serde(default)]
    pub enable_diff_snapshots: Option<bool>,
    /// Run the VM at once (else it is loaded paused).
    #[serde(default)]
    pub resume_vm: Option<bool>,
    /// Taps of the loaded VM's interfaces instead of the snapshot's.
    #[serde(default)]
    pub network_overrides: Option<Vec<NetworkOverride>>,
    /// The socket the loaded VM's vsock device binds instead of the
    /// snapshot's.
    #[serde(default)]
    pub vsock_override: Option<VsockOverride>,
    /// Refused: the guest's clock is restored as lwpvmm restores it.
    #[serde(default)]
    pub clock_realtime: Option<bool>,
    /// Refused unless `None` or `Snapshot`.
    #[serde(default)]
    pub huge_pages: Option<String>,
}

/// `MemoryBackend`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryBackend {
    /// `File` or `Uffd`.
    pub backend_type: String,
    /// The file (or Uffd's socket).
    pub backend_path: String,
}

/// `PUT /snapshot/create` (`SnapshotCreateParams`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotCreate {
    /// lwpvmm's snapshot directory.
    pub snapshot_path: String,
    /// Where the memory goes: `snapshot_path/memory.bin`, or a path where
    /// lwpvmm links that file.
    #[serde(default)]
    pub mem_file_path: Option<String>,
    /// `Full` or `Diff`.
    #[serde(default)]
    pub snapshot_type: Option<String>,
}

/// lwpvmm's `PUT /lwp` and the config file's `lwp` object.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lwp {
    /// `off`, `emulated` (the default), `precise` or `bulldozer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// `shim` (the default) or `stock`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest: Option<String>,
    /// The sampler's rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_hz: Option<u32>,
    /// The trace file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
    /// `auto` (the default), `native` or `emulated`: `--supervisor`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supervisor: Option<String>,
}

/// `GET /`: `InstanceInfo`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InstanceInfo {
    /// [`APP_NAME`], where Firecracker says `Firecracker`: how a client
    /// tells lwpvmm from Firecracker.
    pub app_name: &'static str,
    /// `--id`.
    pub id: String,
    /// `Not started`, `Running` or `Paused`.
    pub state: &'static str,
    /// [`API_VERSION`], as `GET /version` says it.
    pub vmm_version: &'static str,
}

/// `GET /`'s `app_name`.
pub const APP_NAME: &str = "lwpvmm";

/// `GET /version`: `FirecrackerVersion`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Version {
    /// The API version lwpvmm follows (lwpvmm's own is `--version`'s).
    pub firecracker_version: &'static str,
}

/// The version of Firecracker's API lwpvmm follows: that of the vendored
/// firecracker.yaml (`1.17.0-dev`) without its pre-release suffix, which
/// semver sorts below 1.17.0, so that a client's check for "1.17 or later"
/// takes it. lwpvmm's own version is `--version`'s and the API's `Server`
/// header's.
pub const API_VERSION: &str = "1.17.0";

/// `GET /vm/config` and `--config-file`: `FullVmConfiguration`, and `lwp`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FullConfig {
    /// The kernel.
    #[serde(
        rename = "boot-source",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub boot_source: Option<BootSource>,
    /// The block devices.
    #[serde(default)]
    pub drives: Vec<Drive>,
    /// vCPUs and memory.
    #[serde(
        rename = "machine-config",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub machine_config: Option<MachineConfigBody>,
    /// The network devices.
    #[serde(rename = "network-interfaces", default)]
    pub network_interfaces: Vec<NetworkInterface>,
    /// vsock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vsock: Option<Vsock>,
    /// Logging.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logger: Option<Logger>,
    /// Metrics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<Metrics>,
    /// LWP (lwpvmm's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lwp: Option<Lwp>,
    /// Refused: no balloon device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balloon: Option<serde_json::Value>,
    /// Refused: no MMDS.
    #[serde(
        rename = "mmds-config",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub mmds_config: Option<serde_json::Value>,
    /// The entropy device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entropy: Option<Entropy>,
    /// Refused: CPU templates.
    #[serde(
        rename = "cpu-config",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub cpu_config: Option<serde_json::Value>,
    /// Refused: no virtio-pmem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pmem: Option<serde_json::Value>,
    /// Refused: no virtio-mem.
    #[serde(
        rename = "memory-hotplug",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub memory_hotplug: Option<serde_json::Value>,
}
