/* Round-trip benchmark guest. Prints "bench NAME ITERATIONS CYCLES" lines:
 * - lwpins: a CPL3 LWPINS, emulated through the #UD doorbell;
 * - out: a CPL3 port write (port 0x80), the cheapest CPL3 exit;
 * - ud2: a CPL3 UD2 through the same doorbell, which the VMM decodes and
 *   refuses, so the guest's own #UD path resumes after it;
 * - rdmsr / cpl0_out: timed by the CPL0 part (roundtrip.S).
 * The iteration count comes from `iterations=` on the command line. */
#include <x86intrin.h>
#include "lib.h"
#include "lwp.h"

u64 cpl0_rdmsr_cycles, cpl0_out_cycles, cpl0_iterations;

static struct lwpcb cb __attribute__((aligned(64)));
static struct lwp_record ring[1024] __attribute__((aligned(4096)));

static inline u64 tsc(void)
{
    u32 lo, hi;
    __asm__ volatile("lfence; rdtsc" : "=a"(lo), "=d"(hi));
    return ((u64)hi << 32) | lo;
}

static void report(const char *name, u64 n, u64 cycles)
{
    puts("bench ");
    puts(name);
    putc(' ');
    put_dec(n);
    putc(' ');
    put_dec(cycles);
    putc('\n');
}

int main(void)
{
    u64 n = cmdline_number("iterations", 2000);
    cb.flags = LWP_CONT;
    cb.buffer_size = sizeof(ring);
    cb.buffer_base = (u64)ring;
    __llwpcb(&cb);

    u64 t = tsc();
    for (u64 i = 0; i < n; i++)
        __lwpins32(i, i, 1);
    report("lwpins", n, tsc() - t);

    t = tsc();
    for (u64 i = 0; i < n; i++)
        __asm__ volatile("outb %%al, $0x80" : : "a"(0) : "memory");
    report("out", n, tsc() - t);

    t = tsc();
    for (u64 i = 0; i < n; i++)
        __asm__ volatile("lea 1f(%%rip), %%rax\n"
                         "mov %%rax, fault_resume(%%rip)\n"
                         "ud2\n"
                         "1:"
                         :
                         :
                         : "rax", "memory");
    report("ud2", n, tsc() - t);

    report("rdmsr", cpl0_iterations, cpl0_rdmsr_cycles);
    report("cpl0_out", cpl0_iterations, cpl0_out_cycles);
    return 0;
}
