//! What the virtio devices are made of and fail with, below the transport
//! and the devices that use it: the configuration a user gives (a disk, a
//! tap), the spec a snapshot records, the MMIO windows and interrupt lines,
//! and the errors of setup and of a device's request path.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::vsock::error::VsockError;
use crate::hostfs::HostFsError;
use crate::vmm::base::control_error::Fault;

/// The first device's register window; the others follow.
pub const MMIO_BASE: u64 = 0xd000_0000;
/// Each device's window.
pub const WINDOW: u64 = 0x1000;
/// The interrupt lines devices get, in order: ISA lines no other device of
/// the machine uses (0 and 2 the timer, 4 the serial port, 8 the RTC, 9 the
/// ACPI SCI, 13 the FPU) and that Linux maps without ACPI's help.
pub const GSIS: [u32; 8] = [5, 6, 7, 10, 11, 12, 14, 15];
/// How many virtio devices a VM can have.
pub const MAX_DEVICES: usize = GSIS.len();

/// A disk to attach (`--disk PATH[,ro]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskConfig {
    /// The raw image.
    pub path: PathBuf,
    /// Attach it read-only: the guest's writes fail with VIRTIO_BLK_S_IOERR.
    pub read_only: bool,
}

/// A network device to attach (`--net tap=NAME[,mac=MAC]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetConfig {
    /// The front end's name for the interface (Firecracker's `iface_id`),
    /// which a snapshot keeps so that a load can give it another tap.
    pub id: Option<String>,
    /// The host tap's name.
    pub tap: String,
    /// The guest's MAC; without one, 02:4c:57:50:00:NN (locally administered,
    /// NN the device's index).
    pub mac: Option<[u8; 6]>,
}

/// What a restore changes of a snapshot's devices, so that many clones of
/// one snapshot run side by side (Firecracker's `network_overrides` and
/// `vsock_override`): each gets taps and a vsock socket of its own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceOverrides {
    /// (interface id, the tap it opens instead of the snapshot's).
    pub taps: Vec<(String, String)>,
    /// The socket the vsock device binds instead of the snapshot's.
    pub vsock_uds_path: Option<PathBuf>,
}

impl DeviceOverrides {
    /// Checks every override against the snapshot's devices `saved`: each
    /// interface is one of them, and a vsock override has a vsock device.
    pub fn check(&self, saved: &[DeviceSpec]) -> Result<(), VirtioError> {
        let ids: Vec<&str> = saved
            .iter()
            .filter_map(|s| match s {
                DeviceSpec::Net { id: Some(id), .. } => Some(id.as_str()),
                _ => None,
            })
            .collect();
        if let Some((iface_id, _)) = self.taps.iter().find(|(i, _)| !ids.contains(&i.as_str())) {
            return Err(VirtioError::NoSuchInterface {
                iface_id: iface_id.clone(),
                known: if ids.is_empty() {
                    "none".into()
                } else {
                    ids.join(", ")
                },
            });
        }
        let has_vsock = saved.iter().any(|s| matches!(s, DeviceSpec::Vsock { .. }));
        if self.vsock_uds_path.is_some() && !has_vsock {
            return Err(VirtioError::NoVsockToOverride);
        }
        Ok(())
    }

    /// The tap the interface `id` opens: its override's, else `saved`.
    pub fn tap<'a>(&'a self, id: Option<&str>, saved: &'a str) -> &'a str {
        self.taps
            .iter()
            .find(|(i, _)| Some(i.as_str()) == id)
            .map_or(saved, |(_, tap)| tap.as_str())
    }
}

/// What a device was built from: what a snapshot records and a restore
/// checks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeviceSpec {
    /// A disk image.
    Block {
        /// Its path.
        path: PathBuf,
        /// Its length in bytes when attached.
        bytes: u64,
        /// Attached read-only.
        read_only: bool,
    },
    /// A network device.
    Net {
        /// The tap.
        tap: String,
        /// The guest's MAC.
        mac: [u8; 6],
        /// [`NetConfig::id`] (absent from snapshots of older lwpvmm).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
    },
    /// An entropy device.
    Rng {
        /// Its rate limit, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rate_limit: Option<super::rate_limiter::RateLimit>,
    },
    /// A vsock device.
    Vsock {
        /// The guest's context ID.
        cid: u64,
        /// The host socket.
        uds_path: PathBuf,
    },
}

/// What can go wrong in a device's request path: the device then needs a
/// reset by the guest.
#[derive(Debug, Error)]
pub enum DeviceError {
    /// The queue refused an operation (an avail index beyond the queue's
    /// size, a ring outside guest RAM).
    #[error("queue: {0:?}")]
    Queue(virtio_queue::Error),
    /// A queue the device does not have.
    #[error("no queue {0}")]
    NoQueue(usize),
    /// The available ring says chains are waiting, yet none can be read
    /// (its index runs past the queue, or a ring entry is out of RAM).
    #[error("the available ring announces chains that cannot be read")]
    Stalled,
}

impl From<virtio_queue::Error> for DeviceError {
    fn from(e: virtio_queue::Error) -> Self {
        DeviceError::Queue(e)
    }
}

/// Why the devices could not be set up.
#[derive(Debug, Error)]
pub enum VirtioError {
    /// A disk image could not be opened.
    #[error(
        "cannot open the disk image {0} (give an existing raw image file; add `,ro` to attach a file you may only read)"
    )]
    Disk(HostFsError),
    /// A disk image is not a whole number of sectors, or empty.
    #[error(
        "the disk image {path} is {bytes} bytes: a raw image is a non-zero multiple of 512 bytes"
    )]
    DiskSize {
        /// The image.
        path: PathBuf,
        /// Its length.
        bytes: u64,
    },
    /// A tap could not be opened.
    #[error(
        "cannot open the tap `{tap}` through /dev/net/tun: {source} (create it first with `ip tuntap add dev {tap} mode tap`; lwpvmm needs CAP_NET_ADMIN or to own the tap)"
    )]
    Tap {
        /// The tap's name.
        tap: String,
        /// Why.
        source: std::io::Error,
    },
    /// More devices than interrupt lines.
    #[error("{0} virtio devices requested; lwpvmm offers at most {MAX_DEVICES}")]
    TooMany(usize),
    /// KVM refused an irqfd or ioeventfd.
    #[error("{what}: {source}")]
    Kvm {
        /// Which call.
        what: &'static str,
        /// Why.
        source: kvm_ioctls::Error,
    },
    /// An eventfd could not be made.
    #[error("cannot create an eventfd for a device: {0}")]
    EventFd(std::io::Error),
    /// A queue could not be made.
    #[error("cannot create a virtio queue: {0}")]
    Queue(String),
    /// A snapshot's device state does not fit.
    #[error("the snapshot's devices: {0}")]
    Snapshot(String),
    /// A load's override names a network interface the snapshot lacks.
    #[error(
        "network_overrides names the interface `{iface_id}`, which the snapshot has not (its interfaces: {known}); give the iface_id of a network interface the snapshotted VM had"
    )]
    NoSuchInterface {
        /// The override's interface.
        iface_id: String,
        /// The snapshot's interfaces, comma-separated (or "none").
        known: String,
    },
    /// A load's vsock override for a snapshot without a vsock device.
    #[error("vsock_override given, but the snapshot has no vsock device to bind it")]
    NoVsockToOverride,
    /// The vsock device's socket could not be made.
    #[error("vsock: {0}")]
    Vsock(#[from] VsockError),
    /// The device thread could not be started.
    #[error("cannot start the virtio devices thread: {0}")]
    Thread(std::io::Error),
    /// The device thread panicked.
    #[error("the virtio devices thread panicked")]
    Panicked,
}

impl VirtioError {
    /// Whose fault it was: an image, a device count or a snapshot's devices
    /// the caller asked for, or the host (a tap that would not open, KVM,
    /// descriptors, the device thread).
    pub fn fault(&self) -> Fault {
        match self {
            VirtioError::Disk(_)
            | VirtioError::DiskSize { .. }
            | VirtioError::TooMany(_)
            | VirtioError::Snapshot(_)
            | VirtioError::NoSuchInterface { .. }
            | VirtioError::NoVsockToOverride => Fault::Request,
            VirtioError::Vsock(e) => e.fault(),
            VirtioError::Tap { .. }
            | VirtioError::Kvm { .. }
            | VirtioError::EventFd(_)
            | VirtioError::Queue(_)
            | VirtioError::Thread(_)
            | VirtioError::Panicked => Fault::Host,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_name_the_snapshots_devices() {
        let net = |id: Option<&str>, tap: &str| DeviceSpec::Net {
            tap: tap.into(),
            mac: [2, 0, 0, 0, 0, 1],
            id: id.map(Into::into),
        };
        let vsock = DeviceSpec::Vsock {
            cid: 3,
            uds_path: "/tmp/v.sock".into(),
        };
        let saved = [net(Some("eth0"), "tap0"), net(None, "tap1"), vsock];
        let taps = |t: &[(&str, &str)]| {
            t.iter()
                .map(|(i, n)| ((*i).to_owned(), (*n).to_owned()))
                .collect::<Vec<_>>()
        };
        // (what, overrides, devices, error)
        let table: [(&str, DeviceOverrides, &[DeviceSpec], Option<&str>); 5] = [
            ("none", DeviceOverrides::default(), &saved, None),
            (
                "an interface and the socket",
                DeviceOverrides {
                    taps: taps(&[("eth0", "clone1")]),
                    vsock_uds_path: Some("/tmp/c.sock".into()),
                },
                &saved,
                None,
            ),
            (
                "an interface the snapshot lacks",
                DeviceOverrides {
                    taps: taps(&[("eth1", "clone1")]),
                    vsock_uds_path: None,
                },
                &saved,
                Some("`eth1`, which the snapshot has not (its interfaces: eth0)"),
            ),
            (
                "a snapshot without interface ids",
                DeviceOverrides {
                    taps: taps(&[("eth0", "clone1")]),
                    vsock_uds_path: None,
                },
                &saved[1..2],
                Some("(its interfaces: none)"),
            ),
            (
                "a socket without a vsock device",
                DeviceOverrides {
                    taps: Vec::new(),
                    vsock_uds_path: Some("/tmp/c.sock".into()),
                },
                &saved[..2],
                Some("no vsock device"),
            ),
        ];
        for (what, overrides, devices, error) in table {
            let got = overrides.check(devices).err().map(|e| e.to_string());
            match (got, error) {
                (None, None) => {}
                (Some(got), Some(want)) => assert!(got.contains(want), "{what}: {got}"),
                (got, want) => panic!("{what}: {got:?}, want {want:?}"),
            }
        }
        let o = DeviceOverrides {
            taps: taps(&[("eth0", "clone1")]),
            vsock_uds_path: None,
        };
        assert_eq!(o.tap(Some("eth0"), "tap0"), "clone1");
        assert_eq!(o.tap(None, "tap1"), "tap1");
        assert_eq!(o.tap(Some("eth9"), "tap2"), "tap2");
    }
}
