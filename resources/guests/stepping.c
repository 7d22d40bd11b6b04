/* Single-stepping cost: a CPL3 loop stepped under IRE (`bre=0`) or IRE and
 * BRE (`bre=1`, every instruction also decoded), timed with RDTSC. Prints
 * "stepping CYCLES INSTRUCTIONS". `iterations=` sets the loop length. */
#include <x86intrin.h>
#include "lib.h"
#include "lwp.h"

static struct lwpcb cb __attribute__((aligned(64)));
static struct lwp_record ring[1024] __attribute__((aligned(4096)));

int main(void)
{
    u64 n = cmdline_number("iterations", 2000);
    cb.flags = LWP_IRE | LWP_CONT | (cmdline_number("bre", 1) ? LWP_BRE : 0);
    cb.buffer_size = sizeof(ring);
    cb.buffer_base = (u64)ring;
    cb.events[1].interval = 0x1ffffff;
    cb.events[2].interval = 0x1ffffff;
    u32 lo0, hi0, lo1, hi1;
    __asm__ volatile("llwpcb %4\n"
                     "rdtsc\n"
                     "mov %%eax, %0\n"
                     "mov %%edx, %1\n"
                     "mov %6, %%rcx\n"
                     "2: dec %%rcx\n"
                     "jnz 2b\n"
                     "rdtsc\n"
                     "mov %%eax, %2\n"
                     "mov %%edx, %3\n"
                     "xor %%eax, %%eax\n"
                     "llwpcb %%rax"
                     : "=&r"(lo0), "=&r"(hi0), "=&r"(lo1), "=&r"(hi1)
                     : "r"(&cb), "m"(cb), "r"(n)
                     : "rax", "rcx", "rdx", "cc", "memory");
    u64 t0 = ((u64)hi0 << 32) | lo0, t1 = ((u64)hi1 << 32) | lo1;
    puts("stepping ");
    put_dec(t1 - t0);
    putc(' ');
    put_dec(2 * n + 1);
    putc('\n');
    return 0;
}
