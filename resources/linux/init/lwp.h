/*
 * What the self-test and the LWP test programs of lwpvmm's Linux guest
 * share: the LWP control block and event record as LWP software declares
 * them (EventOffset 128, six events), /proc/lwp_cpuid, and the check helper. Built against the
 * kernel's nolibc with -mlwp, so the LWP instructions are gcc's intrinsics.
 */
#ifndef LWPVMM_LINUX_LWP_H
#define LWPVMM_LINUX_LWP_H

#ifdef __x86_64__
#include <x86intrin.h>
#else
/* 32-bit programs: gcc's stddef.h, which x86intrin.h brings, declares a
 * size_t that nolibc's contradicts; the builtins behind the LWP intrinsics
 * need no header. */
#define __llwpcb(cb) __builtin_ia32_llwpcb(cb)
#define __slwpcb() __builtin_ia32_slwpcb()
#define __lwpins32(d2, d1, f) __builtin_ia32_lwpins32((d2), (d1), (f))
#define __lwpval32(d2, d1, f) __builtin_ia32_lwpval32((d2), (d1), (f))
#endif
#include <asm/ioctls.h>

#define LWP_AVAIL (1u << 0)
#define LWP_VAL (1u << 1)
#define LWP_CNH (1u << 5)
#define LWP_PTSC (1u << 30)
#define LWP_EVENT_VAL 1
#define LWP_EVENT_CNH 5
#define LWP_EVENT_INSERT 255

#ifndef SIGSEGV
#define SIGSEGV 11
#endif
#define WIFSIGNALED_(s) (((s) & 0x7f) != 0 && ((s) & 0x7f) != 0x7f)
#define WTERMSIG_(s) ((s) & 0x7f)

struct lwp_event {
	unsigned int interval, counter;
};

struct lwpcb {
	unsigned int flags, buffer_size;
	unsigned long long buffer_base;
	unsigned int head, reserved0;
	unsigned long long missed;
	unsigned int threshold, filters;
	unsigned long long base_ip, limit_ip, reserved1;
	unsigned int tail, reserved2;
	unsigned long long software[2];
	unsigned char reserved3[40];
	struct lwp_event events[6];
};

struct lwp_record {
	unsigned char event_id, core_id;
	unsigned short flags;
	unsigned int data1;
	unsigned long long ip, data2, timestamp;
};

/* What each check line starts with: the programs' lines are indented under
 * the self-test's. */
#ifndef CHECK_INDENT
#define CHECK_INDENT "  "
#endif

static int passed, failed;

static __attribute__((unused)) void check(const char *name, int ok)
{
	/* One write per line, drained before the next step (TCSBRK with 1 is
	 * tcdrain()): the tty writes the line out from a worker, maybe on
	 * another CPU, and a kernel message that the next step causes (the
	 * msr driver's warning, a segfault report) would otherwise land
	 * inside it. */
	char line[160] = CHECK_INDENT;

	strncat(line, ok ? "ok - " : "not ok - ", 9);
	strncat(line, name, sizeof(line) - strlen(line) - 2);
	strncat(line, "\n", 1);
	write(1, line, strlen(line));
	ioctl(1, TCSBRK, (void *)1);
	if (ok)
		passed++;
	else
		failed++;
}

static __attribute__((unused)) void check_eq(const char *name, unsigned long long got,
		     unsigned long long want)
{
	check(name, got == want);
	if (got != want)
		printf("    got %llx, want %llx\n", got, want);
}

/* CPUID 0x8000001C.EAX as the kernel sees it (/proc/lwp_cpuid), or 0. */
/* Loads `cb` with sampled CPU clocks (CNH) every 2^20 cycles into `ring`
 * of `size` bytes, as the sampling programs (lwp-hot, lwp-warm) do. */
static __attribute__((unused)) void cnh_sampling(struct lwpcb *cb, struct lwp_record *ring,
						unsigned int size)
{
	memset(cb, 0, sizeof(*cb));
	memset(ring, 0, size);
	cb->flags = LWP_CNH;
	cb->buffer_size = size;
	cb->buffer_base = (unsigned long)ring;
	cb->events[LWP_EVENT_CNH - 1].interval = 0xfffff;
	__llwpcb(cb);
}

/* Flushes `cb` and empties its ring of `size` bytes, as a profiler reads
 * it: returns the records it held. */
static __attribute__((unused)) unsigned long long drain_ring(struct lwpcb *cb, unsigned int size)
{
	unsigned long long n;

	__slwpcb();
	n = (cb->head + size - cb->tail) % size / sizeof(struct lwp_record);
	cb->tail = cb->head;
	return n;
}

static __attribute__((unused)) unsigned int lwp_enabled(void)
{
	char buf[64];
	int fd = open("/proc/lwp_cpuid", O_RDONLY);
	ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof(buf) - 1);
	unsigned int v = 0;
	int i;

	if (fd >= 0)
		close(fd);
	if (n < 12 || strncmp(buf, "eax=", 4) != 0)
		return 0;
	for (i = 4; i < 12; i++)
		v = v * 16 + (buf[i] <= '9' ? buf[i] - '0' : buf[i] - 'a' + 10);
	return v;
}

/* The exit status of a test program: 0 when every check passed. */
static __attribute__((unused)) int summary(const char *what)
{
	printf("  %s: %d passed, %d failed\n", what, passed, failed);
	return failed ? 1 : 0;
}

#endif
