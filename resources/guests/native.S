/*
 * The entry of the `native` guest, a kernel written for the host's native
 * supervisor mode (docs/pv-abi.md, "Native supervisor mode"): its note
 * declares the mode, lwpvmm enters it in 64-bit mode on boot page tables
 * that are all user-accessible, and it reaches user mode only through
 * SYSRETQ (an IRETQ to user mode is not seen by the host there). It never
 * enables interrupts and has no IDT: a fault ends it, as a triple fault.
 */

/* The TSC in %rax (%rdx clobbered). */
        .macro tsc
        rdtsc
        shl $32, %rdx
        or %rdx, %rax
        .endm

/* The System V callee-saved registers, saved at a probe's start and given
 * back at its return: the probes leave the C caller's frame for user mode
 * and come back on a stack of their own. */
        .macro save_callee
        push %rbx
        push %rbp
        push %r12
        push %r13
        push %r14
        push %r15
        .endm

        .macro return_callee
        pop %r15
        pop %r14
        pop %r13
        pop %r12
        pop %rbp
        pop %rbx
        ret
        .endm

        .section .note.lwpvmm, "a", @note
        .p2align 2
        .long 7                 /* name size: "lwpvmm" and its NUL */
        .long 4                 /* description size */
        .long 0x4c574e01        /* the native supervisor note */
        .asciz "lwpvmm"
        .p2align 2
        .long 1                 /* the contract's version */

        .section .text.boot, "ax"
        .code64
        .globl _start
_start:
        lea stack_top(%rip), %rsp
        mov %rsi, %rdi          /* the zero page (Linux 64-bit protocol) */
        call native_main
1:      hlt
        jmp 1b

/* u64 spin(u64 n): n turns of a two-instruction loop, in TSC cycles. */
        .text
        .globl spin
spin:
        tsc
        mov %rax, %r8
        mov %rdi, %rcx
        xor %r9, %r9
1:      inc %r9
        dec %rcx
        jnz 1b
        tsc
        sub %r8, %rax
        ret

/* u64 user_spin(u64 n): spin(n) in user mode, entered by SYSRETQ and left
 * by SYSCALL (STAR, LSTAR and EFER.SCE set by the caller); its cycles. */
        .globl user_spin
user_spin:
        save_callee
        mov %rsp, saved_rsp(%rip)
        mov %rdi, %rbx
        lea user_entry(%rip), %rcx
        mov $0x2, %r11
        sysretq
user_entry:
        mov %rbx, %rdi
        call spin
        mov %rax, %rbx
        syscall
        .globl syscall_entry
syscall_entry:
        mov saved_rsp(%rip), %rsp
        mov %rbx, %rax
        return_callee

/* The isolation probe (`isolation=1`): one read from user mode, entered by
 * SYSRETQ on the page tables at %rdi (CR3), of the address at %rsi. A read
 * that works comes back by SYSCALL (iso_syscall, LSTAR) with the value in
 * %rax and %rdx = 0; one that faults comes back through the IDT's #PF gate
 * (iso_pf, on the TSS's RSP0 stack) with CR2 in %rax, bit 63 and the error
 * code in %rdx and the frame's CS in %rcx. Either way the kernel's own
 * page tables (kernel_cr3) are loaded again first.
 *   struct { u64 value; u64 fault; u64 cs; } *isolation_read(cr3, addr, out) */
        .globl isolation_read
isolation_read:
        save_callee
        mov %rdx, iso_out(%rip)
        mov %rsp, iso_rsp(%rip)
        mov %cr3, %rax
        mov %rax, kernel_cr3(%rip)
        mov %rdi, %cr3
        mov %rsi, %rdi
        lea iso_user(%rip), %rcx
        mov $0x2, %r11
        sysretq
iso_user:
        mov (%rdi), %rax
        xor %edx, %edx
        syscall
        .globl iso_syscall
iso_syscall:
        xor %ecx, %ecx
        jmp iso_back
        .globl iso_pf
iso_pf:
        pop %rdx                /* the error code */
        bts $63, %rdx
        mov %cr2, %rax
        mov 8(%rsp), %rcx       /* the frame's CS (RIP, CS, RFLAGS, RSP, SS) */
iso_back:
        mov kernel_cr3(%rip), %rbx
        mov %rbx, %cr3
        mov iso_rsp(%rip), %rsp
        mov iso_out(%rip), %rbx
        mov %rax, 0(%rbx)
        mov %rdx, 8(%rbx)
        mov %rcx, 16(%rbx)
        return_callee

/* The return-trampoline probe (`trampoline=1`): an exception taken in user
 * mode returns to it by SYSRETQ, which overwrites RCX and R11, with every
 * register the user had. User code (tramp_user) sets RAX, RCX and R11 and
 * runs UD2; the #UD handler (tramp_ud, on the TSS's RSP0 stack) writes the
 * user's R11, RCX, RAX and the RIP after the UD2 below the user's red zone,
 * points RSP there, and SYSRETQs to tramp_return (a page every process
 * would map), which pops them back and returns with `ret $128` to the
 * RIP and RSP the user had. The user then hands what it sees to the
 * kernel by SYSCALL (tramp_syscall, LSTAR):
 *   void trampoline_probe(struct { u64 rcx, r11, rax, rsp_moved; } *out) */
        .globl trampoline_probe
trampoline_probe:
        save_callee
        mov %rdi, iso_out(%rip)
        mov %rsp, iso_rsp(%rip)
        sub $4096, %rsp         /* the user's stack, below the kernel's frames */
        lea tramp_user(%rip), %rcx
        mov $0x2, %r11
        sysretq
tramp_user:
        mov $0x1111, %rcx
        mov $0x2222, %r11
        mov $0x3333, %rax
        mov %rsp, %rbx
        ud2
        mov %rsp, %rsi
        sub %rbx, %rsi
        mov %rcx, %rdi
        mov %r11, %rdx
        mov %rax, %r8
        syscall
        .globl tramp_ud
tramp_ud:
        push %rbx               /* the frame: RIP 8, CS 16, RFLAGS 24, RSP 32 */
        mov 32(%rsp), %rbx
        sub $160, %rbx          /* the red zone, then four words */
        mov %r11, 0(%rbx)
        mov %rcx, 8(%rbx)
        mov %rax, 16(%rbx)
        mov 8(%rsp), %rax
        add $2, %rax            /* past the UD2 */
        mov %rax, 24(%rbx)
        mov 24(%rsp), %r11
        lea tramp_return(%rip), %rcx
        mov %rbx, %rax
        pop %rbx
        mov %rax, %rsp
        sysretq
tramp_return:
        pop %r11
        pop %rcx
        pop %rax
        ret $128
        .globl tramp_syscall
tramp_syscall:
        mov iso_rsp(%rip), %rsp
        mov iso_out(%rip), %rbx
        mov %rdi, 0(%rbx)
        mov %rdx, 8(%rbx)
        mov %r8, 16(%rbx)
        mov %rsi, 24(%rbx)
        return_callee

/* The LAPIC timer's handler (vector 0x30) of the halt probe: counts the
 * tick and ends the interrupt (EOI). */
        .globl timer_entry
timer_entry:
        push %rax
        incq timer_ticks(%rip)
        mov $0xfee000b0, %eax
        movl $0, (%rax)
        pop %rax
        iretq

/* u64 port_exits(u64 n): n writes to the POST port (each an exit that
 * lwpvmm answers at once), in TSC cycles. */
        .globl port_exits
port_exits:
        tsc
        mov %rax, %r8
        mov %rdi, %rcx
        xor %eax, %eax
1:      outb %al, $0x80
        dec %rcx
        jnz 1b
        tsc
        sub %r8, %rax
        ret

        .bss
        .p2align 12
        .space 16384
stack_top:
saved_rsp:
        .quad 0
kernel_cr3:
        .quad 0
iso_rsp:
        .quad 0
iso_out:
        .quad 0
        .globl timer_ticks
timer_ticks:
        .quad 0
