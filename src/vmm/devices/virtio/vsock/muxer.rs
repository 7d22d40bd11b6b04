//! The host side of the vsock device, Firecracker's hybrid design: guest
//! stream connections become Unix stream connections on the host.
//! - A host process connects to `uds_path` and sends `CONNECT PORT\n`; the
//!   muxer asks the guest to connect (REQUEST from a host port of its own)
//!   and, once the guest accepts, answers `OK HOSTPORT\n`.
//! - A guest connection to host port P reaches the Unix socket
//!   `uds_path_P`, which a host process listens on.
//!
//! Every host socket is non-blocking and registered with one epoll
//! descriptor of the muxer's, which the device thread polls. Memory is
//! bounded whoever stops reading: the muxer reads a host stream only while
//! the guest has buffer space for it (the guest's credit) and the guest has
//! posted receive buffers, and it takes at most [`BUF_ALLOC`] bytes per
//! connection from the guest (the credit it advertises) that the host
//! process has not yet read; a guest that sends past its credit gets the
//! connection reset. Connections are limited to [`MAX_CONNECTIONS`], the
//! control packets waiting for receive buffers to [`MAX_PENDING`].

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use nix::sys::socket::{
    AddressFamily, SockFlag, SockType, UnixAddr, connect, getsockopt, socket,
    sockopt::PeerCredentials,
};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::error::VsockError;
use super::packet::{
    HDR_LEN, HOST_CID, Header, MAX_PAYLOAD, Op, SHUTDOWN_RCV, SHUTDOWN_SEND, TYPE_STREAM,
};

/// The receive buffer the host side of each connection advertises: bytes
/// from the guest the host process has not read yet.
pub const BUF_ALLOC: u32 = 256 * 1024;
/// Connections at once (host clients still to send CONNECT included).
pub const MAX_CONNECTIONS: usize = 256;
/// Control packets waiting for the guest's receive buffers.
pub const MAX_PENDING: usize = 2 * MAX_CONNECTIONS + 64;
/// The longest `CONNECT PORT\n` line.
const MAX_LINE: usize = 32;
/// The first host port of host-initiated connections.
const FIRST_LOCAL_PORT: u32 = 1 << 30;

const LISTENER: u64 = 0;
const WAKE: u64 = 1;

/// Where a connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// A host process asked; the guest has not answered the REQUEST.
    Connecting,
    /// Both ends are connected.
    Established,
}

/// A connection: host port and guest port.
type Key = (u32, u32);

struct Conn {
    stream: UnixStream,
    token: u64,
    state: State,
    /// The guest's receive buffer and what it took of it.
    peer_buf_alloc: u32,
    peer_fwd_cnt: u32,
    /// Bytes sent to the guest.
    tx_cnt: u32,
    /// Bytes from the guest written to the host stream, and the count last
    /// told to the guest.
    fwd_cnt: u32,
    told_fwd_cnt: u32,
    /// Bytes from the guest the host stream has not taken yet.
    to_host: Vec<u8>,
    /// The host stream ended; the guest was told.
    host_eof: bool,
    /// The guest will send no more: the host stream is shut down for
    /// writing once `to_host` is empty.
    guest_done: bool,
    /// Registered with the epoll descriptor, for these events.
    interest: Option<EventSet>,
}

impl Conn {
    fn new(stream: UnixStream, token: u64, state: State) -> Self {
        Conn {
            stream,
            token,
            state,
            peer_buf_alloc: 0,
            peer_fwd_cnt: 0,
            tx_cnt: 0,
            fwd_cnt: 0,
            told_fwd_cnt: 0,
            to_host: Vec::new(),
            host_eof: false,
            guest_done: false,
            interest: None,
        }
    }

    /// What the guest can take now.
    fn credit(&self) -> u32 {
        self.peer_buf_alloc
            .saturating_sub(self.tx_cnt.wrapping_sub(self.peer_fwd_cnt))
    }

    fn wanted(&self) -> Option<EventSet> {
        let mut set = EventSet::empty();
        if self.state == State::Established && !self.host_eof && self.credit() > 0 {
            set |= EventSet::IN;
        }
        if !self.to_host.is_empty() {
            set |= EventSet::OUT;
        }
        (!set.is_empty()).then_some(set)
    }
}

/// What an epoll token stands for.
enum Entry {
    /// A host process that has not sent its CONNECT line yet.
    Waiting(UnixStream, Vec<u8>),
    /// A connection's stream.
    Conn(Key),
}

/// What the muxer counts.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Packets refused or connections reset for a misbehaving peer.
    pub refused: u64,
    /// Control packets dropped: no receive buffers for too long.
    pub dropped: u64,
}

/// The host side of one vsock device.
pub struct Muxer {
    cid: u64,
    uds_path: PathBuf,
    listener: UnixListener,
    owner: u32,
    epoll: Epoll,
    wake: EventFd,
    entries: HashMap<u64, Entry>,
    conns: HashMap<Key, Conn>,
    next_token: u64,
    next_port: u32,
    /// Control packets for the guest.
    pending: VecDeque<Header>,
    /// Streams with bytes (or an end) to read.
    readable: BTreeSet<Key>,
    scratch: Vec<u8>,
    /// Counters.
    pub counts: Counts,
}

/// By fcntl, not the ioctl std uses: the vsock thread makes no ioctl.
fn nonblocking(fd: &impl std::os::fd::AsFd) -> io::Result<()> {
    let flags = rustix::fs::fcntl_getfl(fd)?;
    rustix::fs::fcntl_setfl(fd, flags | rustix::fs::OFlags::NONBLOCK)?;
    Ok(())
}

fn io_err(path: &Path) -> impl Fn(io::Error) -> VsockError + '_ {
    move |source| VsockError::Io {
        path: path.to_owned(),
        source,
    }
}

impl Muxer {
    /// Binds `uds_path` (owner-only) for the guest of context `cid`.
    pub fn new(cid: u64, uds_path: &Path) -> Result<Self, VsockError> {
        if uds_path.symlink_metadata().is_ok() {
            return Err(VsockError::Exists(uds_path.to_owned()));
        }
        let err = io_err(uds_path);
        let listener = UnixListener::bind(uds_path).map_err(&err)?;
        std::fs::set_permissions(uds_path, std::fs::Permissions::from_mode(0o600)).map_err(&err)?;
        let owner = std::fs::metadata(uds_path).map_err(&err)?.uid();
        nonblocking(&listener).map_err(&err)?;
        let epoll = Epoll::new().map_err(&err)?;
        let wake = EventFd::new(EFD_NONBLOCK).map_err(&err)?;
        epoll
            .ctl(
                ControlOperation::Add,
                listener.as_raw_fd(),
                EpollEvent::new(EventSet::IN, LISTENER),
            )
            .map_err(&err)?;
        epoll
            .ctl(
                ControlOperation::Add,
                wake.as_raw_fd(),
                EpollEvent::new(EventSet::IN, WAKE),
            )
            .map_err(&err)?;
        Ok(Muxer {
            cid,
            uds_path: uds_path.to_owned(),
            listener,
            owner,
            epoll,
            wake,
            entries: HashMap::new(),
            conns: HashMap::new(),
            next_token: 2,
            next_port: FIRST_LOCAL_PORT,
            pending: VecDeque::new(),
            readable: BTreeSet::new(),
            scratch: vec![0; MAX_PAYLOAD],
            counts: Counts::default(),
        })
    }

    /// The guest's context ID.
    pub fn cid(&self) -> u64 {
        self.cid
    }

    /// The host socket's path.
    pub fn uds_path(&self) -> &Path {
        &self.uds_path
    }

    /// The descriptor the device thread polls.
    pub fn fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    /// Makes the descriptor readable once, so that the device thread calls
    /// in (a restored device's transport reset).
    pub fn kick(&self) {
        let _ = self.wake.write(1);
    }

    /// Whether a packet is waiting for a receive buffer.
    pub fn has_output(&self) -> bool {
        !self.pending.is_empty() || !self.readable.is_empty()
    }

    /// Whether a control packet (a header alone) is waiting: it fits a
    /// buffer of [`HDR_LEN`] bytes, which data does not.
    pub fn has_control(&self) -> bool {
        !self.pending.is_empty()
    }

    fn header(&self, key: Key, op: Op, len: u32, flags: u32) -> Header {
        let fwd_cnt = self.conns.get(&key).map_or(0, |c| c.fwd_cnt);
        Header {
            src_cid: HOST_CID,
            dst_cid: self.cid,
            src_port: key.0,
            dst_port: key.1,
            len,
            kind: TYPE_STREAM,
            op,
            flags,
            buf_alloc: BUF_ALLOC,
            fwd_cnt,
        }
    }

    fn push(&mut self, header: Header) {
        if self.pending.len() >= MAX_PENDING {
            self.pending.pop_front();
            self.counts.dropped += 1;
        }
        self.pending.push_back(header);
    }

    fn push_ctl(&mut self, key: Key, op: Op, flags: u32) {
        let h = self.header(key, op, 0, flags);
        if let Some(c) = self.conns.get_mut(&key) {
            c.told_fwd_cnt = c.fwd_cnt;
        }
        self.push(h);
    }

    /// Resets `key` towards the guest and forgets it.
    fn reset(&mut self, key: Key) {
        self.push_ctl(key, Op::Rst, 0);
        self.remove(key);
    }

    fn remove(&mut self, key: Key) {
        if let Some(c) = self.conns.remove(&key) {
            if c.interest.is_some() {
                let _ = self.epoll.ctl(
                    ControlOperation::Delete,
                    c.stream.as_raw_fd(),
                    EpollEvent::default(),
                );
            }
            self.entries.remove(&c.token);
        }
        self.readable.remove(&key);
    }

    /// Registers `key`'s stream for what it needs now.
    fn update(&mut self, key: Key) {
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        let want = c.wanted();
        if want == c.interest {
            return;
        }
        let fd = c.stream.as_raw_fd();
        let done = match (c.interest, want) {
            (None, Some(set)) => {
                self.epoll
                    .ctl(ControlOperation::Add, fd, EpollEvent::new(set, c.token))
            }
            (Some(_), Some(set)) => {
                self.epoll
                    .ctl(ControlOperation::Modify, fd, EpollEvent::new(set, c.token))
            }
            (Some(_), None) => self
                .epoll
                .ctl(ControlOperation::Delete, fd, EpollEvent::default()),
            (None, None) => Ok(()),
        };
        if done.is_ok() {
            c.interest = want;
        }
        if want.is_none_or(|s| !s.contains(EventSet::IN)) {
            self.readable.remove(&key);
        }
    }

    fn token(&mut self) -> u64 {
        let t = self.next_token;
        self.next_token += 1;
        t
    }

    fn open_connections(&self) -> usize {
        self.conns.len()
            + self
                .entries
                .values()
                .filter(|e| matches!(e, Entry::Waiting(..)))
                .count()
    }

    /// Takes what the host sockets have: new clients, CONNECT lines,
    /// streams readable or writable.
    pub fn poll_host(&mut self) {
        let mut events = [EpollEvent::default(); 64];
        let n = match self.epoll.wait(0, &mut events) {
            Ok(n) => n,
            Err(_) => return,
        };
        for e in &events[..n] {
            match e.data() {
                LISTENER => self.accept(),
                WAKE => {
                    let _ = self.wake.read();
                }
                token => self.host_event(token, e.event_set()),
            }
        }
    }

    fn accept(&mut self) {
        for _ in 0..16 {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(_) => return,
            };
            let ours = getsockopt(&stream, PeerCredentials)
                .is_ok_and(|p| p.uid() == self.owner || p.uid() == 0);
            if !ours || self.open_connections() >= MAX_CONNECTIONS || nonblocking(&stream).is_err()
            {
                self.counts.refused += 1;
                continue;
            }
            let token = self.token();
            if self
                .epoll
                .ctl(
                    ControlOperation::Add,
                    stream.as_raw_fd(),
                    EpollEvent::new(EventSet::IN, token),
                )
                .is_ok()
            {
                self.entries
                    .insert(token, Entry::Waiting(stream, Vec::new()));
            }
        }
    }

    fn host_event(&mut self, token: u64, set: EventSet) {
        match self.entries.get(&token) {
            Some(Entry::Waiting(..)) => self.connect_line(token),
            Some(Entry::Conn(key)) => {
                let key = *key;
                if set.intersects(EventSet::OUT) {
                    self.flush_to_host(key);
                }
                if set.intersects(EventSet::IN | EventSet::HANG_UP | EventSet::ERROR)
                    && self
                        .conns
                        .get(&key)
                        .and_then(|c| c.interest)
                        .is_some_and(|i| i.contains(EventSet::IN))
                {
                    self.readable.insert(key);
                }
            }
            None => {}
        }
    }

    /// Reads a waiting client's `CONNECT PORT\n`, a byte at a time so that
    /// what follows it stays in the stream for the guest.
    fn connect_line(&mut self, token: u64) {
        let Some(Entry::Waiting(stream, line)) = self.entries.get_mut(&token) else {
            return;
        };
        let mut byte = [0u8; 1];
        let port = loop {
            match stream.read(&mut byte) {
                Ok(1) if byte[0] == b'\n' => {
                    break std::str::from_utf8(line)
                        .ok()
                        .and_then(|l| l.strip_prefix("CONNECT "))
                        .and_then(|p| p.trim().parse::<u32>().ok());
                }
                Ok(1) if line.len() < MAX_LINE => line.push(byte[0]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                _ => break None,
            }
        };
        let Some(Entry::Waiting(stream, _)) = self.entries.remove(&token) else {
            return;
        };
        let _ = self.epoll.ctl(
            ControlOperation::Delete,
            stream.as_raw_fd(),
            EpollEvent::default(),
        );
        let Some(port) = port else {
            self.counts.refused += 1;
            return;
        };
        let local = self.free_port(port);
        let key = (local, port);
        self.entries.insert(token, Entry::Conn(key));
        self.conns
            .insert(key, Conn::new(stream, token, State::Connecting));
        self.push_ctl(key, Op::Request, 0);
    }

    fn free_port(&mut self, peer: u32) -> u32 {
        loop {
            let p = self.next_port;
            self.next_port = self.next_port.wrapping_add(1).max(FIRST_LOCAL_PORT);
            if !self.conns.contains_key(&(p, peer)) {
                return p;
            }
        }
    }

    /// Writes what the guest sent to the host stream, as far as it takes it.
    fn flush_to_host(&mut self, key: Key) {
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        let mut failed = false;
        while !c.to_host.is_empty() {
            match c.stream.write(&c.to_host) {
                Ok(n) if n > 0 => {
                    c.to_host.drain(..n);
                    c.fwd_cnt = c.fwd_cnt.wrapping_add(n as u32);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                _ => {
                    failed = true;
                    break;
                }
            }
        }
        if failed {
            self.reset(key);
            return;
        }
        if c.to_host.is_empty() && c.guest_done {
            let _ = c.stream.shutdown(std::net::Shutdown::Write);
        }
        // Tell the guest of the space once half of it is free again.
        if c.fwd_cnt.wrapping_sub(c.told_fwd_cnt) >= BUF_ALLOC / 2 {
            self.push_ctl(key, Op::CreditUpdate, 0);
        }
        self.update(key);
    }

    /// Connects a guest's REQUEST to `uds_path_PORT`.
    fn connect_host(&self, port: u32) -> Option<UnixStream> {
        let mut path = self.uds_path.clone().into_os_string();
        path.push(format!("_{port}"));
        let addr = UnixAddr::new(Path::new(&path)).ok()?;
        let fd = socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            None,
        )
        .ok()?;
        // A Unix stream connects at once or not at all (a full backlog is
        // EAGAIN: the guest gets its reset).
        connect(fd.as_raw_fd(), &addr).ok()?;
        Some(UnixStream::from(fd))
    }

    /// One packet the guest sent: its header and payload.
    pub fn from_guest(&mut self, h: &Header, payload: &[u8]) {
        if h.src_cid != self.cid || h.dst_cid != HOST_CID || h.kind != TYPE_STREAM {
            self.counts.refused += 1;
            if h.op != Op::Rst {
                let key = (h.dst_port, h.src_port);
                let mut rst = self.header(key, Op::Rst, 0, 0);
                rst.kind = TYPE_STREAM;
                self.push(rst);
            }
            return;
        }
        let key = (h.dst_port, h.src_port);
        if let Some(c) = self.conns.get_mut(&key) {
            c.peer_buf_alloc = h.buf_alloc;
            c.peer_fwd_cnt = h.fwd_cnt;
        }
        let state = self.conns.get(&key).map(|c| c.state);
        match (h.op, state) {
            (Op::Request, None) => {
                if self.open_connections() >= MAX_CONNECTIONS {
                    self.counts.refused += 1;
                    self.push_ctl(key, Op::Rst, 0);
                    return;
                }
                match self.connect_host(h.dst_port) {
                    Some(stream) => {
                        let token = self.token();
                        let mut c = Conn::new(stream, token, State::Established);
                        c.peer_buf_alloc = h.buf_alloc;
                        c.peer_fwd_cnt = h.fwd_cnt;
                        self.entries.insert(token, Entry::Conn(key));
                        self.conns.insert(key, c);
                        self.push_ctl(key, Op::Response, 0);
                        self.update(key);
                    }
                    None => self.push_ctl(key, Op::Rst, 0),
                }
            }
            (Op::Response, Some(State::Connecting)) => {
                if let Some(c) = self.conns.get_mut(&key) {
                    c.state = State::Established;
                    c.to_host
                        .extend_from_slice(format!("OK {}\n", key.0).as_bytes());
                    // Not guest data: it takes no credit.
                    c.fwd_cnt = c.fwd_cnt.wrapping_sub(c.to_host.len() as u32);
                    c.told_fwd_cnt = c.fwd_cnt;
                }
                self.flush_to_host(key);
            }
            (Op::Rst, Some(_)) => self.remove(key),
            (Op::Rst, None) => {}
            (Op::Shutdown, Some(_)) => {
                if h.flags & (SHUTDOWN_RCV | SHUTDOWN_SEND) == SHUTDOWN_RCV | SHUTDOWN_SEND {
                    // Both ways: what the host has not taken yet is
                    // written now if it fits, and the connection ends.
                    self.flush_to_host(key);
                    if self.conns.contains_key(&key) {
                        self.reset(key);
                    }
                } else if h.flags & SHUTDOWN_SEND != 0 {
                    if let Some(c) = self.conns.get_mut(&key) {
                        c.guest_done = true;
                    }
                    self.flush_to_host(key);
                }
            }
            (Op::Rw, Some(State::Established)) => {
                let over = self.conns.get(&key).is_none_or(|c| {
                    c.guest_done || c.to_host.len() + payload.len() > BUF_ALLOC as usize
                });
                if over {
                    // Past the credit it was given, or after its shutdown.
                    self.counts.refused += 1;
                    self.reset(key);
                    return;
                }
                if let Some(c) = self.conns.get_mut(&key) {
                    c.to_host.extend_from_slice(payload);
                }
                self.flush_to_host(key);
            }
            (Op::CreditUpdate, Some(_)) => self.update(key),
            (Op::CreditRequest, Some(_)) => {
                self.push_ctl(key, Op::CreditUpdate, 0);
            }
            // Anything else names no connection this way: a reset.
            _ => {
                self.counts.refused += 1;
                self.push_ctl(key, Op::Rst, 0);
                self.remove(key);
            }
        }
    }

    /// The next packet for the guest, for a receive buffer of `room`
    /// bytes: its header and how many bytes of [`Self::payload`] follow it;
    /// `None` when there is none (the buffer stays the guest's).
    pub fn to_guest(&mut self, room: usize) -> Option<(Header, usize)> {
        if let Some(h) = self.pending.pop_front() {
            return Some((h, 0));
        }
        while let Some(&key) = self.readable.iter().next() {
            let Some(c) = self.conns.get_mut(&key) else {
                self.readable.remove(&key);
                continue;
            };
            let want = (c.credit() as usize)
                .min(room.saturating_sub(HDR_LEN))
                .min(MAX_PAYLOAD);
            if want == 0 {
                self.readable.remove(&key);
                self.update(key);
                continue;
            }
            match c.stream.read(&mut self.scratch[..want]) {
                Ok(0) => {
                    c.host_eof = true;
                    self.readable.remove(&key);
                    let h = self.header(key, Op::Shutdown, 0, SHUTDOWN_SEND);
                    self.update(key);
                    return Some((h, 0));
                }
                Ok(n) => {
                    c.tx_cnt = c.tx_cnt.wrapping_add(n as u32);
                    c.told_fwd_cnt = c.fwd_cnt;
                    let h = self.header(key, Op::Rw, n as u32, 0);
                    self.update(key);
                    return Some((h, n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.readable.remove(&key);
                }
                Err(_) => {
                    let h = self.header(key, Op::Rst, 0, 0);
                    self.remove(key);
                    return Some((h, 0));
                }
            }
        }
        None
    }

    /// The payload of the packet [`Self::to_guest`] just returned.
    pub fn payload(&self, len: usize) -> &[u8] {
        &self.scratch[..len]
    }
}

#[cfg(test)]
#[path = "muxer_tests.rs"]
mod tests;
