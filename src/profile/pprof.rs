//! A trace's records as a pprof profile (Google's profile.proto, gzipped):
//! the format `go tool pprof`, Pyroscope, Parca and Grafana read. One sample
//! type per LWP EventId in the trace, counting records; each distinct stack
//! is a sample, labelled with the address space (CR3) it was stored in;
//! each object frames lie in is a mapping with its path and build ID, and
//! its locations are the object's own addresses, named with its symbols.
//!
//! The messages are profile.proto's, declared for the `prost` crate, which
//! does the encoding; `flate2` compresses it.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};

use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use prost::Message;

use super::objects::{Frame, Resolver};
use super::report::{Tally, event_label};
use super::trace::GUEST_CPU;

/// profile.proto's `Profile` (the fields lwpvmm fills).
#[derive(Clone, PartialEq, Message)]
pub struct Profile {
    /// What each sample value counts.
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    /// The samples.
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    /// The executables the locations lie in.
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    /// The addresses of the stacks.
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    /// The functions the locations are in.
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    /// Every string the profile refers to by index; the first is "".
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    /// When the profile began (nanoseconds since the epoch).
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    /// How long it covers (nanoseconds; 0 when unknown).
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    /// What one sampling period is (cpu/nanoseconds for clock samples).
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    /// One sampling period, in `period_type`'s unit.
    #[prost(int64, tag = "12")]
    pub period: i64,
    /// Free-form comments (string indices).
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    /// The sample type tools show unless told otherwise (string index).
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

/// When a profile was taken, over how long, and the sampler's rate then.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timing {
    /// Its start, in nanoseconds since the epoch.
    pub time_nanos: i64,
    /// How long it covers, in nanoseconds (0 when unknown).
    pub duration_nanos: i64,
    /// The sampler's kicks per second (0: off or unknown).
    pub sample_hz: u32,
    /// The sampler's kicks charged to sampled contexts while the profile
    /// was taken, when known (a capture counts them; a trace does not).
    pub kicks: Option<u64>,
    /// The vCPUs that ran meanwhile (0: unknown). With the duration, the
    /// CPU time a profile can hold: no more than duration x vCPUs.
    pub vcpus: u32,
}

/// profile.proto's `ValueType`.
#[derive(Clone, PartialEq, Message)]
pub struct ValueType {
    /// The kind (string index).
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    /// The unit (string index).
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

/// profile.proto's `Sample`.
#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    /// Innermost location first.
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    /// One value per sample type.
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    /// Labels.
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

/// profile.proto's `Label`.
#[derive(Clone, PartialEq, Message)]
pub struct Label {
    /// The key (string index).
    #[prost(int64, tag = "1")]
    pub key: i64,
    /// A string value (string index; 0 for a number).
    #[prost(int64, tag = "2")]
    pub str: i64,
    /// A numeric value (with `str` 0).
    #[prost(int64, tag = "3")]
    pub num: i64,
}

/// profile.proto's `Mapping`.
#[derive(Clone, PartialEq, Message)]
pub struct Mapping {
    /// Its id (1-based).
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// The first address.
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    /// The address past the last.
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    /// The file offset of `memory_start`.
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    /// The file (string index).
    #[prost(int64, tag = "5")]
    pub filename: i64,
    /// The ELF build ID in hex (string index).
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    /// Its locations have function names.
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
}

/// profile.proto's `Location`.
#[derive(Clone, PartialEq, Message)]
pub struct Location {
    /// Its id (1-based).
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Its mapping (0: none).
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    /// The instruction address.
    #[prost(uint64, tag = "3")]
    pub address: u64,
    /// The function it is in, when known.
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

/// profile.proto's `Line`.
#[derive(Clone, PartialEq, Message)]
pub struct Line {
    /// The function.
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
}

/// profile.proto's `Function`.
#[derive(Clone, PartialEq, Message)]
pub struct Function {
    /// Its id (1-based).
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Its name (string index).
    #[prost(int64, tag = "2")]
    pub name: i64,
    /// Its name in the object file (string index).
    #[prost(int64, tag = "3")]
    pub system_name: i64,
}

/// Builds a profile up: strings, functions and locations each once.
#[derive(Default)]
struct Builder {
    profile: Profile,
    strings: BTreeMap<String, i64>,
    functions: BTreeMap<String, u64>,
    locations: BTreeMap<Frame, u64>,
    /// Each object's mapping id ([`mapping_ids`]).
    mapping_ids: Vec<u64>,
}

/// Each of `objects` objects' mapping id: the one most records land in
/// first, then the others as the resolver found them. pprof names a
/// profile after its first mapping (`File:`), which must be the program
/// sampled, not whichever file the mapping table named first.
fn mapping_ids(tally: &Tally, objects: usize) -> Vec<u64> {
    let mut weight = vec![0u64; objects];
    for c in tally.stacks(None) {
        if let Some(w) = c
            .frames
            .first()
            .filter(|f| f.object != Frame::RAW)
            .and_then(|f| weight.get_mut(f.object as usize))
        {
            *w += c.count;
        }
    }
    let mut order: Vec<usize> = (0..objects).collect();
    // Stable: ties keep the resolver's order.
    order.sort_by_key(|&i| std::cmp::Reverse(weight[i]));
    let mut ids = vec![0u64; objects];
    for (rank, &object) in order.iter().enumerate() {
        ids[object] = rank as u64 + 1;
    }
    ids
}

impl Builder {
    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.profile.string_table.len() as i64;
        self.profile.string_table.push(s.to_owned());
        self.strings.insert(s.to_owned(), i);
        i
    }

    fn function(&mut self, name: &str) -> u64 {
        if let Some(&id) = self.functions.get(name) {
            return id;
        }
        let id = self.profile.function.len() as u64 + 1;
        let name_index = self.string(name);
        self.profile.function.push(Function {
            id,
            name: name_index,
            system_name: name_index,
        });
        self.functions.insert(name.to_owned(), id);
        id
    }

    /// The location of `frame` (a return address already moved back into
    /// its call), named by `resolver`.
    fn location(&mut self, frame: Frame, resolver: &Resolver) -> u64 {
        if let Some(&id) = self.locations.get(&frame) {
            return id;
        }
        let id = self.profile.location.len() as u64 + 1;
        let name = resolver
            .symbols(frame)
            .and_then(|s| s.lookup(frame.address))
            .map(str::to_owned)
            .or_else(|| resolver.unnamed_kernel(frame));
        let line = name
            .map(|n| Line {
                function_id: self.function(&n),
            })
            .into_iter()
            .collect();
        let mapping_id = if frame.object == Frame::RAW {
            0
        } else {
            self.mapping_ids
                .get(frame.object as usize)
                .copied()
                .unwrap_or(0)
        };
        self.profile.location.push(Location {
            id,
            mapping_id,
            address: frame.address,
            line,
        });
        self.locations.insert(frame, id);
        id
    }
}

/// The profile of `tally`'s records, every EventId a sample type of its
/// own, named by `resolver`; `source` says where the records came from
/// (a comment of the profile).
///
/// With sampled clocks (CNH, else RNH: the event `report` counts by
/// default) and a known sampler rate, the profile also has a `cpu` sample
/// type in nanoseconds, its period (1/`sample_hz`), and `cpu` as the
/// default sample type, so tools show time without options. Each kick is
/// one period of CPU time: with the kicks counted (a capture), their time
/// is shared out over the stacks by their records, exactly, however many
/// records one kick stores (an LWPCB interval shorter than a kick's cycles
/// stores several); without (a trace), each record counts one period, and
/// the shares are exact but the times are that many times too large.
/// Without clocks the default is the last type, as pprof's own rule has it.
pub fn profile(tally: &Tally, resolver: &Resolver, timing: Timing, source: &str) -> Profile {
    let mut b = Builder::default();
    b.string("");
    let events: Vec<u8> = tally.events().collect();
    let count = b.string("count");
    for &e in &events {
        let kind = b.string(&event_label(e));
        b.profile.sample_type.push(ValueType {
            r#type: kind,
            unit: count,
        });
    }
    // Whole-guest samples are the guest's time; else the sampled clocks.
    let whole_guest = tally.events().any(|e| e == GUEST_CPU);
    let clock = if whole_guest {
        Some(GUEST_CPU)
    } else {
        tally.default_event()
    };
    let clock_records: u64 = clock.map_or(0, |e| tally.stacks(Some(e)).map(|c| c.count).sum());
    let period = (timing.sample_hz > 0).then(|| 1_000_000_000 / i64::from(timing.sample_hz));
    let cpu_slot = match (clock, period) {
        (Some(_), Some(period)) => {
            let cpu = b.string(if whole_guest { "guest_cpu" } else { "cpu" });
            let nanoseconds = b.string("nanoseconds");
            let ns = ValueType {
                r#type: cpu,
                unit: nanoseconds,
            };
            b.profile.sample_type.push(ns.clone());
            b.profile.period_type = Some(ns);
            b.profile.period = period;
            b.profile.default_sample_type = cpu;
            Some(events.len())
        }
        (Some(e), None) => {
            b.profile.default_sample_type = b.string(&event_label(e));
            None
        }
        _ => None,
    };
    // Every object is a mapping of its own addresses: the profile merges
    // processes, so no one load address would do.
    b.mapping_ids = mapping_ids(tally, resolver.objects.len());
    let mut by_id: Vec<usize> = (0..resolver.objects.len()).collect();
    by_id.sort_by_key(|&i| b.mapping_ids[i]);
    for i in by_id {
        let o = &resolver.objects[i];
        let filename = b.string(&o.path);
        let build_id = b.string(&o.build_id);
        b.profile.mapping.push(Mapping {
            id: b.mapping_ids[i],
            memory_start: 0,
            memory_limit: u64::MAX,
            file_offset: 0,
            filename,
            build_id,
            has_functions: o.symbols.is_some(),
        });
    }
    let cr3_key = b.string("cr3");
    let pid_key = b.string("pid");
    let process_key = b.string("process");
    for c in tally.stacks(None) {
        // A return address is located by the call before it, as pprof's
        // own profiles do for every frame but the innermost.
        let location_id = c
            .frames
            .iter()
            .enumerate()
            .map(|(i, &f)| {
                let address = if i == 0 {
                    f.address
                } else {
                    f.address.saturating_sub(1)
                };
                b.location(Frame { address, ..f }, resolver)
            })
            .collect();
        let mut value = vec![0i64; b.profile.sample_type.len()];
        let n = i64::try_from(c.count).unwrap_or(i64::MAX);
        if let Some(slot) = events.iter().position(|&e| e == c.event) {
            value[slot] = n;
        }
        if let (Some(slot), Some(period)) = (cpu_slot, period)
            && Some(c.event) == clock
        {
            value[slot] = match (timing.kicks, clock_records) {
                // Each whole-guest sample is one kick, one period.
                _ if whole_guest => n.saturating_mul(period),
                (Some(kicks), total) if total > 0 => {
                    let share = u128::from(c.count) * u128::from(kicks) * period as u128
                        / u128::from(total);
                    i64::try_from(share).unwrap_or(i64::MAX)
                }
                _ => n.saturating_mul(period),
            };
        }
        let space = b.string(&format!("{:#x}", c.cr3));
        let mut label = vec![Label {
            key: cr3_key,
            str: space,
            num: 0,
        }];
        // Who ran, as pprof's own labels name it: `-tagfocus process=NAME`
        // and `-tagroot pid,process` work.
        if let Some(p) = c.process {
            let name = b.string(&p.name);
            label.push(Label {
                key: pid_key,
                str: 0,
                num: i64::from(p.pid),
            });
            label.push(Label {
                key: process_key,
                str: name,
                num: 0,
            });
        }
        b.profile.sample.push(Sample {
            location_id,
            value,
            label,
        });
    }
    let what = if whole_guest {
        "whole-guest samples and LWP records"
    } else {
        "LWP records"
    };
    let comment = b.string(&format!("lwpvmm: {what} from {source}"));
    b.profile.comment.push(comment);
    if let Some(note) = tally.unreported_user_note(None) {
        let note = b.string(&note);
        b.profile.comment.push(note);
    }
    if let Some(slot) = cpu_slot
        && let Some(note) = cap_cpu_time(&mut b.profile.sample, slot, &timing)
    {
        let note = b.string(&note);
        b.profile.comment.push(note);
    }
    b.profile.time_nanos = timing.time_nanos;
    b.profile.duration_nanos = timing.duration_nanos;
    b.profile
}

/// Holds the CPU time of `samples` (their values at `slot`) to what the
/// profile's span can hold, its duration times its vCPUs: records that
/// count a period each (a trace's, where an LWPCB interval shorter than a
/// kick stores several records a kick) would otherwise add up to more CPU
/// time than the vCPUs had, and a reader would rank by a total over 100 %.
/// Each sample keeps its share. Returns the note that says so, when it
/// scaled.
fn cap_cpu_time(samples: &mut [Sample], slot: usize, timing: &Timing) -> Option<String> {
    let span = u128::try_from(timing.duration_nanos).ok()? * u128::from(timing.vcpus);
    let total: u128 = samples
        .iter()
        .map(|s| u128::try_from(s.value[slot]).unwrap_or(0))
        .sum();
    if span == 0 || total <= span {
        return None;
    }
    for sample in samples.iter_mut() {
        let v = u128::try_from(sample.value[slot]).unwrap_or(0);
        sample.value[slot] = i64::try_from(v * span / total).unwrap_or(i64::MAX);
    }
    Some(format!(
        "lwpvmm: CPU time scaled from {} ms to {} ms, the span times its {} vCPUs: the records outnumbered the sampler's periods (shares are exact)",
        total / 1_000_000,
        span / 1_000_000,
        timing.vcpus
    ))
}

/// Writes `profile` gzipped, as pprof files are.
pub fn write(profile: &Profile, out: impl Write) -> io::Result<()> {
    let mut gz = GzEncoder::new(out, Compression::default());
    gz.write_all(&profile.encode_to_vec())?;
    gz.finish()?.flush()
}

/// Reads a gzipped profile (tools and tests).
pub fn read(gzipped: &[u8]) -> io::Result<Profile> {
    let mut bytes = Vec::new();
    GzDecoder::new(gzipped).read_to_end(&mut bytes)?;
    Profile::decode(bytes.as_slice()).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A profile's sample types as (type, unit) names, in order.
    fn sample_types(p: &Profile) -> Vec<(&str, &str)> {
        let s = |i: i64| p.string_table[i as usize].as_str();
        p.sample_type
            .iter()
            .map(|t| (s(t.r#type), s(t.unit)))
            .collect()
    }
    use crate::profile::objects::Symbols;
    use crate::profile::trace::{MappingLine, TraceRecord};

    #[test]
    fn a_profile_round_trips_with_stacks_names_and_one_type_per_event() {
        // A sysroot holding the demo guest as /demo, mapped in one address
        // space; another has no mapping.
        let dir = std::env::temp_dir().join(format!("lwpvmm-pprof-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let demo = crate::guests::get("demo").unwrap();
        std::fs::write(dir.join("demo"), demo).unwrap();
        let main = Symbols::from_elf(demo)
            .unwrap()
            .address_of("main")
            .expect("main");
        let mut resolver = Resolver::new(
            None,
            Some(crate::profile::sysroot::Sysroot::dir(&dir).into()),
        );
        // The guest's segment: 1 MiB up, from file offset 4 KiB (guest.ld).
        resolver.mapping(&MappingLine {
            cr3: 0x1000,
            start: 0x10_0000,
            end: 0x20_0000,
            offset: 0x1000,
            path: "/demo".into(),
            build_id: "abcd".into(),
            first: true,
            process: Some(crate::profile::trace::Process {
                pid: 42,
                name: "demo".into(),
            }),
        });
        let mut tally = Tally::default();
        for r in [
            TraceRecord::stacked(5, 0x1000, main + 1, &[0x10_9999]),
            TraceRecord::stacked(5, 0x1000, main + 1, &[0x10_9999]),
            TraceRecord::stacked(255, 0x2000, 0x8888, &[]),
        ] {
            tally.add(&r, &resolver);
        }
        let mut gz = Vec::new();
        let timing = Timing {
            time_nanos: 7,
            duration_nanos: 5_000_000_000,
            sample_hz: 1000,
            kicks: None,
            vcpus: 1,
        };
        write(&profile(&tally, &resolver, timing, "a test"), &mut gz).unwrap();
        let p = read(&gz).unwrap();
        let s = |i: i64| p.string_table[i as usize].as_str();
        assert_eq!(p.string_table[0], "");
        let types = sample_types(&p);
        assert_eq!(
            types,
            [
                ("cpu_clocks", "count"),
                ("lwpins", "count"),
                ("cpu", "nanoseconds")
            ]
        );
        // Tools open it on CPU time: one millisecond per clock sample at
        // 1 kHz.
        assert_eq!(s(p.default_sample_type), "cpu");
        let period = p.period_type.as_ref().map(|t| (s(t.r#type), s(t.unit)));
        assert_eq!(
            (period, p.period),
            (Some(("cpu", "nanoseconds")), 1_000_000)
        );
        assert_eq!(p.duration_nanos, 5_000_000_000);
        assert_eq!(p.sample.len(), 2);
        let clocks = p
            .sample
            .iter()
            .find(|x| x.value == [2, 0, 2_000_000])
            .expect("CNH sample");
        assert_eq!(clocks.location_id.len(), 2);
        let leaf = &p.location[clocks.location_id[0] as usize - 1];
        assert_eq!(leaf.address, main + 1);
        assert_eq!(
            s(p.function[leaf.line[0].function_id as usize - 1].name),
            "main"
        );
        let caller = &p.location[clocks.location_id[1] as usize - 1];
        assert_eq!(
            caller.address, 0x10_9998,
            "a return address is located at its call"
        );
        // The address space, and the process the guest named for it.
        let labels: Vec<(&str, &str, i64)> = clocks
            .label
            .iter()
            .map(|l| (s(l.key), s(l.str), l.num))
            .collect();
        assert_eq!(
            labels,
            [
                ("cr3", "0x1000", 0),
                ("pid", "", 42),
                ("process", "demo", 0)
            ]
        );
        assert_eq!(
            (s(p.mapping[0].filename), s(p.mapping[0].build_id)),
            ("/demo", "abcd")
        );
        assert_eq!(p.time_nanos, 7);
        let raw = p
            .sample
            .iter()
            .find(|x| x.value == [0, 1, 0])
            .expect("LWPINS sample");
        let other = &p.location[raw.location_id[0] as usize - 1];
        assert_eq!(
            (other.mapping_id, other.address),
            (0, 0x8888),
            "no mapping in its address space"
        );
        // Kicks counted: their time is shared out by records (here 3
        // kicks over 2 records of one stack: 3 ms).
        let counted = Timing {
            kicks: Some(3),
            ..timing
        };
        let p = profile(&tally, &resolver, counted, "a test");
        let cpu: i64 = p.sample.iter().map(|x| x.value[2]).sum();
        assert_eq!(cpu, 3_000_000);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_first_mapping_is_the_object_most_records_land_in() {
        let dir = std::env::temp_dir().join(format!("lwpvmm-pprof-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let demo = crate::guests::get("demo").unwrap();
        for name in ["records", "demo"] {
            std::fs::write(dir.join(name), demo).unwrap();
        }
        let mut resolver = Resolver::new(
            None,
            Some(crate::profile::sysroot::Sysroot::dir(&dir).into()),
        );
        // The table names a buffer's file first, the program second.
        for (start, path, first) in [(0x40_0000, "/records", true), (0x10_0000, "/demo", false)] {
            resolver.mapping(&crate::profile::objects::mapping(
                0x1000, start, path, first,
            ));
        }
        let mut tally = Tally::default();
        for r in [
            TraceRecord::stacked(5, 0x1000, 0x10_0100, &[]),
            TraceRecord::stacked(5, 0x1000, 0x10_0200, &[]),
            TraceRecord::stacked(5, 0x1000, 0x40_0100, &[]),
        ] {
            tally.add(&r, &resolver);
        }
        let timing = Timing {
            time_nanos: 0,
            duration_nanos: 0,
            sample_hz: 1000,
            kicks: None,
            vcpus: 0,
        };
        let p = profile(&tally, &resolver, timing, "a test");
        let s = |i: i64| p.string_table[i as usize].as_str();
        let files: Vec<&str> = p.mapping.iter().map(|m| s(m.filename)).collect();
        assert_eq!(files, ["/demo", "/records"]);
        // Each location keeps its own object's mapping: two records in the
        // program, one in the other file.
        let mut per_file = BTreeMap::new();
        for sample in &p.sample {
            let location = &p.location[sample.location_id[0] as usize - 1];
            let file = s(p.mapping[location.mapping_id as usize - 1].filename);
            *per_file.entry(file).or_insert(0) += sample.value[0];
        }
        assert_eq!(
            per_file.into_iter().collect::<Vec<_>>(),
            [("/demo", 2), ("/records", 1)]
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn cpu_time_never_exceeds_the_span_times_the_vcpus() {
        let resolver = Resolver::default();
        let mut tally = Tally::default();
        // Three clock records at 1 kHz: 3 ms as a trace counts them.
        for ip in [0x1000, 0x1000, 0x2000] {
            tally.add(&TraceRecord::stacked(5, 0x1000, ip, &[]), &resolver);
        }
        // (span in ms, vCPUs, CPU time in ms, scaled)
        let table = [
            (0, 1, 3, false),
            (10, 1, 3, false),
            (1, 0, 3, false),
            (1, 1, 1, true),
            (1, 2, 2, true),
        ];
        for (span, vcpus, want, scaled) in table {
            let timing = Timing {
                time_nanos: 0,
                duration_nanos: span * 1_000_000,
                sample_hz: 1000,
                kicks: None,
                vcpus,
            };
            let p = profile(&tally, &resolver, timing, "a test");
            let cpu = p.sample_type.len() - 1;
            let total: i64 = p.sample.iter().map(|s| s.value[cpu]).sum();
            assert!(
                (total - want * 1_000_000).abs() <= 2,
                "{span} ms x {vcpus}: {total} ns"
            );
            let noted = p
                .comment
                .iter()
                .any(|&c| p.string_table[c as usize].contains("CPU time scaled"));
            assert_eq!(noted, scaled, "{span} ms x {vcpus}");
        }
    }

    #[test]
    fn whole_guest_samples_are_the_profiles_time_and_kernel_frames_are_marked() {
        let mut resolver = Resolver::default();
        let kallsyms = "ffffffff81000000 T _text\nffffffff81001000 T read_zero\nffffffff81002000 t clear_user\n";
        assert!(resolver.set_kernel("kallsyms", kallsyms.as_bytes()));
        let kernel = |ip, stack: &[u64]| {
            let mut r = TraceRecord::guest_cpu(0, 0x1000, ip, true, 1, 1_000_000, 0);
            r.stack = stack.to_vec();
            r
        };
        let mut tally = Tally::default();
        for r in [
            kernel(0xffff_ffff_8100_2010, &[0xffff_ffff_8100_1020]),
            kernel(0xffff_ffff_8100_2010, &[0xffff_ffff_8100_1020]),
            kernel(0xffff_ffff_8100_2010, &[0xffff_ffff_8100_1020]),
            // Two periods of guest time since that vCPU's last sample.
            TraceRecord::guest_cpu(1, 0x2000, 0x40_1000, false, 2, 1_000_000, 0),
            TraceRecord::stacked(255, 0x2000, 0x8888, &[]),
        ] {
            tally.add(&r, &resolver);
        }
        let timing = Timing {
            sample_hz: 1000,
            ..Timing::default()
        };
        let p = profile(&tally, &resolver, timing, "a test");
        let s = |i: i64| p.string_table[i as usize].as_str();
        // (type, unit) in order: one count per EventId, then guest time.
        let types = sample_types(&p);
        assert_eq!(
            types,
            [
                ("guest_cpu_samples", "count"),
                ("lwpins", "count"),
                ("guest_cpu", "nanoseconds")
            ]
        );
        assert_eq!(s(p.default_sample_type), "guest_cpu");
        assert_eq!(p.period, 1_000_000);
        // (leaf function, values): three kernel samples, one user sample,
        // one LWPINS record (no time).
        let mut got: Vec<(String, Vec<i64>)> = p
            .sample
            .iter()
            .map(|x| {
                let leaf = &p.location[x.location_id[0] as usize - 1];
                let name = leaf
                    .line
                    .first()
                    .map(|l| s(p.function[l.function_id as usize - 1].name).to_owned())
                    .unwrap_or_else(|| format!("{:#x}", leaf.address));
                (name, x.value.clone())
            })
            .collect();
        got.sort();
        assert_eq!(
            got,
            [
                ("0x401000".to_owned(), vec![2, 0, 2_000_000]),
                ("0x8888".to_owned(), vec![0, 1, 0]),
                ("clear_user".to_owned(), vec![3, 0, 3_000_000]),
            ]
        );
        // pprof names kernel functions plainly: their mapping is the kernel's.
        let kernel_leaf = p
            .location
            .iter()
            .find(|l| l.address == 0xffff_ffff_8100_2010)
            .expect("the kernel leaf");
        let mapping = &p.mapping[kernel_leaf.mapping_id as usize - 1];
        assert_eq!(s(mapping.filename), "kallsyms");
        assert_eq!(
            super::super::report::folded(&tally, &resolver, Some(0)),
            ["0x401000 2", "read_zero_[k];clear_user_[k] 3"]
        );
    }
}
