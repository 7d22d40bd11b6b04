/*
 * One process whose threads record at the same time on different CPUs
 * (thread i pinned to CPU i mod N), each with its own LWPCB and ring: LWP
 * is per thread. Each ring holds exactly its thread's records; a new
 * thread starts with LWP off, and the main thread, which loads no LWPCB,
 * stays off while its threads record.
 */
#include "smp.h"

#define THREADS 4
#define RECORDS 150
#define SLOTS 256
#define STACK 16384

static struct lwpcb cbs[THREADS] __attribute__((aligned(64)));
static struct lwp_record rings[THREADS][SLOTS] __attribute__((aligned(4096)));
static char stacks[THREADS][STACK] __attribute__((aligned(16)));
static int tids[THREADS];
static volatile int ready;
static int cpus;

struct outcome {
	int started_off, pinned, stayed;
	unsigned int carry;
};
static struct outcome outcomes[THREADS];

static int thread(void *arg)
{
	int who = (int)(long)arg, cpu = who % cpus;
	struct outcome *o = &outcomes[who];
	unsigned int i;

	o->started_off = __slwpcb() == 0;
	o->pinned = pin_to(cpu) == 0 && current_cpu() == cpu;
	start_lwp(&cbs[who], rings[who], sizeof(rings[who]));
	barrier(&ready, THREADS);
	for (i = 0; i < RECORDS; i++)
		o->carry += __lwpins32(i, 0xb000 + who, 0);
	o->stayed = current_cpu() == cpu;
	__llwpcb(0);
	return 0;
}

int main(void)
{
	int t, all_started = 1, all_off = 1, all_pinned = 1, all_own = 1;
	unsigned int heads_ok = 1, clean = 1;

	cpus = online_cpus();
	if (cpus < 1)
		return 2;
	for (t = 0; t < THREADS; t++)
		all_started &= spawn(thread, (void *)(long)t,
				     stacks[t] + STACK, &tids[t]) > 0;
	check("threads started", all_started);
	if (!all_started)
		return summary("lwp-threads");
	all_off = __slwpcb() == 0;
	for (t = 0; t < THREADS; t++)
		join(&tids[t]);
	for (t = 0; t < THREADS; t++) {
		struct outcome *o = &outcomes[t];
		unsigned int mine = own_records(rings[t], RECORDS, 0xb000 + t);

		printf("  thread %d on CPU %d: head %u, %u of %u records its own\n",
		       t, t % cpus, cbs[t].head, mine, RECORDS);
		all_pinned &= o->pinned && o->stayed &&
			      records_on(rings[t], RECORDS, t % cpus) == RECORDS;
		all_off &= o->started_off;
		all_own &= mine == RECORDS && rings[t][RECORDS].event_id == 0;
		heads_ok &= cbs[t].head == RECORDS * sizeof(struct lwp_record);
		clean &= cbs[t].missed == 0 && o->carry == 0;
	}
	check("each thread ran on its CPU, and its records say so (CoreId)",
	      all_pinned);
	check("LWP off in new threads and in the main thread", all_off);
	check("every ring holds exactly its thread's records, in order", all_own);
	check("each head counts exactly its thread's records", heads_ok);
	check("nothing missed, nothing refused", clean);
	return summary("lwp-threads");
}
