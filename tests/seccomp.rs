//! seccomp: a thread under lwpvmm's vCPU, control, device or API filter that makes a
//! system call outside its allowlist (or an ioctl request the thread does
//! not make) stops the whole process with status 2 and a message naming the
//! thread and the call; allowed calls go through; in `log` mode the call
//! goes through too; glibc's own read-only open fails with EACCES on the
//! threads that open no file. Each case runs in a child process (this same
//! binary, told by an environment variable which probe to run), because a
//! filter cannot be removed once installed. (tests/seccomp_devices.rs runs
//! the device threads' guest paths under their filters.)
//!
//! A custom harness: it prints `seccomp: N passed, M failed` and exits
//! non-zero when a case fails.

// A test: a failed setup or expectation stops it with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::io::AsRawFd;
use std::process::Command;

use lwpvmm::vmm::base::seccomp::{SeccompMode, ThreadKind, install};

const PROBE: &str = "LWPVMM_SECCOMP_PROBE";
/// KVM_CREATE_VM: a KVM ioctl that no thread makes once the VM runs.
const KVM_CREATE_VM: u64 = 0xae01;

/// The child side: install a filter, then make one system call.
fn probe(which: &str) -> ! {
    let kind = if which.starts_with("control") {
        ThreadKind::Control
    } else if which.starts_with("device") {
        ThreadKind::Device
    } else if which.starts_with("api") {
        ThreadKind::Api
    } else if which.starts_with("vsock") {
        ThreadKind::Vsock
    } else {
        ThreadKind::Vcpu
    };
    let mode = if which.ends_with("log") {
        SeccompMode::Log
    } else {
        SeccompMode::On
    };
    // Opened before the filter, as lwpvmm opens /dev/kvm during setup.
    let kvm = std::fs::File::open("/dev/kvm");
    // A directory sysroot, opened before the filter as the API's is.
    let sysroot = which.contains("sysroot").then(|| {
        let dir = std::env::temp_dir().join(format!("lwpvmm-seccomp-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("bin")).expect("sysroot");
        std::fs::write(dir.join("bin/tool"), b"\x7fELF tool").expect("sysroot file");
        (
            lwpvmm::profile::sysroot::Sysroot::open(&dir).expect("open the sysroot"),
            dir,
        )
    });
    install(kind, mode, "probe").expect("install the filter");
    if which.contains("denied") {
        // socket(2) then bind(2): the vsock thread may make a socket, no
        // thread may bind one.
        let _ = std::net::UdpSocket::bind("127.0.0.1:0");
        println!("survived a denied system call");
        std::process::exit(3);
    }
    if which.contains("create-vm") {
        let fd = kvm.expect("/dev/kvm").as_raw_fd();
        // SAFETY: KVM_CREATE_VM takes an integer argument; the result (a new
        // descriptor or an error) is ignored: the filter must stop the call.
        let _ = unsafe { libc::ioctl(fd, KVM_CREATE_VM as _, 0) };
        println!("survived KVM_CREATE_VM");
        std::process::exit(3);
    }
    if which.contains("create-file") {
        // An open for writing: no thread but the control thread may.
        let _ = std::fs::File::create(std::env::temp_dir().join("lwpvmm-seccomp-probe"));
        println!("survived creating a file");
        std::process::exit(3);
    }
    if which.contains("overcommit") {
        // What glibc's malloc reads the first time a thread's heap shrinks.
        let read = std::fs::read("/proc/sys/vm/overcommit_memory").map(|b| !b.is_empty());
        println!("overcommit read {read:?}");
        std::process::exit(0);
    }
    if let Some((root, dir)) = sysroot {
        // The API thread reads guest files one component at a time (it may
        // not unlink: the directory is left in the temporary directory).
        let read = root.read("/bin/tool").map(|b| b.len());
        let refused = root.read("/bin");
        println!("read {read:?}, {refused:?} in {}", dir.display());
        std::process::exit(0);
    }
    println!("alive");
    std::process::exit(0);
}

fn main() {
    if let Ok(which) = std::env::var(PROBE) {
        probe(&which);
    }
    assert!(
        std::path::Path::new("/dev/kvm").exists(),
        "the seccomp tests open /dev/kvm as lwpvmm does; it is missing on this machine"
    );
    let me = std::env::current_exe().expect("current exe");
    // (probe, exit code, text on stdout or stderr)
    // glibc's own read-only open (its malloc's read of overcommit_memory)
    // fails with EACCES on the threads that open no file, where it once
    // trapped.
    let refused = "overcommit read Err(Os { code: 13,";
    let cases: [(&str, i32, &str); 22] = [
        ("vcpu-allowed", 0, "alive"),
        ("vcpu-denied", 2, "seccomp: thread probe (tid "),
        (
            "vcpu-denied",
            2,
            &format!("made syscall {}", libc::SYS_socket),
        ),
        (
            "vcpu-create-vm",
            2,
            "made syscall 16 (ioctl, request 0xae01)",
        ),
        ("control-allowed", 0, "alive"),
        ("control-denied", 2, "--seccomp log"),
        ("vcpu-denied-log", 3, "survived a denied system call"),
        ("device-allowed", 0, "alive"),
        ("device-denied", 2, "seccomp: thread probe (tid "),
        (
            "device-create-vm",
            2,
            "made syscall 16 (ioctl, request 0xae01)",
        ),
        ("api-allowed", 0, "alive"),
        ("api-denied", 2, "seccomp: thread probe (tid "),
        ("api-sysroot", 0, "read Ok(9), Err(NotRegular)"),
        ("api-overcommit", 0, "overcommit read Ok(true)"),
        (
            "api-create-vm",
            2,
            "made syscall 16 (ioctl, request 0xae01)",
        ),
        ("vsock-allowed", 0, "alive"),
        // The vsock thread may make sockets, but bind none.
        (
            "vsock-denied",
            2,
            &format!("made syscall {}", libc::SYS_bind),
        ),
        (
            "vsock-create-vm",
            2,
            "made syscall 16 (ioctl, request 0xae01)",
        ),
        ("vcpu-overcommit", 0, refused),
        ("device-overcommit", 0, refused),
        ("vsock-overcommit", 0, refused),
        // Any other open still traps.
        (
            "vsock-create-file",
            2,
            &format!("made syscall {}", libc::SYS_openat),
        ),
    ];
    let (mut passed, mut failed) = (0, 0);
    for (which, code, text) in cases {
        let out = Command::new(&me)
            .env(PROBE, which)
            .output()
            .expect("run probe");
        let output = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let ok = out.status.code() == Some(code) && output.contains(text);
        println!(
            "{} {which}: {:?}, want {code} and {text:?}; output: {}",
            if ok { "ok" } else { "FAILED" },
            out.status,
            output.trim()
        );
        if ok {
            passed += 1;
        } else {
            failed += 1;
        }
    }
    println!("seccomp: {passed} passed, {failed} failed");
    std::process::exit(if failed == 0 { 0 } else { 1 });
}
