//! virtio devices over MMIO, the transport Firecracker gives microVMs: raw
//! disk images as virtio block devices and host taps as virtio network
//! devices. Each device has a 4 KiB register window in the MMIO hole, an
//! interrupt line (an irqfd on a GSI, which KVM delivers by the MSI route
//! the guest programmed into the IOAPIC, ioapic.rs) and one ioeventfd per
//! queue on its QueueNotify register, so a notification never leaves KVM
//! for a vCPU thread: the device thread (`worker`) takes it, under its own
//! seccomp filter. The guest learns of the devices from the kernel command
//! line (`virtio_mmio.device=4K@ADDR:IRQ`, which any Linux with
//! CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES reads), not from ACPI: docs/design.md
//! says why.
//!
//! Everything a device reads from the guest (queue addresses, descriptor
//! chains, lengths) is hostile: queues and chains come from the
//! `virtio-queue` crate, whose accessors check every address against guest
//! RAM and bound every chain by the queue's size, and a request the device
//! cannot make sense of ends in a status or a device error, never a panic.

pub mod block;
pub mod drain;
pub mod mmio;
pub mod net;
pub mod worker;

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use kvm_ioctls::{IoEventAddress, VmFd};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use self::block::Block;
use self::mmio::{MmioTransport, REG_QUEUE_NOTIFY, TransportState, VirtioDevice};
use self::net::Net;
use crate::guard::GuestMemory;
use crate::vmm::base::metrics::VcpuMetrics;

/// The first device's register window; the others follow.
pub const MMIO_BASE: u64 = 0xd000_0000;
/// Each device's window.
pub const WINDOW: u64 = 0x1000;
/// The interrupt lines devices get, in order: ISA lines no other device of
/// the machine uses (0 and 2 the timer, 4 the serial port, 8 the RTC, 9 the
/// ACPI SCI, 13 the FPU) and that Linux maps without ACPI's help.
const GSIS: [u32; 8] = [5, 6, 7, 10, 11, 12, 14, 15];
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
}

/// One device in a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSnapshot {
    /// What it is.
    pub spec: DeviceSpec,
    /// Its transport registers and queues.
    pub transport: TransportState,
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
        "cannot open the disk image {path}: {source} (give an existing raw image file; add `,ro` to attach a file you may only read)"
    )]
    Disk {
        /// The image.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
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
}

/// A device on the bus.
pub struct Slot {
    /// Its register window's start.
    pub base: u64,
    /// Its interrupt line.
    pub gsi: u32,
    /// The device behind its transport.
    pub transport: Arc<Mutex<MmioTransport>>,
    /// Its queues' ioeventfds, which the device thread polls.
    pub notify: Vec<EventFd>,
    /// Its own counters (reads, writes, frames, errors).
    pub metrics: Arc<VcpuMetrics>,
}

/// The virtio devices of a VM.
#[derive(Default)]
pub struct VirtioBus {
    slots: Vec<Slot>,
}

fn eventfd() -> Result<EventFd, VirtioError> {
    EventFd::new(EFD_NONBLOCK).map_err(VirtioError::EventFd)
}

/// Opens a disk image and builds its device.
fn open_disk(
    path: &Path,
    read_only: bool,
    metrics: Arc<VcpuMetrics>,
) -> Result<Block, VirtioError> {
    let file = OpenOptions::new()
        .read(true)
        .write(!read_only)
        .open(path)
        .map_err(|source| VirtioError::Disk {
            path: path.to_owned(),
            source,
        })?;
    let bytes = file
        .metadata()
        .map_err(|source| VirtioError::Disk {
            path: path.to_owned(),
            source,
        })?
        .len();
    if bytes == 0 || bytes % block::SECTOR != 0 {
        return Err(VirtioError::DiskSize {
            path: path.to_owned(),
            bytes,
        });
    }
    Ok(Block::new(
        Box::new(file),
        path.to_owned(),
        bytes,
        read_only,
        metrics,
    ))
}

/// Opens a tap and builds its device.
fn open_net(tap: &str, mac: [u8; 6], metrics: Arc<VcpuMetrics>) -> Result<Net, VirtioError> {
    // TUNSETIFF would create a tap of that name, unconnected and gone at
    // exit, where a name is mistyped: lwpvmm only opens existing taps.
    if nix::net::if_::if_nametoindex(tap).is_err() {
        return Err(VirtioError::Tap {
            tap: tap.to_owned(),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no network interface of that name in this network namespace",
            ),
        });
    }
    let iface = net::open_tap(tap).map_err(|source| VirtioError::Tap {
        tap: tap.to_owned(),
        source,
    })?;
    Ok(Net::new(Box::new(iface), tap.to_owned(), mac, metrics))
}

/// The default MAC of the `index`th device.
fn default_mac(index: usize) -> [u8; 6] {
    [0x02, 0x4c, 0x57, 0x50, 0x00, index as u8]
}

impl VirtioBus {
    /// Opens the disks, then the taps, and wires each device into `vm`:
    /// disks first, in order (so the first `--disk` is /dev/vda), then the
    /// network devices. Each device counts into counters of its own
    /// ([`Self::metrics`]).
    pub fn create(
        vm: &VmFd,
        disks: &[DiskConfig],
        nets: &[NetConfig],
    ) -> Result<Self, VirtioError> {
        let count = disks.len() + nets.len();
        if count > MAX_DEVICES {
            return Err(VirtioError::TooMany(count));
        }
        let mut devices: Vec<(Box<dyn VirtioDevice>, Arc<VcpuMetrics>)> = Vec::new();
        for d in disks {
            let m = Arc::<VcpuMetrics>::default();
            devices.push((
                Box::new(open_disk(&d.path, d.read_only, Arc::clone(&m))?),
                m,
            ));
        }
        for (i, n) in nets.iter().enumerate() {
            let mac = n.mac.unwrap_or_else(|| default_mac(disks.len() + i));
            let m = Arc::<VcpuMetrics>::default();
            devices.push((Box::new(open_net(&n.tap, mac, Arc::clone(&m))?), m));
        }
        let mut bus = VirtioBus::default();
        for (device, metrics) in devices {
            bus.attach(vm, device, metrics, |device, irq, notify| {
                MmioTransport::new(device, irq, notify)
            })?;
        }
        Ok(bus)
    }

    /// Re-opens the devices of a snapshot, checks each against what it was
    /// (the image's length and mode, the tap's name), and restores their
    /// registers and queues.
    pub fn restore(
        vm: &VmFd,
        saved: &[DeviceSnapshot],
        mem: &GuestMemory,
    ) -> Result<Self, VirtioError> {
        if saved.len() > MAX_DEVICES {
            return Err(VirtioError::TooMany(saved.len()));
        }
        let mut bus = VirtioBus::default();
        for s in saved {
            let metrics = Arc::<VcpuMetrics>::default();
            let device: Box<dyn VirtioDevice> = match &s.spec {
                DeviceSpec::Block {
                    path,
                    bytes,
                    read_only,
                } => {
                    let disk = open_disk(path, *read_only, Arc::clone(&metrics))?;
                    if disk.spec() != s.spec {
                        return Err(VirtioError::Snapshot(format!(
                            "the disk {} was {bytes} bytes when the snapshot was taken and is {} now",
                            path.display(),
                            match disk.spec() {
                                DeviceSpec::Block { bytes, .. } => bytes,
                                DeviceSpec::Net { .. } => 0,
                            }
                        )));
                    }
                    Box::new(disk)
                }
                DeviceSpec::Net { tap, mac } => {
                    Box::new(open_net(tap, *mac, Arc::clone(&metrics))?)
                }
            };
            bus.attach(vm, device, metrics, |device, irq, notify| {
                MmioTransport::restore(device, irq, notify, &s.transport, mem)
            })?;
        }
        Ok(bus)
    }

    /// Gives `device` the next window and line, its irqfd and ioeventfds.
    fn attach(
        &mut self,
        vm: &VmFd,
        device: Box<dyn VirtioDevice>,
        metrics: Arc<VcpuMetrics>,
        transport: impl FnOnce(
            Box<dyn VirtioDevice>,
            EventFd,
            Vec<EventFd>,
        ) -> Result<MmioTransport, VirtioError>,
    ) -> Result<(), VirtioError> {
        let index = self.slots.len();
        let base = MMIO_BASE + WINDOW * index as u64;
        let gsi = GSIS[index];
        let irq = eventfd()?;
        vm.register_irqfd(&irq, gsi)
            .map_err(|source| VirtioError::Kvm {
                what: "KVM_IRQFD for a virtio device",
                source,
            })?;
        let mut notify = Vec::new();
        let mut theirs = Vec::new();
        for q in 0..device.queue_max_sizes().len() {
            let fd = eventfd()?;
            vm.register_ioevent(
                &fd,
                &IoEventAddress::Mmio(base + REG_QUEUE_NOTIFY),
                q as u32,
            )
            .map_err(|source| VirtioError::Kvm {
                what: "KVM_IOEVENTFD for a virtio queue",
                source,
            })?;
            theirs.push(fd.try_clone().map_err(VirtioError::EventFd)?);
            notify.push(fd);
        }
        let transport = transport(device, irq, theirs)?;
        self.slots.push(Slot {
            base,
            gsi,
            transport: Arc::new(Mutex::new(transport)),
            notify,
            metrics,
        });
        Ok(())
    }

    /// The devices.
    pub fn slots(&self) -> &[Slot] {
        &self.slots
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// What the kernel command line needs to find the devices.
    pub fn cmdline(&self) -> String {
        self.slots
            .iter()
            .map(|s| format!("virtio_mmio.device=4K@{:#x}:{}", s.base, s.gsi))
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn slot(&self, addr: u64) -> Option<(&Slot, u64)> {
        let index = usize::try_from(addr.checked_sub(MMIO_BASE)? / WINDOW).ok()?;
        let slot = self.slots.get(index)?;
        Some((slot, addr - slot.base))
    }

    /// A vCPU's MMIO read; false when no device is there.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.slot(addr) {
            Some((slot, offset)) => {
                match slot.transport.lock() {
                    Ok(t) => t.read(offset, data),
                    Err(_) => data.fill(0xff),
                }
                true
            }
            None => false,
        }
    }

    /// A vCPU's MMIO write; false when no device is there.
    pub fn write(&self, addr: u64, data: &[u8], mem: &GuestMemory) -> bool {
        match self.slot(addr) {
            Some((slot, offset)) => {
                if let Ok(mut t) = slot.transport.lock() {
                    t.write(offset, data, mem);
                }
                true
            }
            None => false,
        }
    }

    /// Every device's state, for a snapshot (the device thread is paused).
    /// Each device's counters, in slot order.
    pub fn metrics(&self) -> Vec<Arc<VcpuMetrics>> {
        self.slots.iter().map(|s| Arc::clone(&s.metrics)).collect()
    }

    pub fn snapshot(&self) -> Result<Vec<DeviceSnapshot>, crate::vmm::base::control_error::ControlError> {
        self.slots
            .iter()
            .map(|s| {
                let t = s.transport.lock().map_err(|_| {
                    crate::vmm::base::control_error::ControlError::host(
                        "a virtio device",
                        "its lock is poisoned",
                    )
                })?;
                Ok(DeviceSnapshot {
                    spec: t.device().spec(),
                    transport: t.state(),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_are_named_on_the_command_line_in_order() {
        let kvm = kvm_ioctls::Kvm::new().expect("these tests need /dev/kvm");
        let vm = kvm.create_vm().unwrap();
        vm.create_irq_chip().unwrap();
        let dir = std::env::temp_dir().join(format!("lwpvmm-virtio-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a.img"), dir.join("b.img"));
        std::fs::write(&a, vec![0u8; 4096]).unwrap();
        std::fs::write(&b, vec![0u8; 512]).unwrap();
        let disks = [
            DiskConfig {
                path: a.clone(),
                read_only: false,
            },
            DiskConfig {
                path: b,
                read_only: true,
            },
        ];
        let bus = VirtioBus::create(&vm, &disks, &[]).unwrap();
        assert_eq!(
            bus.cmdline(),
            "virtio_mmio.device=4K@0xd0000000:5 virtio_mmio.device=4K@0xd0001000:6"
        );
        let mem = GuestMemory::from_ranges(&[(vm_memory::GuestAddress(0), 1 << 20)]).unwrap();
        let mut magic = [0u8; 4];
        // (address, claimed)
        let table = [
            (MMIO_BASE, true),
            (MMIO_BASE + WINDOW + 0x100, true),
            (MMIO_BASE + 2 * WINDOW, false),
            (MMIO_BASE - 4, false),
            (u64::MAX, false),
        ];
        for (addr, claimed) in table {
            assert_eq!(bus.read(addr, &mut magic), claimed, "{addr:#x}");
            assert_eq!(bus.write(addr, &[0; 4], &mem), claimed, "{addr:#x}");
        }
        bus.read(MMIO_BASE, &mut magic);
        assert_eq!(&magic, b"virt");
        // (image, error)
        std::fs::write(dir.join("odd.img"), vec![0u8; 100]).unwrap();
        let bad = [
            (dir.join("missing.img"), "cannot open the disk image"),
            (dir.join("odd.img"), "non-zero multiple of 512"),
        ];
        for (path, message) in bad {
            let disk = DiskConfig {
                path,
                read_only: false,
            };
            let err = VirtioBus::create(&vm, &[disk], &[]).err().unwrap();
            assert!(err.to_string().contains(message), "{err}");
        }
        // A snapshot's devices restore on a new VM; an image whose length
        // changed since is refused, naming both lengths.
        let saved = bus.snapshot().unwrap();
        let other = kvm.create_vm().unwrap();
        other.create_irq_chip().unwrap();
        let back = VirtioBus::restore(&other, &saved, &mem).unwrap();
        assert_eq!(back.snapshot().unwrap(), saved);
        std::fs::write(&a, vec![0u8; 8192]).unwrap();
        let third = kvm.create_vm().unwrap();
        third.create_irq_chip().unwrap();
        let err = VirtioBus::restore(&third, &saved, &mem).err().unwrap();
        assert!(err.to_string().contains("was 4096 bytes"), "{err}");
        assert!(err.to_string().contains("8192 now"), "{err}");
        let many = vec![disks[0].clone(); MAX_DEVICES + 1];
        assert!(matches!(
            VirtioBus::create(&vm, &many, &[]),
            Err(VirtioError::TooMany(9))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
