//! Firecracker's command line, as its own parser takes it (`--name value`
//! or `--name=value`, each at most once) and with its messages, so that an
//! orchestrator's invocation of `firecracker` means the same here.

use std::path::PathBuf;

use thiserror::Error;

use crate::vmm::api::http::MAX_BODY_LIMIT;

/// Firecracker's default API socket.
pub const DEFAULT_API_SOCK: &str = "/run/firecracker.socket";
/// Firecracker's default instance id.
pub const DEFAULT_ID: &str = "anonymous-instance";
/// Firecracker's default `--http-api-max-payload-size`: the most bytes of a
/// request's body.
pub const DEFAULT_MAX_PAYLOAD: usize = 51200;

/// A bad command line, in Firecracker's words.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ArgsError {
    /// Two options that exclude each other.
    #[error("Argument '{1}' cannot be used together with argument '{0}'.")]
    Forbidden(&'static str, &'static str),
    /// An option that needs another.
    #[error("Argument '{0}' required, but not found.")]
    Missing(&'static str),
    /// An option without its value.
    #[error("The argument '{0}' requires a value, but none was supplied.")]
    MissingValue(String),
    /// An option Firecracker does not have.
    #[error("Found argument '{0}' which wasn't expected, or isn't valid in this context.")]
    Unexpected(String),
    /// An option given twice.
    #[error("The argument '{0}' was provided more than once.")]
    Duplicate(String),
    /// An option lwpvmm does not offer.
    #[error("--{option} is not offered by lwpvmm: {why}")]
    NotOffered {
        /// The option.
        option: &'static str,
        /// Why, and what to do.
        why: &'static str,
    },
    /// A value out of range.
    #[error("--{option}: {why}")]
    Invalid {
        /// The option.
        option: &'static str,
        /// What is wrong.
        why: String,
    },
}

/// What the command line asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    /// The API socket (none with `--no-api`).
    pub api_sock: Option<PathBuf>,
    /// `--id`.
    pub id: String,
    /// `--config-file`.
    pub config_file: Option<PathBuf>,
    /// `--log-path`.
    pub log_path: Option<PathBuf>,
    /// `--level`.
    pub level: Option<String>,
    /// `--metrics-path`.
    pub metrics_path: Option<PathBuf>,
    /// `--no-seccomp`.
    pub no_seccomp: bool,
    /// `--boot-timer`: report when the guest's init writes to the boot
    /// timer port (lwpvmm reports the first console line instead).
    pub boot_timer: bool,
    /// `--enable-pci`: taken, with the devices on virtio-mmio all the same
    /// (the process says so in its log).
    pub enable_pci: bool,
    /// `--http-api-max-payload-size`: the most bytes of a request's body.
    pub max_payload: usize,
    /// `--version`.
    pub version: bool,
    /// `--describe-snapshot`.
    pub describe_snapshot: Option<PathBuf>,
    /// `--help`.
    pub help: bool,
}

/// What `--help` prints.
pub const USAGE: &str = "\
lwpvmm as firecracker: Firecracker's command line and API over lwpvmm
(README: \"Running under a Firecracker orchestrator\").

Usage: firecracker [--api-sock PATH | --no-api --config-file FILE] [OPTIONS]
       lwpvmm firecracker [the same]

  --api-sock PATH         the API socket (default /run/firecracker.socket)
  --config-file FILE      boot at once from a Firecracker configuration file
  --no-api                serve no API (needs --config-file)
  --id ID                 the instance's id (GET /)
  --log-path FILE         append log lines to FILE (a file or a FIFO)
  --level LEVEL           Error, Warning, Info, Debug, Trace or Off
  --metrics-path FILE     lwpvmm's counters, on FlushMetrics and at the end
  --no-seccomp            no seccomp filters
  --describe-snapshot DIR the format of an lwpvmm snapshot
  --version               the API version lwpvmm follows, and lwpvmm's
  --http-api-max-payload-size BYTES
                          the most bytes of a request's body (default 51200,
                          at most 1048576)
  --enable-pci            accepted: the devices stay on virtio-mmio
  --show-level, --show-log-origin, --boot-timer, --start-time-us,
  --start-time-cpu-us, --parent-cpu-time-us
                          accepted as Firecracker takes them
";

/// Whether an option takes a value.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Takes {
    Value,
    Flag,
}

/// Firecracker's options (its `main.rs`), and whether each takes a value.
const OPTIONS: &[(&str, Takes)] = &[
    ("api-sock", Takes::Value),
    ("id", Takes::Value),
    ("seccomp-filter", Takes::Value),
    ("no-seccomp", Takes::Flag),
    ("start-time-us", Takes::Value),
    ("start-time-cpu-us", Takes::Value),
    ("parent-cpu-time-us", Takes::Value),
    ("config-file", Takes::Value),
    ("no-api", Takes::Flag),
    ("log-path", Takes::Value),
    ("level", Takes::Value),
    ("module", Takes::Value),
    ("show-level", Takes::Flag),
    ("show-log-origin", Takes::Flag),
    ("metrics-path", Takes::Value),
    ("boot-timer", Takes::Flag),
    ("version", Takes::Flag),
    ("snapshot-version", Takes::Flag),
    ("describe-snapshot", Takes::Value),
    ("http-api-max-payload-size", Takes::Value),
    ("mmds-size-limit", Takes::Value),
    ("enable-pci", Takes::Flag),
    ("help", Takes::Flag),
];

/// The log levels Firecracker takes, any case.
pub const LEVELS: &[&str] = &["off", "error", "warning", "warn", "info", "debug", "trace"];

impl Args {
    /// Parses the arguments after the program's name.
    pub fn parse<S: AsRef<str>>(args: &[S]) -> Result<Args, ArgsError> {
        let mut seen: Vec<(&'static str, Option<String>)> = Vec::new();
        let mut it = args.iter().map(AsRef::as_ref);
        while let Some(arg) = it.next() {
            let arg = if arg == "-h" { "--help" } else { arg };
            let Some(body) = arg.strip_prefix("--") else {
                return Err(ArgsError::Unexpected(arg.to_owned()));
            };
            let (name, inline) = match body.split_once('=') {
                Some((n, v)) => (n, Some(v.to_owned())),
                None => (body, None),
            };
            let Some(&(name, takes)) = OPTIONS.iter().find(|(n, _)| *n == name) else {
                return Err(ArgsError::Unexpected(name.to_owned()));
            };
            if seen.iter().any(|(n, _)| *n == name) {
                return Err(ArgsError::Duplicate(name.to_owned()));
            }
            let value = match (takes, inline) {
                (Takes::Flag, None) => None,
                (Takes::Flag, Some(_)) => return Err(ArgsError::Unexpected(arg.to_owned())),
                (Takes::Value, Some(v)) => Some(v),
                (Takes::Value, None) => match it.next() {
                    Some(v) if !v.starts_with("--") => Some(v.to_owned()),
                    _ => return Err(ArgsError::MissingValue(name.to_owned())),
                },
            };
            seen.push((name, value));
        }
        let has = |n: &str| seen.iter().any(|(s, _)| *s == n);
        let value = |n: &str| {
            seen.iter()
                .find(|(s, _)| *s == n)
                .and_then(|(_, v)| v.clone())
        };
        if has("seccomp-filter") && has("no-seccomp") {
            return Err(ArgsError::Forbidden("seccomp-filter", "no-seccomp"));
        }
        if has("no-api") && !has("config-file") {
            return Err(ArgsError::Missing("config-file"));
        }
        for (option, why) in [
            (
                "seccomp-filter",
                "lwpvmm's threads carry seccomp allowlists of their own, which a filter written for Firecracker's threads would break; drop the option (or give --no-seccomp)",
            ),
            (
                "module",
                "lwpvmm has one log level for every module; drop the option",
            ),
            (
                "snapshot-version",
                "lwpvmm's snapshots are its own format (docs/snapshot.md), not Firecracker's",
            ),
            ("mmds-size-limit", "lwpvmm has no metadata service (MMDS)"),
        ] {
            if has(option) {
                return Err(ArgsError::NotOffered { option, why });
            }
        }
        let max_payload = match value("http-api-max-payload-size") {
            None => DEFAULT_MAX_PAYLOAD,
            Some(size) => size
                .parse::<usize>()
                .ok()
                .filter(|s| *s <= MAX_BODY_LIMIT)
                .ok_or_else(|| ArgsError::Invalid {
                    option: "http-api-max-payload-size",
                    why: format!(
                        "`{size}` is not a size lwpvmm's API takes: give the bytes of the largest request body, at most {MAX_BODY_LIMIT} (Firecracker's default is {DEFAULT_MAX_PAYLOAD})"
                    ),
                })?,
        };
        if let Some(level) = value("level")
            && !LEVELS.contains(&level.to_ascii_lowercase().as_str())
        {
            return Err(ArgsError::Invalid {
                option: "level",
                why: format!(
                    "`{level}` is not a level: give Error, Warning, Info, Debug, Trace or Off"
                ),
            });
        }
        Ok(Args {
            api_sock: (!has("no-api")).then(|| {
                value("api-sock")
                    .unwrap_or_else(|| DEFAULT_API_SOCK.into())
                    .into()
            }),
            id: value("id").unwrap_or_else(|| DEFAULT_ID.into()),
            config_file: value("config-file").map(PathBuf::from),
            log_path: value("log-path").map(PathBuf::from),
            level: value("level"),
            metrics_path: value("metrics-path").map(PathBuf::from),
            no_seccomp: has("no-seccomp"),
            boot_timer: has("boot-timer"),
            enable_pci: has("enable-pci"),
            max_payload,
            version: has("version"),
            describe_snapshot: value("describe-snapshot").map(PathBuf::from),
            help: has("help"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn firecracker_command_lines() {
        let ok = |args: &[&str]| Args::parse(args).unwrap();
        let defaults = ok(&[]);
        assert_eq!(defaults.api_sock, Some(PathBuf::from(DEFAULT_API_SOCK)));
        assert_eq!(defaults.id, DEFAULT_ID);
        let full = ok(&[
            "--api-sock",
            "/tmp/fc.sock",
            "--id=vm7",
            "--level",
            "Debug",
            "--show-level",
            "--show-log-origin",
            "--log-path",
            "/tmp/log",
            "--metrics-path",
            "/tmp/m",
            "--boot-timer",
            "--no-seccomp",
            "--start-time-us",
            "5",
            "--http-api-max-payload-size",
            "4096",
        ]);
        assert_eq!(full.api_sock, Some(PathBuf::from("/tmp/fc.sock")));
        assert_eq!(full.id, "vm7");
        assert!(full.no_seccomp && full.boot_timer);
        let no_api = ok(&["--no-api", "--config-file", "/c.json"]);
        assert_eq!(no_api.api_sock, None);
        assert_eq!(no_api.config_file, Some(PathBuf::from("/c.json")));
        // (arguments, the error)
        let table: &[(&[&str], &str)] = &[
            (
                &["--api-sok", "x"],
                "Found argument 'api-sok' which wasn't expected",
            ),
            (&["run"], "Found argument 'run' which wasn't expected"),
            (
                &["--id", "a", "--id", "b"],
                "The argument 'id' was provided more than once.",
            ),
            (&["--api-sock"], "The argument 'api-sock' requires a value"),
            (
                &["--api-sock", "--no-seccomp"],
                "The argument 'api-sock' requires a value",
            ),
            (
                &["--no-api"],
                "Argument 'config-file' required, but not found.",
            ),
            (
                &["--seccomp-filter", "f", "--no-seccomp"],
                "Argument 'no-seccomp' cannot be used together with argument 'seccomp-filter'.",
            ),
            (
                &["--seccomp-filter", "f"],
                "--seccomp-filter is not offered by lwpvmm",
            ),
            (&["--no-seccomp=1"], "Found argument '--no-seccomp=1'"),
            (&["--level", "loud"], "`loud` is not a level"),
            (
                &["--http-api-max-payload-size", "2000000"],
                "at most 1048576",
            ),
            (&["--http-api-max-payload-size", "-1"], "`-1` is not a size"),
        ];
        for (args, message) in table {
            let e = Args::parse(args).unwrap_err().to_string();
            assert!(e.contains(message), "{args:?}: {e}");
        }
    }

    #[test]
    fn the_listed_clients_command_lines_are_taken() {
        // (client, the arguments it starts `firecracker` with)
        let table: &[(&str, &[&str])] = &[
            (
                "firecracker-python, hysn-firecracker-python",
                &[
                    "--api-sock",
                    "/tmp/fc.sock",
                    "--id",
                    "vm1",
                    "--log-path",
                    "/tmp/vm1.log",
                ],
            ),
            ("bandsox, dud", &["--api-sock", "/tmp/fc.sock"]),
            (
                "husker",
                &[
                    "--api-sock",
                    "/tmp/fc.sock",
                    "--log-path",
                    "/tmp/fc.log",
                    "--level",
                    "Info",
                ],
            ),
            (
                "microheart",
                &[
                    "--api-sock",
                    "/tmp/fc.sock",
                    "--config-file",
                    "/tmp/vm.json",
                    "--enable-pci",
                ],
            ),
        ];
        for (client, args) in table {
            let parsed = Args::parse(args).unwrap_or_else(|e| panic!("{client}: {e}"));
            assert_eq!(
                parsed.api_sock,
                Some(PathBuf::from("/tmp/fc.sock")),
                "{client}"
            );
            assert_eq!(
                parsed.enable_pci,
                args.contains(&"--enable-pci"),
                "{client}"
            );
        }
    }

    #[test]
    fn the_payload_size_defaults_to_firecrackers() {
        // (arguments, the most bytes of a body)
        let table: &[(&[&str], usize)] = &[
            (&[], DEFAULT_MAX_PAYLOAD),
            (&["--http-api-max-payload-size", "4096"], 4096),
            (&["--http-api-max-payload-size=1048576"], MAX_BODY_LIMIT),
        ];
        for (args, bytes) in table {
            assert_eq!(Args::parse(args).unwrap().max_payload, *bytes, "{args:?}");
        }
        assert_eq!(DEFAULT_MAX_PAYLOAD, 51200);
    }
}
