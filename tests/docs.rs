//! The docs name the code as it is: every file path, file name, Rust type and `module::item`
//! path that docs/*.md and the README give in backticks must exist in the repository, so that
//! a file moved or a type renamed leaves no stale pointer behind (the kinds of claims a
//! reading found stale: `src/vmm/virtio` after the devices moved, `LwpState` in a file that
//! no longer held it). A placeholder (`tests/<file>.rs`, `src/...`) is not a claim. Names of
//! other crates' types and the architecture's field names are listed below with where they
//! come from.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// CamelCase names the docs give that are not lwpvmm's: other crates' types and the LWP
/// architecture's LWPCB fields (../shared/docs/lwp-architecture.md).
const NOT_OURS: &[&str] = &[
    // vm-memory
    "AtomicBitmap",
    "ByteValued",
    "GuestMemoryMmap",
    "MmapRegion",
    // virtio-queue
    "DescriptorChain",
    // portable-atomic
    "AtomicU128",
    // std
    "OpenOptions",
    // LWPCB fields
    "BufferBase",
    "BufferSize",
    // units and strings, not names
    "KiB",
    "MiB",
    "LwpV",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every file and directory of the repository (relative, with `/`), without build output,
/// git's and the fuzz corpora.
fn tree(dir: &Path, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let rel = path
            .strip_prefix(root())
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let skipped = [
            "target",
            ".git",
            "fuzz/target",
            "fuzz/corpus",
            "fuzz/artifacts",
        ];
        if path.is_dir() && !skipped.contains(&rel.as_str()) {
            tree(&path, out);
        }
        out.insert(rel);
    }
}

/// What the Rust sources define: items, struct fields (a name that opens a line, then `:`),
/// and enum variants (a capitalised name that opens a line and is followed by a field list, a
/// comma or `=`).
fn defined(files: &BTreeSet<String>) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for f in files.iter().filter(|f| f.ends_with(".rs")) {
        let text = std::fs::read_to_string(root().join(f)).unwrap();
        let words: Vec<&str> = text
            .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '!'))
            .filter(|w| !w.is_empty())
            .collect();
        for pair in words.windows(2) {
            let kinds = [
                "struct",
                "enum",
                "trait",
                "type",
                "fn",
                "const",
                "static",
                "mod",
                "union",
                "macro_rules!",
            ];
            if kinds.contains(&pair[0]) {
                names.insert(pair[1].to_owned());
            }
        }
        for line in text.lines() {
            let t = line.trim_start();
            let t = t
                .strip_prefix("pub(crate) ")
                .or_else(|| t.strip_prefix("pub "))
                .unwrap_or(t);
            let field: String = t
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if !field.is_empty() && t[field.len()..].starts_with(": ") {
                names.insert(field);
            }
            let name: String = t.chars().take_while(|c| c.is_alphanumeric()).collect();
            let rest = &t[name.len()..];
            if name.starts_with(|c: char| c.is_ascii_uppercase())
                && (rest.starts_with(['(', '{', ','])
                    || rest.starts_with(" {")
                    || rest.starts_with(" ="))
            {
                names.insert(name);
            }
        }
    }
    names
}

/// The backticked spans of a Markdown text.
fn spans(text: &str) -> Vec<&str> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| !s.contains('\n'))
        .collect()
}

/// A CamelCase word: an upper-case letter, lower-case ones, then at least one more capital.
fn camel_words(span: &str) -> Vec<&str> {
    span.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .flat_map(|w| w.rsplit("::").next())
        .filter(|w| {
            let mut chars = w.chars();
            chars.next().is_some_and(|c| c.is_ascii_uppercase())
                && w.chars().all(|c| c.is_ascii_alphanumeric())
                && w.chars().nth(1).is_some_and(|c| c.is_ascii_lowercase())
                && w.chars().skip(1).any(|c| c.is_ascii_uppercase())
        })
        .collect()
}

/// The repository path a span names, when it names one: a path with one of the repository's
/// source extensions or under a top folder, or a Rust file's name; `::item`, `:LINE` and a
/// folder's `/` cut off. (Other bare file names are often Linux's or history's.)
fn named_path(span: &str) -> Option<&str> {
    let head = span.split([' ', ',']).next()?;
    let head = head.split("::").next()?;
    let head = head.split(':').next()?;
    if head.contains("...") || head.contains('<') || head.starts_with(['/', '.', '~', '$']) {
        return None;
    }
    let tops = ["src/", "tests/", "benches/", "fuzz/", "resources/", "docs/"];
    let exts = [
        ".rs", ".S", ".c", ".h", ".sh", ".md", ".config", ".patch", ".ld", ".toml",
    ];
    let plain = head
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "_-./+".contains(c));
    let head = head.trim_end_matches('/');
    let named = if head.contains('/') {
        tops.iter()
            .any(|t| head.starts_with(t.trim_end_matches('/')))
            || exts.iter().any(|e| head.ends_with(e))
    } else {
        head.ends_with(".rs")
    };
    (plain && named).then_some(head)
}

/// What a span's `module::item` paths of lwpvmm's own modules name that is not defined.
fn missing_items<'a>(
    span: &'a str,
    modules: &BTreeSet<String>,
    names: &BTreeSet<String>,
) -> Vec<&'a str> {
    span.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| w.contains("::") && !w.ends_with(':'))
        .filter(|w| {
            let first = w.split("::").next().unwrap_or("");
            modules.contains(first) || ["crate", "lwpvmm"].contains(&first)
        })
        .filter(|w| {
            let last = w.rsplit("::").next().unwrap_or("");
            !names.contains(last) && !modules.contains(last)
        })
        .collect()
}

#[test]
fn the_docs_name_files_types_and_items_that_exist() {
    let mut files = BTreeSet::new();
    tree(&root(), &mut files);
    let names = defined(&files);
    assert!(names.len() > 1000, "only {} names defined", names.len());
    let modules: BTreeSet<String> = files
        .iter()
        .filter(|f| f.starts_with("src/"))
        .filter_map(|f| {
            Path::new(f)
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
        })
        .filter(|m| m != "mod")
        .collect();
    let mut docs: Vec<String> = files
        .iter()
        .filter(|f| f.starts_with("docs/") && f.ends_with(".md"))
        .cloned()
        .collect();
    docs.push("README.md".into());
    let mut stale = Vec::new();
    for doc in &docs {
        let text = std::fs::read_to_string(root().join(doc)).unwrap();
        for span in spans(&text) {
            if let Some(path) = named_path(span) {
                let found = files
                    .iter()
                    .any(|f| f == path || f.ends_with(&format!("/{path}")));
                if !found {
                    stale.push(format!("{doc}: `{span}`: no such file"));
                }
            }
            for word in camel_words(span) {
                if !names.contains(word) && !NOT_OURS.contains(&word) {
                    stale.push(format!("{doc}: `{span}`: `{word}` is defined nowhere"));
                }
            }
            for item in missing_items(span, &modules, &names) {
                stale.push(format!("{doc}: `{span}`: `{item}` is defined nowhere"));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "stale names in the docs:\n{}",
        stale.join("\n")
    );
}

#[test]
fn the_checker_reads_paths_types_and_items_as_written() {
    // (span, the path it names, its CamelCase words)
    let table: [(&str, Option<&str>, &[&str]); 9] = [
        ("src/vmm/machine.rs", Some("src/vmm/machine.rs"), &[]),
        ("vcpu/step_probe.rs", Some("vcpu/step_probe.rs"), &[]),
        ("tests/native.rs::user_mode", Some("tests/native.rs"), &[]),
        ("tests/<file>.rs::<name>", None, &[]),
        ("control::ControlThread", None, &["ControlThread"]),
        (
            "machine::Origin::{Boot, Restore(VmConfig)}",
            None,
            &["VmConfig"],
        ),
        ("lwpvmm run --kernel PATH", None, &[]),
        ("src/guard/", Some("src/guard"), &[]),
        ("0004-old.patch", None, &[]),
    ];
    for (span, path, words) in table {
        assert_eq!(named_path(span), path, "{span}");
        assert_eq!(camel_words(span), words, "{span}");
    }
    let modules: BTreeSet<String> = ["native".to_owned()].into();
    let names: BTreeSet<String> = ["WATCH_PERIOD".to_owned()].into();
    assert_eq!(
        missing_items("native::WATCH_PERIOD and native::GONE", &modules, &names),
        ["native::GONE"]
    );
}
