/* The privilege guest: the CPL of a context is SS.DPL (or CS.RPL), never
 * CS.DPL. A CPL3 program that far-returns into the runtime's DPL-0
 * conforming code segment stays at CPL3 while CS.DPL reads 0; from there it
 * makes an LWP state save into a supervisor-only page and rings the #UD
 * doorbell with a forged kernel frame whose LWPINS reads a kernel secret.
 * lwpvmm must refuse both. privilege.S rings doorbells at CPL0 with frames
 * the CPU could not have pushed. docs/security.md. */
#include <x86intrin.h>
#include "lib.h"
#include "lwp.h"

#define SECRET 0x5ec2e7u
#define W0 0x400000ull
#define CONFORMING_CPL3 0x53

extern u64 frame_results[5];
extern char lwpins_site[];

static struct lwpcb cb __attribute__((aligned(64)));
static struct lwp_record ring[64] __attribute__((aligned(4096)));

/* An LWP state save (operation 1) into `area`, made in the conforming
 * segment at CPL3; returns RAX. */
static u64 save_from_conforming(u64 area)
{
    u64 status;
    __asm__ volatile("pushq %[cs]\n"
                     "lea 1f(%%rip), %%rax\n"
                     "pushq %%rax\n"
                     "lretq\n"
                     "1: mov $1, %%eax\n"
                     "out %%al, $0x5d\n"
                     "mov %%rax, %%rdx\n"
                     "pushq $0x23\n"
                     "lea 2f(%%rip), %%rax\n"
                     "pushq %%rax\n"
                     "lretq\n"
                     "2: mov %%rdx, %[status]\n"
                     : [status] "=r"(status)
                     : [cs] "i"(CONFORMING_CPL3), "D"(area)
                     /* A state call writes RDX, RCX and R8 (docs/pv-abi.md). */
                     : "rax", "rcx", "rdx", "r8", "memory");
    return status;
}

/* The #UD doorbell rung in the conforming segment at CPL3 with a forged
 * kernel frame (CS 0x08) whose RIP is the LWPINS at lwpins_site, with RBX
 * pointing at the secret; returns the RFLAGS.CF lwpvmm answered. */
static u64 forged_doorbell_from_conforming(void)
{
    u64 cf;
    __asm__ volatile("pushq %[cs]\n"
                     "lea 1f(%%rip), %%rax\n"
                     "pushq %%rax\n"
                     "lretq\n"
                     "1: mov %%rsp, %%r12\n"
                     "pushq $0x10\n"
                     "pushq %%r12\n"
                     "pushq $0x2\n"
                     "pushq $0x08\n"
                     "pushq %[site]\n"
                     "clc\n"
                     "out %%al, $0x5c\n"
                     "pushfq\n"
                     "popq %%rdx\n"
                     "mov %%r12, %%rsp\n"
                     "pushq $0x23\n"
                     "lea 2f(%%rip), %%rax\n"
                     "pushq %%rax\n"
                     "lretq\n"
                     "2: and $1, %%edx\n"
                     "mov %%rdx, %[cf]\n"
                     : [cf] "=r"(cf)
                     : [cs] "i"(CONFORMING_CPL3), [site] "r"(lwpins_site), "b"(W0)
                     : "rax", "rdx", "r12", "memory", "cc");
    return cf;
}

static int ring_holds(u32 value)
{
    for (u32 i = 0; i < sizeof(ring) / sizeof(ring[0]); i++)
        if (ring[i].event_id && ring[i].data1 == value)
            return 1;
    return 0;
}

int main(void)
{
    puts("# doorbells at CPL0 with frames the CPU could not push\n");
    check_eq(frame_results[0], 1, "CS.RPL 0 with SS.RPL 3: refused");
    check_eq(frame_results[1], 1, "kernel CS with RPL 3: refused");
    check_eq(frame_results[2], 1, "user CS with RPL 0: refused");
    check_eq(frame_results[3], 0, "a kernel frame the CPU pushes: handled");
    check_eq(frame_results[4], 0, "a frame from the conforming segment at CPL3: handled");

    puts("# CPL3 in a DPL-0 conforming code segment\n");
    cb.buffer_size = sizeof(ring);
    cb.buffer_base = (u64)ring;
    __llwpcb(&cb);
    u32 head = cb.head;
    /* Status 0 would mean lwpvmm wrote 128 bytes into the supervisor page
     * (which CPL3 cannot read back to check). */
    check_eq(save_from_conforming(W0 + 0x800), 4, "a state save from it: refused as a CPL3 call");
    check_eq(forged_doorbell_from_conforming(), 1, "the #UD doorbell from it: refused");
    __slwpcb();
    check_eq(cb.head, head, "no record was stored");
    check(!ring_holds(SECRET), "the kernel secret is in no record");
    __llwpcb(0);
    return done();
}
