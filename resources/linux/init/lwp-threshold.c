/*
 * The threshold interrupt: a process whose ring crosses its LWPCB's
 * Threshold gets SIGIO (docs/linux-guest.md). SIGIO's default action ends
 * the process, so a child that crosses the threshold dies of it; one that
 * stays below it exits normally.
 */
#include "lwp.h"

#ifndef SIGIO
#define SIGIO 29
#endif
#define LWP_INT (1u << 31)

static struct lwpcb cb __attribute__((aligned(64)));
static struct lwp_record ring[32] __attribute__((aligned(4096)));

/* Stores `records` records with a threshold of two records, then exits 0. */
static void child(unsigned int records)
{
	unsigned int i;

	memset(&cb, 0, sizeof(cb));
	memset(ring, 0, sizeof(ring));
	cb.flags = LWP_VAL | LWP_INT;
	cb.buffer_size = sizeof(ring);
	cb.buffer_base = (unsigned long long)ring;
	cb.threshold = 2 * sizeof(struct lwp_record);
	__llwpcb(&cb);
	if (cb.flags != (LWP_VAL | LWP_INT))
		exit(2);
	for (i = 0; i < records; i++)
		__lwpins32(i, i, 0);
	exit(0);
}

static int run(unsigned int records)
{
	int status = -1;
	pid_t pid = fork();

	if (pid == 0)
		child(records);
	if (pid < 0 || waitpid(pid, &status, 0) != pid)
		return -1;
	return status;
}

int main(void)
{
	int below, crossing;

	check("CPUID 0x8000001c.EAX enables the threshold interrupt",
	      (lwp_enabled() & LWP_INT) != 0);
	below = run(1);
	check("below the threshold: the child exits normally", below == 0);
	crossing = run(3);
	check("crossing the threshold: SIGIO ends the child",
	      WIFSIGNALED_(crossing) && WTERMSIG_(crossing) == SIGIO);
	if (below || !WIFSIGNALED_(crossing))
		printf("    wait statuses %x and %x\n", below, crossing);
	return summary("lwp-threshold");
}
