/*
 * Fork and exec storms on every CPU while the parent records: a forked
 * child starts with LWP off (SLWPCB reads 0 and its LWPINS stores
 * nothing), and may load an LWPCB of its own, whose records land in its
 * own ring only; an exec turns LWP off (the exec'd program finds SLWPCB
 * 0). The parent stores one record per child, pinned to each CPU in turn:
 * its ring holds exactly those records, so no child's record reached it.
 */
#include "smp.h"

#define PER_CPU 5
#define MAX_CPUS 8
#define SLOTS (2 * PER_CPU * MAX_CPUS + 1)

static struct lwpcb cb __attribute__((aligned(64)));
static struct lwp_record ring[SLOTS] __attribute__((aligned(4096)));
static struct lwpcb child_cb __attribute__((aligned(64)));
static struct lwp_record child_ring[32] __attribute__((aligned(4096)));

/* The forked child: exits 0 when LWP was off and its own LWPCB worked. */
static int forked_child(void)
{
	int off = __slwpcb() == 0;
	unsigned char cf = __lwpins32(7, 0xd1, 0);

	start_lwp(&child_cb, child_ring, sizeof(child_ring));
	__lwpins32(0, 0xd2, 0);
	__llwpcb(0);
	return off && !cf && child_cb.head == sizeof(struct lwp_record) &&
			       child_ring[0].data1 == 0xd2 ? 0 : 1;
}

/* The child that execs: loads an LWPCB, then becomes `lwp-storm exec`. */
static void exec_child(char **envp)
{
	char *argv[] = { "/lwp-storm", "exec", 0 };

	start_lwp(&child_cb, child_ring, sizeof(child_ring));
	execve(argv[0], argv, envp);
	exit(127);
}

static int wait_ok(pid_t pid)
{
	int status = -1;

	return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
	       WEXITSTATUS(status) == 0;
}

int main(int argc, char **argv, char **envp)
{
	int cpus = online_cpus(), cpu, i, forks_ok = 0, execs_ok = 0, runs;
	unsigned int n = 0, carry = 0, mine;

	if (argc > 1 && strcmp(argv[1], "exec") == 0)
		return __slwpcb() == 0 ? 0 : 1;
	if (cpus < 1)
		return 2;
	if (cpus > MAX_CPUS)
		cpus = MAX_CPUS;
	runs = cpus * PER_CPU;
	start_lwp(&cb, ring, sizeof(ring));
	for (cpu = 0; cpu < cpus; cpu++) {
		pin_to(cpu);
		for (i = 0; i < PER_CPU; i++) {
			pid_t pid = fork();

			if (pid == 0)
				exit(forked_child());
			carry += __lwpins32(n, 0xd0, 0);
			n++;
			forks_ok += wait_ok(pid);
			pid = fork();
			if (pid == 0)
				exec_child(envp);
			carry += __lwpins32(n, 0xd0, 0);
			n++;
			execs_ok += wait_ok(pid);
		}
	}
	__llwpcb(0);
	mine = own_records(ring, n, 0xd0);
	printf("  %d CPUs, %d forks and %d execs each: head %u, %u of %u records its own\n",
	       cpus, PER_CPU, PER_CPU, cb.head, mine, n);
	check_eq("every forked child started with LWP off, then recorded in its own ring",
		 forks_ok, runs);
	check_eq("every exec turned LWP off", execs_ok, runs);
	check_eq("the parent's ring holds exactly its records, in order", mine, n);
	check_eq("nothing past them", ring[n].event_id, 0);
	check_eq("head counts exactly the parent's records", cb.head,
		 n * sizeof(struct lwp_record));
	check_eq("nothing missed, nothing refused", cb.missed + carry, 0);
	return summary("lwp-storm");
}
