/* Sampled clock events stay in the address space that loaded the LWPCB.
 * Two CPL3 tasks in separate address spaces (twotask.S) are switched by the
 * LAPIC timer WITHOUT the LWP state calls, so task A's LWPCB stays loaded
 * while task B runs. Task A profiles itself with CNH; samples taken while
 * task B (the other address space) runs must not be charged: every CNH
 * record must point into code only task A runs (main, its loop, its wait
 * for B), never into task_main or task B's loop, which task B runs. */
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

static u64 work(void) { return cmdline_number("work", 600000000); }

/* Task B's entry (twotask.S). */
void task_main(u64 id)
{
    task_b_loop(work());
    done_flag[id] = 1;
}



/* Task A's wait for task B, a function of its own: A runs here, with its
 * LWPCB loaded, whenever its loop ends first (a faster loop on one CPU). */
static void __attribute__((noinline)) wait_for_b(void)
{
    while (!done_flag[1])
        ;
}

static int in(u64 ip, void *f) { return ip >= (u64)f && ip < (u64)f + 64; }

int main(void);

/* Whether `ip` lies in main, which only task A runs: a kick just after A's
 * loop charges A's samples where A is then, in main. main is about 660
 * bytes; the next 100 or so are twotask.S's CPL0 code, where no sample is
 * charged, and task B's entry loop lies beyond the window. */
static int in_main(u64 ip) { return ip >= (u64)main && ip < (u64)main + 768; }

int main(void)
{
    /* Read before LLWPCB: with the LWPCB loaded, A runs only main, its
     * loop and its wait, where a record of its own may land (a kick once
     * landed in cmdline_number, A's own code outside those three). */
    u64 n = work();
    memset(CB, 0, sizeof(*CB));
    CB->flags = LWP_CNH;
    CB->buffer_size = SLOTS * sizeof(struct lwp_record);
    CB->buffer_base = (u64)RING;
    CB->events[4].interval = 0xfffff;
    __llwpcb(CB);
    task_a_loop(n);
    done_flag[0] = 1;
    wait_for_b();
    __slwpcb();
    u64 total = CB->head / sizeof(struct lwp_record), in_a = 0, in_wait = 0, stray = 0;
    for (u64 i = 0; i < total; i++) {
        u64 a = RING[i].event_id == 5 &&
                (in(RING[i].ip, task_a_loop) || in_main(RING[i].ip));
        u64 w = RING[i].event_id == 5 && in(RING[i].ip, wait_for_b);
        if (!a && !w && !stray)
            stray = RING[i].ip;
        in_a += a;
        in_wait += w;
    }
    puts("sample_as: ");
    put_dec(total);
    puts(" CNH records, ");
    put_dec(in_a);
    puts(" in task A's loop, ");
    put_dec(in_wait);
    puts(" in its wait, ");
    put_dec(switches);
    puts(" switches\n");
    if (stray) {
        /* Where a failure's records went, against the two tasks' loops. */
        puts("sample_as: first other record at ip ");
        put_hex(stray);
        puts("; task A's loop at ");
        put_hex((u64)task_a_loop);
        puts(", task B's at ");
        put_hex((u64)task_b_loop);
        puts("\n");
    }
    check(switches >= 2, "the tasks were switched");
    check(in_a > 10, "task A's loop was sampled");
    check_eq(in_a + in_wait, total, "no sample charged while the other address space ran");
    return done();
}
