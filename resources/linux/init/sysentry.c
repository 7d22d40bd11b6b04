/*
 * /sysentry: kvm_pvm's faulting SYSCALL (a user-mode fetch fault at
 * entry_SYSCALL_64) is turned back into a system call, by lwpvmm at the
 * kernel's #PF entry (--syscall-fixup, any kernel) or by our kernel's
 * host-quirk patch 0001 (--syscall-fixup off). A process can take that
 * path on purpose by jumping to entry_SYSCALL_64 itself (its address is
 * LSTAR), with registers of its choosing. Either must then only run a
 * system call when RCX follows a SYSCALL instruction, and return with the
 * flags a user may set: never IOPL, VIF or VIP from R11. Each attack runs in a child that has
 * dropped root (it is given LSTAR, read here through /dev/cpu/0/msr).
 */
#include "lwp.h"

#define MSR_LSTAR 0xc0000082u
#define NOBODY 65534
#define RFLAGS_CF (1ull << 0)
#define RFLAGS_IF (1ull << 9)
#define RFLAGS_IOPL (3ull << 12)
#define RFLAGS_VIF (1ull << 19)
#define RFLAGS_VIP (1ull << 20)

static unsigned long long lstar(void)
{
	unsigned long long v = 0;
	int fd = open("/dev/cpu/0/msr", O_RDONLY);

	if (fd < 0 || lseek(fd, MSR_LSTAR, SEEK_SET) != MSR_LSTAR ||
	    read(fd, &v, 8) != 8)
		v = 0;
	if (fd >= 0)
		close(fd);
	return v;
}

static void drop_root(void)
{
	if (my_syscall1(__NR_setgid, NOBODY) || my_syscall1(__NR_setuid, NOBODY))
		exit(100);
}

/* Jumps to `entry` as if a SYSCALL of getpid had just left CPL3 with R11 =
 * `r11` and RCX after a SYSCALL instruction; exits with 0 when the flags it
 * gets back hold none of IOPL, VIF and VIP and CF (user-settable) survived,
 * and getpid's result came back. */
static int jump_after_syscall(unsigned long long entry, unsigned long long r11)
{
	unsigned long long flags, rax = __NR_getpid;

	__asm__ volatile("lea 2f(%%rip), %%rcx\n"
			 "mov %[r11], %%r11\n"
			 "jmp *%[entry]\n"
			 "syscall\n" /* not run: RCX points after it */
			 "2: pushfq\n"
			 "pop %[flags]\n"
			 : [flags] "=r"(flags), "+a"(rax)
			 : [entry] "r"(entry), [r11] "r"(r11)
			 : "rcx", "r11", "memory", "cc");
	if (flags & (RFLAGS_IOPL | RFLAGS_VIF | RFLAGS_VIP))
		return 1;
	if (!(flags & RFLAGS_CF) || !(flags & RFLAGS_IF))
		return 2;
	return rax == (unsigned long long)getpid() ? 0 : 3;
}

/* Jumps to `entry` with RCX pointing after two NOPs: no SYSCALL was made,
 * so the fault must stay a fault (SIGSEGV). */
static void jump_without_syscall(unsigned long long entry)
{
	__asm__ volatile("lea 3f(%%rip), %%rcx\n"
			 "jmp *%[entry]\n"
			 "nop\n"
			 "nop\n"
			 "3:"
			 :
			 : [entry] "r"(entry), "a"(__NR_getpid)
			 : "rcx", "r11", "memory", "cc");
	exit(0);
}

/* Runs `attack` in a child without root; its wait status. */
static int in_child(int which, unsigned long long entry)
{
	int status = -1;
	pid_t pid = fork();

	if (pid == 0) {
		drop_root();
		if (which == 0)
			exit(jump_after_syscall(entry, RFLAGS_IOPL | RFLAGS_VIF |
							       RFLAGS_VIP | RFLAGS_CF |
							       0x2));
		jump_without_syscall(entry);
	}
	if (pid < 0 || waitpid(pid, &status, 0) != pid)
		return -1;
	return status;
}

int main(void)
{
	unsigned long long entry = lstar();
	int status;

	check("LSTAR (entry_SYSCALL_64) read", entry != 0);
	if (!entry)
		return summary("/sysentry");
	status = in_child(0, entry);
	check("a jump to entry_SYSCALL_64 after a SYSCALL runs it, with R11's IOPL, VIF and VIP dropped",
	      status == 0);
	if (status)
		printf("    wait status %x\n", status);
	status = in_child(1, entry);
	check("a jump to entry_SYSCALL_64 after no SYSCALL is a SIGSEGV",
	      WIFSIGNALED_(status) && WTERMSIG_(status) == SIGSEGV);
	if (!WIFSIGNALED_(status))
		printf("    wait status %x\n", status);
	return summary("/sysentry");
}
