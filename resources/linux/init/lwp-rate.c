/*
 * LWPINS throughput for the SMP benchmark (benches/vmm.rs, `smp`):
 * `lwp-rate P` forks P processes, pinned to CPUs 0..P-1 (modulo the CPUs
 * online), each storing RECORDS records into a ring that holds them all,
 * from a common start. It prints
 *   lwp-rate: P processes on C CPUs: N records in T us
 * where T runs from the common start to the last process's end.
 */
#include "smp.h"

#define RECORDS 8192
#define MAX_PROCS 16

static struct lwpcb cb __attribute__((aligned(64)));
static struct lwp_record ring[RECORDS + 1] __attribute__((aligned(4096)));

struct shared {
	int ready;
	unsigned long long start, end[MAX_PROCS];
	unsigned int stored[MAX_PROCS];
};

static int run(int who, int cpu, int procs, struct shared *sh)
{
	unsigned int i;

	pin_to(cpu);
	start_lwp(&cb, ring, sizeof(ring));
	barrier(&sh->ready, procs);
	if (who == 0)
		sh->start = now_us();
	for (i = 0; i < RECORDS; i++)
		__lwpins32(i, who, 0);
	sh->end[who] = now_us();
	__llwpcb(0);
	sh->stored[who] = own_records(ring, RECORDS, (unsigned int)who);
	return sh->stored[who] == RECORDS ? 0 : 1;
}

int main(int argc, char **argv)
{
	const char *arg = argc > 1 ? argv[1] : "1";
	int procs = (int)parse_uint(&arg), cpus = online_cpus(), p, bad = 0;
	unsigned long long last = 0, total = 0;
	struct shared *sh = shared_memory(sizeof(struct shared));

	if (procs < 1 || procs > MAX_PROCS || cpus < 1 || !sh)
		return 2;
	for (p = 1; p < procs; p++)
		if (fork() == 0)
			return run(p, p % cpus, procs, sh);
	bad |= run(0, 0, procs, sh);
	for (p = 1; p < procs; p++) {
		int status = -1;

		wait(&status);
		bad |= status != 0;
	}
	for (p = 0; p < procs; p++) {
		total += sh->stored[p];
		if (sh->end[p] > last)
			last = sh->end[p];
	}
	printf("lwp-rate: %d processes on %d CPUs: %llu records in %llu us\n",
	       procs, cpus, total, last - sh->start);
	return bad;
}
