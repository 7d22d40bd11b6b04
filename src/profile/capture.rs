//! Profiles captured while a VM runs, for the control API
//! (`GET /debug/pprof/profile`, `PUT /capture/stop`): the records stored
//! during a capture, counted per distinct stack as they arrive, and the
//! executable mappings each address space had, so that a capture resolves
//! its frames exactly as `lwpvmm report` would resolve the same records in
//! a trace. Both are bounded: a guest that makes ever new stacks or ever
//! new address spaces costs a fixed amount of host memory, and what did not
//! fit is counted.

use std::collections::HashMap;

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

/// The executable mappings of every address space, as the guest last
/// reported them: what a capture that starts now resolves its first
/// records with.
#[derive(Debug, Default)]
pub struct MappingTable {
    spaces: HashMap<u64, Space>,
    clock: u64,
    /// Mapping lines not kept (a full space).
    pub dropped: u64,
}

#[derive(Debug, Default)]
struct Space {
    touched: u64,
    lines: Vec<MappingLine>,
}

impl MappingTable {
    /// Takes a mapping line the guest reported.
    pub fn apply(&mut self, line: &MappingLine) {
        self.clock += 1;
        if !self.spaces.contains_key(&line.cr3) && self.spaces.len() >= MAX_SPACES {
            let oldest = self
                .spaces
                .iter()
                .min_by_key(|(_, s)| s.touched)
                .map(|(&cr3, _)| cr3);
            if let Some(cr3) = oldest {
                self.spaces.remove(&cr3);
            }
        }
        let space = self.spaces.entry(line.cr3).or_default();
        space.touched = self.clock;
        if line.first {
            space.lines.clear();
        }
        if space.lines.len() >= MAX_MAPPINGS_PER_SPACE {
            self.dropped += 1;
            return;
        }
        space.lines.push(line.clone());
    }

    /// Every mapping, each address space's first line marked `first`, as a
    /// trace would replay them.
    pub fn lines(&self) -> Vec<MappingLine> {
        let mut out = Vec::new();
        for space in self.spaces.values() {
            for (i, line) in space.lines.iter().enumerate() {
                out.push(MappingLine {
                    first: i == 0,
                    ..line.clone()
                });
            }
        }
        out
    }

    /// Address spaces followed.
    pub fn spaces(&self) -> usize {
        self.spaces.len()
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
    start: Vec<MappingLine>,
    mappings: Vec<MappingLine>,
    counts: HashMap<Key, u64>,
    /// Records counted.
    pub records: u64,
    /// Records not counted: their stack would have exceeded
    /// [`MAX_STACKS`].
    pub dropped: u64,
    /// Mapping lines not kept (past [`MAX_CAPTURE_MAPPINGS`]).
    pub mappings_dropped: u64,
}

impl Capture {
    /// A capture whose address spaces start with `table`'s mappings.
    pub fn new(table: &MappingTable) -> Self {
        Capture {
            start: table.lines(),
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
        if let Some(n) = self.counts.get_mut(&key) {
            *n += 1;
        } else if self.counts.len() < MAX_STACKS {
            self.counts.insert(key, 1);
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
    /// the mappings as they stood at each record.
    pub fn tally(self, resolver: &mut Resolver) -> Tally {
        self.start.iter().for_each(|m| resolver.mapping(m));
        let mut keys: Vec<(Key, u64)> = self.counts.into_iter().collect();
        keys.sort_by_key(|(k, _)| k.generation);
        let mut applied = 0;
        let mut tally = Tally::default();
        for (key, count) in keys {
            while applied < key.generation {
                resolver.mapping(&self.mappings[applied]);
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

    /// The capture as a pprof profile taken at `time_nanos`, named by
    /// `resolver`.
    pub fn profile(self, mut resolver: Resolver, time_nanos: i64) -> Profile {
        let (records, dropped) = (self.records, self.dropped);
        let tally = self.tally(&mut resolver);
        let mut p = super::pprof::profile(
            &tally,
            &resolver,
            time_nanos,
            "a capture of the control API",
        );
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
        let p = c.profile(Resolver::with_symbols(symbols), 7);
        assert!(p.string_table.iter().any(|s| s == "leaf"));
        assert!(p.string_table.iter().any(|s| s.contains("4 of 5 records")));
        assert_eq!(p.time_nanos, 7);
    }
}
