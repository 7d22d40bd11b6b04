//! Where lwpvmm's log lines go: standard error, or the file Firecracker's
//! `PUT /logger` names. The logger writes through [`Sink`], which reads the
//! choice at each line, so that a front end can redirect the log of a
//! process whose logger is already set up. Lines go whole, and the sink
//! never queries the terminal: the seccomp filters of lwpvmm's threads
//! rightly do not allow that.

use std::fs::File;
use std::io::Write;
use std::sync::{Mutex, PoisonError};

/// The file log lines go to instead of standard error, once set.
static FILE: Mutex<Option<File>> = Mutex::new(None);

/// Sends the log lines to `file` from now on.
pub fn redirect(file: File) {
    *FILE.lock().unwrap_or_else(PoisonError::into_inner) = Some(file);
}

/// Standard error, or the file [`redirect`] named.
pub struct Sink;

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match FILE.lock().unwrap_or_else(PoisonError::into_inner).as_mut() {
            Some(file) => file.write(buf),
            None => std::io::stderr().write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match FILE.lock().unwrap_or_else(PoisonError::into_inner).as_mut() {
            Some(file) => file.flush(),
            None => std::io::stderr().flush(),
        }
    }
}
