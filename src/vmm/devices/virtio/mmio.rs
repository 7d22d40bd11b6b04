//! The virtio-mmio transport (virtio 1.2, section 4.2.2, register layout
//! version 2): one 4 KiB register window per device, the device status
//! handshake, feature negotiation and queue set-up. The queues themselves
//! are the rust-vmm `virtio-queue` crate's. A vCPU reads and writes the
//! registers under the device's lock; the device thread processes queue
//! notifications (ioeventfds) under the same lock, so a register write never
//! races a request.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};
use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_CONFIG_S_NEEDS_RESET, VIRTIO_F_VERSION_1,
};
use virtio_bindings::virtio_mmio::{VIRTIO_MMIO_INT_CONFIG, VIRTIO_MMIO_INT_VRING};
use virtio_queue::{Queue, QueueState, QueueT};
use vm_memory::GuestAddress;
use vmm_sys_util::eventfd::EventFd;

use super::device::{DeviceError, DeviceSpec, VirtioError};
use crate::guard::GuestMemory;

/// "virt", little-endian.
const MAGIC_VALUE: u32 = 0x7472_6976;
/// The register layout version: 2, the modern (virtio 1.x) one.
const VERSION: u32 = 2;
/// lwpvmm's vendor ID: "LWPV".
const VENDOR_ID: u32 = 0x5650_574c;

const REG_MAGIC: u64 = 0x000;
const REG_VERSION: u64 = 0x004;
const REG_DEVICE_ID: u64 = 0x008;
const REG_VENDOR_ID: u64 = 0x00c;
const REG_DEVICE_FEATURES: u64 = 0x010;
const REG_DEVICE_FEATURES_SEL: u64 = 0x014;
const REG_DRIVER_FEATURES: u64 = 0x020;
const REG_DRIVER_FEATURES_SEL: u64 = 0x024;
const REG_QUEUE_SEL: u64 = 0x030;
const REG_QUEUE_NUM_MAX: u64 = 0x034;
const REG_QUEUE_NUM: u64 = 0x038;
const REG_QUEUE_READY: u64 = 0x044;
/// Where the guest notifies a queue: the ioeventfds sit on this register.
pub const REG_QUEUE_NOTIFY: u64 = 0x050;
const REG_INTERRUPT_STATUS: u64 = 0x060;
const REG_INTERRUPT_ACK: u64 = 0x064;
const REG_STATUS: u64 = 0x070;
const REG_QUEUE_DESC_LOW: u64 = 0x080;
const REG_QUEUE_DESC_HIGH: u64 = 0x084;
const REG_QUEUE_AVAIL_LOW: u64 = 0x090;
const REG_QUEUE_AVAIL_HIGH: u64 = 0x094;
const REG_QUEUE_USED_LOW: u64 = 0x0a0;
const REG_QUEUE_USED_HIGH: u64 = 0x0a4;
const REG_CONFIG_GENERATION: u64 = 0x0fc;
/// Device-specific configuration space.
const REG_CONFIG: u64 = 0x100;

/// What one of a device's queues asked for, answered by the device thread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    /// The used ring changed and the guest asked to hear of it.
    pub interrupt: bool,
    /// Whether the device thread should poll the device's host descriptor
    /// from now on (a network device with receive buffers to fill, or
    /// without); `None` leaves it as it is.
    pub host_input: Option<bool>,
    /// The queue still has chains: the device stopped at its per-call
    /// limit (a ring the device's own writes keep refilling must not hold
    /// the device thread), and the thread notifies the queue again.
    pub again: bool,
}

/// Most chains a device takes from one queue in one call.
pub const CHAINS_PER_CALL: usize = 1024;

/// The control thread's request that the device thread stop between two
/// requests (a pause waits for the request at hand, not for a ring full of
/// them). Devices check it after each request and, when it is set, return
/// with `again` (or, for input, keep the host descriptor polled) so that
/// what is left is taken up after the pause.
#[derive(Debug, Clone, Default)]
pub struct Halt(Arc<AtomicBool>);

impl Halt {
    /// Whether the device thread should stop at the next request.
    pub fn requested(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    /// Asks for it, or lifts it.
    pub fn set(&self, on: bool) {
        self.0.store(on, Ordering::Release);
    }
}

/// A virtio device behind the transport: its identity, features,
/// configuration space and request paths.
pub trait VirtioDevice: Send {
    /// The virtio device ID (1 network, 2 block, 4 entropy, 19 vsock).
    fn device_type(&self) -> u32;
    /// The features offered (VIRTIO_F_VERSION_1 is added by the transport).
    fn features(&self) -> u64;
    /// The maximum size of each queue.
    fn queue_max_sizes(&self) -> &'static [u16];
    /// Reads the configuration space at `offset`; outside it reads zeros.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// The guest notified queue `index` of the activated device.
    fn notified(
        &mut self,
        index: usize,
        queues: &mut [Queue],
        mem: &GuestMemory,
    ) -> Result<Progress, DeviceError>;
    /// The device's host descriptor is readable (a network device's tap).
    fn host_input(
        &mut self,
        queues: &mut [Queue],
        mem: &GuestMemory,
    ) -> Result<Progress, DeviceError>;
    /// Takes the flag its request paths check between requests.
    fn set_halt(&mut self, halt: Halt);
    /// The host descriptor the device thread polls, if any.
    fn host_fd(&self) -> Option<std::os::unix::io::RawFd>;
    /// What the device was built from, for snapshots.
    fn spec(&self) -> DeviceSpec;
}

/// A queue's state as a snapshot holds it (`virtio_queue::QueueState`,
/// which has no serde).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedQueue {
    /// The queue's maximum size.
    pub max_size: u16,
    /// The next available-ring entry the device reads.
    pub next_avail: u16,
    /// The next used-ring entry the device writes.
    pub next_used: u16,
    /// VIRTIO_F_RING_EVENT_IDX was negotiated.
    pub event_idx: bool,
    /// The size the driver chose.
    pub size: u16,
    /// The driver set QueueReady.
    pub ready: bool,
    /// The descriptor table's guest-physical address.
    pub desc_table: u64,
    /// The available ring's.
    pub avail_ring: u64,
    /// The used ring's.
    pub used_ring: u64,
}

impl From<QueueState> for SavedQueue {
    fn from(s: QueueState) -> Self {
        SavedQueue {
            max_size: s.max_size,
            next_avail: s.next_avail,
            next_used: s.next_used,
            event_idx: s.event_idx_enabled,
            size: s.size,
            ready: s.ready,
            desc_table: s.desc_table,
            avail_ring: s.avail_ring,
            used_ring: s.used_ring,
        }
    }
}

impl From<SavedQueue> for QueueState {
    fn from(s: SavedQueue) -> Self {
        QueueState {
            max_size: s.max_size,
            next_avail: s.next_avail,
            next_used: s.next_used,
            event_idx_enabled: s.event_idx,
            size: s.size,
            ready: s.ready,
            desc_table: s.desc_table,
            avail_ring: s.avail_ring,
            used_ring: s.used_ring,
        }
    }
}

/// The transport's registers, for snapshots.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransportState {
    /// The device status register.
    pub status: u32,
    /// DeviceFeaturesSel.
    pub device_features_sel: u32,
    /// DriverFeaturesSel.
    pub driver_features_sel: u32,
    /// The features the driver acknowledged.
    pub driver_features: u64,
    /// QueueSel.
    pub queue_sel: u32,
    /// InterruptStatus.
    pub interrupt_status: u32,
    /// ConfigGeneration.
    pub config_generation: u32,
    /// Every queue.
    pub queues: Vec<SavedQueue>,
}

/// Reads `data.len()` bytes of `space` from `offset`; bytes past its end
/// (or an offset no index can reach) read as zero, as virtio's unused
/// configuration fields do.
pub fn read_space(space: &[u8], offset: u64, data: &mut [u8]) {
    for (i, b) in data.iter_mut().enumerate() {
        *b = usize::try_from(offset)
            .ok()
            .and_then(|o| o.checked_add(i))
            .and_then(|o| space.get(o))
            .copied()
            .unwrap_or(0);
    }
}

/// `address` with its high (or low) 32 bits replaced by `v`. The queue's
/// own checked setters take the result: a misaligned address is refused
/// there without a log line (the unchecked setters log each refusal, which
/// a guest could repeat at will).
fn halves(address: u64, high: bool, v: u32) -> GuestAddress {
    GuestAddress(if high {
        address & 0xffff_ffff | u64::from(v) << 32
    } else {
        address & !0xffff_ffff | u64::from(v)
    })
}

/// One virtio-mmio device: its registers, its queues and the device.
pub struct MmioTransport {
    device: Box<dyn VirtioDevice>,
    queues: Vec<Queue>,
    regs: TransportState,
    irq: EventFd,
    notify: Vec<EventFd>,
    /// The device thread's pause flag, for a device put in place later.
    halt: Halt,
}

impl MmioTransport {
    /// A device in its reset state; `irq` is its irqfd, `notify` one
    /// ioeventfd per queue.
    pub fn new(
        device: Box<dyn VirtioDevice>,
        irq: EventFd,
        notify: Vec<EventFd>,
    ) -> Result<Self, VirtioError> {
        let queues = Self::fresh_queues(device.as_ref())?;
        Ok(MmioTransport {
            device,
            queues,
            regs: TransportState::default(),
            irq,
            notify,
            halt: Halt::default(),
        })
    }

    fn fresh_queues(device: &dyn VirtioDevice) -> Result<Vec<Queue>, VirtioError> {
        device
            .queue_max_sizes()
            .iter()
            .map(|&size| Queue::new(size).map_err(|e| VirtioError::Queue(format!("{e:?}"))))
            .collect()
    }

    /// A device with the registers and queues of a snapshot; an activated
    /// device's queues must lie in `mem`.
    pub fn restore(
        device: Box<dyn VirtioDevice>,
        irq: EventFd,
        notify: Vec<EventFd>,
        state: &TransportState,
        mem: &GuestMemory,
    ) -> Result<Self, VirtioError> {
        let sizes = device.queue_max_sizes();
        if state.queues.len() != sizes.len()
            || state
                .queues
                .iter()
                .zip(sizes)
                .any(|(q, &s)| q.max_size != s)
        {
            return Err(VirtioError::Snapshot(format!(
                "{} queues of sizes {:?} saved, the device has {:?}",
                state.queues.len(),
                state.queues.iter().map(|q| q.max_size).collect::<Vec<_>>(),
                sizes
            )));
        }
        let queues = state
            .queues
            .iter()
            .map(|&q| {
                Queue::try_from(QueueState::from(q))
                    .map_err(|e| VirtioError::Snapshot(format!("a queue: {e:?}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut t = MmioTransport {
            device,
            queues,
            regs: state.clone(),
            irq,
            notify,
            halt: Halt::default(),
        };
        if t.activated() && !t.queues_valid(mem) {
            return Err(VirtioError::Snapshot(
                "an activated queue lies outside guest RAM".into(),
            ));
        }
        t.regs.queues.clear();
        Ok(t)
    }

    /// The registers and queues, for a snapshot.
    pub fn state(&self) -> TransportState {
        TransportState {
            queues: self.queues.iter().map(|q| q.state().into()).collect(),
            ..self.regs.clone()
        }
    }

    /// The device.
    pub fn device(&self) -> &dyn VirtioDevice {
        self.device.as_ref()
    }

    /// Whether the driver finished initialisation and the device runs.
    pub fn activated(&self) -> bool {
        self.regs.status & VIRTIO_CONFIG_S_DRIVER_OK != 0
            && self.regs.status & VIRTIO_CONFIG_S_NEEDS_RESET == 0
    }

    fn queues_valid(&self, mem: &GuestMemory) -> bool {
        self.queues.iter().all(|q| !q.ready() || q.is_valid(mem))
    }

    fn selected(&mut self) -> Option<&mut Queue> {
        // Queues are configured only before DRIVER_OK (virtio 1.2, 4.2.2.2).
        if self.regs.status & VIRTIO_CONFIG_S_DRIVER_OK != 0 {
            return None;
        }
        self.queues.get_mut(self.regs.queue_sel as usize)
    }

    fn offered(&self) -> u64 {
        self.device.features() | 1 << VIRTIO_F_VERSION_1
    }

    /// A guest read of `data.len()` bytes at `offset` in the window.
    pub fn read(&self, offset: u64, data: &mut [u8]) {
        if offset >= REG_CONFIG {
            self.device.read_config(offset - REG_CONFIG, data);
            return;
        }
        let queue = self.queues.get(self.regs.queue_sel as usize);
        let value = match offset {
            REG_MAGIC => MAGIC_VALUE,
            REG_VERSION => VERSION,
            REG_DEVICE_ID => self.device.device_type(),
            REG_VENDOR_ID => VENDOR_ID,
            REG_DEVICE_FEATURES => match self.regs.device_features_sel {
                0 => self.offered() as u32,
                1 => (self.offered() >> 32) as u32,
                _ => 0,
            },
            REG_QUEUE_NUM_MAX => queue.map_or(0, |q| q.max_size().into()),
            REG_QUEUE_READY => queue.map_or(0, |q| q.ready().into()),
            REG_INTERRUPT_STATUS => self.regs.interrupt_status,
            REG_STATUS => self.regs.status,
            REG_CONFIG_GENERATION => self.regs.config_generation,
            _ => 0,
        };
        // Registers are 32 bits wide; a narrower read gets the low bytes.
        read_space(&value.to_le_bytes(), 0, data);
    }

    /// A guest write at `offset`; `mem` checks the queues at DRIVER_OK.
    pub fn write(&mut self, offset: u64, data: &[u8], mem: &GuestMemory) {
        if offset >= REG_CONFIG {
            // Neither device has a writable configuration field.
            return;
        }
        let mut bytes = [0u8; 4];
        let n = data.len().min(4);
        bytes[..n].copy_from_slice(&data[..n]);
        let v = u32::from_le_bytes(bytes);
        match offset {
            REG_DEVICE_FEATURES_SEL => self.regs.device_features_sel = v,
            REG_DRIVER_FEATURES_SEL => self.regs.driver_features_sel = v,
            REG_DRIVER_FEATURES if self.regs.status & VIRTIO_CONFIG_S_FEATURES_OK == 0 => {
                match self.regs.driver_features_sel {
                    0 => {
                        self.regs.driver_features =
                            (self.regs.driver_features & !0xffff_ffff) | u64::from(v)
                    }
                    1 => {
                        self.regs.driver_features =
                            (self.regs.driver_features & 0xffff_ffff) | u64::from(v) << 32
                    }
                    _ => {}
                }
            }
            REG_QUEUE_SEL => self.regs.queue_sel = v,
            REG_QUEUE_NUM => {
                if let Some(q) = self.selected() {
                    // A size the queue refuses (not a power of two, too
                    // big) leaves the old one, which DRIVER_OK then checks.
                    let _ = q.try_set_size(v as u16);
                }
            }
            REG_QUEUE_READY => {
                if let Some(q) = self.selected() {
                    q.set_ready(v == 1);
                }
            }
            REG_QUEUE_DESC_LOW | REG_QUEUE_DESC_HIGH => {
                if let Some(q) = self.selected() {
                    let a = halves(q.desc_table(), offset == REG_QUEUE_DESC_HIGH, v);
                    let _ = q.try_set_desc_table_address(a);
                }
            }
            REG_QUEUE_AVAIL_LOW | REG_QUEUE_AVAIL_HIGH => {
                if let Some(q) = self.selected() {
                    let a = halves(q.avail_ring(), offset == REG_QUEUE_AVAIL_HIGH, v);
                    let _ = q.try_set_avail_ring_address(a);
                }
            }
            REG_QUEUE_USED_LOW | REG_QUEUE_USED_HIGH => {
                if let Some(q) = self.selected() {
                    let a = halves(q.used_ring(), offset == REG_QUEUE_USED_HIGH, v);
                    let _ = q.try_set_used_ring_address(a);
                }
            }
            // Only reached when the ioeventfd is not there (it always is
            // once the device is registered): hand it to the device thread.
            REG_QUEUE_NOTIFY => {
                if let Some(fd) = self.notify.get(v as usize) {
                    let _ = fd.write(1);
                }
            }
            REG_INTERRUPT_ACK => self.regs.interrupt_status &= !v,
            REG_STATUS => self.set_status(v, mem),
            _ => {}
        }
    }

    /// The device status handshake (virtio 1.2, 3.1.1).
    fn set_status(&mut self, v: u32, mem: &GuestMemory) {
        if v == 0 {
            self.reset();
            return;
        }
        let old = self.regs.status;
        // The driver only adds bits, in order; anything else is ignored.
        if v & old != old {
            return;
        }
        let mut status = v;
        if v & VIRTIO_CONFIG_S_FEATURES_OK != 0 && old & VIRTIO_CONFIG_S_FEATURES_OK == 0 {
            let acked = self.regs.driver_features;
            let ok = acked & !self.offered() == 0 && acked & 1 << VIRTIO_F_VERSION_1 != 0;
            if !ok {
                // The driver re-reads the status and gives up.
                status &= !VIRTIO_CONFIG_S_FEATURES_OK;
            } else {
                let event_idx =
                    acked & 1 << virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX != 0;
                self.queues
                    .iter_mut()
                    .for_each(|q| q.set_event_idx(event_idx));
            }
        }
        let needed = VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER;
        if v & VIRTIO_CONFIG_S_DRIVER_OK != 0 && old & VIRTIO_CONFIG_S_DRIVER_OK == 0 {
            let ready = status & VIRTIO_CONFIG_S_FEATURES_OK != 0 && status & needed == needed;
            if !ready || !self.queues_valid(mem) {
                status |= VIRTIO_CONFIG_S_NEEDS_RESET;
                self.regs.status = status;
                self.interrupt(VIRTIO_MMIO_INT_CONFIG);
                return;
            }
        }
        self.regs.status = status;
    }

    fn reset(&mut self) {
        self.regs = TransportState::default();
        if let Ok(queues) = Self::fresh_queues(self.device.as_ref()) {
            self.queues = queues;
        }
    }

    /// Puts `new`, a block device on another image in the same mode, in
    /// place of the block device (Firecracker's `PATCH /drives`), between
    /// two requests (the caller holds the transport's lock), and tells the
    /// driver its configuration changed (a new capacity). False, and
    /// nothing changed, for any other pair of devices.
    pub fn replace_device(&mut self, mut new: Box<dyn VirtioDevice>) -> bool {
        let same = matches!(
            (self.device.spec(), new.spec()),
            (DeviceSpec::Block { read_only: a, .. }, DeviceSpec::Block { read_only: b, .. }) if a == b
        );
        if !same {
            return false;
        }
        new.set_halt(self.halt.clone());
        self.device = new;
        self.regs.config_generation = self.regs.config_generation.wrapping_add(1);
        if self.activated() {
            self.interrupt(VIRTIO_MMIO_INT_CONFIG);
        }
        true
    }

    fn interrupt(&mut self, why: u32) {
        self.regs.interrupt_status |= why;
        // A full eventfd counter already has an interrupt pending.
        let _ = self.irq.write(1);
    }

    /// Marks the device broken after a request path failed: the driver
    /// sees DEVICE_NEEDS_RESET with a configuration interrupt.
    fn fail(&mut self) {
        self.regs.status |= VIRTIO_CONFIG_S_NEEDS_RESET;
        self.interrupt(VIRTIO_MMIO_INT_CONFIG);
    }

    fn progress(&mut self, result: Result<Progress, DeviceError>) -> Result<Progress, DeviceError> {
        match result {
            Ok(p) => {
                if p.interrupt {
                    self.interrupt(VIRTIO_MMIO_INT_VRING);
                }
                Ok(p)
            }
            Err(e) => {
                self.fail();
                Err(e)
            }
        }
    }

    /// Hands the device the device thread's halt flag.
    pub fn set_halt(&mut self, halt: Halt) {
        self.device.set_halt(halt.clone());
        self.halt = halt;
    }

    /// The guest notified queue `index` (the device thread calls this).
    pub fn notified(&mut self, index: usize, mem: &GuestMemory) -> Result<Progress, DeviceError> {
        if !self.activated() || index >= self.queues.len() {
            return Ok(Progress::default());
        }
        let r = self.device.notified(index, &mut self.queues, mem);
        self.progress(r)
    }

    /// The device's host descriptor is readable.
    pub fn host_input(&mut self, mem: &GuestMemory) -> Result<Progress, DeviceError> {
        if !self.activated() {
            // Nothing can take the input: stop polling until the guest
            // notifies a queue of the running device.
            return Ok(Progress {
                interrupt: false,
                host_input: Some(false),
                again: false,
            });
        }
        let r = self.device.host_input(&mut self.queues, mem);
        self.progress(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Dummy;

    impl VirtioDevice for Dummy {
        fn device_type(&self) -> u32 {
            42
        }
        fn features(&self) -> u64 {
            1 << 5
        }
        fn queue_max_sizes(&self) -> &'static [u16] {
            &[16]
        }
        fn read_config(&self, offset: u64, data: &mut [u8]) {
            data.iter_mut()
                .enumerate()
                .for_each(|(i, b)| *b = (offset as u8).wrapping_add(i as u8));
        }
        fn notified(
            &mut self,
            _: usize,
            _: &mut [Queue],
            _: &GuestMemory,
        ) -> Result<Progress, DeviceError> {
            Ok(Progress {
                interrupt: true,
                host_input: None,
                again: false,
            })
        }
        fn set_halt(&mut self, _: Halt) {}
        fn host_input(
            &mut self,
            _: &mut [Queue],
            _: &GuestMemory,
        ) -> Result<Progress, DeviceError> {
            Ok(Progress::default())
        }
        fn host_fd(&self) -> Option<std::os::unix::io::RawFd> {
            None
        }
        fn spec(&self) -> DeviceSpec {
            DeviceSpec::Net {
                tap: "dummy".into(),
                mac: [0; 6],
                id: None,
            }
        }
    }

    fn mem() -> GuestMemory {
        GuestMemory::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap()
    }

    fn transport() -> MmioTransport {
        MmioTransport::new(
            Box::new(Dummy),
            EventFd::new(0).unwrap(),
            vec![EventFd::new(0).unwrap()],
        )
        .unwrap()
    }

    fn r32(t: &MmioTransport, offset: u64) -> u32 {
        let mut b = [0u8; 4];
        t.read(offset, &mut b);
        u32::from_le_bytes(b)
    }

    fn w32(t: &mut MmioTransport, offset: u64, v: u32, mem: &GuestMemory) {
        t.write(offset, &v.to_le_bytes(), mem);
    }

    /// Brings the device up as Linux does; `desc` is the descriptor table.
    fn bring_up(t: &mut MmioTransport, mem: &GuestMemory, desc: u64, features: u32) {
        w32(t, REG_STATUS, 1, mem);
        w32(t, REG_STATUS, 3, mem);
        w32(t, REG_DRIVER_FEATURES_SEL, 0, mem);
        w32(t, REG_DRIVER_FEATURES, features, mem);
        w32(t, REG_DRIVER_FEATURES_SEL, 1, mem);
        w32(t, REG_DRIVER_FEATURES, 1, mem);
        w32(t, REG_STATUS, 0xb, mem);
        w32(t, REG_QUEUE_SEL, 0, mem);
        w32(t, REG_QUEUE_NUM, 16, mem);
        w32(t, REG_QUEUE_DESC_LOW, desc as u32, mem);
        w32(t, REG_QUEUE_DESC_HIGH, (desc >> 32) as u32, mem);
        w32(t, REG_QUEUE_AVAIL_LOW, 0x1000, mem);
        w32(t, REG_QUEUE_USED_LOW, 0x2000, mem);
        w32(t, REG_QUEUE_READY, 1, mem);
        w32(t, REG_STATUS, 0xf, mem);
    }

    #[test]
    fn identity_registers() {
        let t = transport();
        // (offset, value)
        let table = [
            (REG_MAGIC, MAGIC_VALUE),
            (REG_VERSION, 2),
            (REG_DEVICE_ID, 42),
            (REG_VENDOR_ID, VENDOR_ID),
            (REG_DEVICE_FEATURES, 1 << 5),
            (REG_QUEUE_NUM_MAX, 16),
            (REG_STATUS, 0),
            (0x0f0, 0),
        ];
        for (offset, want) in table {
            assert_eq!(r32(&t, offset), want, "{offset:#x}");
        }
        let mut cfg = [0u8; 2];
        t.read(REG_CONFIG + 4, &mut cfg);
        assert_eq!(cfg, [4, 5]);
    }

    #[test]
    fn negotiation_and_activation() {
        let m = mem();
        // (features the driver acks, descriptor table, activated, status)
        let table = [
            (1 << 5, 0x3000, true, 0xf),
            (0, 0x3000, true, 0xf),
            // A feature not offered: FEATURES_OK does not stick.
            (1 << 6, 0x3000, false, 0x47),
            // A descriptor table outside guest RAM.
            (1 << 5, 1 << 40, false, 0x4f),
        ];
        for (features, desc, activated, status) in table {
            let mut t = transport();
            bring_up(&mut t, &m, desc, features);
            assert_eq!(t.activated(), activated, "{features:#x} {desc:#x}");
            assert_eq!(r32(&t, REG_STATUS), status, "{features:#x} {desc:#x}");
            w32(&mut t, REG_STATUS, 0, &m);
            assert_eq!((r32(&t, REG_STATUS), t.activated()), (0, false), "reset");
        }
    }

    #[test]
    fn queues_are_fixed_once_running_and_interrupts_are_acknowledged() {
        let m = mem();
        let mut t = transport();
        bring_up(&mut t, &m, 0x3000, 0);
        w32(&mut t, REG_QUEUE_DESC_LOW, 0x9000, &m);
        assert_eq!(t.state().queues[0].desc_table, 0x3000);
        assert!(t.notified(0, &m).unwrap().interrupt);
        assert!(t.notified(7, &m).is_ok(), "no such queue: ignored");
        assert_eq!(r32(&t, REG_INTERRUPT_STATUS), VIRTIO_MMIO_INT_VRING);
        w32(&mut t, REG_INTERRUPT_ACK, VIRTIO_MMIO_INT_VRING, &m);
        assert_eq!(r32(&t, REG_INTERRUPT_STATUS), 0);
    }

    #[test]
    fn state_round_trips_and_bad_state_is_refused() {
        let m = mem();
        let mut t = transport();
        bring_up(&mut t, &m, 0x3000, 0);
        let state = t.state();
        let irq = || EventFd::new(0).unwrap();
        let back = MmioTransport::restore(Box::new(Dummy), irq(), vec![irq()], &state, &m).unwrap();
        assert_eq!(back.state(), state);
        assert!(back.activated());
        let mut outside = state.clone();
        outside.queues[0].used_ring = 1 << 40;
        let mut wrong_size = state.clone();
        wrong_size.queues[0].max_size = 256;
        let mut two = state.clone();
        two.queues.push(two.queues[0]);
        for bad in [outside, wrong_size, two] {
            assert!(MmioTransport::restore(Box::new(Dummy), irq(), vec![irq()], &bad, &m).is_err());
        }
    }
}
