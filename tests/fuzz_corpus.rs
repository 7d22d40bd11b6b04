//! The fuzz corpora stay live: every snapshot seed in the current format
//! decodes, and enough of them are in it, so that a format change that
//! leaves the corpus behind fails here and not, silently, in a fuzz
//! campaign that starts from nothing. (CI also compares each target's
//! coverage on its corpus with the floor in fuzz/corpus/FLOORS.)

// A test: a failed setup or expectation stops it with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use lwpvmm::vmm::snapshot::{FORMAT_VERSION, MAGIC, decode};

#[test]
fn snapshot_seeds_are_in_the_current_format() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/snapshot");
    let mut current = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("fuzz/corpus/snapshot") {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        let version = bytes
            .get(8..12)
            .filter(|_| bytes.starts_with(&MAGIC))
            .map(|v| u32::from_le_bytes(v.try_into().unwrap()));
        if version == Some(FORMAT_VERSION) {
            let snap = decode(&bytes, &path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            current.push(snap.vcpus.iter().filter(|v| v.lwp.is_some()).count());
        }
    }
    assert!(
        current.len() >= 4,
        "{} seeds of format {FORMAT_VERSION}: regenerate the corpus (fuzz/README.md)",
        current.len()
    );
    assert!(
        current.iter().filter(|&&lwp| lwp > 0).count() >= 3,
        "seeds with LWP state reach the LWP checks: {current:?}"
    );
}

/// The payload seeds include bzImages whose payloads the standard tools
/// made (gzip, xz with the x86 filter, lzma, bzip2, `zstd -19`, `lz4 -l`,
/// `lzop`): a seed of every format decompresses to its ELF.
#[test]
fn payload_seeds_decompress_in_every_format() {
    use lwpvmm::vmm::boot::payload::{Format, decompress};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/payload");
    let mut formats = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("fuzz/corpus/payload") {
        let path = entry.unwrap().path();
        if let Ok(kernel) = decompress(&std::fs::read(&path).unwrap())
            && kernel.bytes.starts_with(b"\x7fELF")
        {
            formats.push(kernel.format);
        }
    }
    for format in [
        Format::Gzip,
        Format::Xz,
        Format::Lzma,
        Format::Bzip2,
        Format::Zstd,
        Format::Lz4,
        Format::Lzo,
    ] {
        assert!(formats.contains(&format), "no {format} seed: {formats:?}");
    }
}
