//! The README's shell commands, run as a reader runs them, so that one that
//! goes stale fails here. Every ```sh block carries a marker on the line
//! before it: `<!-- runnable -->` blocks run, in the order they appear,
//! each in a shell of its own (`sh -e`, so every command must succeed);
//! `<!-- not runnable: REASON -->` blocks do not, and the reason is there
//! for the reader too (root rights, a host's network, minutes of a stock
//! kernel's boot). A ```text block marked `<!-- output -->` holds lines the
//! runnable block before it prints, in that order, as the README quotes
//! them: other lines may come between them (the kernel's own messages),
//! and a line ending in `...` stands for the lines that start with what
//! comes before it (a boot ID, a version); `...` alone, for lines left out.
//!
//! The blocks run in a directory laid out as the reader's clone is for
//! them: `resources/linux` is the repository's, `resources/examples` a
//! copy (the example's build writes there), and `out/linux` the tests'
//! Linux guest (`common::linux()`, built once for every test), so that
//! `resources/linux/build.sh out/linux` finds it built. `lwpvmm` on PATH is
//! the binary this test was built with, and so is `cargo run --release --`
//! (a shell function): building the release profile inside the suite would
//! build lwpvmm a second time, and cargo's own command is not what goes
//! stale.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{RUN_LIMIT, linux, output_within, require_kvm};

/// What the line before a block says of it.
#[derive(Debug, Clone, PartialEq)]
enum Marker {
    /// `<!-- runnable -->`.
    Runnable,
    /// `<!-- not runnable: REASON -->`.
    NotRunnable(String),
    /// `<!-- output -->`.
    Output,
    /// No marker.
    None,
}

/// A fenced block of the README.
#[derive(Debug)]
struct Block {
    /// The line of its opening fence (1-based).
    line: usize,
    /// Its language, as the fence names it (`sh`, `text`, or empty).
    lang: String,
    marker: Marker,
    text: String,
}

/// The marker `line` is, if it is one.
fn marker(line: &str) -> Marker {
    let Some(inner) = line
        .trim()
        .strip_prefix("<!--")
        .and_then(|l| l.strip_suffix("-->"))
    else {
        return Marker::None;
    };
    let inner = inner.trim();
    if inner == "runnable" {
        Marker::Runnable
    } else if inner == "output" {
        Marker::Output
    } else if let Some(reason) = inner.strip_prefix("not runnable:") {
        Marker::NotRunnable(reason.trim().to_owned())
    } else {
        Marker::None
    }
}

/// The fenced blocks of `readme`, each with the marker of the nearest
/// non-blank line before it.
fn blocks(readme: &str) -> Vec<Block> {
    let mut found = Vec::new();
    let mut lines = readme.lines().enumerate();
    let mut before = Marker::None;
    while let Some((n, line)) = lines.next() {
        let Some(lang) = line.strip_prefix("```") else {
            if !line.trim().is_empty() {
                before = marker(line);
            }
            continue;
        };
        let text: Vec<&str> = lines
            .by_ref()
            .map(|(_, l)| l)
            .take_while(|l| !l.starts_with("```"))
            .collect();
        found.push(Block {
            line: n + 1,
            lang: lang.trim().to_owned(),
            marker: std::mem::replace(&mut before, Marker::None),
            text: text.join("\n"),
        });
    }
    found
}

fn readme() -> Vec<Block> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    blocks(&std::fs::read_to_string(path).unwrap())
}

/// Each marker the parser knows, and blocks found with theirs.
#[test]
fn markers_are_read_as_written() {
    // (line, marker)
    let table = [
        ("<!-- runnable -->", Marker::Runnable),
        ("  <!--runnable-->", Marker::Runnable),
        (
            "<!-- not runnable: needs root -->",
            Marker::NotRunnable("needs root".into()),
        ),
        ("<!-- output -->", Marker::Output),
        ("<!-- runnable, maybe -->", Marker::None),
        ("text", Marker::None),
    ];
    for (line, want) in table {
        assert_eq!(marker(line), want, "{line}");
    }
    let found = blocks("a\n<!-- runnable -->\n\n```sh\nls\n```\n```text\nx\ny\n```\n");
    assert_eq!(found.len(), 2);
    assert_eq!(
        (found[0].line, found[0].lang.as_str(), &found[0].marker),
        (4, "sh", &Marker::Runnable)
    );
    assert_eq!(found[0].text, "ls");
    assert_eq!(
        (found[1].marker.clone(), found[1].text.as_str()),
        (Marker::None, "x\ny")
    );
}

/// Every shell block says whether the test runs it, and why not when it
/// does not; every quoted output follows a block that runs.
#[test]
fn every_shell_block_says_whether_it_runs() {
    let blocks = readme();
    let mut runnable = 0;
    for (i, b) in blocks.iter().enumerate() {
        match (&b.marker, b.lang.as_str()) {
            (Marker::Runnable, "sh") => runnable += 1,
            (Marker::NotRunnable(reason), "sh") => assert!(
                !reason.is_empty(),
                "README.md:{}: give the reason it does not run",
                b.line
            ),
            (Marker::Output, "text") => assert!(
                i > 0 && blocks[i - 1].marker == Marker::Runnable,
                "README.md:{}: an `<!-- output -->` block follows the runnable block that prints it",
                b.line
            ),
            (_, "sh") => panic!(
                "README.md:{}: mark the shell block `<!-- runnable -->` (tests/readme.rs runs it) or `<!-- not runnable: REASON -->`",
                b.line
            ),
            (Marker::None, _) => {}
            (m, lang) => panic!(
                "README.md:{}: {m:?} does not go with a ```{lang} block",
                b.line
            ),
        }
    }
    assert!(runnable >= 4, "{runnable} runnable blocks");
}

/// Runs `script` with `sh -e` in `dir`, `lwpvmm` first on PATH.
fn run(script: &str, dir: &Path) -> std::process::Output {
    let bin = Path::new(env!("CARGO_BIN_EXE_lwpvmm")).parent().unwrap();
    let path = std::env::join_paths(std::iter::once(bin.to_owned()).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .unwrap();
    // `cargo run --release -- ARGS` is the lwpvmm on PATH; any other cargo
    // command fails, so that a new one is noticed here.
    let prelude = r#"cargo() {
    if [ "$1" = run ] && [ "$2" = --release ] && [ "$3" = -- ]; then
        shift 3
        lwpvmm "$@"
    else
        echo "tests/readme.rs runs only \`cargo run --release --\`, not: cargo $*" >&2
        return 1
    fi
}
"#;
    output_within(
        Command::new("sh")
            .arg("-ec")
            .arg(format!("{prelude}{script}"))
            .current_dir(dir)
            .env("PATH", path),
        RUN_LIMIT,
    )
}

/// The directory the blocks run in (the module's doc says what it holds).
fn workdir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("readme");
    let _ = std::fs::remove_dir_all(&dir);
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::create_dir_all(dir.join("resources/examples")).unwrap();
    std::fs::create_dir_all(dir.join("out")).unwrap();
    std::os::unix::fs::symlink(repo.join("resources/linux"), dir.join("resources/linux")).unwrap();
    for entry in std::fs::read_dir(repo.join("resources/examples")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(
            entry.path(),
            dir.join("resources/examples").join(entry.file_name()),
        )
        .unwrap();
    }
    std::os::unix::fs::symlink(linux(), dir.join("out/linux")).unwrap();
    dir
}

/// Each runnable block succeeds, and prints the output the README quotes
/// after it.
#[test]
fn the_runnable_blocks_run() {
    require_kvm();
    let blocks = readme();
    let dir = workdir();
    for (i, b) in blocks.iter().enumerate() {
        if b.marker != Marker::Runnable {
            continue;
        }
        let out = run(&b.text, &dir);
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(
            out.status.success(),
            "README.md:{}: the block failed ({}):\n{}\n--- its standard error ---\n{stderr}\n--- its standard output ---\n{stdout}",
            b.line,
            out.status,
            b.text
        );
        if let Some(quoted) = blocks.get(i + 1).filter(|q| q.marker == Marker::Output) {
            let mut rest = stdout.as_ref();
            for line in quoted.text.lines() {
                let line = line.strip_suffix("...").unwrap_or(line);
                if line.trim().is_empty() {
                    continue;
                }
                let at = rest.find(line).unwrap_or_else(|| {
                    panic!(
                        "README.md:{}: `{line}` is not printed (after the lines before it) by the block at README.md:{}:\n{stdout}",
                        quoted.line, b.line
                    )
                });
                rest = &rest[at + line.len()..];
            }
        }
    }
    std::fs::remove_dir_all(dir).unwrap();
}
