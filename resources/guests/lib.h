/* The CPL3 side of lwpvmm's test guests: serial output, the exit port, the
 * CPUID values the runtime read at CPL0, fault and interrupt records. */
#ifndef LWPVMM_GUEST_LIB_H
#define LWPVMM_GUEST_LIB_H

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long s64;

struct cpuid_entry { u32 leaf, subleaf, eax, ebx, ecx, edx; };

extern volatile u64 fault_resume, fault_count, fault_vector, fault_error, fault_cr2, fault_rip;
extern volatile u64 irq_counts[16];
extern struct cpuid_entry cpuid_table[];
extern u64 window_pt[512];
extern u64 start_info_ptr;

/* The value of `key=` on the PVH command line, or `fallback`. */
u64 cmdline_number(const char *key, u64 fallback);

void putc(char c);
void puts(const char *s);
void put_hex(u64 v);
void put_dec(u64 v);
void guest_exit(u32 code) __attribute__((noreturn));
void *memset(void *d, int c, unsigned long n);
void *memcpy(void *d, const void *s, unsigned long n);
const struct cpuid_entry *cpuid_of(u32 leaf);

/* Runs LLWPCB on `addr` with the fault recorder armed; returns how many
 * faults it raised (fault_vector, fault_error, fault_cr2 hold the last). */
u64 llwpcb_faults(u64 addr);

/* TAP-like checks: every check prints one line; done() prints the totals
 * and returns the exit value (0 when everything passed). */
void check(int ok, const char *what);
void check_eq(u64 got, u64 want, const char *what);
int done(void);

#endif
