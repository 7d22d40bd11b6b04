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
 * native mode leaves KVM_RUN spinning at the next instruction. */

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
#define NATIVE_INFO 0x100
#define NATIVE_INFO_MAGIC 0x4e50574c /* "LWPN" */
#define SERIAL     0x3f8

u64 spin(u64 n);
u64 user_spin(u64 n);
u64 port_exits(u64 n);
extern char syscall_entry[];

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
