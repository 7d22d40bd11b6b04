//! Outputs written as they go (the console file, the trace, the log):
//! never opened through a final symbolic link, never a device, a FIFO only
//! where the caller allows one and only while something reads it, so that
//! opening one neither blocks nor writes somewhere the name did not say.

use std::fs::File;
use std::path::Path;

use rustix::fs::{AtFlags, Mode, OFlags};

use super::input::{HostFsError, Kind, same_regular};

/// Whether an existing regular file is emptied or added to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamMode {
    /// Emptied first (the console file, the trace).
    Truncate,
    /// Added to (a log).
    Append,
}

/// Whether the output may be a FIFO (a log a collector reads).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fifo {
    /// A FIFO with a reader is taken, and written without blocking.
    Allowed,
    /// Only a regular file.
    Refused,
}

/// How a created output is made: owner-only, as the guest's console and
/// records may hold what its owner alone should read.
const CREATE_MODE: u32 = 0o600;

/// Opens the output `path` names for writing: a new file is created with
/// `O_EXCL`, an existing one is taken only when it is a regular file (or a
/// FIFO with a reader, where `fifo` allows), checked before and after it
/// is opened. A symbolic link, a device, a socket or a directory is
/// refused without being opened.
pub fn open_stream(path: &Path, mode: StreamMode, fifo: Fifo) -> Result<File, HostFsError> {
    let io = HostFsError::io(path);
    let append = match mode {
        StreamMode::Append => OFlags::APPEND,
        StreamMode::Truncate => OFlags::empty(),
    };
    let base = OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY | append;
    // Twice at most: a file created by someone else between the look and
    // the exclusive creation is then looked at again.
    for _ in 0..2 {
        let before = match rustix::fs::statat(rustix::fs::CWD, path, AtFlags::SYMLINK_NOFOLLOW) {
            Err(rustix::io::Errno::NOENT) => {
                match rustix::fs::openat(
                    rustix::fs::CWD,
                    path,
                    base | OFlags::CREATE | OFlags::EXCL,
                    Mode::from_raw_mode(CREATE_MODE),
                ) {
                    Ok(fd) => return Ok(File::from(fd)),
                    Err(rustix::io::Errno::EXIST) => continue,
                    Err(e) => return Err(io(e)),
                }
            }
            Err(e) => return Err(io(e)),
            Ok(st) => st,
        };
        return match Kind::of(&before) {
            Kind::Regular => {
                let fd = rustix::fs::openat(
                    rustix::fs::CWD,
                    path,
                    base | OFlags::NONBLOCK,
                    Mode::empty(),
                )
                .map_err(&io)?;
                same_regular(&fd, &before, path)?;
                if mode == StreamMode::Truncate {
                    rustix::fs::ftruncate(&fd, 0).map_err(&io)?;
                }
                Ok(File::from(fd))
            }
            Kind::Fifo if fifo == Fifo::Allowed => {
                let fd = rustix::fs::openat(
                    rustix::fs::CWD,
                    path,
                    base | OFlags::NONBLOCK,
                    Mode::empty(),
                )
                .map_err(|e| match e {
                    rustix::io::Errno::NXIO => HostFsError::NoReader {
                        path: path.to_owned(),
                    },
                    e => io(e),
                })?;
                let now = rustix::fs::fstat(&fd).map_err(&io)?;
                if Kind::of(&now) != Kind::Fifo
                    || (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino)
                {
                    return Err(HostFsError::Changed {
                        path: path.to_owned(),
                    });
                }
                Ok(File::from(fd))
            }
            Kind::Symlink => Err(HostFsError::Symlink {
                path: path.to_owned(),
            }),
            kind => Err(HostFsError::NotRegular {
                path: path.to_owned(),
                kind,
            }),
        };
    }
    Err(io(rustix::io::Errno::EXIST))
}
