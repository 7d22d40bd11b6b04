/*
 * The kernel half of the whole-guest profile test (/init with
 * wholeprof=SECONDS runs it beside /spin-user): pinned to CPU 0, it reads
 * /dev/zero into a large buffer for SECONDS seconds, so that nearly all of
 * its time is the kernel's read path (read_zero clearing user memory). It
 * uses no LWP: lwpvmm's whole-guest samples must find it anyway.
 */
#include "smp.h"

static char buf[1 << 20];

/* Has a frame of its own: the user frame under the kernel's. */
static long __attribute__((noinline)) read_zeros(int fd)
{
	return read(fd, buf, sizeof(buf));
}

int main(int argc, char **argv)
{
	time_t end = time(0) + (argc > 1 ? atoi(argv[1]) : 5);
	unsigned long long bytes = 0;
	int fd = open("/dev/zero", O_RDONLY);

	check("/dev/zero opens", fd >= 0);
	pin_to(0);
	printf("  spin-kernel: reading\n");
	while (fd >= 0 && time(0) < end) {
		long n = read_zeros(fd);

		if (n <= 0)
			break;
		bytes += n;
	}
	printf("  spin-kernel: %llu MiB read\n", bytes >> 20);
	check("it read", bytes > 0);
	return summary("spin-kernel");
}
