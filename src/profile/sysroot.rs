//! Where `lwpvmm report --sysroot` and the control API find the guest's
//! files: a directory holding them, or the initramfs the guest booted (newc
//! cpio, plain or gzipped, archives concatenated as the kernel takes them).
//!
//! Guest paths are hostile input (the guest module reports them, and a
//! guest can plant any file in a disk image mounted as the sysroot), so one
//! function, [`Sysroot::open_file`], decides for both what may be read:
//! a path with `..` is refused; in a directory every component is opened
//! with `O_NOFOLLOW` below a descriptor of the sysroot, so no symbolic
//! link is followed (the guest module reports paths with their links
//! resolved, so a real guest's paths have none); only a regular file is
//! opened, without blocking, and read up to [`FILE_MAX`] bytes.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Cursor, Read};
use std::ops::Range;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use flate2::read::GzDecoder;
use thiserror::Error;

use crate::hostfs::{Dir, HostFsError};

/// The largest initramfs `--sysroot` takes, decompressed.
pub const ARCHIVE_MAX: u64 = 2 << 30;
/// The largest guest file read for its symbols: a larger one is refused.
pub const FILE_MAX: u64 = 256 << 20;
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const NEWC_MAGICS: [&[u8; 6]; 2] = [b"070701", b"070702"];
/// The file-type bits of a cpio mode, and a regular file's.
const MODE_TYPE: u32 = 0o170_000;
const MODE_REGULAR: u32 = 0o100_000;

/// Why a sysroot could not be opened.
#[derive(Debug, Error)]
pub enum SysrootError {
    #[error(transparent)]
    Read(#[from] HostFsError),
    #[error("{0}: neither a directory nor an initramfs (a newc cpio archive, plain or gzipped)")]
    NotAnArchive(PathBuf),
    #[error("{path}: a malformed cpio archive: {source}")]
    Malformed {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}: larger than {ARCHIVE_MAX} bytes once decompressed")]
    TooLarge(PathBuf),
}

/// Why a guest file was not read.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The sysroot has no such file.
    #[error("not in the sysroot")]
    Missing,
    /// The path has `..`, no name, or is not UTF-8.
    #[error("not a plain absolute path (`..` or no name)")]
    BadPath,
    /// A component of the path is a symbolic link.
    #[error("a symbolic link on the way (links are not followed)")]
    Symlink,
    /// A device, a FIFO, a socket or a directory.
    #[error("not a regular file")]
    NotRegular,
    /// Larger than [`FILE_MAX`].
    #[error("{0} bytes, more than the {FILE_MAX} read for a guest file")]
    TooLarge(u64),
    /// The file changed between its check and its opening.
    #[error("replaced while it was opened")]
    Changed,
    /// A profile read as many bytes of guest files as it may.
    #[error("past the bytes one profile reads")]
    Budget,
    /// Reading failed.
    #[error("cannot be read ({0})")]
    Io(std::io::ErrorKind),
}

impl Refusal {
    /// Whether this is a refusal to count, not a file that is just absent.
    pub fn refused(&self) -> bool {
        !matches!(self, Refusal::Missing)
    }
}

/// Which file a guest path names: two paths naming the same file have the
/// same identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileId {
    /// A directory sysroot's file: its device and inode.
    Inode(u64, u64),
    /// An initramfs's file: where its bytes start in the archive.
    Archived(usize),
}

/// A guest file opened and checked, not yet read.
#[derive(Debug)]
pub struct GuestFile<'a> {
    /// Which file it is.
    pub id: FileId,
    /// Its size in bytes (at most [`FILE_MAX`]).
    pub size: u64,
    source: Source<'a>,
}

#[derive(Debug)]
enum Source<'a> {
    File(File),
    Archived(&'a [u8]),
}

impl GuestFile<'_> {
    /// Its bytes, at most the size it had when it was opened.
    pub fn read(self) -> Result<Vec<u8>, Refusal> {
        match self.source {
            Source::Archived(bytes) => Ok(bytes.to_vec()),
            Source::File(file) => {
                let mut out = Vec::with_capacity(usize::try_from(self.size).unwrap_or(0));
                file.take(self.size)
                    .read_to_end(&mut out)
                    .map_err(|e| Refusal::Io(e.kind()))?;
                Ok(out)
            }
        }
    }
}

/// The guest's files, and the count of guest files refused (not the ones
/// just absent), for the metrics.
#[derive(Debug)]
pub struct Sysroot {
    files: Files,
    refused: AtomicU64,
}

#[derive(Debug)]
enum Files {
    /// A directory, opened once: guest paths are opened below it (the
    /// guest's `/a/b` is `DIR/a/b`).
    Dir(Dir),
    /// An initramfs in memory, with where each regular file's bytes lie.
    Archive {
        bytes: Vec<u8>,
        files: HashMap<String, Range<usize>>,
    },
}

impl Sysroot {
    /// Opens `path`: a directory, else an initramfs.
    pub fn open(path: &Path) -> Result<Self, SysrootError> {
        if crate::hostfs::is_dir(path) {
            return Ok(Sysroot::of(Files::Dir(Dir::open(path)?)));
        }
        let raw = crate::hostfs::read_input(path, ARCHIVE_MAX, "a sysroot archive's limit")
            .map_err(|e| match e {
                HostFsError::NotRegular { .. } => SysrootError::NotAnArchive(path.to_path_buf()),
                HostFsError::TooLarge { .. } => SysrootError::TooLarge(path.to_path_buf()),
                e => SysrootError::Read(e),
            })?;
        let bytes = if raw.starts_with(&GZIP_MAGIC) {
            let mut out = Vec::new();
            GzDecoder::new(raw.as_slice())
                .take(ARCHIVE_MAX + 1)
                .read_to_end(&mut out)
                .map_err(|source| SysrootError::Malformed {
                    path: path.to_path_buf(),
                    source,
                })?;
            out
        } else {
            raw
        };
        if bytes.len() as u64 > ARCHIVE_MAX {
            return Err(SysrootError::TooLarge(path.to_path_buf()));
        }
        if !NEWC_MAGICS.iter().any(|m| bytes.starts_with(*m)) {
            return Err(SysrootError::NotAnArchive(path.to_path_buf()));
        }
        let files = index(&bytes).map_err(|source| SysrootError::Malformed {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Sysroot::of(Files::Archive { bytes, files }))
    }

    fn of(files: Files) -> Self {
        Sysroot {
            files,
            refused: AtomicU64::new(0),
        }
    }

    /// A directory sysroot, for tests.
    #[cfg(test)]
    pub fn dir(path: &Path) -> Self {
        match Sysroot::open(path) {
            Ok(root) if matches!(root.files, Files::Dir(_)) => root,
            other => panic!("{}: not a directory sysroot: {other:?}", path.display()),
        }
    }

    /// Guest files refused so far (symbolic links, devices, FIFOs, files
    /// too large, ...), for the metrics.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Opens the guest file `guest_path` after the checks the module's
    /// header names; a refusal other than [`Refusal::Missing`] is counted.
    pub fn open_file(&self, guest_path: &str) -> Result<GuestFile<'_>, Refusal> {
        let got = self.open_checked(guest_path);
        if let Err(r) = &got
            && r.refused()
        {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        got
    }

    fn open_checked(&self, guest_path: &str) -> Result<GuestFile<'_>, Refusal> {
        let parts = normal(guest_path).ok_or(Refusal::BadPath)?;
        match &self.files {
            Files::Dir(root) => open_below(root, &parts),
            Files::Archive { bytes, files } => {
                let range = files.get(&parts.join("/")).ok_or(Refusal::Missing)?;
                let size = range.len() as u64;
                if size > FILE_MAX {
                    return Err(Refusal::TooLarge(size));
                }
                let data = bytes.get(range.clone()).ok_or(Refusal::Missing)?;
                Ok(GuestFile {
                    id: FileId::Archived(range.start),
                    size,
                    source: Source::Archived(data),
                })
            }
        }
    }

    /// The bytes of the guest file `guest_path` (see [`Self::open_file`]).
    pub fn read(&self, guest_path: &str) -> Result<Vec<u8>, Refusal> {
        self.open_file(guest_path)?.read()
    }
}

/// A refusal, from why the file was not opened.
fn refusal(e: HostFsError) -> Refusal {
    match e {
        HostFsError::Symlink { .. } => Refusal::Symlink,
        HostFsError::NotRegular { .. } => Refusal::NotRegular,
        HostFsError::Changed { .. } => Refusal::Changed,
        HostFsError::TooLarge { size, .. } => Refusal::TooLarge(size),
        HostFsError::Io { source, .. }
            if matches!(
                source.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            Refusal::Missing
        }
        HostFsError::Io { source, .. } => Refusal::Io(source.kind()),
        HostFsError::NoReader { .. } => Refusal::NotRegular,
    }
}

/// Opens `parts` below `root` ([`Dir::open_below`]: no link followed, only
/// directories on the way and a regular file at the end), at most
/// [`FILE_MAX`] bytes.
fn open_below<'a>(root: &Dir, parts: &[&str]) -> Result<GuestFile<'a>, Refusal> {
    let input = root
        .open_below(parts)
        .and_then(|f| f.at_most(FILE_MAX, "the most read of a guest file"))
        .map_err(refusal)?;
    let (dev, ino) = input.identity();
    Ok(GuestFile {
        id: FileId::Inode(dev, ino),
        size: input.size(),
        source: Source::File(input.into_file()),
    })
}

/// The components of a guest path, without the root and `.`; `None` for
/// `..` or an empty path.
pub fn normal(path: &str) -> Option<Vec<&str>> {
    let mut parts = Vec::new();
    for c in Path::new(path).components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(part) => parts.push(part.to_str()?),
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    (!parts.is_empty()).then_some(parts)
}

/// Where each regular file of the archives in `bytes` lies. Archives may
/// follow each other, with zeros between them, as in an initramfs.
fn index(bytes: &[u8]) -> std::io::Result<HashMap<String, Range<usize>>> {
    let mut files = HashMap::new();
    let mut at = 0;
    loop {
        at += bytes[at..].iter().take_while(|&&b| b == 0).count();
        if at >= bytes.len() {
            return Ok(files);
        }
        let mut cursor = Cursor::new(&bytes[at..]);
        loop {
            let mut entry = cpio::NewcReader::new(cursor)?;
            let e = entry.entry();
            if e.is_trailer() {
                cursor = entry.finish()?;
                break;
            }
            let (name, size, regular) = (
                e.name().to_owned(),
                e.file_size() as usize,
                e.mode() & MODE_TYPE == MODE_REGULAR,
            );
            let start = at + entry.offset()? as usize;
            let end = start
                .checked_add(size)
                .filter(|&end| end <= bytes.len())
                .ok_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!("{name}: its data runs past the archive's end"),
                    )
                })?;
            if regular && let Some(parts) = normal(&name) {
                // A later entry of the same name replaces an earlier one,
                // as the kernel unpacks it.
                files.insert(parts.join("/"), start..end);
            }
            cursor = entry.skip()?;
        }
        at += cursor.position() as usize;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A newc archive of `(name, mode, data)` entries and its trailer.
    fn archive(entries: &[(&str, u32, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, mode, data) in entries {
            let mut w = cpio::newc::Builder::new(name)
                .mode(*mode)
                .write(&mut out, data.len() as u32);
            w.write_all(data).unwrap();
            w.finish().unwrap();
        }
        cpio::newc::trailer(&mut out).unwrap();
        out
    }

    fn write(name: &str, bytes: &[u8]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("lwpvmm-sysroot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    /// An archive, a guest path, and what reading it gives.
    type Lookup<'a> = (&'a [u8], &'a str, Option<&'a [u8]>);

    #[test]
    fn an_initramfs_gives_its_regular_files_by_guest_path() {
        let first = archive(&[
            ("bin", 0o040_755, b""),
            ("bin/hot", 0o100_755, b"\x7fELF hot"),
            ("init", 0o100_755, b"old init"),
            ("dev/console", 0o020_600, b""),
        ]);
        let mut two = first.clone();
        two.extend_from_slice(&[0; 512]);
        two.extend(archive(&[("./init", 0o100_755, b"new init")]));
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&two).unwrap();
        let gzipped = gz.finish().unwrap();
        // (archive, guest path, what it reads)
        let table: [Lookup; 8] = [
            (&first, "/bin/hot", Some(b"\x7fELF hot")),
            (&first, "bin/hot", Some(b"\x7fELF hot")),
            (&first, "/init", Some(b"old init")),
            (&first, "/bin", None),
            (&first, "/dev/console", None),
            (&first, "/bin/../init", None),
            (&two, "/init", Some(b"new init")),
            (&gzipped, "/init", Some(b"new init")),
        ];
        for (i, (bytes, path, want)) in table.into_iter().enumerate() {
            let root = Sysroot::open(&write(&format!("a{i}.cpio"), bytes)).unwrap();
            assert_eq!(root.read(path).ok().as_deref(), want, "{path}");
        }
    }

    #[test]
    fn a_directory_gives_regular_files_below_it_and_refuses_the_rest() {
        use rustix::fs::{FileType, Mode, mknodat};
        let dir = std::env::temp_dir().join(format!("lwpvmm-sysroot-dir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        std::fs::create_dir_all(dir.join("dev")).unwrap();
        std::fs::write(dir.join("bin/tool"), b"\x7fELF tool").unwrap();
        std::os::unix::fs::symlink("/etc/hostname", dir.join("bin/out")).unwrap();
        std::os::unix::fs::symlink("tool", dir.join("bin/in")).unwrap();
        std::os::unix::fs::symlink("/", dir.join("up")).unwrap();
        let fifo = Mode::from_raw_mode(0o600);
        mknodat(
            rustix::fs::CWD,
            dir.join("dev/fifo"),
            FileType::Fifo,
            fifo,
            0,
        )
        .unwrap();
        // /dev/zero's device number: a character device that never ends.
        let zero = rustix::fs::makedev(1, 5);
        let chr = mknodat(
            rustix::fs::CWD,
            dir.join("dev/zero"),
            FileType::CharacterDevice,
            fifo,
            zero,
        );
        std::fs::File::create(dir.join("big"))
            .unwrap()
            .set_len(FILE_MAX + 1)
            .unwrap();
        let root = Sysroot::dir(&dir);
        // (guest path, what reading it gives)
        let mut table: Vec<(&str, Result<&[u8], Refusal>)> = vec![
            ("/bin/tool", Ok(b"\x7fELF tool")),
            ("/.//bin/./tool", Ok(b"\x7fELF tool")),
            ("/bin/out", Err(Refusal::Symlink)),
            ("/bin/in", Err(Refusal::Symlink)),
            ("/up/etc/hostname", Err(Refusal::Symlink)),
            ("/dev/fifo", Err(Refusal::NotRegular)),
            ("/bin", Err(Refusal::NotRegular)),
            ("/big", Err(Refusal::TooLarge(FILE_MAX + 1))),
            ("/bin/../bin/tool", Err(Refusal::BadPath)),
            ("/", Err(Refusal::BadPath)),
            ("/bin/tool/x", Err(Refusal::Missing)),
            ("/nothing", Err(Refusal::Missing)),
        ];
        // Creating a device node needs CAP_MKNOD and a mount without nodev.
        if chr.is_ok() {
            table.push(("/dev/zero", Err(Refusal::NotRegular)));
        }
        for (path, want) in &table {
            let got = root.read(path);
            assert_eq!(got.as_deref().map_err(|e| *e), *want, "{path}");
        }
        let refused = table
            .iter()
            .filter(|(_, w)| w.is_err_and(|r| r.refused()))
            .count();
        assert_eq!(root.refused(), refused as u64, "refusals are counted");
        // Two spellings of one file are one file.
        let id = |p| root.open_file(p).map(|f| f.id);
        assert_eq!(id("/bin/tool"), id("bin//tool"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn what_is_not_an_initramfs_is_refused() {
        let good = archive(&[("init", 0o100_755, b"0123456789")]);
        let mut cut = good.clone();
        cut.truncate(good.len() - 130);
        let mut bad_size = good.clone();
        // c_filesize (the seventh field, after the magic) of the first
        // header, claiming more bytes than follow.
        bad_size[6 + 6 * 8..6 + 7 * 8].copy_from_slice(b"7FFFFFFF");
        // (what, bytes, the error's variant)
        let table: [(&str, Vec<u8>, &str); 4] = [
            ("text", b"hello".to_vec(), "NotAnArchive"),
            ("a truncated archive", cut, "Malformed"),
            ("a size past the end", bad_size, "Malformed"),
            ("bad gzip", vec![0x1f, 0x8b, 0, 0], "Malformed"),
        ];
        for (i, (what, bytes, variant)) in table.into_iter().enumerate() {
            let err = Sysroot::open(&write(&format!("b{i}.cpio"), &bytes)).unwrap_err();
            assert!(format!("{err:?}").starts_with(variant), "{what}: {err:?}");
        }
        assert!(matches!(
            Sysroot::open(Path::new("/nonexistent/initramfs.cpio")),
            Err(SysrootError::Read(_))
        ));
    }
}
