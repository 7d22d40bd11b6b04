//! A bzImage's kernel, decompressed on the host. A bzImage carries the
//! kernel ELF compressed behind a small decompressor; on hosts whose KVM
//! runs guest CPL0 in its instruction emulator (kvm_pvm), that decompressor
//! takes minutes over a distribution kernel's payload, while the host takes
//! milliseconds. The setup header says where the payload lies
//! (`payload_offset`, `payload_length`, boot protocol 2.08 and later); its
//! first bytes say the format, and its last four the size decompressed
//! (the kernel's build appends it to every format), which bounds what is
//! decompressed before a byte of it is.
//!
//! Every decoder is a maintained crate (docs/design.md); only the framing
//! of the two formats whose crates decode bare blocks is read here: LZ4's
//! legacy frames (`lz4 -l`) and lzop's file format.

use std::io::{self, Read};

use thiserror::Error;

/// The largest kernel lwpvmm decompresses (Debian's 6.1 vmlinux with its
/// relocations is about 60 MiB).
pub const MAX_KERNEL_BYTES: u64 = 256 << 20;

const SETUP_SECTS: usize = 0x1f1;
const HEADER_MAGIC: usize = 0x202;
const VERSION: usize = 0x206;
const PAYLOAD_OFFSET: usize = 0x248;
const PAYLOAD_LENGTH: usize = 0x24c;

/// A payload's compression, as its first bytes say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// gzip (`CONFIG_KERNEL_GZIP`).
    Gzip,
    /// xz, with the x86 BCJ filter (`CONFIG_KERNEL_XZ`).
    Xz,
    /// zstd (`CONFIG_KERNEL_ZSTD`).
    Zstd,
    /// LZ4 legacy frames (`CONFIG_KERNEL_LZ4`).
    Lz4,
    /// bzip2 (`CONFIG_KERNEL_BZIP2`).
    Bzip2,
    /// LZMA "alone" (`CONFIG_KERNEL_LZMA`).
    Lzma,
    /// lzop (`CONFIG_KERNEL_LZO`).
    Lzo,
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Format::Gzip => "gzip",
            Format::Xz => "xz",
            Format::Zstd => "zstd",
            Format::Lz4 => "lz4",
            Format::Bzip2 => "bzip2",
            Format::Lzma => "lzma",
            Format::Lzo => "lzo",
        })
    }
}

/// Each format's first bytes.
const MAGICS: [(&[u8], Format); 7] = [
    (&[0x1f, 0x8b], Format::Gzip),
    (&[0xfd, b'7', b'z', b'X', b'Z', 0], Format::Xz),
    (&[0x28, 0xb5, 0x2f, 0xfd], Format::Zstd),
    (&[0x02, 0x21, 0x4c, 0x18], Format::Lz4),
    (b"BZh", Format::Bzip2),
    (&[0x5d, 0, 0], Format::Lzma),
    (
        &[0x89, b'L', b'Z', b'O', 0, b'\r', b'\n', 0x1a, b'\n'],
        Format::Lzo,
    ),
];

/// Why a bzImage's payload was not decompressed.
#[derive(Debug, Error)]
pub enum PayloadError {
    /// Not a bzImage of boot protocol 2.08 or later (no payload fields).
    #[error("not a bzImage with a payload (boot protocol 2.08 or later)")]
    NotBzImage,
    /// The payload lies outside the image.
    #[error(
        "its setup header puts a {len}-byte payload at {offset:#x}, past the image's {image} bytes"
    )]
    OutOfImage {
        /// Where the payload starts in the image.
        offset: u64,
        /// Its length.
        len: u64,
        /// The image's length.
        image: usize,
    },
    /// A compression lwpvmm does not know.
    #[error("its payload starts with {magic:02x?}, a compression lwpvmm does not know")]
    UnknownFormat {
        /// The payload's first bytes.
        magic: Vec<u8>,
    },
    /// The size the payload announces is too large.
    #[error(
        "its {format} payload says it decompresses to {size} bytes, more than lwpvmm's limit of {MAX_KERNEL_BYTES}"
    )]
    TooLarge {
        /// The format.
        format: Format,
        /// The size announced.
        size: u64,
    },
    /// The payload does not decompress.
    #[error("its {format} payload does not decompress: {source}")]
    Corrupt {
        /// The format.
        format: Format,
        /// What the decoder said.
        source: io::Error,
    },
    /// The payload decompressed to another size than it announced.
    #[error("its {format} payload decompressed to {got} bytes, not the {want} it announces")]
    SizeMismatch {
        /// The format.
        format: Format,
        /// Bytes decompressed (at most one more than announced).
        got: u64,
        /// Bytes announced.
        want: u64,
    },
}

/// A bzImage's payload, decompressed.
#[derive(Debug)]
pub struct Kernel {
    /// Its compression.
    pub format: Format,
    /// What it held: the kernel ELF (with its relocations after it).
    pub bytes: Vec<u8>,
}

/// The first `N` bytes of `b`, when it has them.
fn bytes<const N: usize>(b: &[u8]) -> Option<[u8; N]> {
    b.get(..N)?.try_into().ok()
}

fn u32_at(image: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes(image.get(at..)?)?))
}

/// Where `image`'s payload lies, when it is a bzImage of boot protocol
/// 2.08 or later.
pub fn locate(image: &[u8]) -> Result<&[u8], PayloadError> {
    if u32_at(image, HEADER_MAGIC) != Some(u32::from_le_bytes(*b"HdrS")) {
        return Err(PayloadError::NotBzImage);
    }
    let version = image
        .get(VERSION..VERSION + 2)
        .map_or(0, |b| u16::from_le_bytes([b[0], b[1]]));
    if version < 0x0208 {
        return Err(PayloadError::NotBzImage);
    }
    let sects = match image[SETUP_SECTS] {
        0 => 4,
        n => u64::from(n),
    };
    let (Some(offset), Some(len)) = (u32_at(image, PAYLOAD_OFFSET), u32_at(image, PAYLOAD_LENGTH))
    else {
        return Err(PayloadError::NotBzImage);
    };
    // A header of 2.08 or later that describes no payload is treated as
    // one of an older protocol: its code is loaded as it is.
    if len == 0 {
        return Err(PayloadError::NotBzImage);
    }
    let start = (sects + 1) * 512 + u64::from(offset);
    let end = start + u64::from(len);
    usize::try_from(start)
        .ok()
        .zip(usize::try_from(end).ok())
        .and_then(|(s, e)| image.get(s..e))
        .filter(|p| p.len() >= 4)
        .ok_or(PayloadError::OutOfImage {
            offset: start,
            len: u64::from(len),
            image: image.len(),
        })
}

/// The format of `payload`, from its first bytes.
pub fn format(payload: &[u8]) -> Result<Format, PayloadError> {
    MAGICS
        .iter()
        .find(|(magic, _)| payload.starts_with(magic))
        .map(|&(_, f)| f)
        .ok_or_else(|| PayloadError::UnknownFormat {
            magic: payload.iter().take(8).copied().collect(),
        })
}

/// Decompresses `image`'s payload.
pub fn decompress(image: &[u8]) -> Result<Kernel, PayloadError> {
    let payload = locate(image)?;
    let format = format(payload)?;
    let (data, size) = payload.split_at(payload.len() - 4);
    let want = u64::from(u32_at(size, 0).unwrap_or(0));
    if want > MAX_KERNEL_BYTES {
        return Err(PayloadError::TooLarge { format, size: want });
    }
    let corrupt = |source| PayloadError::Corrupt { format, source };
    // Reserved up front only to a point: a size a crafted image announces
    // costs what it decompresses to, not what it claims.
    let mut out = Vec::with_capacity(want.min(64 << 20) as usize);
    // gzip ends with its own size field: the decoder reads it as the
    // member's trailer, so gzip's payload is decoded whole.
    let data = if format == Format::Gzip {
        payload
    } else {
        data
    };
    // At most one byte more than announced: enough to see a lie.
    let limit = want + 1;
    match format {
        Format::Gzip => flate2::read::GzDecoder::new(data)
            .take(limit)
            .read_to_end(&mut out)
            .map(drop),
        Format::Xz => liblzma::read::XzDecoder::new(data)
            .take(limit)
            .read_to_end(&mut out)
            .map(drop),
        Format::Lzma => liblzma::stream::Stream::new_lzma_decoder(u64::MAX)
            .map_err(io::Error::other)
            .and_then(|s| {
                liblzma::read::XzDecoder::new_stream(data, s)
                    .take(limit)
                    .read_to_end(&mut out)
            })
            .map(drop),
        Format::Zstd => ruzstd::decoding::StreamingDecoder::new(data)
            .map_err(io::Error::other)
            .and_then(|d| d.take(limit).read_to_end(&mut out))
            .map(drop),
        Format::Bzip2 => bzip2::read::BzDecoder::new(data)
            .take(limit)
            .read_to_end(&mut out)
            .map(drop),
        Format::Lz4 => lz4_legacy(data, limit, &mut out),
        Format::Lzo => lzop(data, limit, &mut out),
    }
    .map_err(corrupt)?;
    if out.len() as u64 != want {
        return Err(PayloadError::SizeMismatch {
            format,
            got: out.len() as u64,
            want,
        });
    }
    Ok(Kernel { format, bytes: out })
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

/// The largest block of an LZ4 legacy frame, decompressed.
const LZ4_LEGACY_BLOCK: usize = 8 << 20;
/// The largest lzop block lwpvmm decompresses (lzop writes 256 KiB ones).
const LZOP_BLOCK_MAX: usize = 64 << 20;

/// LZ4's legacy format: its magic, then blocks of at most 8 MiB each
/// behind their compressed length, until the input ends.
fn lz4_legacy(data: &[u8], limit: u64, out: &mut Vec<u8>) -> io::Result<()> {
    let mut rest = data.get(4..).ok_or_else(|| invalid("no LZ4 magic"))?;
    let mut block = vec![0u8; LZ4_LEGACY_BLOCK];
    while rest.len() >= 4 {
        let (len, after) = rest.split_at(4);
        let len = u32_at(len, 0).unwrap_or(0) as usize;
        // A new frame's magic: the kernel's decoder starts over.
        if len == 0x184c_2102 {
            rest = after;
            continue;
        }
        let input = after
            .get(..len)
            .ok_or_else(|| invalid("an LZ4 block runs past the payload"))?;
        let n = lz4_flex::block::decompress_into(input, &mut block).map_err(io::Error::other)?;
        out.extend_from_slice(&block[..n]);
        if out.len() as u64 > limit {
            return Ok(());
        }
        rest = &after[len..];
    }
    Ok(())
}

const LZOP_ADLER32_D: u32 = 0x1;
const LZOP_ADLER32_C: u32 = 0x2;
const LZOP_H_FILTER: u32 = 0x800;
const LZOP_CRC32_D: u32 = 0x100;
const LZOP_CRC32_C: u32 = 0x200;

/// Reads big-endian fields of an lzop file.
struct Be<'a>(&'a [u8]);

impl<'a> Be<'a> {
    fn take(&mut self, n: usize) -> io::Result<&'a [u8]> {
        if self.0.len() < n {
            return Err(invalid("the lzop data ends early"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> io::Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> io::Result<u16> {
        let b = bytes(self.take(2)?).ok_or_else(|| invalid("the lzop data ends early"))?;
        Ok(u16::from_be_bytes(b))
    }

    fn u32(&mut self) -> io::Result<u32> {
        let b = bytes(self.take(4)?).ok_or_else(|| invalid("the lzop data ends early"))?;
        Ok(u32::from_be_bytes(b))
    }
}

/// lzop's file format, as the kernel's `unlzo` reads it: a header, then
/// blocks of LZO1X data (or stored data) behind their lengths and
/// checksums, until a zero length.
fn lzop(data: &[u8], limit: u64, out: &mut Vec<u8>) -> io::Result<()> {
    let mut r = Be(data);
    r.take(9)?;
    let version = r.u16()?;
    r.u16()?;
    if version >= 0x0940 {
        r.u16()?;
    }
    r.u8()?;
    if version >= 0x0940 {
        r.u8()?;
    }
    let flags = r.u32()?;
    if flags & LZOP_H_FILTER != 0 {
        r.u32()?;
    }
    r.take(8)?;
    if version >= 0x0940 {
        r.u32()?;
    }
    let name = usize::from(r.u8()?);
    r.take(name)?;
    r.u32()?;
    loop {
        let dst = r.u32()? as usize;
        if dst == 0 {
            return Ok(());
        }
        if dst > LZOP_BLOCK_MAX {
            return Err(invalid("an lzop block larger than 64 MiB"));
        }
        let src = r.u32()? as usize;
        if flags & (LZOP_ADLER32_D | LZOP_CRC32_D) != 0 {
            r.u32()?;
        }
        if src < dst && flags & (LZOP_ADLER32_C | LZOP_CRC32_C) != 0 {
            r.u32()?;
        }
        let block = r.take(src)?;
        if src == dst {
            out.extend_from_slice(block);
        } else {
            let mut plain = vec![0; dst];
            lzo1x::decompress(block, &mut plain).map_err(|e| invalid(&format!("LZO1X: {e}")))?;
            out.extend_from_slice(&plain);
        }
        if out.len() as u64 > limit {
            return Ok(());
        }
    }
}

#[cfg(test)]
#[path = "payload_tests.rs"]
pub(crate) mod tests;
