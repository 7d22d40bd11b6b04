/* CPL0 part of the kernel_insn guest: LDMXCSR/STMXCSR, VERR/VERW and
 * LOCK CMPXCHG16B as a kernel runs them. Where KVM runs guest CPL0 in its
 * instruction emulator (kvm_pvm), which lacks them, lwpvmm carries them
 * out (src/vmm/vcpu/kernel_insn.rs); elsewhere the CPU does. Either way
 * kinsn_results must hold what the CPU gives (kernel_insn.c checks). */
#define KERNEL_CS 0x08
#define KERNEL_DS 0x10
        .text
        .globl kernel_hook
kernel_hook:
        push    %rbx
        mov     $kinsn_results, %rdi
        /* MXCSR: load FZ | DAZ | every mask, store it back. */
        ldmxcsr kinsn_mxcsr_in
        stmxcsr 0(%rdi)
        /* The selector checks: ZF into a byte each. */
        mov     $KERNEL_DS, %eax
        verw    %ax
        setz    8(%rdi)
        mov     $KERNEL_CS, %eax
        verw    %ax
        setz    9(%rdi)
        verr    %ax
        setz    10(%rdi)
        xor     %eax, %eax
        verr    %ax
        setz    11(%rdi)
        /* A selector in memory, as Linux's buffer clear runs it. */
        verw    kinsn_ds
        setz    12(%rdi)
        /* CMPXCHG16B that matches: {1, 2} becomes {3, 4}. */
        mov     $1, %rax
        mov     $2, %rdx
        mov     $3, %rbx
        mov     $4, %rcx
        lock cmpxchg16b kinsn_pair
        setz    13(%rdi)
        /* One that does not: RDX:RAX gets {3, 4}, memory stays. */
        xor     %eax, %eax
        xor     %edx, %edx
        mov     $5, %rbx
        mov     $6, %rcx
        lock cmpxchg16b kinsn_pair
        setz    14(%rdi)
        mov     %rax, 16(%rdi)
        mov     %rdx, 24(%rdi)
        pop     %rbx
        ret

        .data
        .balign 16
        .globl kinsn_pair
kinsn_pair:
        .quad   1, 2
kinsn_mxcsr_in:
        .long   0x9fc0
kinsn_ds:
        .word   KERNEL_DS
        .section .note.GNU-stack, "", @progbits
