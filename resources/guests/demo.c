/* The demo guest: a CPL3 program that uses LWP exactly as a real LWP user
 * writes it, with gcc's -mlwp intrinsics. It sets up an LWPCB and a ring,
 * loads it with llwpcb, runs a workload that samples values with lwpval and
 * marks phases with lwpins, flushes with slwpcb, then reads its own ring and
 * prints what it found. */
#include <x86intrin.h>
#include "lib.h"
#include "lwp.h"

#define RING_RECORDS 128
#define ITERATIONS 100
#define VAL_INTERVAL 9
#define INS_EVERY 25

static struct lwpcb cb __attribute__((aligned(64)));
static struct lwp_record ring[RING_RECORDS] __attribute__((aligned(4096)));

/* The workload with a known shape: three functions doing 1, 2 and 4
 * units of the same work, profiled with sampled CPU clocks (CNH). */
#define SAMPLE_RECORDS 4096
#define ROUNDS 20

static struct lwpcb pcb __attribute__((aligned(64)));
static struct lwp_record samples[SAMPLE_RECORDS] __attribute__((aligned(4096)));
static volatile u64 sink;

/* Byte-identical bodies at the same alignment, with the caller scaling
 * the count: on an AMD family 19h CPU a loop that happened to cross a
 * 64-byte line ran at half the speed of the others, so the shape is only
 * the program's if the three loops cost the same per iteration. */
#define WORK(name) \
    void __attribute__((noinline, aligned(64))) name(u64 n) { for (u64 i = 0; i < n; i++) sink += i; }
WORK(work_1)
WORK(work_2)
WORK(work_4)

static void profile_shape(void)
{
    u64 unit = cmdline_number("work", 8000000);
    memset(&pcb, 0, sizeof(pcb));
    pcb.flags = LWP_CNH;
    pcb.buffer_size = sizeof(samples);
    pcb.buffer_base = (u64)samples;
    pcb.events[4].interval = 0x3fffff;
    __llwpcb(&pcb);
    check(pcb.flags == LWP_CNH, "llwpcb granted CNH (sampled CPU clocks)");
    for (u32 r = 0; r < ROUNDS; r++) {
        work_1(unit);
        work_2(2 * unit);
        work_4(4 * unit);
    }
    __slwpcb();
    __llwpcb(0);
    u64 fns[3] = { (u64)work_1, (u64)work_2, (u64)work_4 };
    u64 hits[3] = { 0, 0, 0 }, total = pcb.head / sizeof(struct lwp_record);
    for (u64 i = 0; i < total; i++)
        for (u32 f = 0; f < 3; f++)
            if (samples[i].ip >= fns[f] && samples[i].ip < fns[f] + 64)
                hits[f]++;
    puts("demo: CNH samples in the guest's own ring: ");
    put_dec(total);
    puts(" (work_1 ");
    put_dec(hits[0]);
    puts(", work_2 ");
    put_dec(hits[1]);
    puts(", work_4 ");
    put_dec(hits[2]);
    puts("; expected shape 1:2:4)\n");
    u64 counted = hits[0] + hits[1] + hits[2];
    check(counted > 50, "enough samples to see the shape");
    /* Shares within 10 percentage points of 1/7, 2/7, 4/7 (in units of
     * 1/700). */
    const u64 want[3] = { 1, 2, 4 };
    for (u32 f = 0; f < 3; f++) {
        s64 share = (s64)(hits[f] * 700 / (counted ? counted : 1));
        s64 expected = (s64)(want[f] * 100);
        check(share - expected < 70 && expected - share < 70, "share within 10 points of the shape");
    }
}

int main(void)
{
    const struct cpuid_entry *leaf = cpuid_of(0x8000001c);
    puts("demo: LWP CPUID 0x8000001c eax=");
    put_hex(leaf->eax);
    puts(" edx=");
    put_hex(leaf->edx);
    putc('\n');
    check(leaf->eax & 1, "CPUID reports LwpAvail");
    check(leaf->edx & LWP_VAL, "CPUID reports LWPVAL");

    memset(&cb, 0, sizeof(cb));
    cb.flags = LWP_VAL;
    cb.buffer_size = sizeof(ring);
    cb.buffer_base = (u64)ring;
    cb.events[0].interval = VAL_INTERVAL;
    __llwpcb(&cb);
    check(cb.flags == LWP_VAL, "llwpcb granted LWPVAL");

    u32 ins = 0, full = 0;
    for (u32 i = 0; i < ITERATIONS; i++) {
        __lwpval32(i * 2, i, 0x7);
        if (i % INS_EVERY == 0) {
            full += __lwpins32(0xabc, i, 0x55);
            ins++;
        }
    }
    void *addr = __slwpcb();
    check(addr == &cb, "slwpcb returns the LWPCB");
    u32 records = (cb.head - cb.tail) / sizeof(struct lwp_record);
    u32 vals = 0, marks = 0, ordered = 1;
    u64 last_ip = 0;
    for (u32 i = 0; i < records; i++) {
        const struct lwp_record *r = &ring[i];
        if (r->event_id == 1 && r->data1 == vals * (VAL_INTERVAL + 1) &&
            r->data2 == 2ull * r->data1 && r->flags == 7)
            vals++;
        else if (r->event_id == 255 && r->data2 == 0xabc && r->flags == 0x55)
            marks++;
        ordered &= r->ip != 0;
        last_ip = r->ip;
    }
    puts("demo: ring holds ");
    put_dec(records);
    puts(" records: ");
    put_dec(vals);
    puts(" LWPVAL samples, ");
    put_dec(marks);
    puts(" LWPINS marks, last at ip ");
    put_hex(last_ip);
    putc('\n');
    check_eq(vals, ITERATIONS / (VAL_INTERVAL + 1), "one LWPVAL record every interval + 1");
    check_eq(marks, ins, "every LWPINS recorded");
    check_eq(full, 0, "no LWPINS found the ring full");
    check_eq(cb.missed, 0, "no missed events");
    check(ordered, "every record carries its instruction address");
    __llwpcb(0);
    check(__slwpcb() == 0, "llwpcb 0 turns LWP off");
    if (leaf->edx & LWP_CNH)
        profile_shape();
    return done();
}
