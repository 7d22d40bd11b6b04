/*
 * The user half of the whole-guest profile test (/init with
 * wholeprof=SECONDS runs it beside /spin-kernel): pinned to CPU 1, it
 * spins in spin_user for SECONDS seconds without a system call but
 * time(), and uses no LWP.
 */
#include "smp.h"

static volatile unsigned long long sink;

static void __attribute__((noinline)) spin_user(void)
{
	unsigned long long n = 1 << 16;

	while (n--)
		sink += n;
}

int main(int argc, char **argv)
{
	time_t end = time(0) + (argc > 1 ? atoi(argv[1]) : 5);
	unsigned long long rounds = 0;

	pin_to(online_cpus() > 1 ? 1 : 0);
	printf("  spin-user: spinning\n");
	/* time() is a system call, which CPL0 emulation makes slow: asked
	 * once per 64 rounds, it leaves the process in its own code. */
	while (time(0) < end) {
		int i;

		for (i = 0; i < 64; i++)
			spin_user();
		rounds += 64;
	}
	printf("  spin-user: %llu rounds\n", rounds);
	check("it spun", rounds > 0);
	return summary("spin-user");
}
