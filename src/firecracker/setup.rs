//! The machine a Firecracker client configures before `InstanceStart`:
//! each pre-boot request applied to a [`Setup`], checked as Firecracker
//! checks it, and what lwpvmm does not offer refused by name. Pure: the
//! files it names are only looked at (exists, regular) here, and a tap's
//! entry in /sys/class/net read; the launcher opens them.

use std::path::{Path, PathBuf};

use thiserror::Error;

use super::model::{
    BootSource, Drive, Entropy, FullConfig, Logger, Lwp, MachineConfig, MachineConfigBody, Metrics,
    NetworkInterface, PartialNetworkInterface, Vsock,
};
use crate::lwp::cpuid::{GuestLwpSupport, LwpProfile};
use crate::vmm::config::{DEFAULT_MEMORY_MIB, SupervisorMode};

/// Firecracker's limit on vCPUs.
pub const MAX_VCPUS: u64 = 32;
/// The most drives and network interfaces each (lwpvmm's MMIO window).
pub const MAX_DEVICES: usize = 8;
/// The sampler's rate unless `lwp.sample_hz` says otherwise.
pub const DEFAULT_SAMPLE_HZ: u32 = 1000;
/// Where the host lists its network interfaces, a tun/tap device's with
/// its `tun_flags`.
pub const HOST_INTERFACES: &str = "/sys/class/net";
/// `IFF_TAP` in `tun_flags` (linux/if_tun.h): a tap, not a tun.
const IFF_TAP: u32 = 0x0002;

/// Why a request was refused: each says what to send instead.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SetupError {
    /// A field lwpvmm does not offer.
    #[error("{field} is not offered by lwpvmm: {why}")]
    NotOffered {
        /// The field or endpoint.
        field: &'static str,
        /// Why, and what to do.
        why: &'static str,
    },
    /// A value out of its range or not one of its choices.
    #[error("{field}: {why}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What is wrong.
        why: String,
    },
    /// The id in the path and the body differ.
    #[error("the id from the path ({path}) does not match the id from the body ({body})")]
    IdMismatch {
        /// The path's.
        path: String,
        /// The body's.
        body: String,
    },
    /// A file that is not there or not a regular file.
    #[error("{field} {path}: {why}")]
    File {
        /// The field.
        field: &'static str,
        /// The path.
        path: String,
        /// What is wrong.
        why: String,
    },
    /// A host interface that is not a tap.
    #[error("host_dev_name {name}: {why}")]
    Tap {
        /// The interface's name.
        name: String,
        /// What it is, and what to do.
        why: String,
    },
    /// A second root device.
    #[error("a root block device is already added ({0}): only one drive may be the root")]
    SecondRoot(String),
    /// Too many devices.
    #[error("lwpvmm offers at most {MAX_DEVICES} {0}")]
    TooMany(&'static str),
    /// `InstanceStart` with no kernel.
    #[error(
        "cannot start the microVM without a kernel: PUT /boot-source {{\"kernel_image_path\": ...}} first"
    )]
    NoKernel,
}

impl SetupError {
    /// The HTTP status: Firecracker answers every refused request 400.
    pub fn status(&self) -> u16 {
        400
    }
}

/// What LWP the guest gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LwpSetup {
    /// The profile.
    pub profile: LwpProfile,
    /// Whether the guest carries the shim.
    pub guest: GuestLwpSupport,
    /// The sampler's rate.
    pub sample_hz: u32,
    /// The trace file.
    pub trace: Option<PathBuf>,
    /// Where the guest kernel's supervisor code runs.
    pub supervisor: SupervisorMode,
}

impl Default for LwpSetup {
    fn default() -> Self {
        LwpSetup {
            profile: LwpProfile::Emulated,
            guest: GuestLwpSupport::Shim,
            sample_hz: DEFAULT_SAMPLE_HZ,
            trace: None,
            supervisor: SupervisorMode::Auto,
        }
    }
}

/// The pre-boot configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setup {
    /// `PUT /boot-source`.
    pub boot: Option<BootSource>,
    /// `/machine-config`.
    pub machine: MachineConfig,
    /// `PUT /drives/{id}`, in the order first put (the root goes first at
    /// start, as /dev/vda).
    pub drives: Vec<Drive>,
    /// `PUT /network-interfaces/{id}`.
    pub nets: Vec<NetworkInterface>,
    /// `PUT /vsock`.
    pub vsock: Option<Vsock>,
    /// `PUT /entropy`.
    pub entropy: Option<Entropy>,
    /// `PUT /logger`.
    pub logger: Option<Logger>,
    /// `PUT /metrics`.
    pub metrics: Option<Metrics>,
    /// `PUT /lwp`.
    pub lwp: LwpSetup,
    /// The `lwp` object as given, for `GET /vm/config`.
    pub lwp_body: Option<Lwp>,
    /// Where the host's network interfaces are listed
    /// ([`HOST_INTERFACES`]; a test's directory in tests).
    pub interfaces: PathBuf,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            boot: None,
            machine: MachineConfig {
                vcpu_count: 1,
                mem_size_mib: DEFAULT_MEMORY_MIB,
                smt: false,
                track_dirty_pages: false,
                huge_pages: "None",
            },
            drives: Vec::new(),
            nets: Vec::new(),
            vsock: None,
            entropy: None,
            logger: None,
            metrics: None,
            lwp: LwpSetup::default(),
            lwp_body: None,
            interfaces: PathBuf::from(HOST_INTERFACES),
        }
    }
}

/// Refuses a field that is set.
fn refuse<T>(value: &Option<T>, field: &'static str, why: &'static str) -> Result<(), SetupError> {
    match value {
        Some(_) => Err(SetupError::NotOffered { field, why }),
        None => Ok(()),
    }
}

const NO_RATE_LIMITERS: &str =
    "lwpvmm has no rate limiters; leave the field out (cgroups can bound the process's I/O)";

/// Checks that `path` names a regular file (`crate::hostfs::check_input`;
/// it is checked again when `InstanceStart` opens it).
fn regular_file(field: &'static str, path: &str) -> Result<(), SetupError> {
    crate::hostfs::check_input(Path::new(path))
        .map(drop)
        .map_err(|e| SetupError::File {
            field,
            path: path.to_owned(),
            why: match e {
                crate::hostfs::HostFsError::Io { source, .. } => source.to_string(),
                e => e.to_string(),
            },
        })
}

/// At most 32 characters of client text, for a message.
fn shown(text: &str) -> String {
    text.chars().take(32).collect()
}

/// Whether `name` can name a network interface, as Linux's
/// `dev_valid_name` has it (so it is one path component beneath
/// [`HOST_INTERFACES`], too).
fn interface_name(name: &str) -> bool {
    (1..16).contains(&name.len())
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace())
}

/// The most bytes of a sysfs attribute (a page; sysfs reports that size).
const SYSFS_ATTRIBUTE: u64 = 4096;

/// Checks that `name` is a tap on this host when it is PUT, as Firecracker
/// checks it then, rather than at the start: `interfaces` (/sys/class/net)
/// lists it, and its `tun_flags` say tap. Both read without privilege;
/// whether lwpvmm may open it (CAP_NET_ADMIN, or the tap's owner) only the
/// start tells. /sys/class/net shows the network namespace sysfs was
/// mounted in, which `ip netns exec` mounts for the one it enters. With no
/// such directory to look in (no sysfs), the start alone checks.
fn tap(interfaces: &Path, name: &str) -> Result<(), SetupError> {
    if !crate::hostfs::is_dir(interfaces) {
        return Ok(());
    }
    let refused = |why: String| SetupError::Tap {
        name: name.to_owned(),
        why,
    };
    let another = "name a tap instead (`ip tuntap add dev TAP mode tap` makes one)";
    let device = interfaces.join(name);
    if !crate::hostfs::is_dir(&device) {
        return Err(refused(format!(
            "no network interface of that name ({} lists this host's); create it first with `ip tuntap add dev {name} mode tap`",
            interfaces.display()
        )));
    }
    let flags = match crate::hostfs::read_input(
        &device.join("tun_flags"),
        SYSFS_ATTRIBUTE,
        "a sysfs attribute's size",
    ) {
        Ok(bytes) => bytes,
        Err(e) if e.is_missing() => {
            return Err(refused(format!(
                "a network interface, but not a tap (a tun/tap device has tun_flags); {another}"
            )));
        }
        // Unreadable flags do not say it is no tap: the start tells.
        Err(_) => return Ok(()),
    };
    let text = String::from_utf8_lossy(&flags);
    match u32::from_str_radix(text.trim().trim_start_matches("0x"), 16) {
        Ok(flags) if flags & IFF_TAP == 0 => Err(refused(format!(
            "a tun device (IP packets), not a tap (Ethernet frames); {another}"
        ))),
        _ => Ok(()),
    }
}

/// A MAC as `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(text: &str) -> Result<[u8; 6], SetupError> {
    let bad = || SetupError::Invalid {
        field: "guest_mac",
        why: format!("`{text}` is not a MAC address (give six hex bytes, e.g. 06:00:ac:10:00:02)"),
    };
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in &mut mac {
        let part = parts.next().ok_or_else(bad)?;
        if part.len() != 2 {
            return Err(bad());
        }
        *byte = u8::from_str_radix(part, 16).map_err(|_| bad())?;
    }
    if parts.next().is_some() {
        return Err(bad());
    }
    Ok(mac)
}

impl Setup {
    /// `PUT /boot-source`.
    pub fn boot_source(&mut self, boot: BootSource) -> Result<(), SetupError> {
        regular_file("kernel_image_path", &boot.kernel_image_path)?;
        if let Some(initrd) = &boot.initrd_path {
            regular_file("initrd_path", initrd)?;
        }
        self.boot = Some(boot);
        Ok(())
    }

    /// `PUT /machine-config` (`whole`: both counts required) or `PATCH`.
    pub fn machine_config(
        &mut self,
        body: MachineConfigBody,
        whole: bool,
    ) -> Result<(), SetupError> {
        if whole && (body.vcpu_count.is_none() || body.mem_size_mib.is_none()) {
            return Err(SetupError::Invalid {
                field: "machine-config",
                why: "PUT needs vcpu_count and mem_size_mib (PATCH changes some fields)".into(),
            });
        }
        if let Some(t) = body.cpu_template.as_deref()
            && t != "None"
        {
            return Err(SetupError::NotOffered {
                field: "cpu_template",
                why: "lwpvmm builds the CPUID table for the LWP profile itself (`lwpvmm cpuid` prints it); send \"None\" or leave it out",
            });
        }
        if let Some(h) = body.huge_pages.as_deref()
            && h != "None"
        {
            return Err(SetupError::NotOffered {
                field: "huge_pages",
                why: "guest memory is backed by 4 KiB pages; send \"None\" or leave it out",
            });
        }
        if body.smt == Some(true) {
            return Err(SetupError::NotOffered {
                field: "smt",
                why: "lwpvmm's vCPUs are one thread per core; send false or leave it out",
            });
        }
        let mut next = self.machine;
        if let Some(n) = body.vcpu_count {
            next.vcpu_count = match u8::try_from(n) {
                Ok(v) if (1..=MAX_VCPUS).contains(&n) => v,
                _ => {
                    return Err(SetupError::Invalid {
                        field: "vcpu_count",
                        why: format!("{n} is not between 1 and {MAX_VCPUS}"),
                    });
                }
            };
        }
        if let Some(m) = body.mem_size_mib {
            if m == 0 {
                return Err(SetupError::Invalid {
                    field: "mem_size_mib",
                    why: "0 MiB is no memory".into(),
                });
            }
            next.mem_size_mib = m;
        }
        if let Some(t) = body.track_dirty_pages {
            next.track_dirty_pages = t;
        }
        self.machine = next;
        Ok(())
    }

    /// `PUT /drives/{id}`: adds the drive, or replaces the one of that id.
    pub fn drive(&mut self, id: &str, drive: Drive) -> Result<(), SetupError> {
        if drive.drive_id != id {
            return Err(SetupError::IdMismatch {
                path: id.to_owned(),
                body: drive.drive_id,
            });
        }
        refuse(&drive.rate_limiter, "rate_limiter", NO_RATE_LIMITERS)?;
        refuse(
            &drive.socket,
            "socket",
            "lwpvmm has no vhost-user-block; give path_on_host, a raw image",
        )?;
        // lwpvmm's drives are Writeback (VIRTIO_BLK_F_FLUSH offered, a
        // flush answered after fdatasync), which keeps every promise Unsafe
        // makes, and Sync (I/O on the device thread), which serves what
        // Async would: each of the four is taken (README).
        if let Some(c) = drive.cache_type.as_deref()
            && c != "Unsafe"
            && c != "Writeback"
        {
            return Err(SetupError::Invalid {
                field: "cache_type",
                why: format!("`{}` is not Unsafe or Writeback", shown(c)),
            });
        }
        if let Some(e) = drive.io_engine.as_deref()
            && e != "Sync"
            && e != "Async"
        {
            return Err(SetupError::Invalid {
                field: "io_engine",
                why: format!("`{}` is not Sync or Async", shown(e)),
            });
        }
        let Some(path) = &drive.path_on_host else {
            return Err(SetupError::Invalid {
                field: "path_on_host",
                why: "a drive needs its raw image".into(),
            });
        };
        regular_file("path_on_host", path)?;
        if drive.is_root_device
            && let Some(root) = self
                .drives
                .iter()
                .find(|d| d.is_root_device && d.drive_id != id)
        {
            return Err(SetupError::SecondRoot(root.drive_id.clone()));
        }
        let full = self.drives.len() >= MAX_DEVICES;
        match self.drives.iter_mut().find(|d| d.drive_id == id) {
            Some(old) => *old = drive,
            None if full => return Err(SetupError::TooMany("drives")),
            None => self.drives.push(drive),
        }
        Ok(())
    }

    /// `PATCH /drives/{id}` after the start: the drive's index in boot
    /// order and its new file, checked.
    pub fn patch_drive(
        &self,
        id: &str,
        patch: &super::model::PartialDrive,
    ) -> Result<(usize, String), SetupError> {
        if patch.drive_id != id {
            return Err(SetupError::IdMismatch {
                path: id.to_owned(),
                body: patch.drive_id.clone(),
            });
        }
        refuse(&patch.rate_limiter, "rate_limiter", NO_RATE_LIMITERS)?;
        let index = self
            .ordered_drives()
            .iter()
            .position(|d| d.drive_id == id)
            .ok_or_else(|| SetupError::Invalid {
                field: "drive_id",
                why: format!(
                    "no drive `{}` was added before the start",
                    id.chars().take(64).collect::<String>()
                ),
            })?;
        let path = patch.path_on_host.clone().ok_or(SetupError::Invalid {
            field: "path_on_host",
            why: "give the drive's new image".into(),
        })?;
        regular_file("path_on_host", &path)?;
        Ok((index, path))
    }

    /// `PATCH /network-interfaces/{id}` after the start: it changes an
    /// interface's rate limiters, which lwpvmm has not; without one it
    /// changes nothing, as in Firecracker.
    pub fn patch_network(
        &self,
        id: &str,
        patch: &PartialNetworkInterface,
    ) -> Result<(), SetupError> {
        if patch.iface_id != id {
            return Err(SetupError::IdMismatch {
                path: id.to_owned(),
                body: patch.iface_id.clone(),
            });
        }
        refuse(&patch.rx_rate_limiter, "rx_rate_limiter", NO_RATE_LIMITERS)?;
        refuse(&patch.tx_rate_limiter, "tx_rate_limiter", NO_RATE_LIMITERS)?;
        if !self.nets.iter().any(|n| n.iface_id == id) {
            return Err(SetupError::Invalid {
                field: "iface_id",
                why: format!(
                    "no network interface `{}` was added before the start",
                    shown(id)
                ),
            });
        }
        Ok(())
    }

    /// `PUT /network-interfaces/{id}`.
    pub fn network(&mut self, id: &str, net: NetworkInterface) -> Result<(), SetupError> {
        if net.iface_id != id {
            return Err(SetupError::IdMismatch {
                path: id.to_owned(),
                body: net.iface_id,
            });
        }
        refuse(&net.rx_rate_limiter, "rx_rate_limiter", NO_RATE_LIMITERS)?;
        refuse(&net.tx_rate_limiter, "tx_rate_limiter", NO_RATE_LIMITERS)?;
        refuse(
            &net.mtu,
            "mtu",
            "lwpvmm's virtio-net does not offer VIRTIO_NET_F_MTU; set the MTU in the guest",
        )?;
        if !interface_name(&net.host_dev_name) {
            return Err(SetupError::Invalid {
                field: "host_dev_name",
                why: "a tap's name is 1 to 15 bytes, not `.` or `..`, without `/`, `:` or white space".into(),
            });
        }
        if let Some(mac) = &net.guest_mac {
            parse_mac(mac)?;
        }
        tap(&self.interfaces, &net.host_dev_name)?;
        let full = self.nets.len() >= MAX_DEVICES;
        match self.nets.iter_mut().find(|n| n.iface_id == id) {
            Some(old) => *old = net,
            None if full => {
                return Err(SetupError::TooMany("network interfaces"));
            }
            None => self.nets.push(net),
        }
        Ok(())
    }

    /// Checks the tap a load's `network_overrides` names as
    /// [`Self::network`] checks `host_dev_name`.
    pub fn check_override_tap(&self, name: &str) -> Result<(), SetupError> {
        if !interface_name(name) {
            return Err(SetupError::Invalid {
                field: "network_overrides host_dev_name",
                why: "a tap's name is 1 to 15 bytes, not `.` or `..`, without `/`, `:` or white space".into(),
            });
        }
        tap(&self.interfaces, name)
    }

    /// `PUT /entropy`: a virtio-rng device at the start (a second PUT
    /// replaces the first, as Firecracker's does).
    pub fn entropy(&mut self, entropy: Entropy) {
        self.entropy = Some(entropy);
    }

    /// `PUT /vsock`: the guest's context ID (3 or more: 0 to 2 are the
    /// hypervisor's, the local and the host's; `u32::MAX` is "any") and the
    /// host socket, bound at start.
    pub fn vsock(&mut self, vsock: Vsock) -> Result<(), SetupError> {
        if !(3..u64::from(u32::MAX)).contains(&vsock.guest_cid) {
            return Err(SetupError::Invalid {
                field: "guest_cid",
                why: format!(
                    "{} is not a guest's context ID (3 to 4294967294)",
                    vsock.guest_cid
                ),
            });
        }
        // The socket and its `_PORT` siblings must fit sun_path (108 bytes).
        if vsock.uds_path.is_empty() || vsock.uds_path.len() > 96 {
            return Err(SetupError::Invalid {
                field: "uds_path",
                why: "a Unix socket path of 1 to 96 bytes (its `_PORT` siblings must fit the 108 a socket address holds)".into(),
            });
        }
        if Path::new(&vsock.uds_path).symlink_metadata().is_ok() {
            return Err(SetupError::File {
                field: "uds_path",
                path: vsock.uds_path.clone(),
                why: "exists already: lwpvmm creates the socket at start; remove it, or give another path".into(),
            });
        }
        self.vsock = Some(vsock);
        Ok(())
    }

    /// Refuses what lwpvmm's logger cannot do (`PUT /logger`, the config
    /// file's `logger`).
    pub fn check_logger(logger: &Logger) -> Result<(), SetupError> {
        if logger.module.is_some() {
            return Err(SetupError::NotOffered {
                field: "module",
                why: "lwpvmm has one log level for every module; leave it out",
            });
        }
        if let Some(level) = &logger.level
            && !super::args::LEVELS.contains(&level.to_ascii_lowercase().as_str())
        {
            return Err(SetupError::Invalid {
                field: "level",
                why: format!(
                    "`{}` is not a level: give Error, Warning, Info, Debug, Trace or Off",
                    level.chars().take(32).collect::<String>()
                ),
            });
        }
        Ok(())
    }

    /// `PUT /metrics`.
    pub fn metrics(&mut self, metrics: Metrics) -> Result<(), SetupError> {
        refuse(
            &metrics.emit_id,
            "emit_id",
            "lwpvmm's metrics are one JSON object of its own counters; leave it out",
        )?;
        refuse(
            &metrics.properties,
            "properties",
            "lwpvmm's metrics carry no labels; leave it out",
        )?;
        if self.metrics.is_some() {
            return Err(SetupError::Invalid {
                field: "metrics",
                why: "the metrics are configured already (Firecracker allows it once)".into(),
            });
        }
        // Looked at now, as Firecracker opens it now; lwpvmm writes it
        // from the start on, each time under a fresh name renamed over it.
        let path = Path::new(&metrics.metrics_path);
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        if path.file_name().is_none() || crate::hostfs::is_dir(path) || !crate::hostfs::is_dir(dir)
        {
            return Err(SetupError::File {
                field: "metrics_path",
                path: metrics.metrics_path.clone(),
                why: "not a file in a directory that exists: name one there".into(),
            });
        }
        self.metrics = Some(metrics);
        Ok(())
    }

    /// `PUT /lwp`.
    pub fn lwp(&mut self, lwp: Lwp) -> Result<(), SetupError> {
        let mut next = LwpSetup::default();
        if let Some(p) = lwp.profile.as_deref() {
            next.profile = match p {
                "off" => LwpProfile::Off,
                "emulated" => LwpProfile::Emulated,
                "precise" => LwpProfile::Precise,
                "bulldozer" => LwpProfile::Bulldozer,
                other => {
                    return Err(SetupError::Invalid {
                        field: "profile",
                        why: format!(
                            "`{other}` is not an LWP profile: give off, emulated, precise or bulldozer"
                        ),
                    });
                }
            };
        }
        if let Some(g) = lwp.guest.as_deref() {
            next.guest = match g {
                "shim" => GuestLwpSupport::Shim,
                "stock" => GuestLwpSupport::Stock,
                other => {
                    return Err(SetupError::Invalid {
                        field: "guest",
                        why: format!("`{other}` is not shim or stock"),
                    });
                }
            };
        }
        if let Some(hz) = lwp.sample_hz {
            next.sample_hz = hz;
        }
        if let Some(s) = lwp.supervisor.as_deref() {
            next.supervisor = match s {
                "auto" => SupervisorMode::Auto,
                "native" => SupervisorMode::Native,
                "emulated" => SupervisorMode::Emulated,
                other => {
                    return Err(SetupError::Invalid {
                        field: "supervisor",
                        why: format!("`{other}` is not auto, native or emulated"),
                    });
                }
            };
        }
        next.trace = lwp.trace.as_ref().map(PathBuf::from);
        self.lwp = next;
        self.lwp_body = Some(lwp);
        Ok(())
    }

    /// Every part of a config file, in Firecracker's order.
    pub fn from_file(config: FullConfig) -> Result<Setup, SetupError> {
        refuse_features(&config)?;
        let mut setup = Setup::default();
        if let Some(m) = config.machine_config {
            setup.machine_config(m, true)?;
        }
        if let Some(b) = config.boot_source {
            setup.boot_source(b)?;
        }
        for d in config.drives {
            let id = d.drive_id.clone();
            setup.drive(&id, d)?;
        }
        for n in config.network_interfaces {
            let id = n.iface_id.clone();
            setup.network(&id, n)?;
        }
        if let Some(v) = config.vsock {
            setup.vsock(v)?;
        }
        if let Some(e) = config.entropy {
            setup.entropy(e);
        }
        if let Some(m) = config.metrics {
            setup.metrics(m)?;
        }
        if let Some(l) = config.lwp {
            setup.lwp(l)?;
        }
        if let Some(l) = &config.logger {
            Self::check_logger(l)?;
        }
        setup.logger = config.logger;
        Ok(setup)
    }

    /// `GET /vm/config`.
    pub fn full(&self) -> FullConfig {
        FullConfig {
            boot_source: self.boot.clone(),
            drives: self.drives.clone(),
            machine_config: Some(MachineConfigBody {
                vcpu_count: Some(self.machine.vcpu_count.into()),
                mem_size_mib: Some(self.machine.mem_size_mib),
                smt: Some(false),
                track_dirty_pages: Some(self.machine.track_dirty_pages),
                cpu_template: None,
                huge_pages: Some("None".into()),
            }),
            network_interfaces: self.nets.clone(),
            vsock: self.vsock.clone(),
            entropy: self.entropy,
            logger: self.logger.clone(),
            metrics: self.metrics.clone(),
            lwp: self.lwp_body.clone(),
            ..FullConfig::default()
        }
    }

    /// The drives in boot order: the root first (/dev/vda), then the rest
    /// in the order they were put.
    pub fn ordered_drives(&self) -> Vec<&Drive> {
        let mut drives: Vec<&Drive> = self.drives.iter().filter(|d| d.is_root_device).collect();
        drives.extend(self.drives.iter().filter(|d| !d.is_root_device));
        drives
    }

    /// The kernel command line: `boot_args` (or lwpvmm's default for the
    /// kernel, `default`), and for a root drive `root=` and `ro`/`rw` as
    /// Firecracker adds them.
    pub fn cmdline(&self, default: impl FnOnce() -> String) -> Result<String, SetupError> {
        let boot = self.boot.as_ref().ok_or(SetupError::NoKernel)?;
        let mut line = boot.boot_args.clone().unwrap_or_else(default);
        if let Some(root) = self.drives.iter().find(|d| d.is_root_device) {
            match &root.partuuid {
                Some(uuid) => line.push_str(&format!(" root=PARTUUID={uuid}")),
                None => line.push_str(" root=/dev/vda"),
            }
            line.push_str(if root.is_read_only { " ro" } else { " rw" });
        }
        Ok(line)
    }
}

/// Refuses what a config file names that lwpvmm does not offer.
pub fn refuse_features(config: &FullConfig) -> Result<(), SetupError> {
    for (value, field, why) in [
        (
            &config.balloon,
            "balloon",
            "lwpvmm has no balloon device; size mem_size_mib for the guest",
        ),
        (
            &config.mmds_config,
            "mmds-config",
            "lwpvmm has no metadata service (MMDS); pass data on the kernel command line or a drive",
        ),
        (
            &config.cpu_config,
            "cpu-config",
            "lwpvmm builds the CPUID table for the LWP profile itself (`lwpvmm cpuid` prints it)",
        ),
        (
            &config.pmem,
            "pmem",
            "lwpvmm has no virtio-pmem device; give the image as a drive",
        ),
        (
            &config.memory_hotplug,
            "memory-hotplug",
            "lwpvmm has no virtio-mem device; size mem_size_mib for the guest",
        ),
    ] {
        refuse(value, field, why)?;
    }
    Ok(())
}

#[cfg(test)]
#[path = "setup_tests.rs"]
mod tests;
