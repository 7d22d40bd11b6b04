/* The CPL3 side of lwpvmm's test guests. Runs natively (CPL3); only the
 * port writes exit to the VMM. */
#include "lib.h"

static inline void outb(u16 port, u8 v)
{
    __asm__ volatile("outb %0, %1" : : "a"(v), "Nd"(port));
}

void putc(char c) { outb(0x3f8, (u8)c); }

void puts(const char *s)
{
    while (*s)
        putc(*s++);
}

void put_hex(u64 v)
{
    puts("0x");
    for (int i = 60; i >= 0; i -= 4) {
        if ((v >> i) == 0 && i != 0)
            continue;
        putc("0123456789abcdef"[(v >> i) & 0xf]);
    }
}

void put_dec(u64 v)
{
    char b[24];
    int n = 0;
    do {
        b[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        putc(b[--n]);
}

void guest_exit(u32 code)
{
    outb(0xf4, (u8)code);
    for (;;)
        __asm__ volatile("pause");
}

void *memset(void *d, int c, unsigned long n)
{
    u8 *p = d;
    while (n--)
        *p++ = (u8)c;
    return d;
}

void *memcpy(void *d, const void *s, unsigned long n)
{
    u8 *p = d;
    const u8 *q = s;
    while (n--)
        *p++ = *q++;
    return d;
}

const struct cpuid_entry *cpuid_of(u32 leaf)
{
    for (struct cpuid_entry *e = cpuid_table; e->leaf; e++)
        if (e->leaf == leaf)
            return e;
    return 0;
}

static u32 passed, failed;

void check(int ok, const char *what)
{
    if (ok)
        passed++;
    else
        failed++;
    puts(ok ? "ok " : "not ok ");
    put_dec(passed + failed);
    puts(" - ");
    puts(what);
    putc('\n');
}

void check_eq(u64 got, u64 want, const char *what)
{
    check(got == want, what);
    if (got != want) {
        puts("#   got ");
        put_hex(got);
        puts(" want ");
        put_hex(want);
        putc('\n');
    }
}

int done(void)
{
    puts("guest: ");
    put_dec(passed);
    puts(" passed, ");
    put_dec(failed);
    puts(" failed\n");
    return failed ? 1 : 0;
}

u64 cmdline_number(const char *key, u64 fallback)
{
    if (!start_info_ptr)
        return fallback;
    /* hvm_start_info: cmdline_paddr at offset 24 */
    const char *c = (const char *)*(const u64 *)(start_info_ptr + 24);
    if (!c)
        return fallback;
    for (; *c; c++) {
        const char *k = key, *p = c;
        while (*k && *p == *k) {
            k++;
            p++;
        }
        if (*k || *p != '=')
            continue;
        u64 v = 0;
        for (p++; *p >= '0' && *p <= '9'; p++)
            v = v * 10 + (u64)(*p - '0');
        return v;
    }
    return fallback;
}

u64 llwpcb_faults(u64 addr)
{
    u64 faults = fault_count;
    /* The fault handler resumes at label 1. */
    __asm__ volatile("lea 1f(%%rip), %%rax\n"
                     "mov %%rax, fault_resume(%%rip)\n"
                     "llwpcb %0\n"
                     "1: movq $0, fault_resume(%%rip)"
                     :
                     : "r"(addr)
                     : "rax", "memory");
    return fault_count - faults;
}
