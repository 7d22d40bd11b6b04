/* CPL0 part of the CPL probe: marks on the POST port (0x80) at CPL0 in the
 * kernel code segment (stage 0) and in a DPL-0 conforming code segment
 * reached by a far return (stage 1). tests/cpl.rs reads the vCPU's
 * segment registers at each mark. */
#define KERNEL_CS 0x08
#define CONFORMING_SEL 0x50
        .text
        .globl kernel_hook
kernel_hook:
        mov     $0, %eax
        out     %al, $0x80
        pushq   $CONFORMING_SEL
        pushq   $1f
        lretq
1:      mov     $1, %eax
        out     %al, $0x80
        pushq   $KERNEL_CS
        pushq   $2f
        lretq
2:      ret
        .section .note.GNU-stack, "", @progbits
