//! The virtio vsock device (virtio 1.2, section 5.10) with Firecracker's
//! hybrid host side ([`muxer`]): guest stream sockets reach host processes
//! through Unix sockets. Three queues: the guest's receive buffers, its
//! transmit packets, and events (lwpvmm's only event is the transport
//! reset a restored device sends: connections do not survive a snapshot,
//! as Firecracker documents). It runs on a thread of its own (worker.rs)
//! under its own seccomp allowlist: the only device thread that touches
//! host sockets.

pub mod error;
pub mod muxer;
pub mod packet;

use std::io::{Read, Write};
use std::os::unix::io::RawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use virtio_bindings::virtio_ids::VIRTIO_ID_VSOCK;
use virtio_queue::{Queue, QueueOwnedT, QueueT};

use self::error::VsockError;
use self::muxer::Muxer;
use self::packet::{HDR_LEN, Header, MAX_PAYLOAD};
use super::device::{DeviceError, DeviceSpec};
use super::drain::{drain, next_buffer};
use super::mmio::{CHAINS_PER_CALL, Halt, Progress, VirtioDevice, read_space};
use crate::guard::GuestMemory;
use crate::vmm::base::metrics::DeviceMetrics;

const QUEUE_SIZE: u16 = 256;
const RX: usize = 0;
const TX: usize = 1;
const EVENT: usize = 2;
/// VIRTIO_VSOCK_EVENT_TRANSPORT_RESET.
const TRANSPORT_RESET: u32 = 0;

/// A vsock device to attach (`PUT /vsock`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VsockConfig {
    /// The guest's context ID (3 or more).
    pub cid: u64,
    /// The host socket; guest connections to port P go to `uds_path_P`.
    pub uds_path: PathBuf,
}

/// The device.
pub struct Vsock {
    muxer: Muxer,
    metrics: Arc<DeviceMetrics>,
    halt: Halt,
    /// Restored: the guest must drop its connections.
    reset_pending: bool,
    /// The reset went out and the guest has not handled it yet (it posts
    /// its event buffer again when it has): until then nothing else goes
    /// to the guest, or a connection made meanwhile would be reset too.
    reset_unacked: bool,
    packet: Vec<u8>,
    /// The muxer's refusals and drops already added to `device_errors`.
    counted: u64,
}

impl Vsock {
    /// A device for `config`, binding its socket.
    pub fn new(config: &VsockConfig, metrics: Arc<DeviceMetrics>) -> Result<Self, VsockError> {
        Ok(Vsock {
            muxer: Muxer::new(config.cid, &config.uds_path)?,
            metrics,
            halt: Halt::default(),
            reset_pending: false,
            reset_unacked: false,
            packet: vec![0; HDR_LEN + MAX_PAYLOAD],
            counted: 0,
        })
    }

    /// A restored device: its guest gets a transport reset first.
    pub fn restored(config: &VsockConfig, metrics: Arc<DeviceMetrics>) -> Result<Self, VsockError> {
        let mut v = Self::new(config, metrics)?;
        v.reset_pending = true;
        v.muxer.kick();
        Ok(v)
    }

    /// Adds the muxer's new refusals and drops to the device's errors.
    fn count(&mut self) {
        let c = self.muxer.counts;
        let total = c.refused + c.dropped;
        self.metrics
            .device_errors
            .fetch_add(total.saturating_sub(self.counted), Ordering::Relaxed);
        self.counted = total;
    }

    /// Takes the guest's packets.
    fn transmit(
        &mut self,
        queue: &mut Queue,
        mem: &GuestMemory,
    ) -> Result<(bool, bool), DeviceError> {
        let halt = self.halt.clone();
        let Vsock { muxer, packet, .. } = self;
        let done = drain(queue, mem, &halt, |chain| {
            let Ok(mut reader) = chain.reader(mem) else {
                muxer.counts.refused += 1;
                return 0;
            };
            let n = reader.available_bytes().min(packet.len());
            if reader.read_exact(&mut packet[..n]).is_err() {
                muxer.counts.refused += 1;
                return 0;
            }
            match Header::parse(&packet[..n]) {
                Ok(h) if h.len as usize <= n - HDR_LEN => {
                    muxer.from_guest(&h, &packet[HDR_LEN..HDR_LEN + h.len as usize]);
                }
                _ => muxer.counts.refused += 1,
            }
            0
        })?;
        self.count();
        Ok((done.used, done.again))
    }

    /// Fills the guest's receive buffers with what the host side has.
    fn receive(&mut self, queue: &mut Queue, mem: &GuestMemory) -> Result<Progress, DeviceError> {
        if self.reset_unacked {
            // The host waits (its sockets unpolled) until the event queue's
            // notification says the guest took the reset.
            return Ok(Progress {
                interrupt: false,
                host_input: Some(false),
                again: false,
            });
        }
        self.muxer.poll_host();
        let mut used = false;
        for _ in 0..CHAINS_PER_CALL {
            if !self.muxer.has_output() {
                return Ok(Progress {
                    interrupt: used && queue.needs_notification(mem)?,
                    host_input: Some(true),
                    again: false,
                });
            }
            let Some(chain) = next_buffer(queue, mem)? else {
                // No buffers: stop polling the host until the guest posts
                // some (a guest that takes nothing costs nothing).
                return Ok(Progress {
                    interrupt: used && queue.needs_notification(mem)?,
                    host_input: Some(false),
                    again: false,
                });
            };
            let head = chain.head_index();
            let mut writer = match chain.writer(mem) {
                Ok(w) => w,
                Err(_) => {
                    self.muxer.counts.refused += 1;
                    queue.add_used(mem, head, 0)?;
                    used = true;
                    continue;
                }
            };
            let room = writer.available_bytes();
            if room < HDR_LEN || (room == HDR_LEN && !self.muxer.has_control()) {
                // Too small for anything the host has (a header and at
                // least a byte of data, or a header alone for a control
                // packet). Left at the ring's head it would be found again
                // at every wakeup, and a readable host socket wakes the
                // thread at once: a busy loop for as long as the guest
                // likes. It goes back empty (a driver drops a used buffer
                // shorter than a header) and the next buffer is taken;
                // when none is left the host waits for the guest's next.
                self.metrics
                    .vsock_rx_small_buffers
                    .fetch_add(1, Ordering::Relaxed);
                queue.add_used(mem, head, 0)?;
                used = true;
                continue;
            }
            let Some((h, n)) = self.muxer.to_guest(room) else {
                queue.go_to_previous_position();
                break;
            };
            // `to_guest` sizes the packet to `room`.
            let ok = writer.write_all(&h.bytes()).is_ok()
                && writer.write_all(self.muxer.payload(n)).is_ok();
            let written = if ok { HDR_LEN + n } else { 0 };
            queue.add_used(mem, head, written as u32)?;
            used = true;
            if self.halt.requested() {
                break;
            }
        }
        self.count();
        Ok(Progress {
            interrupt: used && queue.needs_notification(mem)?,
            host_input: Some(true),
            again: false,
        })
    }

    /// Sends a restored device's transport reset, once an event buffer is
    /// there.
    fn event(&mut self, queue: &mut Queue, mem: &GuestMemory) -> Result<bool, DeviceError> {
        if !self.reset_pending {
            return Ok(false);
        }
        let Some(chain) = queue.pop_descriptor_chain(mem) else {
            return Ok(false);
        };
        let head = chain.head_index();
        let written = match chain.writer(mem) {
            Ok(mut w) => {
                if w.write_all(&TRANSPORT_RESET.to_le_bytes()).is_ok() {
                    4
                } else {
                    0
                }
            }
            Err(_) => 0,
        };
        queue.add_used(mem, head, written)?;
        self.reset_pending = false;
        self.reset_unacked = true;
        Ok(queue.needs_notification(mem)?)
    }
}

impl VirtioDevice for Vsock {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_VSOCK
    }

    fn features(&self) -> u64 {
        0
    }

    fn queue_max_sizes(&self) -> &'static [u16] {
        &[QUEUE_SIZE, QUEUE_SIZE, QUEUE_SIZE]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // struct virtio_vsock_config { le64 guest_cid; }
        read_space(&self.muxer.cid().to_le_bytes(), offset, data);
    }

    fn notified(
        &mut self,
        index: usize,
        queues: &mut [Queue],
        mem: &GuestMemory,
    ) -> Result<Progress, DeviceError> {
        match index {
            RX => self.host_input(queues, mem),
            EVENT => {
                // The guest posted its event buffer again: it handled the
                // reset (or never got one).
                self.reset_unacked = false;
                self.host_input(queues, mem)
            }
            TX => {
                let queue = queues.get_mut(TX).ok_or(DeviceError::NoQueue(TX))?;
                let (taken, again) = self.transmit(queue, mem)?;
                let tx_interrupt = taken && queue.needs_notification(mem)?;
                // The answers (a RESPONSE, a reset, credit) go out now.
                let mut p = self.host_input(queues, mem)?;
                p.interrupt |= tx_interrupt;
                p.again = again;
                Ok(p)
            }
            other => Err(DeviceError::NoQueue(other)),
        }
    }

    fn host_input(
        &mut self,
        queues: &mut [Queue],
        mem: &GuestMemory,
    ) -> Result<Progress, DeviceError> {
        let event = match queues.get_mut(EVENT) {
            Some(q) => self.event(q, mem)?,
            None => return Err(DeviceError::NoQueue(EVENT)),
        };
        let queue = queues.get_mut(RX).ok_or(DeviceError::NoQueue(RX))?;
        let mut p = self.receive(queue, mem)?;
        p.interrupt |= event;
        Ok(p)
    }

    fn host_fd(&self) -> Option<RawFd> {
        Some(self.muxer.fd())
    }

    fn set_halt(&mut self, halt: Halt) {
        self.halt = halt;
    }

    fn spec(&self) -> DeviceSpec {
        DeviceSpec::Vsock {
            cid: self.muxer.cid(),
            uds_path: self.muxer.uds_path().to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::packet::{HOST_CID, Op, TYPE_STREAM};
    use super::*;
    use crate::vmm::devices::virtio::drain::one_descriptor as one;
    use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{Address, Bytes, GuestAddress};

    struct Rig {
        dir: PathBuf,
        mem: GuestMemory,
        rx: MockSplitQueue<'static, GuestMemory>,
        tx: MockSplitQueue<'static, GuestMemory>,
        event: MockSplitQueue<'static, GuestMemory>,
        queues: Vec<Queue>,
        vsock: Vsock,
    }

    impl Drop for Rig {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn rig(name: &str, restored: bool) -> Rig {
        let mem: &'static GuestMemory = Box::leak(Box::new(
            GuestMemory::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap(),
        ));
        let rx = MockSplitQueue::create(mem, GuestAddress(0), 16);
        let tx = MockSplitQueue::create(mem, GuestAddress(0x8000), 16);
        let event = MockSplitQueue::create(mem, GuestAddress(0x10000), 16);
        let queues = vec![
            rx.create_queue().unwrap(),
            tx.create_queue().unwrap(),
            event.create_queue().unwrap(),
        ];
        let dir =
            std::env::temp_dir().join(format!("lwpvmm-vsockdev-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let config = VsockConfig {
            cid: 3,
            uds_path: dir.join("v.sock"),
        };
        let metrics = Arc::new(DeviceMetrics::default());
        let vsock = if restored {
            Vsock::restored(&config, metrics).unwrap()
        } else {
            Vsock::new(&config, metrics).unwrap()
        };
        Rig {
            dir,
            mem: mem.clone(),
            rx,
            tx,
            event,
            queues,
            vsock,
        }
    }

    /// A REQUEST from the guest to host port 52.
    fn request() -> [u8; HDR_LEN] {
        Header {
            src_cid: 3,
            dst_cid: HOST_CID,
            src_port: 1024,
            dst_port: 52,
            len: 0,
            kind: TYPE_STREAM,
            op: Op::Request,
            flags: 0,
            buf_alloc: 4096,
            fwd_cnt: 0,
        }
        .bytes()
    }

    #[test]
    fn a_packet_goes_through_the_queues_and_its_answer_waits_for_a_buffer() {
        let mut r = rig("queues", false);
        // (what the guest posts on the transmit queue, the answer's op;
        // None: no answer). Nobody listens on v.sock_52: a reset.
        let mut short = request().to_vec();
        short.truncate(20);
        let table: Vec<(Vec<u8>, Option<Op>)> =
            vec![(request().to_vec(), Some(Op::Rst)), (short, None)];
        for (i, (packet, answer)) in table.into_iter().enumerate() {
            let at = 0x20000 + 0x1000 * i as u64;
            r.mem.write_slice(&packet, GuestAddress(at)).unwrap();
            r.tx.add_desc_chains(&one(at, packet.len() as u32, 0), i as u16)
                .unwrap();
            // No receive buffer yet: the answer waits and the host is not
            // polled.
            let p = r.vsock.notified(TX, &mut r.queues, &r.mem).unwrap();
            assert!(p.interrupt, "the transmit chain went back");
            if answer.is_some() {
                assert_eq!(p.host_input, Some(false));
            }
            let buffer = 0x40000 + 0x1000 * i as u64;
            r.rx.add_desc_chains(&one(buffer, 4096, VRING_DESC_F_WRITE), i as u16)
                .unwrap();
            let p = r.vsock.notified(RX, &mut r.queues, &r.mem).unwrap();
            let mut got = [0u8; HDR_LEN];
            r.mem.read_slice(&mut got, GuestAddress(buffer)).unwrap();
            match answer {
                Some(op) => {
                    assert!(p.interrupt);
                    let h = Header::parse(&got).unwrap();
                    assert_eq!((h.op, h.src_port, h.dst_port, h.dst_cid), (op, 52, 1024, 3));
                }
                None => {
                    // Refused and counted; the buffer stays the guest's.
                    assert_eq!(r.vsock.metrics.device_errors.load(Ordering::Relaxed), 1);
                    assert_eq!(r.queues[RX].next_avail(), i as u16);
                }
            }
        }
        let mut cid = [0u8; 8];
        r.vsock.read_config(0, &mut cid);
        assert_eq!(u64::from_le_bytes(cid), 3);
    }

    /// The used ring's entry `i` of `q`: the length the device wrote.
    fn used_len(q: &MockSplitQueue<'static, GuestMemory>, mem: &GuestMemory, i: u16) -> u32 {
        mem.read_obj(q.used_addr().unchecked_add(4 + 8 * u64::from(i) + 4))
            .unwrap()
    }

    fn used_idx(q: &MockSplitQueue<'static, GuestMemory>, mem: &GuestMemory) -> u16 {
        mem.read_obj(q.used_addr().unchecked_add(2)).unwrap()
    }

    /// A guest that posts only receive buffers too small for a header and
    /// any payload while the host has bytes for it. Before, such a buffer
    /// stayed at the ring's head and the device asked to go on polling the
    /// host, whose readable socket woke the thread at once, for ever. Now
    /// each goes back empty and counted, one iteration of the receive loop
    /// each, and the device stops polling the host until the guest's next
    /// notification; a buffer of a header's size still carries a control
    /// packet, and an adequate buffer gets the bytes.
    #[test]
    fn small_receive_buffers_go_back_and_the_host_waits_for_the_next() {
        let mut r = rig("small", false);
        let listener = std::os::unix::net::UnixListener::bind(r.dir.join("v.sock_52")).unwrap();
        let (mut tx_desc, mut rx_desc) = (0u16, 0u16);
        let mut send = |r: &mut Rig, packet: &[u8]| {
            let at = 0x20000 + 0x1000 * u64::from(tx_desc);
            r.mem.write_slice(packet, GuestAddress(at)).unwrap();
            r.tx.add_desc_chains(&one(at, packet.len() as u32, 0), tx_desc)
                .unwrap();
            tx_desc += 1;
            r.vsock.notified(TX, &mut r.queues, &r.mem).unwrap()
        };
        let mut post = |r: &mut Rig, len: u32| {
            let at = 0x40000 + 0x1000 * u64::from(rx_desc);
            r.rx.add_desc_chains(&one(at, len, VRING_DESC_F_WRITE), rx_desc)
                .unwrap();
            rx_desc += 1;
            at
        };
        // The connection, its RESPONSE in a buffer of 4 KiB, and bytes from
        // the host process that no buffer posted below can carry.
        post(&mut r, 4096);
        send(&mut r, &request());
        assert_eq!(used_idx(&r.rx, &r.mem), 1, "the RESPONSE");
        let (mut host, _) = listener.accept().unwrap();
        host.write_all(b"pending").unwrap();
        let small = |r: &Rig| {
            r.vsock
                .metrics
                .vsock_rx_small_buffers
                .load(Ordering::Relaxed)
        };
        // (buffers posted at once, whether a control packet waits: a reset
        // for a REQUEST to a port nobody listens on; the op each buffer
        // gets, None when it goes back empty)
        let mut refused = request();
        refused[20..24].copy_from_slice(&99u32.to_le_bytes());
        type Row<'a> = (&'a [u32], bool, &'a [Option<Op>]);
        let table: [Row; 4] = [
            (&[44], false, &[None]),
            (&[20, 1, 44], false, &[None, None, None]),
            (&[0x10], true, &[None]),
            (&[44], false, &[Some(Op::Rst)]),
        ];
        let mut returned = 0;
        for (sizes, control, want) in table {
            if control {
                let p = send(&mut r, &refused);
                assert_eq!(p.host_input, Some(false), "no buffer for the reset yet");
            }
            let first = used_idx(&r.rx, &r.mem);
            let at: Vec<u64> = sizes.iter().map(|&len| post(&mut r, len)).collect();
            let p = r.vsock.notified(RX, &mut r.queues, &r.mem).unwrap();
            assert_eq!(
                (p.interrupt, p.host_input, p.again),
                (true, Some(false), false),
                "{sizes:?}: every buffer went back and the host waits"
            );
            assert_eq!(used_idx(&r.rx, &r.mem), first + sizes.len() as u16);
            for (i, (op, addr)) in want.iter().zip(at).enumerate() {
                let len = used_len(&r.rx, &r.mem, first + i as u16);
                match op {
                    None => {
                        assert_eq!(len, 0, "{sizes:?}");
                        returned += 1;
                    }
                    Some(op) => {
                        let mut got = [0u8; HDR_LEN];
                        r.mem.read_slice(&mut got, GuestAddress(addr)).unwrap();
                        assert_eq!((len, Header::parse(&got).unwrap().op), (44, *op));
                    }
                }
            }
            assert_eq!(small(&r), returned, "{sizes:?}");
            // Wakeups with nothing posted (the host socket is still
            // readable) take nothing and keep the host unpolled.
            for _ in 0..3 {
                let p = r.vsock.host_input(&mut r.queues, &r.mem).unwrap();
                assert_eq!((p.interrupt, p.host_input), (false, Some(false)));
            }
            assert_eq!(used_idx(&r.rx, &r.mem), first + sizes.len() as u16);
        }
        let at = post(&mut r, 4096);
        let first = used_idx(&r.rx, &r.mem);
        r.vsock.notified(RX, &mut r.queues, &r.mem).unwrap();
        assert_eq!(used_len(&r.rx, &r.mem, first), (HDR_LEN + 7) as u32);
        let mut got = vec![0u8; HDR_LEN + 7];
        r.mem.read_slice(&mut got, GuestAddress(at)).unwrap();
        let h = Header::parse(&got).unwrap();
        assert_eq!((h.op, h.len, &got[HDR_LEN..]), (Op::Rw, 7, &b"pending"[..]));
        assert_eq!(small(&r), 5);
    }

    #[test]
    fn a_restored_device_resets_the_guest_and_waits_for_it() {
        let mut r = rig("restored", true);
        r.event
            .add_desc_chains(&one(0x50000, 8, VRING_DESC_F_WRITE), 0)
            .unwrap();
        r.rx.add_desc_chains(&one(0x40000, 4096, VRING_DESC_F_WRITE), 0)
            .unwrap();
        let p = r.vsock.host_input(&mut r.queues, &r.mem).unwrap();
        assert!(p.interrupt);
        let mut event = [0xffu8; 4];
        r.mem.read_slice(&mut event, GuestAddress(0x50000)).unwrap();
        assert_eq!(u32::from_le_bytes(event), TRANSPORT_RESET);
        // Until the guest posts its event buffer again, nothing else goes
        // out and the host is not polled.
        r.mem
            .write_slice(&request(), GuestAddress(0x20000))
            .unwrap();
        r.tx.add_desc_chains(&one(0x20000, HDR_LEN as u32, 0), 0)
            .unwrap();
        let p = r.vsock.notified(TX, &mut r.queues, &r.mem).unwrap();
        assert_eq!(p.host_input, Some(false));
        assert_eq!(r.queues[RX].next_avail(), 0);
        r.event
            .add_desc_chains(&one(0x51000, 8, VRING_DESC_F_WRITE), 1)
            .unwrap();
        r.vsock.notified(EVENT, &mut r.queues, &r.mem).unwrap();
        assert_eq!(r.queues[RX].next_avail(), 1, "the reset's answer went out");
    }
}
