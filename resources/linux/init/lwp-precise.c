/*
 * Precise events from an unmodified Linux process (`--lwp precise`):
 * lwpvmm single-steps the process while its LWPCB counts instructions
 * (IRE) and branches (BRE) retired, each trap reaching lwpvmm through the
 * guest module's debug notifier. A loop of known length must be counted
 * exactly: the events one run counts (records times the interval, plus what
 * the counters ran down) less those of a one-iteration run are the loop's
 * 2000 instructions and 1000 branches. Then the same loop under the
 * process's own debugger: a traced child single-stepped by its parent
 * counts the same, and the parent sees every one of its steps and the
 * child's INT3.
 */
#include "lwp.h"

#define LWP_IRE (1u << 2)
#define LWP_BRE (1u << 3)
#define EVENT_IRE 2
#define EVENT_BRE 3
/* The smallest IRE and BRE interval lwpvmm takes (lwp-model.md L4): a
 * record every 16 events. */
#define INTERVAL 15
#define ITERATIONS 1000
#define SLOTS 1024
#define PTRACE_TRACEME 0
#define PTRACE_CONT 7
#define PTRACE_SINGLESTEP 9
#define DEBUGGER_STEPS 50
#ifndef SIGSTOP
#define SIGSTOP 19
#endif
#ifndef SIGTRAP
#define SIGTRAP 5
#endif

/* dec %rdi (3 bytes); jnz back (2 bytes); ret. */
__asm__(".text\n"
	".globl precise_loop\n"
	"precise_loop:\n"
	"	dec %rdi\n"
	"	jnz precise_loop\n"
	".globl precise_loop_ret\n"
	"precise_loop_ret:\n"
	"	ret\n");
extern void precise_loop(unsigned long n);
extern const char precise_loop_ret[];

static struct lwpcb cb __attribute__((aligned(64)));
static struct lwp_record ring[SLOTS] __attribute__((aligned(4096)));

static int stopped_by(int status, int sig)
{
	return (status & 0xff) == 0x7f && ((status >> 8) & 0xff) == sig;
}

/* What one run of the loop left: events counted per EventId, and whether
 * every BRE record inside it names the loop's branch and target. */
struct run {
	unsigned long long ire, bre, cycles;
	int branches_named, missed;
};

static unsigned long long counted(unsigned int id)
{
	unsigned long long records = 0;
	unsigned int i, n = (cb.head - cb.tail) / sizeof(struct lwp_record);

	for (i = 0; i < n; i++)
		records += ring[i].event_id == id;
	return records * (INTERVAL + 1) + INTERVAL -
	       (cb.events[id - 1].counter & 0x3ffffff);
}

static struct run run_loop(unsigned long iterations)
{
	unsigned long long loop = (unsigned long long)precise_loop;
	unsigned long long jnz = loop + 3, end = (unsigned long long)precise_loop_ret;
	struct run r = { 0, 0, 0, 1, 0 };
	unsigned long long t0;
	unsigned int i, n;

	__llwpcb(0);
	memset(&cb, 0, sizeof(cb));
	memset(ring, 0, sizeof(ring));
	cb.flags = LWP_IRE | LWP_BRE;
	cb.buffer_size = sizeof(ring);
	cb.buffer_base = (unsigned long long)ring;
	cb.events[EVENT_IRE - 1].interval = INTERVAL;
	cb.events[EVENT_IRE - 1].counter = INTERVAL;
	cb.events[EVENT_BRE - 1].interval = INTERVAL;
	cb.events[EVENT_BRE - 1].counter = INTERVAL;
	__llwpcb(&cb);
	t0 = __rdtsc();
	precise_loop(iterations);
	r.cycles = __rdtsc() - t0;
	/* LLWPCB 0 flushes the head and the counters into the LWPCB. */
	__llwpcb(0);
	r.ire = counted(EVENT_IRE);
	r.bre = counted(EVENT_BRE);
	r.missed = cb.missed != 0;
	n = (cb.head - cb.tail) / sizeof(struct lwp_record);
	for (i = 0; i < n; i++)
		if (ring[i].event_id == EVENT_BRE && ring[i].ip >= loop && ring[i].ip < end)
			r.branches_named &= ring[i].ip == jnz && ring[i].data2 == loop;
	return r;
}

/* The loop in a child its parent single-steps DEBUGGER_STEPS times before
 * letting it go; the child then runs an INT3, whose SIGTRAP stop its parent
 * must see too. The child's exit status says whether its counts were
 * exact, the return value how many steps the parent saw (-3: no INT3
 * stop). */
static int under_a_debugger(unsigned long long want_ire)
{
	int status = 0, steps = 0;
	pid_t pid = fork();

	if (pid == 0) {
		struct run one, many;

		my_syscall4(__NR_ptrace, PTRACE_TRACEME, 0, 0, 0);
		kill(getpid(), SIGSTOP);
		one = run_loop(1);
		many = run_loop(ITERATIONS + 1);
		__asm__ volatile("int3");
		exit(many.ire - one.ire == want_ire ? 0 : 1);
	}
	if (pid < 0 || waitpid(pid, &status, 0) != pid)
		return -1;
	while (steps < DEBUGGER_STEPS) {
		if (my_syscall4(__NR_ptrace, PTRACE_SINGLESTEP, pid, 0, 0) != 0 ||
		    waitpid(pid, &status, 0) != pid)
			return -1;
		if (!stopped_by(status, SIGTRAP))
			break;
		steps++;
	}
	my_syscall4(__NR_ptrace, PTRACE_CONT, pid, 0, 0);
	if (waitpid(pid, &status, 0) != pid || !stopped_by(status, SIGTRAP)) {
		printf("    after the steps: wait status %x, not the INT3's SIGTRAP\n", status);
		return -3;
	}
	my_syscall4(__NR_ptrace, PTRACE_CONT, pid, 0, 0);
	if (waitpid(pid, &status, 0) != pid || status != 0)
		return -2;
	return steps;
}

int main(void)
{
	unsigned int want = LWP_AVAIL | LWP_IRE | LWP_BRE;
	struct run one, many;

	check("CPUID 0x8000001c.EAX enables IRE and BRE", (lwp_enabled() & want) == want);
	one = run_loop(1);
	many = run_loop(ITERATIONS + 1);
	check_eq("IRE exact for a 2000-instruction loop", many.ire - one.ire,
		 2 * ITERATIONS);
	check_eq("BRE exact for its 1000 branches", many.bre - one.bre, ITERATIONS);
	check("BRE records in the loop name its branch and target", many.branches_named);
	check("no records missed", !one.missed && !many.missed);
	/* The cost of one stepped instruction, for the benchmark. */
	printf("  step from a Linux process: %llu guest TSC cycles per instruction\n",
	       (many.cycles - one.cycles) / (2 * ITERATIONS));
	check_eq("under ptrace: the debugger sees each of its 50 single steps and an INT3, and IRE stays exact",
		 under_a_debugger(2 * ITERATIONS), DEBUGGER_STEPS);
	return summary("lwp-precise");
}
