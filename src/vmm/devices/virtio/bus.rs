//! The virtio devices of a VM: each in its slot (its register window, its
//! interrupt line, its queues' ioeventfds, its own counters), built from
//! the user's configuration or from a snapshot's, and the MMIO exits of the
//! vCPUs routed to the slot whose window they hit.

use std::path::Path;
use std::sync::{Arc, Mutex};

use kvm_ioctls::{IoEventAddress, VmFd};
use serde::{Deserialize, Serialize};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::block::{self, Block};
use super::device::{
    DeviceOverrides, DeviceSpec, DiskConfig, GSIS, MAX_DEVICES, MMIO_BASE, NetConfig, VirtioError,
    WINDOW,
};
use super::mmio::{MmioTransport, REG_QUEUE_NOTIFY, TransportState, VirtioDevice};
use super::net::{self, Net};
use super::rng::{EntropyConfig, Rng};
use super::vsock::{Vsock, VsockConfig};
use crate::guard::GuestMemory;
use crate::hostfs::{self, Access};
use crate::vmm::base::metrics::DeviceMetrics;
use crate::vmm::devices::acpi::MmioDevice;

/// One device in a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSnapshot {
    /// What it is.
    pub spec: DeviceSpec,
    /// Its transport registers and queues.
    pub transport: TransportState,
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
    pub metrics: Arc<DeviceMetrics>,
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
    metrics: Arc<DeviceMetrics>,
) -> Result<Block, VirtioError> {
    let access = if read_only {
        Access::Read
    } else {
        Access::ReadWrite
    };
    let image = hostfs::open_image(path, access).map_err(VirtioError::Disk)?;
    let bytes = image.size();
    let file = image.into_file();
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

/// Opens a tap and builds its device, the interface `id`.
fn open_net(
    tap: &str,
    id: Option<String>,
    mac: [u8; 6],
    metrics: Arc<DeviceMetrics>,
) -> Result<Net, VirtioError> {
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
    Ok(Net::new(Box::new(iface), tap.to_owned(), id, mac, metrics))
}

/// The default MAC of the `index`th device.
fn default_mac(index: usize) -> [u8; 6] {
    [0x02, 0x4c, 0x57, 0x50, 0x00, index as u8]
}

impl VirtioBus {
    /// Opens the disks, then the taps, and wires each device into `vm`:
    /// disks first, in order (so the first `--disk` is /dev/vda), then the
    /// network devices, the vsock device and the entropy device. Each
    /// device counts into counters of its own ([`Self::metrics`]).
    pub fn create(
        vm: &VmFd,
        disks: &[DiskConfig],
        nets: &[NetConfig],
        vsock: Option<&VsockConfig>,
        entropy: Option<&EntropyConfig>,
    ) -> Result<Self, VirtioError> {
        let count = disks.len()
            + nets.len()
            + usize::from(vsock.is_some())
            + usize::from(entropy.is_some());
        if count > MAX_DEVICES {
            return Err(VirtioError::TooMany(count));
        }
        let mut devices: Vec<(Box<dyn VirtioDevice>, Arc<DeviceMetrics>)> = Vec::new();
        for d in disks {
            let m = Arc::<DeviceMetrics>::default();
            devices.push((
                Box::new(open_disk(&d.path, d.read_only, Arc::clone(&m))?),
                m,
            ));
        }
        for (i, n) in nets.iter().enumerate() {
            let mac = n.mac.unwrap_or_else(|| default_mac(disks.len() + i));
            let m = Arc::<DeviceMetrics>::default();
            devices.push((
                Box::new(open_net(&n.tap, n.id.clone(), mac, Arc::clone(&m))?),
                m,
            ));
        }
        if let Some(v) = vsock {
            let m = Arc::<DeviceMetrics>::default();
            devices.push((Box::new(Vsock::new(v, Arc::clone(&m))?), m));
        }
        if let Some(e) = entropy {
            let m = Arc::<DeviceMetrics>::default();
            devices.push((Box::new(Rng::new(e, Arc::clone(&m))?), m));
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
    /// (the image's length and mode), and restores their registers and
    /// queues; a tap or the vsock socket comes from `overrides` where it
    /// names one, and the device's spec says so from then on (a snapshot of
    /// the clone records its own).
    pub fn restore(
        vm: &VmFd,
        saved: &[DeviceSnapshot],
        mem: &GuestMemory,
        overrides: &DeviceOverrides,
    ) -> Result<Self, VirtioError> {
        if saved.len() > MAX_DEVICES {
            return Err(VirtioError::TooMany(saved.len()));
        }
        let specs: Vec<DeviceSpec> = saved.iter().map(|s| s.spec.clone()).collect();
        overrides.check(&specs)?;
        let mut bus = VirtioBus::default();
        for s in saved {
            let metrics = Arc::<DeviceMetrics>::default();
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
                                DeviceSpec::Net { .. }
                                | DeviceSpec::Vsock { .. }
                                | DeviceSpec::Rng { .. } => 0,
                            }
                        )));
                    }
                    Box::new(disk)
                }
                DeviceSpec::Net { tap, mac, id } => Box::new(open_net(
                    overrides.tap(id.as_deref(), tap),
                    id.clone(),
                    *mac,
                    Arc::clone(&metrics),
                )?),
                // Connections do not survive: the guest gets a transport
                // reset, and the socket is bound anew.
                DeviceSpec::Rng { rate_limit } => Box::new(Rng::new(
                    &EntropyConfig {
                        rate_limit: *rate_limit,
                    },
                    Arc::clone(&metrics),
                )?),
                DeviceSpec::Vsock { cid, uds_path } => Box::new(Vsock::restored(
                    &VsockConfig {
                        cid: *cid,
                        uds_path: overrides
                            .vsock_uds_path
                            .clone()
                            .unwrap_or_else(|| uds_path.clone()),
                    },
                    Arc::clone(&metrics),
                )?),
            };
            let rng = matches!(s.spec, DeviceSpec::Rng { .. });
            bus.attach(vm, device, metrics, |device, irq, notify| {
                MmioTransport::restore(device, irq, notify, &s.transport, mem)
            })?;
            // A request its limiter held back when the snapshot was taken
            // is in the ring with no notification to come: the guest's
            // driver waits for it. A notification of our own takes it up.
            if rng && let Some(notify) = bus.slots.last().and_then(|slot| slot.notify.first()) {
                notify.write(1).map_err(VirtioError::EventFd)?;
            }
        }
        Ok(bus)
    }

    /// Gives `device` the next window and line, its irqfd and ioeventfds.
    fn attach(
        &mut self,
        vm: &VmFd,
        device: Box<dyn VirtioDevice>,
        metrics: Arc<DeviceMetrics>,
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

    /// Gives the `index`th block device (in `--disk` order) the image at
    /// `path`, in the mode it was attached with, and tells the guest its
    /// capacity changed (Firecracker's `PATCH /drives`).
    pub fn replace_disk(&self, index: usize, path: &Path) -> Result<(), VirtioError> {
        let slot = self
            .slots
            .iter()
            .filter(|s| {
                s.transport
                    .lock()
                    .is_ok_and(|t| matches!(t.device().spec(), DeviceSpec::Block { .. }))
            })
            .nth(index)
            .ok_or_else(|| VirtioError::Snapshot(format!("there is no disk {index}")))?;
        let read_only = match slot.transport.lock().map(|t| t.device().spec()) {
            Ok(DeviceSpec::Block { read_only, .. }) => read_only,
            _ => return Err(VirtioError::Snapshot("the disk's lock is poisoned".into())),
        };
        let disk = open_disk(path, read_only, Arc::clone(&slot.metrics))?;
        let replaced = slot
            .transport
            .lock()
            .is_ok_and(|mut t| t.replace_device(Box::new(disk)));
        if replaced {
            Ok(())
        } else {
            Err(VirtioError::Snapshot(format!(
                "disk {index} cannot change its image"
            )))
        }
    }

    /// The host sockets the devices bound (a vsock device's), which the
    /// thread that runs the VM removes at its end.
    pub fn socket_paths(&self) -> Vec<std::path::PathBuf> {
        self.slots
            .iter()
            .filter_map(|s| match s.transport.lock().ok()?.device().spec() {
                DeviceSpec::Vsock { uds_path, .. } => Some(uds_path),
                _ => None,
            })
            .collect()
    }

    /// What the kernel command line needs to find the devices.
    pub fn cmdline(&self) -> String {
        self.slots
            .iter()
            .map(|s| format!("virtio_mmio.device=4K@{:#x}:{}", s.base, s.gsi))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The devices as the DSDT describes them.
    pub fn acpi_devices(&self) -> Vec<MmioDevice> {
        self.slots
            .iter()
            .map(|s| MmioDevice {
                base: s.base as u32,
                len: WINDOW as u32,
                gsi: s.gsi,
            })
            .collect()
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
    pub fn metrics(&self) -> Vec<Arc<DeviceMetrics>> {
        self.slots.iter().map(|s| Arc::clone(&s.metrics)).collect()
    }

    pub fn snapshot(
        &self,
    ) -> Result<Vec<DeviceSnapshot>, crate::vmm::base::control_error::ControlError> {
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
        let bus = VirtioBus::create(&vm, &disks, &[], None, None).unwrap();
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
            let err = VirtioBus::create(&vm, &[disk], &[], None, None)
                .err()
                .unwrap();
            assert!(err.to_string().contains(message), "{err}");
        }
        // A snapshot's devices restore on a new VM; an image whose length
        // changed since is refused, naming both lengths.
        let saved = bus.snapshot().unwrap();
        let other = kvm.create_vm().unwrap();
        other.create_irq_chip().unwrap();
        let back = VirtioBus::restore(&other, &saved, &mem, &Default::default()).unwrap();
        assert_eq!(back.snapshot().unwrap(), saved);
        std::fs::write(&a, vec![0u8; 8192]).unwrap();
        let third = kvm.create_vm().unwrap();
        third.create_irq_chip().unwrap();
        let err = VirtioBus::restore(&third, &saved, &mem, &Default::default())
            .err()
            .unwrap();
        assert!(err.to_string().contains("was 4096 bytes"), "{err}");
        assert!(err.to_string().contains("8192 now"), "{err}");
        let many = vec![disks[0].clone(); MAX_DEVICES + 1];
        assert!(matches!(
            VirtioBus::create(&vm, &many, &[], None, None),
            Err(VirtioError::TooMany(9))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
