/*
 * What the SMP programs of lwpvmm's Linux self-test share: the number of
 * CPUs online, pinning a task to a CPU, the CPU a task runs on, memory
 * shared between processes, threads and a SIGIO handler. nolibc has no
 * sched_setaffinity, getcpu, pthreads or sigaction, so these are the raw
 * system calls.
 */
#ifndef LWPVMM_LINUX_SMP_H
#define LWPVMM_LINUX_SMP_H

#include <linux/sched.h>
#include "lwp.h"

#ifndef SIGIO
#define SIGIO 29
#endif
#define SA_RESTORER_ 0x04000000ul
#define FUTEX_WAIT_ 0
/* A thread shares everything but its stack; its tid word is cleared (and
 * waited on) when it exits. */
#define THREAD_FLAGS                                                    \
	(CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD | \
	 CLONE_SYSVSEM | CLONE_CHILD_CLEARTID)

static __attribute__((unused)) unsigned int parse_uint(const char **p)
{
	unsigned int v = 0;

	while (**p >= '0' && **p <= '9')
		v = v * 10 + (unsigned int)(*(*p)++ - '0');
	return v;
}

/* CPUs online, counted as sysconf(_SC_NPROCESSORS_ONLN) counts them
 * without sysfs (glibc's fallback): the "cpuN" lines of /proc/stat; -1 if
 * unreadable. The kernel has no sysfs: creating it costs seconds of
 * emulated boot on kvm_pvm. */
static __attribute__((unused)) int online_cpus(void)
{
	static char buf[16384];
	size_t len = 0;
	int fd = open("/proc/stat", O_RDONLY);
	int count = 0;
	ssize_t n;

	if (fd < 0)
		return -1;
	while (len < sizeof(buf) - 1 &&
	       (n = read(fd, buf + len, sizeof(buf) - 1 - len)) > 0)
		len += (size_t)n;
	close(fd);
	buf[len] = 0;
	for (const char *p = buf; *p; p++) {
		if ((p == buf || p[-1] == '\n') && p[0] == 'c' && p[1] == 'p' &&
		    p[2] == 'u' && p[3] >= '0' && p[3] <= '9')
			count++;
	}
	return len ? count : -1;
}

/* Pins the calling task to `cpu`; it runs there when this returns 0. */
static __attribute__((unused)) int pin_to(int cpu)
{
	unsigned long mask[4] = { 0 };

	mask[cpu / 64] = 1ul << (cpu % 64);
	return my_syscall3(__NR_sched_setaffinity, 0, sizeof(mask), mask);
}

/* The CPU the calling task runs on (sched_getcpu()). */
static __attribute__((unused)) int current_cpu(void)
{
	unsigned int cpu = ~0u;

	my_syscall3(__NR_getcpu, &cpu, 0, 0);
	return (int)cpu;
}

/* Anonymous memory shared with the children forked after it. */
static __attribute__((unused)) void *shared_memory(size_t size)
{
	void *p = mmap(0, size, PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	return p == MAP_FAILED ? 0 : p;
}

/* Microseconds since an arbitrary start. */
static __attribute__((unused)) unsigned long long now_us(void)
{
	struct timeval tv;

	gettimeofday(&tv, 0);
	return (unsigned long long)tv.tv_sec * 1000000 + tv.tv_usec;
}

/* Starts a thread running fn(arg) on the stack ending at `stack_top`
 * (16-byte aligned); `*tid` is set non-zero now and cleared when the
 * thread exits. Returns the thread's id or a negative errno. */
static __attribute__((unused)) long spawn(int (*fn)(void *), void *arg,
					  void *stack_top, int *tid)
{
	unsigned long *sp = stack_top;
	long ret;
	register long r10 __asm__("r10") = (long)tid;
	register long r8 __asm__("r8") = 0;

	*tid = 1;
	*--sp = (unsigned long)arg;
	*--sp = (unsigned long)fn;
	/* The child pops fn and arg from its new stack, calls fn and ends
	 * itself (exit, not exit_group: the process lives on). */
	__asm__ volatile("syscall\n\t"
			 "test %%rax, %%rax\n\t"
			 "jnz 1f\n\t"
			 "pop %%rax\n\t"
			 "pop %%rdi\n\t"
			 "call *%%rax\n\t"
			 "mov %%eax, %%edi\n\t"
			 "mov %[exit], %%eax\n\t"
			 "syscall\n\t"
			 "ud2\n"
			 "1:"
			 : "=a"(ret)
			 : "0"(__NR_clone), "D"((long)THREAD_FLAGS), "S"(sp),
			   "d"(0), "r"(r10), "r"(r8), [exit] "i"(__NR_exit)
			 : "rcx", "r11", "memory");
	return ret;
}

/* Waits until the thread whose tid word is `tid` has exited. */
static __attribute__((unused)) void join(int *tid)
{
	int v;

	while ((v = *(volatile int *)tid) != 0)
		my_syscall6(__NR_futex, tid, FUTEX_WAIT_, v, 0, 0, 0);
}

/* rt_sigreturn, which a handler returns to (x86-64 requires SA_RESTORER). */
void lwp_sigreturn(void);
__asm__(".text\n"
	".globl lwp_sigreturn\n"
	"lwp_sigreturn:\n\t"
	"mov $15, %eax\n\t"
	"syscall\n\t"
	"ud2\n");

struct kernel_sigaction {
	void (*handler)(int);
	unsigned long flags;
	void (*restorer)(void);
	unsigned long mask;
};

/* Installs `handler` for `sig`. */
static __attribute__((unused)) int on_signal(int sig, void (*handler)(int))
{
	struct kernel_sigaction sa = { handler, SA_RESTORER_, lwp_sigreturn, 0 };

	return my_syscall4(__NR_rt_sigaction, sig, &sa, 0, sizeof(sa.mask));
}

/* Waits, spinning with sched_yield (the other party may share the CPU),
 * until `*count` reaches `n`. */
static __attribute__((unused)) void barrier(volatile int *count, int n)
{
	__sync_fetch_and_add(count, 1);
	while (*count < n)
		sched_yield();
}

/* Counts the records of `ring` (of `slots`) that carry this LWPINS
 * signature, in order from data2 = 0, up to `want`. */
static __attribute__((unused)) unsigned int own_records(
	const struct lwp_record *ring, unsigned int want, unsigned int data1)
{
	unsigned int i, mine = 0;

	for (i = 0; i < want; i++)
		mine += ring[i].event_id == LWP_EVENT_INSERT &&
			ring[i].data1 == data1 && ring[i].data2 == i;
	return mine;
}

/* How many of the first `n` records of `ring` were made on CPU `cpu`
 * (CoreId, which the kernel sets to the CPU's number). */
static __attribute__((unused)) unsigned int records_on(
	const struct lwp_record *ring, unsigned int n, int cpu)
{
	unsigned int i, on = 0;

	for (i = 0; i < n; i++)
		on += ring[i].core_id == (unsigned char)cpu;
	return on;
}

/* Sets up `cb` with `ring` of `bytes` for LWPINS records and loads it. */
static __attribute__((unused)) void start_lwp(struct lwpcb *cb, void *ring,
					      unsigned int bytes)
{
	memset(cb, 0, sizeof(*cb));
	memset(ring, 0, bytes);
	cb->flags = LWP_VAL;
	cb->buffer_size = bytes;
	cb->buffer_base = (unsigned long long)ring;
	__llwpcb(cb);
}

#endif
