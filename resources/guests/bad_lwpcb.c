/* LLWPCB with the LWPCB or its ring at every bad place: the guest must get
 * exactly the fault docs/lwp-model.md documents (L1, G5), LWP must stay as
 * it was, and the VM must keep running. */
#include <x86intrin.h>
#include "lib.h"
#include "lwp.h"

#define W(i) (0x400000ull + (u64)(i) * 0x1000)
#define GOOD_CB W(8)
#define GOOD_RING W(9)

struct lwpcb *const good = (struct lwpcb *)GOOD_CB;

static void llwpcb_expect(const char *what, u64 addr, u64 vector, u64 error, u64 cr2)
{
    puts("# ");
    puts(what);
    putc('\n');
    check_eq(llwpcb_faults(addr), 1, "llwpcb faults");
    check_eq(fault_vector, vector, "fault vector");
    check_eq(fault_error, error, "error code");
    if (vector == 14)
        check_eq(fault_cr2, cr2, "CR2");
    check_eq((u64)__slwpcb(), GOOD_CB, "the previous LWPCB stays loaded");
}

static void block_at(u64 at, u64 ring, u32 size)
{
    struct lwpcb *c = (struct lwpcb *)at;
    memset(c, 0, sizeof(*c));
    c->buffer_size = size;
    c->buffer_base = ring;
}

int main(void)
{
    block_at(GOOD_CB, GOOD_RING, 4096);
    __llwpcb(good);
    check_eq((u64)__slwpcb(), GOOD_CB, "a good LWPCB loads");

    block_at(W(10), W(1), 4096);
    block_at(W(11), W(3), 4096);
    block_at(W(12), W(5), 8192);
    block_at(W(14), W(9), 1000);
    llwpcb_expect("LWPCB unmapped", W(2), 14, 4, W(2));
    llwpcb_expect("LWPCB supervisor-only", W(0), 14, 5, W(0));
    llwpcb_expect("ring read-only", W(10), 14, 7, W(1));
    llwpcb_expect("ring in the MMIO hole", W(11), 13, 0, 0);
    llwpcb_expect("ring crossing the end of RAM", W(12), 13, 0, 0);
    llwpcb_expect("LWPCB not canonical", 0x8000000000000000ull, 13, 0, 0);
    llwpcb_expect("ring too small", W(14), 13, 0, 0);
    llwpcb_expect("LWPCB in the MMIO hole", W(3), 13, 0, 0);

    check_eq(__lwpins32(1, 2, 3), 0, "the good LWPCB still records");
    __slwpcb();
    check_eq(good->head, 32, "one record in the good ring");
    return done();
}
