//! bzImages of every format the kernel's build makes, compressed here as
//! its Makefiles compress (xz with the x86 filter, the size appended to
//! all but gzip), and bzImages that lie.

use std::io::Write;

use super::*;

/// A kernel-like payload: a guest ELF, so that the bytes are code.
fn kernel() -> Vec<u8> {
    crate::guests::get("demo").expect("the demo guest").to_vec()
}

fn size_appended(mut compressed: Vec<u8>, plain: &[u8]) -> Vec<u8> {
    compressed.extend_from_slice(&(plain.len() as u32).to_le_bytes());
    compressed
}

/// `plain` compressed in `format`, as `arch/x86/boot/compressed/Makefile`
/// makes a payload.
pub(crate) fn compress(format: Format, plain: &[u8]) -> Vec<u8> {
    use liblzma::stream::{Check, Filters, LzmaOptions, Stream};
    let lzma = |stream: Stream| {
        let mut out = Vec::new();
        liblzma::read::XzEncoder::new_stream(plain, stream)
            .read_to_end(&mut out)
            .unwrap();
        out
    };
    let compressed = match format {
        Format::Gzip => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
            e.write_all(plain).unwrap();
            return e.finish().unwrap();
        }
        Format::Xz => {
            let mut filters = Filters::new();
            filters.x86().lzma2(&LzmaOptions::new_preset(6).unwrap());
            lzma(Stream::new_stream_encoder(&filters, Check::Crc32).unwrap())
        }
        Format::Lzma => {
            lzma(Stream::new_lzma_encoder(&LzmaOptions::new_preset(6).unwrap()).unwrap())
        }
        Format::Zstd => {
            ruzstd::encoding::compress_to_vec(plain, ruzstd::encoding::CompressionLevel::Fastest)
        }
        Format::Bzip2 => {
            let mut e = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::best());
            e.write_all(plain).unwrap();
            e.finish().unwrap()
        }
        Format::Lz4 => {
            let mut out = vec![0x02, 0x21, 0x4c, 0x18];
            for chunk in plain.chunks(LZ4_LEGACY_BLOCK) {
                let block = lz4_flex::block::compress(chunk);
                out.extend_from_slice(&(block.len() as u32).to_le_bytes());
                out.extend_from_slice(&block);
            }
            out
        }
        Format::Lzo => {
            // lzop 1.04's header: version, library version, version needed,
            // method, level, flags (Adler-32 of the data), mode, mtime
            // (low, high), no name, the header's checksum.
            let mut out = vec![0x89, b'L', b'Z', b'O', 0, b'\r', b'\n', 0x1a, b'\n'];
            out.extend_from_slice(&0x1040u16.to_be_bytes());
            out.extend_from_slice(&0x20a0u16.to_be_bytes());
            out.extend_from_slice(&0x0940u16.to_be_bytes());
            out.extend_from_slice(&[1, 9]);
            out.extend_from_slice(&LZOP_ADLER32_D.to_be_bytes());
            out.extend_from_slice(&[0; 12]);
            out.push(0);
            out.extend_from_slice(&[0; 4]);
            for chunk in plain.chunks(256 << 10) {
                let block = lzo1x::compress(chunk, lzo1x::CompressLevel::default());
                out.extend_from_slice(&(chunk.len() as u32).to_be_bytes());
                out.extend_from_slice(&(block.len() as u32).to_be_bytes());
                out.extend_from_slice(&[0; 4]);
                out.extend_from_slice(&block);
            }
            out.extend_from_slice(&[0; 4]);
            out
        }
    };
    size_appended(compressed, plain)
}

/// A bzImage of boot protocol 2.15 with one setup sector whose payload is
/// `payload`, 0x10 bytes into the protected-mode code.
pub(crate) fn bzimage(payload: &[u8]) -> Vec<u8> {
    let mut image = vec![0u8; 1024 + 0x10];
    image[SETUP_SECTS] = 1;
    // boot_flag, loadflags' LOADED_HIGH, code32_start at 1 MiB.
    image[0x1fe..0x200].copy_from_slice(&0xaa55u16.to_le_bytes());
    image[0x211] = 1;
    image[0x214..0x218].copy_from_slice(&0x10_0000u32.to_le_bytes());
    image[HEADER_MAGIC..HEADER_MAGIC + 4].copy_from_slice(b"HdrS");
    image[VERSION..VERSION + 2].copy_from_slice(&0x020fu16.to_le_bytes());
    // xloadflags: XLF_KERNEL_64.
    image[0x236] = 1;
    image[PAYLOAD_OFFSET..PAYLOAD_OFFSET + 4].copy_from_slice(&0x10u32.to_le_bytes());
    image[PAYLOAD_LENGTH..PAYLOAD_LENGTH + 4]
        .copy_from_slice(&(payload.len() as u32).to_le_bytes());
    image.extend_from_slice(payload);
    image
}

const FORMATS: [Format; 7] = [
    Format::Gzip,
    Format::Xz,
    Format::Zstd,
    Format::Lz4,
    Format::Bzip2,
    Format::Lzma,
    Format::Lzo,
];

#[test]
fn every_format_decompresses_to_the_kernel() {
    let plain = kernel();
    for format in FORMATS {
        let image = bzimage(&compress(format, &plain));
        let got = decompress(&image).unwrap_or_else(|e| panic!("{format}: {e}"));
        assert_eq!(got.format, format);
        assert!(got.bytes == plain, "{format}: other bytes");
    }
}

#[test]
fn a_payload_larger_than_a_block_decompresses_whole() {
    // Two LZ4 legacy blocks and many lzop blocks.
    let plain: Vec<u8> = (0..(9u32 << 20)).map(|i| (i % 251) as u8).collect();
    for format in [Format::Lz4, Format::Lzo, Format::Xz] {
        let got = decompress(&bzimage(&compress(format, &plain))).unwrap();
        assert!(got.bytes == plain, "{format}");
    }
}

#[test]
fn images_that_lie_are_refused_with_the_reason() {
    let plain = kernel();
    let xz = compress(Format::Xz, &plain);
    let with_size = |mut p: Vec<u8>, size: u32| {
        let at = p.len() - 4;
        p[at..].copy_from_slice(&size.to_le_bytes());
        p
    };
    let mut far = bzimage(&xz);
    far[PAYLOAD_OFFSET..PAYLOAD_OFFSET + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    let mut old = bzimage(&xz);
    old[VERSION..VERSION + 2].copy_from_slice(&0x0206u16.to_le_bytes());
    let mut truncated = xz[..xz.len() / 2].to_vec();
    truncated.extend_from_slice(&xz[xz.len() - 4..]);
    let small = plain.len() as u32 - 1;
    let large = plain.len() as u32 + 1;
    // (what, image, the error's text)
    let table: [(&str, Vec<u8>, &str); 9] = [
        ("an ELF", plain.clone(), "not a bzImage"),
        ("protocol 2.06", old, "not a bzImage"),
        ("a payload past the end", far, "past the image"),
        (
            "an unknown magic",
            bzimage(b"\x01\x02\x03\x04\x05\x06"),
            "does not know",
        ),
        (
            "a size past the limit",
            bzimage(&with_size(xz.clone(), u32::MAX)),
            "limit",
        ),
        ("a cut stream", bzimage(&truncated), "does not decompress"),
        (
            "a size too small",
            bzimage(&with_size(xz.clone(), small)),
            "not the",
        ),
        (
            "a size too large",
            bzimage(&with_size(xz.clone(), large)),
            "not the",
        ),
        (
            "an LZ4 block past the payload",
            bzimage(&size_appended(
                vec![0x02, 0x21, 0x4c, 0x18, 0xff, 0, 0, 0, 1],
                &plain,
            )),
            "runs past",
        ),
    ];
    for (what, image, text) in table {
        match decompress(&image) {
            Ok(_) => panic!("{what}: decompressed"),
            Err(e) => assert!(e.to_string().contains(text), "{what}: {e}"),
        }
    }
}
