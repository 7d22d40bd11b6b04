/* The CPL probe (tests/cpl.rs): marks on the POST port at CPL3 in the user
 * code segment (stage 2) and, after a far return into the DPL-0 conforming
 * code segment with RPL 3 (still CPL3: a conforming segment does not
 * change the privilege level), there (stage 3). cplprobe.S makes the CPL0
 * marks. */
#include "lib.h"

int main(void)
{
    __asm__ volatile("mov $2, %%eax\n"
                     "out %%al, $0x80\n"
                     "pushq $0x53\n" /* the conforming segment, RPL 3 */
                     "pushq $1f\n"
                     "lretq\n"
                     "1: mov $3, %%eax\n"
                     "out %%al, $0x80\n"
                     "pushq $0x23\n" /* back to the user code segment */
                     "pushq $2f\n"
                     "lretq\n"
                     "2:"
                     :
                     :
                     : "rax", "memory");
    puts("cplprobe: done\n");
    return 0;
}
