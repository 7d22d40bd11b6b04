/* A deterministic LWP workload for snapshot tests: LWPVAL and LWPINS
 * records into a small ring that fills (MissedEvents) and that software
 * drains now and then (the ring wraps). At the end it prints a digest of
 * the whole ring, the head, the tail, MissedEvents and the LWPVAL counter:
 * an uninterrupted run and a run restored from a snapshot taken midway
 * must print the same line. `iterations=` sets the length; `snap=N` writes
 * to the snapshot debug port at iteration N (lwpvmm takes a snapshot there
 * with --snapshot-on-port); `precise=1` adds instructions and branches
 * retired (without timestamps, so the records stay deterministic).
 * For the snapshot benchmark, `fill=MiB` writes every page of that many
 * MiB from 32 MiB on before the snapshot point (what the guest touched),
 * and `touch=MiB` writes every page of that many MiB after it (a restored
 * guest's working set), printing the TSC cycles that took; `snap2=N`
 * writes to the snapshot port again at iteration N (a diff snapshot). */
#include <x86intrin.h>
#include "lib.h"
#include "lwp.h"

#define SLOTS 64

static struct lwpcb cb __attribute__((aligned(64)));
static struct lwp_record ring[SLOTS] __attribute__((aligned(4096)));

/* Writes a word into every 4 KiB page of `mib` MiB from 32 MiB on
 * (identity-mapped, user, free in every guest of 64 MiB or more). */
static void touch_pages(u64 mib, u64 value)
{
    volatile u64 *p = (volatile u64 *)(32ull << 20);
    for (u64 i = 0; i < (mib << 20) / 8; i += 512)
        p[i] = value + i;
}

static u64 rdtsc_now(void)
{
    u32 lo, hi;
    __asm__ volatile("lfence; rdtsc" : "=a"(lo), "=d"(hi));
    return ((u64)hi << 32) | lo;
}

static u64 fnv(const void *p, u64 n, u64 h)
{
    const u8 *b = p;
    while (n--) {
        h ^= *b++;
        h *= 0x100000001b3ull;
    }
    return h;
}

int main(void)
{
    u64 n = cmdline_number("iterations", 6000);
    u64 snap = cmdline_number("snap", ~0ull);
    u64 fill = cmdline_number("fill", 0);
    u64 touch = cmdline_number("touch", 0);
    u64 snap2 = cmdline_number("snap2", ~0ull);
    puts("replay: starting\n");
    cb.flags = LWP_VAL;
    if (cmdline_number("precise", 0)) {
        cb.flags |= LWP_IRE | LWP_BRE;
        cb.events[1].interval = 63;
        cb.events[2].interval = 15;
    }
    cb.buffer_size = sizeof(ring);
    cb.buffer_base = (u64)ring;
    cb.events[0].interval = 3;
    __llwpcb(&cb);
    for (u64 i = 0; i < n; i++) {
        if (i == snap) {
            touch_pages(fill, 1);
            __asm__ volatile("outb %%al, $0x5a" : : "a"(0) : "memory");
            if (touch) {
                u64 t0 = rdtsc_now();
                touch_pages(touch, 2);
                u64 t1 = rdtsc_now();
                puts("replay: touched ");
                put_dec(touch);
                puts(" MiB in ");
                put_dec(t1 - t0);
                puts(" cycles\n");
            }
        }
        if (i == snap2)
            __asm__ volatile("outb %%al, $0x5a" : : "a"(0) : "memory");
        __lwpval32((u32)(i * 3), (u32)i, 1);
        if (i % 7 == 0)
            __lwpins32((u32)i, 0x55, 2);
        if (i % 500 == 499) {
            __slwpcb();
            cb.tail = (cb.head + sizeof(ring) - 8 * sizeof(struct lwp_record)) % sizeof(ring);
        }
        if (i % 1000 == 0) {
            puts("replay: step ");
            put_dec(i);
            putc('\n');
        }
    }
    __slwpcb();
    u64 h = fnv(ring, sizeof(ring), 0xcbf29ce484222325ull);
    puts("replay digest ");
    put_hex(h);
    puts(" head ");
    put_dec(cb.head);
    puts(" tail ");
    put_dec(cb.tail);
    puts(" missed ");
    put_dec(cb.missed);
    puts(" counter ");
    put_dec(cb.events[0].counter);
    puts(" flags ");
    put_hex(cb.flags);
    putc('\n');
    return 0;
}
