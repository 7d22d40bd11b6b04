/*
 * LWPINS, LWPVAL, LLWPCB and SLWPCB from an unmodified Linux process (gcc's
 * -mlwp intrinsics): the records' contents, CF on a full ring and
 * MissedEvents.
 */
#include "lwp.h"

#define SLOTS 32
/* LWPINSs timed: as many as the ring takes, so each one stores. */
#define TIMED (SLOTS - 1)

static struct lwpcb cb __attribute__((aligned(64)));
static struct lwp_record ring[SLOTS] __attribute__((aligned(4096)));

static void load(unsigned int flags, unsigned int val_interval)
{
	/* LLWPCB flushes the live block into its LWPCB first: turn LWP off
	 * before the block is reused. */
	__llwpcb(0);
	memset(&cb, 0, sizeof(cb));
	memset(ring, 0, sizeof(ring));
	cb.flags = flags;
	cb.buffer_size = sizeof(ring);
	cb.buffer_base = (unsigned long long)ring;
	cb.events[LWP_EVENT_VAL - 1].interval = val_interval;
	__llwpcb(&cb);
}

static unsigned int records(void)
{
	__slwpcb();
	return (cb.head - cb.tail) / sizeof(struct lwp_record);
}

int main(void)
{
	unsigned int i, full = 0;
	unsigned char cf;

	check("CPUID 0x8000001c.EAX enables LWPVAL",
	      (lwp_enabled() & (LWP_AVAIL | LWP_VAL)) == (LWP_AVAIL | LWP_VAL));
	check_eq("SLWPCB with LWP off", (unsigned long long)__slwpcb(), 0);

	load(LWP_VAL | LWP_PTSC, 2);
	check_eq("SLWPCB returns the LWPCB", (unsigned long long)__slwpcb(),
		 (unsigned long long)&cb);
	check_eq("LLWPCB grants LWPVAL and PTSC", cb.flags, LWP_VAL | LWP_PTSC);

	cf = __lwpins32(0x11223344, 0xabcdef01, 0x1234);
	check_eq("LWPINS stored: CF=0", cf, 0);
	check_eq("LWPINS record: EventId 255", ring[0].event_id, LWP_EVENT_INSERT);
	check_eq("LWPINS record: EventFlags = imm32", ring[0].flags, 0x1234);
	check_eq("LWPINS record: Data1 = r/m32", ring[0].data1, 0xabcdef01);
	check_eq("LWPINS record: Data2 = the register", ring[0].data2, 0x11223344);
	check("LWPINS record: an instruction address in this program",
	      ring[0].ip >= 0x400000 && ring[0].ip < 0x800000);
	check("LWPINS record: a PTSC timestamp", ring[0].timestamp != 0);

	/* Interval 2: LWPVAL records at runs 1 and 4 of 6. */
	for (i = 1; i <= 6; i++)
		__lwpval32(i, 0x500 + i, 0x77);
	check_eq("LWPVAL every interval + 1: two records", records(), 3);
	check_eq("LWPVAL record: EventId 1", ring[1].event_id, LWP_EVENT_VAL);
	check_eq("LWPVAL record: Data1", ring[1].data1, 0x501);
	check_eq("LWPVAL record: Data2", ring[1].data2, 1);
	check_eq("LWPVAL record: EventFlags", ring[1].flags, 0x77);
	check_eq("second LWPVAL record: Data2", ring[2].data2, 4);

	/* A ring of SLOTS holds SLOTS - 1 records (the smallest ring LLWPCB
	 * takes with MinBufferSize 1 is 32 records). */
	load(LWP_VAL, 0);
	for (i = 0; i < SLOTS + 2; i++)
		if (__lwpins32(i, i, 0))
			full++;
		else if (full)
			break;
	check_eq("LWPINS on a full ring: CF=1 for each record that did not fit",
		 full, 3);
	check_eq("the full ring holds SLOTS - 1 records", records(), SLOTS - 1);
	check_eq("MissedEvents counts what did not fit", cb.missed, 3);

	/* The cost of one LWPINS, for the benchmark (benches/vmm.rs). */
	load(LWP_VAL, 0);
	{
		unsigned long long t0 = __rdtsc();

		for (i = 0; i < TIMED; i++)
			__lwpins32(i, i, 0);
		printf("  lwpins from a Linux process: %llu guest TSC cycles each (%u runs)\n",
		       (__rdtsc() - t0) / TIMED, TIMED);
	}

	__llwpcb(0);
	check_eq("LLWPCB 0 turns LWP off", (unsigned long long)__slwpcb(), 0);
	return summary("lwp-records");
}
