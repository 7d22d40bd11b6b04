/* The bare floor of one trap-flag step on this host, for the precise
 * stepping benchmark: the stepping guest's loop (`dec; jnz`), run with
 * RFLAGS.TF set at CPL3, each step taken by a #DB handler that rings a bare
 * port and returns (tfstep.S), timed with RDTSC. No LWP, nothing of
 * lwpvmm's stepping. Prints "tfstep CYCLES INSTRUCTIONS" as the stepping
 * guest prints "stepping ...". `iterations=` sets the loop length. */
#include "lib.h"

int main(void)
{
    u64 n = cmdline_number("iterations", 2000);
    u32 lo0, hi0, lo1, hi1;
    __asm__ volatile("rdtsc\n"
                     "mov %%eax, %0\n"
                     "mov %%edx, %1\n"
                     "mov %4, %%rcx\n"
                     "pushfq\n"
                     "orq $0x100, (%%rsp)\n"
                     "popfq\n"
                     "2: dec %%rcx\n"
                     "jnz 2b\n"
                     "pushfq\n"
                     "andq $~0x100, (%%rsp)\n"
                     "popfq\n"
                     "rdtsc\n"
                     "mov %%eax, %2\n"
                     "mov %%edx, %3\n"
                     : "=&r"(lo0), "=&r"(hi0), "=&r"(lo1), "=&r"(hi1)
                     : "r"(n)
                     : "rax", "rcx", "rdx", "cc", "memory");
    u64 t0 = ((u64)hi0 << 32) | lo0, t1 = ((u64)hi1 << 32) | lo1;
    puts("tfstep ");
    put_dec(t1 - t0);
    putc(' ');
    /* The loop's instructions and the pushfq/andq/popfq that end it: as
     * many steps as the stepping guest's 2n + 1. */
    put_dec(2 * n + 3);
    putc('\n');
    return 0;
}
