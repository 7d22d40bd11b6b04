//! The virtio devices' request paths on crafted queues: 64 KiB of guest RAM
//! filled with the input (descriptor tables, rings, buffers: all the
//! fuzzer's), queue addresses, size and indices from its first bytes, then
//! the block device and the network device's transmit and receive paths
//! run on them. Nothing may panic or hang, and a block device attached
//! read-only never writes its backend.
#![no_main]

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use lwpvmm::guard::GuestMemory;
use lwpvmm::vmm::base::metrics::DeviceMetrics;
use lwpvmm::vmm::devices::virtio::block::{Block, BlockBackend};
use lwpvmm::vmm::devices::virtio::mmio::VirtioDevice;
use lwpvmm::vmm::devices::virtio::net::{Net, Tap};
use virtio_queue::{Queue, QueueState};
use vm_memory::{Bytes, GuestAddress};

/// An in-memory disk that refuses to be written when read-only.
struct Disk {
    data: Vec<u8>,
    read_only: bool,
}

impl BlockBackend for Disk {
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let o = usize::try_from(offset).map_err(io::Error::other)?;
        let src = self.data.get(o..o + buf.len()).ok_or(io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(src);
        Ok(())
    }
    fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        assert!(!self.read_only, "a read-only disk was written");
        let o = usize::try_from(offset).map_err(io::Error::other)?;
        let dst = self.data.get_mut(o..o + buf.len()).ok_or(io::ErrorKind::UnexpectedEof)?;
        dst.copy_from_slice(buf);
        Ok(())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A tap with a few frames waiting.
struct FakeTap(Vec<Vec<u8>>);

impl Tap for FakeTap {
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let frame = self.0.pop().ok_or(io::ErrorKind::WouldBlock)?;
        let n = frame.len().min(buf.len());
        buf[..n].copy_from_slice(&frame[..n]);
        Ok(n)
    }
    fn send(&mut self, frame: &[u8]) -> io::Result<usize> {
        Ok(frame.len())
    }
    fn fd(&self) -> std::os::unix::io::RawFd {
        -1
    }
}

fn u16_at(d: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([d[at], d[at + 1]])
}

fn queue(d: &[u8], at: usize) -> Option<Queue> {
    let addr = |i: usize| u64::from(u16_at(d, at + i)) * 2;
    let state = QueueState {
        max_size: 256,
        next_avail: u16_at(d, at + 6),
        next_used: u16_at(d, at + 8),
        event_idx_enabled: d[at + 10] & 1 != 0,
        size: 1 << (d[at + 11] % 9),
        ready: true,
        desc_table: addr(0) & !15,
        avail_ring: addr(2) & !1,
        used_ring: addr(4) & !3,
    };
    Queue::try_from(state).ok()
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 64 {
        return;
    }
    let mem = GuestMemory::from_ranges(&[(GuestAddress(0), 0x10000)]).expect("guest memory");
    let _ = mem.write_slice(&data[64..data.len().min(64 + 0x10000)], GuestAddress(0));
    let metrics = Arc::new(DeviceMetrics::default());
    let read_only = data[63] & 1 != 0;
    let disk = Disk {
        data: vec![0; 64 << 10],
        read_only,
    };
    let mut block = Block::new(
        Box::new(disk),
        PathBuf::from("fuzz.img"),
        64 << 10,
        read_only,
        Arc::clone(&metrics),
    );
    if let Some(q) = queue(data, 0) {
        let _ = block.notified(0, &mut [q], &mem);
    }
    let tap = FakeTap(vec![data[..40].to_vec(); 3]);
    let mut net = Net::new(Box::new(tap), "fuzz".into(), None, [2, 0, 0, 0, 0, 1], metrics);
    if let (Some(rx), Some(tx)) = (queue(data, 16), queue(data, 32)) {
        let mut queues = [rx, tx];
        let _ = net.notified(1, &mut queues, &mem);
        let _ = net.host_input(&mut queues, &mem);
    }
});
