//! What each opener does with each kind of file a hostile name can point at.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

use super::input::*;
use super::*;

/// A fresh directory of its own for a test.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lwpvmm-hostfs-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn mkfifo(path: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::Fifo,
        Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
}

/// What a name can be, planted at `dir/name`.
#[derive(Debug, Clone, Copy)]
enum Plant {
    Regular,
    Fifo,
    LinkToRegular,
    LinkToDevice,
    LinkToFifo,
    Directory,
}

fn plant(dir: &Path, name: &str, what: Plant) -> PathBuf {
    let path = dir.join(name);
    let target = dir.join(format!("{name}.target"));
    match what {
        Plant::Regular => std::fs::write(&path, b"bytes").unwrap(),
        Plant::Fifo => mkfifo(&path),
        Plant::LinkToRegular => {
            std::fs::write(&target, b"bytes").unwrap();
            symlink(&target, &path).unwrap();
        }
        Plant::LinkToDevice => symlink("/dev/zero", &path).unwrap(),
        Plant::LinkToFifo => {
            mkfifo(&target);
            symlink(&target, &path).unwrap();
        }
        Plant::Directory => std::fs::create_dir(&path).unwrap(),
    }
    path
}

/// The outcome's name, for the tables.
fn outcome<T>(r: &Result<T, HostFsError>) -> &'static str {
    match r {
        Ok(_) => "ok",
        Err(HostFsError::Io { .. }) => "io",
        Err(HostFsError::NotRegular { .. }) => "not regular",
        Err(HostFsError::Symlink { .. }) => "symlink",
        Err(HostFsError::Changed { .. }) => "changed",
        Err(HostFsError::TooLarge { .. }) => "too large",
        Err(HostFsError::NoReader { .. }) => "no reader",
    }
}

#[test]
fn inputs_are_regular_files_and_nothing_else_is_opened() {
    let dir = scratch("inputs");
    // (what is planted, by path (links followed), beneath a Dir (none))
    let table = [
        (Plant::Regular, "ok", "ok"),
        (Plant::Fifo, "not regular", "not regular"),
        (Plant::LinkToRegular, "ok", "symlink"),
        (Plant::LinkToDevice, "not regular", "symlink"),
        (Plant::LinkToFifo, "not regular", "symlink"),
        (Plant::Directory, "not regular", "not regular"),
    ];
    let held = Dir::open(&dir).unwrap();
    for (i, (what, by_path, beneath)) in table.into_iter().enumerate() {
        let name = format!("f{i}");
        let path = plant(&dir, &name, what);
        // A FIFO with no writer would block an open without O_NONBLOCK:
        // the test finishing is part of what it shows.
        assert_eq!(outcome(&open_input(&path)), by_path, "{what:?} by path");
        assert_eq!(
            outcome(&held.open_input(&name)),
            beneath,
            "{what:?} beneath"
        );
    }
    assert!(open_input(&dir.join("missing")).unwrap_err().is_missing());
    assert_eq!(outcome(&open_input(Path::new("/dev/zero"))), "not regular");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn sizes_are_checked_before_reading() {
    let dir = scratch("sizes");
    let big = dir.join("big");
    // Sparse: a file far larger than its limit costs nothing to make, and
    // would cost that much memory if it were read.
    std::fs::File::create(&big)
        .unwrap()
        .set_len(1 << 40)
        .unwrap();
    let small = dir.join("small");
    std::fs::write(&small, b"0123456789").unwrap();
    // (file, max, outcome)
    let table = [
        (&big, 1 << 20, "too large"),
        (&small, 10, "ok"),
        (&small, 9, "too large"),
    ];
    for (path, max, want) in table {
        let got = read_input(path, max, "the test's limit");
        assert_eq!(outcome(&got), want, "{} at most {max}", path.display());
    }
    let text = read_input(&big, 1 << 20, "the guest's RAM")
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("1099511627776 bytes") && text.contains("the guest's RAM"),
        "{text}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_walk_below_a_directory_follows_no_link() {
    let dir = scratch("below");
    std::fs::create_dir_all(dir.join("a/b")).unwrap();
    std::fs::write(dir.join("a/b/file"), b"x").unwrap();
    symlink(dir.join("a"), dir.join("link")).unwrap();
    symlink("/etc/passwd", dir.join("a/out")).unwrap();
    let held = Dir::open(&dir).unwrap();
    // (components, outcome)
    let table: [(&[&str], &str); 5] = [
        (&["a", "b", "file"], "ok"),
        (&["link", "b", "file"], "symlink"),
        (&["a", "out"], "symlink"),
        (&["a", "b"], "not regular"),
        (&["a", "b", "file", "x"], "io"),
    ];
    for (parts, want) in table {
        assert_eq!(outcome(&held.open_below(parts)), want, "{parts:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn new_files_replace_what_was_planted_without_writing_through_it() {
    let dir = scratch("create");
    let held = Dir::open(&dir).unwrap();
    let victim = dir.join("victim");
    for (i, what) in [
        Plant::Regular,
        Plant::Fifo,
        Plant::LinkToRegular,
        Plant::LinkToFifo,
    ]
    .into_iter()
    .enumerate()
    {
        std::fs::write(&victim, b"untouched").unwrap();
        let name = format!("state{i}");
        let path = plant(&dir, &name, what);
        if matches!(what, Plant::LinkToRegular) {
            std::fs::remove_file(&path).unwrap();
            symlink(&victim, &path).unwrap();
        }
        let mut file = held.create_new(&name).unwrap();
        file.write_all(b"new").unwrap();
        file.commit().unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"untouched", "{what:?}");
        assert!(
            std::fs::symlink_metadata(&path).unwrap().is_file(),
            "{what:?}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"new", "{what:?}");
    }
    // Dropped uncommitted: nothing is left behind.
    drop(held.create_new("dropped").unwrap());
    let left: Vec<String> = held
        .names()
        .unwrap()
        .into_iter()
        .filter(|n| n.contains("lwpvmm-part"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn rewrites_replace_the_whole_content_and_leave_no_part_file() {
    let dir = scratch("rewrite");
    let path = dir.join("metrics.json");
    let file = Rewrite::new(&path).unwrap();
    file.replace(b"a longer first version").unwrap();
    file.replace(b"short").unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"short");
    let names = Dir::open(&dir).unwrap().names().unwrap();
    assert_eq!(names, ["metrics.json"]);
    std::fs::create_dir(dir.join("sub")).unwrap();
    assert_eq!(outcome(&Rewrite::new(&dir.join("sub"))), "io");
    assert_eq!(outcome(&Rewrite::new(&dir.join("no/such/x"))), "io");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn streams_take_regular_files_and_fifos_with_readers_only() {
    let dir = scratch("streams");
    // (planted, FIFOs allowed, outcome); None: nothing there yet
    let table = [
        (None, Fifo::Refused, "ok"),
        (Some(Plant::Regular), Fifo::Refused, "ok"),
        (Some(Plant::Fifo), Fifo::Refused, "not regular"),
        (Some(Plant::Fifo), Fifo::Allowed, "no reader"),
        (Some(Plant::LinkToRegular), Fifo::Refused, "symlink"),
        (Some(Plant::LinkToDevice), Fifo::Allowed, "symlink"),
        (Some(Plant::Directory), Fifo::Refused, "not regular"),
    ];
    for (i, (what, fifo, want)) in table.into_iter().enumerate() {
        let name = format!("out{i}");
        let path = match what {
            Some(what) => plant(&dir, &name, what),
            None => dir.join(&name),
        };
        let got = open_stream(&path, StreamMode::Truncate, fifo);
        assert_eq!(outcome(&got), want, "{what:?} {fifo:?}");
        if let (Ok(_), Some(Plant::Regular)) = (&got, what) {
            assert_eq!(std::fs::read(&path).unwrap(), b"", "truncated");
        }
    }
    assert_eq!(
        outcome(&open_stream(
            Path::new("/dev/null"),
            StreamMode::Append,
            Fifo::Allowed
        )),
        "not regular"
    );
    // A FIFO with a reader is taken.
    let fifo = plant(&dir, "read", Plant::Fifo);
    let _reader = rustix::fs::openat(
        rustix::fs::CWD,
        &fifo,
        OFlags::RDONLY | OFlags::NONBLOCK,
        Mode::empty(),
    )
    .unwrap();
    assert_eq!(
        outcome(&open_stream(&fifo, StreamMode::Append, Fifo::Allowed)),
        "ok"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
