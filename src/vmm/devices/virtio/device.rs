//! What the virtio devices are made of and fail with, below the transport
//! and the devices that use it: the configuration a user gives (a disk, a
//! tap), the spec a snapshot records, the MMIO windows and interrupt lines,
//! and the errors of setup and of a device's request path.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::hostfs::HostFsError;

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
    /// The host tap's name.
    pub tap: String,
    /// The guest's MAC; without one, 02:4c:57:50:00:NN (locally administered,
    /// NN the device's index).
    pub mac: Option<[u8; 6]>,
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
    /// The vsock device's socket could not be made.
    #[error("vsock: {0}")]
    Vsock(#[from] super::vsock::muxer::MuxerError),
    /// The device thread could not be started.
    #[error("cannot start the virtio devices thread: {0}")]
    Thread(std::io::Error),
    /// The device thread panicked.
    #[error("the virtio devices thread panicked")]
    Panicked,
}
