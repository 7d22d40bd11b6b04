/* The kernel_insn guest (tests/vmm.rs): what kernel_insn.S's CPL0
 * instructions left, checked at CPL3 against what the CPU gives. */
#include "lib.h"

struct results {
    u32 mxcsr, pad;
    u8 verw_ds, verw_cs, verr_cs, verr_null, verw_mem, cx_match, cx_miss, pad2;
    u64 rax, rdx;
};

struct results kinsn_results;
extern u64 kinsn_pair[2];

int main(void)
{
    const struct results *r = &kinsn_results;
    check_eq(r->mxcsr, 0x9fc0, "stmxcsr gives what ldmxcsr loaded");
    check_eq(r->verw_ds, 1, "verw of the kernel's data segment sets ZF");
    check_eq(r->verw_cs, 0, "verw of a code segment clears ZF");
    check_eq(r->verr_cs, 1, "verr of readable code sets ZF");
    check_eq(r->verr_null, 0, "verr of the null selector clears ZF");
    check_eq(r->verw_mem, 1, "verw of a selector in memory sets ZF");
    check_eq(r->cx_match, 1, "cmpxchg16b that matches sets ZF");
    check_eq(r->cx_miss, 0, "cmpxchg16b that does not clears ZF");
    check_eq(r->rax, 3, "it loads RAX from memory");
    check_eq(r->rdx, 4, "and RDX");
    check_eq(kinsn_pair[0], 3, "the first store took, low half");
    check_eq(kinsn_pair[1], 4, "high half, and the second stored nothing");
    return done();
}
