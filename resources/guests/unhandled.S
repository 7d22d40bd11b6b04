/* CPL0 hook that touches guest-physical memory nobody backs: the VMM must
 * stop with an error naming the exit. */
        .text
        .globl kernel_hook
kernel_hook:
        mov     $0xd0000000, %eax
        movl    $1, (%rax)
        ret
        .section .note.GNU-stack, "", @progbits
