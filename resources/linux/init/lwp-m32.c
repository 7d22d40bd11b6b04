/*
 * /lwp-m32: a 32-bit program (-m32 -mlwp), whose LLWPCB, SLWPCB, LWPINS and
 * LWPVAL run in compatibility mode, where lwpvmm decodes them with the code
 * segment's size (XOP.W and the R, X and B bits ignored) behind the guest
 * module. Linux starts it and returns to it (IRETQ) like any 32-bit task.
 *
 * It makes no system call: on kvm_pvm a 32-bit system call (INT 0x80)
 * raises #UD instead (docs/linux-guest.md). So it reports as a traced
 * program: it ends at a UD2 with EAX holding the checks that passed (bit N
 * for check N) and EBX how many ran, which /lwp-compat32, its tracer,
 * reads. The checks are listed in the same order there.
 */
#include "lwp.h"

#define SLOTS 32

static struct lwpcb cb __attribute__((aligned(64)));
static struct lwp_record ring[SLOTS] __attribute__((aligned(4096)));
static unsigned int passed_mask, checks;

static void expect(int ok)
{
	passed_mask |= (unsigned int)(ok != 0) << checks;
	checks++;
}

/* `llwpcb %eax` with XOP.W set: binutils and the CPU take it as the
 * 32-bit form in compatibility mode. */
static void llwpcb_w1(void *block)
{
	__asm__ volatile(".byte 0x8f, 0xe9, 0xf8, 0x12, 0xc0" ::"a"(block) : "memory");
}

int main(void)
{
	unsigned char cf;

	expect(sizeof(void *) == 4);
	expect(__slwpcb() == 0);
	cb.flags = LWP_VAL;
	cb.buffer_size = sizeof(ring);
	cb.buffer_base = (unsigned long)ring;
	__llwpcb(&cb);
	expect(__slwpcb() == &cb);
	cf = __lwpins32(0x11223344, 0xabcdef01, 0x1234);
	expect(cf == 0);
	expect(ring[0].event_id == LWP_EVENT_INSERT && ring[0].data1 == 0xabcdef01 &&
	       ring[0].data2 == 0x11223344 && ring[0].flags == 0x1234);
	expect(ring[0].ip >= 0x8048000 && ring[0].ip < 0x9000000);
	__lwpval32(5, 0x77, 0x55);
	__slwpcb();
	expect(ring[1].event_id == LWP_EVENT_VAL && ring[1].data1 == 0x77 &&
	       ring[1].data2 == 5 && cb.head == 2 * sizeof(struct lwp_record));
	__llwpcb(0);
	llwpcb_w1(&cb);
	expect(__slwpcb() == &cb);
	__llwpcb(0);
	expect(__slwpcb() == 0);
	__asm__ volatile("ud2" ::"a"(passed_mask), "b"(checks));
	return 0;
}
