/* Two vCPUs, each with its own LWPCB and ring, inserting records at the
 * same time: every ring must hold exactly its own CPU's records, with that
 * CPU's CoreId (the runtime sets CoreId = APIC ID). */
#include <x86intrin.h>
#include "lib.h"
#include "lwp.h"

#define RECORDS 200
#define SLOTS 256

struct cpu {
    struct lwpcb cb __attribute__((aligned(64)));
    struct lwp_record ring[SLOTS] __attribute__((aligned(4096)));
};

static struct cpu cpus[2];
static volatile u32 ap_done;

static void insert(u32 id)
{
    struct cpu *c = &cpus[id];
    c->cb.buffer_size = sizeof(c->ring);
    c->cb.buffer_base = (u64)c->ring;
    __llwpcb(&c->cb);
    for (u32 i = 0; i < RECORDS; i++)
        __lwpins32(i, 0xc0de0000 | id, 0);
    __slwpcb();
}

void ap_main(void)
{
    insert(1);
    ap_done = 1;
}

int main(void)
{
    insert(0);
    u64 spins = 0;
    while (!ap_done && spins < 4000000000ull)
        spins++;
    check(ap_done, "the second vCPU ran its program");
    for (u32 id = 0; id < 2; id++) {
        const struct cpu *c = &cpus[id];
        u32 own = 0, foreign = 0, core = 0;
        for (u32 i = 0; i < c->cb.head / sizeof(struct lwp_record); i++) {
            if (c->ring[i].data1 == (0xc0de0000 | id) && c->ring[i].data2 == own)
                own++;
            else
                foreign++;
            core += c->ring[i].core_id == id;
        }
        check_eq(own, RECORDS, id ? "vCPU 1's ring: all its records, in order" : "vCPU 0's ring: all its records, in order");
        check_eq(foreign, 0, "no record of the other vCPU");
        check_eq(core, RECORDS, "every record carries its CPU's CoreId");
    }
    return done();
}
