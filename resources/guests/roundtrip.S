/* CPL0 part of the round-trip benchmark guest: times N RDMSRs of LWP_CFG
 * (userspace MSR exits) against N CPL0 port writes (port 0x80), with RDTSC,
 * and leaves the cycle counts for the CPL3 part to print. */
#define N 2000
        .text
        .globl kernel_hook
kernel_hook:
        push    %rbx
        rdtsc
        shl     $32, %rdx
        or      %rax, %rdx
        mov     %rdx, %rbx
        mov     $N, %esi
1:      mov     $0xc0000105, %ecx
        rdmsr
        dec     %esi
        jnz     1b
        rdtsc
        shl     $32, %rdx
        or      %rax, %rdx
        sub     %rbx, %rdx
        mov     %rdx, cpl0_rdmsr_cycles
        rdtsc
        shl     $32, %rdx
        or      %rax, %rdx
        mov     %rdx, %rbx
        mov     $N, %esi
2:      out     %al, $0x80
        dec     %esi
        jnz     2b
        rdtsc
        shl     $32, %rdx
        or      %rax, %rdx
        sub     %rbx, %rdx
        mov     %rdx, cpl0_out_cycles
        movq    $N, cpl0_iterations
        pop     %rbx
        ret
        .section .note.GNU-stack, "", @progbits
