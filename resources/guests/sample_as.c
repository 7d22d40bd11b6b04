/* Sampled clock events stay in the address space that loaded the LWPCB.
 * Two CPL3 tasks in separate address spaces (twotask.S) are switched by the
 * LAPIC timer WITHOUT the LWP state calls, so task A's LWPCB stays loaded
 * while task B runs. Task A profiles itself with CNH; samples taken while
 * task B (the other address space) runs must not be charged: every CNH
 * record must point into task A's loop. */
#include <x86intrin.h>
#include "lib.h"
#include "lwp.h"

#define CB ((struct lwpcb *)0x400000)
#define RING ((struct lwp_record *)0x401000)
#define SLOTS 1024

u8 use_state_calls = 0;
extern volatile u64 switches;
static volatile u64 done_flag[2], sink;

void __attribute__((noinline)) task_a_loop(u64 n) { for (u64 i = 0; i < n; i++) sink += i; }
void __attribute__((noinline)) task_b_loop(u64 n) { for (u64 i = 0; i < n; i++) sink ^= i; }

void task_main(u64 id)
{
    u64 n = cmdline_number("work", 600000000);
    if (id == 0) {
        memset(CB, 0, sizeof(*CB));
        CB->flags = LWP_CNH;
        CB->buffer_size = SLOTS * sizeof(struct lwp_record);
        CB->buffer_base = (u64)RING;
        CB->events[4].interval = 0xfffff;
        __llwpcb(CB);
        task_a_loop(n);
    } else {
        task_b_loop(n);
    }
    done_flag[id] = 1;
}

int main(void)
{
    task_main(0);
    while (!done_flag[1])
        ;
    __slwpcb();
    u64 total = CB->head / sizeof(struct lwp_record), in_a = 0;
    for (u64 i = 0; i < total; i++)
        in_a += RING[i].event_id == 5 && RING[i].ip >= (u64)task_a_loop && RING[i].ip < (u64)task_a_loop + 64;
    puts("sample_as: ");
    put_dec(total);
    puts(" CNH records, ");
    put_dec(in_a);
    puts(" in task A's loop, ");
    put_dec(switches);
    puts(" switches\n");
    check(switches >= 2, "the tasks were switched");
    check(total > 10, "task A was sampled");
    check_eq(in_a, total, "no sample charged while the other address space ran");
    return done();
}
