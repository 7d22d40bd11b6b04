/* The start-up probe of the stepping backends: a CPL3 port write (the VMM
 * turns on KVM's single-step there), a few instructions to step, then the
 * exit port. docs/profiling.md. */
#include "lib.h"

int main(void)
{
    __asm__ volatile("outb %%al, $0x80\n"
                     "nop\n"
                     "nop\n"
                     "nop\n"
                     "nop"
                     :
                     : "a"(0)
                     : "memory");
    return 0;
}
