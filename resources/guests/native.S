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

/* The events probe (`events=1`): where interrupts and exceptions land in
 * the mode and what they do to the page's interrupt flag. A probe runs
 * kernel code (probe_kernel) or user code entered by SYSRETQ (probe_user)
 * and comes back with 0 when the code returned (or made a SYSCALL,
 * ev_syscall, LSTAR) and 1 when a trap came: each trap stub records the
 * page's IF and pending bytes first, then the frame, the stack it landed
 * on and CR2 in ev_trap, ends any interrupt (EOI) and returns to the
 * probe's caller on the kernel's stack.
 *   u64 probe_kernel(void (*fn)(void))
 *   u64 probe_user(void *entry, u64 rflags, u64 rsp, u64 unused, u64 rbx) */
        .text
        .globl probe_kernel
probe_kernel:
        save_callee
        mov %rsp, ev_rsp(%rip)
        call *%rdi
        xor %eax, %eax
        jmp ev_done
        .globl probe_user
probe_user:
        save_callee
        mov %rsp, ev_rsp(%rip)
        mov %rdi, %rcx
        mov %rsi, %r11
        mov %rdx, %rsp
        mov %r8, %rbx
        sysretq
/* probe_user with the page's IF set just before the SYSRETQ (a tick is
 * pending): is it delivered before the SYSRETQ or in user mode after? */
        .globl probe_user_if_on
probe_user_if_on:
        save_callee
        mov %rsp, ev_rsp(%rip)
        mov %rdi, %rcx
        mov %rsi, %r11
        mov %rdx, %rsp
        mov vif_ptr(%rip), %rax
        movb $1, (%rax)
        .globl ev_sysret_at
ev_sysret_at:
        sysretq
        .globl ev_syscall
ev_syscall:
        mov %rax, ev_user_rax(%rip)
        mov vif_ptr(%rip), %rax
        movzwl (%rax), %eax
        mov %rax, ev_syscall_vif(%rip)
        xor %eax, %eax
ev_done:
        mov ev_rsp(%rip), %rsp
        return_callee

        .macro ev_stub name, vector, has_error
        .globl \name
\name:
        push %rax
        mov vif_ptr(%rip), %rax
        movzwl (%rax), %eax
        mov %rax, ev_trap+48(%rip)
        pop %rax
        .if \has_error == 0
        push $0
        .endif
        push $\vector
        jmp ev_trap_common
        .endm

        ev_stub ev_de, 0, 0
        ev_stub ev_ud, 6, 0
        ev_stub ev_gp, 13, 1
        ev_stub ev_pf, 14, 1
        ev_stub ev_tick, 0x30, 0

/* The stack: vector, error, RIP, CS, RFLAGS, RSP, SS. ev_trap: vector 0,
 * error 8, RIP 16, CS 24, RFLAGS 32, RSP 40, the page's bytes 48, the
 * stack's top at entry 56, CR2 64. */
ev_trap_common:
        lea ev_trap(%rip), %rax
        mov 0(%rsp), %rbx
        mov %rbx, 0(%rax)
        mov 8(%rsp), %rbx
        mov %rbx, 8(%rax)
        mov 16(%rsp), %rbx
        mov %rbx, 16(%rax)
        mov 24(%rsp), %rbx
        mov %rbx, 24(%rax)
        mov 32(%rsp), %rbx
        mov %rbx, 32(%rax)
        mov 40(%rsp), %rbx
        mov %rbx, 40(%rax)
        lea 56(%rsp), %rbx
        mov %rbx, 56(%rax)
        mov %cr2, %rbx
        mov %rbx, 64(%rax)
        mov $0xfee000b0, %ebx
        movl $0, (%rbx)
        mov $1, %eax
        jmp ev_done

/* A kernel-mode tick that returns by IRETQ: the page's bytes at entry and
 * the frame's CS and RFLAGS. */
        .globl ev_tick_iret
ev_tick_iret:
        push %rax
        push %rbx
        mov vif_ptr(%rip), %rax
        movzwl (%rax), %ebx
        mov %rbx, ev_iret+0(%rip)
        mov 24(%rsp), %rbx
        mov %rbx, ev_iret+8(%rip)
        mov 32(%rsp), %rbx
        mov %rbx, ev_iret+16(%rip)
        incq ev_iret+24(%rip)
        mov $0xfee000b0, %eax
        movl $0, (%rax)
        pop %rbx
        pop %rax
        iretq

/* User code: a bounded spin a tick can interrupt, then SYSCALL. */
        .globl ev_user_spin
ev_user_spin:
        mov $400000000, %rbx
1:      dec %rbx
        jnz 1b
        .globl ev_user_syscall
ev_user_syscall:
        syscall
/* User code that reads an address no page table maps (above the boot
 * tables' 4 GiB), for where the mode puts CR2. */
        .globl ev_user_fault
ev_user_fault:
        movabs 0x200000000, %rax
        syscall

/* User code that reads the address in %rbx (the kernel's half). */
        .globl ev_user_read
ev_user_read:
        mov (%rbx), %rax
        syscall

/* Kernel code: a divide error (for the IST gate), and loads of the
 * kernel's data selector into DS, ES and SS and a far return to its code
 * selector, as Linux's startup does. */
        .globl ev_divide
ev_divide:
        xor %ecx, %ecx
        div %rcx
        ret
/* The page's IF set (a tick is pending), then SWAPGS, the next trapped
 * instruction: is the tick delivered before it or after? */
        .globl ev_swapgs
ev_swapgs:
        mov vif_ptr(%rip), %rax
        movb $1, (%rax)
        .globl ev_swapgs_at
ev_swapgs_at:
        swapgs
        .globl ev_swapgs_after
ev_swapgs_after:
        swapgs
        ret
        .globl ev_segments
ev_segments:
        mov $0x10, %eax
        mov %eax, %ds
        mov %eax, %es
        mov %eax, %ss
        pop %rax
        pushq $0x08
        push %rax
        lretq

        .data
        .globl vif_ptr, ev_trap, ev_iret, ev_syscall_vif, ev_user_rax
ev_user_rax:
        .quad 0
vif_ptr:
        .quad 0
ev_rsp:
        .quad 0
ev_syscall_vif:
        .quad 0
ev_trap:
        .space 80
ev_iret:
        .space 32

/* The SMP probe (`smp=1`): the application processor's start. The BSP
 * copies ap_tramp to 0x8000 (the SIPI's page), fills its four slots and
 * sends INIT and SIPI; the AP goes from real mode straight to long mode
 * on the BSP's page tables and GDT and calls ap_main on its own stack.
 * Everything the trampoline reads is by its address at 0x8000. */
        .set AP_BASE, 0x8000
        .text
        .code16
        .globl ap_tramp, ap_tramp_end
ap_tramp:
        cli
        xor %ax, %ax
        mov %ax, %ds
        lgdtl AP_BASE + (ap_gdtr - ap_tramp)
        movl AP_BASE + (ap_cr3 - ap_tramp), %eax
        mov %eax, %cr3
        mov %cr4, %eax
        or $0x20, %eax          /* PAE */
        mov %eax, %cr4
        mov $0xc0000080, %ecx
        rdmsr
        or $0x100, %eax         /* EFER.LME */
        wrmsr
        mov %cr0, %eax
        or $0x80000001, %eax    /* PG, PE */
        mov %eax, %cr0
        ljmpl $0x08, $(AP_BASE + (ap_long - ap_tramp))
        .code64
ap_long:
        mov $0x10, %eax
        mov %eax, %ss
        mov AP_BASE + (ap_stack - ap_tramp), %rsp
        call *AP_BASE + (ap_entry - ap_tramp)
1:      jmp 1b
        .p2align 3
        .globl ap_gdtr, ap_cr3, ap_stack, ap_entry
ap_gdtr:
        .word 0
        .quad 0
        .p2align 3
ap_cr3:
        .quad 0
ap_stack:
        .quad 0
ap_entry:
        .quad 0
ap_tramp_end:

/* The IPI handlers of the SMP probe (vector 0x31 on the BSP, 0x32 on
 * the AP): count the interrupt and end it. */
        .macro ipi_handler name, counter
        .globl \name
\name:
        push %rax
        lock incq \counter(%rip)
        mov $0xfee000b0, %eax
        movl $0, (%rax)
        pop %rax
        iretq
        .endm
        ipi_handler ipi_bsp_entry, ipi_count
        ipi_handler ipi_ap_entry, ipi_ap_count

        .data
        .globl ipi_count, ipi_ap_count
ipi_count:
        .quad 0
ipi_ap_count:
        .quad 0
