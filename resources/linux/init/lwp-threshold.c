/*
 * The threshold interrupt: a process whose ring crosses its LWPCB's
 * Threshold gets SIGIO (docs/linux-guest.md). SIGIO's default action ends
 * the process, so a child that crosses the threshold dies of it; one that
 * stays below it exits normally. Then the interrupt on SMP: a child pinned
 * to the last CPU catches SIGIO with a handler that checks it runs there,
 * while its parent spins in user mode on CPU 0 with a handler that counts
 * any SIGIO it gets: an interrupt sent to the wrong CPU would signal it.
 * "The last CPU" is the last one with a threshold line: lwpvmm gives lines
 * to the first eight vCPUs only (docs/pv-abi.md).
 */
#include "smp.h"

#define LWP_INT (1u << 31)

static struct lwpcb cb __attribute__((aligned(64)));
static struct lwp_record ring[32] __attribute__((aligned(4096)));

static volatile int sigio_count, sigio_cpu = -1, sigio_elsewhere;
static int pinned_cpu;

/* The CPUs that have a threshold line, of `cpus`: lwpvmm's leaf
 * 0x40000102.EBX, read through the kernel's cpuid driver (user-mode CPUID
 * returns the host's leaves on kvm_pvm). */
static int line_cpus(int cpus)
{
	unsigned int regs[4];
	off_t at = 0x40000102;
	int fd = open("/dev/cpu/0/cpuid", O_RDONLY);
	int ok = fd >= 0 && lseek(fd, at, SEEK_SET) == at && read(fd, regs, 16) == 16;

	if (fd >= 0)
		close(fd);
	return ok && regs[1] >= 1 && regs[1] < (unsigned int)cpus ? (int)regs[1] : cpus;
}

/* Stores `records` records with a threshold of two records. */
static void record(unsigned int records)
{
	unsigned int i;

	memset(&cb, 0, sizeof(cb));
	memset(ring, 0, sizeof(ring));
	cb.flags = LWP_VAL | LWP_INT;
	cb.buffer_size = sizeof(ring);
	cb.buffer_base = (unsigned long long)ring;
	cb.threshold = 2 * sizeof(struct lwp_record);
	__llwpcb(&cb);
	if (cb.flags != (LWP_VAL | LWP_INT))
		exit(2);
	for (i = 0; i < records; i++)
		__lwpins32(i, i, 0);
}

static int run(unsigned int records)
{
	int status = -1;
	pid_t pid = fork();

	if (pid == 0) {
		record(records);
		exit(0);
	}
	if (pid < 0 || waitpid(pid, &status, 0) != pid)
		return -1;
	return status;
}

static void on_sigio(int sig)
{
	int cpu = current_cpu();

	(void)sig;
	sigio_count++;
	if (cpu != pinned_cpu)
		sigio_elsewhere++;
	sigio_cpu = cpu;
}

/* The pinned child: exits 0 when SIGIO came, once or more, always on its
 * CPU. */
static int pinned_child(int cpu)
{
	pinned_cpu = cpu;
	if (pin_to(cpu) || on_signal(SIGIO, on_sigio))
		return 3;
	record(3);
	__llwpcb(0);
	return sigio_count >= 1 && sigio_elsewhere == 0 && sigio_cpu == cpu ? 0 : 1;
}

int main(void)
{
	int below, crossing, cpus = online_cpus(), status = -1;
	unsigned int spins = 0;
	pid_t pid;

	check("CPUID 0x8000001c.EAX enables the threshold interrupt",
	      (lwp_enabled() & LWP_INT) != 0);
	below = run(1);
	check("below the threshold: the child exits normally", below == 0);
	crossing = run(3);
	check("crossing the threshold: SIGIO ends the child",
	      WIFSIGNALED_(crossing) && WTERMSIG_(crossing) == SIGIO);
	if (below || !WIFSIGNALED_(crossing))
		printf("    wait statuses %x and %x\n", below, crossing);

	pinned_cpu = 0;
	if (cpus < 1 || pin_to(0) || on_signal(SIGIO, on_sigio))
		return 2;
	cpus = line_cpus(cpus);
	pid = fork();
	if (pid == 0)
		return pinned_child(cpus - 1);
	/* Spin in user mode between looks, where a misdirected interrupt
	 * would find this process running. */
	while (waitpid(pid, &status, WNOHANG) == 0)
		for (spins = 0; spins < 200000; spins++)
			__asm__ volatile("" ::: "memory");
	printf("  on CPU %d: the pinned child's status %x; %d SIGIO here\n",
	       cpus - 1, status, sigio_count);
	check("on SMP: SIGIO reaches the thread pinned to the interrupted CPU",
	      WIFEXITED(status) && WEXITSTATUS(status) == 0);
	check_eq("and no other CPU's process", sigio_count, 0);
	return summary("lwp-threshold");
}
