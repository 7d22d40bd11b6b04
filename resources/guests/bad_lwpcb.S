/* CPL0 part of the bad-LWPCB guest: turns pages of the runtime's 4 KiB
 * window (0x400000-0x5fffff) into every kind of bad place. The guest runs
 * with 64 MiB of RAM. */
        .text
        .globl kernel_hook
kernel_hook:
        andq    $~4, window_pt + 0 * 8          /* W0: supervisor-only */
        andq    $~2, window_pt + 1 * 8          /* W1: read-only */
        movq    $0, window_pt + 2 * 8           /* W2: not present */
        mov     $0xfec00007, %eax               /* W3: the IOAPIC, MMIO hole */
        mov     %rax, window_pt + 3 * 8
        mov     $0x3fff007, %eax                /* W5: the last page of RAM */
        mov     %rax, window_pt + 5 * 8
        mov     $0x4000007, %eax                /* W6: just past the end of RAM */
        mov     %rax, window_pt + 6 * 8
        mov     %cr3, %rax
        mov     %rax, %cr3
        ret
        .section .note.GNU-stack, "", @progbits
