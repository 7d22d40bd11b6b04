/* Protection keys (docs/security.md): with CR4.PKE on a processor with
 * PKU, a CPL3 store to a user page whose key PKRU write-disables faults, so
 * LLWPCB refuses a ring there (a #PF with the PK bit), and accepts it again
 * once PKRU allows the key. On a processor without PKU the key bits of a
 * PTE mean nothing, whatever CR4 says, and a ring there loads. The guest
 * says which case it ran. */
#include <x86intrin.h>
#include "lib.h"
#include "lwp.h"

#define W(i) (0x400000ull + (u64)(i) * 0x1000)
#define PF_PK (1u << 5)

extern volatile u64 pku_state;

static struct lwpcb cb __attribute__((aligned(64)));

static void wrpkru(u32 value)
{
    __asm__ volatile(".byte 0x0f, 0x01, 0xef" : : "a"(value), "c"(0), "d"(0) : "memory");
}

/* A CPL3 store to `at`; returns the #PF error code, or 0 when it stored. */
static u64 store_faults(u64 at)
{
    u64 faults = fault_count;
    __asm__ volatile("lea 1f(%%rip), %%rax\n"
                     "mov %%rax, fault_resume(%%rip)\n"
                     "movl $1, (%0)\n"
                     "1: movq $0, fault_resume(%%rip)"
                     :
                     : "r"(at)
                     : "rax", "memory");
    return fault_count == faults ? 0 : fault_error;
}

int main(void)
{
    cb.buffer_size = 4096;
    cb.buffer_base = W(4);
    if (pku_state != 1) {
        puts(pku_state == 2 ? "pku: not offered by this processor; CR4.PKE refused with #GP\n"
                            : "pku: not offered by this processor; CR4.PKE accepted anyway\n");
        check(pku_state == 2 || pku_state == 3, "the CPL0 part ran");
        check_eq(store_faults(W(4)), 0, "a CPL3 store to the page with key bits stores");
        check_eq(llwpcb_faults((u64)&cb), 0, "LLWPCB with the ring there loads");
        check_eq(__lwpins32(1, 2, 3), 0, "and stores");
        __llwpcb(0);
        return done();
    }
    puts("pku: offered; CR4.PKE on, window page 4 has key 1\n");
    wrpkru(1u << 3); /* WD for key 1 */
    u64 cpu = store_faults(W(4));
    puts("# the CPU's own store with key 1 write-disabled: error code ");
    put_hex(cpu);
    putc('\n');
    check_eq(llwpcb_faults((u64)&cb), 1, "LLWPCB with the ring on a write-disabled key faults");
    check_eq(fault_vector, 14, "with #PF");
    check_eq(fault_error & PF_PK, PF_PK, "whose error code has the PK bit");
    check_eq(fault_cr2, W(4), "at the ring");
    wrpkru(0);
    check_eq(llwpcb_faults((u64)&cb), 0, "with PKRU allowing key 1 it loads");
    check_eq(__lwpins32(1, 2, 3), 0, "and stores");
    __llwpcb(0);
    return done();
}
