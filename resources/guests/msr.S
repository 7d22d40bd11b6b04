/* CPL0 part of the MSR guest: runs the msr_ops table (RDMSR or WRMSR of
 * the LWP MSRs) and records, for each, the value read and whether it
 * raised #GP. */
        .text
        .globl kernel_hook
kernel_hook:
        mov     $msr_ops, %rsi
1:      mov     (%rsi), %eax            /* 0 end, 1 rdmsr, 2 wrmsr */
        test    %eax, %eax
        jz      9f
        mov     4(%rsi), %ecx
        mov     fault_count, %r8
        movq    $2f, fault_resume
        xor     %edx, %edx
        cmp     $1, %eax
        jne     3f
        rdmsr
        jmp     2f
3:      mov     8(%rsi), %eax
        mov     12(%rsi), %edx
        wrmsr
2:      movq    $0, fault_resume
        mov     fault_count, %r9
        sub     %r8, %r9
        mov     %r9, 24(%rsi)
        shl     $32, %rdx
        mov     %eax, %eax
        or      %rdx, %rax
        mov     %rax, 16(%rsi)
        add     $32, %rsi
        jmp     1b
9:      ret
        .section .note.GNU-stack, "", @progbits
