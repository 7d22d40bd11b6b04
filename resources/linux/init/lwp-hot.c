/*
 * A sampled profile of a Linux process: three functions doing 1, 2 and 4
 * units of work with CNH (clocks not halted) sampling. lwpvmm's host-side
 * trace and `lwpvmm report --symbols` of this program must put hot_4 on
 * top. The ring is drained before it fills, as a profiler would: the
 * interval (2^20 cycles) makes a record or a few per sampling kick, so a
 * full ring never drops the samples of one part of a round more than
 * another's, however slowly a loaded host runs the guest. With an argument
 * it runs rounds for that many seconds instead of ROUNDS (the control
 * API's profile test).
 */
#include "lwp.h"

#define SLOTS 256
#define ROUNDS 400
#define UNIT 200000

static struct lwpcb cb __attribute__((aligned(64)));
static struct lwp_record ring[SLOTS] __attribute__((aligned(4096)));
static volatile unsigned long long sink;
static unsigned long long samples;

/* Each function spins itself: the report charges the sampled address. */
#define HOT(name, units)                                         \
	static void __attribute__((noinline)) name(void)         \
	{                                                        \
		unsigned long long n = (units) * UNIT;           \
		while (n--)                                      \
			sink += n;                               \
	}
HOT(hot_1, 1)
HOT(hot_2, 2)
HOT(hot_4, 4)

static void drain(void)
{
	samples += drain_ring(&cb, sizeof(ring));
}

int main(int argc, char **argv)
{
	time_t end = argc > 1 ? time(0) + atoi(argv[1]) : 0;
	int i;

	cnh_sampling(&cb, ring, sizeof(ring));
	check("LLWPCB grants CNH", cb.flags == LWP_CNH);
	/* The control API's test starts its captures once both programs
	 * say this: it meets them on progress, not on a clock. */
	printf("  lwp-hot: sampling\n");
	for (i = 0; end ? time(0) < end : i < ROUNDS; i++) {
		hot_1();
		hot_2();
		hot_4();
		if (i % 8 == 0)
			drain();
	}
	drain();
	__llwpcb(0);
	printf("  lwp-hot: %llu samples\n", samples);
	check("CNH samples were taken", samples > 20);
	return summary("lwp-hot");
}
