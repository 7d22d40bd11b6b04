//! The control API (docs/profiling.md): an HTTP/1.1 server on a thread of
//! its own, under its own seccomp allowlist, that drives the VM only
//! through a [`VmmHandle`]. It listens on an owner-only Unix socket
//! (`--api-sock`: every endpoint; a peer of another user is refused even if
//! it got through the file mode) and, when asked, on TCP (`--api-listen`:
//! the read-only endpoints). One poll loop serves every connection at
//! once, without blocking on any: each request has one deadline from the
//! client's connection, each answer one to go out, and TCP clients have
//! their connections and captures apart from the owner's, so no TCP
//! client can delay the owner's socket and no client holds the VM.

mod conn;
pub mod frontend;
pub mod http;
pub mod routes;

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
use thiserror::Error;

use self::conn::{Conn, ConnStream, Interest, REFUSED, Service};
use self::frontend::{Before, Frontend};
use self::http::{Request, Response};
use self::routes::{Answer, Context, KernelSymbols, Origin, finish_profile, route};
use crate::guest_warn;
use crate::profile::objects::{KernelSymbolsError, read_kernel_symbols};
use crate::profile::sysroot::{Sysroot, SysrootError};
use crate::vmm::base::recorder::CaptureId;
use crate::vmm::base::request::VmmHandle;
use crate::vmm::base::seccomp::{self, SeccompMode, ThreadKind};
use std::sync::Arc;

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
    /// `--kernel-symbols` could not be used.
    #[error("--kernel-symbols {}: {source}", path.display())]
    KernelSymbols {
        /// The file.
        path: PathBuf,
        /// Why.
        source: KernelSymbolsError,
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
    /// The guest kernel's symbols (a vmlinux or a /proc/kallsyms copy),
    /// naming the kernel frames of whole-guest profiles; an error when it is
    /// neither.
    pub kernel_symbols: Option<PathBuf>,
    /// The kernel the VM booted: its symbols, when it is an ELF that has
    /// them, name kernel frames unless `kernel_symbols` is given.
    pub kernel_image: Option<PathBuf>,
}

/// What the API serves from its start: a front end that has not started
/// a VM yet, or a running VM (with the front end that started it, which
/// answers first, if any).
pub enum ApiPhase {
    /// The front end answers everything until it starts a VM; lwpvmm's
    /// endpoints then serve that VM too.
    Before(Box<dyn Frontend>),
    /// A VM started already (by the front end itself, or booted from a
    /// config file).
    Running {
        /// The VM, with what names its profiles' frames.
        started: frontend::Started,
        /// The front end that answers first.
        frontend: Option<Box<dyn Frontend>>,
    },
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
    kernel: Option<KernelSymbols>,
    /// The most bytes a request's body takes.
    max_body: usize,
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
        let kernel = match (&config.kernel_symbols, &config.kernel_image) {
            (Some(path), _) => {
                let bytes =
                    read_kernel_symbols(path).map_err(|source| ApiError::KernelSymbols {
                        path: path.clone(),
                        source,
                    })?;
                Some((path.display().to_string(), Arc::new(bytes)))
            }
            (None, Some(image)) => match read_kernel_symbols(image) {
                Ok(bytes) => Some((image.display().to_string(), Arc::new(bytes))),
                Err(why) => {
                    log::info!(
                        "{} gives no kernel symbols ({why}): kernel frames of whole-guest profiles are addresses unless --kernel-symbols names the kernel's vmlinux",
                        image.display()
                    );
                    None
                }
            },
            (None, None) => None,
        };
        Ok(Some(ApiListeners {
            unix,
            tcp,
            file,
            sysroot,
            kernel,
            max_body: http::MAX_BODY,
        }))
    }

    /// Takes request bodies of up to `bytes` (at most
    /// [`http::MAX_BODY_LIMIT`]) instead of [`http::MAX_BODY`]: a front end
    /// whose clients send larger configurations says so (Firecracker's
    /// `--http-api-max-payload-size`).
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes.min(http::MAX_BODY_LIMIT);
        self
    }

    /// Serves `phase` on a thread of its own, under the API thread's
    /// seccomp filter in `mode`, until [`ApiThread::finish`]. A front end
    /// starts it: before the VM it serves runs, and finishes it after the
    /// VM ended, so that the profiles still due go out.
    pub fn start(mut self, phase: ApiPhase, mode: SeccompMode) -> Result<ApiThread, ApiError> {
        let phase = match phase {
            ApiPhase::Before(frontend) => Phase::Before(Some(frontend)),
            ApiPhase::Running { started, frontend } => {
                if started.sysroot.is_some() {
                    self.sysroot = started.sysroot;
                }
                if started.kernel.is_some() {
                    self.kernel = started.kernel;
                }
                Phase::Running {
                    vm: started.vm,
                    started: None,
                    frontend,
                }
            }
        };
        self.spawn(phase, mode)
    }

    fn spawn(mut self, phase: Phase, mode: SeccompMode) -> Result<ApiThread, ApiError> {
        let (stop, stopped) = UnixStream::pair().map_err(ApiError::Thread)?;
        // Removed by this thread at the end: the API thread may not unlink.
        let file = self.file.take();
        let thread = thread::Builder::new()
            .name("lwpvmm-api".into())
            .spawn(
                move || match seccomp::install(ThreadKind::Api, mode, "api") {
                    Ok(()) => {
                        let mut server = Server {
                            phase,
                            sysroot: self.sysroot.take(),
                            kernel: self.kernel.take(),
                            max_body: self.max_body,
                        };
                        self.serve(&mut server, &stopped);
                    }
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

    fn serve(&self, server: &mut Server, stopped: &UnixStream) {
        let mut conns: Vec<Conn<Stream>> = Vec::new();
        // Once the VM ends: until when the answers still due may go out.
        let mut stopping: Option<Instant> = None;
        loop {
            let now = Instant::now();
            conns.retain_mut(|c| c.tick(now, server));
            if let Some(end) = stopping
                && (conns.is_empty() || now >= end)
            {
                return;
            }
            let wake = conns.iter().map(Conn::wake_at).chain(stopping).min();
            let timeout = wake.map_or(PollTimeout::NONE, |at| {
                // Rounded up: a timeout cut short would spin until due.
                let ms = at.saturating_duration_since(now).as_millis() + 1;
                PollTimeout::try_from(ms.min(60_000) as u32).unwrap_or(PollTimeout::MAX)
            });
            let mut fds = Vec::with_capacity(3 + conns.len());
            if stopping.is_none() {
                fds.push(PollFd::new(stopped.as_fd(), PollFlags::POLLIN));
                if let Some((l, _)) = &self.unix {
                    fds.push(PollFd::new(l.as_fd(), PollFlags::POLLIN));
                }
                if let Some(l) = &self.tcp {
                    fds.push(PollFd::new(l.as_fd(), PollFlags::POLLIN));
                }
            }
            let listeners = fds.len();
            for c in &conns {
                let interest = match c.interest() {
                    Interest::Read => PollFlags::POLLIN,
                    Interest::Write => PollFlags::POLLOUT,
                };
                fds.push(PollFd::new(c.stream.as_fd(), interest));
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
            let mut at = listeners;
            conns.retain_mut(|c| {
                at += 1;
                !ready[at - 1] || c.ready(Instant::now(), server)
            });
            if listeners == 0 {
                continue;
            }
            if ready[0] {
                // The VM ended: what was captured is the whole profile,
                // and requests not yet read get no answer.
                let now = Instant::now();
                stopping = Some(now + FINAL_FLUSH);
                conns.retain_mut(|c| c.finish(now, server));
                continue;
            }
            let mut next = ready[1..listeners].iter();
            if let Some((listener, owner)) = &self.unix
                && next.next() == Some(&true)
            {
                let open = conns.iter().filter(|c| c.origin == Origin::Unix).count();
                conns.extend(accept_unix(listener, *owner, open));
            }
            if let Some(listener) = &self.tcp
                && next.next() == Some(&true)
            {
                let open = conns.iter().filter(|c| c.origin == Origin::Tcp).count();
                match listener.accept() {
                    Ok((stream, _)) if open < MAX_TCP_CONNECTIONS => {
                        conns.extend(Stream::Tcp(stream).conn(Origin::Tcp));
                    }
                    Ok(_) => {
                        guest_warn!(
                            REFUSED,
                            "API: closed a TCP client: {MAX_TCP_CONNECTIONS} TCP connections are open"
                        );
                    }
                    Err(e) => accept_failed(&e),
                }
            }
        }
    }
}

/// Where the API stands: before a front end started the VM, or serving it.
enum Phase {
    /// A front end answers everything (`None` only while it starts the VM).
    Before(Option<Box<dyn Frontend>>),
    /// The VM runs.
    Running {
        vm: VmmHandle,
        /// The capture `PUT /capture/start` began.
        started: Option<CaptureId>,
        /// The front end that started it, which answers first.
        frontend: Option<Box<dyn Frontend>>,
    },
}

/// What answers the API's requests, in either phase.
struct Server {
    phase: Phase,
    sysroot: Option<Arc<Sysroot>>,
    kernel: Option<KernelSymbols>,
    /// The most bytes a request's body takes.
    max_body: usize,
}

impl Service for Server {
    fn max_body(&self) -> usize {
        self.max_body
    }

    fn route(&mut self, request: &Request, origin: Origin) -> Answer {
        match &mut self.phase {
            Phase::Before(frontend) => {
                let Some(mut front) = frontend.take() else {
                    return Response::fault(503, "the VM is starting").into();
                };
                match front.before_start(request) {
                    Before::Now(r) => {
                        *frontend = Some(front);
                        r.into()
                    }
                    Before::Started(r, started) => {
                        if started.sysroot.is_some() {
                            self.sysroot = started.sysroot;
                        }
                        if started.kernel.is_some() {
                            self.kernel = started.kernel;
                        }
                        self.phase = Phase::Running {
                            vm: started.vm,
                            started: None,
                            frontend: Some(front),
                        };
                        r.into()
                    }
                }
            }
            Phase::Running {
                vm,
                started,
                frontend,
            } => {
                if origin == Origin::Unix
                    && let Some(answer) = frontend.as_mut().and_then(|f| f.after_start(request, vm))
                {
                    return answer.into();
                }
                let mut cx = Context {
                    vm,
                    sysroot: self.sysroot.clone(),
                    kernel: self.kernel.clone(),
                    started: *started,
                    origin,
                };
                let answer = route(request, origin, &mut cx);
                *started = cx.started;
                answer
            }
        }
    }

    /// The profile of capture `id`, once due.
    fn finish_profile(&self, id: CaptureId) -> Response {
        match &self.phase {
            Phase::Running { vm, .. } => finish_profile(
                id,
                &Context {
                    vm,
                    sysroot: self.sysroot.clone(),
                    kernel: self.kernel.clone(),
                    started: None,
                    origin: Origin::Unix,
                },
            ),
            Phase::Before(_) => Response::fault(500, "the capture was lost"),
        }
    }

    /// A client that waited for capture `id` went away.
    fn drop_capture(&self, id: CaptureId) {
        if let Phase::Running { vm, .. } = &self.phase {
            vm.recorder().finish_capture(id);
        }
    }
}

/// Accepts a client on the Unix socket; another user's is answered 403.
fn accept_unix(listener: &UnixListener, owner: u32, open: usize) -> Option<Conn<Stream>> {
    let stream = match listener.accept() {
        Ok((stream, _)) => stream,
        Err(e) => {
            accept_failed(&e);
            return None;
        }
    };
    if open >= MAX_UNIX_CONNECTIONS {
        guest_warn!(
            REFUSED,
            "API: closed a client: {MAX_UNIX_CONNECTIONS} connections to the socket are open"
        );
        return None;
    }
    match getsockopt(&stream, PeerCredentials) {
        Ok(peer) if peer.uid() == owner || peer.uid() == 0 => {
            Stream::Unix(stream).conn(Origin::Unix)
        }
        Ok(peer) => {
            guest_warn!(
                REFUSED,
                "API: refused a client of uid {} (the socket is owner-only)",
                peer.uid()
            );
            let mut conn = Stream::Unix(stream).conn(Origin::Unix)?;
            conn.respond(
                Response::fault(403, "the API serves only its owner"),
                Instant::now(),
            );
            Some(conn)
        }
        Err(e) => {
            accept_failed(&io::Error::from(e));
            None
        }
    }
}

/// Connections open at once on each listener; past it a new client is
/// closed at once. Apart, so that TCP clients never hold the owner's.
const MAX_TCP_CONNECTIONS: usize = 16;
const MAX_UNIX_CONNECTIONS: usize = 16;
/// After the VM ends, how long the answers still due may take to go out.
const FINAL_FLUSH: Duration = Duration::from_secs(5);

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

/// A client's connection, on either listener.
enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    /// Its connection, accepted now; none when it cannot be made
    /// non-blocking.
    fn conn(self, origin: Origin) -> Option<Conn<Stream>> {
        self.set_nonblocking().ok()?;
        Some(Conn::new(self, origin, Instant::now()))
    }

    /// By fcntl, not the ioctl std uses: the API thread makes no ioctl.
    fn set_nonblocking(&self) -> io::Result<()> {
        let fd = self.as_fd();
        let flags = rustix::fs::fcntl_getfl(fd)?;
        rustix::fs::fcntl_setfl(fd, flags | rustix::fs::OFlags::NONBLOCK)?;
        Ok(())
    }

    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Stream::Unix(s) => s.as_fd(),
            Stream::Tcp(s) => s.as_fd(),
        }
    }
}

impl ConnStream for Stream {
    fn finish_writing(&self) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.shutdown(std::net::Shutdown::Write),
            Stream::Tcp(s) => s.shutdown(std::net::Shutdown::Write),
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
