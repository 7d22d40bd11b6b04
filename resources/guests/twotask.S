/* CPL0 part of the two-task guests (twotask.c, sample_as.c): a second CPL3 task in its own address
 * space, and a LAPIC-timer handler that switches between the two, carrying
 * each task's LWP state through lwpvmm's LWP state calls (docs/pv-abi.md).
 *
 * Task B's address space is task A's with the 4 KiB window (VA 0x400000)
 * mapped to other physical pages (0x600000), so both tasks use the same
 * linear addresses for their LWPCB and ring. */
#define STATE_PORT 0x5d
#define STATE_SAVE 1
#define STATE_RESTORE 2
#define TIMER_VECTOR 0x30
#define LAPIC 0xfee00000
#define FRAME_QUADS 20

        .text
        .globl kernel_hook
kernel_hook:
        mov     $TIMER_VECTOR, %edi
        mov     $timer_handler, %esi
        call    set_gate
        mov     $LAPIC, %eax
        movl    $0x3, 0x3e0(%rax)               /* divide by 16 */
        movl    $(0x20000 | TIMER_VECTOR), 0x320(%rax)  /* periodic */
        movl    $100000, 0x380(%rax)            /* 1.6 ms at 1 GHz */
        ret

/* The LWP state call: %eax = operation, area of task %rdx. A guest that
 * sets use_state_calls to 0 (sample_as.c) switches tasks without them. */
state_call:
        cmpb    $0, use_state_calls
        je      1f
        imul    $128, %rdx, %rdi
        add     $lwp_areas, %rdi
        out     %al, $STATE_PORT
        test    %rax, %rax
        jz      1f
        incq    state_errors
1:      ret

timer_handler:
        push    %rax
        push    %rbx
        push    %rcx
        push    %rdx
        push    %rsi
        push    %rdi
        push    %rbp
        push    %r8
        push    %r9
        push    %r10
        push    %r11
        push    %r12
        push    %r13
        push    %r14
        push    %r15
        cld
        mov     current, %rdx
        mov     $STATE_SAVE, %eax
        call    state_call
        mov     current, %rax
        imul    $(8 * FRAME_QUADS), %rax, %rdi
        add     $tcbs, %rdi
        mov     %rsp, %rsi
        mov     $FRAME_QUADS, %ecx
        rep movsq
        xorq    $1, current
        mov     current, %rdx
        mov     cr3s(, %rdx, 8), %rax
        mov     %rax, %cr3
        mov     $STATE_RESTORE, %eax
        call    state_call
        mov     current, %rax
        imul    $(8 * FRAME_QUADS), %rax, %rsi
        add     $tcbs, %rsi
        mov     %rsp, %rdi
        mov     $FRAME_QUADS, %ecx
        rep movsq
        incq    switches
        mov     $LAPIC, %eax
        movl    $0, 0xb0(%rax)
        pop     %r15
        pop     %r14
        pop     %r13
        pop     %r12
        pop     %r11
        pop     %r10
        pop     %r9
        pop     %r8
        pop     %rbp
        pop     %rdi
        pop     %rsi
        pop     %rdx
        pop     %rcx
        pop     %rbx
        pop     %rax
        iretq

task_b_entry:
        mov     $1, %edi
        call    task_main
1:      pause
        jmp     1b

        .data
        .globl switches, state_errors
        .p2align 3
current:        .quad 0
switches:       .quad 0
state_errors:   .quad 0
cr3s:           .quad pml4, pml4_b
/* Saved contexts: r15..rax, then RIP, CS, RFLAGS, RSP, SS. Task B starts
 * at task_b_entry on its own stack. */
tcbs:
        .fill FRAME_QUADS, 8, 0
        .fill 15, 8, 0
        .quad task_b_entry, 0x23, 0x202, task_b_stack_top, 0x1b
        .p2align 7
lwp_areas:
        .fill 256, 1, 0

        .section .data.pagetables, "aw"
        .p2align 12
pml4_b:
        .quad pdpt_b + 0x7
        .fill 511, 8, 0
pdpt_b:
        .quad pd0_b + 0x7
        .quad pd1 + 0x3
        .quad pd2 + 0x3
        .quad pd3 + 0x3
        .fill 508, 8, 0
pd0_b:
        .set i, 0
        .rept 512
        .if i == 2
        .quad window_pt_b + 0x7
        .else
        .quad (i << 21) | 0x87
        .endif
        .set i, i + 1
        .endr
window_pt_b:
        .set i, 0
        .rept 512
        .quad (0x600000 + (i << 12)) | 0x7
        .set i, i + 1
        .endr

        .bss
        .p2align 12
task_b_stack:   .skip 16384
task_b_stack_top:
        .section .note.GNU-stack, "", @progbits
