/*
 * A process that records while it migrates from CPU to CPU every couple
 * of milliseconds (sched_setaffinity): its LWP state moves with it, so its
 * records are all there and in order, its ring position and MissedEvents
 * carry on across CPUs, and MissedEvents is exact once the ring is full.
 * Meanwhile a bystander process records into its own ring on the last
 * CPU: nothing of the migrating process lands there.
 */
#include "smp.h"

#define ROUNDS 1500
#define SLOTS 512
#define FIT (SLOTS - 1)
#define BYSTANDER_RECORDS 100
#define MIGRATE_US 2000

static struct lwpcb cb __attribute__((aligned(64)));
static struct lwp_record ring[SLOTS] __attribute__((aligned(4096)));
static struct lwpcb other_cb __attribute__((aligned(64)));
static struct lwp_record other_ring[128] __attribute__((aligned(4096)));

struct shared {
	int ready;
	volatile int done;
};

static int bystander(int cpu, struct shared *sh)
{
	unsigned int i, mine;

	pin_to(cpu);
	start_lwp(&other_cb, other_ring, sizeof(other_ring));
	barrier(&sh->ready, 2);
	for (i = 0; i < BYSTANDER_RECORDS; i++) {
		__lwpins32(i, 0xc1, 0);
		sched_yield();
	}
	__llwpcb(0);
	while (!sh->done)
		sched_yield();
	mine = own_records(other_ring, BYSTANDER_RECORDS, 0xc1);
	check_eq("bystander: every record its own, in order", mine,
		 BYSTANDER_RECORDS);
	check_eq("bystander: nothing past its records",
		 other_ring[BYSTANDER_RECORDS].event_id, 0);
	check_eq("bystander: head counts exactly its records", other_cb.head,
		 BYSTANDER_RECORDS * sizeof(struct lwp_record));
	return summary("lwp-migrate bystander");
}

int main(void)
{
	int cpus = online_cpus(), status = -1, cpu = 0, moves = 0, visited = 0;
	int recorded_on = 0;
	unsigned long long seen = 0, last;
	unsigned int i, carry = 0, mine;
	struct shared *sh = shared_memory(sizeof(*sh));
	pid_t pid;

	if (cpus < 1 || !sh)
		return 2;
	pid = fork();
	if (pid < 0)
		return 2;
	if (pid == 0)
		return bystander(cpus - 1, sh);
	pin_to(cpu);
	start_lwp(&cb, ring, sizeof(ring));
	barrier(&sh->ready, 2);
	last = now_us();
	for (i = 0; i < ROUNDS; i++) {
		carry += __lwpins32(i, 0xc0, 0);
		/* System calls are slow on kvm_pvm: look every 8 records. */
		if (i % 8)
			continue;
		if (current_cpu() < 64)
			seen |= 1ull << current_cpu();
		if (now_us() - last >= MIGRATE_US) {
			cpu = (cpu + 1) % cpus;
			moves += pin_to(cpu) == 0;
			last = now_us();
		}
	}
	__llwpcb(0);
	sh->done = 1;
	for (; seen; seen &= seen - 1)
		visited++;
	mine = own_records(ring, FIT, 0xc0);
	for (cpu = 0; cpu < cpus; cpu++)
		recorded_on += records_on(ring, FIT, cpu) > 0;
	printf("  %u records, %d migrations, %d CPUs visited, the ring's records made on %d: head %u, missed %llu\n",
	       ROUNDS, moves, visited, recorded_on, cb.head, cb.missed);
	check("migrated between every CPU while recording",
	      visited == (cpus < 64 ? cpus : 64) && moves >= 2 * cpus - 1);
	check("the records kept were made on more than one CPU (CoreId)",
	      recorded_on >= (cpus < 2 ? cpus : 2));
	check_eq("the first records are all there, in order", mine, FIT);
	check_eq("head stopped where the ring filled", cb.head,
		 FIT * sizeof(struct lwp_record));
	check_eq("MissedEvents counts exactly the records that did not fit",
		 cb.missed, ROUNDS - FIT);
	check_eq("CF=1 for exactly those", carry, ROUNDS - FIT);
	waitpid(pid, &status, 0);
	check("the bystander passed", WIFEXITED(status) && WEXITSTATUS(status) == 0);
	return summary("lwp-migrate");
}
