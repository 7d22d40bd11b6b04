/* An example for `lwpvmm profile`: a freestanding program with three
 * functions doing 1, 3 and 6 units of work. README.md ("Profile your own
 * program") says how to build and run it: `hot` should lead the report. */

typedef unsigned long long u64;

static volatile u64 sink;

static void out(const char *s)
{
    for (; *s; s++)
        __asm__ volatile("outb %0, %1" : : "a"(*s), "Nd"((unsigned short)0x3f8));
}

/* The same loop in each, aligned alike, so that only the count the caller
 * passes makes one hotter than another: CPUs run a loop that crosses a
 * cache line slower, which would skew the profile. */
#define SPIN(name) \
    void __attribute__((noinline, aligned(64))) name(u64 n) { for (u64 i = 0; i < n; i++) sink += i; }
SPIN(cold)
SPIN(warm)
SPIN(hot)

__attribute__((section(".text.start"))) void _start(void)
{
    out("hot: working\n");
    for (int r = 0; r < 10; r++) {
        cold(10000000);
        warm(30000000);
        hot(60000000);
    }
    out("hot: done\n");
}
