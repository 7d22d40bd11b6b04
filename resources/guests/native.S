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
        push %rbx
        push %rbp
        push %r12
        push %r13
        push %r14
        push %r15
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
        pop %r15
        pop %r14
        pop %r13
        pop %r12
        pop %rbp
        pop %rbx
        ret

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
