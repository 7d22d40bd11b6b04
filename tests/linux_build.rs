//! resources/linux/build.sh builds what it is asked for: by default what a
//! user boots (vmlinux, vmlinuz, lwpvmm.ko, initramfs.cpio, rootfs.ext4),
//! and the bzImage in every other compression only with `--test-images`;
//! a kernel already built is reused, not built again, and a run ends with
//! the time it took. The kernel is built at most once here, by
//! `common::linux()`; every run below finds it cached.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::linux;

/// The test images, which only `--test-images` builds.
const TEST_IMAGES: [&str; 6] = [
    "vmlinuz.gzip",
    "vmlinuz.bzip2",
    "vmlinuz.lzma",
    "vmlinuz.lzo",
    "vmlinuz.lz4",
    "vmlinuz.zstd",
];

fn build_sh(args: &[&Path]) -> Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("resources/linux/build.sh");
    Command::new(script).args(args).output().unwrap()
}

/// A guest directory holding the kernel of `from`, as a default build
/// leaves it: no test images, no initramfs or disk image yet.
fn kernel_only(from: &Path, name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for file in ["vmlinux", "vmlinuz", "lwpvmm.ko", "vmlinux.key"] {
        std::fs::copy(from.join(file), dir.join(file)).unwrap();
    }
    let copied = Command::new("cp")
        .arg("-r")
        .arg(from.join("support"))
        .arg(&dir)
        .status()
        .unwrap();
    assert!(copied.success());
    dir
}

#[test]
fn build_sh_builds_what_is_asked_and_reuses_a_built_kernel() {
    let built = linux();
    let default = kernel_only(built, "linux-build-default");
    let (none, bogus) = (Path::new("--no-such-option"), Path::new("dir"));
    let test_images = Path::new("--test-images");
    // (arguments, exit status, what standard error says, files there
    // after it, files not there)
    type Case<'a> = (Vec<&'a Path>, i32, Vec<&'a str>, Vec<&'a str>, Vec<&'a str>);
    let table: [Case; 4] = [
        (vec![], 2, vec!["usage:", "--test-images"], vec![], vec![]),
        (vec![none, bogus], 2, vec!["usage:"], vec![], vec![]),
        // The default build reuses the kernel and makes no test image.
        (
            vec![&default],
            0,
            vec!["is cached", "rootfs.ext4 in "],
            vec!["initramfs.cpio", "rootfs.ext4", "vmlinuz"],
            TEST_IMAGES.to_vec(),
        ),
        // The tests' guest has them all: nothing of the kernel is built.
        (
            vec![test_images, built],
            0,
            vec!["is cached", "rootfs.ext4 in "],
            [&["initramfs.cpio", "rootfs.ext4"][..], &TEST_IMAGES[..]].concat(),
            vec![],
        ),
    ];
    for (args, status, said, there, absent) in table {
        let out = build_sh(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(status), "{args:?}: {err}");
        for text in said {
            assert!(err.contains(text), "{args:?}: `{text}` not in: {err}");
        }
        assert!(!err.contains("building kernel"), "{args:?}: {err}");
        let dir = args.last().copied().unwrap_or(bogus);
        for file in there {
            assert!(dir.join(file).is_file(), "{args:?}: no {file}");
        }
        for file in absent {
            assert!(!dir.join(file).exists(), "{args:?}: {file} was built");
        }
    }
    std::fs::remove_dir_all(default).unwrap();
}
