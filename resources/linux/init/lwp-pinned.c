/*
 * Two processes, pinned to different CPUs (CPU 0 and the last one), record
 * at the same time: each ring holds exactly its own records, all of them,
 * in order. Their LWPCBs and rings live at different addresses, so a record
 * stored with the other CPU's or the other process's state lands outside
 * the ring checked, or carries the other's signature.
 */
#include "smp.h"

#define RECORDS 200
#define SLOTS 256

static struct lwpcb cbs[2] __attribute__((aligned(64)));
static struct lwp_record rings[2][SLOTS] __attribute__((aligned(4096)));

struct shared {
	int ready;
};

/* "parent: " or "child: " followed by `what`, in `out`. */
static const char *named(char *out, int who, const char *what)
{
	strcpy(out, who ? "child: " : "parent: ");
	return strncat(out, what, 72);
}

static int work(int who, int cpu, struct shared *sh)
{
	static const char *const names[2] = { "parent", "child" };
	unsigned int i, carry = 0, tag = 0xa000 + who, mine;
	int stayed;
	char what[80];

	check(who ? "child: pinned" : "parent: pinned",
	      pin_to(cpu) == 0 && current_cpu() == cpu);
	start_lwp(&cbs[who], rings[who], sizeof(rings[who]));
	barrier(&sh->ready, 2);
	for (i = 0; i < RECORDS; i++)
		carry += __lwpins32(i, tag, 0);
	stayed = current_cpu() == cpu;
	__llwpcb(0);
	mine = own_records(rings[who], RECORDS, tag);
	printf("  %s on CPU %d: head %u, %u of %u records its own\n",
	       names[who], cpu, cbs[who].head, mine, RECORDS);
	check_eq(named(what, who, "every record its own, in order"), mine, RECORDS);
	check_eq(named(what, who, "head counts exactly its records"), cbs[who].head, RECORDS * sizeof(struct lwp_record));
	check_eq(named(what, who, "nothing missed, nothing refused"), cbs[who].missed + carry, 0);
	check_eq(named(what, who, "nothing past its records"), rings[who][RECORDS].event_id, 0);
	check(named(what, who, "stayed on its CPU, and its records say so (CoreId)"), stayed && records_on(rings[who], RECORDS, cpu) == RECORDS);
	return summary(who ? "lwp-pinned child" : "lwp-pinned parent");
}

int main(void)
{
	int cpus = online_cpus(), status = -1, parent;
	struct shared *sh = shared_memory(sizeof(*sh));
	pid_t pid;

	if (cpus < 1 || !sh)
		return 2;
	pid = fork();
	if (pid < 0)
		return 2;
	if (pid == 0)
		return work(1, cpus - 1, sh);
	parent = work(0, 0, sh);
	waitpid(pid, &status, 0);
	passed = failed = 0;
	check("the child passed", WIFEXITED(status) && WEXITSTATUS(status) == 0);
	return parent | summary("lwp-pinned");
}
