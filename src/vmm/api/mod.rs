//! The control API (docs/profiling.md): an HTTP/1.1 server on a thread of
//! its own, under its own seccomp allowlist, that drives the VM only
//! through a [`VmmHandle`]. It listens on an owner-only Unix socket
//! (`--api-sock`: every endpoint; a peer of another user is refused even if
//! it got through the file mode) and, when asked, on TCP (`--api-listen`:
//! the read-only endpoints). One connection at a time, each with read and
//! write timeouts, so a slow or vanished client holds the API for a few
//! seconds at most and never the VM.

pub mod http;
pub mod routes;

use std::io;
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
use thiserror::Error;

use self::http::{Response, read_request};
use self::routes::{Answer, Context, Origin, finish_profile, route};
use super::seccomp::{self, SeccompMode, ThreadKind};
use super::vmm::VmmHandle;
use crate::guest_warn;
use crate::profile::sysroot::{Sysroot, SysrootError};
use crate::vmm::recorder::CaptureId;
use std::sync::Arc;

/// How long a client may take to send its request, or to take the answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// Requests refused (malformed, oversized, another user's), for the
/// rate-limited log lines.
static REFUSED: AtomicU64 = AtomicU64::new(0);

/// Why the API could not start.
#[derive(Debug, Error)]
pub enum ApiError {
    /// Something is at the socket's path already.
    #[error(
        "the API socket {0} already exists: remove it if no lwpvmm is using it, or give another --api-sock"
    )]
    SocketExists(PathBuf),
    /// The socket could not be made.
    #[error("cannot create the API socket {path}: {source}")]
    Bind {
        /// Where.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The TCP listener could not be made.
    #[error("cannot listen on {addr} (--api-listen): {source}")]
    Listen {
        /// Where.
        addr: SocketAddr,
        /// Why.
        source: io::Error,
    },
    /// The sysroot could not be opened.
    #[error("--sysroot: {0}")]
    Sysroot(#[from] SysrootError),
    /// The thread could not start.
    #[error("cannot start the API thread: {0}")]
    Thread(io::Error),
}

/// Where the API listens.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApiConfig {
    /// The Unix socket of every endpoint.
    pub sock: Option<PathBuf>,
    /// The TCP address of the read-only endpoints.
    pub listen: Option<SocketAddr>,
    /// The guest's files (a directory, or the initramfs it booted), which
    /// name the frames of the profiles the API returns.
    pub sysroot: Option<PathBuf>,
}

/// The socket file, removed when the API goes.
#[derive(Debug)]
struct SocketFile(PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The API's listeners, bound before the VM runs so that a wrong path or
/// port fails the command at once.
#[derive(Debug)]
pub struct ApiListeners {
    unix: Option<(UnixListener, u32)>,
    tcp: Option<TcpListener>,
    file: Option<SocketFile>,
    sysroot: Option<Arc<Sysroot>>,
}

impl ApiListeners {
    /// Binds what `config` names; `None` when it names nothing.
    pub fn bind(config: &ApiConfig) -> Result<Option<Self>, ApiError> {
        if config.sock.is_none() && config.listen.is_none() {
            return Ok(None);
        }
        let (unix, file) = match config.sock.as_deref().map(bind_unix).transpose()? {
            Some((listener, file, owner)) => (Some((listener, owner)), Some(file)),
            None => (None, None),
        };
        let tcp = config
            .listen
            .map(|addr| TcpListener::bind(addr).map_err(|source| ApiError::Listen { addr, source }))
            .transpose()?;
        // Opened before the VM runs: a wrong path fails the command at once,
        // and an initramfs is read once, not at every profile.
        let sysroot = config
            .sysroot
            .as_deref()
            .map(Sysroot::open)
            .transpose()?
            .map(Arc::new);
        Ok(Some(ApiListeners {
            unix,
            tcp,
            file,
            sysroot,
        }))
    }

    /// Serves on a thread of its own until [`ApiThread::finish`].
    pub fn start(mut self, vm: VmmHandle, mode: SeccompMode) -> Result<ApiThread, ApiError> {
        let (stop, stopped) = UnixStream::pair().map_err(ApiError::Thread)?;
        // Removed by this thread at the end: the API thread may not unlink.
        let file = self.file.take();
        let thread = thread::Builder::new()
            .name("lwpvmm-api".into())
            .spawn(
                move || match seccomp::install(ThreadKind::Api, mode, "api") {
                    Ok(()) => self.serve(&vm, &stopped),
                    Err(e) => {
                        log::error!("the API thread stops: {e}");
                    }
                },
            )
            .map_err(ApiError::Thread)?;
        Ok(ApiThread {
            stop,
            thread,
            _file: file,
        })
    }

    fn serve(&self, vm: &VmmHandle, stopped: &UnixStream) {
        let mut cx = Context {
            vm,
            sysroot: self.sysroot.clone(),
            started: None,
        };
        let mut waiting: Vec<Waiting> = Vec::new();
        loop {
            let now = Instant::now();
            let (due, later): (Vec<Waiting>, Vec<Waiting>) =
                waiting.into_iter().partition(|w| w.due <= now);
            waiting = later;
            due.into_iter().for_each(|w| w.answer(&cx));
            let timeout = waiting
                .iter()
                .map(|w| w.due.saturating_duration_since(now))
                .min()
                .map_or(PollTimeout::NONE, |d| {
                    // Rounded up: a timeout cut short would spin until due.
                    let ms = d.as_millis().saturating_add(1);
                    PollTimeout::try_from(ms.min(60_000) as u32).unwrap_or(PollTimeout::MAX)
                });
            let mut fds = vec![PollFd::new(stopped.as_fd(), PollFlags::POLLIN)];
            if let Some((l, _)) = &self.unix {
                fds.push(PollFd::new(l.as_fd(), PollFlags::POLLIN));
            }
            if let Some(l) = &self.tcp {
                fds.push(PollFd::new(l.as_fd(), PollFlags::POLLIN));
            }
            let listeners = fds.len();
            for w in &waiting {
                fds.push(PollFd::new(w.stream.as_fd(), PollFlags::POLLIN));
            }
            match poll(&mut fds, timeout) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => {
                    log::error!("the API stops: poll failed: {e}");
                    return;
                }
            }
            let ready: Vec<bool> = fds
                .iter()
                .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
                .collect();
            drop(fds);
            if ready[0] {
                // The VM ended: what was captured is the whole profile.
                waiting.into_iter().for_each(|w| w.answer(&cx));
                return;
            }
            // A waiting client that hung up takes its capture with it.
            let mut keep = ready[listeners..].iter();
            waiting.retain_mut(|w| keep.next() != Some(&true) || w.still_there(vm));
            let mut next = ready[1..listeners].iter();
            if let Some((listener, owner)) = &self.unix
                && next.next() == Some(&true)
                && let Some(w) = self.accept_unix(listener, *owner, &mut cx)
            {
                waiting.push(w);
            }
            if let Some(listener) = &self.tcp
                && next.next() == Some(&true)
            {
                match listener.accept() {
                    Ok((stream, _)) => {
                        waiting.extend(answer(Stream::Tcp(stream), Origin::Tcp, &mut cx));
                    }
                    Err(e) => accept_failed(&e),
                }
            }
        }
    }

    fn accept_unix(
        &self,
        listener: &UnixListener,
        owner: u32,
        cx: &mut Context<'_>,
    ) -> Option<Waiting> {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) => {
                accept_failed(&e);
                return None;
            }
        };
        match getsockopt(&stream, PeerCredentials) {
            Ok(peer) if peer.uid() == owner || peer.uid() == 0 => {
                answer(Stream::Unix(stream), Origin::Unix, cx)
            }
            Ok(peer) => {
                guest_warn!(
                    REFUSED,
                    "API: refused a client of uid {} (the socket is owner-only)",
                    peer.uid()
                );
                let mut stream = stream;
                let _ = Response::fault(403, "the API serves only its owner").write(&mut stream);
                None
            }
            Err(e) => {
                accept_failed(&io::Error::from(e));
                None
            }
        }
    }
}

/// A client waiting for the profile of a capture.
struct Waiting {
    stream: Stream,
    id: CaptureId,
    due: Instant,
    /// Bytes it sent after its request, ignored up to [`LINGER_BYTES`].
    extra: usize,
}

impl Waiting {
    fn answer(mut self, cx: &Context<'_>) {
        let response = finish_profile(self.id, cx);
        if self.stream.set_timeouts(CLIENT_TIMEOUT).is_ok()
            && response.write(&mut self.stream).is_ok()
        {
            linger(&mut self.stream);
        }
    }

    /// Reads what made its stream readable: false when the client went
    /// away (its capture is then dropped); bytes it sends after its
    /// request are ignored.
    fn still_there(&mut self, vm: &VmmHandle) -> bool {
        let mut sink = [0u8; 512];
        let gone = match self.stream.read(&mut sink) {
            Ok(0) => true,
            // A client that keeps sending while it waits is let go: it
            // would keep the API thread reading.
            Ok(n) => {
                self.extra += n;
                self.extra > LINGER_BYTES
            }
            Err(e) => !matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
            ),
        };
        if gone {
            vm.recorder().finish_capture(self.id);
        }
        !gone
    }
}

fn bind_unix(path: &Path) -> Result<(UnixListener, SocketFile, u32), ApiError> {
    if path.symlink_metadata().is_ok() {
        return Err(ApiError::SocketExists(path.to_owned()));
    }
    let bind_err = |source| ApiError::Bind {
        path: path.to_owned(),
        source,
    };
    let listener = UnixListener::bind(path).map_err(bind_err)?;
    let file = SocketFile(path.to_owned());
    // The mode keeps others from connecting; the peer check in
    // `accept_unix` refuses whoever connected before it was set.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(bind_err)?;
    let owner = std::fs::metadata(path).map_err(bind_err)?.uid();
    Ok((listener, file, owner))
}

fn accept_failed(e: &io::Error) {
    guest_warn!(REFUSED, "API: accept failed: {e}");
    // Out of descriptors, accept fails at once again: do not spin on it.
    thread::sleep(Duration::from_millis(10));
}

/// Reads one request from `stream` and answers it, or hands it back to
/// wait for a capture's end.
fn answer(mut stream: Stream, origin: Origin, cx: &mut Context<'_>) -> Option<Waiting> {
    stream.set_timeouts(CLIENT_TIMEOUT).ok()?;
    let response = match read_request(&mut stream) {
        Ok(request) => match route(&request, origin, cx) {
            Answer::Now(r) => r,
            Answer::Profile { id, due } => {
                return Some(Waiting {
                    stream,
                    id,
                    due,
                    extra: 0,
                });
            }
        },
        Err(e) => {
            let status = e.status()?;
            guest_warn!(REFUSED, "API: refused a request: {e}");
            Response::fault(status, &e.to_string())
        }
    };
    // A client that went away gets nothing; the VM does not notice.
    if response.write(&mut stream).is_ok() {
        linger(&mut stream);
    }
    None
}

/// Closes our side, then reads what the client still sends (a refused
/// request's rest), within bounds: closing with unread input would reset
/// the connection, and the client could lose the answer.
fn linger(stream: &mut Stream) {
    if stream.set_timeouts(LINGER).is_err() || stream.finish_writing().is_err() {
        return;
    }
    let mut sink = [0u8; 4096];
    let mut left = LINGER_BYTES;
    while left > 0 {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => return,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}

/// How long, and how many bytes, [`linger`] reads at most.
const LINGER: Duration = Duration::from_millis(500);
const LINGER_BYTES: usize = 1 << 20;

/// A client's connection, on either listener.
enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    fn set_timeouts(&self, t: Duration) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s
                .set_read_timeout(Some(t))
                .and_then(|()| s.set_write_timeout(Some(t))),
            Stream::Tcp(s) => s
                .set_read_timeout(Some(t))
                .and_then(|()| s.set_write_timeout(Some(t))),
        }
    }

    fn finish_writing(&self) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.shutdown(std::net::Shutdown::Write),
            Stream::Tcp(s) => s.shutdown(std::net::Shutdown::Write),
        }
    }

    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Stream::Unix(s) => s.as_fd(),
            Stream::Tcp(s) => s.as_fd(),
        }
    }
}

impl io::Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl io::Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.flush(),
            Stream::Tcp(s) => s.flush(),
        }
    }
}

/// The running API.
#[derive(Debug)]
pub struct ApiThread {
    stop: UnixStream,
    thread: JoinHandle<()>,
    _file: Option<SocketFile>,
}

impl ApiThread {
    /// Stops serving (after the request being answered, if any), and
    /// removes the socket file.
    pub fn finish(self) {
        use std::io::Write;
        let _ = (&self.stop).write_all(&[1]);
        let _ = self.thread.join();
    }
}
