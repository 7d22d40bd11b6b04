//! The control thread's event sources: the descriptors its loop waits on
//! (the exit and snapshot-point eventfds, the request wake-up, timers for
//! snapshots, the sampler and a native guest's watch, signal pipes, the
//! terminal's input) and what the loop saw on them, for control.rs to act
//! on.

use std::io::Read;
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use event_manager::{EventOps, Events, MutEventSubscriber};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;

use crate::vmm::base::signals::StopSignals;
use crate::vmm::error::VmError;

/// What the event loop saw, for the loop to act on.
#[derive(Default)]
pub(crate) struct Seen {
    pub(crate) done: bool,
    pub(crate) signal: Option<i32>,
    /// What asked for a snapshot since the loop last looked: requests that
    /// arrive together make one snapshot, whose log line names them all.
    pub(crate) snapshot: Vec<&'static str>,
    pub(crate) metrics: bool,
    pub(crate) samples: u64,
    pub(crate) requests: bool,
    /// A vCPU found the SYSCALL quirk's entry: the others are kicked to
    /// set their breakpoint.
    pub(crate) syscall_entry: bool,
    /// Time for a native guest's vCPUs to look where they are.
    pub(crate) watch: bool,
}

/// The loop's descriptors.
pub(crate) struct Sources {
    pub(crate) exit: EventFd,
    pub(crate) snapshot_point: EventFd,
    pub(crate) wake: EventFd,
    pub(crate) syscall_entry: Option<EventFd>,
    pub(crate) timer: Option<TimerFd>,
    pub(crate) sampler: Option<TimerFd>,
    /// A native guest's watch (`vcpu::native::Watch`).
    pub(crate) watch: Option<TimerFd>,
    pub(crate) sigusr1: Option<UnixStream>,
    pub(crate) sigusr2: Option<UnixStream>,
    pub(crate) stop_signals: Option<StopSignals>,
    pub(crate) stdin: Option<std::io::Stdin>,
    pub(crate) bus: Arc<Mutex<crate::vmm::devices::port_bus::PortBus>>,
    pub(crate) seen: Seen,
}

fn drain(fd: &mut impl Read) {
    let mut b = [0u8; 64];
    let _ = fd.read(&mut b);
}

impl MutEventSubscriber for Sources {
    fn process(&mut self, events: Events, ops: &mut EventOps) {
        let fd = events.fd();
        let seen = &mut self.seen;
        if fd == self.exit.as_raw_fd() {
            seen.done = true;
        } else if fd == self.snapshot_point.as_raw_fd() {
            let _ = self.snapshot_point.read();
            seen.snapshot.push("the guest's snapshot point");
        } else if fd == self.wake.as_raw_fd() {
            let _ = self.wake.read();
            seen.requests = true;
        } else if let Some(e) = self.syscall_entry.as_ref().filter(|e| e.as_raw_fd() == fd) {
            let _ = e.read();
            seen.syscall_entry = true;
        } else if let Some(t) = self.sampler.as_mut().filter(|t| t.as_raw_fd() == fd) {
            seen.samples += t.wait().unwrap_or(0);
        } else if let Some(t) = self.watch.as_mut().filter(|t| t.as_raw_fd() == fd) {
            let _ = t.wait();
            seen.watch = true;
        } else if let Some(t) = self.timer.as_mut().filter(|t| t.as_raw_fd() == fd) {
            let _ = t.wait();
            seen.snapshot.push("--snapshot-after");
        } else if let Some(s) = self.sigusr2.as_mut().filter(|s| s.as_raw_fd() == fd) {
            drain(s);
            seen.snapshot.push("SIGUSR2");
        } else if let Some(s) = self.sigusr1.as_mut().filter(|s| s.as_raw_fd() == fd) {
            drain(s);
            seen.metrics = true;
        } else if let Some(signal) = self.stop_signals.as_mut().and_then(|s| s.arrived(fd)) {
            seen.signal.get_or_insert(signal);
            seen.done = true;
        } else {
            self.console_input(ops);
        }
    }

    fn init(&mut self, ops: &mut EventOps) {
        let mut fds: Vec<RawFd> = vec![
            self.exit.as_raw_fd(),
            self.snapshot_point.as_raw_fd(),
            self.wake.as_raw_fd(),
        ];
        fds.extend(self.syscall_entry.iter().map(AsRawFd::as_raw_fd));
        fds.extend(
            self.timer
                .iter()
                .chain(&self.sampler)
                .chain(&self.watch)
                .map(AsRawFd::as_raw_fd),
        );
        fds.extend(
            self.sigusr1
                .iter()
                .chain(&self.sigusr2)
                .map(AsRawFd::as_raw_fd),
        );
        fds.extend(self.stop_signals.iter().flat_map(StopSignals::fds));
        for fd in fds {
            let _ = ops.add(Events::new_raw(fd, EventSet::IN));
        }
        if let Some(s) = &self.stdin
            && ops
                .add(Events::new_raw(s.as_raw_fd(), EventSet::IN))
                .is_err()
        {
            self.stdin = None;
        }
    }
}

impl Sources {
    fn console_input(&mut self, ops: &mut EventOps) {
        let mut buf = [0u8; 64];
        let n = match &self.stdin {
            Some(s) => s.lock().read(&mut buf).unwrap_or(0),
            None => 0,
        };
        if n == 0 {
            if let Some(s) = self.stdin.take() {
                let _ = ops.remove(Events::new_raw(s.as_raw_fd(), EventSet::IN));
            }
            return;
        }
        if let Ok(mut bus) = self.bus.lock() {
            let _ = bus.serial_input(&buf[..n]);
        }
    }
}

/// A socket that receives a byte whenever `signal` arrives (signal-hook
/// writes it from the handler), for the event loop.
pub(crate) fn signal_pipe(signal: libc::c_int, what: &'static str) -> Result<UnixStream, VmError> {
    let err = |source| VmError::Signal { what, source };
    let (reader, writer) = UnixStream::pair().map_err(err)?;
    reader.set_nonblocking(true).map_err(err)?;
    signal_hook::low_level::pipe::register(signal, writer).map_err(err)?;
    Ok(reader)
}

pub(crate) fn timer_error(e: vmm_sys_util::errno::Error) -> VmError {
    VmError::EventLoop(format!("timerfd: {e}"))
}

/// A timer that fires once after `first`, or a disarmed one.
pub(crate) fn timer(first: Option<Duration>) -> Result<TimerFd, VmError> {
    let mut t = TimerFd::new().map_err(timer_error)?;
    if let Some(first) = first {
        t.reset(first, None).map_err(timer_error)?;
    }
    Ok(t)
}

/// Fires the sampler `hz` times a second (0: never).
pub(crate) fn arm_sampler(t: &mut TimerFd, hz: u32) -> Result<(), VmError> {
    if hz == 0 {
        return t.clear().map_err(timer_error);
    }
    let period = Duration::from_nanos(1_000_000_000 / u64::from(hz));
    t.reset(period, Some(period)).map_err(timer_error)
}

pub(crate) fn stdin_is_terminal() -> bool {
    use std::io::IsTerminal;
    std::io::stdin().is_terminal()
}
