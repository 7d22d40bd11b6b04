/* CPL0 part of the reserved-bit oracle guest (reserved_bits.c): a probe
 * address space of its own under PML4 slot 1 (linear 512 GiB up), so that
 * a bit set in its PML4E touches nothing the guest runs on:
 *   0x80_0000_0000  a 4 KiB page (probe_pt[0]),
 *   0x80_0020_0000  a 2 MiB page (probe_pd[1], the 2 MiB frame of
 *                   probe_page),
 *   0x80_4000_0000  a 1 GiB page (probe_pdpt[1], physical 0),
 * each reaching the scratch page probe_page. A divide error (#DE) of the
 * CPL3 part writes one paging entry, sets EFER.NXE and flushes the TLB (a
 * CR3 reload: CR4.PGE is off, so nothing survives it) in one step: on
 * kvm_pvm a CPL3 `int $0x80` through a DPL-3 gate raised #UD instead, while
 * exceptions, which no gate DPL stops, are delivered. The handler replaces the
 * runtime's #DE recorder, which this guest has no other use for.
 * The vendor string and MAXPHYADDR are read here at CPL0, where kvm_pvm
 * answers CPUID from the VMM's table. */
#define DE_VECTOR 0
#define MSR_EFER 0xc0000080
#define EFER_NXE (1 << 11)

        .text
        .globl kernel_hook
kernel_hook:
        push    %rbx
        xor     %eax, %eax
        xor     %ecx, %ecx
        cpuid
        mov     %ebx, guest_vendor
        mov     %edx, guest_vendor + 4
        mov     %ecx, guest_vendor + 8
        mov     $0x80000000, %eax
        cpuid
        cmp     $0x80000008, %eax
        jb      1f
        mov     $0x80000008, %eax
        cpuid
        movzbl  %al, %eax
        mov     %rax, guest_maxphyaddr
1:      mov     $probe_page, %eax
        and     $~0x1fffff, %eax
        or      $0x87, %eax                     /* P, RW, US, PS */
        mov     %rax, probe_pd + 8
        mov     $(probe_pdpt + 7), %eax
        mov     %rax, pml4 + 8
        mov     %cr3, %rax
        mov     %rax, %cr3
        mov     $DE_VECTOR, %edi
        mov     $set_entry_handler, %esi
        call    set_gate
        pop     %rbx
        ret

/* #DE, raised by the CPL3 part on purpose (set_entry in reserved_bits.c):
 * stores RSI at RDI (a paging entry), turns EFER.NXE on when R9 is 1 and
 * off when it is 0, reloads CR3 and resumes at R8. No error code: the
 * frame's RIP is at the top of the stack. */
set_entry_handler:
        mov     %rsi, (%rdi)
        push    %rax
        push    %rcx
        push    %rdx
        mov     $MSR_EFER, %ecx
        rdmsr
        and     $~EFER_NXE, %eax
        test    %r9, %r9
        jz      1f
        or      $EFER_NXE, %eax
1:      wrmsr
        mov     %cr3, %rax
        mov     %rax, %cr3
        pop     %rdx
        pop     %rcx
        pop     %rax
        mov     %r8, (%rsp)
        iretq

        .data
        .globl guest_vendor, guest_maxphyaddr
        .p2align 3
guest_vendor:   .fill 16, 1, 0
guest_maxphyaddr: .quad 36                      /* without leaf 0x8000_0008 */

        .section .data.pagetables, "aw"
        .globl probe_pdpt, probe_pd, probe_pt
        .p2align 12
probe_pdpt:
        .quad probe_pd + 0x7
        .quad 0x87                              /* 1 GiB page at 0 */
        .fill 510, 8, 0
probe_pd:
        .quad probe_pt + 0x7
        .fill 511, 8, 0                         /* [1]: by kernel_hook */
probe_pt:
        .quad probe_page + 0x7
        .fill 511, 8, 0

        .bss
        .globl probe_page
        .p2align 12
probe_page:     .skip 4096
        .section .note.GNU-stack, "", @progbits
