//! What the integration tests share: running lwpvmm as a user does, on a
//! terminal, within a time limit (a hung guest fails its test with its
//! console instead of stalling the suite), and the Linux guest of
//! resources/linux, built once.

#![allow(dead_code)]

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long one lwpvmm run of a test may take. The slowest Linux test
/// takes about a minute on a quiet host; a guest that hangs (a kernel
/// stuck in boot) is stopped at this limit with its console so far, so the
/// suite fails in minutes instead of running into CI's time limit.
pub const RUN_LIMIT: Duration = Duration::from_secs(300);

/// How long a run stopped at its limit gets to write its console after
/// SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(20);

/// A running lwpvmm whose standard output and error are collected as they
/// are printed; stopped if it outlives its limit, and killed if dropped
/// (a test that panics leaves no VM running behind it).
pub struct Bounded {
    child: Option<Child>,
    stdout: Option<JoinHandle<Vec<u8>>>,
    /// Standard output so far, as the reader receives it.
    so_far: Arc<Mutex<Vec<u8>>>,
    stderr: Option<JoinHandle<Vec<u8>>>,
    started: Instant,
    limit: Duration,
    /// Why the run is stopped before it ends, when not at its limit.
    stopped_because: Option<String>,
}

/// Sends `signal` to the process group `child` leads (spawn_within gives
/// each run a group of its own).
fn signal_group(child: &Child, signal: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{signal}"), "--", &format!("-{}", child.id())])
        .stderr(Stdio::null())
        .status();
}

fn collect(from: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    collect_into(Box::new(from), Arc::default())
}

/// Reads `from` to its end, keeping what came so far in `so_far`.
fn collect_into(
    mut from: Box<dyn Read + Send + 'static>,
    so_far: Arc<Mutex<Vec<u8>>>,
) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        loop {
            match from.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if let Ok(mut all) = so_far.lock() {
                        all.extend_from_slice(&chunk[..n]);
                    }
                }
            }
        }
        so_far.lock().map(|all| all.clone()).unwrap_or_default()
    })
}

/// Starts `command` with its output piped and no input (as
/// `Command::output` runs it), to end within `limit`.
pub fn spawn_within(command: &mut Command, limit: Duration) -> Bounded {
    let mut child = command
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {command:?}: {e}"));
    let so_far: Arc<Mutex<Vec<u8>>> = Arc::default();
    let stdout = child
        .stdout
        .take()
        .map(|s| collect_into(Box::new(s), Arc::clone(&so_far)));
    let stderr = child.stderr.take().map(collect);
    Bounded {
        child: Some(child),
        stdout,
        so_far,
        stderr,
        started: Instant::now(),
        limit,
        stopped_because: None,
    }
}

/// Runs `command` to its end or to `limit` (then SIGTERM, which makes
/// lwpvmm stop the VM and write its console, and SIGKILL after a grace),
/// and returns what it printed.
pub fn output_within(command: &mut Command, limit: Duration) -> Output {
    spawn_within(command, limit).wait()
}

impl Bounded {
    /// Waits until the run has printed each of `lines` (whole lines, in
    /// any order) on standard output: true then, false when it ended or
    /// `within` passed first.
    pub fn wait_for_lines(&mut self, lines: &[&str], within: Duration) -> bool {
        let until = Instant::now() + within;
        loop {
            let printed = self
                .so_far
                .lock()
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default();
            if lines
                .iter()
                .all(|want| printed.lines().any(|l| l.trim_end() == *want))
            {
                return true;
            }
            let ended = self
                .child
                .as_mut()
                .is_none_or(|c| !matches!(c.try_wait(), Ok(None)));
            if ended || Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn wait_until(child: &mut Child, until: Instant) -> Option<ExitStatus> {
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if Instant::now() >= until => return None,
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                Err(e) => panic!("wait for lwpvmm: {e}"),
            }
        }
    }

    /// Waits for the end, or the limit, or `silence` without a byte on
    /// standard output, and returns what the run printed: for runs whose
    /// length depends on the host's load (a slow host makes a long boot
    /// slower, while a stuck guest stops printing).
    pub fn wait_while_printing(mut self, silence: Duration) -> Output {
        let (mut printed, mut last) = (0, Instant::now());
        loop {
            let ended = self
                .child
                .as_mut()
                .is_none_or(|c| !matches!(c.try_wait(), Ok(None)));
            let now = self.so_far.lock().map(|b| b.len()).unwrap_or(0);
            if now != printed {
                (printed, last) = (now, Instant::now());
            }
            if ended || self.started.elapsed() >= self.limit {
                return self.wait();
            }
            if last.elapsed() >= silence {
                self.stopped_because = Some(format!(
                    "test harness: lwpvmm printed nothing for {} s and was sent SIGTERM\n",
                    silence.as_secs()
                ));
                self.limit = self.started.elapsed();
                return self.wait();
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Stops the run now with SIGTERM, as its limit would, and returns what
    /// it printed.
    pub fn terminate(mut self) -> Output {
        self.stopped_because = Some("test harness: stopped with SIGTERM\n".into());
        self.limit = self.started.elapsed();
        self.wait()
    }

    /// Waits for the end (or the limit) and returns what the run printed;
    /// a run stopped at its limit says so at the top of its standard error.
    pub fn wait(mut self) -> Output {
        let mut child = self.child.take().expect("waited once");
        let mut note = String::new();
        let status = match Self::wait_until(&mut child, self.started + self.limit) {
            Some(status) => status,
            None => {
                note = self.stopped_because.take().unwrap_or_else(|| {
                    format!(
                        "test harness: lwpvmm was still running after its {} s limit and was sent SIGTERM\n",
                        self.limit.as_secs()
                    )
                });
                signal_group(&child, "TERM");
                let status = match Self::wait_until(&mut child, Instant::now() + STOP_GRACE) {
                    Some(status) => status,
                    None => {
                        let _ = child.kill();
                        child.wait().expect("reap lwpvmm")
                    }
                };
                // Whatever the run started holds its output pipes open.
                signal_group(&child, "KILL");
                status
            }
        };
        let join = |h: Option<JoinHandle<Vec<u8>>>| {
            h.map(|h| h.join().expect("output reader"))
                .unwrap_or_default()
        };
        let mut stderr = note.into_bytes();
        stderr.extend(join(self.stderr.take()));
        Output {
            status,
            stdout: join(self.stdout.take()),
            stderr,
        }
    }
}

impl Drop for Bounded {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            signal_group(child, "KILL");
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Fails the test, saying why, where /dev/kvm is missing.
pub fn require_kvm() {
    assert!(
        std::path::Path::new("/dev/kvm").exists(),
        "this test runs lwpvmm on KVM and needs /dev/kvm, which is missing on this machine"
    );
}

/// The lwpvmm binary under test: every run a test starts names it here.
pub const BIN: &str = env!("CARGO_BIN_EXE_lwpvmm");

/// A command that runs lwpvmm, for [`output_within`], [`spawn_within`], or a
/// child the test holds itself under a [`Watchdog`].
pub fn command() -> Command {
    Command::new(BIN)
}

/// Runs the lwpvmm binary with `args` to its end, within [`RUN_LIMIT`],
/// after checking that /dev/kvm is there.
pub fn lwpvmm(args: &[&str]) -> Output {
    require_kvm();
    output_within(command().args(args), RUN_LIMIT)
}

/// The time limit of a child a test holds itself (to signal it, to close
/// its pipes, to read it as it runs): past [`RUN_LIMIT`] it is killed,
/// and the test then fails on what it got, instead of stalling the suite.
/// Dropping the watchdog ends its watch.
pub struct Watchdog {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// Watches `child` for [`RUN_LIMIT`].
pub fn watch(child: &Child) -> Watchdog {
    let pid = child.id().to_string();
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(RUN_LIMIT) {
            eprintln!("lwpvmm (pid {pid}) outlived its {RUN_LIMIT:?} limit: killed");
            let _ = Command::new("kill")
                .args(["-KILL", &pid])
                .stderr(Stdio::null())
                .status();
        }
    });
    Watchdog {
        stop: Some(stop),
        thread: Some(thread),
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The Linux self-test's programs, each one check line of its /init
/// (resources/linux/init/selftest.c), besides /lwp-precise.
pub const PROGRAMS: [&str; 10] = [
    "/lwp-records",
    "/lwp-two",
    "/lwp-faults",
    "/lwp-hot",
    "/lwp-pinned",
    "/lwp-threshold",
    "/lwp-threads",
    "/lwp-migrate",
    "/lwp-storm",
    "/lwp-compat32",
];

/// The self-test's line for /sysentry: lwpvmm's SYSCALL fixup, or patch
/// 0001 with the fixup off, runs a system call only after a real SYSCALL,
/// and gives back only the flags a user may set.
pub const SYSENTRY: &str =
    "ok - /sysentry: only real SYSCALLs run, with user flags (patch 0001 or lwpvmm)";

/// Asserts that `console` holds every one of `lines` and no failed check.
pub fn assert_lines(console: &Console, lines: &[String]) {
    for line in lines {
        assert!(
            console.contains(line.as_str()),
            "missing {line:?}:\n{console}"
        );
    }
    assert!(!console.contains("not ok"), "{console}");
}

/// Asserts what the metrics file `metrics` of a Linux run says of the
/// SYSCALL fixup: on kvm_pvm (on by default there) it completed the
/// processes' system calls; elsewhere it stayed off.
pub fn assert_syscalls_completed(metrics: &std::path::Path) {
    let text = std::fs::read(metrics).unwrap_or_else(|e| panic!("read {}: {e}", metrics.display()));
    let m: serde_json::Value =
        serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{}: {e}", metrics.display()));
    let completed = m["vm"]["syscalls_completed"].as_u64().unwrap_or_default();
    if std::path::Path::new("/sys/module/kvm_pvm").exists() {
        assert!(
            completed > 100,
            "lwpvmm completed {completed} SYSCALLs: {m}"
        );
    } else {
        assert_eq!(completed, 0, "the fixup is off on this host: {m}");
    }
}

/// The directory of the Linux guest the tests boot: `$LWPVMM_LINUX` when it
/// is set (a guest you built with resources/linux/build.sh, such as the
/// README's `out/linux`, reused instead of built again), else
/// target/tmp/linux. Once per test binary, `build.sh --test-images` makes
/// sure of it: vmlinux, vmlinuz, the test images vmlinuz.FORMAT,
/// initramfs.cpio and rootfs.ext4; a cached kernel takes seconds.
pub fn linux() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = linux_dir();
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("resources/linux/build.sh");
        use std::io::Write;
        // Straight to standard error, past the test harness's capture, and
        // so is build.sh's progress (its output is inherited): a first
        // build takes minutes, and the person waiting should see them go.
        let _ = writeln!(
            std::io::stderr(),
            "tests: checking (or building) the Linux guest in {} with resources/linux/build.sh --test-images (set LWPVMM_LINUX to use another)",
            dir.display()
        );
        let status = Command::new(&script)
            .arg("--test-images")
            .arg(&dir)
            .stdin(Stdio::null())
            .status()
            .expect("run resources/linux/build.sh");
        assert!(
            status.success(),
            "resources/linux/build.sh --test-images {} failed ({status}): its messages are above, make's steps in {}",
            dir.display(),
            dir.join("build.log").display()
        );
        // Absolute, for tests that run commands in directories of their own.
        std::fs::canonicalize(&dir).expect("the Linux guest's directory")
    })
}

/// Where the tests' Linux guest is: `$LWPVMM_LINUX`, else target/tmp/linux.
fn linux_dir() -> PathBuf {
    std::env::var_os("LWPVMM_LINUX")
        .filter(|d| !d.is_empty())
        .map_or_else(
            || PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("linux"),
            PathBuf::from,
        )
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
    let out: Output = output_within(
        Command::new("script")
            .args(["-qec", &command.join(" "), "/dev/null"])
            .env("RUST_LOG", "lwpvmm=trace"),
        RUN_LIMIT,
    );
    let text = String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n");
    assert!(
        !text.contains("seccomp:"),
        "a seccomp allowlist lacks a system call this run makes:\n{text}"
    );
    (out.status.code(), text)
}

/// Sends one HTTP request to the API on the Unix socket `sock` and returns
/// (status, body): as `curl --unix-socket sock -X method http://localhost{path} -d body`.
pub fn http(sock: &std::path::Path, method: &str, path: &str, body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(sock)
        .unwrap_or_else(|e| panic!("connect to {}: {e}", sock.display()));
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(raw.as_bytes()).expect("send the request");
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).expect("read the answer");
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {text:?}"));
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body.to_owned())
}

/// Waits until `path` exists (a socket lwpvmm binds), or panics after `within`.
pub fn wait_for_path(path: &std::path::Path, within: Duration) {
    let until = Instant::now() + within;
    while !path.exists() {
        assert!(Instant::now() < until, "{} did not appear", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `ip ARGS` (iproute2), failing the test with what `ip` said and
/// what the test needs.
pub fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("this test needs `ip` (iproute2)");
    assert!(
        out.status.success(),
        "`ip {}` failed: {} (this test needs /dev/net/tun and the rights to create network namespaces and taps: run it as root)",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The network namespace of this name, deleted (with its taps) when
/// dropped.
pub struct NamespaceGuard(pub String);

impl Drop for NamespaceGuard {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.0])
            .output();
    }
}

/// A network namespace with a tap, torn down when dropped (the tests
/// that need one run as root, as CI does).
pub struct Netns {
    /// Its name (`ip netns exec NAME ...`).
    pub name: String,
}

impl Netns {
    fn ip(args: &[&str]) -> Output {
        Command::new("ip")
            .args(args)
            .output()
            .expect("the network test needs `ip` (iproute2)")
    }

    /// A namespace `name` with the tap `lwptap0` at 172.30.0.1/24, up.
    pub fn create(name: &str) -> Netns {
        let _ = Self::ip(&["netns", "delete", name]);
        let steps: [&[&str]; 5] = [
            &["netns", "add", name],
            &["-n", name, "tuntap", "add", "dev", "lwptap0", "mode", "tap"],
            &["-n", name, "addr", "add", "172.30.0.1/24", "dev", "lwptap0"],
            &["-n", name, "link", "set", "lwptap0", "up"],
            &["-n", name, "link", "set", "lo", "up"],
        ];
        let ns = Netns {
            name: name.to_owned(),
        };
        for step in steps {
            let out = Self::ip(step);
            assert!(
                out.status.success(),
                "`ip {}` failed: {} (the network test needs /dev/net/tun and the rights to create network namespaces and taps: run it as root)",
                step.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        ns
    }

    /// Connects to `addr` from inside the namespace (on a thread that
    /// enters it), retrying while the guest boots.
    pub fn connect(
        &self,
        addr: &'static str,
        until: Instant,
    ) -> std::io::Result<std::net::TcpStream> {
        let ns = std::fs::File::open(format!("/run/netns/{}", self.name)).expect("the namespace");
        std::thread::spawn(move || {
            // Only this thread enters the namespace.
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            loop {
                match std::net::TcpStream::connect_timeout(
                    &addr.parse().unwrap(),
                    Duration::from_secs(2),
                ) {
                    Ok(s) => return Ok(s),
                    Err(e) if Instant::now() > until => return Err(e),
                    Err(_) => std::thread::sleep(Duration::from_millis(500)),
                }
            }
        })
        .join()
        .expect("the connecting thread")
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Self::ip(&["netns", "delete", &self.name]);
    }
}
