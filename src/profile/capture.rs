//! Profiles captured while a VM runs, for the control API
//! (`GET /debug/pprof/profile`, `PUT /capture/stop`): the records stored
//! during a capture, counted per distinct stack as they arrive, and the
//! executable mappings each address space had, so that a capture resolves
//! its frames exactly as `lwpvmm report` would resolve the same records in
//! a trace. Both are bounded: a guest that makes ever new stacks or ever
//! new address spaces costs a fixed amount of host memory, and what did not
//! fit is counted.
//!
//! The mapping table is shared, not copied: a capture that starts holds
//! the table's current version (an `Arc`), and the table copies an address
//! space's line list only when it next changes while a capture still holds
//! it. Resolving a capture replays only the address spaces its records
//! came from.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::objects::Resolver;
use super::pprof::Profile;
use super::report::Tally;
use super::trace::{MappingLine, TraceRecord};

/// Distinct stacks one capture counts; records of further stacks are
/// counted as dropped. With 64 frames at most, about 40 MiB at worst.
pub const MAX_STACKS: usize = 65_536;
/// Mapping lines one capture keeps besides the table it started from.
pub const MAX_CAPTURE_MAPPINGS: usize = 16_384;
/// Address spaces the mapping table follows; the one reported longest ago
/// goes first.
pub const MAX_SPACES: usize = 4096;
/// Mappings the table keeps per address space (the guest module reports
/// at most 64 at a time).
pub const MAX_MAPPINGS_PER_SPACE: usize = 256;
/// The most bytes the mapping table's lines take (their paths included);
/// past it the address spaces reported longest ago go first.
pub const MAX_TABLE_BYTES: usize = 32 << 20;

/// What one mapping line costs the table.
fn line_bytes(line: &MappingLine) -> usize {
    std::mem::size_of::<MappingLine>()
        + std::mem::size_of::<Arc<MappingLine>>()
        + line.path.len()
        + line.build_id.len()
        + line.process.as_ref().map_or(0, |p| p.name.len())
}

/// The executable mappings of every address space, as the guest last
/// reported them: what a capture that starts now resolves its first
/// records with.
#[derive(Debug, Default)]
pub struct MappingTable {
    spaces: Arc<HashMap<u64, Space>>,
    clock: u64,
    bytes: usize,
    /// Mapping lines not kept (a full space).
    pub dropped: u64,
}

#[derive(Debug, Default, Clone)]
struct Space {
    touched: u64,
    bytes: usize,
    lines: Arc<Vec<Arc<MappingLine>>>,
}

/// A version of the mapping table, held by a capture while the table goes
/// on changing.
#[derive(Debug, Default, Clone)]
pub struct TableVersion(Arc<HashMap<u64, Space>>);

impl TableVersion {
    /// The mappings of address space `cr3`, its first line marked `first`,
    /// as a trace would replay them.
    fn lines(&self, cr3: u64) -> impl Iterator<Item = MappingLine> + '_ {
        self.0
            .get(&cr3)
            .into_iter()
            .flat_map(|s| s.lines.iter().enumerate())
            .map(|(i, line)| MappingLine {
                first: i == 0,
                ..MappingLine::clone(line)
            })
    }
}

impl MappingTable {
    /// Takes a mapping line the guest reported.
    pub fn apply(&mut self, line: &MappingLine) {
        self.clock += 1;
        let cost = line_bytes(line);
        // Copies the map of spaces (not their lines) once after a capture
        // took this version.
        let spaces = Arc::make_mut(&mut self.spaces);
        if line.first
            && let Some(space) = spaces.get_mut(&line.cr3)
        {
            self.bytes -= space.bytes;
            space.bytes = 0;
            space.lines = Arc::default();
        }
        let full = |spaces: &HashMap<u64, Space>, bytes: usize| {
            let new = !spaces.contains_key(&line.cr3);
            (new && spaces.len() >= MAX_SPACES) || bytes + cost > MAX_TABLE_BYTES
        };
        while full(spaces, self.bytes) {
            let oldest = spaces
                .iter()
                .filter(|(cr3, _)| **cr3 != line.cr3)
                .min_by_key(|(_, s)| s.touched)
                .map(|(&cr3, _)| cr3);
            match oldest.and_then(|cr3| spaces.remove(&cr3)) {
                Some(gone) => self.bytes -= gone.bytes,
                None => break,
            }
        }
        let space = spaces.entry(line.cr3).or_default();
        space.touched = self.clock;
        if space.lines.len() >= MAX_MAPPINGS_PER_SPACE || self.bytes + cost > MAX_TABLE_BYTES {
            self.dropped += 1;
            return;
        }
        Arc::make_mut(&mut space.lines).push(Arc::new(line.clone()));
        space.bytes += cost;
        self.bytes += cost;
    }

    /// The table as it stands, to hold while it goes on changing.
    pub fn version(&self) -> TableVersion {
        TableVersion(Arc::clone(&self.spaces))
    }

    /// Every mapping, each address space's first line marked `first`, as a
    /// trace would replay them.
    pub fn lines(&self) -> Vec<MappingLine> {
        let version = self.version();
        self.spaces
            .keys()
            .flat_map(|&cr3| version.lines(cr3).collect::<Vec<_>>())
            .collect()
    }

    /// Address spaces followed.
    pub fn spaces(&self) -> usize {
        self.spaces.len()
    }

    /// The bytes its lines take (at most [`MAX_TABLE_BYTES`]).
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// A record's stack as stored, and how many mapping lines of the capture
/// came before it: records before and after a new mapping of their
/// address space resolve differently.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    generation: usize,
    event: u8,
    cr3: u64,
    ip: u64,
    top: Option<u64>,
    stack: Vec<u64>,
}

/// One capture.
#[derive(Debug, Default)]
pub struct Capture {
    start: TableVersion,
    /// When it began, for the profile's time and duration.
    began: Option<(std::time::SystemTime, std::time::Instant)>,
    mappings: Vec<MappingLine>,
    counts: HashMap<Key, u64>,
    /// Records counted.
    pub records: u64,
    /// Records not counted: their stack would have exceeded
    /// [`MAX_STACKS`].
    pub dropped: u64,
    /// Mapping lines not kept (past [`MAX_CAPTURE_MAPPINGS`]).
    pub mappings_dropped: u64,
    /// Sampler kicks charged to sampled contexts during the capture.
    pub kicks: u64,
    /// It asked for host-side samples of the whole guest while it runs.
    pub kernel: bool,
}

impl Capture {
    /// A capture whose address spaces start with `table`'s mappings.
    pub fn new(table: &MappingTable) -> Self {
        Capture {
            start: table.version(),
            began: Some((std::time::SystemTime::now(), std::time::Instant::now())),
            ..Capture::default()
        }
    }

    /// Counts a stored record.
    pub fn record(&mut self, r: &TraceRecord) {
        let key = Key {
            generation: self.mappings.len(),
            event: r.event,
            cr3: r.cr3,
            ip: r.ip,
            top: r.top,
            stack: r.stack.clone(),
        };
        let weight = r.weight();
        if let Some(n) = self.counts.get_mut(&key) {
            *n = n.saturating_add(weight);
        } else if self.counts.len() < MAX_STACKS {
            self.counts.insert(key, weight);
        } else {
            self.dropped += 1;
            return;
        }
        self.records += 1;
    }

    /// Takes a mapping line reported during the capture.
    pub fn mapping(&mut self, line: &MappingLine) {
        if self.mappings.len() < MAX_CAPTURE_MAPPINGS {
            self.mappings.push(line.clone());
        } else {
            self.mappings_dropped += 1;
        }
    }

    /// The captured records counted per stack, resolved by `resolver` with
    /// the mappings as they stood at each record. Only the address spaces
    /// the records came from are replayed: the cost is bounded by the
    /// records' [`MAX_STACKS`], those spaces' lines, the capture's
    /// [`MAX_CAPTURE_MAPPINGS`] and the resolver's read budget.
    pub fn tally(self, resolver: &mut Resolver) -> Tally {
        let used: HashSet<u64> = self.counts.keys().map(|k| k.cr3).collect();
        for &cr3 in &used {
            self.start.lines(cr3).for_each(|m| resolver.mapping(&m));
        }
        let mut keys: Vec<(Key, u64)> = self.counts.into_iter().collect();
        keys.sort_by_key(|(k, _)| k.generation);
        let mut applied = 0;
        let mut tally = Tally::default();
        for (key, count) in keys {
            while applied < key.generation {
                let line = &self.mappings[applied];
                if used.contains(&line.cr3) {
                    resolver.mapping(line);
                }
                applied += 1;
            }
            let record = TraceRecord {
                event: key.event,
                cr3: key.cr3,
                ip: key.ip,
                top: key.top,
                stack: key.stack,
                ..TraceRecord::default()
            };
            tally.add_n(&record, resolver, count);
        }
        tally
    }

    /// The capture as a pprof profile, named by `resolver`: it began when
    /// the capture started and lasts until now; `sample_hz` is the
    /// sampler's rate, `vcpus` the VM's vCPUs (0: unknown).
    pub fn profile(self, mut resolver: Resolver, sample_hz: u32, vcpus: u32) -> Profile {
        let (records, dropped) = (self.records, self.dropped);
        let timing = match self.began {
            Some((wall, since)) => super::pprof::Timing {
                time_nanos: wall
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)),
                duration_nanos: i64::try_from(since.elapsed().as_nanos()).unwrap_or(i64::MAX),
                sample_hz,
                kicks: Some(self.kicks),
                vcpus,
            },
            None => super::pprof::Timing {
                sample_hz,
                kicks: Some(self.kicks),
                ..super::pprof::Timing::default()
            },
        };
        let tally = self.tally(&mut resolver);
        let mut p =
            super::pprof::profile(&tally, &resolver, timing, "a capture of the control API");
        if dropped > 0 {
            let note = format!(
                "lwpvmm: {dropped} of {} records not counted (more than {MAX_STACKS} distinct stacks)",
                records + dropped
            );
            p.comment.push(p.string_table.len() as i64);
            p.string_table.push(note);
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::objects::Symbols;

    fn mapping(cr3: u64, path: &str, first: bool) -> MappingLine {
        MappingLine {
            cr3,
            start: 0x40_0000,
            end: 0x50_0000,
            offset: 0,
            path: path.into(),
            build_id: String::new(),
            first,
            process: None,
        }
    }

    #[test]
    fn the_table_replays_what_the_guest_last_reported() {
        // (lines applied: path and `first`, paths the table then holds for
        // cr3 0x1000)
        type Lines<'a> = &'a [(&'a str, bool)];
        let table: &[(Lines, &[&str])] = &[
            (&[("/a", true)], &["/a"]),
            (&[("/a", true), ("/lib", false)], &["/a", "/lib"]),
            // A new program in a reused address space forgets the old one.
            (&[("/a", true), ("/lib", false), ("/b", true)], &["/b"]),
        ];
        for (lines, want) in table {
            let mut t = MappingTable::default();
            lines
                .iter()
                .for_each(|(p, first)| t.apply(&mapping(0x1000, p, *first)));
            let got = t.lines();
            let paths: Vec<&str> = got.iter().map(|m| m.path.as_str()).collect();
            assert_eq!(&paths, want, "{lines:?}");
            assert!(got[0].first, "the replay starts the space afresh");
        }
    }

    #[test]
    fn the_table_is_bounded() {
        let mut t = MappingTable::default();
        for cr3 in 0..(MAX_SPACES as u64 + 10) {
            t.apply(&mapping(cr3 << 12, "/p", true));
        }
        assert_eq!(t.spaces(), MAX_SPACES);
        assert!(
            !t.lines().iter().any(|m| m.cr3 == 0),
            "the oldest space went"
        );
        for _ in 0..MAX_MAPPINGS_PER_SPACE + 3 {
            t.apply(&mapping(0x5000, "/lib", false));
        }
        assert_eq!(t.dropped, 3);
    }

    /// The red team's full table: every space full of lines with long
    /// paths stays within its bytes, and captures share it.
    #[test]
    fn the_table_is_bounded_in_bytes_and_shared_by_captures() {
        let long = format!("/{}", "p".repeat(400));
        let mut t = MappingTable::default();
        let mut captures = Vec::new();
        for cr3 in 0..MAX_SPACES as u64 {
            for i in 0..MAX_MAPPINGS_PER_SPACE {
                t.apply(&mapping(cr3 << 12, &long, i == 0));
            }
            if cr3 % 1024 == 0 {
                captures.push(Capture::new(&t));
            }
        }
        assert!(t.bytes() <= MAX_TABLE_BYTES, "{} bytes", t.bytes());
        assert!(
            t.bytes()
                > MAX_TABLE_BYTES - MAX_MAPPINGS_PER_SPACE * line_bytes(&mapping(0, &long, true))
        );
        let newest = (MAX_SPACES as u64 - 1) << 12;
        assert_eq!(t.version().lines(newest).count(), MAX_MAPPINGS_PER_SPACE);
        assert_eq!(t.version().lines(0).count(), 0, "the oldest went first");
        // A capture keeps the version it started with.
        assert_eq!(captures[0].start.lines(0).count(), MAX_MAPPINGS_PER_SPACE);
        // Its lines are the table's, not copies.
        let (a, b) = (
            captures[3].start.0.get(&(1 << 12)),
            t.spaces.get(&(1 << 12)),
        );
        if let (Some(a), Some(b)) = (a, b) {
            assert!(Arc::ptr_eq(&a.lines, &b.lines));
        }
    }

    #[test]
    fn a_capture_counts_stacks_and_stays_bounded() {
        let mut c = Capture::default();
        let r = TraceRecord::stacked(5, 0x1000, 0x40_1000, &[0x40_2000]);
        c.record(&r);
        c.record(&r);
        assert_eq!((c.records, c.counts.len()), (2, 1));
        for ip in 0..MAX_STACKS as u64 + 5 {
            c.record(&TraceRecord::stacked(5, 0x1000, ip, &[]));
        }
        assert_eq!(c.counts.len(), MAX_STACKS);
        assert_eq!(c.dropped, 6);
        for _ in 0..MAX_CAPTURE_MAPPINGS + 2 {
            c.mapping(&mapping(0x1000, "/a", false));
        }
        assert_eq!(c.mappings_dropped, 2);
    }

    /// Records before a reused address space's new program are the old
    /// program's, those after it the new one's, also in the profile.
    #[test]
    fn records_resolve_with_the_mappings_of_their_time() {
        let mut table = MappingTable::default();
        table.apply(&mapping(0x1000, "/old", true));
        let mut c = Capture::new(&table);
        c.record(&TraceRecord::stacked(5, 0x1000, 0x40_0010, &[]));
        c.mapping(&mapping(0x1000, "/new", true));
        c.record(&TraceRecord::stacked(5, 0x1000, 0x40_0010, &[]));
        c.record(&TraceRecord::stacked(5, 0x1000, 0x40_0010, &[]));
        let mut resolver = Resolver::new(None, None);
        let tally = c.tally(&mut resolver);
        let mut per_object: Vec<(String, u64)> = tally
            .stacks(None)
            .map(|s| {
                let o = &resolver.objects[s.frames[0].object as usize];
                (o.path.clone(), s.count)
            })
            .collect();
        per_object.sort();
        assert_eq!(per_object, [("/new".into(), 2), ("/old".into(), 1)]);
    }

    #[test]
    fn the_profile_names_its_frames_and_says_what_it_dropped() {
        let symbols = Symbols::from_functions(&[(0x1000, 0x1100, "leaf", true)]);
        let mut c = Capture::default();
        c.record(&TraceRecord::stacked(5, 0x1000, 0x1010, &[]));
        c.dropped = 4;
        let p = c.profile(Resolver::with_symbols(symbols), 1000, 0);
        assert!(p.string_table.iter().any(|s| s == "leaf"));
        assert!(p.string_table.iter().any(|s| s.contains("4 of 5 records")));
        assert_eq!(p.period, 1_000_000, "a period of 1/sample_hz");
    }
}
