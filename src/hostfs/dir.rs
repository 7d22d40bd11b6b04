//! A directory lwpvmm holds by its descriptor (a snapshot, a sysroot, the
//! folder of a rewritten file): files are opened beneath it without
//! following any symbolic link, and created under fresh names that are
//! renamed over their own.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{AtFlags, Mode, OFlags};

use super::input::Access;
use super::input::{DIR_WALK_FLAGS, HostFsError, Input, Kind, Links, open_checked, open_dir_fd};

/// How often a fresh name is tried when one is taken.
const FRESH_NAME_ATTEMPTS: u32 = 16;
/// What sets lwpvmm's fresh names apart in a process.
static FRESH: AtomicU64 = AtomicU64::new(0);

/// A directory, by its descriptor.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

impl Dir {
    /// Opens the directory `path` names (following links on the way, as a
    /// user's path does).
    pub fn open(path: &Path) -> Result<Dir, HostFsError> {
        let fd = open_dir_fd(rustix::fs::CWD, path, path)?;
        Ok(Dir {
            fd,
            path: path.to_owned(),
        })
    }

    /// Creates the directory `path` (and its parents) when missing, then
    /// opens it.
    pub fn create(path: &Path) -> Result<Dir, HostFsError> {
        std::fs::create_dir_all(path).map_err(|source| HostFsError::Io {
            path: path.to_owned(),
            source,
        })?;
        Dir::open(path)
    }

    /// The directory's path, as named.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path of `name` in it, for messages.
    pub fn shown(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// What `name` in it is, without following a link; `None` when absent.
    pub fn kind(&self, name: &str) -> Option<Kind> {
        rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW)
            .ok()
            .map(|st| Kind::of(&st))
    }

    /// Opens the regular file `name` in it for reading: a symbolic link, a
    /// FIFO or a device there is refused, never opened.
    pub fn open_input(&self, name: &str) -> Result<Input, HostFsError> {
        open_checked(
            self.fd.as_fd(),
            Path::new(name),
            &self.shown(name),
            Links::Refuse,
            Access::Read,
        )
    }

    /// Opens the regular file at `parts` below it, one component at a
    /// time, following no symbolic link and opening nothing but
    /// directories on the way (a sysroot's guest paths).
    pub fn open_below(&self, parts: &[&str]) -> Result<Input, HostFsError> {
        let shown = parts.iter().fold(self.path.clone(), |p, c| p.join(c));
        let (leaf, dirs) = parts.split_last().ok_or_else(|| HostFsError::Io {
            path: shown.clone(),
            source: std::io::ErrorKind::InvalidFilename.into(),
        })?;
        let mut dir: Option<OwnedFd> = None;
        for part in dirs {
            let at = dir.as_ref().unwrap_or(&self.fd);
            let st = rustix::fs::statat(at, *part, AtFlags::SYMLINK_NOFOLLOW)
                .map_err(HostFsError::io(&shown))?;
            match Kind::of(&st) {
                Kind::Directory => {}
                Kind::Symlink => return Err(HostFsError::Symlink { path: shown }),
                _ => {
                    return Err(HostFsError::Io {
                        path: shown,
                        source: rustix::io::Errno::NOTDIR.into(),
                    });
                }
            }
            dir = Some(
                rustix::fs::openat(at, *part, DIR_WALK_FLAGS, Mode::empty())
                    .map_err(HostFsError::io(&shown))?,
            );
        }
        let at = dir.as_ref().unwrap_or(&self.fd);
        open_checked(
            at.as_fd(),
            Path::new(leaf),
            &shown,
            Links::Refuse,
            Access::Read,
        )
    }

    /// The names of the entries in it (not `.` and `..`).
    pub fn names(&self) -> Result<Vec<String>, HostFsError> {
        let fd = rustix::fs::openat(
            &self.fd,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(HostFsError::io(&self.path))?;
        let entries = rustix::fs::Dir::read_from(&fd).map_err(HostFsError::io(&self.path))?;
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(HostFsError::io(&self.path))?;
            if let Ok(name) = entry.file_name().to_str()
                && name != "."
                && name != ".."
            {
                names.push(name.to_owned());
            }
        }
        Ok(names)
    }

    /// Opens the subdirectory `name` (not through a link).
    pub fn subdir(&self, name: &str) -> Result<Dir, HostFsError> {
        let shown = self.shown(name);
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(HostFsError::io(&shown))?;
        Ok(Dir { fd, path: shown })
    }

    /// A new, empty file that will become `name` in this directory when
    /// committed: created under a fresh name with `O_CREAT | O_EXCL |
    /// O_NOFOLLOW` (so nothing already there, link or FIFO, is opened), and
    /// removed if it is dropped uncommitted.
    pub fn create_new(&self, name: &str) -> Result<NewFile<'_>, HostFsError> {
        let shown = self.shown(name);
        for _ in 0..FRESH_NAME_ATTEMPTS {
            let part = format!(
                ".{name}.{}-{}.lwpvmm-part",
                std::process::id(),
                FRESH.fetch_add(1, Ordering::Relaxed)
            );
            match rustix::fs::openat(
                &self.fd,
                part.as_str(),
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            ) {
                Ok(fd) => {
                    return Ok(NewFile {
                        dir: self,
                        part,
                        name: name.to_owned(),
                        file: File::from(fd),
                        committed: false,
                    });
                }
                Err(rustix::io::Errno::EXIST) => continue,
                Err(e) => return Err(HostFsError::io(&shown)(e)),
            }
        }
        Err(HostFsError::Io {
            path: shown,
            source: rustix::io::Errno::EXIST.into(),
        })
    }
}

/// A file being written beneath a [`Dir`], not yet under its name.
#[derive(Debug)]
pub struct NewFile<'d> {
    dir: &'d Dir,
    part: String,
    name: String,
    file: File,
    committed: bool,
}

impl NewFile<'_> {
    /// The open file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The open file, to write to.
    pub fn file_mut(&mut self) -> &mut File {
        &mut self.file
    }

    /// Writes all of `bytes` at the current position.
    pub fn write_all(&mut self, bytes: &[u8]) -> Result<(), HostFsError> {
        self.file
            .write_all(bytes)
            .map_err(|source| HostFsError::Io {
                path: self.dir.shown(&self.name),
                source,
            })
    }

    /// Renames it over its name: whatever was there (a file, a planted
    /// link, a FIFO) is replaced, never written through.
    pub fn commit(mut self) -> Result<(), HostFsError> {
        rustix::fs::renameat(
            &self.dir.fd,
            self.part.as_str(),
            &self.dir.fd,
            self.name.as_str(),
        )
        .map_err(HostFsError::io(&self.dir.shown(&self.name)))?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for NewFile<'_> {
    fn drop(&mut self) {
        if !self.committed {
            // Best effort: the write that failed is the error to report.
            let _ = rustix::fs::unlinkat(&self.dir.fd, self.part.as_str(), AtFlags::empty());
        }
    }
}

/// A file whose whole content is replaced at each write (the metrics): a
/// new file beneath its directory's descriptor each time, renamed over it,
/// so the file always holds one whole document.
#[derive(Debug)]
pub struct Rewrite {
    dir: Dir,
    name: String,
}

impl Rewrite {
    /// Checks that `path` can be rewritten: its directory opens, a file
    /// can be created in it (a fresh one, removed at once), and `path` is
    /// not a directory. The file itself is not touched until the first
    /// [`Self::replace`].
    pub fn new(path: &Path) -> Result<Rewrite, HostFsError> {
        let io = |kind: std::io::ErrorKind| HostFsError::Io {
            path: path.to_owned(),
            source: kind.into(),
        };
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| io(std::io::ErrorKind::InvalidFilename))?;
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let dir = Dir::open(parent).map_err(|e| e.at(path))?;
        if dir.kind(name) == Some(Kind::Directory) {
            return Err(io(std::io::ErrorKind::IsADirectory));
        }
        drop(dir.create_new(name).map_err(|e| e.at(path))?);
        Ok(Rewrite {
            dir,
            name: name.to_owned(),
        })
    }

    /// The next content, written under a fresh name until it is
    /// committed.
    pub fn begin(&self) -> Result<NewFile<'_>, HostFsError> {
        self.dir.create_new(&self.name)
    }

    /// Replaces the content with `bytes`.
    pub fn replace(&self, bytes: &[u8]) -> Result<(), HostFsError> {
        let mut file = self.begin()?;
        file.write_all(bytes)?;
        file.commit()
    }

    /// The file's path.
    pub fn path(&self) -> PathBuf {
        self.dir.shown(&self.name)
    }
}

/// A directory of lwpvmm's own under the system's temporary directory
/// (for the trace `lwpvmm demo` and `profile` read back): made under a
/// fresh name by `mkdir`, which takes no name already there, owner-only,
/// and removed with what it holds when dropped, so that nobody else's file
/// or link in /tmp is written through.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// A new one whose name starts with `prefix`.
    pub fn new(prefix: &str) -> Result<TempDir, HostFsError> {
        let base = std::env::temp_dir();
        for _ in 0..FRESH_NAME_ATTEMPTS {
            let path = base.join(format!(
                "{prefix}-{}-{}",
                std::process::id(),
                FRESH.fetch_add(1, Ordering::Relaxed)
            ));
            match rustix::fs::mkdir(&path, Mode::from_raw_mode(0o700)) {
                Ok(()) => return Ok(TempDir { path }),
                Err(rustix::io::Errno::EXIST) => continue,
                Err(e) => return Err(HostFsError::io(&path)(e)),
            }
        }
        Err(HostFsError::Io {
            path: base,
            source: rustix::io::Errno::EXIST.into(),
        })
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // Best effort: what the command printed is its result.
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
