// SPDX-License-Identifier: GPL-2.0
/*
 * waits.bpf.c — where one launch waited for pages, and who read them.
 *
 * What it records. Loaded only for `warmstart run --breakdown`, beside the
 * replay and the recorder:
 *   - every page-cache insertion (filemap:mm_filemap_add_to_page_cache),
 *     with who inserted it: a task of the launch (the `tracked` tgids,
 *     seeded with the held child and grown on fork) or a thread of the
 *     replay (`replay_tgid`, warmstart's own process). An insertion is the
 *     moment a read was issued for that page: the replay's fadvise and the
 *     launch's own readahead both insert before submitting the I/O.
 *   - the launch's page uses: mm_filemap_get_pages (read(); fires at the
 *     end of filemap_get_pages, after any wait for the page), map_pages
 *     (fault-around, uptodate pages only) and mm_filemap_fault (fires at
 *     the start of filemap_fault, before any wait).
 *   - how long each launch thread was off-CPU in uninterruptible sleep
 *     (tp_btf/sched_switch, prev_state & TASK_UNINTERRUPTIBLE, from the
 *     switch-out to the switch-in that runs it again), and how long it
 *     was off-CPU though runnable (preempted: the CPU went to someone
 *     else, such as the replay's threads).
 *   - exec, fork and exit of the launch's processes.
 *
 * Why D-state sleeps measure the wait. A launch thread that needs a page
 * not yet uptodate sleeps in folio_wait_bit (TASK_UNINTERRUPTIBLE or
 * TASK_KILLABLE, both with the D bit), whether it reached the page by
 * read() or by a fault, and whoever issued the read. Timing syscalls
 * (sys_enter/sys_exit) would miss faults, which are where a launch waits
 * for its shared libraries and binaries; timing the I/O would count reads
 * the launch never waited for. The interval ends at the switch-in, so time
 * spent runnable after the wake-up (CPU taken by the replay) is counted:
 * the launch waited for it too. User space attributes each sleep to the
 * page the thread was after (see crates/record/src/breakdown.rs); the
 * sleep's kernel stack (bpf_get_stackid) tells whether it was for a page
 * at all (folio_wait_bit_common, __wait_on_buffer) or for a lock.
 *
 * What it cannot see. The page a sleep is for is inferred from the
 * thread's page events around it, not read from the wait itself. Insertions by third parties (other programs,
 * kernel threads) are not recorded: their pages count as already cached.
 * Needs tp_btf only; nothing of record.bpf.c is shared, so the recorder's
 * behaviour and cost are unchanged when this is not loaded.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "waits.h"
#include "compat.bpf.h"

char LICENSE[] SEC("license") = "GPL";

/* Unused instances so the record types reach BTF and the skeleton. */
struct wt_ev _wt_ev = {};
enum wt_kind _wt_kind = 0;

/* Set before load: the process whose threads are the replay's. */
const volatile u32 replay_tgid = 0;

/* TASK_UNINTERRUPTIBLE in include/linux/sched.h (also in TASK_KILLABLE). */
#define WT_TASK_UNINTERRUPTIBLE 0x2

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 << 20);
} events SEC(".maps");

/* tgids of the launch's process tree. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, u32);
	__type(value, u8);
} tracked SEC(".maps");

/* Launch threads off-CPU: thread id -> when it left the CPU, and how. */
struct off_cpu {
	u64 since;
	u32 kind; /* WT_SLEEP or WT_RUNNABLE */
	u32 by_replay; /* WT_RUNNABLE: the CPU went to a replay thread */
	s64 stack; /* WT_SLEEP: id in `stacks`, negative if not taken */
};
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, u32);
	__type(value, struct off_cpu);
} asleep SEC(".maps");

/* Kernel stacks of D sleeps: user space tells a wait for a page
 * (folio_wait_bit_common, __wait_on_buffer, ...) from one for a lock. */
#define WT_STACK_DEPTH 32
struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, 16384);
	__uint(key_size, sizeof(u32));
	__uint(value_size, WT_STACK_DEPTH * sizeof(u64));
} stacks SEC(".maps");

/* Records lost because the ring buffer was full. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u64);
} drops SEC(".maps");

/* A read() loop repeats the same use: each CPU drops an exact repeat of
 * its previous record (the recorder keeps four; one is enough here, the
 * classification keeps only first uses). */
struct last_use {
	u64 ino;
	u64 index;
	u64 count;
	u32 dev;
	u32 pid;
	u32 kind;
	u32 _pad;
};
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct last_use);
} last_use SEC(".maps");

static __always_inline bool tracked_tgid(u32 tgid)
{
	return bpf_map_lookup_elem(&tracked, &tgid) != NULL;
}

static __always_inline void emit(u32 kind, u32 pid, u32 tgid, u64 ts, u32 dev, u64 ino,
				 u64 index, u64 count, u64 wake)
{
	struct wt_ev *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		u32 zero = 0;
		u64 *n = bpf_map_lookup_elem(&drops, &zero);
		if (n)
			*n += 1;
		return;
	}
	e->kind = kind;
	e->pid = pid;
	e->tgid = tgid;
	e->dev = dev;
	e->ts_ns = ts;
	e->ino = ino;
	e->index = index;
	e->count = count;
	bpf_ringbuf_submit(e, wake);
}


SEC("tp_btf/mm_filemap_add_to_page_cache")
int BPF_PROG(wt_add, void *folio)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tgid = id >> 32;
	struct address_space *mapping = NULL;
	u64 ino, index = 0, count;
	u32 kind, dev;

	if (tgid == replay_tgid)
		kind = WT_ADD_REPLAY;
	else if (tracked_tgid(tgid))
		kind = WT_ADD_LAUNCH;
	else
		return 0;
	count = cached_pages(folio, &mapping, &index);
	dev = mapping_dev(mapping, &ino);
	emit(kind, (u32)id, tgid, bpf_ktime_get_ns(), dev, ino, index, count, BPF_RB_NO_WAKEUP);
	return 0;
}

static __always_inline void use(u32 kind, struct address_space *mapping, u64 index, u64 last)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tgid = id >> 32;
	u64 ino, count = last >= index ? last - index + 1 : 1;
	u32 dev, zero = 0;

	if (!tracked_tgid(tgid))
		return;
	dev = mapping_dev(mapping, &ino);
	struct last_use *l = bpf_map_lookup_elem(&last_use, &zero);
	if (l) {
		if (l->ino == ino && l->index == index && l->count == count && l->dev == dev &&
		    l->pid == (u32)id && l->kind == kind)
			return;
		l->ino = ino;
		l->index = index;
		l->count = count;
		l->dev = dev;
		l->pid = (u32)id;
		l->kind = kind;
	}
	emit(kind, (u32)id, tgid, bpf_ktime_get_ns(), dev, ino, index, count, BPF_RB_NO_WAKEUP);
}

SEC("tp_btf/mm_filemap_get_pages")
int BPF_PROG(wt_get, struct address_space *mapping, unsigned long index, unsigned long last)
{
	use(WT_GET, mapping, index, last);
	return 0;
}

SEC("tp_btf/mm_filemap_map_pages")
int BPF_PROG(wt_map, struct address_space *mapping, unsigned long index, unsigned long last)
{
	use(WT_MAP, mapping, index, last);
	return 0;
}

SEC("tp_btf/mm_filemap_fault")
int BPF_PROG(wt_fault, struct address_space *mapping, unsigned long index)
{
	use(WT_FAULT, mapping, index, index);
	return 0;
}

static __always_inline int on_switch(void *ctx, bool preempt, struct task_struct *prev,
				     struct task_struct *next, long prev_state)
{
	u32 next_pid = next->pid;
	struct off_cpu *off = bpf_map_lookup_elem(&asleep, &next_pid);
	u64 now = 0;

	if (off) {
		now = bpf_ktime_get_ns();
		/* WT_SLEEP: index is the stack id (+1, 0: none) */
		u64 index = off->kind == WT_SLEEP ? (off->stack >= 0 ? off->stack + 1 : 0)
						  : off->by_replay;
		emit(off->kind, next_pid, next->tgid, off->since, 0, 0, index, now,
		     BPF_RB_NO_WAKEUP);
		bpf_map_delete_elem(&asleep, &next_pid);
	}
	/* Preempted (or yielding) threads stay runnable whatever their state
	 * says; others left the CPU to sleep, and only D sleeps are waits. */
	u32 kind = 0;
	if (preempt || prev_state == 0)
		kind = WT_RUNNABLE;
	else if (prev_state & WT_TASK_UNINTERRUPTIBLE)
		kind = WT_SLEEP;
	if (kind && tracked_tgid(prev->tgid)) {
		u32 prev_pid = prev->pid;
		struct off_cpu v = { .since = now ? now : bpf_ktime_get_ns(),
				     .kind = kind,
				     .by_replay = next->tgid == replay_tgid,
				     .stack = -1 };
		/* the stack of `current`, which is still prev here */
		if (kind == WT_SLEEP)
			v.stack = bpf_get_stackid(ctx, &stacks, 0);
		bpf_map_update_elem(&asleep, &prev_pid, &v, BPF_ANY);
	}
	return 0;
}

/* 5.18 and later pass the state prev leaves in (fa2c3254d7cf). */
SEC("tp_btf/sched_switch")
int BPF_PROG(wt_switch, bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	return on_switch(ctx, preempt, prev, next, prev_state);
}

SEC("tp_btf/sched_switch")
int BPF_PROG(wt_switch_old, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	return on_switch(ctx, preempt, prev, next, task_state(prev));
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(wt_fork, struct task_struct *parent, struct task_struct *child)
{
	u32 ptgid = parent->tgid;
	u32 ctgid = child->tgid;
	u8 one = 1;

	if (ctgid == ptgid || !tracked_tgid(ptgid))
		return 0;
	bpf_map_update_elem(&tracked, &ctgid, &one, BPF_ANY);
	emit(WT_FORK, parent->pid, ptgid, bpf_ktime_get_ns(), 0, 0, ctgid, 0, BPF_RB_NO_WAKEUP);
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(wt_exec, struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tgid = id >> 32;

	if (!tracked_tgid(tgid))
		return 0;
	struct inode *inode = BPF_CORE_READ(bprm, file, f_inode);
	emit(WT_EXEC, (u32)id, tgid, bpf_ktime_get_ns(), BPF_CORE_READ(inode, i_sb, s_dev),
	     BPF_CORE_READ(inode, i_ino), 0, 0, BPF_RB_NO_WAKEUP);
	return 0;
}

static __always_inline int wt_on_exit(struct task_struct *p, bool group_dead)
{
	u32 pid = BPF_CORE_READ(p, pid);
	u32 tgid = BPF_CORE_READ(p, tgid);

	/* a thread that ends asleep is never switched in again */
	bpf_map_delete_elem(&asleep, &pid);
	if (!group_dead || bpf_map_delete_elem(&tracked, &tgid))
		return 0;
	emit(WT_EXIT, pid, tgid, bpf_ktime_get_ns(), 0, 0, 0, 0, BPF_RB_NO_WAKEUP);
	return 0;
}

/* 6.16 and later; before, the variant below (see compat.bpf.h). */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(wt_exit, struct task_struct *p, bool group_dead)
{
	return wt_on_exit(p, group_dead);
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(wt_exit_task, struct task_struct *p)
{
	return wt_on_exit(p, group_dead_of(p));
}
