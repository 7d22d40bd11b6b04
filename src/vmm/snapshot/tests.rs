//! snapshot/mod.rs's tests.

use super::*;

pub(super) fn sample() -> VmSnapshot {
    VmSnapshot {
        lwpvmm_version: "test".into(),
        profile: LwpProfile::Emulated,
        guest: GuestLwpSupport::Shim,
        memory: MemoryLayout {
            regions: vec![(0, 1 << 20)],
            crc64: 7,
            ..MemoryLayout::default()
        },
        vm: VmKvmState {
            clock: kvm_clock_data::default(),
        },
        ioapic: IoapicState::default(),
        serial: SerialSnapshot::default(),
        pm: PmState::default(),
        devices: Vec::new(),
        vcpus: vec![],
    }
}

#[test]
fn round_trip_and_every_corruption_refused() {
    let p = Path::new("state.bin");
    let good = encode(&sample()).unwrap();
    assert_eq!(decode(&good, p).unwrap().profile, LwpProfile::Emulated);
    type Corrupt = fn(&mut Vec<u8>);
    let table: [(&str, Corrupt); 5] = [
        ("magic", |b| b[0] = b'X'),
        ("version", |b| b[8] = 9),
        ("length", |b| b[16] ^= 1),
        ("payload byte", |b| {
            let last = b.len() - 2;
            b[last] ^= 0x20;
        }),
        ("truncated", |b| b.truncate(20)),
    ];
    for (what, corrupt) in table {
        let mut bad = good.clone();
        corrupt(&mut bad);
        let err = decode(&bad, p).expect_err(what);
        let ok = match what {
            "magic" | "truncated" => matches!(err, SnapshotError::BadMagic(_)),
            "version" => matches!(err, SnapshotError::Version { found: 9 }),
            "length" => matches!(err, SnapshotError::Length),
            _ => matches!(err, SnapshotError::Checksum { .. }),
        };
        assert!(ok, "{what}: {err}");
    }
}

#[test]
fn memory_round_trip_checks_size_and_crc() {
    let dir = std::env::temp_dir().join(format!("lwpvmm-snap-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mem = GuestMemory::from_ranges(&[(GuestAddress(0), 2 << 20)]).unwrap();
    mem.write_obj(0xfeed_u64, GuestAddress(0x1234)).unwrap();
    let (crc64, len) = write_memory(&dir, &mem).unwrap();
    assert_eq!(len, 2 << 20);
    let layout = MemoryLayout {
        regions: super::layout(&mem),
        crc64,
        ..MemoryLayout::default()
    };
    use std::os::unix::fs::MetadataExt;
    let blocks = std::fs::metadata(dir.join(MEMORY_FILE)).unwrap().blocks() * 512;
    assert!(blocks <= 64 << 10, "one page of data takes {blocks} bytes");
    let map = || {
        let file = open_memory(&dir, &layout).unwrap();
        crate::vmm::boot::map_file(&[(GuestAddress(0), 2 << 20)], &file).unwrap()
    };
    let fresh = map();
    check_layout(&fresh, &layout).unwrap();
    verify_memory(&fresh, &layout).unwrap();
    assert_eq!(fresh.read_obj::<u64>(GuestAddress(0x1234)).unwrap(), 0xfeed);
    // Copy-on-write: the restored guest's writes never reach the file,
    // so the snapshot restores again as it was.
    fresh.write_obj(0xbad_u64, GuestAddress(0x1234)).unwrap();
    let again = map();
    assert_eq!(again.read_obj::<u64>(GuestAddress(0x1234)).unwrap(), 0xfeed);
    // A new snapshot replaces the file: the mapping keeps the old pages.
    again.write_obj(0x5eed_u64, GuestAddress(0x1234)).unwrap();
    write_memory(&dir, &again).unwrap();
    assert_eq!(fresh.read_obj::<u64>(GuestAddress(0x1234)).unwrap(), 0xbad);
    let bad = MemoryLayout {
        crc64: crc64 ^ 1,
        ..layout.clone()
    };
    assert!(matches!(
        verify_memory(&again, &bad),
        Err(SnapshotError::Memory(_))
    ));
    let small = GuestMemory::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
    assert!(matches!(
        check_layout(&small, &layout),
        Err(SnapshotError::Memory(_))
    ));
    let short = MemoryLayout {
        regions: vec![(0, 4 << 20)],
        crc64,
        ..MemoryLayout::default()
    };
    assert!(
        matches!(open_memory(&dir, &short), Err(SnapshotError::Memory(_))),
        "a file shorter than the layout is refused before it is mapped"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn zero_pages_are_told_apart() {
    let mut page = vec![0u8; PAGE];
    // (byte set, value)
    let table = [
        (None, true),
        (Some(0), false),
        (Some(PAGE - 1), false),
        (Some(1000), false),
    ];
    for (at, zero) in table {
        page.fill(0);
        if let Some(at) = at {
            page[at] = 1;
        }
        assert_eq!(is_zero(&page), zero, "{at:?}");
    }
    assert!(!is_zero(&[0, 0, 1]), "a short remainder");
}

/// A diff holds the marked pages, across two regions, and applying it
/// onto the parent's memory gives the memory it was taken from; a page
/// changed on disk is refused by its CRC-64.
#[test]
fn a_diff_carries_the_marked_pages() {
    let dir = std::env::temp_dir().join(format!("lwpvmm-diff-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ranges = [(GuestAddress(0), 1 << 20), (GuestAddress(4 << 20), 1 << 20)];
    let mem = GuestMemory::from_ranges(&ranges).unwrap();
    // (guest-physical address, value): pages 1 and 2 of region 0, page
    // 0 of region 1 (file page 256).
    let written = [(0x1008u64, 1u64), (0x2000, 2), (4 << 20, 3)];
    written
        .iter()
        .for_each(|&(gpa, v)| mem.write_obj(v, GuestAddress(gpa)).unwrap());
    let dirty = vec![vec![0b110u64, 0, 0, 0], vec![1, 0, 0, 0]];
    let DiffWritten {
        crc64,
        pages,
        bytes,
    } = write_diff_memory(&dir, &mem, &dirty).unwrap();
    assert_eq!(pages, [(1, 2), (256, 1)]);
    assert_eq!(bytes, 3 * 4096);
    let layout = MemoryLayout {
        regions: super::layout(&mem),
        crc64,
        pages,
        ..MemoryLayout::default()
    };
    let parent = GuestMemory::from_ranges(&ranges).unwrap();
    apply_diff(&dir, &parent, &layout).unwrap();
    for &(gpa, v) in &written {
        assert_eq!(parent.read_obj::<u64>(GuestAddress(gpa)).unwrap(), v);
    }
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(MEMORY_FILE))
        .unwrap();
    file.write_all_at(&[9], 0x2001).unwrap();
    assert!(matches!(
        apply_diff(&dir, &parent, &layout),
        Err(SnapshotError::Memory(m)) if m.contains("CRC-64")
    ));
    std::fs::remove_dir_all(dir).unwrap();
}

/// A diff whose page list repeats, overlaps, runs backwards or past
/// the guest is refused before a page is read; one whose pages fail
/// their CRC-64 changes nothing.
#[test]
fn a_bad_page_list_or_checksum_copies_nothing() {
    let dir = std::env::temp_dir().join(format!("lwpvmm-diff-list-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ranges = [(GuestAddress(0), 1 << 20)];
    let mem = GuestMemory::from_ranges(&ranges).unwrap();
    mem.write_obj(0x77_u64, GuestAddress(0x3000)).unwrap();
    let written = write_diff_memory(&dir, &mem, &[vec![0b1000]]).unwrap();
    let layout = |pages: Vec<(u64, u64)>, crc64| MemoryLayout {
        regions: ranges.iter().map(|&(a, n)| (a.0, n as u64)).collect(),
        crc64,
        pages,
        ..MemoryLayout::default()
    };
    // (page list, accepted)
    let table: Vec<(Vec<(u64, u64)>, bool)> = vec![
        (vec![(3, 1)], true),
        (vec![(3, 1); 2000], false),
        (vec![(3, 2), (4, 1)], false),
        (vec![(5, 1), (3, 1)], false),
        (vec![(3, 0)], false),
        (vec![(255, 2)], false),
        (vec![(u64::MAX, 2)], false),
        (vec![(0, 256)], true),
    ];
    for (pages, accepted) in table {
        assert_eq!(
            check_pages(&layout(pages.clone(), 0)).is_ok(),
            accepted,
            "{pages:?}"
        );
    }
    // Repeats refused before anything is read or copied.
    let target = GuestMemory::from_ranges(&ranges).unwrap();
    let repeated = layout(vec![(3, 1); 2000], written.crc64);
    assert!(matches!(
        apply_diff(&dir, &target, &repeated),
        Err(SnapshotError::Memory(m)) if m.contains("page list")
    ));
    // A wrong checksum: nothing copied.
    let wrong = layout(written.pages.clone(), written.crc64 ^ 1);
    assert!(apply_diff(&dir, &target, &wrong).is_err());
    assert_eq!(target.read_obj::<u64>(GuestAddress(0x3000)).unwrap(), 0);
    apply_diff(&dir, &target, &layout(written.pages, written.crc64)).unwrap();
    assert_eq!(target.read_obj::<u64>(GuestAddress(0x3000)).unwrap(), 0x77);
    std::fs::remove_dir_all(dir).unwrap();
}

/// State and memory files that are FIFOs or devices are refused at
/// once, never read (a FIFO would hang the restore, /dev/zero never
/// end); a state file longer than its header says is refused after
/// reading only what it states.
#[test]
fn snapshot_files_must_be_regular() {
    use rustix::fs::{FileType, Mode, mknodat};
    let root = std::env::temp_dir().join(format!("lwpvmm-snap-files-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    // (directory, how its state.bin is made)
    type Make = fn(&Path);
    let table: [(&str, Make, &str); 5] = [
        // No state file at all: a directory that is not a snapshot.
        ("empty", |_| {}, "NotASnapshot"),
        (
            "fifo",
            |p| {
                mknodat(
                    rustix::fs::CWD,
                    p,
                    FileType::Fifo,
                    Mode::from_raw_mode(0o600),
                    0,
                )
                .unwrap()
            },
            "NotRegular",
        ),
        (
            "zero",
            |p| std::os::unix::fs::symlink("/dev/zero", p).unwrap(),
            "NotRegular",
        ),
        ("dir", |p| std::fs::create_dir(p).unwrap(), "NotRegular"),
        (
            "long",
            |p| {
                let mut bytes = encode(&sample()).unwrap();
                bytes.extend_from_slice(&[0; 100]);
                std::fs::write(p, bytes).unwrap();
            },
            "Length",
        ),
    ];
    for (name, make, variant) in table {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        make(&dir.join(STATE_FILE));
        let err = read_state(&dir).unwrap_err();
        assert!(format!("{err:?}").starts_with(variant), "{name}: {err:?}");
    }
    let dir = root.join("fifo");
    mknodat(
        rustix::fs::CWD,
        dir.join(MEMORY_FILE),
        FileType::Fifo,
        Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    assert!(matches!(
        open_memory(&dir, &sample().memory),
        Err(SnapshotError::NotRegular(_))
    ));
    std::fs::remove_dir_all(root).unwrap();
}

/// A diff that names itself (or an ancestor) as its parent is refused
/// as a loop, read once per link.
#[test]
fn a_chain_that_loops_is_refused() {
    let root = std::env::temp_dir().join(format!("lwpvmm-snap-loop-{}", std::process::id()));
    let (a, b) = (root.join("a"), root.join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let with_parent = |parent: &Path, state_crc| {
        let mut s = sample();
        s.memory.parent = Some(ParentRef {
            dir: parent.to_owned(),
            state_crc,
        });
        s
    };
    // a names itself: the loop shows whatever CRC it recorded.
    write_state(&a, &with_parent(&a, 0)).unwrap();
    assert!(matches!(chain(&a), Err(SnapshotError::Loop(_))));
    // a -> b -> a, each with the CRC the other really has: b's is
    // written first against a's old state, then a points at b.
    let (_, crc_a) = write_state(&a, &with_parent(&b, 0)).unwrap();
    let (_, crc_b) = write_state(&b, &with_parent(&a, crc_a)).unwrap();
    // Rewriting a changes its CRC, so b's record of it no longer holds:
    // refused either as a replaced parent or as a loop, never looped.
    write_state(&a, &with_parent(&b, crc_b)).unwrap();
    assert!(chain(&a).is_err());
    std::fs::remove_dir_all(root).unwrap();
}

/// `restore DIR` of a --snapshot-diff directory names the snapshots in
/// it.
#[test]
fn a_directory_of_numbered_snapshots_is_named() {
    let root = std::env::temp_dir().join(format!("lwpvmm-snap-numbered-{}", std::process::id()));
    for n in ["0", "1", "10", "2"] {
        std::fs::create_dir_all(root.join(n)).unwrap();
        write_state(&root.join(n), &sample()).unwrap();
    }
    std::fs::create_dir_all(root.join("other")).unwrap();
    let err = chain(&root).unwrap_err().to_string();
    assert!(
        err.contains("holds the --snapshot-diff snapshots 0, 1, 2, 10"),
        "{err}"
    );
    assert!(
        err.ends_with(&format!("the newest is {})", root.join("10").display())),
        "{err}"
    );
    std::fs::remove_dir_all(root).unwrap();
}

/// CRC-64/XZ tells runs of zeros of different lengths apart (format 6's
/// CRC-64/ECMA-182 gave every one of them 0).
#[test]
fn runs_of_zeros_have_distinct_checksums() {
    let sums: Vec<u64> = [0usize, 1, 4096, 8192, 1 << 20]
        .iter()
        .map(|&n| CRC.checksum(&vec![0; n]))
        .collect();
    let distinct: HashSet<u64> = sums.iter().copied().collect();
    assert_eq!(distinct.len(), sums.len(), "{sums:x?}");
    assert!(!sums[1..].contains(&0), "{sums:x?}");
}
