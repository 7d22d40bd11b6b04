//! What the integration tests share: running lwpvmm as a user does, on a
//! terminal, and the Linux guest of resources/linux, built once.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;

/// Fails the test, saying why, where /dev/kvm is missing.
pub fn require_kvm() {
    assert!(
        std::path::Path::new("/dev/kvm").exists(),
        "this test boots a Linux VM and needs /dev/kvm, which is missing on this machine"
    );
}

/// The directory holding vmlinux, initramfs.cpio and rootfs.ext4, built on
/// first use (the kernel is cached across runs).
pub fn linux() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("linux");
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("resources/linux/build.sh");
        let out = Command::new(&script)
            .arg(&dir)
            .output()
            .expect("run resources/linux/build.sh");
        assert!(
            out.status.success(),
            "resources/linux/build.sh failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    })
}

/// What a Linux run printed. Its `Display` leads with what a failing test
/// needs (the self-test's failed checks, then lwpvmm's standard error and
/// the console's last lines), because CI shows only the start of a
/// failure's message; the whole console follows.
pub struct Console {
    pub stdout: String,
    pub stderr: String,
}

impl std::ops::Deref for Console {
    type Target = str;

    fn deref(&self) -> &str {
        &self.stdout
    }
}

impl std::fmt::Display for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const TAIL: usize = 30;
        writeln!(
            f,
            "--- failed checks, with the details indented under them ---"
        )?;
        let mut in_failure = false;
        for line in self.stdout.lines() {
            in_failure = line.contains("not ok") || (in_failure && line.starts_with("    "));
            if in_failure {
                writeln!(f, "{line}")?;
            }
        }
        writeln!(
            f,
            "--- lwpvmm's standard error ---\n{}",
            self.stderr.trim_end()
        )?;
        let lines: Vec<&str> = self.stdout.lines().collect();
        writeln!(f, "--- the console's last {TAIL} lines ---")?;
        for line in &lines[lines.len().saturating_sub(TAIL)..] {
            writeln!(f, "{line}")?;
        }
        write!(f, "--- the whole console ---\n{}", self.stdout)
    }
}

impl Console {
    /// What `out` printed.
    pub fn of(out: &Output) -> Self {
        Console {
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// Quotes `s` for `sh`.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Runs lwpvmm with `args`, its standard input, output and error on a
/// pseudo-terminal (util-linux `script`) and `RUST_LOG=lwpvmm=trace`, as a
/// person at a terminal runs it with logging turned up: every thread then
/// logs to a terminal, so a system call a seccomp allowlist lacks shows.
/// Returns lwpvmm's exit status (script -e passes it on; 128 + N for a
/// signal) and everything the terminal showed.
pub fn on_terminal(args: &[&str]) -> (Option<i32>, String) {
    let command: Vec<String> = std::iter::once(env!("CARGO_BIN_EXE_lwpvmm"))
        .chain(args.iter().copied())
        .map(quote)
        .collect();
    let out: Output = Command::new("script")
        .args(["-qec", &command.join(" "), "/dev/null"])
        .env("RUST_LOG", "lwpvmm=trace")
        .output()
        .expect("run script(1) from util-linux");
    let text = String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n");
    assert!(
        !text.contains("seccomp:"),
        "a seccomp allowlist lacks a system call this run makes:\n{text}"
    );
    (out.status.code(), text)
}
