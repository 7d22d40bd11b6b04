//! Every open of a path goes through `src/hostfs` (its header says the rules: regular files
//! only, bounded reads, nothing followed out of a directory, outputs created fresh). This test
//! parses every other file under src/ with syn and fails on any call or import that opens or
//! creates a path by itself: `File::open`, `File::create`, `OpenOptions`, `std::fs::read` and its
//! kin, `read_dir`, `create_dir*`, and the raw `open`/`openat` of libc, rustix and nix. Test
//! code (`#[cfg(test)]` modules and files, `#[test]` functions) may make its own fixtures.
//!
//! The checker is tested on made-up files, so that an open it missed would fail here too.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// Paths that open or create a file or directory by name, as runs of segments.
const OPENERS: &[&[&str]] = &[
    &["File", "open"],
    &["File", "create"],
    &["File", "create_new"],
    &["File", "options"],
    &["OpenOptions"],
    &["fs", "read"],
    &["fs", "read_to_string"],
    &["fs", "write"],
    &["fs", "copy"],
    &["fs", "read_dir"],
    &["fs", "create_dir"],
    &["fs", "create_dir_all"],
    &["fs", "open"],
    &["fs", "openat"],
    &["fs", "openat2"],
    &["libc", "open"],
    &["libc", "open64"],
    &["libc", "openat"],
    &["libc", "creat"],
    &["fcntl", "open"],
    &["fcntl", "openat"],
];

/// The folder allowed to open paths.
const HOSTFS: &str = "hostfs";

/// Whether a path holds one of [`OPENERS`] as consecutive segments.
fn is_opener(segments: &[String]) -> bool {
    OPENERS.iter().any(|opener| {
        segments
            .windows(opener.len())
            .any(|w| w.iter().zip(opener.iter()).all(|(a, b)| a == b))
    })
}

fn has_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        (a.path().is_ident("cfg") || a.path().is_ident("test"))
            && (a.path().is_ident("test")
                || a.parse_args::<syn::Meta>()
                    .is_ok_and(|m| m.path().is_ident("test")))
    })
}

/// Collects the openers a file names outside test code, and its test-only child modules.
#[derive(Default)]
struct Finder {
    found: Vec<String>,
    test_children: Vec<String>,
    prefix: Vec<String>,
}

impl Finder {
    fn check(&mut self, segments: Vec<String>) {
        if is_opener(&segments) {
            self.found.push(segments.join("::"));
        }
    }

    fn use_tree(&mut self, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                self.prefix.push(p.ident.to_string());
                self.use_tree(&p.tree);
                self.prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut s = self.prefix.clone();
                s.push(n.ident.to_string());
                self.check(s);
            }
            syn::UseTree::Rename(r) => {
                let mut s = self.prefix.clone();
                s.push(r.ident.to_string());
                self.check(s);
            }
            syn::UseTree::Glob(_) => {}
            syn::UseTree::Group(g) => g.items.iter().for_each(|t| self.use_tree(t)),
        }
    }
}

impl<'ast> Visit<'ast> for Finder {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if has_cfg_test(&m.attrs) {
            if m.content.is_none() {
                self.test_children
                    .push(path_attr(&m.attrs).unwrap_or_else(|| m.ident.to_string()));
            }
            return;
        }
        syn::visit::visit_item_mod(self, m);
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !has_cfg_test(&f.attrs) {
            syn::visit::visit_item_fn(self, f);
        }
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        if !has_cfg_test(&i.attrs) {
            syn::visit::visit_item_impl(self, i);
        }
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !has_cfg_test(&f.attrs) {
            syn::visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        if !has_cfg_test(&u.attrs) {
            self.use_tree(&u.tree);
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        self.check(p.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, p);
    }
}

/// The file a `#[path = "..."]` attribute names.
fn path_attr(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|a| match &a.meta {
        syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

fn scan(source: &str) -> Finder {
    let file = syn::parse_file(source).expect("a file syn parses");
    let mut finder = Finder::default();
    finder.visit_file(&file);
    finder
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The files a test-only `mod name;` in `file` may stand for (or the file
/// its `#[path]` names, beside `file`).
fn child_files(file: &Path, name: &str) -> [PathBuf; 2] {
    if name.ends_with(".rs") {
        let beside = file.parent().unwrap().join(name);
        return [beside.clone(), beside];
    }
    let stem = file.file_stem().unwrap();
    let dir = if stem == "mod" || stem == "lib" {
        file.parent().unwrap().to_owned()
    } else {
        file.with_extension("")
    };
    [
        dir.join(format!("{name}.rs")),
        dir.join(name).join("mod.rs"),
    ]
}

#[test]
fn only_hostfs_opens_paths() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut test_only = BTreeSet::new();
    let mut offences = Vec::new();
    let scanned: Vec<(PathBuf, Finder)> = files
        .iter()
        .map(|f| (f.clone(), scan(&std::fs::read_to_string(f).unwrap())))
        .collect();
    for (file, finder) in &scanned {
        for child in &finder.test_children {
            test_only.extend(child_files(file, child));
        }
    }
    for (file, finder) in scanned {
        let rel = file.strip_prefix(&src).unwrap();
        if rel.starts_with(HOSTFS) || test_only.contains(&file) {
            continue;
        }
        offences.extend(
            finder
                .found
                .into_iter()
                .map(|f| format!("{}: {f}", rel.display())),
        );
    }
    assert!(
        offences.is_empty(),
        "these open paths outside src/hostfs (use its functions, which check what a name points at):\n{}",
        offences.join("\n")
    );
    assert!(files.len() > 100, "src has {} files", files.len());
}

#[test]
fn the_checker_finds_each_kind_of_open_and_spares_test_code() {
    // (source, what it must find)
    let table: [(&str, &[&str]); 8] = [
        (
            "fn f() { let _ = std::fs::read(\"x\"); }",
            &["std::fs::read"],
        ),
        ("fn f() { let _ = File::create(\"x\"); }", &["File::create"]),
        (
            "use std::fs::OpenOptions; fn f() { OpenOptions::new(); }",
            &["std::fs::OpenOptions", "OpenOptions::new"],
        ),
        (
            "use std::fs::{read_dir, write};",
            &["std::fs::read_dir", "std::fs::write"],
        ),
        (
            "fn f() { rustix::fs::openat(CWD, \"x\", F, M); }",
            &["rustix::fs::openat"],
        ),
        ("fn f() { unsafe { libc::open(p, 0) }; }", &["libc::open"]),
        (
            "#[cfg(test)] mod tests { fn g() { std::fs::write(\"x\", b\"\").unwrap(); } }",
            &[],
        ),
        (
            "fn f() { crate::hostfs::read_input(p, 1, \"l\"); } #[test] fn t() { File::open(\"x\"); }",
            &[],
        ),
    ];
    for (source, want) in table {
        assert_eq!(scan(source).found, want, "{source}");
    }
    assert_eq!(
        scan("#[cfg(test)] mod tests; mod real; #[cfg(test)] #[path = \"t.rs\"] mod more;")
            .test_children,
        ["tests", "t.rs"]
    );
}
