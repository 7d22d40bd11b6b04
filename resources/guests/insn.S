/* CPL0 part of the instruction guest: CoreId 5 in LWP_CFG, so records can
 * be checked for it; then LLWPCB and SLWPCB executed at CPL0 (on kvm_pvm
 * they end KVM_RUN with an emulation failure and the VMM emulates them; on
 * other hosts they #UD into the shim). Without LwpAvail it does nothing,
 * like an OS that does not enable LWP. */
        .text
        .globl kernel_hook
kernel_hook:
        testl   $1, cpuid_table + 48 + 8        /* 0x8000001C.EAX LwpAvail */
        jz      1f
        mov     $0xc0000105, %ecx
        rdmsr
        mov     $0x4005, %edx           /* vector 0x40, CoreId 5 */
        wrmsr
        mov     $cpl0_cb, %eax
        llwpcb  %rax
        slwpcb  %rbx
        mov     %rbx, cpl0_slwpcb
        xor     %eax, %eax
        llwpcb  %rax
1:      ret
        .section .note.GNU-stack, "", @progbits
