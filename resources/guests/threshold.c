/* The threshold interrupt reaches the guest's handler with the vector
 * programmed in LWP_CFG, once per crossing (docs/lwp-model.md R7). */
#include <x86intrin.h>
#include "lib.h"
#include "lwp.h"

#define STORM 200

static struct lwpcb cb __attribute__((aligned(64)));
static struct lwp_record ring[32] __attribute__((aligned(4096)));

static u64 irqs(void)
{
    /* The MSI is injected at the VMM's next entry: let it land. */
    for (volatile int i = 0; i < 1000; i++)
        ;
    return irq_counts[1];
}

int main(void)
{
    cb.flags = LWP_INT;
    cb.buffer_size = sizeof(ring);
    cb.buffer_base = (u64)ring;
    cb.threshold = 64;
    __llwpcb(&cb);
    check_eq(cb.flags, LWP_INT, "INT granted");
    __lwpins32(0, 0, 0);
    check_eq(irqs(), 0, "below the threshold: no interrupt");
    __lwpins32(0, 1, 0);
    check_eq(irqs(), 1, "crossing the threshold: one interrupt on vector 0x41");
    check_eq(cb.head, 64, "the head is flushed for the handler");
    for (u32 i = 0; i < 5; i++)
        __lwpins32(0, i, 0);
    check_eq(irqs(), 1, "still above the threshold: no more");
    __slwpcb();
    cb.tail = cb.head;
    __lwpins32(0, 9, 0);
    __lwpins32(0, 10, 0);
    check_eq(irqs(), 2, "after software drains the ring, the next crossing interrupts again");
    check_eq(irq_counts[0], 0, "no other vector fired");

    /* An interrupt storm: threshold at one record, the ring drained after
     * every record, so every record crosses the threshold. */
    __slwpcb();
    cb.threshold = 32;
    cb.tail = cb.head;
    __llwpcb(&cb);
    u64 before = irqs();
    for (u32 i = 0; i < STORM; i++) {
        __lwpins32(0, i, 0);
        __slwpcb();
        __asm__ volatile("" ::: "memory");
        cb.tail = cb.head;
    }
    check_eq(irqs() - before, STORM, "a storm: one interrupt per crossing, none lost or doubled");
    return done();
}
