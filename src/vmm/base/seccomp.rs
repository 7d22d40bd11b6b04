//! seccomp filters for lwpvmm's threads (seccompiler, the rust-vmm crate
//! Firecracker uses). Each vCPU thread and the control thread install their
//! own allowlist before they touch guest input. A system call outside it is
//! trapped (SECCOMP_RET_TRAP): the SIGSYS handler here writes which thread
//! made which call and ends lwpvmm with status 2, so a violation is never
//! silent. In `log` mode the kernel logs the call (SECCOMP_RET_LOG) and lets
//! it through, which is how a user finds what a list lacks. ioctl is
//! allowed only for the request numbers each thread makes. On the threads
//! that open no file (vCPU, device, vsock), glibc's own read-only open fails
//! with EACCES instead of trapping (`refusal`). The lists are documented
//! in docs/security.md.

use std::cell::Cell;
use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use thiserror::Error;
use vmm_sys_util::{ioctl_io_nr, ioctl_ior_nr, ioctl_iow_nr, ioctl_iowr_nr};

/// Which thread a filter is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadKind {
    /// A vCPU thread: KVM_RUN and exit handling.
    Vcpu,
    /// The control thread: event loop, snapshots, shutdown.
    Control,
    /// The virtio device thread: queues, disk images, taps.
    Device,
    /// The control API's thread: its sockets, no KVM.
    Api,
    /// The vsock device's thread: its queues and host Unix sockets.
    Vsock,
}

/// What a filter does with a system call outside its allowlist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SeccompMode {
    /// Trap it: lwpvmm says which thread made which call and exits with
    /// status 2.
    #[default]
    On,
    /// Let it through and have the kernel log it (SECCOMP_RET_LOG: the
    /// audit log, `dmesg`), to find what a list lacks.
    Log,
    /// No filters.
    Off,
}

/// Why a filter could not be built or installed.
#[derive(Debug, Error)]
pub enum SeccompError {
    /// The filter could not be built.
    #[error("cannot build the seccomp filter: {0}")]
    Build(String),
    /// The kernel refused it.
    #[error("cannot install the seccomp filter: {0}")]
    Install(String),
    /// The SIGSYS handler could not be installed.
    #[error("cannot install the SIGSYS handler: {0}")]
    Handler(vmm_sys_util::errno::Error),
}

/// A list of system calls by their `libc::SYS_*` constants, each with its
/// name, so the list can be checked against docs/security.md.
macro_rules! syscalls {
    ($($nr:path),* $(,)?) => {
        &[$((syscall_name(stringify!($nr)), $nr)),*]
    };
}

/// `brk` of "libc :: SYS_brk": what follows `SYS_`.
const fn syscall_name(path: &'static str) -> &'static str {
    let b = path.as_bytes();
    let mut i = 0;
    while i + 4 <= b.len() {
        if b[i] == b'S' && b[i + 1] == b'Y' && b[i + 2] == b'S' && b[i + 3] == b'_' {
            return match path.split_at_checked(i + 4) {
                Some((_, name)) => name,
                None => path,
            };
        }
        i += 1;
    }
    path
}

/// System calls every lwpvmm thread makes after setup: memory allocation,
/// locks, signals (the vCPU kick, the signal pipes), logging and exit.
const COMMON: &[(&str, i64)] = syscalls![
    libc::SYS_brk,
    // The vCPU thread's CPU time (the sampler), and clock reads the vDSO
    // hands to the kernel where it cannot read the host's clocksource.
    libc::SYS_clock_gettime,
    libc::SYS_close,
    libc::SYS_exit,
    libc::SYS_exit_group,
    // Debug builds check a descriptor is open (F_GETFD) before closing it.
    libc::SYS_fcntl,
    libc::SYS_futex,
    libc::SYS_getpid,
    libc::SYS_gettid,
    libc::SYS_madvise,
    libc::SYS_mmap,
    libc::SYS_mprotect,
    libc::SYS_mremap,
    libc::SYS_munmap,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_sched_getaffinity,
    libc::SYS_sched_yield,
    libc::SYS_sendto,
    libc::SYS_sigaltstack,
    libc::SYS_write,
    libc::SYS_writev,
];

/// What the control thread adds: the event loop, kicking vCPUs, writing
/// metrics (rewritten in place) and snapshots.
const CONTROL: &[(&str, i64)] = syscalls![
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_wait,
    libc::SYS_fstat,
    libc::SYS_fsync,
    libc::SYS_ftruncate,
    // A diff snapshot's parent named by its absolute path.
    libc::SYS_getcwd,
    libc::SYS_getrandom,
    libc::SYS_lseek,
    libc::SYS_mkdir,
    libc::SYS_mkdirat,
    libc::SYS_newfstatat,
    libc::SYS_openat,
    libc::SYS_pwrite64,
    libc::SYS_read,
    libc::SYS_recvfrom,
    // A new memory file replaces the old one, which a restored VM maps.
    libc::SYS_rename,
    libc::SYS_renameat,
    libc::SYS_renameat2,
    libc::SYS_statx,
    libc::SYS_tgkill,
    // The sampler's rate set at run time (`PATCH /capture`).
    libc::SYS_timerfd_settime,
    // A snapshot or metrics file that failed half-written is removed
    // (`hostfs::NewFile`).
    libc::SYS_unlinkat,
];

/// What the device thread adds: its event loop, the disk images (positioned
/// reads and writes, fdatasync) and the taps (read, write).
const DEVICE: &[(&str, i64)] = syscalls![
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_wait,
    libc::SYS_fdatasync,
    // The entropy device's bytes, and its rate limiter's timer.
    libc::SYS_getrandom,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_read,
    libc::SYS_timerfd_settime,
];

/// What the vsock thread adds: its event loop, accepting host clients on
/// its socket (and their credentials), connecting the guest's connections
/// to `uds_path_PORT`, reading and shutting down streams.
const VSOCK: &[(&str, i64)] = syscalls![
    libc::SYS_accept4,
    libc::SYS_connect,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_wait,
    libc::SYS_getsockopt,
    libc::SYS_read,
    libc::SYS_recvfrom,
    libc::SYS_shutdown,
    libc::SYS_socket,
];

/// What the API thread adds: waiting for and accepting clients, their
/// timeouts and credentials, reading requests, closing its side first, and
/// a pause after a failed accept.
const API: &[(&str, i64)] = syscalls![
    libc::SYS_accept4,
    libc::SYS_clock_nanosleep,
    // Reading a directory sysroot's ELF files for a profile's names: the
    // files are opened read-only (`API_OPEN_FLAGS`), sized and read.
    libc::SYS_fstat,
    libc::SYS_lseek,
    libc::SYS_newfstatat,
    libc::SYS_statx,
    // The hash maps of a capture seed themselves from it.
    libc::SYS_getrandom,
    libc::SYS_getsockopt,
    libc::SYS_nanosleep,
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_read,
    libc::SYS_recvfrom,
    libc::SYS_setsockopt,
    libc::SYS_shutdown,
];

/// The only flags the API thread opens files with, so it can create or
/// write nothing: a directory sysroot's directories and guest files,
/// opened one component at a time without following links
/// (`profile::sysroot`), and glibc's own read-only open: its malloc reads
/// /proc/sys/vm/overcommit_memory the first time a thread's heap shrinks,
/// which a large profile's answer does (seen killing the API thread).
const API_OPEN_FLAGS: [u64; 4] = [
    crate::hostfs::DIR_WALK_FLAGS.bits() as u64,
    crate::hostfs::INPUT_BELOW_FLAGS.bits() as u64,
    crate::hostfs::INPUT_FLAGS.bits() as u64,
    libc::O_RDONLY as u64 | libc::O_CLOEXEC as u64,
];

/// The flags glibc opens a file of its own with (`__open_nocancel`), as
/// its malloc opens /proc/sys/vm/overcommit_memory the first time a heap of
/// any thread's arena shrinks: on a device thread, when a guest's large
/// buffers are freed (vsock connections reset past their credit, seen
/// killing the vsock thread).
const GLIBC_OPEN_FLAGS: u64 = libc::O_RDONLY as u64 | libc::O_CLOEXEC as u64;

/// Whether a thread of `kind` gets [`refusal`]: the threads that open no
/// file, whose guest-driven memory use could reach glibc's open.
fn refuses_glibc_opens(kind: ThreadKind) -> bool {
    match kind {
        ThreadKind::Vcpu | ThreadKind::Device | ThreadKind::Vsock => true,
        // The control thread opens files; the API thread allows glibc's
        // open among its own (`API_OPEN_FLAGS`).
        ThreadKind::Control | ThreadKind::Api => false,
    }
}

const KVMIO: u32 = 0xae;

// The KVM ioctls lwpvmm's threads make once they run, computed from the
// structure sizes as the kernel's headers do.
ioctl_io_nr!(KVM_RUN, KVMIO, 0x80);
ioctl_iow_nr!(KVM_GET_DIRTY_LOG, KVMIO, 0x42, kvm_bindings::kvm_dirty_log);
ioctl_ior_nr!(KVM_GET_REGS, KVMIO, 0x81, kvm_bindings::kvm_regs);
ioctl_iow_nr!(KVM_SET_REGS, KVMIO, 0x82, kvm_bindings::kvm_regs);
ioctl_ior_nr!(KVM_GET_SREGS, KVMIO, 0x83, kvm_bindings::kvm_sregs);
ioctl_iow_nr!(KVM_SET_SREGS, KVMIO, 0x84, kvm_bindings::kvm_sregs);
ioctl_iowr_nr!(KVM_GET_MSRS, KVMIO, 0x88, kvm_bindings::kvm_msrs);
ioctl_iow_nr!(KVM_SET_XSAVE, KVMIO, 0xa5, kvm_bindings::kvm_xsave);
ioctl_ior_nr!(KVM_GET_LAPIC, KVMIO, 0x8e, kvm_bindings::kvm_lapic_state);
ioctl_ior_nr!(KVM_GET_MP_STATE, KVMIO, 0x98, kvm_bindings::kvm_mp_state);
ioctl_iow_nr!(KVM_SET_MP_STATE, KVMIO, 0x99, kvm_bindings::kvm_mp_state);
ioctl_iow_nr!(
    KVM_SET_GUEST_DEBUG,
    KVMIO,
    0x9b,
    kvm_bindings::kvm_guest_debug
);
ioctl_ior_nr!(
    KVM_GET_VCPU_EVENTS,
    KVMIO,
    0x9f,
    kvm_bindings::kvm_vcpu_events
);
ioctl_iow_nr!(
    KVM_SET_VCPU_EVENTS,
    KVMIO,
    0xa0,
    kvm_bindings::kvm_vcpu_events
);
ioctl_ior_nr!(KVM_GET_DEBUGREGS, KVMIO, 0xa1, kvm_bindings::kvm_debugregs);
ioctl_iow_nr!(KVM_SIGNAL_MSI, KVMIO, 0xa5, kvm_bindings::kvm_msi);
ioctl_iow_nr!(KVM_IRQ_LINE, KVMIO, 0x61, kvm_bindings::kvm_irq_level);
ioctl_ior_nr!(KVM_GET_XCRS, KVMIO, 0xa6, kvm_bindings::kvm_xcrs);
ioctl_ior_nr!(KVM_GET_XSAVE, KVMIO, 0xa4, kvm_bindings::kvm_xsave);
ioctl_ior_nr!(KVM_GET_XSAVE2, KVMIO, 0xcf, kvm_bindings::kvm_xsave);
ioctl_ior_nr!(KVM_GET_CLOCK, KVMIO, 0x7c, kvm_bindings::kvm_clock_data);
ioctl_iow_nr!(
    KVM_SET_GSI_ROUTING,
    KVMIO,
    0x6a,
    kvm_bindings::kvm_irq_routing
);

/// The ioctl requests a thread of `kind` makes, by name (docs/security.md
/// lists the same).
pub fn ioctls(kind: ThreadKind) -> Vec<(&'static str, u64)> {
    match kind {
        ThreadKind::Vcpu => vec![
            // The run loop and exit handling.
            ("KVM_RUN", KVM_RUN()),
            ("KVM_SET_REGS", KVM_SET_REGS()),
            ("KVM_SET_SREGS", KVM_SET_SREGS()),
            ("KVM_GET_VCPU_EVENTS", KVM_GET_VCPU_EVENTS()),
            ("KVM_SET_VCPU_EVENTS", KVM_SET_VCPU_EVENTS()),
            ("KVM_SET_GUEST_DEBUG", KVM_SET_GUEST_DEBUG()),
            ("KVM_SIGNAL_MSI", KVM_SIGNAL_MSI()),
            // A threshold interrupt on the vCPU's line (docs/pv-abi.md).
            ("KVM_IRQ_LINE", KVM_IRQ_LINE()),
            // The guest programmed the IOAPIC (ioapic.rs).
            ("KVM_SET_GSI_ROUTING", KVM_SET_GSI_ROUTING()),
            // The power port's halt until an interrupt (docs/pv-abi.md).
            ("KVM_SET_MP_STATE", KVM_SET_MP_STATE()),
            // MXCSR, for the CPL0 LDMXCSR and STMXCSR lwpvmm carries out
            // (vcpu/kernel_insn.rs), read with KVM_GET_XSAVE and written
            // after KVM_GET_XSAVE2.
            ("KVM_SET_XSAVE", KVM_SET_XSAVE()),
            // PKRU, for the guard's protection-key checks under CR4.PKE.
            ("KVM_GET_XSAVE", KVM_GET_XSAVE()),
            // Saving the vCPU's state for a snapshot.
            ("KVM_GET_XSAVE2", KVM_GET_XSAVE2()),
            ("KVM_GET_REGS", KVM_GET_REGS()),
            ("KVM_GET_SREGS", KVM_GET_SREGS()),
            ("KVM_GET_MSRS", KVM_GET_MSRS()),
            ("KVM_GET_LAPIC", KVM_GET_LAPIC()),
            ("KVM_GET_MP_STATE", KVM_GET_MP_STATE()),
            ("KVM_GET_DEBUGREGS", KVM_GET_DEBUGREGS()),
            ("KVM_GET_XCRS", KVM_GET_XCRS()),
        ],
        ThreadKind::Control => vec![
            // Diff snapshots: the pages the guest wrote.
            ("KVM_GET_DIRTY_LOG", KVM_GET_DIRTY_LOG()),
            ("KVM_GET_CLOCK", KVM_GET_CLOCK()),
        ],
        ThreadKind::Device | ThreadKind::Api | ThreadKind::Vsock => vec![],
    }
}

fn build(kind: ThreadKind, mode: SeccompMode) -> Result<BpfProgram, SeccompError> {
    let err = |e: seccompiler::BackendError| SeccompError::Build(e.to_string());
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    let extra: &[(&str, i64)] = match kind {
        ThreadKind::Vcpu => &[],
        ThreadKind::Control => CONTROL,
        ThreadKind::Device => DEVICE,
        ThreadKind::Api => API,
        ThreadKind::Vsock => VSOCK,
    };
    for &(_, nr) in COMMON.iter().chain(extra) {
        rules.insert(nr, vec![]);
    }
    // The kernel takes ioctl's request as an unsigned int: compare 32 bits.
    let requests = ioctls(kind)
        .into_iter()
        .map(|(_, request)| {
            let condition =
                SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, request)
                    .map_err(err)?;
            SeccompRule::new(vec![condition]).map_err(err)
        })
        .collect::<Result<Vec<_>, _>>()?;
    if kind == ThreadKind::Api {
        let read_only = API_OPEN_FLAGS
            .iter()
            .map(|&flags| {
                let condition =
                    SeccompCondition::new(2, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, flags)
                        .map_err(err)?;
                SeccompRule::new(vec![condition]).map_err(err)
            })
            .collect::<Result<Vec<_>, _>>()?;
        rules.insert(libc::SYS_openat, read_only);
    }
    if refuses_glibc_opens(kind) {
        // Let through here so that [`refusal`] answers it: the kernel takes
        // the stricter answer of the two filters, and a trap beats EACCES.
        let condition = SeccompCondition::new(
            2,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Eq,
            GLIBC_OPEN_FLAGS,
        )
        .map_err(err)?;
        rules.insert(
            libc::SYS_openat,
            vec![SeccompRule::new(vec![condition]).map_err(err)?],
        );
    }
    // An empty rule list would allow every ioctl: a thread that makes none
    // gets no ioctl entry at all.
    if !requests.is_empty() {
        rules.insert(libc::SYS_ioctl, requests);
    }
    let mismatch = match mode {
        SeccompMode::Log => SeccompAction::Log,
        SeccompMode::On | SeccompMode::Off => SeccompAction::Trap,
    };
    let filter = SeccompFilter::new(rules, mismatch, SeccompAction::Allow, TargetArch::x86_64)
        .map_err(err)?;
    BpfProgram::try_from(filter).map_err(err)
}

/// The filter that makes glibc's own read-only open fail with EACCES and
/// lets everything else through (to the allowlist, which traps an open with
/// any other flags). glibc takes the failure for the default setting and
/// frees heap pages with madvise, which every thread may call; the thread
/// still opens no file, so a guest that reaches this path neither kills
/// lwpvmm nor gains a way to read the host's files.
fn refusal() -> Result<BpfProgram, SeccompError> {
    let err = |e: seccompiler::BackendError| SeccompError::Build(e.to_string());
    let condition = SeccompCondition::new(
        2,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::Eq,
        GLIBC_OPEN_FLAGS,
    )
    .map_err(err)?;
    let rules = BTreeMap::from([(
        libc::SYS_openat,
        vec![SeccompRule::new(vec![condition]).map_err(err)?],
    )]);
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EACCES as u32),
        TargetArch::x86_64,
    )
    .map_err(err)?;
    BpfProgram::try_from(filter).map_err(err)
}

thread_local! {
    /// The calling thread's name for the SIGSYS message. Const-initialised
    /// and without a destructor, so the handler can read it.
    static THREAD_NAME: Cell<[u8; 16]> = const { Cell::new([0; 16]) };
}

/// Installs the filter for `kind` on the calling thread (and the threads it
/// creates later); `name` is how a violation names the thread. `Off` does
/// nothing.
pub fn install(kind: ThreadKind, mode: SeccompMode, name: &str) -> Result<(), SeccompError> {
    if mode == SeccompMode::Off {
        return Ok(());
    }
    let mut label = [0u8; 16];
    let n = name.len().min(label.len());
    label[..n].copy_from_slice(&name.as_bytes()[..n]);
    THREAD_NAME.with(|c| c.set(label));
    let program = build(kind, mode)?;
    let refusing = if refuses_glibc_opens(kind) {
        Some(refusal()?)
    } else {
        None
    };
    vmm_sys_util::signal::register_signal_handler(libc::SIGSYS, sigsys_handler)
        .map_err(SeccompError::Handler)?;
    // The refusal first: under the allowlist the thread may not install
    // another filter.
    for p in refusing.iter().chain([&program]) {
        seccompiler::apply_filter(p).map_err(|e| SeccompError::Install(e.to_string()))?;
    }
    Ok(())
}

/// The SIGSYS part of `siginfo_t` (the kernel's `_sigsys`), which the libc
/// crate does not expose.
#[repr(C)]
struct SigsysInfo {
    _signo: i32,
    _errno: i32,
    _code: i32,
    _pad: i32,
    _call_addr: u64,
    syscall: i32,
    _arch: u32,
}

/// A fixed buffer the handler formats into: no allocation, no locks.
struct Line {
    buf: [u8; 256],
    len: usize,
}

impl Line {
    fn text(&mut self, s: &[u8]) {
        for &b in s {
            if self.len < self.buf.len() {
                self.buf[self.len] = b;
                self.len += 1;
            }
        }
    }

    fn number(&mut self, mut v: u64, radix: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b"0123456789abcdef"[(v % radix) as usize];
            v /= radix;
            if v == 0 {
                break;
            }
        }
        self.text(&digits[i..]);
    }
}

/// SIGSYS from SECCOMP_RET_TRAP: says which thread made which system call
/// and ends the process with status 2. Async-signal-safe: it formats into a
/// stack buffer and makes only write, gettid and exit_group, which every
/// allowlist has.
extern "C" fn sigsys_handler(
    _: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    // SAFETY: the kernel passes a valid siginfo_t for a SA_SIGINFO handler;
    // for SIGSYS its union holds `_sigsys`, whose layout SigsysInfo mirrors,
    // and siginfo_t (128 bytes) is larger than SigsysInfo.
    let nr = unsafe { (*info.cast::<SigsysInfo>()).syscall };
    // SAFETY: the third argument of a SA_SIGINFO handler is the interrupted
    // context, a ucontext_t; RSI held the call's second argument.
    let arg1 = unsafe {
        (*context.cast::<libc::ucontext_t>()).uc_mcontext.gregs[libc::REG_RSI as usize] as u64
    };
    let mut line = Line {
        buf: [0; 256],
        len: 0,
    };
    line.text(b"seccomp: thread ");
    let name = THREAD_NAME.with(Cell::get);
    let name_len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    line.text(&name[..name_len]);
    line.text(b" (tid ");
    // SAFETY: gettid has no preconditions.
    line.number(unsafe { libc::gettid() } as u64, 10);
    line.text(b") made syscall ");
    line.number(nr as u64, 10);
    if i64::from(nr) == libc::SYS_ioctl {
        line.text(b" (ioctl, request 0x");
        line.number(arg1 & 0xffff_ffff, 16);
        line.text(b")");
    }
    line.text(
        b", which its seccomp allowlist lacks; lwpvmm stops. Rerun with --seccomp log \
          to list every missing call, and report it (docs/security.md)\n",
    );
    // SAFETY: writes a valid buffer to stderr, then exits without running
    // anything else of this process.
    unsafe {
        libc::write(2, line.buf.as_ptr().cast(), line.len);
        libc::_exit(2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// docs/security.md's lists of each thread's system calls are the
    /// filters' lists: a call added to a filter without the table (or the
    /// other way round) fails here.
    #[test]
    fn the_security_doc_lists_every_filter() {
        let doc = include_str!("../../../docs/security.md");
        // The bullet that starts with `lead`, up to the next bullet or
        // blank line: its lower-case words in backticks.
        let listed = |lead: &str| -> BTreeSet<String> {
            let start = doc
                .find(lead)
                .unwrap_or_else(|| panic!("no bullet {lead:?} in docs/security.md"));
            let rest = &doc[start + 2..];
            let end = [rest.find("\n- "), rest.find("\n\n")]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(rest.len());
            rest[..end]
                .split('`')
                .skip(1)
                .step_by(2)
                .flat_map(str::split_whitespace)
                .filter(|w| {
                    w.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                })
                .map(str::to_owned)
                .collect()
        };
        let names = |list: &[(&str, i64)]| -> BTreeSet<String> {
            list.iter().map(|(n, _)| (*n).to_owned()).collect()
        };
        let mut api = names(API);
        // The API's openat has a rule of its own (the flags it may pass).
        api.insert("openat".into());
        // (the doc's bullet, the filter's list)
        let table = [
            ("- every thread:", names(COMMON)),
            ("- the control thread adds:", names(CONTROL)),
            ("- the device thread adds:", names(DEVICE)),
            ("- the vsock thread adds:", names(VSOCK)),
            ("- the API thread", api),
        ];
        for (lead, want) in table {
            assert_eq!(listed(lead), want, "docs/security.md {lead:?}");
        }
        // Each list's names are its numbers' (the macro's work).
        assert!(COMMON.contains(&("brk", libc::SYS_brk)));
        assert!(API.contains(&("accept4", libc::SYS_accept4)));
    }

    #[test]
    fn filters_build() {
        for kind in [
            ThreadKind::Vcpu,
            ThreadKind::Control,
            ThreadKind::Device,
            ThreadKind::Api,
            ThreadKind::Vsock,
        ] {
            for mode in [SeccompMode::On, SeccompMode::Log] {
                let program = build(kind, mode).unwrap();
                assert!(program.len() > 10, "{kind:?} {mode:?}");
            }
        }
        assert!(refusal().unwrap().len() > 3);
    }

    #[test]
    fn ioctl_numbers_match_the_kernel_headers() {
        // (name, request as the kernel's headers give it on x86-64)
        let table = [
            ("KVM_RUN", 0xae80),
            ("KVM_GET_REGS", 0x8090_ae81),
            ("KVM_SET_REGS", 0x4090_ae82),
            ("KVM_GET_SREGS", 0x8138_ae83),
            ("KVM_SIGNAL_MSI", 0x4020_aea5),
            ("KVM_IRQ_LINE", 0x4008_ae61),
            ("KVM_SET_GSI_ROUTING", 0x4008_ae6a),
            ("KVM_GET_CLOCK", 0x8030_ae7c),
            ("KVM_GET_VCPU_EVENTS", 0x8040_ae9f),
            // What the CPL0 LDMXCSR lwpvmm carries out writes.
            ("KVM_SET_XSAVE", 0x5000_aea5),
        ];
        let all: Vec<(&str, u64)> = ioctls(ThreadKind::Vcpu)
            .into_iter()
            .chain(ioctls(ThreadKind::Control))
            .collect();
        for (name, want) in table {
            let got = all.iter().find(|(n, _)| *n == name).map(|&(_, r)| r);
            assert_eq!(got, Some(want), "{name}");
        }
    }

    #[test]
    fn numbers_format_in_any_radix() {
        let mut line = Line {
            buf: [0; 256],
            len: 0,
        };
        for (v, radix) in [(0, 10), (16, 10), (0xae80, 16), (u64::MAX, 16)] {
            line.number(v, radix);
            line.text(b" ");
        }
        assert_eq!(
            &line.buf[..line.len],
            b"0 16 ae80 ffffffffffffffff ".as_slice()
        );
    }
}
