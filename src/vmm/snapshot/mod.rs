//! The snapshot format: a state file (header, format version, CRC-64 of the
//! payload, then the payload as JSON) and guest RAM in a separate file, as
//! Firecracker does. Everything read back is untrusted: the header, the
//! checksums, the sizes and the LWP section are checked before anything runs.
//! docs/snapshot.md describes the format and its version rules.

pub mod checks;

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use crc::{CRC_64_XZ, Crc};
use kvm_bindings::kvm_clock_data;
use kvm_ioctls::VmFd;
use serde::{Deserialize, Serialize};
use thiserror::Error;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use crate::guard::GuestMemory;
use crate::hostfs::{Dir, HostFsError};
use crate::lwp::cpuid::{GuestLwpSupport, LwpProfile};
use crate::vmm::devices::ioapic::IoapicState;
use crate::vmm::devices::pm::PmState;
use crate::vmm::devices::port_bus::SerialSnapshot;
use crate::vmm::vcpu::vcpu_state::VcpuSnapshot;

/// The state file in a snapshot directory.
pub const STATE_FILE: &str = "state.bin";
/// The guest-memory file in a snapshot directory.
pub const MEMORY_FILE: &str = "memory.bin";
/// The state file's first eight bytes.
pub const MAGIC: [u8; 8] = *b"LWPVMMST";
/// The format version this lwpvmm writes: 7 checks every file with
/// CRC-64/XZ (non-zero initial value and final XOR, so runs of zeros of
/// different lengths have different checksums; 6 used CRC-64/ECMA-182,
/// under which every run of zeros has checksum 0); 6 is a machine with lwpvmm's
/// IOAPIC on KVM's split irqchip and no PIC or PIT; 5 made the memory file
/// sparse (pages of zeros are holes) and restores map it instead of reading it,
/// checking its CRC-64 only with `restore --verify`; 4 adds the virtio
/// devices (what each was built from, its registers and queues); 3 is the
/// machine with ACPI tables, a CPUID topology and the ACPI PM registers;
/// 2 added each vCPU's whole LWP state and named the profile and guest
/// kind as enums.
pub const FORMAT_VERSION: u32 = 7;
const HEADER_LEN: usize = 8 + 4 + 4 + 8 + 8;
/// The largest state payload accepted (it is JSON of a few KiB per vCPU).
const MAX_PAYLOAD: u64 = 64 << 20;
const CRC: Crc<u64> = Crc::<u64>::new(&CRC_64_XZ);

/// Why a snapshot cannot be written or read.
#[derive(Debug, Error)]
pub enum SnapshotError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// Not an lwpvmm state file.
    #[error("{0} is not an lwpvmm snapshot state file (bad magic)")]
    BadMagic(PathBuf),
    /// A format version this lwpvmm does not read.
    #[error(
        "snapshot format version {found} is not supported: this lwpvmm reads version {FORMAT_VERSION}{}",
        if *.found < FORMAT_VERSION { " (restore it with the lwpvmm that wrote it; versions before 7 use another checksum)" } else { "" }
    )]
    Version {
        /// The file's version.
        found: u32,
    },
    /// The payload is shorter than the header says, or absurdly long.
    #[error("the state file is truncated or its length field is corrupt")]
    Length,
    /// The payload's checksum does not match.
    #[error("the state file is corrupt: CRC-64 {found:#018x}, header says {expected:#018x}")]
    Checksum {
        /// Computed.
        found: u64,
        /// Recorded.
        expected: u64,
    },
    /// The payload is not a valid snapshot document.
    #[error("the state file's payload is invalid: {0}")]
    Payload(#[from] serde_json::Error),
    /// The memory file does not match the recorded layout.
    #[error("the memory file is corrupt: {0}")]
    Memory(String),
    /// The snapshot does not fit this host or these options.
    #[error("the snapshot does not match: {0}")]
    Mismatch(String),
    /// The caller asked for another LWP profile than the snapshot's.
    #[error("it was taken with LWP profile `{snapshot}`, not `{asked}`")]
    ProfileMismatch {
        /// The snapshot's.
        snapshot: LwpProfile,
        /// The one asked for.
        asked: LwpProfile,
    },
    /// KVM refused the VM-wide state.
    #[error("{what} failed: {source}")]
    Kvm {
        /// The ioctl.
        what: &'static str,
        /// Why.
        source: kvm_ioctls::Error,
    },
    /// A snapshot file or directory cannot be opened or created.
    #[error(transparent)]
    File(#[from] HostFsError),
    /// A snapshot file is not a regular file.
    #[error("{0}: not a regular file (a snapshot's files are regular files)")]
    NotRegular(PathBuf),
    /// The directory holds the numbered snapshots of `--snapshot-diff`,
    /// not a snapshot of its own.
    #[error(
        "{} holds no {STATE_FILE}: it holds the --snapshot-diff snapshots {}; restore one of them (the newest is {})",
        .dir.display(),
        .numbered.iter().map(|n| format!("{n}")).collect::<Vec<_>>().join(", "),
        .dir.join(.numbered.last().map_or(0, |n| *n).to_string()).display()
    )]
    NumberedSnapshots {
        /// The directory.
        dir: PathBuf,
        /// The numbers of its snapshot subdirectories, in order.
        numbered: Vec<u64>,
    },
    /// The directory holds no snapshot.
    #[error(
        "{} is not a snapshot: it has no {STATE_FILE} (a snapshot is the directory that --snapshot-dir, SIGUSR2 or `PUT /snapshot/create` wrote, holding {STATE_FILE} and {MEMORY_FILE})",
        .0.display()
    )]
    NotASnapshot(PathBuf),
    /// A diff snapshot's chain of parents comes back to itself.
    #[error("the chain of diff snapshots loops: {0} is its own ancestor")]
    Loop(PathBuf),
    /// The LWP section of a vCPU is invalid.
    #[error("vCPU {vcpu}: invalid LWP section: {reason}")]
    Lwp {
        /// The vCPU.
        vcpu: u8,
        /// What is wrong.
        reason: String,
    },
}

fn io_err(path: &Path) -> impl Fn(io::Error) -> SnapshotError + '_ {
    move |source| SnapshotError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The whole VM, as written to the state file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VmSnapshot {
    /// The lwpvmm version that wrote it.
    pub lwpvmm_version: String,
    /// The LWP profile.
    pub profile: LwpProfile,
    /// Whether the guest carries the paravirtual shim.
    pub guest: GuestLwpSupport,
    /// Guest RAM.
    pub memory: MemoryLayout,
    /// The VM's clock.
    pub vm: VmKvmState,
    /// The IOAPIC's registers.
    pub ioapic: IoapicState,
    /// The 8250's registers.
    pub serial: SerialSnapshot,
    /// The ACPI PM registers.
    pub pm: PmState,
    /// The virtio devices: what each was built from and its transport.
    pub devices: Vec<crate::vmm::devices::virtio::DeviceSnapshot>,
    /// Every vCPU.
    pub vcpus: Vec<VcpuSnapshot>,
}

/// Guest RAM as saved in the memory file.
#[derive(Default, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryLayout {
    /// (guest-physical start, size) of each region, in file order.
    pub regions: Vec<(u64, u64)>,
    /// CRC-64 of the memory file (of a diff: of its pages, in order).
    pub crc64: u64,
    /// A diff snapshot's parent: the memory file holds only `pages`, the
    /// rest is the parent's (and its parents', down to a full snapshot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentRef>,
    /// A diff's pages: (first 4 KiB page of the memory file, pages), in
    /// order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pages: Vec<(u64, u64)>,
}

/// The snapshot a diff snapshot is on top of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentRef {
    /// Its directory (absolute).
    pub dir: PathBuf,
    /// The CRC-64 of its state file's payload: a parent replaced since is
    /// refused.
    pub state_crc: u64,
}

/// Diff snapshots a chain holds at most, above its full snapshot.
pub const MAX_CHAIN: usize = 64;

/// VM-wide KVM state: the local APICs are each vCPU's, the IOAPIC is
/// lwpvmm's, and there is no PIC or PIT.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VmKvmState {
    /// kvmclock.
    pub clock: kvm_clock_data,
}

impl VmKvmState {
    /// Reads it from a VM whose vCPUs are paused.
    pub fn capture(vm: &VmFd) -> Result<Self, SnapshotError> {
        Ok(VmKvmState {
            clock: vm.get_clock().map_err(|source| SnapshotError::Kvm {
                what: "KVM_GET_CLOCK",
                source,
            })?,
        })
    }

    /// Sets it on a VM before its vCPUs run: kvmclock goes on from the
    /// value it had at the snapshot, as Firecracker restores it. The flags
    /// KVM_GET_CLOCK reported are dropped: with KVM_CLOCK_REALTIME, KVM
    /// would move the clock on by the host's real time since the snapshot,
    /// and a guest restored minutes later would jump by minutes (and report
    /// RCU stalls). The guest's wall clock then lags by the pause, until
    /// its time service steps it (docs/snapshot.md).
    pub fn apply(&self, vm: &VmFd) -> Result<(), SnapshotError> {
        let clock = kvm_clock_data {
            clock: self.clock.clock,
            ..kvm_clock_data::default()
        };
        vm.set_clock(&clock).map_err(|source| SnapshotError::Kvm {
            what: "KVM_SET_CLOCK",
            source,
        })
    }
}

/// Encodes a state file: header, then the JSON payload.
pub fn encode(snapshot: &VmSnapshot) -> Result<Vec<u8>, SnapshotError> {
    let payload = serde_json::to_vec(snapshot)?;
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&CRC.checksum(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
    Ok(out)
}

/// Decodes and checks a state file.
pub fn decode(bytes: &[u8], path: &Path) -> Result<VmSnapshot, SnapshotError> {
    if bytes.len() < HEADER_LEN || bytes[..8] != MAGIC {
        return Err(SnapshotError::BadMagic(path.to_owned()));
    }
    let u32_at =
        |o: usize| u32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]);
    let u64_at = |o: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&bytes[o..o + 8]);
        u64::from_le_bytes(b)
    };
    let version = u32_at(8);
    // Only this version: an older snapshot's guest was set up with KVM's
    // PIC, PIT and IOAPIC, which this machine does not have.
    if version != FORMAT_VERSION {
        return Err(SnapshotError::Version { found: version });
    }
    let len = u64_at(16);
    let expected = u64_at(24);
    let payload = &bytes[HEADER_LEN..];
    if len > MAX_PAYLOAD || payload.len() as u64 != len {
        return Err(SnapshotError::Length);
    }
    // A fuzzer cannot forge checksums: under it the check is skipped, so
    // that its inputs reach the payload's own checks.
    let found = if cfg!(fuzzing) {
        expected
    } else {
        CRC.checksum(payload)
    };
    if found != expected {
        return Err(SnapshotError::Checksum { found, expected });
    }
    Ok(serde_json::from_slice(payload)?)
}

/// Writes the state file; returns its length and its payload's CRC-64 (what
/// a diff on top of it records). It is a new file beneath the directory's
/// descriptor, renamed over the old one (`crate::hostfs::Dir::create_new`),
/// so a link, a FIFO or a file planted under its name is replaced, never
/// written through or waited on.
pub fn write_state(dir: &Path, snapshot: &VmSnapshot) -> Result<(u64, u64), SnapshotError> {
    let bytes = encode(snapshot)?;
    let held = Dir::open(dir)?;
    let mut file = held.create_new(STATE_FILE)?;
    file.write_all(&bytes)?;
    file.commit()?;
    Ok((bytes.len() as u64, payload_crc(&bytes)))
}

/// The payload CRC-64 of encoded state (its header's).
fn payload_crc(bytes: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[24..32]);
    u64::from_le_bytes(b)
}

/// Reads and checks the state file.
pub fn read_state(dir: &Path) -> Result<VmSnapshot, SnapshotError> {
    read_state_crc(dir).map(|(s, _)| s)
}

/// Opens the snapshot file `name` in `dir` for reading (`crate::hostfs`):
/// a regular file beneath the directory's descriptor, never a link, a FIFO
/// or a device, none of which is opened.
fn open_regular(dir: &Path, name: &str) -> Result<File, SnapshotError> {
    let held = Dir::open(dir)?;
    held.open_input(name)
        .map(crate::hostfs::Input::into_file)
        .map_err(|e| match e {
            HostFsError::NotRegular { path, .. } | HostFsError::Symlink { path } => {
                SnapshotError::NotRegular(path)
            }
            e => SnapshotError::File(e),
        })
}

/// As [`read_state`], with the payload's CRC-64.
pub fn read_state_crc(dir: &Path) -> Result<(VmSnapshot, u64), SnapshotError> {
    read_state_file(dir).map(|(s, crc, _)| (s, crc))
}

/// Reads a state file: the header, then exactly the payload length it
/// states (at most 64 MiB), never more. Returns the state, its payload's
/// CRC-64 and the file's identity (device, inode).
fn read_state_file(dir: &Path) -> Result<(VmSnapshot, u64, (u64, u64)), SnapshotError> {
    let path = dir.join(STATE_FILE);
    let file = open_regular(dir, STATE_FILE).map_err(|e| match e {
        // The directory is there, its state file is not: say what the
        // directory is not, rather than which file it lacks.
        SnapshotError::File(HostFsError::Io {
            path: missing,
            source,
        }) if source.kind() == io::ErrorKind::NotFound && missing != dir => {
            SnapshotError::NotASnapshot(dir.to_owned())
        }
        e => e,
    })?;
    let meta = file.metadata().map_err(io_err(&path))?;
    let identity = (meta.dev(), meta.ino());
    if meta.len() > MAX_PAYLOAD + HEADER_LEN as u64 {
        return Err(SnapshotError::Length);
    }
    let mut bytes = vec![0u8; HEADER_LEN];
    let mut reader = file.take(MAX_PAYLOAD + HEADER_LEN as u64);
    match reader.read_exact(&mut bytes) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            return Err(SnapshotError::BadMagic(path));
        }
        Err(e) => return Err(io_err(&path)(e)),
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&bytes[16..24]);
    let len = u64::from_le_bytes(len);
    if bytes[..8] == MAGIC && len <= MAX_PAYLOAD {
        // One byte more than stated, so that a longer file shows.
        reader
            .take(len + 1)
            .read_to_end(&mut bytes)
            .map_err(io_err(&path))?;
    }
    let snapshot = decode(&bytes, &path)?;
    Ok((snapshot, payload_crc(&bytes), identity))
}

/// A parent in a chain of diff snapshots: its directory and its state's
/// CRC-64 (checked again when it is read again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// Its directory.
    pub dir: PathBuf,
    /// Its state payload's CRC-64, as its child recorded it.
    pub state_crc: u64,
}

/// The snapshot a restore of `dir` resumes (its state and payload CRC-64)
/// and the parents it reads memory from, newest first, down to a full
/// snapshot. Each parent's state must have the CRC-64 its child recorded
/// and the same layout; a chain that loops (by the state files' device
/// and inode) or is longer than [`MAX_CHAIN`] is refused. Only one
/// parent's state is held at a time: [`read_link`] reads it again.
pub fn chain(dir: &Path) -> Result<(VmSnapshot, u64, Vec<Link>), SnapshotError> {
    let held = Dir::open(dir)?;
    if held.kind(STATE_FILE).is_none() {
        let mut numbered: Vec<u64> = held
            .names()?
            .into_iter()
            .filter(|n| {
                held.subdir(n)
                    .is_ok_and(|d| d.kind(STATE_FILE) == Some(crate::hostfs::Kind::Regular))
            })
            .filter_map(|n| n.parse().ok())
            .collect();
        numbered.sort_unstable();
        if !numbered.is_empty() {
            return Err(SnapshotError::NumberedSnapshots {
                dir: dir.to_owned(),
                numbered,
            });
        }
    }
    let (first, crc, identity) = read_state_file(dir)?;
    let mut seen = HashSet::from([identity]);
    let mut links: Vec<Link> = Vec::new();
    let mut next = first.memory.parent.clone();
    while let Some(parent) = next.take() {
        if links.len() >= MAX_CHAIN {
            return Err(SnapshotError::Mismatch(format!(
                "the chain of diff snapshots is longer than {MAX_CHAIN}"
            )));
        }
        let (state, found, identity) = read_state_file(&parent.dir)?;
        if !seen.insert(identity) {
            return Err(SnapshotError::Loop(parent.dir));
        }
        check_link(&parent, found, &state, &first.memory)?;
        next = state.memory.parent;
        links.push(Link {
            dir: parent.dir,
            state_crc: found,
        });
    }
    Ok((first, crc, links))
}

/// Reads a parent of a chain again: it must still be what [`chain`] found.
pub fn read_link(link: &Link, newest: &MemoryLayout) -> Result<VmSnapshot, SnapshotError> {
    let (state, found) = read_state_crc(&link.dir)?;
    let parent = ParentRef {
        dir: link.dir.clone(),
        state_crc: link.state_crc,
    };
    check_link(&parent, found, &state, newest)?;
    Ok(state)
}

fn check_link(
    parent: &ParentRef,
    found: u64,
    state: &VmSnapshot,
    newest: &MemoryLayout,
) -> Result<(), SnapshotError> {
    if found != parent.state_crc {
        return Err(SnapshotError::Mismatch(format!(
            "the parent snapshot {} was replaced since its diff was taken (its state's CRC-64 is {found:#018x}, the diff recorded {:#018x})",
            parent.dir.display(),
            parent.state_crc
        )));
    }
    if state.memory.regions != newest.regions {
        return Err(SnapshotError::Mismatch(format!(
            "the parent snapshot {} has another memory layout",
            parent.dir.display()
        )));
    }
    Ok(())
}

/// The RAM layout of `mem`.
pub fn layout(mem: &GuestMemory) -> Vec<(u64, u64)> {
    mem.iter()
        .map(|r| (r.start_addr().raw_value(), r.len()))
        .collect()
}

const CHUNK: usize = 1 << 20;

/// The page size of the memory file's holes.
const PAGE: usize = 4096;

/// Whether `page` holds only zeros (compared 16 bytes at a time).
fn is_zero(page: &[u8]) -> bool {
    let mut words = page.chunks_exact(16);
    words
        .by_ref()
        .all(|w| u128::from_ne_bytes(w.try_into().unwrap_or([1; 16])) == 0)
        && words.remainder().iter().all(|&b| b == 0)
}

/// Writes guest RAM to the memory file; returns (CRC-64, bytes). Pages of
/// zeros are holes (a sparse file: a guest that touched little takes
/// little disk). The file is written beside the old one and renamed over
/// it, so a VM restored from the old one, which maps it, keeps its pages.
pub fn write_memory(dir: &Path, mem: &GuestMemory) -> Result<(u64, u64), SnapshotError> {
    let held = Dir::open(dir)?;
    let new = held.create_new(MEMORY_FILE)?;
    let part = dir.join(MEMORY_FILE);
    let file = new.file();
    let mut digest = CRC.digest();
    let mut buf = vec![0u8; CHUNK];
    let mut at = 0u64;
    for (start, size) in layout(mem) {
        let mut done = 0u64;
        while done < size {
            let n = (size - done).min(CHUNK as u64) as usize;
            let chunk = &mut buf[..n];
            mem.read_slice(chunk, GuestAddress(start + done))
                .map_err(|e| SnapshotError::Memory(e.to_string()))?;
            digest.update(chunk);
            for (i, page) in chunk.chunks(PAGE).enumerate() {
                if !is_zero(page) {
                    file.write_all_at(page, at + (i * PAGE) as u64)
                        .map_err(io_err(&part))?;
                }
            }
            at += n as u64;
            done += n as u64;
        }
    }
    file.set_len(at).map_err(io_err(&part))?;
    new.commit()?;
    Ok((digest.finalize(), at))
}

/// What a diff's memory file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiffWritten {
    /// The CRC-64 of its pages, in order.
    pub crc64: u64,
    /// (first 4 KiB page of the file, pages), in order.
    pub pages: Vec<(u64, u64)>,
    /// Bytes of pages written.
    pub bytes: u64,
}

/// Writes the pages `dirty` marks (one bit per 4 KiB page of each region,
/// regions in file order) to a diff's memory file, a sparse file as long as
/// a full one.
pub fn write_diff_memory(
    dir: &Path,
    mem: &GuestMemory,
    dirty: &[Vec<u64>],
) -> Result<DiffWritten, SnapshotError> {
    let held = Dir::open(dir)?;
    let new = held.create_new(MEMORY_FILE)?;
    let part = dir.join(MEMORY_FILE);
    let file = new.file();
    let mut digest = CRC.digest();
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    let mut page = vec![0u8; PAGE];
    let (mut base, mut written) = (0u64, 0u64);
    for ((start, size), bits) in layout(mem).into_iter().zip(dirty) {
        let pages = size / PAGE as u64;
        for i in 0..pages {
            let word = bits.get((i / 64) as usize).copied().unwrap_or(0);
            if word >> (i % 64) & 1 == 0 {
                continue;
            }
            mem.read_slice(&mut page, GuestAddress(start + i * PAGE as u64))
                .map_err(|e| SnapshotError::Memory(e.to_string()))?;
            digest.update(&page);
            let at = base / PAGE as u64 + i;
            file.write_all_at(&page, at * PAGE as u64)
                .map_err(io_err(&part))?;
            written += PAGE as u64;
            match ranges.last_mut() {
                Some((first, n)) if *first + *n == at => *n += 1,
                _ => ranges.push((at, 1)),
            }
        }
        base += size;
    }
    file.set_len(base).map_err(io_err(&part))?;
    new.commit()?;
    Ok(DiffWritten {
        crc64: digest.finalize(),
        pages: ranges,
        bytes: written,
    })
}

/// Checks a diff's page list against its layout: ranges in order, none
/// empty, none overlapping, all inside the memory file; so the pages it
/// lists are at most the guest's. Returns how many it lists.
fn check_pages(recorded: &MemoryLayout) -> Result<u64, SnapshotError> {
    let total: u64 = recorded.regions.iter().map(|r| r.1).sum::<u64>() / PAGE as u64;
    let mut end = 0u64;
    let mut pages = 0u64;
    for &(first, count) in &recorded.pages {
        let last = first.checked_add(count).filter(|&l| l <= total);
        match last {
            Some(last) if count > 0 && first >= end => {
                end = last;
                pages += count;
            }
            _ => {
                return Err(SnapshotError::Memory(format!(
                    "the diff's page list is out of order, overlaps or passes the guest's {total} pages at ({first}, {count})"
                )));
            }
        }
    }
    Ok(pages)
}

/// Copies a diff's pages from its memory file into `mem` (mapped from the
/// chain's full snapshot). The page list is checked first, then the pages'
/// CRC-64 (a diff is small, so it is always checked), and only then is
/// anything copied: a bad diff costs at most two reads of the guest's
/// size and changes nothing.
pub fn apply_diff(
    dir: &Path,
    mem: &GuestMemory,
    recorded: &MemoryLayout,
) -> Result<(), SnapshotError> {
    check_pages(recorded)?;
    let file = open_memory(dir, recorded)?;
    let path = dir.join(MEMORY_FILE);
    let mut page = vec![0u8; PAGE];
    let pages = || {
        recorded
            .pages
            .iter()
            .flat_map(|&(first, count)| first..first + count)
    };
    let mut digest = CRC.digest();
    for p in pages() {
        file.read_exact_at(&mut page, p * PAGE as u64)
            .map_err(io_err(&path))?;
        digest.update(&page);
    }
    let found = digest.finalize();
    if found != recorded.crc64 {
        return Err(SnapshotError::Memory(format!(
            "{}: the diff's pages have CRC-64 {found:#018x}, the state file says {:#018x}",
            path.display(),
            recorded.crc64
        )));
    }
    for p in pages() {
        let offset = p * PAGE as u64;
        file.read_exact_at(&mut page, offset)
            .map_err(io_err(&path))?;
        let gpa = file_offset_to_gpa(&recorded.regions, offset).ok_or_else(|| {
            SnapshotError::Memory(format!("diff page {p} lies outside the layout"))
        })?;
        mem.write_slice(&page, GuestAddress(gpa))
            .map_err(|e| SnapshotError::Memory(e.to_string()))?;
    }
    Ok(())
}

/// The guest-physical address of a memory-file offset.
fn file_offset_to_gpa(regions: &[(u64, u64)], offset: u64) -> Option<u64> {
    let mut base = 0u64;
    for &(start, size) in regions {
        if offset < base + size {
            return Some(start + (offset - base));
        }
        base += size;
    }
    None
}

/// Opens the memory file to map it: it must have exactly the size the
/// recorded layout needs, so that no page of the mapping lies past its end
/// (which would be SIGBUS when touched).
pub fn open_memory(dir: &Path, recorded: &MemoryLayout) -> Result<File, SnapshotError> {
    let path = dir.join(MEMORY_FILE);
    let file = open_regular(dir, MEMORY_FILE)?;
    let total: u64 = recorded.regions.iter().map(|r| r.1).sum();
    let len = file.metadata().map_err(io_err(&path))?.len();
    if len != total {
        return Err(SnapshotError::Memory(format!(
            "{len} bytes, the layout needs {total}"
        )));
    }
    Ok(file)
}

/// Checks that `mem`, mapped from the memory file, has the recorded layout.
pub fn check_layout(mem: &GuestMemory, recorded: &MemoryLayout) -> Result<(), SnapshotError> {
    if layout(mem) != recorded.regions {
        return Err(SnapshotError::Memory(
            "the region layout does not match".into(),
        ));
    }
    Ok(())
}

/// `restore --verify`: reads all of guest memory (the mapped file) and
/// checks its CRC-64 against the state file's.
pub fn verify_memory(mem: &GuestMemory, recorded: &MemoryLayout) -> Result<(), SnapshotError> {
    let mut digest = CRC.digest();
    let mut buf = vec![0u8; CHUNK];
    for &(start, size) in &recorded.regions {
        let mut done = 0u64;
        while done < size {
            let n = (size - done).min(CHUNK as u64) as usize;
            let chunk = &mut buf[..n];
            mem.read_slice(chunk, GuestAddress(start + done))
                .map_err(|e| SnapshotError::Memory(e.to_string()))?;
            digest.update(chunk);
            done += n as u64;
        }
    }
    let found = digest.finalize();
    if found != recorded.crc64 {
        return Err(SnapshotError::Memory(format!(
            "CRC-64 {found:#018x}, the state file says {:#018x}",
            recorded.crc64
        )));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests;
