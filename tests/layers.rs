//! The crate's imports run one way, and this test holds them to it (docs/design.md draws the
//! parts). It parses every file under src/ with syn and collects what each one names of the
//! crate: its `use` trees and every `crate::`, `super::` or `self::` path, in code, in tests and
//! in macro arguments. Then:
//! - no two files of any folder of src import each other, directly or around a loop, and no
//!   file holds more than 700 code lines;
//! - each of the crate's top modules imports only those below it (`log_sink` <- `lwp` <- `guard`
//!   <- `guests` <- `hostfs` <- `profile` <- `vmm` <- `firecracker` <- `cli`), and each part of src/vmm only the parts below it (`base` <-
//!   `devices` <- `vcpu` <- `boot` <- `snapshot` <- `api` <- the `Vmm` on top);
//! - the front ends (`cli`, `firecracker`) reach the VMM only through its front door:
//!   `vmm::config`, the API's entry (`vmm::api`, its `frontend` and `http`), and what the `vmm`
//!   root re-exports.
//!
//! The checker itself is tested on made-up files, so that a loop or an upward import it missed
//! would fail here too.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// A module path from the crate root, e.g. `["vmm", "vcpu", "exit"]`.
type ModPath = Vec<String>;

/// The crate's top modules, lowest first: each may import only those before it.
const CRATE_PARTS: [&str; 9] = [
    "log_sink",
    "lwp",
    "guard",
    "guests",
    "hostfs",
    "profile",
    "vmm",
    "firecracker",
    "cli",
];

/// src/vmm's parts, lowest first; a file directly in src/vmm belongs to the top part (the
/// `Vmm`, its builder and control thread), above them all.
const VMM_PARTS: [&str; 6] = ["base", "devices", "vcpu", "boot", "snapshot", "api"];

/// What one file imports: the module paths it names (made absolute), each with how it was
/// written.
struct FileImports {
    module: ModPath,
    named: Vec<(ModPath, String)>,
}

/// Collects the crate paths a file names.
struct Collector<'a> {
    /// The module whose code is being visited: the file's, or an inline module's inside it.
    module: ModPath,
    files: &'a BTreeSet<ModPath>,
    named: Vec<(ModPath, String)>,
}

impl Collector<'_> {
    /// Records `segments` as written in the current module.
    fn name(&mut self, segments: &[String], in_use: bool) {
        let Some(first) = segments.first() else {
            return;
        };
        let mut base = match first.as_str() {
            "crate" => Vec::new(),
            "self" => self.module.clone(),
            "super" => {
                let mut m = self.module.clone();
                let mut rest = segments;
                while rest.first().is_some_and(|s| s == "super") {
                    m.pop();
                    rest = &rest[1..];
                }
                m.extend(rest.iter().cloned());
                self.named.push((m, segments.join("::")));
                return;
            }
            // A `use` of a child module by its bare name (2018 paths).
            child
                if in_use && {
                    let mut m = self.module.clone();
                    m.push(child.to_string());
                    self.files.contains(&m)
                } =>
            {
                let mut m = self.module.clone();
                m.extend(segments.iter().cloned());
                self.named.push((m, segments.join("::")));
                return;
            }
            _ => return,
        };
        base.extend(segments[1..].iter().cloned());
        self.named.push((base, segments.join("::")));
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut full = prefix.clone();
                if n.ident != "self" {
                    full.push(n.ident.to_string());
                }
                self.name(&full, true);
            }
            syn::UseTree::Rename(r) => {
                let mut full = prefix.clone();
                full.push(r.ident.to_string());
                self.name(&full, true);
            }
            syn::UseTree::Glob(_) => {
                let full = prefix.clone();
                self.name(&full, true);
            }
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }

    /// Paths inside a macro's arguments (`guest_warn!`, `format!`), which syn leaves as
    /// tokens: every run of `ident :: ident ...` that starts with `crate`, `super` or `self`.
    fn tokens(&mut self, tokens: proc_macro2::TokenStream) {
        let mut run: Vec<String> = Vec::new();
        let mut colons = 0;
        let flush = |run: &mut Vec<String>, me: &mut Self| {
            if run.len() > 1 {
                me.name(run, false);
            }
            run.clear();
        };
        for t in tokens {
            match t {
                proc_macro2::TokenTree::Ident(i) => {
                    if run.is_empty() || colons == 2 {
                        run.push(i.to_string());
                    } else {
                        flush(&mut run, self);
                        run.push(i.to_string());
                    }
                    colons = 0;
                }
                proc_macro2::TokenTree::Punct(p) if p.as_char() == ':' => colons += 1,
                proc_macro2::TokenTree::Group(g) => {
                    flush(&mut run, self);
                    self.tokens(g.stream());
                    colons = 0;
                }
                _ => {
                    flush(&mut run, self);
                    colons = 0;
                }
            }
        }
        flush(&mut run, self);
    }
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &u.tree);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        self.name(&segments, false);
        syn::visit::visit_path(self, p);
    }

    /// `pub(super)` names who may see an item, not what it imports.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.tokens(m.tokens.clone());
        syn::visit::visit_macro(self, m);
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if m.content.is_some() {
            self.module.push(m.ident.to_string());
            syn::visit::visit_item_mod(self, m);
            self.module.pop();
        }
    }
}

/// The module a file under `src` holds.
fn module_of(src: &Path, file: &Path) -> ModPath {
    let rel = file.strip_prefix(src).expect("a file under src");
    let mut parts: Vec<String> = rel
        .with_extension("")
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|l| l == "mod" || l == "lib") {
        parts.pop();
    }
    parts
}

/// The file a named module path lands in: the longest prefix that is a file's module.
fn file_of(files: &BTreeSet<ModPath>, path: &[String]) -> Option<ModPath> {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|p| files.contains(p))
}

/// What each file imports, from `(module, source)` pairs.
fn imports(sources: &[(ModPath, String)]) -> Vec<FileImports> {
    let files: BTreeSet<ModPath> = sources.iter().map(|(m, _)| m.clone()).collect();
    sources
        .iter()
        .map(|(module, text)| {
            let ast = syn::parse_file(text)
                .unwrap_or_else(|e| panic!("{} does not parse: {e}", module.join("::")));
            let mut c = Collector {
                module: module.clone(),
                files: &files,
                named: Vec::new(),
            };
            c.visit_file(&ast);
            FileImports {
                module: module.clone(),
                named: c.named,
            }
        })
        .collect()
}

/// The file-to-file edges, each with the first path that makes it.
fn edges(imports: &[FileImports]) -> BTreeMap<(ModPath, ModPath), String> {
    let files: BTreeSet<ModPath> = imports.iter().map(|f| f.module.clone()).collect();
    let mut out = BTreeMap::new();
    for f in imports {
        for (path, written) in &f.named {
            if let Some(to) = file_of(&files, path)
                && to != f.module
                && !to.is_empty()
            {
                out.entry((f.module.clone(), to))
                    .or_insert_with(|| written.clone());
            }
        }
    }
    out
}

/// A loop among the files under `within`, as the files around it, if there is one.
fn find_loop(edges: &BTreeMap<(ModPath, ModPath), String>, within: &[&str]) -> Option<Vec<String>> {
    let inside = |m: &ModPath| m.len() >= within.len() && m[..within.len()] == *within;
    let mut next: BTreeMap<&ModPath, Vec<&ModPath>> = BTreeMap::new();
    for (a, b) in edges.keys() {
        if inside(a) && inside(b) {
            next.entry(a).or_default().push(b);
        }
    }
    // Depth-first search; 1 = on the current path, 2 = done.
    fn visit<'a>(
        m: &'a ModPath,
        next: &BTreeMap<&'a ModPath, Vec<&'a ModPath>>,
        state: &mut BTreeMap<&'a ModPath, u8>,
        path: &mut Vec<&'a ModPath>,
    ) -> Option<Vec<String>> {
        state.insert(m, 1);
        path.push(m);
        for &n in next.get(m).map(Vec::as_slice).unwrap_or_default() {
            match state.get(n) {
                Some(1) => {
                    let start = path.iter().position(|p| *p == n).unwrap_or(0);
                    let mut cycle: Vec<String> =
                        path[start..].iter().map(|p| p.join("/")).collect();
                    cycle.push(n.join("/"));
                    return Some(cycle);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(n, next, state, path) {
                        return Some(c);
                    }
                }
            }
        }
        path.pop();
        state.insert(m, 2);
        None
    }
    let mut state = BTreeMap::new();
    let starts: Vec<&ModPath> = next.keys().copied().collect();
    for m in starts {
        if !state.contains_key(m)
            && let Some(c) = visit(m, &next, &mut state, &mut Vec::new())
        {
            return Some(c);
        }
    }
    None
}

/// A module's rank among `parts` below `within` (files directly in `within` rank above all
/// parts); `None` outside `within`.
fn rank(m: &ModPath, within: &[&str], parts: &[&str]) -> Option<usize> {
    if m.len() < within.len() || m[..within.len()] != *within {
        return None;
    }
    let top = parts.len();
    Some(match m.get(within.len()) {
        Some(p) => parts.iter().position(|q| q == p).unwrap_or(top),
        None => top,
    })
}

/// Every import from a part to one above it, said in a line each.
fn upward(
    edges: &BTreeMap<(ModPath, ModPath), String>,
    within: &[&str],
    parts: &[&str],
) -> Vec<String> {
    edges
        .iter()
        .filter_map(|((a, b), written)| {
            let (ra, rb) = (rank(a, within, parts)?, rank(b, within, parts)?);
            (rb > ra).then(|| format!("{} imports {written}, a part above it", a.join("/")))
        })
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a readable directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn the_crate() -> Vec<FileImports> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let sources: Vec<(ModPath, String)> = files
        .iter()
        .filter(|f| !f.ends_with("main.rs"))
        .map(|f| {
            let text = std::fs::read_to_string(f).expect("a readable source file");
            (module_of(&src, f), text)
        })
        .collect();
    imports(&sources)
}

#[test]
fn no_two_files_of_the_shell_import_each_other_around_a_loop() {
    let crate_imports = the_crate();
    assert!(
        crate_imports.len() > 80,
        "only {} files found under src/",
        crate_imports.len()
    );
    let edges = edges(&crate_imports);
    // Every folder of src, and the crate as a whole.
    let mut folders: BTreeSet<ModPath> = crate_imports
        .iter()
        .flat_map(|f| (0..f.module.len()).map(|n| f.module[..n].to_vec()))
        .collect();
    folders.insert(Vec::new());
    assert!(folders.len() > 10, "only {} folders found", folders.len());
    let loops: Vec<String> = folders
        .iter()
        .filter_map(|folder| {
            let within: Vec<&str> = folder.iter().map(String::as_str).collect();
            let found = find_loop(&edges, &within)?;
            Some(format!("src/{}: {}", folder.join("/"), found.join(" -> ")))
        })
        .collect();
    assert!(loops.is_empty(), "loops:\n{}", loops.join("\n"));
}

/// Code lines in a file: neither blank nor only a comment.
fn code_lines(text: &str) -> usize {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("//"))
        .count()
}

#[test]
fn no_source_file_holds_more_than_700_code_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let long: Vec<String> = files
        .iter()
        .map(|f| (f, code_lines(&std::fs::read_to_string(f).unwrap())))
        .filter(|(_, n)| *n > 700)
        .map(|(f, n)| format!("{} has {n} code lines", f.display()))
        .collect();
    assert!(long.is_empty(), "split these files:\n{}", long.join("\n"));
    assert_eq!(code_lines("// a\n\n  let x = 1; // b\n    //! c\n}\n"), 2);
}

#[test]
fn each_part_imports_only_the_parts_below_it() {
    let edges = edges(&the_crate());
    assert!(
        edges.len() > 200,
        "only {} imports between files found",
        edges.len()
    );
    let mut wrong = upward(&edges, &[], &CRATE_PARTS);
    wrong.extend(upward(&edges, &["vmm"], &VMM_PARTS));
    assert!(
        wrong.is_empty(),
        "imports that point up:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_checker_finds_loops_and_upward_imports() {
    let m = |s: &str| -> ModPath { s.split('/').map(String::from).collect() };
    // (files, a loop in src/vmm, upward imports in src/vmm)
    type Case = (Vec<(&'static str, &'static str)>, bool, usize);
    let table: Vec<Case> = vec![
        (
            vec![
                ("vmm/base/a", "use crate::vmm::base::b::X;"),
                ("vmm/base/b", "pub struct X;"),
            ],
            false,
            0,
        ),
        (
            vec![
                ("vmm/base/a", "use super::b::X; pub struct Y;"),
                (
                    "vmm/base/b",
                    "pub struct X; fn f() { let _ = crate::vmm::base::a::Y; }",
                ),
            ],
            true,
            0,
        ),
        (
            vec![
                ("vmm/vcpu", "mod x; pub use x::X;"),
                ("vmm/vcpu/x", "pub struct X;"),
                (
                    "vmm/vcpu/y",
                    "#[cfg(test)] mod tests { use crate::vmm::vcpu::X; }",
                ),
                (
                    "vmm/vcpu/z",
                    "fn f() { log::warn!(\"{}\", crate::vmm::vcpu::y::F); }",
                ),
                ("vmm/vcpu/y2", "use super::z;"),
            ],
            false,
            0,
        ),
        (
            vec![
                ("vmm/devices/bus", "use crate::vmm::vcpu::Exit;"),
                ("vmm/vcpu", "pub struct Exit;"),
                ("vmm/machine", "use crate::vmm::vcpu::Exit;"),
            ],
            false,
            1,
        ),
        (
            vec![
                (
                    "vmm/vcpu/a",
                    "pub(super) struct A; pub(in crate::vmm) struct B;",
                ),
                ("vmm/vcpu", "mod a;"),
            ],
            false,
            0,
        ),
        (
            vec![
                ("vmm/base/request", "fn f(_: crate::vmm::Vmm) {}"),
                ("vmm", "pub struct Vmm; use base::request;"),
                ("vmm/base", "pub mod request;"),
            ],
            true,
            1,
        ),
    ];
    for (i, (files, has_loop, ups)) in table.into_iter().enumerate() {
        let sources: Vec<(ModPath, String)> =
            files.iter().map(|(p, t)| (m(p), t.to_string())).collect();
        let edges = edges(&imports(&sources));
        assert_eq!(
            find_loop(&edges, &["vmm"]).is_some(),
            has_loop,
            "case {i}: {edges:?}"
        );
        assert_eq!(
            upward(&edges, &["vmm"], &VMM_PARTS).len(),
            ups,
            "case {i}: {edges:?}"
        );
    }
}

/// Whether `path` (a named crate path) is the VMM's front door for a front end: `vmm::config`
/// (every type and limit a front end hands the VMM), the API's entry (`vmm::api` itself, and its
/// `frontend` and `http` that a front end plugs into), or an item the `vmm` root re-exports
/// (`Vmm`, `VmmHandle`, the run functions), not one of `vmm`'s parts.
fn through_the_front_door(path: &ModPath, modules: &BTreeSet<ModPath>) -> bool {
    let is_module = |n: usize| modules.contains(&path[..n].to_vec());
    match path.get(1).map(String::as_str) {
        None => true,
        Some("config") => true,
        Some("api") => match path.get(2).map(String::as_str) {
            None => true,
            Some("frontend" | "http") => !is_module(4),
            Some(_) => !is_module(3),
        },
        Some(_) => !is_module(2),
    }
}

#[test]
fn front_ends_enter_the_vmm_through_its_front_door() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeSet<ModPath> = files.iter().map(|f| module_of(&src, f)).collect();
    let mut wrong = Vec::new();
    for file in the_crate() {
        if !matches!(
            file.module.first().map(String::as_str),
            Some("cli" | "firecracker")
        ) {
            continue;
        }
        for (path, written) in &file.named {
            if path.first().map(String::as_str) == Some("vmm")
                && !through_the_front_door(path, &modules)
            {
                wrong.push(format!("{} imports {written}", file.module.join("/")));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "front ends reaching past vmm::config, the API's entry and the vmm root:\n{}",
        wrong.join("\n")
    );
    // The rule itself, on made-up paths.
    let m = |s: &str| -> ModPath { s.split('/').map(String::from).collect() };
    let known: BTreeSet<ModPath> = [
        "vmm",
        "vmm/boot",
        "vmm/api",
        "vmm/api/http",
        "vmm/api/routes",
    ]
    .into_iter()
    .map(m)
    .collect();
    // (path, through the front door)
    let table = [
        ("vmm/config/DiskConfig", true),
        ("vmm/Vmm", true),
        ("vmm/api/ApiConfig", true),
        ("vmm/api/http/Request", true),
        ("vmm/boot/read_image", false),
        ("vmm/api/routes/MAX_SAMPLE_HZ", false),
    ];
    for (path, ok) in table {
        assert_eq!(through_the_front_door(&m(path), &known), ok, "{path}");
    }
}
