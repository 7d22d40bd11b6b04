/* CPL0 part of the privilege guest (docs/security.md, "CPL"): a kernel
 * secret on a supervisor-only page (window page 0), the doorbell ports 0x5c
 * and 0x5d opened to CPL3 in the TSS I/O bitmap, and #UD doorbells rung at
 * CPL0 with exception frames the CPU could never have pushed. Each
 * doorbell's RFLAGS.CF goes to frame_results (1: refused, as it must be
 * for the first three):
 *   [0] CS 0x08 (RPL 0) with SS 0x1b (RPL 3)
 *   [1] CS 0x0b: the kernel code segment (DPL 0) with RPL 3
 *   [2] CS 0x20: the user code segment (DPL 3) with RPL 0
 *   [3] CS 0x08, SS 0x10: a frame the CPU pushes (handled)
 *   [4] CS 0x53, SS 0x1b: the conforming segment at CPL3 (handled)
 * Each frame's RIP is an LWPINS, so that only the frame decides. */
#define SECRET 0x5ec2e7
#define W0 0x400000
        .text
        .globl kernel_hook
kernel_hook:
        call    bad_window_pages
        movl    $SECRET, W0
        mov     $frames, %rsi
        mov     $frame_results, %rdi
1:      mov     (%rsi), %rax
        test    %rax, %rax
        jz      2f
        mov     %rsp, %rbx
        pushq   8(%rsi)                         /* SS */
        pushq   %rbx                            /* RSP */
        pushq   $0x2                            /* RFLAGS */
        pushq   (%rsi)                          /* CS */
        pushq   $lwpins_site                    /* RIP */
        clc
        out     %al, $0x5c
        pushfq
        popq    %rax
        and     $1, %eax
        mov     %rax, (%rdi)
        mov     %rbx, %rsp
        add     $16, %rsi
        add     $8, %rdi
        jmp     1b
        /* Open ports 0x5c and 0x5d (bitmap byte 0x0b) to CPL3. */
2:      andb    $~0x30, tss_iomap + 0x0b
        ret

        .globl lwpins_site
lwpins_site:
        lwpins  $0x77, (%rbx), %rax

        .data
        .p2align 3
frames:
        .quad 0x08, 0x1b
        .quad 0x0b, 0x1b
        .quad 0x20, 0x10
        .quad 0x08, 0x10
        .quad 0x53, 0x1b
        .quad 0, 0
        .globl frame_results
frame_results:  .quad 9, 9, 9, 9, 9
        .section .note.GNU-stack, "", @progbits
