/* CPL0 parts of the page-table race guest: the boot CPU starts the second
 * one, which, once the program has loaded its LWPCB, flips the present bit
 * of the ring's page (window page 9) on and off while the first CPU's CPL3
 * program stores LWP records into it. The VMM must re-check the page on
 * every record. */
#define TOGGLES 20000
        .text
        .globl kernel_hook
kernel_hook:
        jmp     start_aps

        .globl ap_kernel_hook
ap_kernel_hook:
        /* Not before the program's LLWPCB, which checks the ring page and
         * would fault on it (architecturally) while it is not present. */
0:      pause
        cmpq    $0, toggles_go
        je      0b
        mov     $TOGGLES, %ecx
        mov     $0x409000, %edx
1:      xorq    $1, window_pt + 9 * 8
        invlpg  (%rdx)
        dec     %ecx
        jnz     1b
        orq     $1, window_pt + 9 * 8
        invlpg  (%rdx)
        movq    $1, toggles_done
        ret

        .data
        .globl toggles_done, toggles_go
        .p2align 3
toggles_done:   .quad 0
toggles_go:     .quad 0
        .section .note.GNU-stack, "", @progbits
