/*
 * The second process of the control API's profile test (/init with
 * lwpprof=SECONDS runs it beside /lwp-hot): CNH sampling of warm_leaf,
 * which only warm_caller calls, for SECONDS seconds. A profile fetched
 * from lwpvmm while both run must name warm_leaf from this program's own
 * ELF, hot_4 from lwp-hot's, and warm_caller as warm_leaf's caller: the
 * host unwinds each sample's stack by frame pointers.
 */
#include "lwp.h"

#define SLOTS 256
#define UNIT 200000

static struct lwpcb cb __attribute__((aligned(64)));
static struct lwp_record ring[SLOTS] __attribute__((aligned(4096)));
static volatile unsigned long long sink;
static unsigned long long samples;

/* The same loop as lwp-hot's functions: the sampled address is here. */
static void __attribute__((noinline, aligned(64))) warm_leaf(void)
{
	unsigned long long n = 4 * UNIT;

	while (n--)
		sink += n;
}

/* Has a frame of its own, so that the unwinder finds it above the leaf. */
static void __attribute__((noinline)) warm_caller(int rounds)
{
	int i;

	for (i = 0; i < rounds; i++)
		warm_leaf();
	sink++;
}

static void drain(void)
{
	samples += drain_ring(&cb, sizeof(ring));
}

int main(int argc, char **argv)
{
	time_t end = time(0) + (argc > 1 ? atoi(argv[1]) : 5);

	cnh_sampling(&cb, ring, sizeof(ring));
	check("LLWPCB grants CNH", cb.flags == LWP_CNH);
	/* The control API's test starts its captures once both programs
	 * say this: it meets them on progress, not on a clock. */
	printf("  lwp-warm: sampling\n");
	while (time(0) < end) {
		warm_caller(8);
		drain();
	}
	drain();
	__llwpcb(0);
	printf("  lwp-warm: %llu samples\n", samples);
	check("CNH samples were taken", samples > 20);
	return summary("lwp-warm");
}
