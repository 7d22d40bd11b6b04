//! The objects a report names frames with: the function symbols of guest
//! ELF files (with which functions set up a frame pointer), and the
//! resolver that maps an address of an address space to an object and an
//! address in it, from the `--symbols` ELF or from the executable mappings
//! the guest reported into the trace, with the files found under
//! `--sysroot`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SymbolKind};

use super::sysroot::{FileId, Refusal, Sysroot, normal};
use super::trace::{MappingLine, Process};
use crate::hostfs::HostFsError;

/// Function symbols of a guest ELF, sorted by address, and which of them
/// set up a frame pointer.
#[derive(Debug, Default)]
pub struct Symbols {
    functions: Vec<(u64, u64, String)>,
    /// Per function: the length of its frame-pointer prologue (`push %rbp;
    /// mov %rsp,%rbp`, after an ENDBR64), or `None` when it has none.
    prologues: Vec<Option<u64>>,
}

/// The length of the frame-pointer prologue `code` starts with, if any.
fn prologue(code: &[u8]) -> Option<u64> {
    const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];
    let skip = if code.starts_with(&ENDBR64) { 4 } else { 0 };
    let body = code.get(skip..)?;
    // push %rbp; mov %rsp,%rbp (both encodings of the move), or 32-bit
    // push %ebp; mov %esp,%ebp.
    [
        &[0x55, 0x48, 0x89, 0xe5][..],
        &[0x55, 0x48, 0x8b, 0xec],
        &[0x55, 0x89, 0xe5],
        &[0x55, 0x8b, 0xec],
    ]
    .iter()
    .find(|p| body.starts_with(p))
    .map(|p| (skip + p.len()) as u64)
}

/// A global symbol without a type in a code section: how assembly names
/// its entry points (Linux's `entry_SYSCALL_64`, `asm_exc_page_fault`),
/// which are functions to a profile.
fn is_code_label(file: &object::File<'_>, s: &object::Symbol<'_, '_>) -> bool {
    s.kind() == SymbolKind::Unknown
        && s.is_global()
        && s.section_index()
            .and_then(|i| file.section_by_index(i).ok())
            .is_some_and(|section| section.kind() == object::SectionKind::Text)
}

impl Symbols {
    /// The function symbols of `elf`, and the global labels of its code. A symbol without a size ends where the
    /// next one starts.
    pub fn from_elf(elf: &[u8]) -> Result<Self, object::Error> {
        let file = object::File::parse(elf)?;
        let mut f: Vec<(u64, u64, String)> = file
            .symbols()
            .filter(|s| {
                s.is_definition() && (s.kind() == SymbolKind::Text || is_code_label(&file, s))
            })
            .filter_map(|s| Some((s.address(), s.size(), s.name().ok()?.to_owned())))
            .filter(|(_, _, name)| !name.is_empty())
            .collect();
        f.sort_by_key(|&(a, _, _)| a);
        f.dedup_by_key(|(a, _, _)| *a);
        let starts: Vec<u64> = f.iter().map(|s| s.0).skip(1).chain([u64::MAX]).collect();
        let code = |address: u64| {
            file.sections().find_map(|s| {
                let offset = address.checked_sub(s.address())?;
                let data = s.data().ok()?;
                data.get(usize::try_from(offset).ok()?..)
            })
        };
        let prologues = f
            .iter()
            .map(|&(a, _, _)| code(a).and_then(prologue))
            .collect();
        // A label's extent stops at the end of its section: `_etext`, the
        // last label of a vmlinux's text, would otherwise name every
        // address above it (a module's code).
        let section_end = |address: u64| {
            file.sections()
                .map(|s| (s.address(), s.address().saturating_add(s.size())))
                .find(|&(start, end)| (start..=end).contains(&address) && end > start)
                .map_or(u64::MAX, |(_, end)| end)
        };
        let functions = f
            .into_iter()
            .zip(starts)
            .map(|((a, size, name), next)| {
                let end = if size > 0 {
                    a.saturating_add(size)
                } else {
                    next.min(section_end(a))
                };
                (a, end, name)
            })
            .collect();
        Ok(Symbols {
            functions,
            prologues,
        })
    }

    /// The text symbols of a `/proc/kallsyms` copy (`ADDRESS TYPE NAME
    /// [MODULE]` per line): each ends where the next starts, and none is
    /// known to have a frame (kallsyms has no code). Lines that are not
    /// symbol lines are skipped; `None` when no line is one.
    pub fn from_kallsyms(text: &str) -> Option<Self> {
        let mut f: Vec<(u64, String)> = text
            .lines()
            .filter_map(|line| {
                let mut words = line.split_whitespace();
                let address = u64::from_str_radix(words.next()?, 16).ok()?;
                let kind = words.next()?;
                let name = words.next()?;
                (matches!(kind, "t" | "T" | "w" | "W") && address != 0)
                    .then(|| (address, name.to_owned()))
            })
            .collect();
        if f.is_empty() {
            return None;
        }
        f.sort();
        f.dedup_by_key(|(a, _)| *a);
        let starts: Vec<u64> = f.iter().map(|s| s.0).skip(1).chain([u64::MAX]).collect();
        Some(Symbols {
            prologues: vec![None; f.len()],
            functions: f
                .into_iter()
                .zip(starts)
                // `_etext` marks the end of the kernel's text: it names
                // nothing after it (the modules' code).
                .map(|((a, name), next)| (a, if name == END_OF_TEXT { a } else { next }, name))
                .collect(),
        })
    }

    /// Symbols of made-up functions: (start, end, name, has a frame).
    #[cfg(test)]
    pub fn from_functions(functions: &[(u64, u64, &str, bool)]) -> Self {
        Symbols {
            functions: functions
                .iter()
                .map(|&(a, e, n, _)| (a, e, n.to_owned()))
                .collect(),
            prologues: functions.iter().map(|f| f.3.then_some(4)).collect(),
        }
    }

    /// The lowest address a symbol names.
    pub fn first_address(&self) -> Option<u64> {
        self.functions.first().map(|f| f.0)
    }

    /// The start of the function `name`.
    pub fn address_of(&self, name: &str) -> Option<u64> {
        self.functions
            .iter()
            .find(|(_, _, n)| n == name)
            .map(|&(a, _, _)| a)
    }

    /// The function containing `ip`.
    pub fn lookup(&self, ip: u64) -> Option<&str> {
        self.index(ip).map(|i| self.functions[i].2.as_str())
    }

    fn index(&self, ip: u64) -> Option<usize> {
        let i = self.functions.partition_point(|&(a, _, _)| a <= ip);
        let i = i.checked_sub(1)?;
        let (start, end, _) = &self.functions[i];
        (*start..*end).contains(&ip).then_some(i)
    }

    /// The return address of a context interrupted at `ip` whose stack
    /// pointer points at `top`, when the frame-pointer chain misses it: the
    /// function at `ip` has no frame of its own (a leaf function compiled
    /// without one) or has not pushed RBP yet. `top` must itself be in a
    /// known function.
    pub fn frameless_caller(&self, ip: u64, top: u64) -> Option<u64> {
        let i = self.index(ip)?;
        let start = self.functions[i].0;
        let missed = match self.prologues.get(i).copied().flatten() {
            None => true,
            Some(_) => ip == start,
        };
        (missed && self.index(top.checked_sub(1)?).is_some()).then_some(top)
    }
}

/// A frame of a stack: an address inside an object, or a raw address when
/// no object is known for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Frame {
    /// The object's index in [`Resolver::objects`], or [`Frame::RAW`].
    pub object: u32,
    /// The address: the object's own (its ELF virtual address) when the
    /// object is known, else as the guest saw it.
    pub address: u64,
}

impl Frame {
    /// No object.
    pub const RAW: u32 = u32::MAX;
}

/// An object frames lie in.
#[derive(Debug)]
pub struct ObjectFile {
    /// Its path: the guest's, or the `--symbols` file's.
    pub path: String,
    /// Its symbols, when its ELF was found and read.
    pub symbols: Option<Symbols>,
    /// Its build ID in hex ("" when unknown): the guest's report, or the
    /// ELF's own.
    pub build_id: String,
    /// Its loadable segments: (file offset, virtual address, file size).
    segments: Vec<(u64, u64, u64)>,
}

impl ObjectFile {
    fn from_elf(path: String, elf: Option<&[u8]>, build_id: String) -> Self {
        let file = elf.and_then(|e| object::File::parse(e).ok());
        let own_id = file
            .as_ref()
            .and_then(|f| f.build_id().ok().flatten())
            .map(hex)
            .unwrap_or_default();
        let segments = file
            .as_ref()
            .map(|f| {
                f.segments()
                    .map(|s| {
                        let (offset, size) = s.file_range();
                        (offset, s.address(), size)
                    })
                    .collect()
            })
            .unwrap_or_default();
        ObjectFile {
            path,
            symbols: elf.and_then(|e| Symbols::from_elf(e).ok()),
            build_id: if build_id.is_empty() {
                own_id
            } else {
                build_id
            },
            segments,
        }
    }

    /// The object's virtual address for a file offset, when a segment
    /// holds it.
    fn address_of_offset(&self, offset: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|&&(o, _, size)| (o..o.saturating_add(size)).contains(&offset))
            .map(|&(o, vaddr, _)| vaddr.wrapping_add(offset - o))
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The most bytes of a kernel symbol file read (a vmlinux with debug
/// information is tens of MiB; a kallsyms copy a few).
pub const KERNEL_SYMBOLS_MAX: u64 = 1 << 30;

/// The label that marks the end of a kernel's text.
const END_OF_TEXT: &str = "_etext";

/// Why a kernel symbol file cannot name kernel frames.
#[derive(Debug, thiserror::Error)]
pub enum KernelSymbolsError {
    /// It cannot be read, or is no regular file, or is too large.
    #[error(transparent)]
    File(#[from] HostFsError),
    /// Not symbols.
    #[error("neither an ELF with a symbol table (a vmlinux) nor a copy of /proc/kallsyms")]
    NoSymbols,
}

/// Reads a kernel symbol file a user named (a regular file of at most
/// [`KERNEL_SYMBOLS_MAX`] bytes) and checks that it names kernel functions,
/// for [`Resolver::set_kernel`].
pub fn read_kernel_symbols(path: &std::path::Path) -> Result<Vec<u8>, KernelSymbolsError> {
    let bytes =
        crate::hostfs::read_input(path, KERNEL_SYMBOLS_MAX, "the most read of kernel symbols")?;
    if !Resolver::default().set_kernel(&path.display().to_string(), &bytes) {
        return Err(KernelSymbolsError::NoSymbols);
    }
    Ok(bytes)
}

/// Where the kernel half of a 64-bit address space starts (canonical
/// addresses with bit 47 set).
pub const KERNEL_HALF: u64 = 0xffff_8000_0000_0000;

/// The symbol x86-64 Linux points MSR LSTAR at: where a randomised kernel
/// was placed is read from it.
const SYSCALL_ENTRY: &str = "entry_SYSCALL_64";

/// The most bytes of guest files one resolver reads (one report, or one
/// profile of the API): past it, further files are refused
/// ([`Refusal::Budget`]) and their frames stay addresses.
pub const READ_BUDGET: u64 = 1 << 30;
/// The most guest paths a resolver remembers as refused or missing; past
/// it they are only counted.
pub const MAX_MISSING: usize = 1024;

/// Maps addresses of address spaces to objects as a trace streams by.
///
/// Files are cached by their normalised guest path and by their identity
/// (device and inode), so that a file named in many spellings or through
/// hard links is read once; what is read in all is bounded by
/// [`READ_BUDGET`].
#[derive(Debug, Default)]
pub struct Resolver {
    /// Every object seen.
    pub objects: Vec<ObjectFile>,
    /// The `--symbols` object: names every address no mapping covers.
    fallback: Option<u32>,
    /// The guest kernel's object (`--kernel-symbols`): names every address
    /// in the kernel half of the address space.
    kernel: Option<u32>,
    /// How far the running kernel lies from its symbols' addresses (KASLR):
    /// subtracted from every kernel address before it is named.
    kernel_slide: u64,
    sysroot: Option<Arc<Sysroot>>,
    /// Per address space: its mappings and their objects.
    spaces: HashMap<u64, Vec<(MappingLine, u32)>>,
    /// Per address space: the process its mappings last said ran in it.
    processes: HashMap<u64, Process>,
    by_path: HashMap<String, u32>,
    by_id: HashMap<FileId, u32>,
    /// Bytes of guest files read.
    pub bytes_read: u64,
    /// Guest files not found under the sysroot, or refused, and why (at
    /// most [`MAX_MISSING`]).
    pub missing: BTreeMap<String, Refusal>,
    /// Guest files not found or refused past [`MAX_MISSING`].
    pub missing_more: u64,
}

impl Resolver {
    /// A resolver naming every address from `symbols` (a path and its ELF)
    /// and reading the files of reported mappings under `sysroot`.
    pub fn new(symbols: Option<(String, &[u8])>, sysroot: Option<Arc<Sysroot>>) -> Self {
        let mut r = Resolver {
            sysroot,
            ..Resolver::default()
        };
        if let Some((path, elf)) = symbols {
            r.objects
                .push(ObjectFile::from_elf(path, Some(elf), String::new()));
            r.fallback = Some(0);
        }
        r
    }

    /// Names the guest kernel's addresses (the upper half of the address
    /// space) from `bytes`: a vmlinux ELF, or a copy of `/proc/kallsyms`.
    /// False when it is neither.
    pub fn set_kernel(&mut self, path: &str, bytes: &[u8]) -> bool {
        let object = if object::File::parse(bytes).is_ok() {
            ObjectFile::from_elf(path.to_owned(), Some(bytes), String::new())
        } else {
            let Some(symbols) = std::str::from_utf8(bytes)
                .ok()
                .and_then(Symbols::from_kallsyms)
            else {
                return false;
            };
            ObjectFile {
                path: path.to_owned(),
                symbols: Some(symbols),
                build_id: String::new(),
                segments: Vec::new(),
            }
        };
        self.objects.push(object);
        self.kernel = Some(self.objects.len() as u32 - 1);
        true
    }

    /// Takes where the running kernel's system-call entry lay (a trace's
    /// [`KernelLine`]): a kernel placed at random (KASLR) is named at its
    /// symbols' addresses from then on. False when the kernel symbols have
    /// no `entry_SYSCALL_64`, or there are none; addresses stay as run.
    ///
    /// [`KernelLine`]: crate::profile::trace::KernelLine
    pub fn kernel_entry(&mut self, syscall_entry: u64) -> bool {
        let linked = self
            .kernel
            .and_then(|k| self.objects[k as usize].symbols.as_ref())
            .and_then(|s| s.address_of(SYSCALL_ENTRY));
        match linked {
            Some(linked) => {
                self.kernel_slide = syscall_entry.wrapping_sub(linked);
                true
            }
            None => false,
        }
    }

    /// Whether `address` is the guest kernel's: the upper half of a 64-bit
    /// address space.
    pub fn is_kernel(address: u64) -> bool {
        address >= KERNEL_HALF
    }

    /// Whether `frame` lies in the guest kernel's object.
    pub fn in_kernel(&self, frame: Frame) -> bool {
        self.kernel == Some(frame.object)
    }

    /// A resolver naming every address from `symbols` alone.
    #[cfg(test)]
    pub fn with_symbols(symbols: Symbols) -> Self {
        Resolver {
            objects: vec![ObjectFile {
                path: "test".into(),
                symbols: Some(symbols),
                build_id: String::new(),
                segments: Vec::new(),
            }],
            fallback: Some(0),
            ..Resolver::default()
        }
    }

    /// Takes a mapping line: from here on, its address space's addresses in
    /// its range lie in its file.
    pub fn mapping(&mut self, m: &MappingLine) {
        let object = self.object(&m.path, &m.build_id);
        let space = self.spaces.entry(m.cr3).or_default();
        if m.first {
            space.clear();
            self.processes.remove(&m.cr3);
        }
        space.push((m.clone(), object));
        if let Some(p) = &m.process {
            self.processes.insert(m.cr3, p.clone());
        }
    }

    /// The process the guest last said ran in address space `cr3`.
    pub fn process(&self, cr3: u64) -> Option<&Process> {
        self.processes.get(&cr3)
    }

    /// The object of the guest file `path`, loaded once: every spelling
    /// of one path, and every path of one file, is the same object.
    fn object(&mut self, path: &str, build_id: &str) -> u32 {
        let key = normal(path).map_or_else(|| path.to_owned(), |parts| parts.join("/"));
        if let Some(&i) = self.by_path.get(&key) {
            return i;
        }
        let mut elf = None;
        let mut id = None;
        if let Some(root) = self.sysroot.clone() {
            let read = root.open_file(path).and_then(|file| {
                id = Some(file.id);
                if let Some(&i) = self.by_id.get(&file.id) {
                    return Ok(Some(i));
                }
                if self.bytes_read.saturating_add(file.size) > READ_BUDGET {
                    return Err(Refusal::Budget);
                }
                self.bytes_read += file.size;
                elf = Some(file.read()?);
                Ok(None)
            });
            match read {
                Ok(Some(i)) => {
                    self.by_path.insert(key, i);
                    return i;
                }
                Ok(None) => {}
                Err(why) => self.note_missing(path, why),
            }
        }
        let i = self.objects.len() as u32;
        self.objects.push(ObjectFile::from_elf(
            path.to_owned(),
            elf.as_deref(),
            build_id.to_owned(),
        ));
        self.by_path.insert(key, i);
        if let Some(id) = id {
            self.by_id.insert(id, i);
        }
        i
    }

    fn note_missing(&mut self, path: &str, why: Refusal) {
        if self.missing.len() < MAX_MISSING {
            self.missing.insert(path.to_owned(), why);
        } else {
            self.missing_more += 1;
        }
    }

    /// Whether the guest reported mappings (a trace of a Linux guest with
    /// the module), which only a sysroot names.
    pub fn has_mappings(&self) -> bool {
        !self.spaces.is_empty()
    }

    /// The frame of `address` in the address space `cr3`.
    pub fn frame(&self, cr3: u64, address: u64) -> Frame {
        if let Some(object) = self.kernel.filter(|_| Self::is_kernel(address)) {
            return Frame {
                object,
                address: address.wrapping_sub(self.kernel_slide),
            };
        }
        let mapped = self.spaces.get(&cr3).and_then(|maps| {
            maps.iter()
                .rev()
                .find(|(m, _)| (m.start..m.end).contains(&address))
        });
        // A mapped file that could not be read (no sysroot, or not in it)
        // leaves the address to the `--symbols` ELF, when one was given.
        let mapped = mapped.filter(|(_, object)| {
            self.fallback.is_none() || self.objects[*object as usize].symbols.is_some()
        });
        match (mapped, self.fallback) {
            // A file not found (or outside its segments) keeps the guest's
            // address, which is what a person can look up.
            (Some((m, object)), _) => Frame {
                object: *object,
                address: self.objects[*object as usize]
                    .address_of_offset(address - m.start + m.offset)
                    .unwrap_or(address),
            },
            (None, Some(object)) => Frame { object, address },
            (None, None) => Frame {
                object: Frame::RAW,
                address,
            },
        }
    }

    /// The symbols of `frame`'s object.
    pub fn symbols(&self, frame: Frame) -> Option<&Symbols> {
        self.objects.get(frame.object as usize)?.symbols.as_ref()
    }

    /// A name for a kernel frame no symbol covers (past the kernel's text:
    /// a module's code, which the symbols do not list): `[kernel]+OFFSET`
    /// from the kernel's first text symbol, so a reader sees whose code it
    /// is without a function's name made up for it; `None` for any other
    /// frame.
    pub fn unnamed_kernel(&self, frame: Frame) -> Option<String> {
        if !self.in_kernel(frame) {
            return None;
        }
        let base = self.symbols(frame)?.first_address()?;
        Some(format!("[kernel]+{:#x}", frame.address.wrapping_sub(base)))
    }

    /// The function `frame` is in; `ret` for a return address, looked up
    /// one byte back, in its call. Unknown: the address in hex (or
    /// [`Self::unnamed_kernel`]'s name).
    pub fn name(&self, frame: Frame, ret: bool) -> String {
        let at = if ret {
            frame.address.saturating_sub(1)
        } else {
            frame.address
        };
        let name = self
            .symbols(frame)
            .and_then(|s| s.lookup(at))
            .map(str::to_owned)
            .or_else(|| self.unnamed_kernel(frame))
            .unwrap_or_else(|| format!("{:#x}", frame.address));
        // Kernel functions marked as perf marks them in flamegraphs.
        if self.in_kernel(frame) {
            format!("{name}_[k]")
        } else {
            name
        }
    }
}

/// A 1 MiB mapping of `path` at `start` from file offset 4 KiB (the test
/// guests' layout), for tests.
#[cfg(test)]
pub(crate) fn mapping(cr3: u64, start: u64, path: &str, first: bool) -> MappingLine {
    MappingLine {
        cr3,
        start,
        end: start + 0x10_0000,
        offset: 0x1000,
        path: path.into(),
        build_id: String::new(),
        first,
        process: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbols_from_an_embedded_guest() {
        let syms = Symbols::from_elf(crate::guests::get("demo").unwrap()).unwrap();
        let main = syms.address_of("main").expect("main is a symbol");
        assert_eq!(syms.lookup(main), Some("main"));
        assert_eq!(syms.lookup(0), None);
    }

    #[test]
    fn addresses_resolve_through_the_mappings_of_their_address_space() {
        let root = std::env::temp_dir().join(format!("lwpvmm-objects-{}", std::process::id()));
        std::fs::create_dir_all(root.join("bin")).unwrap();
        let demo = crate::guests::get("demo").unwrap();
        std::fs::write(root.join("bin/demo"), demo).unwrap();
        let main = Symbols::from_elf(demo).unwrap().address_of("main").unwrap();
        let mut r = Resolver::new(None, Some(Sysroot::dir(&root).into()));
        // The demo guest mapped 1 MiB higher than it is linked (a PIE's
        // load bias): names come from its own addresses.
        r.mapping(&mapping(0xa000, 0x20_0000, "/bin/demo", true));
        r.mapping(&mapping(0xb000, 0x10_0000, "/../../etc/passwd", true));
        r.mapping(&mapping(0xb000, 0x30_0000, "/bin/gone", false));
        let named = |r: &Resolver, cr3, a| r.name(r.frame(cr3, a), false);
        // (address space, address, name)
        let table = [
            (0xa000, main + 0x10_0000, "main".to_owned()),
            (0xa000, 0x40_0000, "0x400000".to_owned()),
            (0xc000, main, format!("{main:#x}")),
            (0xb000, 0x10_0010, "0x100010".to_owned()),
        ];
        for (cr3, address, want) in table {
            assert_eq!(named(&r, cr3, address), want, "{cr3:#x} {address:#x}");
        }
        let missing: Vec<(&str, Refusal)> =
            r.missing.iter().map(|(p, w)| (p.as_str(), *w)).collect();
        assert_eq!(
            missing,
            [
                ("/../../etc/passwd", Refusal::BadPath),
                ("/bin/gone", Refusal::Missing)
            ],
            "refused or not found"
        );
        // A new report for the address space forgets the old mappings.
        r.mapping(&mapping(0xa000, 0x50_0000, "/bin/gone", true));
        assert_eq!(
            named(&r, 0xa000, main + 0x10_0000),
            format!("{:#x}", main + 0x10_0000)
        );
        std::fs::remove_dir_all(root).unwrap();

        // Without a sysroot, a mapped address is the `--symbols` ELF's.
        let mut r = Resolver::new(Some(("demo".into(), demo)), None);
        r.mapping(&mapping(0xa000, main & !0xfff, "/bin/demo", true));
        assert_eq!(named(&r, 0xa000, main), "main");
    }

    #[test]
    fn one_file_in_many_spellings_is_read_once() {
        let root = std::env::temp_dir().join(format!("lwpvmm-aliases-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("bin")).unwrap();
        let demo = crate::guests::get("demo").unwrap();
        std::fs::write(root.join("bin/tool"), demo).unwrap();
        std::fs::hard_link(root.join("bin/tool"), root.join("bin/link")).unwrap();
        let mut r = Resolver::new(None, Some(Sysroot::dir(&root).into()));
        // The spellings of the red team's 1,024-alias capture.
        for i in 0..1024u64 {
            let path = match i % 4 {
                0 => format!("/bin/{}tool", "./".repeat(i as usize % 7)),
                1 => format!("/{}bin/tool", "/".repeat(i as usize % 9)),
                2 => format!("{}/bin//tool", "/.".repeat(i as usize % 5)),
                _ => "/bin/link".to_owned(),
            };
            r.mapping(&mapping(0x1000 + i * 0x1000, 0x40_0000, &path, true));
        }
        assert_eq!(r.objects.len(), 1, "one object for every spelling and link");
        assert_eq!(r.bytes_read, demo.len() as u64, "the file was read once");
        assert!(r.missing.is_empty(), "{:?}", r.missing);
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn frame_pointer_prologues_are_recognised() {
        // (code, prologue length)
        let table: [(&[u8], Option<u64>); 5] = [
            (&[0x55, 0x48, 0x89, 0xe5, 0x90], Some(4)),
            (&[0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5], Some(8)),
            (&[0x55, 0x89, 0xe5], Some(3)),
            (&[0x48, 0x85, 0xff], None),
            (&[], None),
        ];
        for (code, want) in table {
            assert_eq!(prologue(code), want, "{code:x?}");
        }
    }

    #[test]
    fn kallsyms_names_text_symbols_and_skips_the_rest() {
        let text = "\
ffffffff81000000 T _text
ffffffff81000100 t helper
ffffffff81000200 D some_data
0000000000000000 A fixed_percpu_data
not a symbol line
ffffffff81000300 W weak_one [some_module]
";
        let s = Symbols::from_kallsyms(text).expect("symbols");
        // (address, function)
        let table = [
            (0xffff_ffff_8100_0000, Some("_text")),
            (0xffff_ffff_8100_0150, Some("helper")),
            // Data is no function: the text symbol before it runs on.
            (0xffff_ffff_8100_0250, Some("helper")),
            (0xffff_ffff_8100_0301, Some("weak_one")),
            (0xffff_ffff_80ff_ffff, None),
        ];
        for (address, want) in table {
            assert_eq!(s.lookup(address), want, "{address:#x}");
        }
        assert!(Symbols::from_kallsyms("no symbols here\n").is_none());
    }

    #[test]
    fn kernel_addresses_past_its_text_are_the_kernels_not_etexts() {
        let kallsyms =
            "ffffffff81000000 T _text\nffffffff81001000 T read_zero\nffffffff81002000 T _etext\n";
        let mut resolver = Resolver::default();
        assert!(resolver.set_kernel("kallsyms", kallsyms.as_bytes()));
        // (address, its name)
        let table = [
            (0xffff_ffff_8100_1010, "read_zero_[k]"),
            (0xffff_ffff_8100_2000, "[kernel]+0x2000_[k]"),
            (0xffff_ffff_c000_1234, "[kernel]+0x3f001234_[k]"),
        ];
        for (address, want) in table {
            let frame = resolver.frame(0x1000, address);
            assert_eq!(resolver.name(frame, false), want, "{address:#x}");
        }
        // A vmlinux's `_etext` label ends with its section, as kallsyms's.
        let vmlinux = crate::guests::get("minimal").unwrap();
        let s = Symbols::from_elf(vmlinux).unwrap();
        assert!(
            s.lookup(u64::MAX - 1).is_none(),
            "no symbol runs to the end of memory"
        );
    }

    #[test]
    fn a_randomised_kernel_is_named_at_its_symbols_addresses() {
        let kallsyms = "ffffffff81000000 T start_kernel\nffffffff81400040 T entry_SYSCALL_64\n";
        // (LSTAR as the guest set it, the sampled address, its name):
        // the sample moves with the kernel.
        let table = [
            (
                0xffff_ffff_8140_0040,
                0xffff_ffff_8100_0010,
                "start_kernel_[k]",
            ),
            (
                0xffff_ffff_9e40_0040,
                0xffff_ffff_9e00_0010,
                "start_kernel_[k]",
            ),
            (
                0xffff_ffff_9e40_0040,
                0xffff_ffff_9e40_0041,
                "entry_SYSCALL_64_[k]",
            ),
        ];
        for (lstar, address, want) in table {
            let mut r = Resolver::default();
            assert!(r.set_kernel("kallsyms", kallsyms.as_bytes()));
            assert!(r.kernel_entry(lstar));
            assert_eq!(r.name(r.frame(0x1000, address), false), want);
        }
        // Symbols without the entry leave the addresses as they ran.
        let mut r = Resolver::default();
        assert!(!r.kernel_entry(0xffff_ffff_9e40_0040), "no kernel symbols");
        assert!(r.set_kernel("kallsyms", b"ffffffff81000000 T start_kernel\n"));
        assert!(!r.kernel_entry(0xffff_ffff_9e40_0040));
        assert_eq!(
            r.name(r.frame(0, 0xffff_ffff_8100_0010), false),
            "start_kernel_[k]"
        );
    }

    #[test]
    fn an_assembly_entry_point_is_a_function() {
        // The insn guest's kernel_hook is a global label without a type in
        // code, as Linux's entry code declares its entry points; main is a
        // typed function.
        let symbols = Symbols::from_elf(crate::guests::get("insn").unwrap()).unwrap();
        for name in ["kernel_hook", "main"] {
            assert!(symbols.address_of(name).is_some(), "{name}");
        }
    }

    #[test]
    fn kernel_addresses_resolve_from_the_kernel_symbols_in_every_space() {
        let mut r = Resolver::default();
        assert!(!r.set_kernel("junk", b"\x00\x01 not symbols"));
        assert!(r.set_kernel("kallsyms", b"ffffffff81000000 T start_kernel\n"));
        r.mapping(&mapping(0x1000, 0x40_0000, "/bin/x", true));
        // (address space, address, name): the kernel half is the kernel's
        // whatever the space; the user half is not.
        let table = [
            (0x1000, 0xffff_ffff_8100_0010, "start_kernel_[k]"),
            (0x2000, 0xffff_ffff_8100_0010, "start_kernel_[k]"),
            (0x2000, 0x1234, "0x1234"),
        ];
        for (cr3, address, want) in table {
            assert_eq!(r.name(r.frame(cr3, address), false), want);
        }
    }

    #[test]
    fn a_kernel_symbol_file_must_be_a_regular_file_of_symbols() {
        let dir = std::env::temp_dir().join(format!("lwpvmm-ksyms-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        let _ = std::fs::remove_file(&fifo);
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
        )
        .unwrap();
        std::fs::write(dir.join("text"), "hello\n").unwrap();
        std::fs::write(dir.join("kallsyms"), "ffffffff81000000 T _text\n").unwrap();
        // (file, what reading it gives)
        let table: [(std::path::PathBuf, &str); 5] = [
            (dir.join("kallsyms"), "ok"),
            (dir.join("text"), "neither an ELF"),
            (fifo.clone(), "not a regular file"),
            (std::path::PathBuf::from("/dev/null"), "not a regular file"),
            (dir.join("missing"), "No such file"),
        ];
        for (path, want) in table {
            let got = match read_kernel_symbols(&path) {
                Ok(_) => "ok".to_owned(),
                Err(e) => e.to_string(),
            };
            assert!(got.contains(want), "{}: {got}", path.display());
        }
        // The sysroot's initramfs is read the same way: a FIFO is refused
        // at once, not waited on.
        assert!(matches!(
            Sysroot::open(&fifo),
            Err(crate::profile::sysroot::SysrootError::NotAnArchive(_))
        ));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
