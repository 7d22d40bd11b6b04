/* Two CPL3 tasks in separate address spaces, switched by the LAPIC timer,
 * each with its own LWPCB and ring at the same linear addresses. The timer
 * handler (twotask.S) carries each task's LWP state through lwpvmm's LWP
 * state calls, so each ring must hold only its own task's records. */
#include <x86intrin.h>
#include "lib.h"
#include "lwp.h"

#define N 1500
#define CB ((struct lwpcb *)0x400000)
#define RING ((struct lwp_record *)0x401000)

extern volatile u64 switches, state_errors;
u8 use_state_calls = 1;
static volatile u64 done_flag[2], own[2], foreign[2], missed[2];

void task_main(u64 id)
{
    memset(CB, 0, sizeof(*CB));
    CB->buffer_size = (N + 32) * sizeof(struct lwp_record);
    CB->buffer_base = (u64)RING;
    __llwpcb(CB);
    for (u32 i = 0; i < N; i++)
        __lwpins32(i, 0x7a5c0000u | (u32)id, 0);
    __slwpcb();
    for (u32 i = 0; i < CB->head / sizeof(struct lwp_record); i++) {
        if (RING[i].data1 == (0x7a5c0000u | id) && RING[i].data2 == own[id])
            own[id]++;
        else
            foreign[id]++;
    }
    missed[id] = CB->missed;
    __llwpcb(0);
    done_flag[id] = 1;
}

int main(void)
{
    task_main(0);
    while (!done_flag[1])
        ;
    puts("twotask: ");
    put_dec(switches);
    puts(" task switches\n");
    check(switches >= 2, "the tasks were switched while they ran");
    check_eq(state_errors, 0, "every LWP state call succeeded");
    for (u32 id = 0; id < 2; id++) {
        check_eq(own[id], N, "each task's ring holds all its records, in order");
        check_eq(foreign[id], 0, "and none of the other task's");
        check_eq(missed[id], 0, "nothing missed");
    }
    return done();
}
