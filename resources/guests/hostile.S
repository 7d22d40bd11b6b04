/* CPL0 part of the hostile guest: the runtime's bad window pages, a
 * threshold vector in the exception range, and paravirtual calls made the
 * wrong way. Results go to pv_results for the CPL3 part to check:
 *   [0] RFLAGS after a #UD doorbell with RSP on an unmapped page
 *   [1] RFLAGS after a #UD doorbell whose frame points at a non-LWP
 *       instruction (no #UD happened)
 *   [2] RAX of a state save into an unmapped area
 *   [3] RAX of a state restore of a garbage image
 * It also opens ports 0x5c and 0x5d to CPL3 in the TSS I/O bitmap, so the
 * CPL3 part can ring them. */
        .text
        .globl kernel_hook
kernel_hook:
        call    bad_window_pages

        /* LWP_CFG: INT on an exception vector (0x10), CoreId 0. */
        mov     $0xc0000105, %ecx
        rdmsr
        mov     $0x1000, %edx
        wrmsr

        /* #UD doorbell with a bogus frame pointer. */
        mov     %rsp, %rbx
        mov     $0x7ff000000000, %rsp
        clc
        out     %al, $0x5c
        mov     %rbx, %rsp
        pushfq
        popq    pv_results + 0

        /* #UD doorbell with a frame that points at a NOP, without a #UD. */
        pushq   $0x10                           /* SS */
        pushq   %rsp                            /* RSP (any) */
        pushq   $0x2                            /* RFLAGS */
        pushq   $0x08                           /* CS */
        pushq   $a_nop                          /* RIP */
        clc
        out     %al, $0x5c
        pushfq
        popq    pv_results + 8
        add     $40, %rsp

        /* State save into an unmapped area, restore of garbage. */
        mov     $0x7ff000000000, %rdi
        mov     $1, %eax
        out     %al, $0x5d
        mov     %rax, pv_results + 16
        mov     $garbage_area, %edi
        mov     $2, %eax
        out     %al, $0x5d
        mov     %rax, pv_results + 24

        /* Open ports 0x5c and 0x5d (bitmap byte 0x0b) to CPL3. */
        andb    $~0x30, tss_iomap + 0x0b
        ret
a_nop:
        nop

        .data
        .globl pv_results
        .p2align 3
pv_results:     .quad 0, 0, 0, 0
garbage_area:
        .quad 0x400000                          /* LWPCB address */
        .long 0xffffffff, 0x7fffffff            /* flags, head */
        .quad 0xfffffffffffff000                /* buffer base */
        .long 64, 0                             /* buffer size, filters */
        .fill 96, 1, 0xee
        .section .note.GNU-stack, "", @progbits
