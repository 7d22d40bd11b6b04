/* A hostile guest: LWPCBs and rings at more bad places, a threshold
 * interrupt on an exception vector, LLWPCB storms, and paravirtual calls
 * made the wrong way (hostile.S makes the CPL0 ones). Guest memory outside
 * the LWPCBs and rings must stay untouched, and the VMM must carry on. */
#include <x86intrin.h>
#include "lib.h"
#include "lwp.h"

#define W(i) (0x400000ull + (u64)(i) * 0x1000)
#define SENTINEL_FIRST 20
#define SENTINEL_PAGES 8

extern u64 pv_results[4];

static void llwpcb_expect(const char *what, u64 addr, u64 vector)
{
    puts("# ");
    puts(what);
    putc('\n');
    check_eq(llwpcb_faults(addr), 1, "llwpcb faults");
    check_eq(fault_vector, vector, "with the documented vector");
}

static struct lwpcb *block_at(u64 at, u64 ring, u32 size, u32 flags, u32 threshold)
{
    struct lwpcb *c = (struct lwpcb *)at;
    memset(c, 0, sizeof(*c));
    c->flags = flags;
    c->buffer_size = size;
    c->buffer_base = ring;
    c->threshold = threshold;
    return c;
}

static int sentinel_intact(void)
{
    const volatile u8 *p = (const volatile u8 *)W(SENTINEL_FIRST);
    for (u64 i = 0; i < SENTINEL_PAGES * 0x1000ull; i++)
        if (p[i] != 0xa5)
            return 0;
    return 1;
}

int main(void)
{
    memset((void *)W(SENTINEL_FIRST), 0xa5, SENTINEL_PAGES * 0x1000);

    puts("# paravirtual calls made the wrong way (CPL0)\n");
    check_eq(pv_results[0] & 1, 1, "#UD doorbell with a bogus frame pointer: not handled");
    check_eq(pv_results[1] & 1, 1, "#UD doorbell with no #UD, frame on a NOP: not handled");
    check_eq(pv_results[2], 2, "state save into an unmapped area: bad area");
    check_eq(pv_results[3], 3, "state restore of a garbage image: refused");
    check_eq((u64)__slwpcb(), 0, "and LWP is off after it");

    puts("# paravirtual calls from CPL3\n");
    u64 flags;
    __asm__ volatile("clc\n out %%al, $0x5c\n pushfq\n pop %0" : "=r"(flags) : "a"(0) : "cc", "memory");
    check_eq(flags & 1, 1, "#UD doorbell from CPL3: refused");
    u64 status = 1;
    /* A state call writes RDX, RCX and R8 (docs/pv-abi.md). */
    __asm__ volatile("out %%al, $0x5d" : "+a"(status) : "D"(W(8)) : "rcx", "rdx", "r8", "memory");
    check_eq(status, 4, "state call from CPL3: refused");

    puts("# more bad places\n");
    struct lwpcb *good = block_at(W(8), W(5), 4096, 0, 0);
    __llwpcb(good);
    check_eq((u64)__slwpcb(), W(8), "a ring on the last page of RAM loads");
    check_eq(__lwpins32(0x77, 0x66, 0x55), 0, "and takes a record");
    check_eq(((struct lwp_record *)W(5))->data1, 0x66, "stored on the last page");
    block_at(W(10), 0xfffffffffffff000ull, 8192, 0, 0);
    llwpcb_expect("ring wrapping past 2^64", W(10), 13);
    block_at(W(11), W(9), 0x0fffffe0, 0, 0);
    llwpcb_expect("BufferSize huge (256 MiB, past the end of RAM)", W(11), 13);
    block_at(W(12), W(9), 32, 0, 0);
    llwpcb_expect("BufferSize tiny", W(12), 13);
    struct lwpcb *odd = block_at(W(13), W(9), 4100, 0, 0);
    __llwpcb(odd);
    check_eq(odd->buffer_size, 4096, "an unaligned BufferSize is rounded down to whole records");

    puts("# a threshold interrupt on an exception vector (LWP_CFG vector 0x10)\n");
    struct lwpcb *irq = block_at(W(14), W(9), 4096, LWP_INT, 32);
    u64 faults = fault_count;
    __llwpcb(irq);
    check_eq(irq->flags, LWP_INT, "INT granted");
    for (u32 i = 0; i < 50; i++) {
        __lwpins32(i, i, 0);
        __slwpcb();
        __asm__ volatile("" ::: "memory");
        irq->tail = irq->head;
    }
    for (volatile int i = 0; i < 10000; i++)
        ;
    check_eq(fault_count, faults, "no exception was forged");
    u64 irqs = 0;
    for (u32 v = 0; v < 16; v++)
        irqs += irq_counts[v];
    check_eq(irqs, 0, "no interrupt delivered");

    puts("# LLWPCB storm\n");
    for (u32 i = 0; i < 2000; i++) {
        __llwpcb(good);
        __llwpcb(0);
    }
    __llwpcb(good);
    check_eq(good->head, 32, "the ring's head survived the storm");
    __llwpcb(0);

    check(sentinel_intact(), "memory outside every LWPCB and ring is untouched");
    return done();
}
