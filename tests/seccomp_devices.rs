//! seccomp on the device threads a guest drives: every path a guest can
//! reach on the vsock thread, and on the disk and network thread, stays
//! inside that thread's allowlist. The real threads run (worker.rs's
//! `DeviceThread`, each installing its own filter in trap mode, with
//! lwpvmm's logger) over a `VirtioBus` on a KVM VM. This test is their
//! guest: it sets each transport up through its registers, writes
//! descriptor chains into guest memory and signals the queues' ioeventfds,
//! as KVM does on a guest's QueueNotify write. It is also the host
//! processes on the other side of the vsock socket and of the tap.
//!
//! A call outside a thread's list ends the process with status 2 and a line
//! naming the thread and the call, so each scenario runs in a child process
//! (this test binary, told by an environment variable which scenario), and
//! the parent checks that it got to its end. The disk and network scenario
//! needs root (a network namespace and a tap, /dev/net/tun and `ip`); both
//! need /dev/kvm. Each fails saying what is missing.

// A test: a failed setup or expectation stops it with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{NamespaceGuard, ip};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::UdpSocket;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use lwpvmm::guard::GuestMemory;
use lwpvmm::vmm::base::seccomp::SeccompMode;
use lwpvmm::vmm::devices::virtio::vsock::VsockConfig;
use lwpvmm::vmm::devices::virtio::vsock::muxer::{BUF_ALLOC, MAX_CONNECTIONS};
use lwpvmm::vmm::devices::virtio::vsock::packet::{
    HDR_LEN, HOST_CID, Header, Op, SHUTDOWN_RCV, SHUTDOWN_SEND, TYPE_STREAM,
};
use lwpvmm::vmm::devices::virtio::worker::DeviceThread;
use lwpvmm::vmm::devices::virtio::{DiskConfig, NetConfig, VirtioBus};
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
};
use vm_memory::{Bytes, GuestAddress};

/// The environment variable that makes this binary a child, and names its
/// scenario.
const CHILD: &str = "LWPVMM_SECCOMP_DEVICES";
/// What a child prints when it got to its end.
const DONE: &str = "every guest path ran";
/// How long one step may take before the child gives up.
const STEP: Duration = Duration::from_secs(20);

// The virtio-mmio registers (virtio 1.2, 4.2.2) the driver writes.
const REG_DEVICE_FEATURES: u64 = 0x010;
const REG_DEVICE_FEATURES_SEL: u64 = 0x014;
const REG_DRIVER_FEATURES: u64 = 0x020;
const REG_DRIVER_FEATURES_SEL: u64 = 0x024;
const REG_QUEUE_SEL: u64 = 0x030;
const REG_QUEUE_NUM: u64 = 0x038;
const REG_QUEUE_READY: u64 = 0x044;
const REG_STATUS: u64 = 0x070;
const REG_QUEUE_DESC_LOW: u64 = 0x080;
const REG_QUEUE_AVAIL_LOW: u64 = 0x090;
const REG_QUEUE_USED_LOW: u64 = 0x0a0;
const STATUS_DRIVER_READY: u32 = 1 | 2 | 8;
const STATUS_DRIVER_OK: u32 = 4;
const STATUS_NEEDS_RESET: u32 = 0x40;
/// VIRTIO_F_VERSION_1, feature bit 32: bit 0 of the features' high word.
const VIRTIO_F_VERSION_1_HIGH: u32 = 1;
const VIRTIO_RING_F_EVENT_IDX: u32 = 1 << 29;

/// Each queue's size here, and its chains' most descriptors.
const QUEUE: u16 = 128;
const CHAIN: u16 = 4;
const SLOTS: u16 = QUEUE / CHAIN;
/// Bytes of guest memory each chain slot's buffers may use.
const SLOT_BYTES: u64 = 0x2_0000;
/// Each queue's guest memory: rings, then its slots' buffers.
const QUEUE_BYTES: u64 = 0x50_0000;
/// Guest RAM: three queues' worth after the first MiB.
const GUEST_BYTES: usize = 16 << 20;

/// A buffer of a chain: bytes the device reads, or room it writes.
enum Buf<'a> {
    Out(&'a [u8]),
    In(u32),
}

/// One split virtqueue as its driver sees it.
struct Ring {
    base: u64,
    avail_idx: u16,
    used_idx: u16,
    pushed: u64,
    /// Each slot's buffers (address, length), while the device has them.
    slots: Vec<Option<Vec<(u64, u32)>>>,
}

impl Ring {
    fn new(index: u64) -> Ring {
        Ring {
            base: 0x10_0000 + index * QUEUE_BYTES,
            avail_idx: 0,
            used_idx: 0,
            pushed: 0,
            slots: (0..SLOTS).map(|_| None).collect(),
        }
    }

    fn desc(&self) -> u64 {
        self.base
    }

    fn avail(&self) -> u64 {
        self.base + 0x800
    }

    fn used(&self) -> u64 {
        self.base + 0x1000
    }

    /// Makes a chain of `bufs` available.
    fn push(&mut self, mem: &GuestMemory, bufs: &[Buf]) {
        assert!(!bufs.is_empty() && bufs.len() <= usize::from(CHAIN));
        let slot = (0..SLOTS)
            .map(|i| ((self.pushed + u64::from(i)) % u64::from(SLOTS)) as u16)
            .find(|&s| self.slots[usize::from(s)].is_none())
            .expect("a free chain slot: the device holds every one");
        self.pushed += 1;
        let mut at = self.base + 0x1_0000 + u64::from(slot) * SLOT_BYTES;
        let mut parts = Vec::new();
        for (i, b) in bufs.iter().enumerate() {
            let (len, flags) = match b {
                Buf::Out(bytes) => {
                    mem.write_slice(bytes, GuestAddress(at)).unwrap();
                    (bytes.len() as u32, 0u16)
                }
                Buf::In(n) => (*n, 2),
            };
            let index = slot * CHAIN + i as u16;
            let next = if i + 1 < bufs.len() { 1 } else { 0 };
            let d = self.desc() + 16 * u64::from(index);
            mem.write_obj(at, GuestAddress(d)).unwrap();
            mem.write_obj(len, GuestAddress(d + 8)).unwrap();
            mem.write_obj(flags | next, GuestAddress(d + 12)).unwrap();
            mem.write_obj(index + 1, GuestAddress(d + 14)).unwrap();
            parts.push((at, len));
            at += u64::from(len).next_multiple_of(64);
        }
        assert!(at <= self.base + 0x1_0000 + u64::from(slot + 1) * SLOT_BYTES);
        self.slots[usize::from(slot)] = Some(parts);
        let entry = self.avail() + 4 + 2 * u64::from(self.avail_idx % QUEUE);
        mem.write_obj(slot * CHAIN, GuestAddress(entry)).unwrap();
        self.avail_idx = self.avail_idx.wrapping_add(1);
        mem.store(
            self.avail_idx,
            GuestAddress(self.avail() + 2),
            Ordering::Release,
        )
        .unwrap();
    }

    /// The chains the device returned since the last call: each one's
    /// buffers and the length it wrote.
    fn take(&mut self, mem: &GuestMemory) -> Vec<(Vec<(u64, u32)>, u32)> {
        let idx: u16 = mem
            .load(GuestAddress(self.used() + 2), Ordering::Acquire)
            .unwrap();
        let mut out = Vec::new();
        while self.used_idx != idx {
            let e = self.used() + 4 + 8 * u64::from(self.used_idx % QUEUE);
            let id: u32 = mem.read_obj(GuestAddress(e)).unwrap();
            let len: u32 = mem.read_obj(GuestAddress(e + 4)).unwrap();
            let slot = (id / u32::from(CHAIN)) as usize;
            let parts = self.slots[slot].take().expect("a chain the device held");
            out.push((parts, len));
            self.used_idx = self.used_idx.wrapping_add(1);
        }
        out
    }

    /// Chains the device still holds.
    fn held(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }
}

/// Waits for `what` to hold, or stops the child saying what it waited for.
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + STEP;
    while !done() {
        assert!(Instant::now() < deadline, "waited {STEP:?} for {what}");
        thread::sleep(Duration::from_millis(1));
    }
}

/// One device on the bus, driven by this test.
struct Driver<'a> {
    bus: &'a VirtioBus,
    mem: &'a GuestMemory,
    slot: usize,
    rings: Vec<Ring>,
}

impl<'a> Driver<'a> {
    /// Sets slot `slot`'s device up with queues `first..first + n` of guest
    /// memory, accepting EVENT_IDX where it is offered (as Linux does).
    fn new(bus: &'a VirtioBus, mem: &'a GuestMemory, slot: usize, first: u64, n: u64) -> Self {
        let d = Driver {
            bus,
            mem,
            slot,
            rings: (first..first + n).map(Ring::new).collect(),
        };
        d.activate();
        d
    }

    /// Slot `slot`'s device restored from a snapshot, its rings as this
    /// driver left them.
    fn restored(bus: &'a VirtioBus, mem: &'a GuestMemory, slot: usize, rings: Vec<Ring>) -> Self {
        Driver {
            bus,
            mem,
            slot,
            rings,
        }
    }

    fn write(&self, reg: u64, v: u32) {
        let base = self.bus.slots()[self.slot].base;
        assert!(self.bus.write(base + reg, &v.to_le_bytes(), self.mem));
    }

    fn read(&self, reg: u64) -> u32 {
        let base = self.bus.slots()[self.slot].base;
        let mut v = [0u8; 4];
        assert!(self.bus.read(base + reg, &mut v));
        u32::from_le_bytes(v)
    }

    fn activate(&self) {
        self.write(REG_STATUS, 0);
        self.write(REG_STATUS, 1);
        self.write(REG_STATUS, 1 | 2);
        self.write(REG_DEVICE_FEATURES_SEL, 0);
        let offered = self.read(REG_DEVICE_FEATURES);
        self.write(REG_DRIVER_FEATURES_SEL, 0);
        self.write(REG_DRIVER_FEATURES, offered & VIRTIO_RING_F_EVENT_IDX);
        self.write(REG_DRIVER_FEATURES_SEL, 1);
        self.write(REG_DRIVER_FEATURES, VIRTIO_F_VERSION_1_HIGH);
        self.write(REG_STATUS, STATUS_DRIVER_READY);
        for (q, r) in self.rings.iter().enumerate() {
            self.write(REG_QUEUE_SEL, q as u32);
            self.write(REG_QUEUE_NUM, u32::from(QUEUE));
            self.write(REG_QUEUE_DESC_LOW, r.desc() as u32);
            self.write(REG_QUEUE_AVAIL_LOW, r.avail() as u32);
            self.write(REG_QUEUE_USED_LOW, r.used() as u32);
            self.write(REG_QUEUE_READY, 1);
        }
        self.write(REG_STATUS, STATUS_DRIVER_READY | STATUS_DRIVER_OK);
        assert_eq!(
            self.read(REG_STATUS),
            STATUS_DRIVER_READY | STATUS_DRIVER_OK,
            "device {} activated",
            self.slot
        );
    }

    /// Signals queue `q`'s ioeventfd, as KVM does on the guest's write.
    fn notify(&self, q: usize) {
        self.bus.slots()[self.slot].notify[q].write(1).unwrap();
    }

    fn push(&mut self, q: usize, bufs: &[Buf]) {
        self.rings[q].push(self.mem, bufs);
    }

    /// Pushes `bufs` on queue `q`, notifies it and waits for the chain.
    fn request(&mut self, q: usize, bufs: &[Buf]) -> (Vec<(u64, u32)>, u32) {
        self.push(q, bufs);
        self.notify(q);
        let mut got = Vec::new();
        wait_for("the device to return a chain", || {
            got.extend(self.rings[q].take(self.mem));
            !got.is_empty()
        });
        got.remove(0)
    }

    fn bytes(&self, (addr, len): (u64, u32)) -> Vec<u8> {
        let mut b = vec![0u8; len as usize];
        self.mem.read_slice(&mut b, GuestAddress(addr)).unwrap();
        b
    }

    /// Announces chains the ring does not hold (the available index far
    /// ahead): the device thread logs the failure (one rate-limited line)
    /// and the device needs a reset.
    fn break_ring(&mut self, q: usize) {
        let r = &mut self.rings[q];
        r.avail_idx = r.avail_idx.wrapping_add(QUEUE * 4);
        self.mem
            .store(r.avail_idx, GuestAddress(r.avail() + 2), Ordering::Release)
            .unwrap();
        self.notify(q);
        wait_for("the broken ring to need a reset", || {
            self.read(REG_STATUS) & STATUS_NEEDS_RESET != 0
        });
    }
}

/// lwpvmm's logger as its `main` sets it up (no colours, lines through the
/// log sink, virtio-queue's own lines off), so the device threads' log
/// lines take the real path.
fn logger() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .write_style(env_logger::WriteStyle::Never)
        .target(env_logger::Target::Pipe(Box::new(lwpvmm::log_sink::Sink)))
        .filter_module("virtio_queue", log::LevelFilter::Off)
        .init();
}

/// A VM with an interrupt controller, for the devices' irqfds and
/// ioeventfds.
fn vm(kvm: &kvm_ioctls::Kvm) -> kvm_ioctls::VmFd {
    let vm = kvm.create_vm().expect("a KVM VM");
    vm.create_irq_chip().expect("an irqchip");
    vm
}

fn memory() -> Arc<GuestMemory> {
    Arc::new(GuestMemory::from_ranges(&[(GuestAddress(0), GUEST_BYTES)]).unwrap())
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lwpvmm-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const RX: usize = 0;
const TX: usize = 1;
const EVENT: usize = 2;
/// The guest's context ID.
const CID: u64 = 3;
/// Receive buffers the guest keeps posted: a header and 4 KiB, as Linux's.
const RX_BUFFERS: usize = 16;
const RX_ROOM: u32 = HDR_LEN as u32 + 4096;

/// The guest's side of a vsock device.
struct Guest<'a> {
    d: Driver<'a>,
    /// Packets received and not looked at yet.
    got: VecDeque<(Header, Vec<u8>)>,
    /// Whether `receive` keeps [`RX_BUFFERS`] buffers posted.
    stock: bool,
}

impl<'a> Guest<'a> {
    fn packet(src_port: u32, dst_port: u32, op: Op, flags: u32, payload: &[u8]) -> Vec<u8> {
        let mut p = Header {
            src_cid: CID,
            dst_cid: HOST_CID,
            src_port,
            dst_port,
            len: payload.len() as u32,
            kind: TYPE_STREAM,
            op,
            flags,
            buf_alloc: 1 << 20,
            fwd_cnt: 0,
        }
        .bytes()
        .to_vec();
        p.extend_from_slice(payload);
        p
    }

    /// Keeps the receive queue stocked and takes what came back.
    fn receive(&mut self) {
        for (parts, len) in self.d.rings[RX].take(self.d.mem) {
            let bytes = self.d.bytes((parts[0].0, len.min(parts[0].1)));
            if let Ok(h) = Header::parse(&bytes) {
                self.got.push_back((h, bytes[HDR_LEN..].to_vec()));
            }
        }
        let posted = self.d.rings[RX].held();
        if !self.stock {
            return;
        }
        for _ in posted..RX_BUFFERS {
            self.d.push(RX, &[Buf::In(RX_ROOM)]);
        }
        if posted < RX_BUFFERS {
            self.d.notify(RX);
        }
    }

    /// Sends packets on the transmit queue and waits until the device has
    /// taken them all.
    fn send(&mut self, packets: &[Vec<u8>]) {
        for chunk in packets.chunks(usize::from(SLOTS) / 2) {
            for p in chunk {
                self.d.push(TX, &[Buf::Out(p)]);
            }
            self.d.notify(TX);
            wait_for("the device to take the packets", || {
                self.d.rings[TX].take(self.d.mem);
                self.d.rings[TX].held() == 0
            });
            self.receive();
        }
    }

    /// Waits for a packet that `want` accepts; the ones before it are
    /// dropped.
    fn expect(&mut self, what: &str, want: impl Fn(&Header, &[u8]) -> bool) -> (Header, Vec<u8>) {
        let mut found = None;
        wait_for(what, || {
            self.receive();
            while let Some((h, p)) = self.got.pop_front() {
                if want(&h, &p) {
                    found = Some((h, p));
                    return true;
                }
            }
            false
        });
        found.unwrap()
    }

    fn connect(&mut self, port: u32) {
        self.send(&[Self::packet(port, 52, Op::Request, 0, &[])]);
        self.expect("the RESPONSE", |h, _| {
            h.op == Op::Response && h.dst_port == port
        });
    }
}

/// The host process listening on port 52: it takes every connection and
/// reads from none unless asked to.
fn listen(path: &Path) -> Arc<Mutex<Vec<UnixStream>>> {
    let listener = UnixListener::bind(path).unwrap();
    let streams = Arc::new(Mutex::new(Vec::new()));
    let theirs = Arc::clone(&streams);
    thread::spawn(move || {
        for s in listener.incoming().flatten() {
            theirs.lock().unwrap().push(s);
        }
    });
    streams
}

/// The next connection the host process accepted.
fn accepted(streams: &Mutex<Vec<UnixStream>>) -> UnixStream {
    let mut s = None;
    wait_for("the host process to accept", || {
        s = streams.lock().unwrap().pop();
        s.is_some()
    });
    s.unwrap()
}

/// Every guest-reachable vsock path, then a restored device's transport
/// reset, on the real vsock thread.
fn vsock_child() {
    let kvm = kvm_ioctls::Kvm::new().expect("/dev/kvm");
    let dir = scratch("seccomp-vsock");
    let uds = dir.join("v.sock");
    let streams = listen(&dir.join("v.sock_52"));
    let config = VsockConfig {
        cid: CID,
        uds_path: uds.clone(),
    };
    let first = vm(&kvm);
    let bus = VirtioBus::create(&first, &[], &[], Some(&config), None).unwrap();
    let mem = memory();
    let threads = DeviceThread::start(&bus, Arc::clone(&mem), SeccompMode::On)
        .unwrap()
        .expect("the vsock thread");
    let mut g = Guest {
        d: Driver::new(&bus, &mem, 0, 0, 3),
        got: VecDeque::new(),
        stock: true,
    };
    g.receive();

    // A connection to host port 52; data both ways; credit asked and given.
    g.connect(1000);
    let mut host = accepted(&streams);
    g.send(&[Guest::packet(1000, 52, Op::Rw, 0, b"from the guest")]);
    let mut buf = [0u8; 14];
    host.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"from the guest");
    host.write_all(b"from the host").unwrap();
    g.expect("the host's bytes", |h, p| {
        h.op == Op::Rw && p == b"from the host"
    });
    g.send(&[
        Guest::packet(1000, 52, Op::CreditRequest, 0, &[]),
        Guest::packet(1000, 52, Op::CreditUpdate, 0, &[]),
    ]);
    g.expect("the CREDIT_UPDATE", |h, _| h.op == Op::CreditUpdate);

    // A host process connects through the socket and the guest accepts.
    let mut client = UnixStream::connect(&uds).unwrap();
    client.write_all(b"CONNECT 1234\n").unwrap();
    let (req, _) = g.expect("the host's REQUEST", |h, _| {
        h.op == Op::Request && h.dst_port == 1234
    });
    let accept = Header {
        src_cid: CID,
        dst_cid: HOST_CID,
        src_port: 1234,
        dst_port: req.src_port,
        len: 0,
        kind: TYPE_STREAM,
        op: Op::Response,
        flags: 0,
        buf_alloc: 1 << 20,
        fwd_cnt: 0,
    };
    g.send(&[accept.bytes().to_vec()]);
    let mut ok = [0u8; 3];
    client.read_exact(&mut ok).unwrap();
    assert_eq!(&ok, b"OK ");
    let mut reset = accept;
    reset.op = Op::Rst;
    g.send(&[reset.bytes().to_vec()]);

    // Packets the device refuses: short, an unknown op, another CID, a
    // length past the packet, data for no connection.
    let mut unknown = Guest::packet(1001, 52, Op::Rw, 0, &[]);
    unknown[30] = 99;
    let mut other_cid = Guest::packet(1001, 52, Op::Request, 0, &[]);
    other_cid[0] = 7;
    let mut long = Guest::packet(1001, 52, Op::Rw, 0, b"abc");
    long[24] = 200;
    g.send(&[
        vec![0u8; 20],
        unknown,
        other_cid,
        long,
        Guest::packet(1001, 52, Op::Rw, 0, b"nobody"),
        Guest::packet(1001, 53, Op::Request, 0, &[]),
    ]);

    // Many connections, each sent to the edge of its credit while its host
    // process reads nothing (the device holds what the host did not take),
    // then each past it: each is reset and its bytes are freed. One goes
    // first on its own: freeing its buffer raises glibc's mmap threshold,
    // so the next ones live in the thread's heap, and that heap shrinking
    // after their resets is what made glibc open
    // /proc/sys/vm/overcommit_memory (issue 44, 6).
    let payload = vec![0x5a_u8; 64 << 10];
    let rw = |port, n| -> Vec<Vec<u8>> {
        (0..n)
            .map(|_| Guest::packet(port, 52, Op::Rw, 0, &payload))
            .collect()
    };
    // What the host socket's buffer takes, then up to the credit; and
    // enough past it for the reset.
    let edge = (BUF_ALLOC as usize + (192 << 10)) / payload.len();
    let past = (BUF_ALLOC as usize + (512 << 10)) / payload.len();
    for ports in [1999..2000, 2000..2064] {
        for port in ports.clone() {
            g.connect(port);
            g.send(&rw(port, edge));
        }
        for port in ports {
            g.send(&rw(port, past - edge));
            g.expect("the credit overrun's reset", |h, _| {
                h.op == Op::Rst && h.dst_port == port
            });
        }
    }

    // More connections than the device keeps: the last ones are refused
    // with a reset; then the guest resets them all.
    let ports = 6000..6000 + MAX_CONNECTIONS as u32 + 8;
    let requests: Vec<Vec<u8>> = ports
        .clone()
        .map(|port| Guest::packet(port, 52, Op::Request, 0, &[]))
        .collect();
    g.send(&requests);
    let last = ports.end - 1;
    g.expect("the reset past the connection limit", |h, _| {
        h.op == Op::Rst && h.dst_port == last
    });
    let resets: Vec<Vec<u8>> = ports
        .map(|port| Guest::packet(port, 52, Op::Rst, 0, &[]))
        .collect();
    g.send(&resets);

    // Both shutdowns on the first connection: the host sees its end.
    g.send(&[Guest::packet(1000, 52, Op::Shutdown, SHUTDOWN_SEND, &[])]);
    let mut rest = Vec::new();
    host.read_to_end(&mut rest).unwrap();
    g.send(&[Guest::packet(
        1000,
        52,
        Op::Shutdown,
        SHUTDOWN_RCV | SHUTDOWN_SEND,
        &[],
    )]);
    g.expect("the reset after both shutdowns", |h, _| {
        h.op == Op::Rst && h.dst_port == 1000
    });

    // Receive buffers too small for a header and any payload while the
    // host has bytes: the device hands each back empty and counts it, then
    // waits for the guest's next buffer, which gets the bytes.
    streams.lock().unwrap().clear();
    g.connect(3000);
    let mut small_host = accepted(&streams);
    g.stock = false;
    let held = g.d.rings[RX].held();
    let refused: Vec<Vec<u8>> = (0..held as u32)
        .map(|i| Guest::packet(5000 + i, 99, Op::Request, 0, &[]))
        .collect();
    g.send(&refused);
    wait_for("the stocked buffers to carry the resets", || {
        g.receive();
        g.d.rings[RX].held() == 0
    });
    small_host.write_all(b"pending").unwrap();
    let sizes = [44, 20, 1, 44];
    for &len in &sizes {
        g.d.push(RX, &[Buf::In(len)]);
    }
    g.d.notify(RX);
    let mut back = Vec::new();
    wait_for("the small buffers to come back", || {
        back.extend(g.d.rings[RX].take(g.d.mem));
        back.len() == sizes.len()
    });
    assert!(back.iter().all(|(_, len)| *len == 0), "{back:?}");
    let small = &bus.slots()[0].metrics.vsock_rx_small_buffers;
    assert_eq!(small.load(Ordering::Relaxed), sizes.len() as u64);
    g.stock = true;
    g.expect("the pending bytes", |h, p| {
        h.op == Op::Rw && h.dst_port == 3000 && p == b"pending"
    });

    threads.pause().unwrap();
    threads.resume().unwrap();
    threads.finish().unwrap();

    // The same device restored: its guest gets the transport reset first
    // and takes it; then a connection, and a broken ring, which the thread
    // logs.
    let saved = bus.snapshot().unwrap();
    let rings = std::mem::take(&mut g.d.rings);
    drop(g);
    drop(bus);
    std::fs::remove_file(&uds).unwrap();
    let second = vm(&kvm);
    let bus = VirtioBus::restore(&second, &saved, &mem, &Default::default()).unwrap();
    let threads = DeviceThread::start(&bus, Arc::clone(&mem), SeccompMode::On)
        .unwrap()
        .expect("the vsock thread");
    let mut g = Guest {
        d: Driver::restored(&bus, &mem, 0, rings),
        got: VecDeque::new(),
        stock: true,
    };
    let (event, len) = g.d.request(EVENT, &[Buf::In(8)]);
    assert_eq!(len, 4);
    assert_eq!(
        g.d.bytes((event[0].0, 4)),
        0u32.to_le_bytes(),
        "TRANSPORT_RESET"
    );
    g.d.push(EVENT, &[Buf::In(8)]);
    g.d.notify(EVENT);
    g.connect(4000);
    g.d.break_ring(TX);
    threads.finish().unwrap();
}

/// The tap of the disk and network scenario, in its own network namespace,
/// with the address the host side sends from and a neighbour (the guest,
/// which answers no ARP) that its frames go to.
const TAP: &str = "lwpscdev0";
const HOST_IP: &str = "172.31.7.1";
const GUEST_IP: &str = "172.31.7.2";

/// A block request: its type and sector, then its data buffers.
fn block_header(kind: u32, sector: u64) -> Vec<u8> {
    let mut h = kind.to_le_bytes().to_vec();
    h.extend_from_slice(&[0; 4]);
    h.extend_from_slice(&sector.to_le_bytes());
    h
}

/// Every guest-reachable path of the disk and network thread: reads,
/// writes, flushes, the ID, requests it refuses, frames both ways, a
/// buffer too small for a frame, a frame too long, a broken ring.
fn devices_child() {
    let kvm = kvm_ioctls::Kvm::new().expect("/dev/kvm");
    let dir = scratch("seccomp-devices");
    let image = dir.join("disk.img");
    std::fs::write(&image, vec![0u8; 1 << 20]).unwrap();
    let vm = vm(&kvm);
    let disk = DiskConfig {
        path: image,
        read_only: false,
    };
    let net = NetConfig {
        id: None,
        tap: TAP.into(),
        mac: None,
    };
    let bus = VirtioBus::create(&vm, &[disk], &[net], None, None).unwrap();
    let mem = memory();
    let threads = DeviceThread::start(&bus, Arc::clone(&mem), SeccompMode::On)
        .unwrap()
        .expect("the device thread");
    let mut block = Driver::new(&bus, &mem, 0, 0, 1);
    let mut net = Driver::new(&bus, &mem, 1, 1, 2);

    // (type, sector, data buffers: bytes to write or room to read, the
    // status the device answers)
    let data = vec![0xa5_u8; 4096];
    let table: Vec<(u32, u64, Vec<Buf>, u8)> = vec![
        (VIRTIO_BLK_T_OUT, 0, vec![Buf::Out(&data)], 0),
        (VIRTIO_BLK_T_IN, 0, vec![Buf::In(4096)], 0),
        (
            VIRTIO_BLK_T_IN,
            8,
            vec![Buf::In(64 << 10), Buf::In(32 << 10)],
            0,
        ),
        (VIRTIO_BLK_T_FLUSH, 0, vec![], 0),
        (VIRTIO_BLK_T_GET_ID, 0, vec![Buf::In(20)], 0),
        (VIRTIO_BLK_T_IN, 1 << 20, vec![Buf::In(512)], 1),
        (99, 0, vec![], 2),
    ];
    for (kind, sector, bufs, status) in table {
        let header = block_header(kind, sector);
        let mut chain = vec![Buf::Out(&header)];
        chain.extend(bufs);
        chain.push(Buf::In(1));
        let (parts, _) = block.request(0, &chain);
        let last = *parts.last().unwrap();
        assert_eq!(block.bytes(last), [status], "type {kind} sector {sector}");
    }
    // A header and nothing to write a status into: the chain comes back.
    let header = block_header(VIRTIO_BLK_T_IN, 0);
    block.request(0, &[Buf::Out(&header)]);

    // Frames from the host to the guest's buffers, one of them too small.
    let host = UdpSocket::bind((HOST_IP, 0)).expect("the tap's address");
    for _ in 0..4 {
        net.push(0, &[Buf::In(12 + 1522)]);
    }
    net.push(0, &[Buf::In(20)]);
    net.notify(0);
    let mut frames = Vec::new();
    wait_for("frames from the tap", || {
        let _ = host.send_to(b"from the host", (GUEST_IP, 9));
        frames.extend(net.rings[0].take(net.mem));
        thread::sleep(Duration::from_millis(5));
        frames.len() == 5
    });
    let dropped = &bus.slots()[1].metrics.net_rx_dropped;
    assert_eq!(dropped.load(Ordering::Relaxed), 1, "{frames:?}");
    // Frames from the guest: one the tap takes, one too long.
    let mut frame = vec![0u8; 12];
    frame.extend_from_slice(&[0xff; 6]);
    frame.extend_from_slice(&[0x02, 0x4c, 0x57, 0x50, 0x00, 0x01, 0x88, 0xb5]);
    frame.extend_from_slice(b"from the guest");
    net.request(1, &[Buf::Out(&frame)]);
    let long = vec![0u8; 12 + 4000];
    net.request(1, &[Buf::Out(&long)]);
    let sent = &bus.slots()[1].metrics.net_tx_frames;
    assert_eq!(sent.load(Ordering::Relaxed), 1);

    threads.pause().unwrap();
    threads.resume().unwrap();
    block.break_ring(0);
    net.break_ring(1);
    threads.finish().unwrap();
}

/// The child side: runs the scenario `CHILD` names, if any.
#[test]
fn child() {
    let Ok(which) = std::env::var(CHILD) else {
        return;
    };
    logger();
    match which.as_str() {
        "vsock" => vsock_child(),
        "devices" => devices_child(),
        other => panic!("no scenario {other}"),
    }
    println!("{DONE}");
    std::process::exit(0);
}

/// Runs scenario `which` in a child (through `prefix`, a command that runs
/// it elsewhere, such as in a network namespace).
fn run_child(prefix: &[&str], which: &str) -> Output {
    let me = std::env::current_exe().unwrap();
    let mut c = match prefix.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(&me);
            c
        }
        None => Command::new(&me),
    };
    c.args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CHILD, which)
        .output()
        .unwrap()
}

/// Checks that the child got to its end, and that its device thread's log
/// line about the broken ring went out (through the logger, under the
/// filter).
fn assert_ran(out: &Output, which: &str) {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains(DONE),
        "the {which} scenario ended with {:?} before its end:\n{text}",
        out.status
    );
    assert!(
        text.contains("it needs a reset by the guest"),
        "no log line for the broken ring:\n{text}"
    );
}

fn require(path: &str) {
    assert!(
        Path::new(path).exists(),
        "this test needs {path}, which is missing on this machine"
    );
}

/// The vsock thread: connections both ways, data both ways, credit asked
/// and given, refused packets, 65 connections sent past their credit (the
/// path that once ended lwpvmm: glibc's malloc opened
/// /proc/sys/vm/overcommit_memory when their buffers were freed), both
/// shutdowns, resets, receive buffers too small for anything, a restored
/// device's transport reset, a broken ring.
#[test]
fn every_guest_vsock_path_stays_inside_the_vsock_allowlist() {
    require("/dev/kvm");
    let out = run_child(&[], "vsock");
    assert_ran(&out, "vsock");
}

/// The disk and network thread: every kind of block request and refusal,
/// frames both ways on a tap, a receive buffer too small for a frame, a
/// frame too long, broken rings.
#[test]
fn every_guest_disk_and_network_path_stays_inside_the_device_allowlist() {
    require("/dev/kvm");
    require("/dev/net/tun");
    let name = format!("lwpvmm-seccomp-{}", std::process::id());
    let _ = Command::new("ip").args(["netns", "delete", &name]).output();
    ip(&["netns", "add", &name]);
    let ns = NamespaceGuard(name);
    let n = ns.0.as_str();
    ip(&["-n", n, "tuntap", "add", "dev", TAP, "mode", "tap"]);
    ip(&["-n", n, "addr", "add", &format!("{HOST_IP}/24"), "dev", TAP]);
    ip(&["-n", n, "link", "set", TAP, "up"]);
    ip(&[
        "-n",
        n,
        "neigh",
        "add",
        GUEST_IP,
        "lladdr",
        "02:4c:57:50:00:01",
        "dev",
        TAP,
    ]);
    let out = run_child(&["ip", "netns", "exec", n], "devices");
    assert_ran(&out, "disk and network");
}
