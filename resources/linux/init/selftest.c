/*
 * /init of lwpvmm's Linux guest: the LWP self-test.
 *
 * Built freestanding against the kernel's nolibc (no libc, no AVX: kvm_pvm
 * does not preserve AVX state across guest processes). It checks what a
 * Linux program can see of the LWP that lwpvmm emulates, prints one line per
 * check, then the summary line the host-side tests look for, and powers
 * off.
 *
 * User-mode CPUID runs natively on nested hosts such as kvm_pvm and returns
 * the host's leaves, so the leaves are read through /dev/cpu/0/cpuid, whose
 * driver executes CPUID in the kernel, and /proc/lwp_cpuid (our kernel
 * patch 0004) must give the same leaf 0x8000001C.
 *
 * /sysentry checks that our host-quirk patch 0001 cannot be abused by a
 * process that jumps to the SYSCALL entry itself.
 *
 * Then, when the leaf says the OS enabled LWP (EAX.LwpAvail), it runs the
 * LWP programs (unmodified -mlwp programs, each a check of its own); without
 * LwpAvail they are not run, and say so.
 */
#include <linux/reboot.h>
#include <asm/ioctls.h>

/* The self-test's own check lines are not indented. */
#define CHECK_INDENT ""
#include "lwp.h"

#define LEAF_EXT_FEATURES 0x80000001u
#define LEAF_LWP 0x8000001cu
#define EXT_FEATURES_ECX_LWP (1u << 15)
#define MSR_LWP_CFG 0xc0000105u
#define MSR_LWP_CBADDR 0xc0000106u
/* What the kernel enables in LWP_CFG when it runs LWP for user tasks: the
 * event enables, CONT and PTSC the leaf offers, and INT with the kernel's
 * threshold vector 0xf5 (patch 0004). */
#define LWP_CFG_ENABLES 0x6000007eu
#define LWP_CFG_INT (1u << 31)
#define LWP_THRESHOLD_VECTOR 0xf5ull

/* Reads the four registers of a CPUID leaf as the kernel sees them. */
static int cpuid(unsigned int leaf, unsigned int regs[4])
{
	int fd = open("/dev/cpu/0/cpuid", O_RDONLY);
	int ok = fd >= 0 && lseek(fd, leaf, SEEK_SET) == (off_t)leaf &&
		 read(fd, regs, 16) == 16;

	if (fd >= 0)
		close(fd);
	return ok;
}

/* An MSR access through /dev/cpu/0/msr, which lwpvmm answers. */
static int msr(unsigned int index, unsigned long long *value, int write_it)
{
	int fd = open("/dev/cpu/0/msr", write_it ? O_WRONLY : O_RDONLY);
	int ok = fd >= 0 && lseek(fd, index, SEEK_SET) == (off_t)index &&
		 (write_it ? write(fd, value, 8) : read(fd, value, 8)) == 8;

	if (fd >= 0)
		close(fd);
	return ok;
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

/* Runs an LWP test program; whether it exited 0. */
static int run_program(const char *path, char **envp)
{
	char *argv[] = { (char *)path, 0 };
	int status = -1;
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

int main(int argc, char **argv, char **envp)
{
	static const char *const programs[] = {
		"/lwp-records", "/lwp-two",	  "/lwp-faults",
		"/lwp-hot",	"/lwp-threshold",
	};
	unsigned int i;
	unsigned int ext[4] = { 0 }, lwp[4] = { 0 };
	unsigned long long cfg = ~0ull, cbaddr = ~0ull, boot_cfg = ~0ull, value;
	char want[64], file[64];

	mount("proc", "/proc", "proc", 0, 0);
	mount("devtmpfs", "/dev", "devtmpfs", 0, 0);
	printf("LWP self-test starting\n");

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
	value = 0;
	if (lwp[0] & 1) {
		value = lwp[3] & LWP_CFG_ENABLES;
		if (lwp[3] & LWP_CFG_INT)
			value |= LWP_CFG_INT | LWP_THRESHOLD_VECTOR << 40;
	}
	check("LWP_CFG reads what the kernel enabled at boot",
	      msr(MSR_LWP_CFG, &boot_cfg, 0) && boot_cfg == value);
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
	check("/sysentry: patch 0001 runs only real SYSCALLs, with user flags",
	      run_program("/sysentry", envp));

	if (lwp[0] & 1) {
		for (i = 0; i < sizeof(programs) / sizeof(programs[0]); i++) {
			printf("%s:\n", programs[i]);
			check(programs[i], run_program(programs[i], envp));
		}
	} else {
		printf("LWP programs not run: CPUID 0x8000001c.EAX has no LwpAvail\n");
	}

	printf("lwp-linux-selftest: %d passed, %d failed\n", passed, failed);
	/* Power-off does not wait for the console: what the serial driver
	 * still holds (it transmits on interrupts, which a loaded host
	 * delivers late) would be lost. TCSBRK with 1 is tcdrain(). */
	ioctl(1, TCSBRK, (void *)1);
	reboot(LINUX_REBOOT_CMD_POWER_OFF);
	return 1;
}
