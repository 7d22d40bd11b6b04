// SPDX-License-Identifier: GPL-2.0
/*
 * lwpvmm.ko: LWP for the processes of an unmodified Linux kernel running on
 * the lwpvmm virtual machine monitor, which emulates AMD's Lightweight
 * Profiling unit (lwpvmm docs/pv-abi.md is the interface, docs/linux-guest.md
 * says why each hook below was chosen).
 *
 * - Discovery: CPUID 0x40000100 carries "LwpVmmLwpVmm"; without it the module
 *   refuses to load.
 * - LWP instructions: a CPL3 LWP instruction raises #UD, whose handler calls
 *   notify_die(DIE_TRAP).  The die notifier hands the saved registers
 *   (struct pt_regs) to lwpvmm's register call, which emulates the
 *   instruction in place.  A fault it raises is delivered as the kernel
 *   would: a page is faulted in before the task returns to user mode (and
 *   the instruction runs again), SIGSEGV when it cannot be.
 * - Per-task state: a task that ran an LWP instruction gets a preempt
 *   notifier (what KVM itself uses).  sched_out comes before the address
 *   space switch, so lwpvmm can flush the ring head into the task's LWPCB
 *   while it is mapped: the switch-out call saves the state (XSAVE
 *   component 62) and turns LWP off.  sched_in comes after it: the switch-in
 *   call restores the state and validates it in the task's own address
 *   space.  The state follows the task to whichever CPU runs it next.
 * - fork: a child has no notifier, so it starts with LWP off.  exec: a
 *   binary format registered first, whose load_binary() runs before any
 *   other format's and so before the old address space goes, turns LWP off,
 *   frees the state and declines the file.  exit: a task whose mm is no
 *   longer the one it enabled LWP in (after exit_mm()) only ever turns LWP
 *   off, and its last sched_out (TASK_DEAD) hands the state to an irq_work
 *   that frees it once the switch is over.  No tracepoint or kprobe: both
 *   would need CONFIG_TRACEPOINTS or CONFIG_KPROBES, and the first cost
 *   our emulated boot 25 s (docs/linux-guest.md).
 * - Precise events: lwpvmm single-steps a task whose LWPCB counts retired
 *   instructions or branches; each trap reaches the die notifier as
 *   DIE_DEBUG and goes to the #DB register call.  A trap lwpvmm did not
 *   cause, and every trap of a task its debugger single-steps, stays the
 *   kernel's.  The step origin moves with the task across switches.
 * - The threshold interrupt: one IOAPIC line per CPU (CPUID 0x40000102), with
 *   request_irq and its affinity pinned to that CPU; lwpvmm raises the line
 *   of the CPU whose unit crossed the threshold while that CPU runs the
 *   owning task (a sampled event, at CPL3 with interrupts on), and the
 *   handler sends it SIGIO.  A crossing by an instruction the register
 *   calls emulate comes back in the call's reply instead, and the task gets
 *   SIGIO there: its handler runs with interrupts off, so the line's
 *   interrupt could arrive after a switch.
 * - /proc/lwp_cpuid: CPUID leaf 0x8000001C as the kernel reads it (CPUID at
 *   CPL3 returns the host's leaves on nested hosts such as kvm_pvm).
 * - Power-off through lwpvmm's power port.
 *
 * Once loaded the module stays: every task that used LWP holds a notifier
 * into it, which only that task can unregister.
 */
#define pr_fmt(fmt) "lwpvmm: " fmt

#include <linux/acpi.h>
#include <linux/binfmts.h>
#include <linux/cpuhotplug.h>
#include <linux/dcache.h>
#include <linux/elf.h>
#include <linux/fs.h>
#include <linux/init.h>
#include <linux/interrupt.h>
#include <linux/irq.h>
#include <linux/irq_work.h>
#include <linux/kdebug.h>
#include <linux/llist.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/pagemap.h>
#include <linux/percpu.h>
#include <linux/pm.h>
#include <linux/preempt.h>
#include <linux/proc_fs.h>
#include <linux/sched.h>
#include <linux/sched/signal.h>
#include <linux/seq_file.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/task_work.h>
#include <linux/uaccess.h>
#include <asm/apic.h>
#include <asm/cpufeature.h>
#include <asm/debugreg.h>
#include <asm/msr.h>
#include <asm/processor.h>
#include <asm/ptrace.h>
#include <asm/smp.h>
#include <asm/trap_pf.h>
#include <asm/traps.h>

#ifndef CONFIG_PREEMPT_NOTIFIERS
#error "lwpvmm.ko needs CONFIG_PREEMPT_NOTIFIERS (any kernel with CONFIG_KVM has it)"
#endif

#define LWPVMM_LEAF_BASE	0x40000100
#define LWPVMM_LEAF_INFO	0x40000101
#define LWPVMM_LEAF_LINES	0x40000102
#define LWPVMM_VERSION		1
#define FEAT_UD			(1u << 0)
#define FEAT_STATE		(1u << 2)
#define FEAT_DB			(1u << 3)
#define FEAT_POWER		(1u << 4)
#define FEAT_REGS		(1u << 5)
#define FEAT_LINES		(1u << 6)
#define FEAT_MAPPINGS		(1u << 7)
#define STATE_PORT		0x5d
#define POWER_PORT		0x5e
#define POWER_OFF		0

/* State-call operations and statuses (docs/pv-abi.md). */
enum {
	OP_RESTORE = 2,
	OP_DECLARE_DB = 3,
	OP_UD_REGS = 4,
	OP_DB_REGS = 5,
	OP_THRESHOLD_LINE = 6,
	OP_SWITCH_OUT = 7,
	OP_SWITCH_IN = 8,
	OP_EXEC_MAPPING = 9,
};
enum {
	ST_OK = 0,
	ST_REFUSED = 3,
	ST_FAULT = 6,
};
/* Operation 6's RDI: the line, and the register calls' crossings answered
 * in their replies. */
#define LINE_ON			1
#define LINE_CROSSINGS_IN_REPLY	2

#define MSR_LWP_CFG		0xc0000105
#define LWP_LEAF		0x8000001c
/* LWP_CFG: the event enables (6:1), CONT (29) and PTSC (30) as offered. */
#define LWP_CFG_ENABLES		0x6000007eu
/* LWP_CFG.INT (31) and CoreId (39:32); on a line the vector is not used. */
#define LWP_CFG_INT		(1u << 31)
#define LWP_CFG_COREID_SHIFT	32
#define AREA_SIZE		128
/* A fault the same instruction keeps raising after it was faulted in. */
#define FAULT_RETRIES		3

/* What a state call answers. */
struct pv_reply {
	unsigned long status, dx, cx, r8;
};

static struct pv_reply pv_call(unsigned long op, const void *arg, unsigned long si)
{
	struct pv_reply r;
	register unsigned long r8 asm("r8");

	r.status = op;
	asm volatile("outb %%al, %[port]"
		     : "+a"(r.status), "=d"(r.dx), "=c"(r.cx), "=r"(r8)
		     : "D"(arg), "S"(si), [port] "i"(STATE_PORT)
		     : "memory");
	r.r8 = r8;
	return r;
}

/* A task's LWP state, from its first LWP instruction to exec or exit. */
struct lwp_task {
	struct preempt_notifier pn;
	/* The address space LWP was enabled in: LWP is off in any other. */
	struct mm_struct *mm;
	/* The step origin while lwpvmm was single-stepping the task. */
	unsigned long step_from;
	/* The last fault raised, to stop retrying one that faulting in
	 * cannot resolve. */
	unsigned long fault_ip, fault_addr;
	unsigned int fault_count;
	/* On the list of dead tasks' states to free. */
	struct llist_node dead;
	/* XSAVE component 62 while the task is switched out. */
	u8 area[AREA_SIZE] __aligned(64);
};

/* A fault to resolve before the task returns to user mode. */
struct lwp_fault {
	struct callback_head work;
	unsigned long addr;
	bool write, give_up;
};

static u32 features;
static u32 line_gsi, line_count;
static u64 lwp_cfg;
static void (*old_power_off)(void);
static const u8 lwp_off_area[AREA_SIZE] __aligned(64);
static DEFINE_PER_CPU(int, line_irq) = -1;

static struct preempt_ops lwp_preempt_ops;

/* The states of tasks that died: freed by an irq_work, which runs once the
 * scheduler that switched away from them has let go of their notifiers. */
static LLIST_HEAD(dead_states);

static void free_dead_states(struct irq_work *work)
{
	struct llist_node *list = llist_del_all(&dead_states);
	struct lwp_task *st, *next;

	llist_for_each_entry_safe(st, next, list, dead)
		kfree(st);
}

static DEFINE_IRQ_WORK(reaper, free_dead_states);

/* A task's LWP state, or NULL.  Only the task itself changes its notifier
 * list (this module with interrupts off; KVM, for its own, with preemption
 * off), so an interrupt on its CPU finds the list whole. */
static struct lwp_task *lwp_task_of(struct task_struct *t)
{
	struct preempt_notifier *pn;

	hlist_for_each_entry(pn, &t->preempt_notifiers, link)
		if (pn->ops == &lwp_preempt_ops)
			return container_of(pn, struct lwp_task, pn);
	return NULL;
}

static bool area_live(const u8 *area)
{
	u64 lwpcb;

	memcpy(&lwpcb, area, sizeof(lwpcb));
	return lwpcb != 0;
}

/* Turns the CPU's LWP off without saving (restoring the init state). */
static void lwp_off(void)
{
	pv_call(OP_RESTORE, lwp_off_area, 0);
}

/* Turns LWP off for a task whose address space is going away (exec, exit):
 * no flush into it, and lwpvmm stops stepping it. */
static void lwp_off_for_good(struct lwp_task *st)
{
	pv_call(OP_SWITCH_OUT, st->area, 1);
	memset(st->area, 0, sizeof(st->area));
	st->step_from = 0;
}

/* Creates the calling task's state; interrupts are off. */
static struct lwp_task *lwp_task_new(void)
{
	struct lwp_task *st = kzalloc(sizeof(*st), GFP_ATOMIC);

	if (!st)
		return NULL;
	preempt_notifier_init(&st->pn, &lwp_preempt_ops);
	st->mm = current->mm;
	preempt_notifier_register(&st->pn);
	return st;
}

/* Drops the calling task's state with LWP off (exec). */
static void lwp_task_drop(void)
{
	struct lwp_task *st;
	unsigned long flags;

	local_irq_save(flags);
	st = lwp_task_of(current);
	if (st) {
		lwp_off_for_good(st);
		preempt_notifier_unregister(&st->pn);
	}
	local_irq_restore(flags);
	kfree(st);
}

static void lwp_sched_out(struct preempt_notifier *pn, struct task_struct *next)
{
	struct lwp_task *st = container_of(pn, struct lwp_task, pn);
	struct pv_reply r;

	if (current->mm != st->mm) {
		/* After exit_mm(): the LWPCB's address space is gone or going;
		 * never flush into it. */
		lwp_off_for_good(st);
		/* The task's last switch: the scheduler is still walking its
		 * notifiers, so the state is freed after it. */
		if (READ_ONCE(current->__state) == TASK_DEAD) {
			llist_add(&st->dead, &dead_states);
			irq_work_queue(&reaper);
		}
		return;
	}
	r = pv_call(OP_SWITCH_OUT, st->area, 0);
	st->step_from = r.status == ST_OK ? r.dx : 0;
}

static void lwp_sched_in(struct preempt_notifier *pn, int cpu)
{
	struct lwp_task *st = container_of(pn, struct lwp_task, pn);
	struct pv_reply r;

	if (current->mm != st->mm || (!area_live(st->area) && !st->step_from))
		return;
	r = pv_call(OP_SWITCH_IN, st->area, st->step_from);
	if (r.status == ST_REFUSED) {
		memset(st->area, 0, sizeof(st->area));
		/* finish_task_switch() has released the runqueue lock. */
		pr_warn_ratelimited("LWP state of %s[%d] refused; LWP is off for it\n",
				    current->comm, task_pid_nr(current));
	}
	if (st->step_from && !(r.status == ST_OK && r.dx == 1) &&
	    !test_thread_flag(TIF_SINGLESTEP)) {
		/* Stepping did not resume: the trap flag lwpvmm left in the
		 * task's user frame must not reach it as a SIGTRAP. */
		task_pt_regs(current)->flags &= ~X86_EFLAGS_TF;
	}
	st->step_from = 0;
}

static struct preempt_ops lwp_preempt_ops = {
	.sched_in = lwp_sched_in,
	.sched_out = lwp_sched_out,
};

static void lwp_fault_in(struct callback_head *work)
{
	struct lwp_fault *f = container_of(work, struct lwp_fault, work);
	void __user *addr = (void __user *)f->addr;
	size_t left;

	if (!(current->flags & PF_EXITING)) {
		left = f->write ? fault_in_safe_writeable(addr, 1) :
				  fault_in_readable(addr, 1);
		if (left || f->give_up)
			force_sig(SIGSEGV);
	}
	kfree(f);
}

/* Delivers a fault of the LWP instruction at regs->ip as the kernel would
 * have, had the instruction raised it. */
static void lwp_fault(struct lwp_task *st, struct pt_regs *regs,
		      const struct pv_reply *r)
{
	struct lwp_fault *f;

	/* Without a state the retries cannot be bounded: no second try. */
	if (!st || r->dx != X86_TRAP_PF) {
		force_sig(SIGSEGV);
		return;
	}
	if (st->fault_ip == regs->ip && st->fault_addr == r->cx) {
		st->fault_count++;
	} else {
		st->fault_ip = regs->ip;
		st->fault_addr = r->cx;
		st->fault_count = 1;
	}
	f = kzalloc(sizeof(*f), GFP_ATOMIC);
	if (!f) {
		force_sig(SIGSEGV);
		return;
	}
	f->addr = r->cx;
	f->write = r->r8 & X86_PF_WRITE;
	f->give_up = st->fault_count > FAULT_RETRIES;
	init_task_work(&f->work, lwp_fault_in);
	if (task_work_add(current, &f->work, TWA_RESUME)) {
		kfree(f);
		force_sig(SIGSEGV);
	}
}

/* State call 9's structure (docs/pv-abi.md, "Executable mappings"). */
#define MAPPING_PATH_MAX	256
#define BUILD_ID_MAX		20
#define MAPPING_FIRST		1
/* The mapping carries the process it belongs to (pid and comm follow). */
#define MAPPING_PROCESS		2
/* The executable mappings one report names at most, and the bytes of ELF
 * program headers and notes read to find a build ID. */
#define MAPPINGS_MAX		64
#define ELF_READ_MAX		4096
#define NT_GNU_BUILD_ID_TYPE	3

struct exec_mapping {
	u64 start, end, offset;
	u32 build_id_len, flags;
	u8 build_id[BUILD_ID_MAX];
	u32 pid;
	char path[MAPPING_PATH_MAX];
	char comm[TASK_COMM_LEN];
};
static_assert(sizeof(struct exec_mapping) == 328);

struct mapping_report {
	struct callback_head work;
	struct exec_mapping m;
	u8 buf[ELF_READ_MAX];
};

/* The GNU build ID in the notes at buf[0..len), aligned to `align`. */
static void note_build_id(const u8 *buf, size_t len, size_t align,
			  struct exec_mapping *m)
{
	size_t at = 0;

	while (at + 12 <= len) {
		const u32 *h = (const u32 *)(buf + at);
		size_t name = ALIGN((size_t)h[0], align);
		size_t desc = ALIGN((size_t)h[1], align);

		if (name > len || desc > len || at + 12 + name + desc > len)
			return;
		if (h[2] == NT_GNU_BUILD_ID_TYPE && h[0] == 4 &&
		    memcmp(buf + at + 12, "GNU", 4) == 0 && h[1] <= BUILD_ID_MAX) {
			memcpy(m->build_id, buf + at + 12 + name, h[1]);
			m->build_id_len = h[1];
			return;
		}
		at += 12 + name + desc;
	}
}

/* Reads `len` bytes of `file` at `pos` into buf; whether it read them. */
static bool read_at(struct file *file, u8 *buf, size_t len, loff_t pos)
{
	return len <= ELF_READ_MAX && kernel_read(file, buf, len, &pos) == (ssize_t)len;
}

/* The ELF build ID of `file` (32- or 64-bit), from its PT_NOTE segments;
 * none when the file is not ELF or the notes do not fit. */
static void file_build_id(struct file *file, struct mapping_report *r)
{
	struct exec_mapping *m = &r->m;
	bool is64;
	u64 phoff;
	unsigned int phnum, phentsize, i;

	if (!read_at(file, r->buf, sizeof(Elf64_Ehdr), 0) ||
	    memcmp(r->buf, ELFMAG, SELFMAG) != 0)
		return;
	is64 = r->buf[EI_CLASS] == ELFCLASS64;
	if (is64) {
		const Elf64_Ehdr *e = (const Elf64_Ehdr *)r->buf;

		phoff = e->e_phoff;
		phnum = e->e_phnum;
		phentsize = e->e_phentsize;
		if (phentsize != sizeof(Elf64_Phdr))
			return;
	} else {
		const Elf32_Ehdr *e = (const Elf32_Ehdr *)r->buf;

		phoff = e->e_phoff;
		phnum = e->e_phnum;
		phentsize = e->e_phentsize;
		if (r->buf[EI_CLASS] != ELFCLASS32 || phentsize != sizeof(Elf32_Phdr))
			return;
	}
	for (i = 0; i < phnum && i < ELF_READ_MAX / sizeof(Elf64_Phdr); i++) {
		u64 type, offset, size, align;

		if (!read_at(file, r->buf, phentsize, phoff + (u64)i * phentsize))
			return;
		if (is64) {
			const Elf64_Phdr *p = (const Elf64_Phdr *)r->buf;

			type = p->p_type, offset = p->p_offset;
			size = p->p_filesz, align = p->p_align;
		} else {
			const Elf32_Phdr *p = (const Elf32_Phdr *)r->buf;

			type = p->p_type, offset = p->p_offset;
			size = p->p_filesz, align = p->p_align;
		}
		if (type != PT_NOTE || size > ELF_READ_MAX ||
		    !read_at(file, r->buf, size, offset))
			continue;
		note_build_id(r->buf, size, align == 8 ? 8 : 4, m);
		if (m->build_id_len)
			return;
	}
}

/* Tells lwpvmm which files the task's address space runs (state call 9),
 * after each exec and before its first LWP record: each executable file
 * mapping with its path and build ID and the process (tgid and name) it
 * belongs to, the first flagged so that lwpvmm forgets what an earlier
 * address space with the same CR3 ran. */
static void lwp_report_mappings(struct callback_head *work)
{
	struct mapping_report *r = container_of(work, struct mapping_report, work);
	struct mm_struct *mm = current->mm;
	struct {
		unsigned long start, end, offset;
		struct file *file;
	} *spans;
	struct vm_area_struct *vma;
	unsigned int n = 0, i, sent = 0;

	spans = kcalloc(MAPPINGS_MAX, sizeof(*spans), GFP_KERNEL);
	if (!spans || !mm || (current->flags & PF_EXITING))
		goto out;
	mmap_read_lock(mm);
	{
		VMA_ITERATOR(vmi, mm, 0);

		for_each_vma(vmi, vma) {
			if (!(vma->vm_flags & VM_EXEC) || !vma->vm_file)
				continue;
			if (n == MAPPINGS_MAX)
				break;
			spans[n].start = vma->vm_start;
			spans[n].end = vma->vm_end;
			spans[n].offset = vma->vm_pgoff << PAGE_SHIFT;
			spans[n].file = get_file(vma->vm_file);
			n++;
		}
	}
	mmap_read_unlock(mm);
	for (i = 0; i < n; i++) {
		struct exec_mapping *m = &r->m;
		char *path;

		memset(m, 0, sizeof(*m));
		path = d_path(&spans[i].file->f_path, m->path, sizeof(m->path));
		if (!IS_ERR(path)) {
			memmove(m->path, path, strlen(path) + 1);
			m->start = spans[i].start;
			m->end = spans[i].end;
			m->offset = spans[i].offset;
			m->flags = (sent == 0 ? MAPPING_FIRST : 0) | MAPPING_PROCESS;
			m->pid = task_tgid_nr(current);
			get_task_comm(m->comm, current);
			file_build_id(spans[i].file, r);
			if (pv_call(OP_EXEC_MAPPING, m, 0).status == ST_OK)
				sent++;
		}
		fput(spans[i].file);
	}
out:
	kfree(spans);
	kfree(r);
}

/* Queues the report of a task's mappings for its return to user mode: the
 * #UD handler that found its first LWP instruction cannot sleep, and an
 * exec has mapped its new program only when it returns. */
static void report_mappings_later(void)
{
	struct mapping_report *r;

	if (!(features & FEAT_MAPPINGS))
		return;
	r = kmalloc(sizeof(*r), GFP_ATOMIC);
	if (!r)
		return;
	init_task_work(&r->work, lwp_report_mappings);
	if (task_work_add(current, &r->work, TWA_RESUME))
		kfree(r);
}

/* A register call's instruction crossed the threshold (RDX = 1, asked for
 * with operation 6's RDI bit 1): the task is current here, so it gets its
 * SIGIO now.  The line's interrupt would stay pending while this handler
 * runs with interrupts off and could arrive after a switch to another task
 * that uses LWP. */
static void crossed(const struct pv_reply *r)
{
	if (r->dx == 1)
		send_sig(SIGIO, current, 1);
}

static int lwp_ud(struct pt_regs *regs)
{
	struct lwp_task *st = lwp_task_of(current);
	struct pv_reply r = pv_call(OP_UD_REGS, regs, 0);

	if (r.status != ST_OK && r.status != ST_FAULT)
		return NOTIFY_DONE;
	if (!st) {
		st = lwp_task_new();
		if (st)
			report_mappings_later();
	}
	if (r.status == ST_FAULT) {
		lwp_fault(st, regs, &r);
	} else if (!st) {
		/* No memory for the state: LWP cannot follow this task. */
		lwp_off();
		pr_warn_ratelimited("no memory for the LWP state of %s[%d]; LWP is off for it\n",
				    current->comm, task_pid_nr(current));
	} else {
		st->fault_count = 0;
		crossed(&r);
	}
	return NOTIFY_STOP;
}

static int lwp_db(struct pt_regs *regs)
{
	struct pv_reply r = pv_call(OP_DB_REGS, regs, 0);

	if (r.status != ST_OK)
		return NOTIFY_DONE;
	crossed(&r);
	if (test_thread_flag(TIF_SINGLESTEP)) {
		/* The task's debugger steps it too: the trap is also its. */
		regs->flags |= X86_EFLAGS_TF;
		return NOTIFY_DONE;
	}
	return NOTIFY_STOP;
}

static int lwp_die(struct notifier_block *nb, unsigned long val, void *data)
{
	struct die_args *args = data;

	if (!user_mode(args->regs) || !current->mm)
		return NOTIFY_DONE;
	if (val == DIE_TRAP && args->trapnr == X86_TRAP_UD)
		return lwp_ud(args->regs);
	if (val == DIE_DEBUG && (features & FEAT_DB))
		return lwp_db(args->regs);
	return NOTIFY_DONE;
}

static struct notifier_block lwp_die_nb = {
	.notifier_call = lwp_die,
};

/* Whether LWP is offered to processes (the die notifier and the preempt
 * notifiers are in place). */
static bool lwp_offered;

/* Tried before every other binary format on each exec, while the old
 * program's address space is still current: LWP off, the state gone, and
 * the new program's mappings reported when it first returns to user mode,
 * so that a whole-guest profile names every process, whether it uses LWP
 * or not. A script's exec comes back here for its interpreter, which
 * reports instead. An exec that then fails leaves the old program with LWP
 * off, and reports its mappings again. */
static int lwp_exec(struct linux_binprm *bprm)
{
	if (lwp_offered)
		lwp_task_drop();
	if (bprm->buf[0] != '#' || bprm->buf[1] != '!')
		report_mappings_later();
	return -ENOEXEC;
}

static struct linux_binfmt lwp_binfmt = {
	.module = THIS_MODULE,
	.load_binary = lwp_exec,
};

static irqreturn_t lwp_threshold(int irq, void *dev)
{
	/* lwpvmm raises the line only for an event it charged to the task
	 * running at CPL3 on this CPU, with interrupts on: the interrupt
	 * arrives before that task runs another instruction.  Crossings of
	 * the register calls come in their replies (crossed()). */
	if (current->mm && lwp_task_of(current))
		send_sig(SIGIO, current, 1);
	return IRQ_HANDLED;
}

/* This CPU's threshold line, when lwpvmm gives it one: an edge-triggered
 * IOAPIC input whose interrupt only this CPU takes. */
static bool line_up(unsigned int cpu)
{
#ifdef CONFIG_ACPI
	u32 apic = cpu_physical_id(cpu);
	int irq;

	if (!(features & FEAT_LINES) || apic >= line_count)
		return false;
	irq = acpi_register_gsi(NULL, line_gsi + apic, ACPI_EDGE_SENSITIVE,
				ACPI_ACTIVE_HIGH);
	if (irq < 0)
		return false;
	/* Before the interrupt is started: an affinity set afterwards only
	 * moves it at its next arrival, on whichever CPU it had. */
	if (irq_set_affinity(irq, cpumask_of(cpu)) ||
	    request_irq(irq, lwp_threshold, IRQF_NOBALANCING, "lwpvmm-threshold",
			NULL))
		return false;
	if (pv_call(OP_THRESHOLD_LINE, (void *)(LINE_ON | LINE_CROSSINGS_IN_REPLY), 0).status != ST_OK) {
		free_irq(irq, NULL);
		return false;
	}
	per_cpu(line_irq, cpu) = irq;
	return true;
#else
	return false;
#endif
}

static int lwp_cpu_online(unsigned int cpu)
{
	u64 cfg = lwp_cfg;

	if ((cpuid_edx(LWP_LEAF) & LWP_CFG_INT) && line_up(cpu))
		cfg |= LWP_CFG_INT;
	if (features & FEAT_DB)
		pv_call(OP_DECLARE_DB, NULL, 0);
	wrmsrl(MSR_LWP_CFG, cfg | ((u64)(cpu & 0xff) << LWP_CFG_COREID_SHIFT));
	return 0;
}

static int lwp_cpu_offline(unsigned int cpu)
{
	int irq = per_cpu(line_irq, cpu);

	wrmsrl(MSR_LWP_CFG, 0);
	if (irq >= 0) {
		pv_call(OP_THRESHOLD_LINE, NULL, 0);
		free_irq(irq, NULL);
		per_cpu(line_irq, cpu) = -1;
	}
	return 0;
}

static int lwp_cpuid_show(struct seq_file *m, void *v)
{
	u32 eax, ebx, ecx, edx;

	cpuid(LWP_LEAF, &eax, &ebx, &ecx, &edx);
	seq_printf(m, "eax=%08x ebx=%08x ecx=%08x edx=%08x\n", eax, ebx, ecx,
		   edx);
	return 0;
}

static void lwpvmm_power_off(void)
{
	outb(POWER_OFF, POWER_PORT);
}

static bool lwpvmm_present(void)
{
	u32 eax, sig[3], version, ecx, edx;

	cpuid(LWPVMM_LEAF_BASE, &eax, &sig[0], &sig[1], &sig[2]);
	if (memcmp(sig, "LwpVmmLwpVmm", 12) || eax < LWPVMM_LEAF_INFO)
		return false;
	cpuid(LWPVMM_LEAF_INFO, &version, &features, &ecx, &edx);
	if (eax >= LWPVMM_LEAF_LINES)
		cpuid(LWPVMM_LEAF_LINES, &line_gsi, &line_count, &ecx, &edx);
	return version >= LWPVMM_VERSION;
}

static int __init lwpvmm_init(void)
{
	const u32 need = FEAT_UD | FEAT_STATE | FEAT_REGS;
	int ret;

	if (!lwpvmm_present()) {
		pr_info("not running on lwpvmm\n");
		return -ENODEV;
	}
	pr_info("paravirtual interface found, features %#x\n", features);
	if (boot_cpu_has(X86_FEATURE_LWP) &&
	    !proc_create_single("lwp_cpuid", 0444, NULL, lwp_cpuid_show))
		pr_warn("cannot create /proc/lwp_cpuid\n");
	if (features & FEAT_POWER) {
		old_power_off = pm_power_off;
		pm_power_off = lwpvmm_power_off;
	}
	if ((features & need) != need || !boot_cpu_has(X86_FEATURE_LWP)) {
		pr_info("LWP is not offered to processes (features %#x)\n", features);
		/* Every exec's mappings still name the processes of a profile. */
		if (features & FEAT_MAPPINGS)
			insert_binfmt(&lwp_binfmt);
		return 0;
	}
	lwp_cfg = cpuid_edx(LWP_LEAF) & LWP_CFG_ENABLES;
	preempt_notifier_inc();
	lwp_offered = true;
	insert_binfmt(&lwp_binfmt);
	ret = register_die_notifier(&lwp_die_nb);
	if (ret)
		goto undo_binfmt;
	ret = cpuhp_setup_state(CPUHP_AP_ONLINE_DYN, "lwpvmm:online",
				lwp_cpu_online, lwp_cpu_offline);
	if (ret < 0)
		goto undo_die;
	pr_info("LWP for user tasks on %u CPUs, LWP_CFG %#llx, %u threshold lines%s\n",
		num_online_cpus(), lwp_cfg, min_t(u32, line_count, num_online_cpus()),
		features & FEAT_DB ? ", precise events" : "");
	return 0;

undo_die:
	unregister_die_notifier(&lwp_die_nb);
undo_binfmt:
	unregister_binfmt(&lwp_binfmt);
	lwp_offered = false;
	preempt_notifier_dec();
	if (features & FEAT_POWER)
		pm_power_off = old_power_off;
	remove_proc_entry("lwp_cpuid", NULL);
	return ret;
}
module_init(lwpvmm_init);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("LWP for processes on the lwpvmm virtual machine monitor");
MODULE_AUTHOR("lwpvmm");
