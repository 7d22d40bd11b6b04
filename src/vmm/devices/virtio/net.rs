//! The virtio network device (virtio 1.2, section 5.1) on a host tap: the
//! transmit queue's frames go to the tap, the tap's frames fill the receive
//! queue's buffers. No offloads are offered, so the 12-byte virtio-net
//! header is all zeros on receive and ignored on transmit, and the tap
//! carries plain Ethernet frames.
//!
//! The receive path never blocks and never queues: a frame is read from the
//! tap only into a buffer the guest posted. When the guest posts none, the
//! device stops polling the tap until the guest notifies the receive queue,
//! and the host kernel's tap queue (bounded by its txqueuelen) drops what
//! arrives meanwhile. A guest that stops taking packets therefore cannot
//! grow lwpvmm's memory.

use std::io::{self, Read, Write};
use std::os::unix::io::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use virtio_bindings::virtio_ids::VIRTIO_ID_NET;
use virtio_bindings::virtio_net::VIRTIO_NET_F_MAC;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::{Queue, QueueOwnedT, QueueT};

use super::device::{DeviceError, DeviceSpec};
use super::drain::{drain, next_buffer};
use super::mmio::{CHAINS_PER_CALL, Halt, Progress, VirtioDevice, read_space};
use crate::guard::GuestMemory;
use crate::vmm::base::metrics::DeviceMetrics;

/// The receive and transmit queues' size.
const QUEUE_SIZE: u16 = 256;
const RX: usize = 0;
const TX: usize = 1;
/// struct virtio_net_hdr_v1 (with num_buffers, as VIRTIO_F_VERSION_1 has
/// it).
const NET_HDR: usize = 12;
/// The largest frame without offloads: a 1500-byte MTU's, with VLAN tag,
/// rounded up. Longer transmit chains are dropped.
pub const MAX_FRAME: usize = 1522;

/// A host tap, or a fake one in tests.
pub trait Tap: Send {
    /// Reads one frame; `WouldBlock` when there is none.
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    /// Writes one frame.
    fn send(&mut self, frame: &[u8]) -> io::Result<usize>;
    /// The descriptor to poll for frames.
    fn fd(&self) -> RawFd;
}

impl Tap for tun_tap::Iface {
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        tun_tap::Iface::recv(self, buf)
    }

    fn send(&mut self, frame: &[u8]) -> io::Result<usize> {
        tun_tap::Iface::send(self, frame)
    }

    fn fd(&self) -> RawFd {
        self.as_raw_fd()
    }
}

/// Opens the tap `name` through /dev/net/tun, non-blocking.
pub fn open_tap(name: &str) -> io::Result<tun_tap::Iface> {
    let tap = tun_tap::Iface::without_packet_info(name, tun_tap::Mode::Tap)?;
    tap.set_non_blocking()?;
    Ok(tap)
}

/// A virtio network device.
pub struct Net {
    tap: Box<dyn Tap>,
    name: String,
    id: Option<String>,
    mac: [u8; 6],
    metrics: Arc<DeviceMetrics>,
    frame: Vec<u8>,
    halt: Halt,
}

impl Net {
    /// A device on `tap` (called `name`) with the guest MAC `mac`; `id` is
    /// the front end's name for it ([`super::device::NetConfig::id`]).
    pub fn new(
        tap: Box<dyn Tap>,
        name: String,
        id: Option<String>,
        mac: [u8; 6],
        metrics: Arc<DeviceMetrics>,
    ) -> Self {
        Net {
            tap,
            name,
            id,
            mac,
            metrics,
            frame: vec![0; NET_HDR + MAX_FRAME],
            halt: Halt::default(),
        }
    }

    /// Sends the frames the guest posted, up to the per-call limit: whether
    /// a chain was used, and whether the limit stopped it.
    fn transmit(
        &mut self,
        queue: &mut Queue,
        mem: &GuestMemory,
    ) -> Result<(bool, bool), DeviceError> {
        let halt = self.halt.clone();
        let done = drain(queue, mem, &halt, |chain| {
            match chain.reader(mem) {
                Ok(mut reader) if reader.available_bytes() <= self.frame.len() => {
                    let n = reader.available_bytes();
                    let ok = reader.read_exact(&mut self.frame[..n]).is_ok() && n > NET_HDR;
                    if !ok {
                        self.metrics.device_errors.fetch_add(1, Ordering::Relaxed);
                    } else if self.tap.send(&self.frame[NET_HDR..n]).is_ok() {
                        self.metrics.net_tx_frames.fetch_add(1, Ordering::Relaxed);
                    } else {
                        // The tap's queue is full or it is down: a network
                        // drops frames.
                        self.metrics.net_tx_dropped.fetch_add(1, Ordering::Relaxed);
                    }
                }
                _ => {
                    self.metrics.device_errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            0
        })?;
        Ok((done.used, done.again))
    }

    /// Fills posted receive buffers from the tap until either runs out;
    /// says whether a chain was used and whether buffers remain.
    fn receive(&mut self, queue: &mut Queue, mem: &GuestMemory) -> Result<Progress, DeviceError> {
        let mut used = false;
        for _ in 0..CHAINS_PER_CALL {
            let Some(chain) = next_buffer(queue, mem)? else {
                // Out of buffers: the guest's next one is heard of.
                return Ok(Progress {
                    interrupt: used && queue.needs_notification(mem)?,
                    host_input: Some(false),
                    again: false,
                });
            };
            let head = chain.head_index();
            let n = match self.tap.recv(&mut self.frame[NET_HDR..]) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // No frame: the buffer stays the guest's.
                    queue.go_to_previous_position();
                    return Ok(Progress {
                        interrupt: used && queue.needs_notification(mem)?,
                        host_input: Some(true),
                        again: false,
                    });
                }
                Err(_) => 0,
            };
            let written = if n == 0 {
                0
            } else {
                self.frame[..NET_HDR].fill(0);
                // num_buffers: one buffer per frame (no MRG_RXBUF).
                self.frame[10] = 1;
                match chain.writer(mem) {
                    Ok(mut w) if w.available_bytes() >= NET_HDR + n => {
                        match w.write_all(&self.frame[..NET_HDR + n]) {
                            Ok(()) => {
                                self.metrics.net_rx_frames.fetch_add(1, Ordering::Relaxed);
                                NET_HDR + n
                            }
                            Err(_) => 0,
                        }
                    }
                    _ => 0,
                }
            };
            if written == 0 {
                self.metrics.net_rx_dropped.fetch_add(1, Ordering::Relaxed);
            }
            queue.add_used(mem, head, written as u32)?;
            used = true;
            if self.halt.requested() {
                break;
            }
        }
        // The limit or a pause: the tap stays polled, so the thread comes
        // back.
        Ok(Progress {
            interrupt: used && queue.needs_notification(mem)?,
            host_input: Some(true),
            again: false,
        })
    }
}

impl VirtioDevice for Net {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_NET
    }

    fn features(&self) -> u64 {
        1 << VIRTIO_NET_F_MAC | 1 << VIRTIO_RING_F_EVENT_IDX
    }

    fn queue_max_sizes(&self) -> &'static [u16] {
        &[QUEUE_SIZE, QUEUE_SIZE]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // virtio_net_config: mac only (no STATUS, no MQ, no MTU).
        read_space(&self.mac, offset, data);
    }

    fn notified(
        &mut self,
        index: usize,
        queues: &mut [Queue],
        mem: &GuestMemory,
    ) -> Result<Progress, DeviceError> {
        match index {
            RX => self.host_input(queues, mem),
            TX => {
                let queue = queues.get_mut(TX).ok_or(DeviceError::NoQueue(TX))?;
                let (sent, again) = self.transmit(queue, mem)?;
                Ok(Progress {
                    interrupt: sent && queue.needs_notification(mem)?,
                    // Transmitting says nothing about receive buffers.
                    host_input: None,
                    again,
                })
            }
            other => Err(DeviceError::NoQueue(other)),
        }
    }

    fn host_input(
        &mut self,
        queues: &mut [Queue],
        mem: &GuestMemory,
    ) -> Result<Progress, DeviceError> {
        let queue = queues.get_mut(RX).ok_or(DeviceError::NoQueue(RX))?;
        self.receive(queue, mem)
    }

    fn host_fd(&self) -> Option<RawFd> {
        Some(self.tap.fd())
    }

    fn set_halt(&mut self, halt: Halt) {
        self.halt = halt;
    }

    fn spec(&self) -> DeviceSpec {
        DeviceSpec::Net {
            tap: self.name.clone(),
            mac: self.mac,
            id: self.id.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vmm::devices::virtio::drain::one_descriptor as one;
    use std::collections::VecDeque;
    use std::sync::Mutex;
    use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{Bytes, GuestAddress};

    #[derive(Default)]
    struct FakeTap {
        incoming: Arc<Mutex<VecDeque<Vec<u8>>>>,
        sent: Arc<Mutex<Vec<Vec<u8>>>>,
    }

    impl Tap for FakeTap {
        fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            match self.incoming.lock().unwrap().pop_front() {
                Some(f) => {
                    let n = f.len().min(buf.len());
                    buf[..n].copy_from_slice(&f[..n]);
                    Ok(n)
                }
                None => Err(io::ErrorKind::WouldBlock.into()),
            }
        }
        fn send(&mut self, frame: &[u8]) -> io::Result<usize> {
            self.sent.lock().unwrap().push(frame.to_vec());
            Ok(frame.len())
        }
        fn fd(&self) -> RawFd {
            -1
        }
    }

    struct Rig {
        mem: GuestMemory,
        rx: MockSplitQueue<'static, GuestMemory>,
        tx: MockSplitQueue<'static, GuestMemory>,
        queues: Vec<Queue>,
        incoming: Arc<Mutex<VecDeque<Vec<u8>>>>,
        sent: Arc<Mutex<Vec<Vec<u8>>>>,
        net: Net,
    }

    fn rig() -> Rig {
        let mem: &'static GuestMemory = Box::leak(Box::new(
            GuestMemory::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap(),
        ));
        let rx = MockSplitQueue::create(mem, GuestAddress(0), 16);
        let tx = MockSplitQueue::create(mem, GuestAddress(0x8000), 16);
        let queues = vec![rx.create_queue().unwrap(), tx.create_queue().unwrap()];
        let tap = FakeTap::default();
        let (incoming, sent) = (Arc::clone(&tap.incoming), Arc::clone(&tap.sent));
        let net = Net::new(
            Box::new(tap),
            "tap0".into(),
            None,
            [2, 0, 0, 0, 0, 1],
            Arc::new(DeviceMetrics::default()),
        );
        Rig {
            mem: mem.clone(),
            rx,
            tx,
            queues,
            incoming,
            sent,
            net,
        }
    }

    #[test]
    fn frames_go_out_without_the_header() {
        let mut r = rig();
        let mut frame = vec![0u8; NET_HDR];
        frame.extend_from_slice(b"ethernet frame");
        r.mem.write_slice(&frame, GuestAddress(0x20000)).unwrap();
        r.tx.add_desc_chains(&one(0x20000, frame.len() as u32, 0), 0)
            .unwrap();
        let p = r.net.notified(TX, &mut r.queues, &r.mem).unwrap();
        assert!(p.interrupt);
        assert_eq!(*r.sent.lock().unwrap(), vec![b"ethernet frame".to_vec()]);
    }

    #[test]
    fn frames_come_in_only_into_posted_buffers() {
        let mut r = rig();
        r.incoming
            .lock()
            .unwrap()
            .extend([b"first".to_vec(), b"second".to_vec()]);
        // No buffer: nothing is read from the tap, and polling stops.
        let p = r.net.host_input(&mut r.queues, &r.mem).unwrap();
        assert_eq!((p.interrupt, p.host_input), (false, Some(false)));
        assert_eq!(r.incoming.lock().unwrap().len(), 2);
        // One buffer: one frame, and the tap still has one.
        r.rx.add_desc_chains(&one(0x30000, 2048, VRING_DESC_F_WRITE), 0)
            .unwrap();
        let p = r.net.notified(RX, &mut r.queues, &r.mem).unwrap();
        assert_eq!((p.interrupt, p.host_input), (true, Some(false)));
        let mut got = [0u8; NET_HDR + 5];
        r.mem.read_slice(&mut got, GuestAddress(0x30000)).unwrap();
        assert_eq!(&got[NET_HDR..], b"first");
        assert_eq!(got[10], 1, "num_buffers");
        assert_eq!(r.incoming.lock().unwrap().len(), 1);
        // A buffer too small for the header: the frame is dropped.
        r.rx.add_desc_chains(&one(0x31000, 4, VRING_DESC_F_WRITE), 1)
            .unwrap();
        r.net.host_input(&mut r.queues, &r.mem).unwrap();
        assert_eq!(r.net.metrics.net_rx_dropped.load(Ordering::Relaxed), 1);
        // A buffer and an empty tap: the buffer is kept for later.
        r.rx.add_desc_chains(&one(0x32000, 2048, VRING_DESC_F_WRITE), 2)
            .unwrap();
        let p = r.net.host_input(&mut r.queues, &r.mem).unwrap();
        assert_eq!(p.host_input, Some(true));
        assert_eq!(r.queues[RX].next_avail(), 2);
    }

    #[test]
    fn the_config_space_holds_the_mac() {
        let r = rig();
        let mut mac = [0u8; 8];
        r.net.read_config(0, &mut mac);
        assert_eq!(mac, [2, 0, 0, 0, 0, 1, 0, 0]);
    }
}
