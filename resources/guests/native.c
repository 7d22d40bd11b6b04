/* The `native` guest: a kernel for the host's native supervisor mode that
 * measures what the mode gives (docs/pv-abi.md, "Native supervisor mode";
 * `cargo bench --bench vmm -- native`). It times `iterations=N` turns of a
 * loop at CPL0 and, with `user=1`, at CPL3 (entered by SYSRETQ), then
 * `exits=K` port exits at CPL0, prints the TSC cycles of each, and ends
 * through the exit port. `probe=1` first prints what RDMSR of the mode's
 * MSR gives the kernel (a host without the MSR would #GP) and, in native
 * mode, lwpvmm's and LWP's CPUID leaves from its page; `snap=1` before
 * that writes the snapshot debug port (a snapshot there, with
 * --snapshot-on-port). `supervisor_page=1`
 * then breaks the mode's first rule: it clears U in the boot page
 * directory entry that maps its own code (lwpvmm's identity map at
 * 0x9000: PML4, PDPT, then the first page directory at 0xb000), which in
 * native mode leaves KVM_RUN spinning at the next instruction.
 * `isolation=1` asks whether a kernel can keep user mode out of its memory
 * in native mode, where every page it touches must be U=1: it writes a
 * secret at 4 MiB, reads it from user mode on its own page tables (which
 * the native guest's user mode then reaches), and again on user page
 * tables that map only the first 2 MiB (where this guest, its IDT, GDT and
 * TSS and the entry code lie, as KPTI's entry area), entering user mode by
 * SYSRETQ each time and taking the fault through its own IDT and TSS.
 * `trampoline=1` asks whether an exception taken in user mode can return
 * there with every register the user had, although the only way back is
 * SYSRETQ, which overwrites RCX and R11: through a return trampoline in
 * user memory (native.S, trampoline_probe). `halt=1` asks how HLT and the
 * page's interrupt flag (byte 0) and pending byte (byte 1) work together
 * with the LAPIC timer, and whether lwpvmm's halt (the power port's value
 * 2) sleeps until the tick. `events=1` asks where interrupts and
 * exceptions land in the mode and what they do to the page's IF: from
 * kernel and user mode, with the page's IF on and off, pending as the IF
 * is set before SWAPGS and SYSRETQ, through an IST gate, and whether user
 * mode reaches the kernel's half (a -2 GiB alias) before and after kernel
 * mode has. `smp=1` (with two vCPUs) starts the second from the SIPI's
 * real mode into long mode and native mode, times its CPL0 loop, and sends
 * IPIs both ways, the second vCPU asleep in lwpvmm's halt for the BSP's. */

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define MSR_EFER   0xc0000080
#define MSR_STAR   0xc0000081
#define MSR_LSTAR  0xc0000082
#define MSR_FMASK  0xc0000084
#define MSR_NATIVE 0x4b564d10
#define EXIT_PORT  0xf4
#define SNAPSHOT_PORT 0x5a
#define POWER_PORT 0x5e
#define POWER_HALT 2
#define NATIVE_INFO 0x100
#define NATIVE_INFO_MAGIC 0x4e50574c /* "LWPN" */
#define SERIAL     0x3f8

u64 spin(u64 n);
u64 user_spin(u64 n);
u64 port_exits(u64 n);
extern char syscall_entry[];
struct iso_result {
    u64 value, fault, cs;
};
void isolation_read(u64 cr3, u64 addr, struct iso_result *out);
extern char iso_syscall[], iso_pf[];
struct tramp_result {
    u64 rcx, r11, rax, rsp_moved;
};
void trampoline_probe(struct tramp_result *out);
extern char tramp_ud[], tramp_syscall[];
extern char timer_entry[];
extern volatile u64 timer_ticks;

static void outb(u16 port, u8 v) { __asm__ volatile("outb %0, %1" : : "a"(v), "Nd"(port)); }

static u64 rdmsr(u32 msr)
{
    u32 lo, hi;
    __asm__ volatile("rdmsr" : "=a"(lo), "=d"(hi) : "c"(msr));
    return (u64)hi << 32 | lo;
}

static void wrmsr(u32 msr, u64 v)
{
    __asm__ volatile("wrmsr" : : "c"(msr), "a"((u32)v), "d"((u32)(v >> 32)));
}

static void puts(const char *s)
{
    while (*s)
        outb(SERIAL, (u8)*s++);
}

static void put_num(u64 v, u32 base)
{
    char b[24];
    int i = 23;
    b[i] = 0;
    do {
        b[--i] = "0123456789abcdef"[v % base];
        v /= base;
    } while (v);
    puts(b + i);
}

static const char *cmdline = "";

/* The value of ` key=` on the command line, or `fallback`. */
static u64 arg(const char *key, u64 fallback)
{
    for (const char *p = cmdline; *p; p++) {
        if (p != cmdline && p[-1] != ' ')
            continue;
        const char *k = key, *q = p;
        while (*k && *q == *k)
            k++, q++;
        if (*k || *q != '=')
            continue;
        u64 v = 0;
        for (q++; *q >= '0' && *q <= '9'; q++)
            v = v * 10 + (u64)(*q - '0');
        return v;
    }
    return fallback;
}

/* The VM's CPUID leaves lwpvmm put in the page (its kernel-mode CPUID
 * shows the host's): lwpvmm's signature and LWP's leaf. */
static void print_leaves(const u32 *info)
{
    if (info[0] != NATIVE_INFO_MAGIC || info[1] != 1) {
        puts("native: no CPUID table in the page\n");
        return;
    }
    puts("native: the page holds ");
    put_num(info[2], 10);
    puts(" CPUID leaves\n");
    for (u32 i = 0; i < info[2]; i++) {
        const u32 *e = info + 4 + 6 * i;
        if (e[0] != 0x40000100 && e[0] != 0x8000001c)
            continue;
        puts("native: leaf 0x");
        put_num(e[0], 16);
        puts(": eax=0x");
        put_num(e[2], 16);
        puts(" ebx=0x");
        put_num(e[3], 16);
        puts(" ecx=0x");
        put_num(e[4], 16);
        puts(" edx=0x");
        put_num(e[5], 16);
        puts("\n");
    }
}

static void report(const char *what, u64 count, const char *unit, u64 cycles)
{
    puts(what);
    put_num(count, 10);
    puts(unit);
    put_num(cycles, 10);
    puts(" cycles\n");
}

/* The probe's own descriptor tables: lwpvmm's boot GDT (0x08 code, 0x10
 * data, 0x18 32-bit code) with the user segments SYSRET's STAR names and
 * a TSS whose RSP0 is the stack a fault from user mode lands on; an IDT
 * with #PF only. All in .bss, inside the first 2 MiB that both page
 * tables map. */
static u64 gdt[8] __attribute__((aligned(16)));
static u64 idt[2 * 64] __attribute__((aligned(16)));
static int tables_loaded;
static u32 tss[26] __attribute__((aligned(16)));
static u8 fault_stack[4096] __attribute__((aligned(16)));
static u64 user_pml4[512] __attribute__((aligned(4096)));
static u64 user_pdpt[512] __attribute__((aligned(4096)));
static u64 user_pd[512] __attribute__((aligned(4096)));

#define SECRET_AT 0x400000ULL
#define SECRET 0x5ec2e75ec2e7ULL
#define PTE_P_RW_U 0x7ULL
#define PTE_PS 0x80ULL

struct table_reg {
    u16 limit;
    u64 base;
} __attribute__((packed));

/* An interrupt gate of the kernel's code segment, DPL 0. */
static void gate(u32 vector, u64 handler)
{
    idt[2 * vector] = (handler & 0xffff) | 0x08ULL << 16 | 0x8eULL << 40 |
                      (handler >> 16 & 0xffff) << 48;
    idt[2 * vector + 1] = handler >> 32;
}

static void descriptor_tables(void)
{
    gdt[1] = 0x00af9b000000ffffULL;
    gdt[2] = 0x00cf93000000ffffULL;
    gdt[3] = 0x00cf9b000000ffffULL;
    gdt[4] = 0x00cff3000000ffffULL; /* 0x23: user data (SYSRET's SS) */
    gdt[5] = 0x00affb000000ffffULL; /* 0x2b: user 64-bit code (SYSRET's CS) */
    u64 base = (u64)tss;
    gdt[6] = (sizeof(tss) - 1) | (base & 0xffffff) << 16 | 0x89ULL << 40 |
             (base >> 24 & 0xff) << 56;
    gdt[7] = base >> 32;
    u64 rsp0 = (u64)(fault_stack + sizeof(fault_stack));
    tss[1] = (u32)rsp0;
    tss[2] = (u32)(rsp0 >> 32);
    tss[25] = sizeof(tss) << 16; /* no I/O bitmap */
    gate(14, (u64)iso_pf);
    gate(6, (u64)tramp_ud);
    gate(0x30, (u64)timer_entry);
    struct table_reg g = {sizeof(gdt) - 1, (u64)gdt}, i = {sizeof(idt) - 1, (u64)idt};
    __asm__ volatile("lgdt %0; lidt %1; ltr %w2" : : "m"(g), "m"(i), "r"(0x30) : "memory");
}

static void report_read(const char *tables, const struct iso_result *r)
{
    puts("native: a user read of 0x400000 on ");
    puts(tables);
    if (r->fault >> 63) {
        puts(" faulted: #PF error 0x");
        put_num(r->fault & 0xffff, 16);
        puts(" at 0x");
        put_num(r->value, 16);
        puts(", cs 0x");
        put_num(r->cs, 16);
    } else {
        puts(" read 0x");
        put_num(r->value, 16);
    }
    puts("\n");
}

/* The probes' tables, STAR, FMASK and EFER.SCE, and LSTAR at `entry`. */
static void probe_setup(void *entry)
{
    if (!tables_loaded) {
        descriptor_tables();
        tables_loaded = 1;
    }
    wrmsr(MSR_STAR, 0x0018ULL << 48 | 0x0008ULL << 32);
    wrmsr(MSR_LSTAR, (u64)entry);
    wrmsr(MSR_FMASK, 0x700);
    wrmsr(MSR_EFER, rdmsr(MSR_EFER) | 1);
}

static void trampoline(void)
{
    probe_setup(tramp_syscall);
    struct tramp_result r;
    trampoline_probe(&r);
    puts("native: after a user-mode #UD returned by SYSRETQ and the trampoline: rcx 0x");
    put_num(r.rcx, 16);
    puts(" r11 0x");
    put_num(r.r11, 16);
    puts(" rax 0x");
    put_num(r.rax, 16);
    puts(", rsp moved by ");
    put_num(r.rsp_moved, 10);
    puts("\n");
}

#define LAPIC 0xfee00000ULL
#define TIMER_VECTOR 0x30

static void lapic_write(u32 reg, u32 v)
{
    *(volatile u32 *)(LAPIC + reg) = v;
}

static u64 tsc(void)
{
    u32 lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return (u64)hi << 32 | lo;
}

static void halt_line(const char *what, u64 ticks, u64 pending, u64 cycles)
{
    puts("native: ");
    puts(what);
    puts(": ticks ");
    put_num(ticks, 10);
    puts(", pending byte ");
    put_num(pending, 10);
    puts(", ");
    put_num(cycles, 10);
    puts(" cycles\n");
}

/* HLT and the page's interrupt flag, with the LAPIC timer one-shot at
 * vector 0x30 (about 1 ms at the TSC's rate on a divide-by-1 bus clock
 * of at least 1 GHz). */
static void halt_probe(void)
{
    volatile u8 *vif = (volatile u8 *)rdmsr(MSR_NATIVE);
    if (!vif) {
        puts("native: halt probe: not in native mode\n");
        return;
    }
    probe_setup(iso_syscall);
    lapic_write(0xf0, 0x1ff);
    lapic_write(0x3e0, 0xb);
    lapic_write(0x320, TIMER_VECTOR);
    /* Interrupts on in the page: does HLT sleep until the tick? */
    vif[0] = 1;
    u64 t0 = tsc();
    lapic_write(0x380, 1000000);
    __asm__ volatile("hlt" ::: "memory");
    halt_line("HLT with the page's IF on returned", timer_ticks, vif[1], tsc() - t0);
    /* And is the tick delivered to code that makes no exit? */
    while (!timer_ticks && tsc() - t0 < 8000000000ULL)
        ;
    halt_line("then, spinning, the tick came", timer_ticks, vif[1], tsc() - t0);
    /* Interrupts off in the page: the tick stays pending. */
    vif[0] = 0;
    u64 before = timer_ticks;
    t0 = tsc();
    lapic_write(0x380, 100000);
    while (!vif[1] && tsc() - t0 < 8000000000ULL)
        ;
    halt_line("with the page's IF off the tick", timer_ticks - before, vif[1], tsc() - t0);
    /* IF back on, then one trapped instruction: delivered at it? */
    vif[0] = 1;
    t0 = tsc();
    u64 cr0;
    __asm__ volatile("mov %%cr0, %0" : "=r"(cr0) : : "memory");
    halt_line("IF on again and one trapped MOV from CR0", timer_ticks - before, vif[1],
              tsc() - t0);
    /* lwpvmm's halt (the power port's value 2): the vCPU sleeps in KVM
     * until the tick. */
    before = timer_ticks;
    t0 = tsc();
    lapic_write(0x380, 1000000);
    outb(POWER_PORT, POWER_HALT);
    halt_line("the power port's halt with the page's IF on", timer_ticks - before, vif[1],
              tsc() - t0);
    vif[0] = 0;
}

/* What the events probe records of a trap (native.S, ev_trap_common). */
struct trap {
    u64 vector, error, rip, cs, rflags, rsp, vif, stack_top, cr2, pad;
};
extern u64 vif_ptr;
extern struct trap ev_trap;
extern u64 ev_iret[4];
extern u64 ev_syscall_vif, ev_user_rax;
u64 probe_kernel(void (*fn)(void));
u64 probe_user(void *entry, u64 rflags, u64 rsp, u64 unused, u64 rbx);
extern char ev_syscall[], ev_de[], ev_ud[], ev_gp[], ev_pf[], ev_tick[], ev_tick_iret[];
extern char ev_user_spin[], ev_user_syscall[], ev_user_fault[], ev_user_read[];
void ev_divide(void);
void ev_segments(void);
void ev_swapgs(void);
u64 probe_user_if_on(void *entry, u64 rflags, u64 rsp);
extern char ev_sysret_at[], ev_swapgs_at[], ev_swapgs_after[];
static u8 user_stack[8192] __attribute__((aligned(16)));
static u8 ist_stack[4096] __attribute__((aligned(16)));
static u64 high_pdpt[512] __attribute__((aligned(4096)));

/* The kernel's -2 GiB alias of the first GiB (Linux's kernel text lies
 * there), added to the boot page tables. */
#define HIGH_ALIAS 0xffffffff80000000ULL

/* A probe's outcome: no trap (what a SYSCALL from user mode found in the
 * page's bytes), or where the trap came and what it found. */
static void trap_line(const char *what, int user, u64 trapped)
{
    puts("native: ");
    puts(what);
    if (!trapped) {
        puts(": no trap");
        if (user) {
            puts(", syscall saw the page's bytes 0x");
            put_num(ev_syscall_vif, 16);
        }
        puts("\n");
        return;
    }
    puts(": vector ");
    put_num(ev_trap.vector, 10);
    puts(" error 0x");
    put_num(ev_trap.error, 16);
    puts(" cs 0x");
    put_num(ev_trap.cs, 16);
    puts(" rflags.IF ");
    put_num(ev_trap.rflags >> 9 & 1, 10);
    puts(" the page's bytes at entry 0x");
    put_num(ev_trap.vif, 16);
    puts(" stack ");
    if (ev_trap.stack_top == (u64)(fault_stack + sizeof(fault_stack)))
        puts("TSS.RSP0");
    else if (ev_trap.stack_top == (u64)(ist_stack + sizeof(ist_stack)))
        puts("TSS.IST1");
    else {
        puts("0x");
        put_num(ev_trap.stack_top, 16);
    }
    puts(" cr2 0x");
    put_num(ev_trap.cr2, 16);
    puts(" the page's cr2 0x");
    put_num(*(volatile u64 *)(vif_ptr + 8), 16);
    puts("\n");
}

static void user_read_line(const char *when, u64 trapped)
{
    puts("native: a user read of the -2 GiB alias of 0x400000 ");
    puts(when);
    if (trapped) {
        puts(" faulted: #PF error 0x");
        put_num(ev_trap.error, 16);
    } else {
        puts(" read 0x");
        put_num(ev_user_rax, 16);
    }
    puts("\n");
}

static void arm_tick(u32 count)
{
    lapic_write(0xf0, 0x1ff);
    lapic_write(0x3e0, 0xb);
    lapic_write(0x320, TIMER_VECTOR);
    lapic_write(0x380, count);
}

/* A tick made pending with the page's IF off, then the page's IF set just
 * before SWAPGS (kernel) or SYSRETQ (user_rsp != 0); whether it trapped. */
static u64 pending_then(int kernel, u64 user_rsp)
{
    volatile u8 *vif = (volatile u8 *)vif_ptr;
    vif[0] = 0;
    arm_tick(100000);
    u64 t0 = tsc();
    while (!vif[1] && tsc() - t0 < 8000000000ULL)
        ;
    if (kernel)
        return probe_kernel(ev_swapgs);
    return probe_user_if_on(ev_user_syscall, 0x202, user_rsp);
}

static void where_line(const char *insn, u64 trapped, u64 at, u64 after)
{
    puts("native: a tick pending as the page's IF is set just before ");
    puts(insn);
    if (!trapped) {
        puts(": not delivered\n");
        return;
    }
    if (ev_trap.rip == at)
        puts(": delivered before it");
    else if (ev_trap.rip == after)
        puts(": delivered after it");
    else {
        puts(": delivered at rip 0x");
        put_num(ev_trap.rip, 16);
    }
    puts(", frame cs 0x");
    put_num(ev_trap.cs, 16);
    puts("\n");
}

static void events_probe(void)
{
    volatile u8 *vif = (volatile u8 *)rdmsr(MSR_NATIVE);
    if (!vif) {
        puts("native: events probe: not in native mode\n");
        return;
    }
    vif_ptr = (u64)vif;
    probe_setup(ev_syscall);
    gate(0, (u64)ev_de);
    gate(6, (u64)ev_ud);
    gate(13, (u64)ev_gp);
    gate(14, (u64)ev_pf);
    u64 user_rsp = (u64)(user_stack + sizeof(user_stack));

    /* A kernel-mode tick returned by IRETQ. */
    gate(TIMER_VECTOR, (u64)ev_tick_iret);
    vif[0] = 1;
    u64 t0 = tsc();
    arm_tick(100000);
    while (!ev_iret[3] && tsc() - t0 < 8000000000ULL)
        __asm__ volatile("mov %%cr0, %%rax" ::: "rax", "memory");
    puts("native: a kernel-mode tick: the page's bytes at entry 0x");
    put_num(ev_iret[0], 16);
    puts(", frame cs 0x");
    put_num(ev_iret[1], 16);
    puts(" rflags.IF ");
    put_num(ev_iret[2] >> 9 & 1, 10);
    puts("; after its IRETQ the page's bytes 0x");
    put_num(*(volatile u16 *)vif, 16);
    puts("\n");

    /* Ticks in user mode, the page's IF on and off. */
    gate(TIMER_VECTOR, (u64)ev_tick);
    vif[0] = 1;
    arm_tick(100000);
    trap_line("a user-mode tick, the page's IF on", 1, probe_user(ev_user_spin, 0x202, user_rsp, 0, 0));
    vif[0] = 0;
    arm_tick(100000);
    trap_line("a user-mode tick, the page's IF off", 1, probe_user(ev_user_spin, 0x202, user_rsp, 0, 0));
    puts("native: after it the page's bytes 0x");
    put_num(*(volatile u16 *)vif, 16);
    puts("\n");
    /* The tick still pending comes now, to a handler that returns. */
    gate(TIMER_VECTOR, (u64)ev_tick_iret);
    vif[0] = 1;
    __asm__ volatile("mov %%cr0, %%rax" ::: "rax", "memory");
    vif[0] = 0;

    /* A tick pending when the page's IF is set just before SWAPGS and
     * just before SYSRETQ: delivered before the instruction or after? */
    gate(TIMER_VECTOR, (u64)ev_tick);
    where_line("SWAPGS", pending_then(1, 0), (u64)ev_swapgs_at, (u64)ev_swapgs_after);
    where_line("SYSRETQ", pending_then(0, user_rsp), (u64)ev_sysret_at, (u64)ev_user_syscall);

    /* SYSCALL's effect on the page's IF (FMASK clears IF). */
    vif[0] = 1;
    trap_line("a SYSCALL with the page's IF on", 1, probe_user(ev_user_syscall, 0x202, user_rsp, 0, 0));
    vif[0] = 0;

    /* A user-mode #PF: error code, CR2 and the page's cr2 cell. */
    trap_line("a user-mode #PF", 1, probe_user(ev_user_fault, 0x202, user_rsp, 0, 0));

    /* A kernel-mode exception through an IST gate. */
    u64 ist = (u64)(ist_stack + sizeof(ist_stack));
    tss[9] = (u32)ist;
    tss[10] = (u32)(ist >> 32);
    gate(0, (u64)ev_de);
    idt[0] |= 1ULL << 32;
    trap_line("a kernel-mode #DE through an IST gate", 0, probe_kernel(ev_divide));

    /* Loads of the kernel's selectors and a far return. */
    u16 ds = 0, ss = 0;
    u64 trapped = probe_kernel(ev_segments);
    __asm__ volatile("mov %%ds, %0; mov %%ss, %1" : "=r"(ds), "=r"(ss));
    trap_line("MOV to DS, ES, SS and LRETQ at CPL0", 0, trapped);
    puts("native: then ds 0x");
    put_num(ds, 16);
    puts(" ss 0x");
    put_num(ss, 16);
    puts("\n");

    /* The kernel's half, mapped U=1 (the -2 GiB alias): does user mode
     * reach it before and after kernel mode has, and can SYSRETQ go
     * there (a trampoline there)? */
    u64 *pml4;
    __asm__ volatile("mov %%cr3, %0" : "=r"(pml4));
    high_pdpt[510] = ((u64 *)((u64)pml4[0] & ~0xfffULL))[0];
    pml4[511] = (u64)high_pdpt | PTE_P_RW_U;
    __asm__ volatile("mov %%cr3, %%rax; mov %%rax, %%cr3" ::: "rax", "memory");
    *(volatile u64 *)SECRET_AT = SECRET;
    u64 alias = SECRET_AT + HIGH_ALIAS;
    user_read_line("before the kernel", probe_user(ev_user_read, 0x202, user_rsp, 0, alias));
    puts("native: a kernel read of the -2 GiB alias of 0x400000 reads 0x");
    put_num(*(volatile u64 *)alias, 16);
    puts("\n");
    user_read_line("after the kernel", probe_user(ev_user_read, 0x202, user_rsp, 0, alias));
    trap_line("SYSRETQ to code at the -2 GiB alias", 1, probe_user((void *)((u64)ev_user_syscall + HIGH_ALIAS), 0x202, user_rsp, 0, 0));

    gate(14, (u64)iso_pf);
    gate(6, (u64)tramp_ud);
    gate(TIMER_VECTOR, (u64)timer_entry);
}

/* The SMP probe (`smp=1`, with two vCPUs): the AP's start from the
 * SIPI's real mode in native mode, its page, its loop's speed, and IPIs
 * both ways, the AP asleep in lwpvmm's halt for the second. */
extern char ap_tramp[], ap_tramp_end[], ipi_bsp_entry[], ipi_ap_entry[];
extern struct table_reg ap_gdtr;
extern u64 ap_cr3, ap_stack, ap_entry;
extern volatile u64 ipi_count, ipi_ap_count;
static u8 ap_stack_area[8192] __attribute__((aligned(16)));
static volatile u64 ap_page, ap_cycles, ap_stage;

#define AP_BASE 0x8000ULL
#define ICR_LOW 0x300
#define ICR_HIGH 0x310

static void send_ipi(u32 apic, u32 low)
{
    lapic_write(ICR_HIGH, apic << 24);
    lapic_write(ICR_LOW, low);
}

/* The AP, in long mode: its page, a timed CPL0 loop, an IPI to the BSP,
 * then lwpvmm's halt with the page's IF on until the BSP's IPI. */
static void ap_main(void)
{
    struct table_reg i = {sizeof(idt) - 1, (u64)idt};
    __asm__ volatile("lidt %0" : : "m"(i));
    volatile u8 *vif = (volatile u8 *)rdmsr(MSR_NATIVE);
    ap_page = (u64)vif;
    ap_cycles = spin(10000000);
    ap_stage = 1;
    lapic_write(0xf0, 0x1ff);
    send_ipi(0, 0x4000 | 0x31);
    ap_stage = 2;
    if (vif) {
        vif[0] = 1;
        while (!ipi_ap_count)
            outb(POWER_PORT, POWER_HALT);
    }
    ap_stage = 3;
    for (;;)
        outb(POWER_PORT, POWER_HALT);
}

static void smp_probe(void)
{
    volatile u8 *vif = (volatile u8 *)rdmsr(MSR_NATIVE);
    probe_setup(iso_syscall);
    gate(0x31, (u64)ipi_bsp_entry);
    gate(0x32, (u64)ipi_ap_entry);
    u8 *tramp = (u8 *)AP_BASE;
    for (u64 k = 0; k < (u64)(ap_tramp_end - ap_tramp); k++)
        tramp[k] = ap_tramp[k];
    struct table_reg *g = (struct table_reg *)(AP_BASE + ((char *)&ap_gdtr - ap_tramp));
    g->limit = sizeof(gdt) - 1;
    g->base = (u64)gdt;
    u64 cr3;
    __asm__ volatile("mov %%cr3, %0" : "=r"(cr3));
    *(u64 *)(AP_BASE + ((char *)&ap_cr3 - ap_tramp)) = cr3;
    *(u64 *)(AP_BASE + ((char *)&ap_stack - ap_tramp)) = (u64)(ap_stack_area + sizeof(ap_stack_area));
    *(u64 *)(AP_BASE + ((char *)&ap_entry - ap_tramp)) = (u64)ap_main;
    lapic_write(0xf0, 0x1ff);
    if (vif)
        vif[0] = 1;
    u64 mine = spin(10000000);
    send_ipi(1, 0x4500);                  /* INIT */
    send_ipi(1, 0x4600 | (AP_BASE >> 12)); /* SIPI */
    send_ipi(1, 0x4600 | (AP_BASE >> 12));
    u64 t0 = tsc();
    while (ap_stage < 2 && tsc() - t0 < 30000000000ULL)
        __asm__ volatile("mov %%cr0, %%rax" ::: "rax", "memory");
    if (ap_stage < 1) {
        puts("native: the AP did not start\n");
        return;
    }
    puts("native: the AP started; its MSR reads 0x");
    put_num(ap_page, 16);
    puts(", its cpl0 loop ");
    put_num(ap_cycles, 10);
    puts(" cycles for 10000000 turns (the BSP's ");
    put_num(mine, 10);
    puts(")\n");
    t0 = tsc();
    while (!ipi_count && tsc() - t0 < 8000000000ULL)
        __asm__ volatile("mov %%cr0, %%rax" ::: "rax", "memory");
    puts("native: the AP's IPI reached the BSP: ");
    put_num(ipi_count, 10);
    puts("\n");
    /* The AP sleeps in lwpvmm's halt: the BSP's IPI wakes it. */
    t0 = tsc();
    while (tsc() - t0 < 100000000ULL)
        ;
    send_ipi(1, 0x4000 | 0x32);
    t0 = tsc();
    while (ap_stage < 3 && tsc() - t0 < 8000000000ULL)
        __asm__ volatile("mov %%cr0, %%rax" ::: "rax", "memory");
    puts("native: the BSP's IPI woke the AP from the power port's halt: ");
    puts(ap_stage == 3 ? "yes" : "no");
    puts("\n");
    if (vif)
        vif[0] = 0;
}

static void isolation(void)
{
    *(volatile u64 *)SECRET_AT = SECRET;
    probe_setup(iso_syscall);
    u64 kernel_cr3;
    __asm__ volatile("mov %%cr3, %0" : "=r"(kernel_cr3));
    struct iso_result r;
    isolation_read(kernel_cr3, SECRET_AT, &r);
    report_read("the kernel's page tables", &r);
    user_pml4[0] = (u64)user_pdpt | PTE_P_RW_U;
    user_pdpt[0] = (u64)user_pd | PTE_P_RW_U;
    user_pd[0] = 0 | PTE_PS | PTE_P_RW_U;
    isolation_read((u64)user_pml4, SECRET_AT, &r);
    report_read("user page tables", &r);
}

void native_main(const u8 *zero_page)
{
    cmdline = (const char *)(u64) * (const u32 *)(zero_page + 0x228);
    u64 n = arg("iterations", 1000000), k = arg("exits", 1000);
    if (arg("snap", 0))
        outb(SNAPSHOT_PORT, 0);
    if (arg("probe", 0)) {
        u64 page = rdmsr(MSR_NATIVE);
        puts("native: MSR 0x4b564d10 reads 0x");
        put_num(page, 16);
        puts("\n");
        if (page)
            print_leaves((const u32 *)(page + NATIVE_INFO));
    }
    if (arg("supervisor_page", 0)) {
        puts("native: mapping my own code supervisor-only\n");
        volatile u64 *pde = (volatile u64 *)0xb000;
        *pde &= ~4ULL;
        u64 cr3;
        __asm__ volatile("mov %%cr3, %0; mov %0, %%cr3" : "=r"(cr3) : : "memory");
        puts("native: still running\n");
    }
    if (arg("isolation", 0))
        isolation();
    if (arg("trampoline", 0))
        trampoline();
    if (arg("halt", 0))
        halt_probe();
    if (arg("events", 0))
        events_probe();
    if (arg("smp", 0))
        smp_probe();
    report("native: cpl0 loop ", n, " iterations in ", spin(n));
    if (arg("user", 0)) {
        /* SYSCALL to the kernel's 64-bit selectors (0x08, 0x10), SYSRET to
         * 0x2b/0x23: no segment is loaded from a descriptor either way. */
        wrmsr(MSR_STAR, 0x0018ULL << 48 | 0x0008ULL << 32);
        wrmsr(MSR_LSTAR, (u64)syscall_entry);
        wrmsr(MSR_FMASK, 0x700);
        wrmsr(MSR_EFER, rdmsr(MSR_EFER) | 1);
        report("native: cpl3 loop ", n, " iterations in ", user_spin(n));
    }
    report("native: port exits ", k, " exits in ", port_exits(k));
    outb(EXIT_PORT, 0);
    for (;;)
        __asm__ volatile("hlt");
}
