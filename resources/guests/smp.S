/* CPL0 part of the two-vCPU guest: start the second CPU. */
        .text
        .globl kernel_hook
kernel_hook:
        jmp     start_aps
        .section .note.GNU-stack, "", @progbits
