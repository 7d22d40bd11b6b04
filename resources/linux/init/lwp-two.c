/*
 * Two processes with their own LWPCBs and rings, forced to alternate on one
 * vCPU with sched_yield(): each ring holds only its own records, all of
 * them. The child's LWPCB and ring live at other addresses than the
 * parent's, so a record stored with the wrong task's state would land
 * outside the ring checked. The rings are too small for every round, so
 * the last rounds find them full: MissedEvents must count those across the
 * context switches between them.
 */
#include "lwp.h"

#define ROUNDS 40
#define SLOTS 32
#define FIT (SLOTS - 1)

static struct lwpcb cbs[2] __attribute__((aligned(64)));
static struct lwp_record rings[2][SLOTS] __attribute__((aligned(4096)));

static unsigned int carry;

static void work(int who)
{
	struct lwpcb *cb = &cbs[who];
	struct lwp_record *ring = rings[who];
	unsigned int i;

	memset(cb, 0, sizeof(*cb));
	memset(ring, 0, sizeof(rings[who]));
	cb->flags = LWP_VAL;
	cb->buffer_size = sizeof(rings[who]);
	cb->buffer_base = (unsigned long long)ring;
	__llwpcb(cb);
	for (i = 0; i < ROUNDS; i++) {
		carry += __lwpins32(i, 0x1000 * (who + 1) + i, 0);
		sched_yield();
	}
	__slwpcb();
}

static int report(int who)
{
	struct lwpcb *cb = &cbs[who];
	struct lwp_record *ring = rings[who];
	unsigned int i, mine = 0;

	for (i = 0; i < FIT; i++)
		mine += ring[i].event_id == LWP_EVENT_INSERT &&
			ring[i].data1 == 0x1000 * (who + 1) + i &&
			ring[i].data2 == i;
	printf("  %s: head %u, %u of %u records its own\n",
	       who ? "child" : "parent", cb->head, mine, FIT);
	check_eq(who ? "child: CF=1 for each round the full ring refused" :
		       "parent: CF=1 for each round the full ring refused",
		 carry, ROUNDS - FIT);
	check_eq(who ? "child: head counts exactly its records" :
		       "parent: head counts exactly its records",
		 cb->head, FIT * sizeof(struct lwp_record));
	check_eq(who ? "child: every record its own, in order" :
		       "parent: every record its own, in order", mine, FIT);
	check_eq(who ? "child: MissedEvents kept across the switches" :
		       "parent: MissedEvents kept across the switches",
		 cb->missed, ROUNDS - FIT);
	return summary(who ? "lwp-two child" : "lwp-two parent");
}

int main(void)
{
	int status = 0, parent;
	pid_t pid = fork();

	if (pid < 0)
		return 2;
	if (pid == 0) {
		work(1);
		return report(1);
	}
	work(0);
	/* Report after the child has: the two would interleave their output. */
	waitpid(pid, &status, 0);
	parent = report(0);
	passed = failed = 0;
	check("the child passed", WIFEXITED(status) && WEXITSTATUS(status) == 0);
	return parent | summary("lwp-two");
}
