/* CPL3 throughput under the sampler: times a fixed loop with RDTSC and
 * prints "throughput CYCLES". With `lwp=1` the loop runs under an LWPCB
 * with sampled CPU clocks (CNH), so every kick charges it; with `lwp=0` no
 * clock event is armed, so the sampler never kicks. `work=` sets the loop
 * length, `interval=` the CNH interval (small: a record at every kick). */
#include <x86intrin.h>
#include "lib.h"
#include "lwp.h"

static struct lwpcb cb __attribute__((aligned(64)));
static struct lwp_record ring[64] __attribute__((aligned(4096)));
static volatile u64 sink;

int main(void)
{
    u64 n = cmdline_number("work", 1000000000);
    if (cmdline_number("lwp", 1)) {
        cb.flags = LWP_CNH | LWP_CONT;
        cb.buffer_size = sizeof(ring);
        cb.buffer_base = (u64)ring;
        cb.events[4].interval = cmdline_number("interval", 0x1ffffff);
        __llwpcb(&cb);
    }
    u32 lo, hi;
    __asm__ volatile("lfence; rdtsc" : "=a"(lo), "=d"(hi));
    u64 t0 = ((u64)hi << 32) | lo;
    for (u64 i = 0; i < n; i++)
        sink += i;
    __asm__ volatile("lfence; rdtsc" : "=a"(lo), "=d"(hi));
    u64 t1 = ((u64)hi << 32) | lo;
    puts("throughput ");
    put_dec(t1 - t0);
    putc('\n');
    return 0;
}
