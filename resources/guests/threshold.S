/* CPL0 part of the threshold guest: the threshold interrupt on vector
 * 0x41. */
        .text
        .globl kernel_hook
kernel_hook:
        mov     $0xc0000105, %ecx
        rdmsr
        mov     $0x4100, %edx
        wrmsr
        ret
        .section .note.GNU-stack, "", @progbits
