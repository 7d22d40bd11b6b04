/* Precise events by single-stepping (the `precise` profile): a CPL3 loop
 * of known length with IRE and BRE enabled, intervals 15 and counters 15,
 * so a record is due every 16th instruction and every 16th branch.
 *
 * Counted while the LWPCB is live: mov (1), 96 x (dec + jnz) (192), slwpcb
 * (1), xor (1) = 195 instructions -> 12 IRE records, each at the 16k-th
 * instruction, which is always a `dec`; 96 branches -> 6 BRE records, the
 * first five taken to the loop and the last (the 96th, not taken) with the
 * loop as its target.
 *
 * Then a stepped loop that rings the #DB doorbell itself from CPL3 (its port
 * opened by precise.S): lwpvmm must refuse the ring without losing its place
 * in the stepping, so every instruction is still counted and no stray #DB
 * reaches the guest. */
#include <x86intrin.h>
#include "lib.h"
#include "lwp.h"

static struct lwpcb cb __attribute__((aligned(64)));
static struct lwp_record ring[64] __attribute__((aligned(4096)));

int main(void)
{
    cb.flags = LWP_IRE | LWP_BRE;
    cb.buffer_size = sizeof(ring);
    cb.buffer_base = (u64)ring;
    cb.events[1].interval = 15;
    cb.events[1].counter = 15;
    cb.events[2].interval = 15;
    cb.events[2].counter = 15;
    u64 loop, jnz;
    __asm__ volatile("lea 2f(%%rip), %0\n"
                     "lea 3f(%%rip), %1\n"
                     "llwpcb %2\n"
                     "mov $96, %%ecx\n"
                     "2: dec %%ecx\n"
                     "3: jnz 2b\n"
                     "slwpcb %%rdx\n"
                     "xor %%eax, %%eax\n"
                     "llwpcb %%rax"
                     : "=&r"(loop), "=&r"(jnz)
                     : "r"(&cb)
                     : "rax", "rcx", "rdx", "cc", "memory");
    check_eq(cb.flags, LWP_IRE | LWP_BRE, "llwpcb granted IRE and BRE");
    u32 ire = 0, ire_at_dec = 0, bre = 0, bre_ok = 0;
    for (u32 i = 0; i < cb.head / sizeof(struct lwp_record); i++) {
        const struct lwp_record *r = &ring[i];
        if (r->event_id == 2) {
            ire++;
            ire_at_dec += r->ip == loop;
        } else if (r->event_id == 3) {
            bre++;
            int last = bre == 6;
            bre_ok += r->ip == jnz && r->data2 == loop && (r->flags & 1) == (last ? 0 : 1);
        }
    }
    check_eq(ire, 12, "IRE: floor(195 / 16) records");
    check_eq(ire_at_dec, 12, "IRE records at the retiring instruction");
    check_eq(bre, 6, "BRE: floor(96 / 16) records");
    check_eq(bre_ok, 6, "BRE records: the branch, its target, taken or not");

    /* IRE with the counter at 11: the 12th instruction (mov, 3 x (out, dec,
     * jnz), slwpcb, then xor) makes the one record, at the xor. */
    cb.flags = LWP_IRE;
    cb.head = 0;
    cb.events[1].interval = 15;
    cb.events[1].counter = 11;
    memset(ring, 0, sizeof(ring));
    u64 faults_before = fault_count, twelfth;
    __asm__ volatile("lea 3f(%%rip), %0\n"
                     "llwpcb %1\n"
                     "mov $3, %%ecx\n"
                     "2: out %%al, $0x5b\n"
                     "dec %%ecx\n"
                     "jnz 2b\n"
                     "slwpcb %%rdx\n"
                     "3: xor %%eax, %%eax\n"
                     "llwpcb %%rax"
                     : "=&r"(twelfth)
                     : "r"(&cb)
                     : "rax", "rcx", "rdx", "cc", "memory");
    check_eq(fault_count, faults_before, "a CPL3 ring of the #DB doorbell reaches no handler");
    check_eq(cb.head / sizeof(struct lwp_record), 1, "and stepping goes on: one IRE record");
    check_eq(ring[0].ip, twelfth, "at the 12th instruction: none was lost");

    /* The guest's own single-step still reaches its own #DB handler. */
    u64 faults = fault_count;
    __asm__ volatile("lea 1f(%%rip), %%rax\n"
                     "mov %%rax, fault_resume(%%rip)\n"
                     "pushfq\n"
                     "orq $0x100, (%%rsp)\n"
                     "popfq\n"
                     "nop\n"
                     "1: movq $0, fault_resume(%%rip)"
                     :
                     :
                     : "rax", "cc", "memory");
    check_eq(fault_count - faults, 1, "the guest's own trap flag: its own #DB");
    check_eq(fault_vector, 1, "vector 1");
    return done();
}
