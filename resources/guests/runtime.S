/*
 * The runtime every lwpvmm test guest shares: a PVH entry (32-bit protected
 * mode, paging off), the switch to long mode, a GDT with user segments, a
 * TSS whose I/O bitmap opens the serial port and the exit port to CPL3, an
 * IDT with lwpvmm's paravirtual #UD shim, recording fault and interrupt
 * handlers, then one iretq into the CPL3 program (`main`).
 *
 * CPL0 work is kept to a few hundred instructions: on nested KVM hosts
 * (kvm_pvm) every CPL0 instruction goes through KVM's emulator. Page tables
 * are built by the assembler, not at run time.
 *
 * Paravirtual interface: docs/pv-abi.md.
 */

#define KERNEL_CS 0x08
#define KERNEL_DS 0x10
#define USER_DS   0x1b
#define USER_CS   0x23
#define TSS_SEL   0x28
#define CODE32_SEL 0x38
#define TSS_AP_SEL 0x40
#define CONFORMING_SEL 0x50
#define AP_TRAMPOLINE 0x8000

#define PV_UD_PORT 0x5c
#define PV_DB_PORT 0x5b
#define PV_STATE_PORT 0x5d
#define EXIT_PORT  0xf4
#define LAPIC_BASE 0xfee00000

        .section .note.Xen, "a", @note
        .p2align 2
        .long 4                 /* name size */
        .long 4                 /* desc size */
        .long 18                /* XEN_ELFNOTE_PHYS32_ENTRY */
        .asciz "Xen"
        .long _start32

        .section .text.boot, "ax"
        .code32
        .globl _start32
_start32:
        cli
        mov     %ebx, start_info_ptr    /* PVH: EBX = hvm_start_info */
        lgdt    gdt_desc
        mov     %cr4, %eax
        or      $0x620, %eax            /* PAE | OSFXSR | OSXMMEXCPT */
        mov     %eax, %cr4
        mov     $pml4, %eax
        mov     %eax, %cr3
        mov     $0xc0000080, %ecx       /* EFER */
        rdmsr
        or      $0x900, %eax            /* LME | NXE */
        wrmsr
        mov     %cr0, %eax
        and     $0xfffffffb, %eax       /* clear EM */
        or      $0x80010003, %eax       /* PG | WP | MP | PE */
        mov     %eax, %cr0
        ljmp    $KERNEL_CS, $start64

        .code64
start64:
        mov     $KERNEL_DS, %ax
        mov     %ax, %ds
        mov     %ax, %es
        mov     %ax, %ss
        xor     %eax, %eax
        mov     %ax, %fs
        mov     %ax, %gs
        mov     $kernel_stack_top, %rsp

        mov     $tss, %rax
        mov     $gdt_tss, %rdi
        call    set_tss_base
        mov     $tss_ap, %rax
        mov     $gdt_tss_ap, %rdi
        call    set_tss_base
        mov     $TSS_SEL, %ax
        ltr     %ax
        call    setup_idt
        lidt    idt_desc
        call    read_cpuid
        call    declare_db_doorbell
        call    cpu_init
        call    kernel_hook

        /* Into the CPL3 program, interrupts on. */
        pushq   $USER_DS
        pushq   $user_stack_top
        pushq   $0x202
        pushq   $USER_CS
        pushq   $user_start
        iretq

/* The CPUID leaves LWP software needs, read at CPL0 (on kvm_pvm, CPL3 CPUID
 * returns the host's leaves). Entry i: leaf, subleaf, eax, ebx, ecx, edx. */
read_cpuid:
        mov     $cpuid_table, %rsi
1:      mov     (%rsi), %eax
        test    %eax, %eax
        jz      2f
        mov     4(%rsi), %ecx
        cpuid
        mov     %eax, 8(%rsi)
        mov     %ebx, 12(%rsi)
        mov     %ecx, 16(%rsi)
        mov     %edx, 20(%rsi)
        add     $24, %rsi
        jmp     1b
2:      ret

/* As an OS that supports LWP would: when CPUID shows LWP, enable in
 * LWP_CFG every feature the processor supports, with the threshold
 * interrupt on vector 0x40 and CoreId = the local APIC ID. */
setup_lwp_cfg:
        testl   $0x8000, cpuid_table + 24 + 16  /* 0x80000001.ECX[15] */
        jz      1f
        mov     $LAPIC_BASE, %eax
        mov     0x20(%rax), %edx
        shr     $24, %edx                       /* CoreId = APIC ID */
        or      $0x4000, %edx                   /* vector 0x40 in 47:40 */
        mov     cpuid_table + 48 + 20, %eax     /* 0x8000001C.EDX */
        and     $0xe000007e, %eax
        mov     $0xc0000105, %ecx
        wrmsr
1:      ret

/* Interrupt gates (DPL 0) for the vectors in idt_handlers. */
setup_idt:
        mov     $idt_handlers, %r8
1:      mov     (%r8), %rdi
        cmp     $-1, %rdi
        je      2f
        mov     8(%r8), %rsi
        call    set_gate
        add     $16, %r8
        jmp     1b
2:      ret

/* set_gate(vector %rdi, handler %rsi): a DPL-0 interrupt gate. Guests call
 * it from kernel_hook for vectors of their own. */
        .globl set_gate
set_gate:
        shl     $4, %rdi
        add     $idt, %rdi
        mov     %si, (%rdi)
        movw    $KERNEL_CS, 2(%rdi)
        movw    $0x8e00, 4(%rdi)
        shr     $16, %rsi
        mov     %si, 6(%rdi)
        shr     $16, %rsi
        mov     %esi, 8(%rdi)
        ret

        .weak kernel_hook
kernel_hook:
        ret

/* Turns window pages into bad places for LWP tests (64 MiB of RAM assumed):
 * W0 supervisor-only, W1 read-only, W2 not present, W3 the IOAPIC (MMIO
 * hole), W5 the last page of RAM, W6 just past the end of RAM. */
        .globl bad_window_pages
bad_window_pages:
        andq    $~4, window_pt + 0 * 8
        andq    $~2, window_pt + 1 * 8
        movq    $0, window_pt + 2 * 8
        mov     $0xfec00007, %eax
        mov     %rax, window_pt + 3 * 8
        mov     $0x3fff007, %eax
        mov     %rax, window_pt + 5 * 8
        mov     $0x4000007, %eax
        mov     %rax, window_pt + 6 * 8
        mov     %cr3, %rax
        mov     %rax, %cr3
        ret

/* #UD: the paravirtual LWP shim. The doorbell is the first instruction, so
 * every general register still holds the interrupted context. The VMM
 * answers in RFLAGS.CF: clear = handled (frame updated), set = not an LWP
 * instruction for the VMM, so the guest's own #UD path runs. */
ud_handler:
        out     %al, $PV_UD_PORT
        jc      1f
        iretq
1:      pushq   $0
        pushq   $6
        jmp     fault_common

/* #DB: the paravirtual single-step doorbell (precise LWP events), declared
 * to the VMM at boot. CF clear: a step of the VMM's, resume; CF set: the
 * guest's own #DB. */
db_handler:
        out     %al, $PV_DB_PORT
        jc      1f
        iretq
1:      pushq   $0
        pushq   $1
        jmp     fault_common

.macro FAULT_NOCODE vec
fault_\vec:
        pushq   $0
        pushq   $\vec
        jmp     fault_common
.endm
.macro FAULT_CODE vec
fault_\vec:
        pushq   $\vec
        jmp     fault_common
.endm
        FAULT_NOCODE 0
        FAULT_NOCODE 3
        FAULT_CODE 13
        FAULT_CODE 14

/* A fault the program expects: it stored a resume address in fault_resume
 * before the faulting instruction. Record vector, error code, CR2 and RIP,
 * then resume there. An unexpected fault ends the VM with exit value
 * 0x80 | vector. */
fault_common:
        push    %rax
        push    %rdx
        mov     fault_resume, %rax
        test    %rax, %rax
        jz      9f
        movq    $0, fault_resume
        mov     16(%rsp), %rdx
        mov     %rdx, fault_vector
        mov     24(%rsp), %rdx
        mov     %rdx, fault_error
        mov     %cr2, %rdx
        mov     %rdx, fault_cr2
        mov     32(%rsp), %rdx
        mov     %rdx, fault_rip
        mov     %rax, 32(%rsp)
        andq    $~0x100, 48(%rsp)               /* resume without TF */
        incq    fault_count
        pop     %rdx
        pop     %rax
        add     $16, %rsp
        iretq
9:      mov     16(%rsp), %rax
        or      $0x80, %al
        out     %al, $EXIT_PORT
        hlt
        jmp     9b

/* Vectors 0x40-0x4f: count the interrupt, EOI, return. */
.macro IRQ vec
irq_\vec:
        incq    irq_counts + 8 * (\vec - 0x40)
        push    %rax
        mov     $LAPIC_BASE, %eax
        movl    $0, 0xb0(%rax)
        pop     %rax
        iretq
.endm
        .irp v, 0x40,0x41,0x42,0x43,0x44,0x45,0x46,0x47,0x48,0x49,0x4a,0x4b,0x4c,0x4d,0x4e,0x4f
        IRQ \v
        .endr

/* Tells the VMM that the #DB handler starts with the #DB doorbell, when
 * the VMM offers it (0x40000101.EBX bit 3). */
declare_db_doorbell:
        cmpl    $0x40000101, cpuid_table + 72 + 8      /* lwpvmm's leaves present */
        jb      1f
        testl   $8, cpuid_table + 96 + 12               /* 0x40000101.EBX[3] */
        jz      1f
        mov     $3, %eax
        out     %al, $PV_STATE_PORT
1:      ret

/* Writes base %rax into the 16-byte TSS descriptor at %rdi (bits 15:0,
 * 23:16, 31:24, 63:32). */
set_tss_base:
        mov     %ax, 2(%rdi)
        shr     $16, %rax
        mov     %al, 4(%rdi)
        mov     %ah, 7(%rdi)
        shr     $16, %rax
        mov     %eax, 8(%rdi)
        ret

/* Per-CPU setup: software-enable the local APIC (SVR = 0x1ff), LWP_CFG. */
cpu_init:
        mov     $LAPIC_BASE, %eax
        movl    $0x1ff, 0xf0(%rax)
        jmp     setup_lwp_cfg

/* Starts the second CPU (APIC ID 1) with INIT and two SIPIs; it enters
 * ap_start16 at 0x8000, runs ap_kernel_hook at CPL0, then ap_main at CPL3.
 * Call from kernel_hook. */
        .globl start_aps
start_aps:
        mov     $ap_start16, %rsi
        mov     $AP_TRAMPOLINE, %edi
        mov     $(ap_start16_end - ap_start16), %ecx
        rep movsb
        mov     $LAPIC_BASE, %eax
        movl    $(1 << 24), 0x310(%rax)
        movl    $0x4500, 0x300(%rax)            /* INIT */
        movl    $(0x4600 | (AP_TRAMPOLINE >> 12)), 0x300(%rax)  /* SIPI */
        movl    $(0x4600 | (AP_TRAMPOLINE >> 12)), 0x300(%rax)
        ret

        .code16
ap_start16:
        cli
        xor     %ax, %ax
        mov     %ax, %ds
        lgdtl   AP_TRAMPOLINE + (ap_gdt_desc - ap_start16)
        mov     %cr0, %eax
        or      $1, %eax
        mov     %eax, %cr0
        ljmpl   $CODE32_SEL, $ap_start32
        .p2align 2
ap_gdt_desc:
        .word gdt_end - gdt - 1
        .long gdt
ap_start16_end:

        .code32
ap_start32:
        mov     $KERNEL_DS, %ax
        mov     %ax, %ds
        mov     %cr4, %eax
        or      $0x620, %eax
        mov     %eax, %cr4
        mov     $pml4, %eax
        mov     %eax, %cr3
        mov     $0xc0000080, %ecx
        rdmsr
        or      $0x900, %eax
        wrmsr
        mov     %cr0, %eax
        and     $0xfffffffb, %eax
        or      $0x80010003, %eax
        mov     %eax, %cr0
        ljmp    $KERNEL_CS, $ap_start64

        .code64
ap_start64:
        mov     $KERNEL_DS, %ax
        mov     %ax, %ds
        mov     %ax, %es
        mov     %ax, %ss
        xor     %eax, %eax
        mov     %ax, %fs
        mov     %ax, %gs
        mov     $ap_kernel_stack_top, %rsp
        mov     $TSS_AP_SEL, %ax
        ltr     %ax
        lidt    idt_desc
        call    cpu_init
        call    ap_kernel_hook
        pushq   $USER_DS
        pushq   $ap_user_stack_top
        pushq   $0x202
        pushq   $USER_CS
        pushq   $ap_user_start
        iretq

        .weak ap_kernel_hook
ap_kernel_hook:
        ret

        .text
user_start:
        call    main
        mov     %eax, %edi
        call    guest_exit

ap_user_start:
        call    ap_main
1:      pause
        jmp     1b

        .weak ap_main
ap_main:
        ret

/* ---- data ---- */
        .data
        .p2align 4
gdt:
        .quad 0
        .quad 0x00af9b000000ffff        /* 0x08 kernel code 64 */
        .quad 0x00cf93000000ffff        /* 0x10 kernel data */
        .quad 0x00cff3000000ffff        /* 0x18 user data */
        .quad 0x00affb000000ffff        /* 0x20 user code 64 */
gdt_tss:
        .quad 0x0000890000000000 + (tss_end - tss - 1)
        .quad 0
        .quad 0x00cf9b000000ffff        /* 0x38 kernel code 32 (AP start) */
gdt_tss_ap:
        .quad 0x0000890000000000 + (tss_end - tss - 1)
        .quad 0
        .quad 0x00af9e000000ffff        /* 0x50 conforming code 64, DPL 0 */
        .quad 0x00cffb000000ffff        /* 0x58 user code 32 (compatibility mode) */
gdt_end:
gdt_desc:
        .word gdt_end - gdt - 1
        .quad gdt

.macro TSS name, rsp0
        .p2align 4
\name:
        .long 0
        .quad \rsp0                     /* RSP0 */
        .quad 0, 0
        .quad 0                         /* reserved */
        .quad 0, 0, 0, 0, 0, 0, 0       /* IST1-7 */
        .quad 0
        .word 0
        .word 104                       /* I/O map base: right after */
        .globl \name\()_iomap
\name\()_iomap:
        /* Ports 0x000-0x3ff: allow the snapshot debug port 0x5a, 0x80,
         * 0xf4 and 0x3f8-0x3ff, deny the rest. */
        .fill 11, 1, 0xff
        .byte 0xfb                      /* 0x58-0x5f: allow 0x5a */
        .fill 4, 1, 0xff
        .byte 0xfe                      /* 0x80-0x87: allow 0x80 */
        .fill 13, 1, 0xff
        .byte 0xef                      /* 0xf0-0xf7: allow 0xf4 */
        .fill 96, 1, 0xff
        .byte 0x00                      /* 0x3f8-0x3ff */
        .byte 0xff                      /* terminator */
\name\()_end:
.endm
        TSS tss, kernel_stack_top
        TSS tss_ap, ap_kernel_stack_top

idt_handlers:
        .quad 0, fault_0, 1, db_handler, 3, fault_3, 6, ud_handler
        .quad 13, fault_13, 14, fault_14
        .irp v, 0x40,0x41,0x42,0x43,0x44,0x45,0x46,0x47,0x48,0x49,0x4a,0x4b,0x4c,0x4d,0x4e,0x4f
        .quad \v, irq_\v
        .endr
        .quad -1

        .p2align 4
idt:
        .fill 256 * 16, 1, 0
idt_end:
idt_desc:
        .word idt_end - idt - 1
        .quad idt

        .globl fault_resume, fault_count, fault_vector, fault_error, fault_cr2, fault_rip
        .globl irq_counts, cpuid_table, window_pt, start_info_ptr
        .p2align 3
start_info_ptr: .quad 0
fault_resume:   .quad 0
fault_count:    .quad 0
fault_vector:   .quad 0
fault_error:    .quad 0
fault_cr2:      .quad 0
fault_rip:      .quad 0
irq_counts:     .fill 16, 8, 0
cpuid_table:
        .long 0x80000000, 0, 0, 0, 0, 0
        .long 0x80000001, 0, 0, 0, 0, 0
        .long 0x8000001c, 0, 0, 0, 0, 0
        .long 0x40000100, 0, 0, 0, 0, 0
        .long 0x40000101, 0, 0, 0, 0, 0
        .long 0, 0, 0, 0, 0, 0

/* Page tables: 0-1 GiB identity-mapped with user 2 MiB pages, except the
 * "window" 0x400000-0x5fffff, mapped by 4 KiB user pages in window_pt that a
 * test's kernel_hook may rewrite; 1-4 GiB identity-mapped supervisor-only
 * (the local APIC lives there). */
        .section .data.pagetables, "aw"
        .globl pml4, pdpt, pd1, pd2, pd3
        .p2align 12
pml4:
        .quad pdpt + 0x7
        .fill 511, 8, 0
pdpt:
        .quad pd0 + 0x7
        .quad pd1 + 0x3
        .quad pd2 + 0x3
        .quad pd3 + 0x3
        .fill 508, 8, 0
pd0:
        .set i, 0
        .rept 512
        .if i == 2
        .quad window_pt + 0x7
        .else
        .quad (i << 21) | 0x87
        .endif
        .set i, i + 1
        .endr
.macro PD_SUPERVISOR gib
        .set i, 0
        .rept 512
        .quad ((\gib << 30) + (i << 21)) | 0x83
        .set i, i + 1
        .endr
.endm
pd1:    PD_SUPERVISOR 1
pd2:    PD_SUPERVISOR 2
pd3:    PD_SUPERVISOR 3
window_pt:
        .set i, 0
        .rept 512
        .quad (0x400000 + (i << 12)) | 0x7
        .set i, i + 1
        .endr

        .bss
        .p2align 12
kernel_stack:   .skip 16384
kernel_stack_top:
user_stack:     .skip 65536
user_stack_top:
ap_kernel_stack: .skip 16384
ap_kernel_stack_top:
ap_user_stack:  .skip 65536
ap_user_stack_top:

        .section .note.GNU-stack, "", @progbits
