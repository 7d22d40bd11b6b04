//! The inputs lwpvmm opens by name: what kind of file each must be, how
//! it is opened and checked (the same regular file before and after the
//! open, read up to its caller's limit), and the errors that say why not;
//! dir.rs and stream.rs open beneath directories and streams on top of it.

use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};
use thiserror::Error;

/// How an input is opened for reading: never waiting (a FIFO swapped in
/// after the check opens at once and is then refused), never as a
/// controlling terminal. rustix always adds `O_LARGEFILE`; the API thread's
/// seccomp filter compares these exact flags.
pub const INPUT_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::NONBLOCK)
    .union(OFlags::NOCTTY)
    .union(OFlags::CLOEXEC)
    .union(OFlags::LARGEFILE);
/// [`INPUT_FLAGS`] beneath a directory: no final symbolic link either.
pub const INPUT_BELOW_FLAGS: OFlags = INPUT_FLAGS.union(OFlags::NOFOLLOW);
/// How a directory on the way to a file beneath a [`Dir`] is opened: never
/// through a symbolic link, and only to open below it.
pub const DIR_WALK_FLAGS: OFlags = OFlags::PATH
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC)
    .union(OFlags::LARGEFILE);

/// What a path names, as a refusal says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    Regular,
    /// A directory.
    Directory,
    /// A FIFO (named pipe).
    Fifo,
    /// A Unix socket.
    Socket,
    /// A character device.
    CharDevice,
    /// A block device.
    BlockDevice,
    /// A symbolic link.
    Symlink,
    /// Anything else.
    Other,
}

impl Kind {
    pub(super) fn of(stat: &Stat) -> Kind {
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::RegularFile => Kind::Regular,
            FileType::Directory => Kind::Directory,
            FileType::Fifo => Kind::Fifo,
            FileType::Socket => Kind::Socket,
            FileType::CharacterDevice => Kind::CharDevice,
            FileType::BlockDevice => Kind::BlockDevice,
            FileType::Symlink => Kind::Symlink,
            FileType::Unknown => Kind::Other,
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Regular => "a regular file",
            Kind::Directory => "a directory",
            Kind::Fifo => "a FIFO",
            Kind::Socket => "a socket",
            Kind::CharDevice => "a character device",
            Kind::BlockDevice => "a block device",
            Kind::Symlink => "a symbolic link",
            Kind::Other => "not a file",
        })
    }
}

/// Why a named file was not opened, read or written.
#[derive(Debug, Error)]
pub enum HostFsError {
    /// The system refused (no such file, no permission, ...).
    #[error("{}: {source}", .path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A FIFO, a device, a socket or a directory where a regular file must
    /// be; nothing was opened.
    #[error("{} is {kind}, not a regular file", .path.display())]
    NotRegular {
        /// The path.
        path: PathBuf,
        /// What it is.
        kind: Kind,
    },
    /// A symbolic link where links are not followed.
    #[error("{} is a symbolic link, which lwpvmm does not follow here: name the file itself", .path.display())]
    Symlink {
        /// The path.
        path: PathBuf,
    },
    /// The file was replaced between its check and its opening.
    #[error("{} was replaced while lwpvmm opened it", .path.display())]
    Changed {
        /// The path.
        path: PathBuf,
    },
    /// Larger than its reader takes; nothing was read.
    #[error("{} is {size} bytes, more than {max} bytes ({limit})", .path.display())]
    TooLarge {
        /// The path.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// The most the reader takes.
        max: u64,
        /// Where that limit comes from.
        limit: &'static str,
    },
    /// A FIFO that nobody reads (an output).
    #[error("{} is a FIFO with no reader: open it for reading first", .path.display())]
    NoReader {
        /// The path.
        path: PathBuf,
    },
}

impl HostFsError {
    /// The path the error is about.
    pub fn path(&self) -> &Path {
        match self {
            HostFsError::Io { path, .. }
            | HostFsError::NotRegular { path, .. }
            | HostFsError::Symlink { path }
            | HostFsError::Changed { path }
            | HostFsError::TooLarge { path, .. }
            | HostFsError::NoReader { path } => path,
        }
    }

    /// The same error, said of `path` (an error met on the way to it).
    pub fn at(mut self, path: &Path) -> Self {
        match &mut self {
            HostFsError::Io { path: p, .. }
            | HostFsError::NotRegular { path: p, .. }
            | HostFsError::Symlink { path: p }
            | HostFsError::Changed { path: p }
            | HostFsError::TooLarge { path: p, .. }
            | HostFsError::NoReader { path: p } => *p = path.to_owned(),
        }
        self
    }

    /// Whether the path did not exist.
    pub fn is_missing(&self) -> bool {
        matches!(self, HostFsError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }

    pub(super) fn io(path: &Path) -> impl Fn(rustix::io::Errno) -> HostFsError + '_ {
        move |e| HostFsError::Io {
            path: path.to_owned(),
            source: e.into(),
        }
    }
}

/// Whether the last component of a path may be a symbolic link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Links {
    Follow,
    Refuse,
}

/// How an input is opened: for reading, or for reading and writing (a
/// writable disk image).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read-only.
    Read,
    /// Read and write.
    ReadWrite,
}

/// A regular file opened and checked, not yet read.
#[derive(Debug)]
pub struct Input {
    file: File,
    size: u64,
    identity: (u64, u64),
    path: PathBuf,
}

impl Input {
    /// Its size when it was opened.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Its device and inode: two names of one file have the same.
    pub fn identity(&self) -> (u64, u64) {
        self.identity
    }

    /// Its path, as named.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Refuses it when it is larger than `max` bytes (`limit` says why
    /// that is the limit), before anything is read.
    pub fn at_most(self, max: u64, limit: &'static str) -> Result<Input, HostFsError> {
        if self.size > max {
            return Err(HostFsError::TooLarge {
                path: self.path,
                size: self.size,
                max,
                limit,
            });
        }
        Ok(self)
    }

    /// All its bytes, at most `max` (see [`Self::at_most`]); a file that
    /// grew past `max` while it was read is refused too.
    pub fn read_all(self, max: u64, limit: &'static str) -> Result<Vec<u8>, HostFsError> {
        let input = self.at_most(max, limit)?;
        let mut bytes = Vec::with_capacity(usize::try_from(input.size).unwrap_or(0));
        let Input { file, path, .. } = input;
        file.take(max.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|source| HostFsError::Io {
                path: path.clone(),
                source,
            })?;
        let size = bytes.len() as u64;
        if size > max {
            return Err(HostFsError::TooLarge {
                path,
                size,
                max,
                limit,
            });
        }
        Ok(bytes)
    }

    /// The open file.
    pub fn into_file(self) -> File {
        self.file
    }
}

/// Opens the regular file `path` names for reading (see the module's
/// header).
pub fn open_input(path: &Path) -> Result<Input, HostFsError> {
    open_checked(rustix::fs::CWD, path, path, Links::Follow, Access::Read)
}

/// Opens the regular file `path` names as `access` says (a disk image).
pub fn open_image(path: &Path, access: Access) -> Result<Input, HostFsError> {
    open_checked(rustix::fs::CWD, path, path, Links::Follow, access)
}

/// The bytes of the regular file `path`, at most `max` (`limit` says why),
/// refused before reading when it is larger.
pub fn read_input(path: &Path, max: u64, limit: &'static str) -> Result<Vec<u8>, HostFsError> {
    open_input(path)?.read_all(max, limit)
}

/// Checks that `path` names a regular file (following links, as a user's
/// path does), without opening it; its size. The file is checked again
/// when it is opened.
pub fn check_input(path: &Path) -> Result<u64, HostFsError> {
    let st = rustix::fs::stat(path).map_err(HostFsError::io(path))?;
    regular(&st, path)?;
    Ok(u64::try_from(st.st_size).unwrap_or(u64::MAX))
}

/// Whether `path` names a directory (following links, as a user's path
/// does); nothing is opened.
pub fn is_dir(path: &Path) -> bool {
    rustix::fs::stat(path).is_ok_and(|st| Kind::of(&st) == Kind::Directory)
}

/// Opens `name` beneath `at` (or by path, with `rustix::fs::CWD`): checked
/// by path first so that nothing but a regular file is opened, then on the
/// descriptor. `shown` is the path errors name.
pub(super) fn open_checked(
    at: BorrowedFd<'_>,
    name: &Path,
    shown: &Path,
    links: Links,
    access: Access,
) -> Result<Input, HostFsError> {
    let io = HostFsError::io(shown);
    let stat_flags = match links {
        Links::Follow => AtFlags::empty(),
        Links::Refuse => AtFlags::SYMLINK_NOFOLLOW,
    };
    let before = rustix::fs::statat(at, name, stat_flags).map_err(&io)?;
    regular(&before, shown)?;
    let mut flags = match links {
        Links::Follow => INPUT_FLAGS,
        Links::Refuse => INPUT_BELOW_FLAGS,
    };
    if access == Access::ReadWrite {
        flags = (flags - OFlags::RDONLY) | OFlags::RDWR;
    }
    let fd = rustix::fs::openat(at, name, flags, Mode::empty()).map_err(|e| match e {
        rustix::io::Errno::LOOP if links == Links::Refuse => HostFsError::Symlink {
            path: shown.to_owned(),
        },
        e => io(e),
    })?;
    let size = same_regular(&fd, &before, shown)?;
    Ok(Input {
        file: File::from(fd),
        size,
        identity: (before.st_dev, before.st_ino),
        path: shown.to_owned(),
    })
}

/// Refuses anything but a regular file.
fn regular(stat: &Stat, path: &Path) -> Result<(), HostFsError> {
    match Kind::of(stat) {
        Kind::Regular => Ok(()),
        Kind::Symlink => Err(HostFsError::Symlink {
            path: path.to_owned(),
        }),
        kind => Err(HostFsError::NotRegular {
            path: path.to_owned(),
            kind,
        }),
    }
}

/// Checks that `fd` is the regular file `before` described; its size.
pub(super) fn same_regular(fd: &impl AsFd, before: &Stat, path: &Path) -> Result<u64, HostFsError> {
    let now = rustix::fs::fstat(fd).map_err(HostFsError::io(path))?;
    if Kind::of(&now) != Kind::Regular || (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino)
    {
        return Err(HostFsError::Changed {
            path: path.to_owned(),
        });
    }
    Ok(u64::try_from(now.st_size).unwrap_or(u64::MAX))
}

/// A descriptor of a directory, for walking below it.
pub(super) fn open_dir_fd(
    at: BorrowedFd<'_>,
    name: &Path,
    shown: &Path,
) -> Result<OwnedFd, HostFsError> {
    rustix::fs::openat(
        at,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(HostFsError::io(shown))
}
