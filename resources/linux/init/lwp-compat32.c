/*
 * /lwp-compat32: runs the 32-bit program /lwp-m32 under ptrace and prints
 * its checks. /lwp-m32 cannot print (a 32-bit system call raises #UD on
 * kvm_pvm); it ends at a UD2 with its results in EAX and EBX, which this
 * tracer reads at the SIGILL stop, with the code segment it stopped in.
 */
#include "lwp.h"

#define PTRACE_TRACEME 0
#define PTRACE_CONT 7
#define PTRACE_KILL 8
#define PTRACE_GETREGS 12
#ifndef SIGTRAP
#define SIGTRAP 5
#endif
#ifndef SIGILL
#define SIGILL 4
#endif
/* Linux's 32-bit user code segment. */
#define USER32_CS 0x23

/* struct user_regs_struct, x86-64. */
struct regs {
	unsigned long r15, r14, r13, r12, rbp, rbx, r11, r10, r9, r8, rax, rcx,
		rdx, rsi, rdi, orig_rax, rip, cs, flags, rsp, ss, fs_base,
		gs_base, ds, es, fs, gs;
};

/* /lwp-m32's checks, in its order. */
static const char *const names[] = {
	"a 32-bit process",
	"SLWPCB with LWP off",
	"LLWPCB, then SLWPCB returns the LWPCB",
	"LWPINS stored: CF=0",
	"LWPINS record: EventId, Data1, Data2, EventFlags",
	"LWPINS record: a 32-bit instruction address in the program",
	"LWPVAL record, and the head after two records",
	"LLWPCB with XOP.W set is the 32-bit form",
	"LLWPCB 0 turns LWP off",
};
#define CHECKS (sizeof(names) / sizeof(names[0]))

static int stopped_by(int status, int sig)
{
	return (status & 0xff) == 0x7f && ((status >> 8) & 0xff) == sig;
}

int main(int argc, char **argv, char **envp)
{
	char *args[] = { "/lwp-m32", 0 };
	struct regs r;
	int status = 0;
	unsigned int i;
	pid_t pid;

	check("CPUID 0x8000001c.EAX enables LWPVAL",
	      (lwp_enabled() & (LWP_AVAIL | LWP_VAL)) == (LWP_AVAIL | LWP_VAL));
	pid = fork();
	if (pid == 0) {
		my_syscall4(__NR_ptrace, PTRACE_TRACEME, 0, 0, 0);
		execve(args[0], args, envp);
		exit(127);
	}
	if (pid < 0 || waitpid(pid, &status, 0) != pid || !stopped_by(status, SIGTRAP)) {
		check("/lwp-m32 started under ptrace", 0);
		return summary("lwp-compat32");
	}
	my_syscall4(__NR_ptrace, PTRACE_CONT, pid, 0, 0);
	check("/lwp-m32 ran to its final UD2",
	      waitpid(pid, &status, 0) == pid && stopped_by(status, SIGILL) &&
		      my_syscall4(__NR_ptrace, PTRACE_GETREGS, pid, 0, &r) == 0);
	check_eq("in the 32-bit code segment", r.cs, USER32_CS);
	check_eq("every check ran", r.rbx, CHECKS);
	for (i = 0; i < CHECKS; i++)
		check(names[i], (r.rax >> i) & 1);
	my_syscall4(__NR_ptrace, PTRACE_KILL, pid, 0, 0);
	waitpid(pid, &status, 0);
	return summary("lwp-compat32");
}
