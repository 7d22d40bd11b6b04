/* CPL0 part of the protection-key guest: window page 4 gets protection key
 * 1 in its PTE, and CR4.PKE is turned on. pku_state: 1 = CPUID 7.0.ECX[3]
 * (PKU) offered; 2 = not offered and CR4.PKE refused with #GP, as a
 * processor without PKU does; 3 = not offered and CR4.PKE accepted anyway
 * (kvm_pvm does not check CR4 against CPUID). */
#define CR4_PKE (1 << 22)
        .text
        .globl kernel_hook
kernel_hook:
        push    %rbx
        mov     $7, %eax
        xor     %ecx, %ecx
        cpuid
        movabs  $(1 << 59), %rax
        or      %rax, window_pt + 4 * 8
        mov     %cr3, %rax
        mov     %rax, %cr3
        test    $8, %ecx
        jz      1f
        mov     %cr4, %rax
        or      $CR4_PKE, %rax
        mov     %rax, %cr4
        movq    $1, pku_state
        jmp     2f
1:      lea     3f(%rip), %rax
        mov     %rax, fault_resume
        mov     %cr4, %rax
        or      $CR4_PKE, %rax
        mov     %rax, %cr4
        movq    $0, fault_resume
        movq    $3, pku_state                   /* accepted anyway */
        jmp     2f
3:      movq    $2, pku_state                   /* refused by #GP */
2:      pop     %rbx
        ret

        .data
        .globl pku_state
        .p2align 3
pku_state:      .quad 0
        .section .note.GNU-stack, "", @progbits
