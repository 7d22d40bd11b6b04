//! Where `lwpvmm report --sysroot` finds the guest's files: a directory
//! holding them, or the initramfs the guest booted (newc cpio, plain or
//! gzipped, archives concatenated as the kernel takes them). Guest paths
//! are looked up as the guest named them; a path with `..` is refused.

use std::collections::HashMap;
use std::io::{Cursor, Read};
use std::ops::Range;
use std::path::{Component, Path, PathBuf};

use flate2::read::GzDecoder;
use thiserror::Error;

/// The largest initramfs `--sysroot` takes, decompressed.
pub const ARCHIVE_MAX: u64 = 2 << 30;
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const NEWC_MAGICS: [&[u8; 6]; 2] = [b"070701", b"070702"];
/// The file-type bits of a cpio mode, and a regular file's.
const MODE_TYPE: u32 = 0o170_000;
const MODE_REGULAR: u32 = 0o100_000;

/// Why a sysroot could not be opened.
#[derive(Debug, Error)]
pub enum SysrootError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
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

/// The guest's files.
#[derive(Debug)]
pub enum Sysroot {
    /// A directory: the guest's `/a/b` is `DIR/a/b`.
    Dir(PathBuf),
    /// An initramfs in memory, with where each regular file's bytes lie.
    Archive {
        bytes: Vec<u8>,
        files: HashMap<String, Range<usize>>,
    },
}

impl Sysroot {
    /// Opens `path`: a directory, else an initramfs.
    pub fn open(path: &Path) -> Result<Self, SysrootError> {
        if path.is_dir() {
            return Ok(Sysroot::Dir(path.to_path_buf()));
        }
        let read = |source| SysrootError::Read {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(read)?;
        let mut raw = Vec::new();
        file.take(ARCHIVE_MAX + 1)
            .read_to_end(&mut raw)
            .map_err(read)?;
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
        Ok(Sysroot::Archive { bytes, files })
    }

    /// The guest file `guest_path`, when the sysroot has it.
    pub fn read(&self, guest_path: &str) -> Option<Vec<u8>> {
        let parts = normal(guest_path)?;
        match self {
            Sysroot::Dir(root) => {
                std::fs::read(parts.iter().fold(root.clone(), |p, c| p.join(c))).ok()
            }
            Sysroot::Archive { bytes, files } => {
                let range = files.get(&parts.join("/"))?;
                bytes.get(range.clone()).map(<[u8]>::to_vec)
            }
        }
    }
}

/// The components of a guest path, without the root and `.`; `None` for
/// `..` or an empty path.
fn normal(path: &str) -> Option<Vec<&str>> {
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
            assert_eq!(root.read(path).as_deref(), want, "{path}");
        }
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
            Err(SysrootError::Read { .. })
        ));
    }
}
