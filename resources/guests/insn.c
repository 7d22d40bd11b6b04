/* Each LWP instruction from CPL3 through the #UD shim, with the records
 * checked field by field: EventId, CoreId, EventFlags, Data1, Data2 and
 * InstructionAddress (the instruction's own address); LWPINS's CF on a full
 * ring and MissedEvents; LWPVAL every interval + 1; SLWPCB's flush. */
#include <x86intrin.h>
#include "lib.h"
#include "lwp.h"

#define SLOTS 32

static struct lwpcb cb __attribute__((aligned(64)));
static struct lwp_record ring[SLOTS] __attribute__((aligned(4096)));
static volatile u32 memory_operand = 0x600dcafe;

/* Loaded and read back by the CPL0 hook (insn.S). */
static struct lwp_record cpl0_ring[32] __attribute__((aligned(4096)));
struct lwpcb cpl0_cb = { .buffer_size = sizeof(cpl0_ring), .buffer_base = (u64)cpl0_ring };
u64 cpl0_slwpcb;

static u8 lwpins_at(u64 data2, u32 data1, u64 *ip)
{
    u8 cf;
    __asm__ volatile("lea 1f(%%rip), %0\n"
                     "1: lwpins $0x1234, %%ecx, %%rax\n"
                     "setc %1"
                     : "=&r"(*ip), "=r"(cf)
                     : "a"(data2), "c"(data1)
                     : "cc", "memory");
    return cf;
}

static void load(u32 flags, u32 interval1)
{
    memset(&cb, 0, sizeof(cb));
    memset(ring, 0, sizeof(ring));
    cb.flags = flags;
    cb.buffer_size = sizeof(ring);
    cb.buffer_base = (u64)ring;
    cb.events[0].interval = interval1;
    __llwpcb(&cb);
}

static u32 records(void)
{
    __slwpcb();
    return (cb.head - cb.tail) / sizeof(struct lwp_record);
}

int main(void)
{
    check_eq(cpl0_slwpcb, (u64)&cpl0_cb, "llwpcb and slwpcb at CPL0");
    check_eq((u64)__slwpcb(), 0, "llwpcb 0 at CPL0 turned LWP off");
    load(LWP_VAL | LWP_PTSC, 2);
    check_eq(cb.flags, LWP_VAL | LWP_PTSC, "llwpcb writes back the granted flags");
    check_eq((u64)__slwpcb(), (u64)&cb, "slwpcb returns the LWPCB address");

    u64 ip;
    u8 cf = lwpins_at(0x1122334455667788ull, 0xabcdef01, &ip);
    check_eq(cf, 0, "lwpins stored: CF=0");
    const struct lwp_record *r = &ring[0];
    check_eq(r->event_id, 255, "lwpins record: EventId 255");
    check_eq(r->core_id, 5, "lwpins record: CoreId from LWP_CFG");
    check_eq(r->flags, 0x1234, "lwpins record: EventFlags = imm32");
    check_eq(r->data1, 0xabcdef01, "lwpins record: Data1 = r/m32");
    check_eq(r->data2, 0x1122334455667788ull, "lwpins record: Data2 = 64-bit vvvv register");
    check_eq(r->ip, ip, "lwpins record: InstructionAddress = the instruction");
    check(r->timestamp != 0, "lwpins record: PTSC timestamp");

    u64 ip2;
    __asm__ volatile("lea 1f(%%rip), %0\n"
                     "1: lwpins $7, %1, %%edx"
                     : "=&r"(ip2)
                     : "m"(memory_operand), "d"(0x99)
                     : "cc", "memory");
    check_eq(ring[1].data1, 0x600dcafe, "lwpins with a memory r/m32 operand");
    check_eq(ring[1].data2, 0x99, "lwpins with a 32-bit vvvv register");
    check_eq(ring[1].ip, ip2, "second record's InstructionAddress");
    check_eq(records(), 2, "slwpcb flushes the head: 2 records");

    for (u32 i = 0; i < 7; i++)
        __lwpval32(i + 100, i, 0x42);
    check_eq(records(), 5, "lwpval with interval 2: records at runs 1, 4 and 7");
    check_eq(ring[2].event_id, 1, "lwpval record: EventId 1");
    check_eq(ring[2].data1, 0, "lwpval record: Data1");
    check_eq(ring[2].data2, 100, "lwpval record: Data2");
    check_eq(ring[3].data1, 3, "second lwpval record after 3 more runs");
    check_eq(ring[4].data1, 6, "third lwpval record");

    u32 stored = 0, full = 0;
    /* 5 records are in; 26 more fill the ring, the last 4 find it full. */
    for (u32 i = 0; i < SLOTS - 1 - 5 + 4; i++) {
        if (__lwpins32(i, i, 0))
            full++;
        else
            stored++;
    }
    check_eq(stored, SLOTS - 1 - 5, "the ring keeps one slot free");
    check_eq(full, 4, "lwpins on a full ring: CF=1");
    __slwpcb();
    check_eq(cb.missed, 4, "MissedEvents counts them");
    cb.tail = cb.head;
    check_eq(__lwpins32(1, 2, 3), 0, "after software consumes the ring, lwpins stores again");

    u32 low;
    __asm__ volatile("slwpcb %0" : "=r"(low));
    check_eq(low, (u32)(u64)&cb, "slwpcb into a 32-bit register");
    __llwpcb(0);
    check_eq((u64)__slwpcb(), 0, "llwpcb 0: LWP off");
    check_eq(__lwpins32(1, 2, 3), 0, "lwpins with LWP off: CF=0");
    return done();
}
