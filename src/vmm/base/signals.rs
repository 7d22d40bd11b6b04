//! SIGINT, SIGTERM and SIGHUP (the terminal closed) while a VM runs (when
//! the caller asks for it, as `lwpvmm run` does): the first one stops the
//! VM cleanly (the vCPUs stop,
//! the console, trace and metrics are flushed and written, and the run ends
//! with that signal as its reason); a second one ends the process at once
//! with status 128 + N, for a stop that hangs. signal-hook writes a byte to
//! a socket from the handler; the control thread watches the sockets.

use std::io::Read;
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;

use signal_hook::SigId;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

/// The signals that stop a VM.
pub const STOP_SIGNALS: [i32; 3] = [SIGINT, SIGTERM, SIGHUP];

/// The handlers, registered until this is dropped.
#[derive(Debug)]
pub struct StopSignals {
    watched: Vec<(i32, UnixStream)>,
    ids: Vec<SigId>,
    /// The thread that ends the process at the second signal, and how to
    /// stop it.
    second: Option<(signal_hook::iterator::Handle, std::thread::JoinHandle<()>)>,
}

impl StopSignals {
    /// Registers the handlers. They replace an inherited "ignore" too (a
    /// shell starts background jobs with SIGINT ignored).
    pub fn register() -> std::io::Result<Self> {
        let mut stop = StopSignals {
            watched: Vec::new(),
            ids: Vec::new(),
            second: None,
        };
        // The second signal ends the process from a thread of its own
        // (made before any filter, on the caller's thread), which says so
        // first: the control thread may be busy stopping the VM.
        let mut signals = signal_hook::iterator::Signals::new(STOP_SIGNALS)?;
        let handle = signals.handle();
        let thread = std::thread::Builder::new()
            .name("lwpvmm-signals".into())
            .spawn(move || {
                let mut seen = 0;
                for signal in signals.forever() {
                    seen += 1;
                    if seen >= 2 {
                        eprintln!(
                            "lwpvmm: {} again: exiting at once, without waiting for the VM to stop (the --metrics file keeps its last whole document)",
                            name(signal)
                        );
                        std::process::exit(128 + signal);
                    }
                }
            })?;
        stop.second = Some((handle, thread));
        for signal in STOP_SIGNALS {
            let (reader, writer) = UnixStream::pair()?;
            reader.set_nonblocking(true)?;
            stop.ids
                .push(signal_hook::low_level::pipe::register(signal, writer)?);
            stop.watched.push((signal, reader));
        }
        Ok(stop)
    }

    /// The descriptors to watch.
    pub fn fds(&self) -> Vec<RawFd> {
        self.watched.iter().map(|(_, s)| s.as_raw_fd()).collect()
    }

    /// The signal whose socket `fd` is, after draining it.
    pub fn arrived(&mut self, fd: RawFd) -> Option<i32> {
        let (signal, socket) = self.watched.iter_mut().find(|(_, s)| s.as_raw_fd() == fd)?;
        let mut b = [0u8; 16];
        let _ = socket.read(&mut b);
        Some(*signal)
    }
}

impl Drop for StopSignals {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
        if let Some((handle, thread)) = self.second.take() {
            handle.close();
            let _ = thread.join();
        }
    }
}

/// A signal's name, for messages.
pub fn name(signal: i32) -> &'static str {
    match signal {
        SIGINT => "SIGINT",
        SIGTERM => "SIGTERM",
        SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}

/// What a SIGBUS means for a VM restored from a mapped memory file: a page
/// lwpvmm touched lies past the file's end, because something truncated
/// the file underneath.
const SIGBUS_MESSAGE: &[u8] = b"lwpvmm: SIGBUS: the snapshot's memory file this VM maps was truncated or replaced in place while the VM ran; lwpvmm stops (docs/snapshot.md)\n";

extern "C" fn memory_file_sigbus(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: write(2) and _exit(2) are async-signal-safe; the message is a
    // static byte string, and nothing else is touched. Returning would
    // retry the faulting access forever.
    unsafe {
        libc::write(
            libc::STDERR_FILENO,
            SIGBUS_MESSAGE.as_ptr().cast(),
            SIGBUS_MESSAGE.len(),
        );
        libc::_exit(2);
    }
}

/// Makes a SIGBUS end the process with status 2 and a message naming the
/// memory file, instead of a crash without one: a restored VM's RAM is a
/// private mapping of that file, and a page past an end that another
/// process truncated raises SIGBUS when lwpvmm reads it.
pub fn exit_on_memory_file_sigbus() -> Result<(), vmm_sys_util::errno::Error> {
    vmm_sys_util::signal::register_signal_handler(libc::SIGBUS, memory_file_sigbus)
}
