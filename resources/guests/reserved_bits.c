/* The CPU as the oracle for the guard's reserved bits (docs/security.md,
 * tests/reserved_bits.rs). Each case sets one bit in one entry of the probe
 * mapping (reserved_bits.S), then:
 *   - a CPL3 store through it, which faults with PFEC.RSVD where the CPU
 *     finds a reserved bit (on shadow-paging hosts such as kvm_pvm, KVM's
 *     MMU walks the guest's tables and decides, by the guest's CPUID);
 *   - LLWPCB with its ring on the same page, which the guard checks as a
 *     CPL3 store.
 * and prints both answers: 0 for a store that went through, the #PF error
 * code, or 0x10000 | vector for any other fault (0x20000 more when CR2 is
 * not the address). The guest checks that they agree; so does the host.
 * On a bare KVM VM (cmdline bare=1: no LWP there) only the CPU's answers
 * are printed, each followed by a mark on port 0x80 at which the host runs
 * the guard on the same mapping. */
#include <x86intrin.h>
#include "lib.h"
#include "lwp.h"

extern u64 pml4[512], probe_pdpt[512], probe_pd[512], probe_pt[512];
extern u8 probe_page[4096];
extern char guest_vendor[16];
extern volatile u64 guest_maxphyaddr;

#define XD 63
/* Bit numbers that stand for something else. */
#define NONE 64         /* the entry as it is */
#define MAXPHY 65       /* bit MAXPHYADDR */

enum page { P4K, P2M, P1G };

struct probe {
    const char *what;
    u64 *entry;
    enum page page;
    u32 bit;
    int nxe;
};

static const struct probe probes[] = {
    {"PML4E bit 7 (PS)", &pml4[1], P4K, 7, 1},
    {"PML4E bit 8", &pml4[1], P4K, 8, 1},
    {"PML4E bit MAXPHYADDR", &pml4[1], P4K, MAXPHY, 1},
    {"PML4E bit 51", &pml4[1], P4K, 51, 1},
    {"PML4E bit 52", &pml4[1], P4K, 52, 1},
    {"PML4E bit 63, EFER.NXE on", &pml4[1], P4K, XD, 1},
    {"PML4E bit 63, EFER.NXE off", &pml4[1], P4K, XD, 0},
    {"PDPTE bit 8", &probe_pdpt[0], P4K, 8, 1},
    {"PDPTE bit MAXPHYADDR", &probe_pdpt[0], P4K, MAXPHY, 1},
    {"PDPTE bit 63, EFER.NXE on", &probe_pdpt[0], P4K, XD, 1},
    {"PDPTE bit 63, EFER.NXE off", &probe_pdpt[0], P4K, XD, 0},
    {"1 GiB PDPTE (PS)", &probe_pdpt[1], P1G, NONE, 1},
    {"1 GiB PDPTE bit 8 (G)", &probe_pdpt[1], P1G, 8, 1},
    {"1 GiB PDPTE bit 13", &probe_pdpt[1], P1G, 13, 1},
    {"1 GiB PDPTE bit 29", &probe_pdpt[1], P1G, 29, 1},
    {"1 GiB PDPTE bit MAXPHYADDR", &probe_pdpt[1], P1G, MAXPHY, 1},
    {"1 GiB PDPTE bit 63, EFER.NXE off", &probe_pdpt[1], P1G, XD, 0},
    {"PDE bit 8", &probe_pd[0], P4K, 8, 1},
    {"PDE bit MAXPHYADDR", &probe_pd[0], P4K, MAXPHY, 1},
    {"PDE bit 63, EFER.NXE on", &probe_pd[0], P4K, XD, 1},
    {"PDE bit 63, EFER.NXE off", &probe_pd[0], P4K, XD, 0},
    {"2 MiB PDE (PS)", &probe_pd[1], P2M, NONE, 1},
    {"2 MiB PDE bit 8 (G)", &probe_pd[1], P2M, 8, 1},
    {"2 MiB PDE bit 12 (PAT)", &probe_pd[1], P2M, 12, 1},
    {"2 MiB PDE bit 13", &probe_pd[1], P2M, 13, 1},
    {"2 MiB PDE bit 20", &probe_pd[1], P2M, 20, 1},
    {"2 MiB PDE bit MAXPHYADDR", &probe_pd[1], P2M, MAXPHY, 1},
    {"2 MiB PDE bit 63, EFER.NXE off", &probe_pd[1], P2M, XD, 0},
    {"PTE", &probe_pt[0], P4K, NONE, 1},
    {"PTE bit 7 (PAT)", &probe_pt[0], P4K, 7, 1},
    {"PTE bit 8 (G)", &probe_pt[0], P4K, 8, 1},
    {"PTE bit MAXPHYADDR", &probe_pt[0], P4K, MAXPHY, 1},
    {"PTE bit 51", &probe_pt[0], P4K, 51, 1},
    {"PTE bit 52", &probe_pt[0], P4K, 52, 1},
    {"PTE bit 63, EFER.NXE on", &probe_pt[0], P4K, XD, 1},
    {"PTE bit 63, EFER.NXE off", &probe_pt[0], P4K, XD, 0},
};

static struct lwpcb cb __attribute__((aligned(64)));

static u64 address_of(enum page page)
{
    switch (page) {
    case P2M:
        return 0x8000200000ull + ((u64)probe_page & 0x1fffff);
    case P1G:
        return 0x8040000000ull + (u64)probe_page;
    default:
        return 0x8000000000ull;
    }
}

/* Through reserved_bits.S's #DE handler: a division by zero that resumes
 * at label 1. */
static void set_entry(u64 *entry, u64 value, int nxe)
{
    register u64 want_nxe __asm__("r9") = (u64)nxe;
    __asm__ volatile("lea 1f(%%rip), %%r8\n"
                     "xor %%ecx, %%ecx\n"
                     "div %%rcx\n"
                     "1:"
                     :
                     : "D"(entry), "S"(value), "r"(want_nxe)
                     : "rax", "rcx", "rdx", "r8", "memory");
}

/* What the fault recorder saw since `before`, as the header says. */
static u64 outcome(u64 before, u64 at)
{
    if (fault_count == before)
        return 0;
    u64 code = fault_vector == 14 ? fault_error : 0x10000 | fault_vector;
    return fault_vector == 14 && fault_cr2 != at ? code | 0x20000 : code;
}

/* A CPL3 store to `at`. */
static u64 cpu_store(u64 at)
{
    u64 before = fault_count;
    __asm__ volatile("lea 1f(%%rip), %%rax\n"
                     "mov %%rax, fault_resume(%%rip)\n"
                     "movl $1, (%0)\n"
                     "1: movq $0, fault_resume(%%rip)"
                     :
                     : "r"(at)
                     : "rax", "memory");
    return outcome(before, at);
}

/* LLWPCB with a one-page ring at `at`: the guard checks the ring page as a
 * CPL3 store. A block that loads is unloaded again. */
static u64 lwp_store(u64 at)
{
    cb.buffer_base = at;
    cb.buffer_size = 4096;
    u64 before = fault_count;
    if (llwpcb_faults((u64)&cb) == 0) {
        __llwpcb(0);
        return 0;
    }
    return outcome(before, at);
}

int main(void)
{
    int bare = cmdline_number("bare", 0) != 0;
    const struct cpuid_entry *ext = cpuid_of(0x80000001);
    u64 maxphy = guest_maxphyaddr;
    puts("reserved_bits: guest vendor ");
    puts(guest_vendor);
    puts(", MAXPHYADDR ");
    put_dec(maxphy);
    puts(ext && (ext->edx & (1u << 26)) ? ", Page1GB" : ", no Page1GB");
    puts(ext && (ext->edx & (1u << 20)) ? ", NX\n" : ", no NX\n");
    u32 ran = 0;
    for (u32 i = 0; i < sizeof(probes) / sizeof(probes[0]); i++) {
        const struct probe *p = &probes[i];
        u32 bit = p->bit == MAXPHY ? (u32)maxphy : p->bit;
        if (p->bit == MAXPHY && maxphy >= 52) {
            puts("probe ");
            puts(p->what);
            puts(": skipped, MAXPHYADDR is 52\n");
            continue;
        }
        u64 at = address_of(p->page);
        u64 old = *p->entry;
        set_entry(p->entry, bit == NONE ? old : old | 1ull << bit, p->nxe);
        u64 cpu = cpu_store(at);
        puts("probe ");
        puts(p->what);
        puts(": cpu ");
        put_hex(cpu);
        if (bare) {
            /* The host runs the guard on this mapping now: RDI the
             * address, RSI what the CPU did. */
            putc('\n');
            __asm__ volatile("outb %%al, $0x80" : : "a"(0), "D"(at), "S"(cpu) : "memory");
        } else {
            u64 lwp = lwp_store(at);
            puts(" lwp ");
            put_hex(lwp);
            putc('\n');
            check_eq(lwp, cpu, p->what);
        }
        set_entry(p->entry, old, 1);
        ran++;
    }
    check(ran >= 30, "the cases ran");
    check_eq(cpu_store(address_of(P4K)), 0, "the probe page is writable again");
    return done();
}
