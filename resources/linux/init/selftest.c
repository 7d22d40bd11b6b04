/*
 * /init of lwpvmm's Linux guest: the LWP self-test.
 *
 * Built freestanding against the kernel's nolibc (no libc, no AVX: kvm_pvm
 * does not preserve AVX state across guest processes). It checks what a
 * Linux program can see of the LWP that lwpvmm emulates, prints one line per
 * check, then the summary line the host-side tests look for, and powers
 * off.
 *
 * It first loads the lwpvmm guest module (/lwpvmm.ko, built from
 * resources/linux/module against this kernel, which carries no guest patch),
 * which gives processes LWP, and powers the VM off at the end. A
 * distribution kernel builds as modules what ours builds in: the drivers
 * its checks use (/dev/cpu/N/cpuid and msr) and virtio-mmio's block stack
 * come from its package, as /NAME.ko, loaded first when the initramfs has
 * them (resources/linux/stock.sh puts them there).
 *
 * It prints `lwp-linux-selftest: kernel RELEASE` (uname -r), so a log says
 * which kernel ran it.
 *
 * It prints `lwp-linux-selftest: cpus N`, N counted as
 * sysconf(_SC_NPROCESSORS_ONLN) counts, and checks that every CPU's CPUID
 * topology names it by its APIC ID and that the kernel enabled LWP on each.
 *
 * User-mode CPUID runs natively on nested hosts such as kvm_pvm and returns
 * the host's leaves, so the leaves are read through /dev/cpu/N/cpuid, whose
 * driver executes CPUID in the kernel, and /proc/lwp_cpuid (the module)
 * must give the same leaf 0x8000001C.
 *
 * /sysentry checks that our host-quirk patch 0001 cannot be abused by a
 * process that jumps to the SYSCALL entry itself.
 *
 * Then, when the leaf says the OS enabled LWP (EAX.LwpAvail), it runs the
 * LWP programs (unmodified -mlwp programs, each a check of its own, one of
 * them a 32-bit program), and when the leaf offers IRE and BRE (`--lwp
 * precise`) the precise-event program too; without LwpAvail they are not
 * run, and say so. With `lwpsnap=1` on the kernel
 * command line (the kernel hands it to /init's environment) it writes
 * lwpvmm's snapshot debug port halfway through them, so that a run with
 * --snapshot-on-port snapshots a busy SMP guest.
 *
 * It prints the boot's ID (/proc/sys/kernel/random/boot_id). Booted from a
 * disk (the root is ext4), it also writes that line and the summary line to
 * /lwp-selftest.result and flushes them to the disk before powering off.
 *
 * `lwpdisk=MODE` and `lwpnet=PORT` run the device programs instead of the
 * self-test (/lwp-disk and /lwp-net, for the device tests and benchmark);
 * `lwpvsock=PORT` starts /lwp-vsock in the background beside it, and
 * `lwpvsockonly=PORT` runs it alone (the vsock benchmark).
 */
#include <linux/reboot.h>
#include <linux/utsname.h>
#include <asm/ioctls.h>

/* The self-test's own check lines are not indented. */
#define CHECK_INDENT ""
#include "smp.h"

#define LEAF_EXT_FEATURES 0x80000001u
#define LEAF_LWP 0x8000001cu
#define EXT_FEATURES_ECX_LWP (1u << 15)
#define MSR_LWP_CFG 0xc0000105u
#define MSR_LWP_CBADDR 0xc0000106u
/* What the module enables in LWP_CFG when it runs LWP for user tasks: the
 * event enables, CONT and PTSC the leaf offers, and INT, delivered on the
 * CPU's threshold line (so without a vector), on the CPUs that have one
 * (lwpvmm's leaf 0x40000102.EBX counts them). */
#define LWP_CFG_ENABLES 0x6000007eu
#define LWP_CFG_INT (1u << 31)
#define LWP_CFG_COREID_SHIFT 32
#define LWP_IRE_BRE (3u << 2)
#define LEAF_PV_LINES 0x40000102u
/* lwpvmm's snapshot debug port (docs/pv-abi.md). */
#define SNAPSHOT_PORT 0x5a

/* Reads a small file whole, NUL-terminated; its length or -1. */
static ssize_t slurp(const char *path, char *buf, size_t size)
{
	int fd = open(path, O_RDONLY);
	ssize_t len = 0, n;

	if (fd < 0)
		return -1;
	while (len < (ssize_t)size - 1 &&
	       (n = read(fd, buf + len, size - 1 - len)) > 0)
		len += n;
	close(fd);
	buf[len] = 0;
	return len;
}

/* "/dev/cpu/N/" followed by `file`. */
static void cpu_path(char *out, int cpu, const char *file)
{
	strcpy(out, "/dev/cpu/");
	strncat(out, itoa(cpu), 8);
	strncat(out, "/", 1);
	strncat(out, file, 8);
}

/* Reads the four registers of a CPUID leaf (and subleaf) as the kernel of
 * CPU `cpu` sees them: the driver's file offset is subleaf << 32 | leaf. */
static int cpuid_on(int cpu, unsigned int leaf, unsigned int subleaf,
		    unsigned int regs[4])
{
	char path[32];
	off_t at = (off_t)((unsigned long long)subleaf << 32 | leaf);
	int fd, ok;

	cpu_path(path, cpu, "cpuid");
	fd = open(path, O_RDONLY);
	ok = fd >= 0 && lseek(fd, at, SEEK_SET) == at && read(fd, regs, 16) == 16;
	if (fd >= 0)
		close(fd);
	return ok;
}

static int cpuid(unsigned int leaf, unsigned int regs[4])
{
	return cpuid_on(0, leaf, 0, regs);
}

/* An MSR access on CPU `cpu` through /dev/cpu/N/msr, which lwpvmm answers. */
static int msr_on(int cpu, unsigned int index, unsigned long long *value,
		  int write_it)
{
	char path[32];
	int fd, ok;

	cpu_path(path, cpu, "msr");
	fd = open(path, write_it ? O_WRONLY : O_RDONLY);
	ok = fd >= 0 && lseek(fd, index, SEEK_SET) == (off_t)index &&
	     (write_it ? write(fd, value, 8) : read(fd, value, 8)) == 8;
	if (fd >= 0)
		close(fd);
	return ok;
}

static int msr(unsigned int index, unsigned long long *value, int write_it)
{
	return msr_on(0, index, value, write_it);
}

/* Whether CPU `cpu`'s CPUID names it by APIC ID `cpu` in one package of
 * `cpus` cores (leaves 1, 0xB and 0x8000001E, as lwpvmm's MADT does). */
static int topology_agrees(int cpu, int cpus)
{
	unsigned int l1[4], smt[4], core[4], amd[4];
	unsigned int id = (unsigned int)cpu;

	if (!cpuid_on(cpu, 1, 0, l1) || !cpuid_on(cpu, 0xb, 0, smt) ||
	    !cpuid_on(cpu, 0xb, 1, core) || !cpuid_on(cpu, 0x8000001e, 0, amd))
		return 0;
	if (l1[1] >> 24 == id && smt[3] == id && core[3] == id &&
	    (core[1] & 0xffff) == (unsigned int)cpus && amd[0] == id)
		return 1;
	printf("  CPU %d: leaf 1 EBX %x, 0xb EDX %x/%x EBX %x, 0x8000001e EAX %x\n",
	       cpu, l1[1], smt[3], core[3], core[1], amd[0]);
	return 0;
}

/* The "processor" lines of /proc/cpuinfo. */
static int cpuinfo_processors(void)
{
	static char buf[16384];
	int n = 0;
	char *p = buf;

	if (slurp("/proc/cpuinfo", buf, sizeof(buf)) < 0)
		return -1;
	for (; *p; p++)
		n += (p == buf || p[-1] == '\n') && strncmp(p, "processor", 9) == 0;
	return n;
}

/* "eax=%08x ebx=%08x ecx=%08x edx=%08x\n" (nolibc has no snprintf). */
static void leaf_line(char *out, const unsigned int regs[4])
{
	static const char *const names[4] = { "eax=", " ebx=", " ecx=", " edx=" };
	int r, i;

	for (r = 0; r < 4; r++) {
		strcpy(out, names[r]);
		out += strlen(names[r]);
		for (i = 7; i >= 0; i--)
			*out++ = "0123456789abcdef"[(regs[r] >> (4 * i)) & 0xf];
	}
	*out++ = '\n';
	*out = 0;
}

/* Whether the "flags" line of /proc/cpuinfo holds the word "lwp". */
static int cpuinfo_has_lwp(void)
{
	static char buf[8192];
	char *line, *p;

	if (slurp("/proc/cpuinfo", buf, sizeof(buf)) < 0)
		return 0;
	for (line = buf; *line; line = p + 1) {
		for (p = line; *p && *p != '\n'; p++)
			;
		if (strncmp(line, "flags", 5) == 0) {
			char *w;

			for (w = line; w + 4 <= p; w++)
				if (w[0] == ' ' && strncmp(w + 1, "lwp", 3) == 0 &&
				    (w + 4 == p || w[4] == ' '))
					return 1;
			return 0;
		}
		if (!*p)
			break;
	}
	return 0;
}

/* Runs a program with `argv` (its own name when 0); whether it exited 0. */
static int run_program(const char *path, char **argv, char **envp)
{
	char *own[] = { (char *)path, 0 };
	int status = -1;

	if (!argv)
		argv = own;
	pid_t pid = fork();

	if (pid == 0) {
		execve(path, argv, envp);
		printf("cannot run %s\n", path);
		exit(127);
	}
	if (pid < 0 || waitpid(pid, &status, 0) != pid)
		return 0;
	if (status)
		printf("  %s: wait status %x\n", path, status);
	return status == 0;
}

/* The value of `name` in the environment, or 0. */
static const char *env_value(char **envp, const char *name)
{
	size_t len = strlen(name);

	for (; *envp; envp++)
		if (strncmp(*envp, name, len) == 0 && (*envp)[len] == '=')
			return *envp + len + 1;
	return 0;
}

/* Whether `name=1` is in the environment. */
static int env_set(char **envp, const char *name)
{
	const char *v = env_value(envp, name);

	return v && strcmp(v, "1") == 0;
}

static void power_off(void)
{
	/* Power-off does not wait for the console: what the serial driver
	 * still holds (it transmits on interrupts, which a loaded host
	 * delivers late) would be lost. TCSBRK with 1 is tcdrain(). */
	ioctl(1, TCSBRK, (void *)1);
	reboot(LINUX_REBOOT_CMD_POWER_OFF);
	exit(1);
}

/* The guest's monotonic clock in milliseconds: a restored guest's goes on
 * from where the snapshot left it, however long the snapshot waited
 * (docs/snapshot.md). */
static unsigned long long monotonic_ms(void)
{
	struct timespec ts = { 0 };

	/* CLOCK_MONOTONIC is 1. */
	my_syscall2(__NR_clock_gettime, 1, &ts);
	return (unsigned long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Asks lwpvmm for a snapshot here (--snapshot-on-port): the debug port,
 * opened to this process with ioperm. Both lines carry the monotonic
 * clock, so a restore's time jump shows. */
static void snapshot_point(void)
{
	if (my_syscall3(__NR_ioperm, SNAPSHOT_PORT, 1, 1) != 0) {
		printf("snapshot point: ioperm refused\n");
		return;
	}
	printf("snapshot point at %llu ms\n", monotonic_ms());
	ioctl(1, TCSBRK, (void *)1);
	__asm__ volatile("outb %%al, %0" ::"i"(SNAPSHOT_PORT), "a"(0));
	printf("after the snapshot point at %llu ms\n", monotonic_ms());
}

/* The LWP_CFG the module writes on CPU `cpu` when the leaf enables LWP;
 * `lines` CPUs have a threshold line. */
static unsigned long long kernel_cfg(const unsigned int lwp[4], int cpu, int lines)
{
	unsigned long long value = lwp[3] & LWP_CFG_ENABLES;

	if (!(lwp[0] & 1))
		return 0;
	if ((lwp[3] & LWP_CFG_INT) && cpu < lines)
		value |= LWP_CFG_INT;
	return value | (unsigned long long)(cpu & 0xff) << LWP_CFG_COREID_SHIFT;
}

/* Whether `needle` occurs in `hay` (nolibc has no strstr). */
static int contains(const char *hay, const char *needle)
{
	size_t n = strlen(needle);

	for (; *hay; hay++)
		if (strncmp(hay, needle, n) == 0)
			return 1;
	return 0;
}

/* Whether / is the ext4 of a disk rather than the initramfs. */
static int root_is_disk(void)
{
	static char buf[4096];

	return slurp("/proc/mounts", buf, sizeof(buf)) > 0 &&
	       contains(buf, " / ext4 ");
}

/* Writes the boot ID and summary lines to /lwp-selftest.result and makes
 * them durable: fsync of the file, then sync of the file system. */
static void write_result(const char *boot_line, const char *summary_line)
{
	int fd = open("/lwp-selftest.result", O_WRONLY | O_CREAT | O_TRUNC, 0644);
	int ok = fd >= 0;

	if (ok) {
		ok = write(fd, boot_line, strlen(boot_line)) == (ssize_t)strlen(boot_line) &&
		     write(fd, summary_line, strlen(summary_line)) ==
			     (ssize_t)strlen(summary_line) &&
		     fsync(fd) == 0;
		close(fd);
	}
	my_syscall0(__NR_sync);
	printf("lwp-linux-selftest: result %s /lwp-selftest.result\n",
	       ok ? "written to" : "could not be written to");
}

/* Loads the module at PATH: whether the kernel took it. */
static int load_module(const char *path)
{
	int fd = open(path, O_RDONLY);
	long ret = fd < 0 ? -1 : my_syscall3(__NR_finit_module, fd, "", 0);

	if (fd >= 0)
		close(fd);
	if (ret)
		printf("  finit_module %s: %ld\n", path, ret);
	return ret == 0;
}

/*
 * The drivers a distribution kernel builds as modules and the checks use,
 * in the order they depend on each other; ours builds them in, and its
 * initramfs has none of these files.
 */
static void load_package_modules(void)
{
	static const char *const modules[] = {
		"/cpuid.ko",	   "/msr.ko",	      "/virtio_ring.ko",
		"/virtio.ko",	   "/virtio_mmio.ko", "/virtio_blk.ko",
	};
	unsigned int i;

	for (i = 0; i < sizeof(modules) / sizeof(modules[0]); i++) {
		int fd = open(modules[i], O_RDONLY);

		if (fd < 0)
			continue;
		close(fd);
		printf("lwp-linux-selftest: package module %s %s\n", modules[i],
		       load_module(modules[i]) ? "loaded" : "NOT loaded");
	}
}

/* Prints the kernel's release, as uname -r does. */
static void kernel_line(void)
{
	struct new_utsname u;

	if (my_syscall1(__NR_uname, &u) == 0)
		printf("lwp-linux-selftest: kernel %s\n", u.release);
	else
		printf("lwp-linux-selftest: kernel unknown (uname failed)\n");
}

/*
 * Runs /NAMES[0] and /NAMES[1] side by side with SECONDS as their argument,
 * then powers off, saying "TAG: done" or "TAG: FAILED" first.
 */
static void two_programs(const char *tag, const char *const names[2], const char *seconds,
			 char **envp)
{
	pid_t pids[2];
	int i, status, ok = 1;

	printf("%s: running %s and %s for %s s\n", tag, names[0], names[1], seconds);
	for (i = 0; i < 2; i++) {
		char *args[] = { (char *)names[i], (char *)seconds, 0 };

		pids[i] = fork();
		if (pids[i] == 0) {
			execve(names[i], args, envp);
			printf("cannot run %s\n", names[i]);
			exit(127);
		}
	}
	for (i = 0; i < 2; i++)
		ok &= pids[i] > 0 && waitpid(pids[i], &status, 0) == pids[i] && status == 0;
	printf("%s: %s\n", tag, ok ? "done" : "FAILED");
	power_off();
}

/* Runs /NAME with `value` as its argument, then powers off. */
static void device_program(const char *name, const char *value, char **envp)
{
	char *args[] = { (char *)name, (char *)value, 0 };

	run_program(name, args, envp);
	power_off();
}

int main(int argc, char **argv, char **envp)
{
	static const char *const programs[] = {
		"/lwp-records", "/lwp-two",	 "/lwp-faults",	 "/lwp-hot",
		"/lwp-pinned",	"/lwp-threshold", "/lwp-threads", "/lwp-migrate",
		"/lwp-storm",	"/lwp-compat32",
	};
	/* The snapshot point comes after this many programs. */
	const unsigned int snapshot_after = 5;
	unsigned int i;
	unsigned int ext[4] = { 0 }, lwp[4] = { 0 }, lines[4] = { 0 };
	unsigned long long cfg = ~0ull, cbaddr = ~0ull, boot_cfg = ~0ull, value;
	char want[64], file[64], boot_id[64], boot_line[128], summary_line[96];
	int cpu, cpus, topology = 1, every_cfg = 1;

	mount("proc", "/proc", "proc", 0, 0);
	mount("devtmpfs", "/dev", "devtmpfs", 0, 0);
	/* Before anything else: it is also what powers the VM off. */
	kernel_line();
	check("the lwpvmm guest module loads", load_module("/lwpvmm.ko"));
	load_package_modules();
	if (env_value(envp, "lwprate")) {
		/* The SMP benchmark's run instead of the self-test. */
		char *rate[] = { "/lwp-rate", (char *)env_value(envp, "lwprate"), 0 };

		run_program(rate[0], rate, envp);
		power_off();
	}
	/* lwpprof=SECONDS: the control API's profile test (/lwp-hot, /lwp-warm). */
	if (env_value(envp, "lwpprof")) {
		static const char *const names[] = { "/lwp-hot", "/lwp-warm" };

		two_programs("lwp-prof", names, env_value(envp, "lwpprof"), envp);
	}
	/*
	 * wholeprof=SECONDS: the whole-guest profile test, one process in the
	 * kernel's read path (CPU 0) and one in its own code (CPU 1), neither
	 * using LWP.
	 */
	if (env_value(envp, "wholeprof")) {
		static const char *const names[] = { "/spin-kernel", "/spin-user" };

		two_programs("whole-prof", names, env_value(envp, "wholeprof"), envp);
	}
	if (env_value(envp, "lwpdisk"))
		device_program("/lwp-disk", env_value(envp, "lwpdisk"), envp);
	if (env_value(envp, "lwpnet"))
		device_program("/lwp-net", env_value(envp, "lwpnet"), envp);
	if (env_value(envp, "lwpvsockonly"))
		device_program("/lwp-vsock", env_value(envp, "lwpvsockonly"), envp);
	if (env_value(envp, "lwpvsock") && fork() == 0) {
		char *args[] = { "/lwp-vsock", (char *)env_value(envp, "lwpvsock"), "quiet", 0 };

		execve(args[0], args, envp);
		printf("cannot run /lwp-vsock\n");
		exit(127);
	}
	printf("LWP self-test starting\n");
	if (slurp("/proc/sys/kernel/random/boot_id", boot_id, sizeof(boot_id)) <= 0)
		strcpy(boot_id, "unknown\n");
	strcpy(boot_line, "lwp-linux-selftest: boot-id ");
	strncat(boot_line, boot_id, sizeof(boot_line) - strlen(boot_line) - 1);
	printf("%s", boot_line);
	cpus = online_cpus();
	printf("lwp-linux-selftest: cpus %d\n", cpus);
	for (cpu = 0; cpu < cpus; cpu++)
		topology &= topology_agrees(cpu, cpus);
	check("every CPU is in /proc/cpuinfo and its CPUID topology names it by its APIC ID",
	      cpus >= 1 && cpuinfo_processors() == cpus && topology);

	check("/proc/cpuinfo flags show lwp", cpuinfo_has_lwp());
	check("CPUID 0x80000001 read in the kernel",
	      cpuid(LEAF_EXT_FEATURES, ext));
	check("CPUID 0x80000001.ECX[15] (LWP) set",
	      (ext[2] & EXT_FEATURES_ECX_LWP) != 0);
	check("CPUID 0x8000001c read in the kernel", cpuid(LEAF_LWP, lwp));
	printf("leaf 0x8000001c: eax=%x ebx=%x ecx=%x edx=%x\n", lwp[0],
	       lwp[1], lwp[2], lwp[3]);
	leaf_line(want, lwp);
	check("/proc/lwp_cpuid gives the same leaf",
	      slurp("/proc/lwp_cpuid", file, sizeof(file)) > 0 &&
		      strcmp(file, want) == 0);
	if (!cpuid(LEAF_PV_LINES, lines))
		lines[1] = 0;
	for (cpu = 0; cpu < cpus; cpu++) {
		every_cfg &= msr_on(cpu, MSR_LWP_CFG, &value, 0) &&
			     value == kernel_cfg(lwp, cpu, (int)lines[1]);
		if (cpu == 0)
			boot_cfg = value;
	}
	check("LWP_CFG reads what the kernel enabled at boot, on every CPU",
	      every_cfg);
	check("LWP_CBADDR reads 0 at boot",
	      msr(MSR_LWP_CBADDR, &cbaddr, 0) && cbaddr == 0);
	value = lwp[3] & LWP_VAL;
	check("LWP_CFG takes a supported enable and reads it back",
	      value && msr(MSR_LWP_CFG, &value, 1) &&
		      msr(MSR_LWP_CFG, &cfg, 0) && cfg == value);
	value = boot_cfg;
	check("LWP_CFG takes the kernel's value back",
	      msr(MSR_LWP_CFG, &value, 1) && msr(MSR_LWP_CFG, &cfg, 0) &&
		      cfg == boot_cfg);

	printf("/sysentry:\n");
	check("/sysentry: only real SYSCALLs run, with user flags (patch 0001 or lwpvmm)",
	      run_program("/sysentry", 0, envp));

	if (lwp[0] & 1) {
		for (i = 0; i < sizeof(programs) / sizeof(programs[0]); i++) {
			if (i == snapshot_after && env_set(envp, "lwpsnap"))
				snapshot_point();
			printf("%s:\n", programs[i]);
			check(programs[i], run_program(programs[i], 0, envp));
		}
		if ((lwp[3] & LWP_IRE_BRE) == LWP_IRE_BRE) {
			printf("/lwp-precise:\n");
			check("/lwp-precise", run_program("/lwp-precise", 0, envp));
		} else {
			printf("/lwp-precise not run: the leaf offers no IRE and BRE\n");
		}
	} else {
		printf("LWP programs not run: CPUID 0x8000001c.EAX has no LwpAvail\n");
	}

	strcpy(summary_line, "lwp-linux-selftest: ");
	strncat(summary_line, itoa(passed), 32);
	strncat(summary_line, " passed, ", 32);
	strncat(summary_line, itoa(failed), 32);
	strncat(summary_line, " failed\n", 32);
	printf("%s", summary_line);
	if (root_is_disk())
		write_result(boot_line, summary_line);
	power_off();
	return 1;
}
