/* The host of `lwpvmm profile`: runs a user's freestanding program as its
 * CPL3 task. The VMM loads the program's ELF (linked at 16 MiB or above,
 * below 1 GiB) and passes its entry point as `entry=` on the command line;
 * the program runs as a function call at CPL3 and may use LWP through the
 * shim, write to the console (port 0x3f8) and end the VM (port 0xf4).
 * Returning from it ends the VM with value 0. The host loads an LWPCB with
 * sampled CPU clocks (CNH) before calling the program, so every sample of
 * it lands in lwpvmm's trace. */
#include <x86intrin.h>
#include "lib.h"
#include "lwp.h"

/* The host profiles the program with sampled CPU clocks into a ring it
 * never reads (continuous mode): lwpvmm's trace is where the samples go. */
static struct lwpcb cb __attribute__((aligned(64)));
static struct lwp_record ring[1024] __attribute__((aligned(4096)));

int main(void)
{
    u64 entry = cmdline_number("entry", 0);
    if (!entry) {
        puts("profile host: no program (entry=)\n");
        return 1;
    }
    const struct cpuid_entry *leaf = cpuid_of(0x8000001c);
    if (leaf && (leaf->eax & LWP_CNH)) {
        cb.flags = LWP_CNH | LWP_CONT;
        cb.buffer_size = sizeof(ring);
        cb.buffer_base = (u64)ring;
        cb.events[4].interval = 0xfffff;
        __llwpcb(&cb);
    }
    ((void (*)(void))entry)();
    __llwpcb(0);
    return 0;
}
