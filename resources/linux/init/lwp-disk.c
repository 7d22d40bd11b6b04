/*
 * /lwp-disk MODE[,MODE...]: the device tests' and benchmark's disk
 * program, run by /init when the command line says `lwpdisk=MODES`. It
 * works on /dev/vdb (the second disk; /dev/vda is the root) through the
 * block device itself, with the buffer cache dropped (BLKFLSBUF) before it
 * reads, so every read reaches the device.
 *
 * Sizes are small: every byte crosses the guest kernel, which kvm_pvm
 * emulates.
 *
 *   check       writes 4 MiB of a pattern in 256 KiB steps, each made
 *               durable with fdatasync, writes lwpvmm's snapshot debug port
 *               halfway through (a run with --snapshot-on-port snapshots
 *               it there, with the device busy), then reads it all back and
 *               compares checksums;
 *   ro          tries to write /dev/vdc (a third disk, attached read-only)
 *               and says whether the write failed;
 *   seq-read, seq-write, randread
 *               the benchmark: 8 MiB read or written in 1 MiB requests, or
 *               512 random 4 KiB reads, and the time it took in the guest.
 */
#include <linux/fs.h>

/* lwpvmm's snapshot debug port (docs/pv-abi.md). */
#define SNAPSHOT_PORT 0x5a
#define MIB (1u << 20)
#define STEP (256u << 10)

static unsigned char buf[MIB];

/* What nolibc lacks. */
static ssize_t pread(int fd, void *b, size_t n, off_t off)
{
	return my_syscall4(__NR_pread64, fd, b, n, off);
}

static ssize_t pwrite(int fd, const void *b, size_t n, off_t off)
{
	return my_syscall4(__NR_pwrite64, fd, b, n, off);
}

static int fdatasync(int fd)
{
	return my_syscall1(__NR_fdatasync, fd);
}

static unsigned long long now_us(void)
{
	struct timeval tv;

	gettimeofday(&tv, 0);
	return (unsigned long long)tv.tv_sec * 1000000 + tv.tv_usec;
}

/* The byte at `offset` of the pattern. */
static unsigned char pattern(unsigned long long offset)
{
	return (unsigned char)(offset * 2654435761ull >> 13);
}

/* FNV-1a over `len` bytes, continued from `h`. */
static unsigned long long fnv(unsigned long long h, const unsigned char *p, size_t len)
{
	while (len--) {
		h ^= *p++;
		h *= 1099511628211ull;
	}
	return h;
}

static int open_disk(int flags)
{
	int fd = open("/dev/vdb", flags);

	if (fd < 0)
		printf("lwp-disk: cannot open /dev/vdb: %d\n", errno);
	return fd;
}

static int drop_cache(int fd)
{
	return ioctl(fd, BLKFLSBUF, (void *)0);
}

static int check(void)
{
	unsigned long long wrote = 0xcbf29ce484222325ull, read_back = wrote;
	unsigned int step, i, steps = 16;
	int fd = open_disk(O_RDWR), ok = 1;

	if (fd < 0)
		return 1;
	for (step = 0; step < steps && ok; step++) {
		if (step == steps / 2 &&
		    my_syscall3(__NR_ioperm, SNAPSHOT_PORT, 1, 1) == 0) {
			printf("lwp-disk: snapshot point at %u KiB\n", step * (STEP >> 10));
			/* Dirty again what the device has: the guest's writeback
			 * is under way when the snapshot is taken. */
			pwrite(fd, buf, STEP, (off_t)(step - 1) * STEP);
			__asm__ volatile("outb %%al, %0" ::"i"(SNAPSHOT_PORT), "a"(0));
			printf("lwp-disk: after the snapshot point\n");
		}
		for (i = 0; i < STEP; i++)
			buf[i] = pattern((unsigned long long)step * STEP + i);
		wrote = fnv(wrote, buf, STEP);
		ok = pwrite(fd, buf, STEP, (off_t)step * STEP) == STEP && fdatasync(fd) == 0;
	}
	ok = ok && drop_cache(fd) == 0;
	for (step = 0; step < steps && ok; step++) {
		ok = pread(fd, buf, STEP, (off_t)step * STEP) == STEP;
		read_back = fnv(read_back, buf, STEP);
	}
	close(fd);
	printf("lwp-disk: wrote %u KiB, checksum %llx; read back %llx: %s\n", steps * (STEP >> 10),
	       wrote, read_back, ok && wrote == read_back ? "match" : "MISMATCH");
	return !(ok && wrote == read_back);
}

static int read_only(void)
{
	int fd = open("/dev/vdc", O_RDWR);
	ssize_t n = -1;

	if (fd >= 0) {
		memset(buf, 0x5a, 4096);
		n = pwrite(fd, buf, 4096, 0);
		if (n == 4096 && fdatasync(fd) != 0)
			n = -1;
		close(fd);
	}
	printf("lwp-disk: write to the read-only disk %s\n",
	       n == 4096 ? "SUCCEEDED" : "failed");
	return n == 4096;
}

static int bench(const char *mode)
{
	unsigned long long start, bytes = 0, seed = 88172645463325252ull;
	unsigned int i, writing = strcmp(mode, "seq-write") == 0;
	unsigned int random = strcmp(mode, "randread") == 0;
	int fd = open_disk(writing ? O_RDWR : O_RDONLY);

	if (fd < 0)
		return 1;
	memset(buf, 0xa5, MIB);
	drop_cache(fd);
	/* The benchmark times the host's view, from this line to the next. */
	printf("lwp-disk: start %s\n", mode);
	start = now_us();
	for (i = 0; i < (random ? 512u : 8u); i++) {
		ssize_t n;

		if (random) {
			seed ^= seed << 13;
			seed ^= seed >> 7;
			seed ^= seed << 17;
			n = pread(fd, buf, 4096, (off_t)(seed % (8 * MIB / 4096)) * 4096);
			/* The cache would answer a repeated block. */
			drop_cache(fd);
		} else if (writing) {
			n = pwrite(fd, buf, MIB, (off_t)i * MIB);
		} else {
			n = pread(fd, buf, MIB, (off_t)i * MIB);
		}
		if (n <= 0) {
			printf("lwp-disk: %s failed at request %u\n", mode, i);
			return 1;
		}
		bytes += n;
	}
	if (writing)
		fdatasync(fd);
	printf("lwp-disk: %s %llu bytes in %llu us\n", mode, bytes, now_us() - start);
	close(fd);
	return 0;
}

static int run(const char *mode)
{
	if (strcmp(mode, "check") == 0)
		return check();
	if (strcmp(mode, "ro") == 0)
		return read_only();
	if (strcmp(mode, "seq-read") == 0 || strcmp(mode, "seq-write") == 0 ||
	    strcmp(mode, "randread") == 0)
		return bench(mode);
	printf("lwp-disk: unknown mode `%s`\n", mode);
	return 2;
}

int main(int argc, char **argv)
{
	static char modes[128];
	char *mode, *comma;
	int status = 0;

	strncpy(modes, argc > 1 ? argv[1] : "", sizeof(modes) - 1);
	for (mode = modes; mode; mode = comma) {
		comma = strchr(mode, ',');
		if (comma)
			*comma++ = 0;
		status |= run(mode);
	}
	printf("lwp-disk: done\n");
	return status;
}
