//! Kernel command lines: the defaults for the project's Linux and for any
//! other kernel, what the project's kernel builds in, and the words a host
//! that emulates guest CPL0 adds to a line of the user's own.

/// The default command line of `lwpvmm run`, for the Linux guest kernel
/// built by resources/linux/build.sh. The console is the 8250 at 0x3f8;
/// `reboot=k` reboots through the keyboard controller, which lwpvmm turns
/// into the end of the VM, as it does `panic=-1`'s reboot. The rest works
/// around kvm_pvm, whose CPL0 emulation is slow and incomplete: clearcpuid
/// hides features whose instructions its emulator cannot run (XSAVE is the
/// one that matters; CLAC/STAC, POPCNT and friends would otherwise need
/// emulating in lwpvmm). What the kernel needs on lwpvmm whatever the host
/// is built into it ([`KERNEL_BUILTIN_CMDLINE`]), not here. `noreplace-smp`
/// and `percpu_alloc=page` answer the whole-guest
/// profile of a boot: one vCPU's kernel rewrote every LOCK prefix
/// (`alternatives_smp_module_add`, 6% of it), and each vCPU's per-CPU area
/// was a zeroed 2 MiB unit (`pcpu_embed_first_chunk`, 6%). docs/linux-guest.md
/// has the details.
pub const LINUX_CMDLINE: &str = "console=ttyS0 reboot=k panic=-1 rdinit=/init \
     clearcpuid=145,150,151,154,288,291,296,297,298,308,534,580 \
     no_timer_check rodata=off noreplace-smp percpu_alloc=page";
/// The command line built into the project's kernel (CONFIG_CMDLINE in
/// resources/linux/lwpvmm.config), ahead of the boot loader's, whose words
/// then win: what it needs on lwpvmm on any host, so that a command line
/// of a user's own keeps it. Only `nompscan` (patch 0003: lwpvmm has no MP
/// table). The host's words cannot be built in: Linux 6.1 reads
/// `clearcpuid=` in `early_cpu_init`, before `setup_arch` merges the
/// built-in line, so lwpvmm adds them ([`host_words`]).
pub const KERNEL_BUILTIN_CMDLINE: &str = "nompscan";
/// The default command line of `lwpvmm run` for any other kernel (a
/// distribution's): the console and the VM's end as for ours, and what keeps
/// it off the paths a host that emulates guest CPL0 makes slow or cannot
/// run: no crypto self-tests (`cryptomgr.notests`: over 20 minutes of
/// emulated generic C), the CPU features whose instructions the emulator
/// lacks hidden (ours, and the SIMD extensions a distribution kernel's
/// built-in crypto would use at CPL0: its emulator runs no SSE), and the
/// command-line choices of our own kernel that cost nothing on ordinary
/// KVM; two boot-time checks of the tracing code that its whole-guest
/// profile put at 16% of a boot are left out (`initcall_blacklist`).
/// docs/linux-guest.md ("The command line") has each part.
pub const STOCK_CMDLINE: &str = "console=ttyS0 reboot=k panic=-1 cryptomgr.notests \
     clearcpuid=129,137,145,147,148,150,151,153,154,288,291,296,297,298,307,308,317,520,534,580 \
     no_timer_check rodata=off noreplace-smp percpu_alloc=page \
     initcall_blacklist=ftrace_check_for_weak_functions,trace_eval_init,cubictcp_register,\
     bpf_tcp_ca_kfunc_init,bpf_key_sig_kfuncs_init,bpf_rstat_kfunc_init,kfunc_init,\
     bpf_prog_test_run_init";

/// What the project's build of its Linux guest leaves in the kernel's
/// banner (resources/linux/build.sh's KBUILD_BUILD_USER and _HOST), in a
/// vmlinux and in a bzImage's uncompressed `kernel_version` string alike.
pub(super) const OUR_BUILD: &[u8] = b"(lwpvmm@lwpvmm)";

/// Whether `image` is the project's own kernel build.
pub fn is_our_build(image: &[u8]) -> bool {
    memchr::memmem::find(image, OUR_BUILD).is_some()
}

/// The words of a command line that are the user's choice whatever the
/// host: [`host_words`] never adds them.
pub(super) const CLIENT_KEYS: [&str; 4] = ["console", "reboot", "panic", "rdinit"];

/// The words of [`LINUX_CMDLINE`] that `cmdline` lacks and that our kernel
/// needs on a host that emulates its CPL0 (kvm_pvm): the CPU features whose
/// instructions the emulator lacks hidden (`clearcpuid=`: without it the
/// kernel dies on XRSTOR), and the boot-time paths the emulator makes slow
/// left out. A word whose key (before `=`) the line has already is the
/// user's, as are the console and the VM's end ([`CLIENT_KEYS`]): a
/// Firecracker client's `boot_args` still count.
pub fn host_words(cmdline: &str) -> Vec<&'static str> {
    let key = |word: &str| word.split('=').next().unwrap_or(word).to_owned();
    let given: std::collections::HashSet<String> = cmdline.split_whitespace().map(key).collect();
    LINUX_CMDLINE
        .split_whitespace()
        .filter(|w| {
            let k = key(w);
            !CLIENT_KEYS.contains(&k.as_str()) && !given.contains(&k)
        })
        .collect()
}

/// `lwpvmm run`'s default command line for `image`: ours for the project's
/// kernel, [`STOCK_CMDLINE`] for any other; with a root disk, booting from
/// the first disk (/dev/vda), read-only when the disk is.
pub fn default_cmdline(image: &[u8], root: Option<bool>) -> String {
    match (is_our_build(image), root) {
        (true, None) => LINUX_CMDLINE.to_owned(),
        (true, Some(read_only)) => disk_cmdline(read_only),
        (false, None) => STOCK_CMDLINE.to_owned(),
        // Another kernel's root boots its own init.
        (false, Some(read_only)) => format!("{STOCK_CMDLINE} {}", root_args(read_only)),
    }
}

/// The command line that boots the project's kernel from the first disk
/// (/dev/vda) instead of an initramfs, mounted read-only when the disk is;
/// its /init is the self-test.
pub fn disk_cmdline(read_only: bool) -> String {
    format!("{LINUX_CMDLINE} {} init=/init", root_args(read_only))
}

/// The root file system on the first disk, read-only when the disk is.
pub(super) fn root_args(read_only: bool) -> &'static str {
    if read_only {
        "root=/dev/vda ro"
    } else {
        "root=/dev/vda rw"
    }
}
