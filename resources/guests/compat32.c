/* LWP instructions in a 32-bit code segment: CPL3 code far-calls into
 * compatibility mode (selector 0x5b, runtime.S's GDT), runs LLWPCB, LWPINS
 * (a register and a memory operand), LWPVAL and SLWPCB there, through the
 * same #UD doorbell, and far-returns. In 32-bit code XOP.W and the R, X and
 * B bits are ignored: the LLWPCB is encoded with XOP.W and XOP.B set, which
 * in 64-bit code would be `llwpcb %r8`. The records are then checked from
 * 64-bit code. */
#include <x86intrin.h>
#include "lib.h"
#include "lwp.h"

#define SLOTS 32
#define USER_CS32 0x5b

static struct lwpcb cb __attribute__((aligned(64)));
static struct lwp_record ring[SLOTS] __attribute__((aligned(4096)));
static volatile u32 operand = 0x32323232;

/* What the 32-bit code takes and leaves. */
struct compat_io {
    u32 lwpcb;          /* in: EAX for LLWPCB */
    u32 operand;        /* in: the address of LWPINS's memory operand */
    u32 slwpcb;         /* out: what SLWPCB returned */
    u32 ips[3];         /* out: the LWPINS, LWPINS and LWPVAL addresses */
};

static struct compat_io io;

/* The 32-bit code: ESI points at `io`. */
__asm__(".text\n"
        ".code32\n"
        "compat32_entry:\n"
        "    mov 0(%esi), %eax\n"
        "    .byte 0x8f, 0xc9, 0xf8, 0x12, 0xc0\n"      /* llwpcb %eax (XOP.W, XOP.B) */
        "    mov $0x11111111, %edx\n"
        "    mov $0x22222222, %ecx\n"
        "1:  lwpins $0x3201, %ecx, %edx\n"
        "    movl $1b, 12(%esi)\n"
        "    mov 4(%esi), %ebx\n"
        "2:  lwpins $0x3202, (%ebx), %edx\n"
        "    movl $2b, 16(%esi)\n"
        "3:  lwpval $0x3203, %ecx, %edx\n"
        "    movl $3b, 20(%esi)\n"
        "    slwpcb %eax\n"
        "    mov %eax, 8(%esi)\n"
        "    lret\n"
        ".code64\n");
extern char compat32_entry[];

/* Far-calls the 32-bit code (a 32-bit far pointer: offset, selector). */
static void run32(void)
{
    static struct { u32 offset; u16 selector; } __attribute__((packed)) target;

    target.offset = (u32)(u64)compat32_entry;
    target.selector = USER_CS32;
    __asm__ volatile("lcall *%0" : : "m"(target), "S"(&io)
                     : "rax", "rbx", "rcx", "rdx", "cc", "memory");
}

int main(void)
{
    cb.flags = LWP_VAL;
    cb.buffer_size = sizeof(ring);
    cb.buffer_base = (u64)ring;
    io.lwpcb = (u32)(u64)&cb;
    io.operand = (u32)(u64)&operand;
    run32();
    check_eq((u64)__slwpcb(), (u64)&cb, "llwpcb %eax in 32-bit code, encoded with XOP.W and XOP.B");
    check_eq(io.slwpcb, (u32)(u64)&cb, "slwpcb in 32-bit code");
    check_eq(cb.head, 3 * sizeof(struct lwp_record), "three records from 32-bit code");
    check_eq(ring[0].event_id, 255, "lwpins record: EventId 255");
    check_eq(ring[0].data1, 0x22222222, "lwpins record: Data1 = ecx");
    check_eq(ring[0].data2, 0x11111111, "lwpins record: Data2 = edx");
    check_eq(ring[0].flags, 0x3201, "lwpins record: EventFlags");
    check_eq(ring[0].ip, io.ips[0], "lwpins record: its 32-bit address");
    check_eq(ring[1].data1, 0x32323232, "lwpins with a 32-bit memory operand");
    check_eq(ring[1].ip, io.ips[1], "second record's address");
    check_eq(ring[2].event_id, 1, "lwpval record: EventId 1");
    check_eq(ring[2].data1, 0x22222222, "lwpval record: Data1");
    check_eq(ring[2].ip, io.ips[2], "lwpval record's address");
    __llwpcb(0);
    return done();
}
