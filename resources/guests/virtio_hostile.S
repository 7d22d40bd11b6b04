/* CPL0 part of the hostile virtio guest: the 2 MiB page holding the virtio
 * register windows (0xd0000000) becomes user-accessible, so the CPL3 part
 * drives the devices directly, and the 8259s are masked: the devices'
 * interrupt lines reach the PICs too, whose reset vector base is 0, and
 * this guest polls its used rings instead. */
        .text
        .globl kernel_hook
kernel_hook:
        mov     $0xff, %al
        out     %al, $0x21
        out     %al, $0xa1
        orq     $4, pdpt + 3 * 8
        orq     $4, pd3 + 128 * 8
        mov     %cr3, %rax
        mov     %rax, %cr3
        ret
