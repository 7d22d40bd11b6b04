/* CPL0 part of the bad-LWPCB guest: the runtime's bad window pages. The
 * guest runs with 64 MiB of RAM. */
        .text
        .globl kernel_hook
kernel_hook:
        jmp     bad_window_pages
        .section .note.GNU-stack, "", @progbits
