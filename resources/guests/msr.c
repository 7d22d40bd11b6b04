/* The LWP MSRs from CPL0, against the read/write/#GP table of
 * docs/lwp-model.md (M1-M3, B1-B3) for the `emulated` profile; with no LWP
 * every access must #GP. */
#include "lib.h"

#define CFG 0xc0000105u
#define CBADDR 0xc0000106u
#define RD 1
#define WR 2

struct msr_op { u32 op, msr; u64 value, result, faulted; };

struct msr_op msr_ops[] = {
    { RD, CFG, 0, 0, 0 },
    { WR, CFG, 0x2, 0, 0 },
    { RD, CFG, 0, 0, 0 },
    { WR, CFG, 1u << 2, 0, 0 },
    { WR, CFG, 1u << 7, 0, 0 },
    { RD, CFG, 0, 0, 0 },
    { WR, CFG, 0xffff000000000003ull, 0, 0 },
    { RD, CFG, 0, 0, 0 },
    { WR, CFG, 0x00001f0580000000ull, 0, 0 },
    { RD, CFG, 0, 0, 0 },
    { RD, CBADDR, 0, 0, 0 },
    { WR, CBADDR, 0x1000, 0, 0 },
    { WR, CBADDR, 0, 0, 0 },
    { RD, CBADDR, 0, 0, 0 },
    { 0, 0, 0, 0, 0 },
};

/* Expected (faulted, value read) per entry for the emulated profile. */
static const struct { u64 faulted, read; } emulated[] = {
    { 0, 0x00004000e0000062ull }, /* the runtime enabled every feature, vector 0x40 */
    { 0, 0 },
    { 0, 0x2 },
    { 1, 0 },                     /* IRE is not in the emulated profile */
    { 1, 0 },                     /* reserved bit 7 */
    { 0, 0x2 },                   /* refused writes change nothing */
    { 0, 0 },                     /* bit 0 and 63:48 ignored */
    { 0, 0x2 },
    { 0, 0 },                     /* CoreId 5, vector 0x1f accepted */
    { 0, 0x00001f0580000000ull },
    { 0, 0 },                     /* LWP off: LWP_CBADDR reads 0 */
    { 1, 0 },                     /* non-zero LWP_CBADDR write */
    { 0, 0 },
    { 0, 0 },
};

int main(void)
{
    int lwp = (cpuid_of(0x80000001)->ecx >> 15) & 1;
    puts(lwp ? "msr: LWP offered\n" : "msr: no LWP\n");
    for (u32 i = 0; msr_ops[i].op; i++) {
        const struct msr_op *o = &msr_ops[i];
        puts(o->op == RD ? "rdmsr " : "wrmsr ");
        put_hex(o->msr);
        if (o->op == WR) {
            puts(" <- ");
            put_hex(o->value);
        }
        if (o->faulted) {
            puts(": #GP\n");
        } else if (o->op == RD) {
            puts(" = ");
            put_hex(o->result);
            putc('\n');
        } else {
            puts(": ok\n");
        }
        u64 want_fault = lwp ? emulated[i].faulted : 1;
        check_eq(o->faulted, want_fault, "#GP as documented");
        if (o->op == RD && !o->faulted)
            check_eq(o->result, emulated[i].read, "value read as documented");
    }
    return done();
}
