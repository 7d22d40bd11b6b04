//! Why the vsock device could not be made: its host socket's path is taken,
//! or the host would not make the socket; and whose fault each is.

use std::io;
use std::path::PathBuf;

use thiserror::Error;

use crate::vmm::base::control_error::Fault;

/// Why the vsock device (its muxer's host socket) could not be set up.
#[derive(Debug, Error)]
pub enum VsockError {
    /// Something is at `uds_path` already.
    #[error(
        "the vsock socket {0} already exists: remove it if no VMM is using it, or give another uds_path"
    )]
    Exists(PathBuf),
    /// The socket or the epoll descriptor could not be made.
    #[error("cannot create the vsock socket {path}: {source}")]
    Io {
        /// The socket's path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
}

impl VsockError {
    /// A path already taken is the caller's to change; a socket the host
    /// would not make is the host's.
    pub fn fault(&self) -> Fault {
        match self {
            VsockError::Exists(_) => Fault::Request,
            VsockError::Io { .. } => Fault::Host,
        }
    }
}
