//! What the integration tests share: running lwpvmm as a user does, on a
//! terminal.

use std::process::{Command, Output};

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
