/*
 * A process whose LWPCB or ring points at a kernel address, an unmapped
 * page or a read-only page gets SIGSEGV (lwpvmm raises #PF or #GP at the
 * LWP instruction; docs/linux-guest.md), and the kernel and lwpvmm carry
 * on: each case runs in a child, and LWP still works here afterwards.
 */
#include "lwp.h"

#define PAGE 4096

static struct lwpcb cb __attribute__((aligned(64)));
static struct lwp_record ring[32] __attribute__((aligned(4096)));

enum bad { KERNEL_LWPCB, UNMAPPED_LWPCB, READONLY_LWPCB, READONLY_RING, UNMAPPED_RING };

static void *page(int prot)
{
	void *p = mmap(0, PAGE, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	return p == MAP_FAILED ? 0 : p;
}

static void attempt(enum bad what)
{
	struct lwpcb *target = &cb;
	void *p;

	memset(&cb, 0, sizeof(cb));
	cb.flags = LWP_VAL;
	cb.buffer_size = sizeof(ring);
	cb.buffer_base = (unsigned long long)ring;
	switch (what) {
	case KERNEL_LWPCB:
		target = (struct lwpcb *)0xffffffff81000000ull;
		break;
	case UNMAPPED_LWPCB:
		p = page(PROT_READ | PROT_WRITE);
		munmap(p, PAGE);
		target = p;
		break;
	case READONLY_LWPCB:
		p = page(PROT_READ | PROT_WRITE);
		memcpy(p, &cb, sizeof(cb));
		my_syscall3(__NR_mprotect, p, PAGE, PROT_READ);
		target = p;
		break;
	case READONLY_RING:
		cb.buffer_base = (unsigned long long)page(PROT_READ);
		break;
	case UNMAPPED_RING:
		p = page(PROT_READ | PROT_WRITE);
		munmap(p, PAGE);
		cb.buffer_base = (unsigned long long)p;
		break;
	}
	__llwpcb(target);
	__lwpins32(1, 2, 3);
	__slwpcb();
}

int main(void)
{
	static const char *const names[] = {
		"LWPCB at a kernel address: SIGSEGV",
		"LWPCB on an unmapped page: SIGSEGV",
		"LWPCB on a read-only page: SIGSEGV",
		"ring on a read-only page: SIGSEGV",
		"ring on an unmapped page: SIGSEGV",
	};
	int i, status;

	for (i = 0; i < 5; i++) {
		pid_t pid = fork();

		if (pid == 0) {
			attempt(i);
			exit(0);
		}
		status = 0;
		waitpid(pid, &status, 0);
		check(names[i], WIFSIGNALED_(status) && WTERMSIG_(status) == SIGSEGV);
		if (!(WIFSIGNALED_(status) && WTERMSIG_(status) == SIGSEGV))
			printf("    wait status %x\n", status);
	}
	memset(&cb, 0, sizeof(cb));
	cb.flags = LWP_VAL;
	cb.buffer_size = sizeof(ring);
	cb.buffer_base = (unsigned long long)ring;
	__llwpcb(&cb);
	check_eq("afterwards LWPINS still stores here", __lwpins32(5, 6, 7), 0);
	__slwpcb();
	check_eq("and the record is in the ring", ring[0].data1, 6);
	return summary("lwp-faults");
}
