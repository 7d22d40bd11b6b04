/* Prints the CPUID leaves the runtime read at CPL0, one line each:
 * "cpuid LEAF EAX EBX ECX EDX". The host test compares them with the table
 * lwpvmm passed to KVM. */
#include "lib.h"

int main(void)
{
    for (const struct cpuid_entry *e = cpuid_table; e->leaf; e++) {
        puts("cpuid ");
        put_hex(e->leaf);
        putc(' ');
        put_hex(e->eax);
        putc(' ');
        put_hex(e->ebx);
        putc(' ');
        put_hex(e->ecx);
        putc(' ');
        put_hex(e->edx);
        putc('\n');
    }
    return 0;
}
