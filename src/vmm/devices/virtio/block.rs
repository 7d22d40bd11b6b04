//! The virtio block device (virtio 1.2, section 5.2) over a raw image:
//! reads, writes, flushes and the device ID, one request per descriptor
//! chain from the `virtio-queue` crate's Reader and Writer (which check every
//! buffer against guest RAM). Requests larger than the limits the device
//! advertises end with VIRTIO_BLK_S_IOERR; data moves through a bounded
//! buffer, so no request can grow lwpvmm's memory. A FLUSH completes only
//! after the backend's flush (fdatasync) returned: the writes, then
//! fdatasync, then the used-ring entry.

/// The dirty-bitmap slice of guest memory that descriptor chains carry.
type MemBitmap<'a> = vm_memory::bitmap::BS<'a, vm_memory::bitmap::AtomicBitmap>;

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::io::RawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_F_SIZE_MAX,
    VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_FLUSH,
    VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
};
use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::{DescriptorChain, Queue, QueueT};

use super::device::{DeviceError, DeviceSpec};
use super::drain::drain;
use super::mmio::{Halt, Progress, VirtioDevice, read_space};
use crate::guard::GuestMemory;
use crate::vmm::base::metrics::DeviceMetrics;

/// Sector size of the virtio block protocol.
pub const SECTOR: u64 = 512;
/// The queue's size.
const QUEUE_SIZE: u16 = 256;
/// Largest data segment the device accepts (VIRTIO_BLK_F_SIZE_MAX).
const SIZE_MAX: u32 = 128 << 10;
/// Most data segments in one request (VIRTIO_BLK_F_SEG_MAX): the queue
/// minus the header and status descriptors.
const SEG_MAX: u32 = QUEUE_SIZE as u32 - 2;
/// Largest request: what the two limits above allow.
pub const MAX_REQUEST: u64 = SIZE_MAX as u64 * SEG_MAX as u64;
/// The buffer data moves through between guest memory and the image.
const CHUNK: usize = 64 << 10;
/// The request header: type, reserved, sector.
const HEADER: usize = 16;
/// Bytes of the device ID (VIRTIO_BLK_ID_BYTES).
const ID_BYTES: usize = 20;

/// Where a block device's data lives.
pub trait BlockBackend: Send {
    /// Reads `buf.len()` bytes at `offset`.
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes `buf` at `offset`.
    fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes every completed write durable (fdatasync for a file).
    fn flush(&mut self) -> io::Result<()>;
}

impl BlockBackend for File {
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read_exact_at(buf, offset)
    }

    fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_all_at(buf, offset)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.sync_data()
    }
}

/// A virtio block device.
pub struct Block {
    backend: Box<dyn BlockBackend>,
    path: PathBuf,
    bytes: u64,
    read_only: bool,
    id: [u8; ID_BYTES],
    metrics: Arc<DeviceMetrics>,
    buf: Vec<u8>,
    halt: Halt,
}

/// One request's outcome: its status and how many bytes it wrote into the
/// guest's buffers (data and status).
struct Done {
    status: u32,
    written: u32,
}

impl Block {
    /// A device over `backend`, `bytes` long (whole sectors are used),
    /// known by `path` (its ID and snapshots name it).
    pub fn new(
        backend: Box<dyn BlockBackend>,
        path: PathBuf,
        bytes: u64,
        read_only: bool,
        metrics: Arc<DeviceMetrics>,
    ) -> Self {
        let mut id = [0u8; ID_BYTES];
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let n = name.len().min(ID_BYTES);
        id[..n].copy_from_slice(&name.as_bytes()[..n]);
        Block {
            backend,
            path,
            bytes,
            read_only,
            id,
            metrics,
            buf: vec![0; CHUNK],
            halt: Halt::default(),
        }
    }

    fn sectors(&self) -> u64 {
        self.bytes / SECTOR
    }

    /// Runs one request; `None` when the chain cannot even take a status
    /// byte (it is returned to the guest with nothing written).
    fn request(&mut self, chain: DescriptorChain<&GuestMemory>, mem: &GuestMemory) -> Option<Done> {
        let mut reader = chain.clone().reader(mem).ok()?;
        let mut writer = chain.writer(mem).ok()?;
        let data_len = writer.available_bytes().checked_sub(1)?;
        let mut status_writer = writer.split_at(data_len).ok()?;
        let mut header = [0u8; HEADER];
        let (status, data_written) = match reader.read_exact(&mut header) {
            Err(_) => (VIRTIO_BLK_S_IOERR, 0),
            Ok(()) => {
                let kind = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
                let mut sector = [0u8; 8];
                sector.copy_from_slice(&header[8..16]);
                let sector = u64::from_le_bytes(sector);
                self.execute(kind, sector, &mut reader, &mut writer, data_len)
            }
        };
        status_writer.write_all(&[status as u8]).ok()?;
        Some(Done {
            status,
            written: (data_written + 1) as u32,
        })
    }

    /// Checks a data transfer of `len` bytes at `sector`; its byte offset.
    fn range(&self, sector: u64, len: u64) -> Option<u64> {
        let end = sector.checked_mul(SECTOR)?.checked_add(len)?;
        (len.is_multiple_of(SECTOR) && len <= MAX_REQUEST && end <= self.sectors() * SECTOR)
            .then(|| sector * SECTOR)
    }

    /// Executes a request of `kind`: its status and the data bytes it
    /// wrote into the guest's buffers.
    fn execute(
        &mut self,
        kind: u32,
        sector: u64,
        reader: &mut virtio_queue::Reader<'_, MemBitmap<'_>>,
        writer: &mut virtio_queue::Writer<'_, MemBitmap<'_>>,
        data_len: usize,
    ) -> (u32, usize) {
        match kind {
            VIRTIO_BLK_T_IN => match self.range(sector, data_len as u64) {
                Some(offset) => match self.read(offset, writer, data_len) {
                    Ok(()) => {
                        self.metrics.disk_reads.fetch_add(1, Ordering::Relaxed);
                        (VIRTIO_BLK_S_OK, data_len)
                    }
                    Err(_) => (VIRTIO_BLK_S_IOERR, writer.bytes_written()),
                },
                None => (VIRTIO_BLK_S_IOERR, 0),
            },
            VIRTIO_BLK_T_OUT => {
                let len = reader.available_bytes();
                match self.range(sector, len as u64) {
                    Some(offset) if !self.read_only => match self.write(offset, reader) {
                        Ok(()) => {
                            self.metrics.disk_writes.fetch_add(1, Ordering::Relaxed);
                            (VIRTIO_BLK_S_OK, 0)
                        }
                        Err(_) => (VIRTIO_BLK_S_IOERR, 0),
                    },
                    _ => (VIRTIO_BLK_S_IOERR, 0),
                }
            }
            VIRTIO_BLK_T_FLUSH => match self.backend.flush() {
                Ok(()) => {
                    self.metrics.disk_flushes.fetch_add(1, Ordering::Relaxed);
                    (VIRTIO_BLK_S_OK, 0)
                }
                Err(_) => (VIRTIO_BLK_S_IOERR, 0),
            },
            VIRTIO_BLK_T_GET_ID => {
                let n = data_len.min(ID_BYTES);
                match writer.write_all(&self.id[..n]) {
                    Ok(()) => (VIRTIO_BLK_S_OK, n),
                    Err(_) => (VIRTIO_BLK_S_IOERR, 0),
                }
            }
            _ => (VIRTIO_BLK_S_UNSUPP, 0),
        }
    }

    fn read(
        &mut self,
        mut offset: u64,
        writer: &mut virtio_queue::Writer<'_, MemBitmap<'_>>,
        mut len: usize,
    ) -> io::Result<()> {
        while len > 0 {
            let n = len.min(CHUNK);
            self.backend.read_at(&mut self.buf[..n], offset)?;
            writer.write_all(&self.buf[..n])?;
            offset += n as u64;
            len -= n;
        }
        Ok(())
    }

    fn write(
        &mut self,
        mut offset: u64,
        reader: &mut virtio_queue::Reader<'_, MemBitmap<'_>>,
    ) -> io::Result<()> {
        loop {
            let n = reader.read(&mut self.buf)?;
            if n == 0 {
                return Ok(());
            }
            self.backend.write_at(&self.buf[..n], offset)?;
            offset += n as u64;
        }
    }
}

impl VirtioDevice for Block {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn features(&self) -> u64 {
        let ro = if self.read_only {
            1 << VIRTIO_BLK_F_RO
        } else {
            0
        };
        1 << VIRTIO_BLK_F_FLUSH
            | 1 << VIRTIO_BLK_F_SIZE_MAX
            | 1 << VIRTIO_BLK_F_SEG_MAX
            | 1 << VIRTIO_RING_F_EVENT_IDX
            | ro
    }

    fn queue_max_sizes(&self) -> &'static [u16] {
        &[QUEUE_SIZE]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // virtio_blk_config: capacity (sectors), size_max, seg_max.
        let mut config = [0u8; 16];
        config[..8].copy_from_slice(&self.sectors().to_le_bytes());
        config[8..12].copy_from_slice(&SIZE_MAX.to_le_bytes());
        config[12..16].copy_from_slice(&SEG_MAX.to_le_bytes());
        read_space(&config, offset, data);
    }

    fn notified(
        &mut self,
        index: usize,
        queues: &mut [Queue],
        mem: &GuestMemory,
    ) -> Result<Progress, DeviceError> {
        let queue = queues.get_mut(index).ok_or(DeviceError::NoQueue(index))?;
        let halt = self.halt.clone();
        let done = drain(queue, mem, &halt, |chain| match self.request(chain, mem) {
            Some(done) => {
                if done.status == VIRTIO_BLK_S_IOERR {
                    self.metrics.device_errors.fetch_add(1, Ordering::Relaxed);
                }
                done.written
            }
            None => {
                self.metrics.device_errors.fetch_add(1, Ordering::Relaxed);
                0
            }
        })?;
        Ok(Progress {
            interrupt: done.used && queue.needs_notification(mem)?,
            host_input: None,
            again: done.again,
        })
    }

    fn host_input(&mut self, _: &mut [Queue], _: &GuestMemory) -> Result<Progress, DeviceError> {
        Ok(Progress::default())
    }

    fn set_halt(&mut self, halt: Halt) {
        self.halt = halt;
    }

    fn host_fd(&self) -> Option<RawFd> {
        None
    }

    fn spec(&self) -> DeviceSpec {
        DeviceSpec::Block {
            path: self.path.clone(),
            bytes: self.bytes,
            read_only: self.read_only,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
    use virtio_queue::desc::{RawDescriptor, split::Descriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{Address, Bytes, GuestAddress};

    /// What the fake backend saw, in order.
    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Op {
        Write(u64, usize),
        /// A flush, with the used ring's index at the moment it ran.
        Flush {
            used_idx: u16,
        },
    }

    struct Fake {
        data: Vec<u8>,
        ops: Arc<Mutex<Vec<Op>>>,
        mem: GuestMemory,
        used_ring: GuestAddress,
    }

    impl BlockBackend for Fake {
        fn read_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            let o = offset as usize;
            buf.copy_from_slice(&self.data[o..o + buf.len()]);
            Ok(())
        }
        fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
            let o = offset as usize;
            self.data[o..o + buf.len()].copy_from_slice(buf);
            self.ops.lock().unwrap().push(Op::Write(offset, buf.len()));
            Ok(())
        }
        fn flush(&mut self) -> io::Result<()> {
            let used_idx: u16 = self.mem.read_obj(self.used_ring.unchecked_add(2)).unwrap();
            self.ops.lock().unwrap().push(Op::Flush { used_idx });
            Ok(())
        }
    }

    const HDR: u64 = 0x10000;
    const DATA: u64 = 0x11000;
    const STATUS: u64 = 0x20000;

    fn desc(addr: u64, len: u32, flags: u32, next: u16) -> RawDescriptor {
        RawDescriptor::from(Descriptor::new(addr, len, flags as u16, next))
    }

    /// A request chain at descriptor `first`: header, optional data,
    /// status.
    fn chain(first: u16, data: Option<(u32, bool)>) -> Vec<RawDescriptor> {
        let mut d = vec![desc(HDR, HEADER as u32, VRING_DESC_F_NEXT, first + 1)];
        if let Some((len, device_writes)) = data {
            let w = if device_writes { VRING_DESC_F_WRITE } else { 0 };
            d.push(desc(DATA, len, VRING_DESC_F_NEXT | w, first + 2));
        }
        let next = first + d.len() as u16;
        d.push(desc(STATUS, 1, VRING_DESC_F_WRITE, next));
        d
    }

    struct Rig {
        mem: GuestMemory,
        vq: MockSplitQueue<'static, GuestMemory>,
        queue: Queue,
        used_ring: GuestAddress,
        ops: Arc<Mutex<Vec<Op>>>,
        block: Block,
    }

    fn rig(read_only: bool) -> Rig {
        // The mock borrows the memory for the rig's life.
        let mem: &'static GuestMemory = Box::leak(Box::new(
            GuestMemory::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap(),
        ));
        let vq = MockSplitQueue::new(mem, 16);
        let queue: Queue = vq.create_queue().unwrap();
        let used_ring = vq.used_addr();
        let ops = Arc::new(Mutex::new(Vec::new()));
        let fake = Fake {
            data: vec![0; 64 << 10],
            ops: Arc::clone(&ops),
            mem: mem.clone(),
            used_ring,
        };
        let block = Block::new(
            Box::new(fake),
            PathBuf::from("/images/root.ext4"),
            64 << 10,
            read_only,
            Arc::new(DeviceMetrics::default()),
        );
        Rig {
            mem: mem.clone(),
            vq,
            queue,
            used_ring,
            ops,
            block,
        }
    }

    impl Rig {
        /// Posts one request and runs it: its status byte.
        fn run(&mut self, kind: u32, sector: u64, data: Option<(u32, bool)>) -> u8 {
            let mut header = [0u8; HEADER];
            header[..4].copy_from_slice(&kind.to_le_bytes());
            header[8..].copy_from_slice(&sector.to_le_bytes());
            self.mem.write_slice(&header, GuestAddress(HDR)).unwrap();
            self.mem.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
            self.vq.add_desc_chains(&chain(0, data), 0).unwrap();
            self.block
                .notified(0, std::slice::from_mut(&mut self.queue), &self.mem)
                .unwrap();
            self.mem.read_obj(GuestAddress(STATUS)).unwrap()
        }
    }

    /// A pause asked for during a storm of requests waits for the request
    /// at hand only: the drain stops after it and says to come back.
    #[test]
    fn a_halt_stops_the_drain_after_the_request_at_hand() {
        let mut r = rig(false);
        let mut header = [0u8; HEADER];
        header[..4].copy_from_slice(&VIRTIO_BLK_T_IN.to_le_bytes());
        r.mem.write_slice(&header, GuestAddress(HDR)).unwrap();
        let chains: Vec<RawDescriptor> = (0..4u16)
            .flat_map(|i| chain(i * 3, Some((4096, true))))
            .collect();
        r.vq.add_desc_chains(&chains, 0).unwrap();
        let halt = Halt::default();
        r.block.set_halt(halt.clone());
        let used = |r: &Rig| -> u16 { r.mem.read_obj(r.used_ring.unchecked_add(2)).unwrap() };
        // (halted, requests used afterwards, come back)
        let table = [(true, 1, true), (true, 2, true), (false, 4, false)];
        for (halted, want, again) in table {
            halt.set(halted);
            let progress = r
                .block
                .notified(0, std::slice::from_mut(&mut r.queue), &r.mem)
                .unwrap();
            assert_eq!((used(&r), progress.again), (want, again), "halted {halted}");
        }
    }

    #[test]
    fn a_flush_completes_only_after_the_backend_flushed() {
        let mut r = rig(false);
        r.mem.write_slice(&[7u8; 1024], GuestAddress(DATA)).unwrap();
        assert_eq!(r.run(VIRTIO_BLK_T_OUT, 2, Some((1024, false))), 0);
        assert_eq!(r.run(VIRTIO_BLK_T_FLUSH, 0, None), 0);
        let used_after: u16 = r.mem.read_obj(r.used_ring.unchecked_add(2)).unwrap();
        assert_eq!(used_after, 2, "the flush is in the used ring afterwards");
        assert_eq!(
            *r.ops.lock().unwrap(),
            vec![Op::Write(1024, 1024), Op::Flush { used_idx: 1 }],
            "the write, then fdatasync while the flush was not yet used"
        );
        assert_eq!(r.block.metrics.disk_flushes.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn requests_and_their_statuses() {
        let s = |v: u32| v as u8;
        // (read-only, type, sector, data (length, device-writable), status)
        let table = [
            (
                false,
                VIRTIO_BLK_T_IN,
                0,
                Some((4096, true)),
                s(VIRTIO_BLK_S_OK),
            ),
            (
                false,
                VIRTIO_BLK_T_OUT,
                0,
                Some((512, false)),
                s(VIRTIO_BLK_S_OK),
            ),
            (
                true,
                VIRTIO_BLK_T_OUT,
                0,
                Some((512, false)),
                s(VIRTIO_BLK_S_IOERR),
            ),
            (
                true,
                VIRTIO_BLK_T_IN,
                0,
                Some((512, true)),
                s(VIRTIO_BLK_S_OK),
            ),
            // Past the end of the disk, or not whole sectors.
            (
                false,
                VIRTIO_BLK_T_IN,
                127,
                Some((1024, true)),
                s(VIRTIO_BLK_S_IOERR),
            ),
            (
                false,
                VIRTIO_BLK_T_IN,
                u64::MAX / 2,
                Some((512, true)),
                s(VIRTIO_BLK_S_IOERR),
            ),
            (
                false,
                VIRTIO_BLK_T_OUT,
                0,
                Some((100, false)),
                s(VIRTIO_BLK_S_IOERR),
            ),
            (
                false,
                VIRTIO_BLK_T_GET_ID,
                0,
                Some((20, true)),
                s(VIRTIO_BLK_S_OK),
            ),
            (false, 99, 0, None, s(VIRTIO_BLK_S_UNSUPP)),
        ];
        for (ro, kind, sector, data, want) in table {
            let mut r = rig(ro);
            assert_eq!(
                r.run(kind, sector, data),
                want,
                "{kind} {sector} {data:?} ro={ro}"
            );
        }
        let mut r = rig(false);
        r.run(VIRTIO_BLK_T_GET_ID, 0, Some((20, true)));
        let mut id = [0u8; 9];
        r.mem.read_slice(&mut id, GuestAddress(DATA)).unwrap();
        assert_eq!(&id, b"root.ext4");
    }

    #[test]
    fn the_config_space_names_capacity_and_limits() {
        let r = rig(true);
        let mut cap = [0u8; 8];
        r.block.read_config(0, &mut cap);
        assert_eq!(u64::from_le_bytes(cap), 128);
        let mut past = [0xffu8; 4];
        r.block.read_config(u64::MAX, &mut past);
        assert_eq!(past, [0; 4]);
        assert_ne!(r.block.features() & 1 << VIRTIO_BLK_F_RO, 0);
    }
}
