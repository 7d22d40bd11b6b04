//! seccomp filters for lwpvmm's threads (seccompiler, the rust-vmm crate
//! Firecracker uses). Each vCPU thread and the control thread install their
//! own allowlist before they touch guest input; any other system call kills
//! the whole process (SECCOMP_RET_KILL_PROCESS). ioctl is limited to KVM's
//! ioctl type. The lists come from tracing lwpvmm's runs (docs/security.md).

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use thiserror::Error;

/// Which thread a filter is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadKind {
    /// A vCPU thread: KVM_RUN and exit handling.
    Vcpu,
    /// The control thread: event loop, snapshots, shutdown.
    Control,
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
}

/// System calls every lwpvmm thread makes after setup: memory allocation,
/// locks, signals (the vCPU kick, SIGUSR2's pipe), logging and exit.
const COMMON: &[i64] = &[
    libc::SYS_brk,
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

/// What the control thread adds: the event loop, kicking vCPUs, and writing
/// snapshots.
const CONTROL: &[i64] = &[
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_wait,
    libc::SYS_fstat,
    libc::SYS_getrandom,
    libc::SYS_lseek,
    libc::SYS_mkdir,
    libc::SYS_mkdirat,
    libc::SYS_newfstatat,
    libc::SYS_openat,
    libc::SYS_read,
    libc::SYS_recvfrom,
    libc::SYS_statx,
    libc::SYS_tgkill,
];

/// KVM's ioctl type byte (`KVMIO`, bits 15:8 of the request).
const KVMIO: u64 = 0xae;

fn build(kind: ThreadKind) -> Result<BpfProgram, SeccompError> {
    let err = |e: seccompiler::BackendError| SeccompError::Build(e.to_string());
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    let extra: &[i64] = match kind {
        ThreadKind::Vcpu => &[],
        ThreadKind::Control => CONTROL,
    };
    for &nr in COMMON.iter().chain(extra) {
        rules.insert(nr, vec![]);
    }
    let kvm_only = SeccompRule::new(vec![
        SeccompCondition::new(
            1,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::MaskedEq(0xff00),
            KVMIO << 8,
        )
        .map_err(err)?,
    ])
    .map_err(err)?;
    rules.insert(libc::SYS_ioctl, vec![kvm_only]);
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::KillProcess,
        SeccompAction::Allow,
        TargetArch::x86_64,
    )
    .map_err(err)?;
    BpfProgram::try_from(filter).map_err(err)
}

/// Installs the filter for `kind` on the calling thread (and the threads it
/// creates later).
pub fn install(kind: ThreadKind) -> Result<(), SeccompError> {
    let program = build(kind)?;
    seccompiler::apply_filter(&program).map_err(|e| SeccompError::Install(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_build() {
        for kind in [ThreadKind::Vcpu, ThreadKind::Control] {
            let program = build(kind).unwrap();
            assert!(program.len() > 10, "{kind:?}");
        }
    }
}
