// SPDX-License-Identifier: GPL-2.0
/*
 * record.bpf.c — what a launch reads, page by page, in order.
 *
 * What it records. For every process in the traced tree (the tgids in the
 * `tracked` map, seeded by user space with the launched child before it is
 * allowed to exec, and grown on fork):
 *   - pages inserted into the page cache (filemap:mm_filemap_add_to_page_cache):
 *     these came from storage, so they are what a cold launch waits for. The
 *     event carries the folio order, so a large folio is 2^order pages.
 *     Filesystem metadata (ext4 inode tables, directory and extent blocks)
 *     arrives here too, as insertions into the block device's own mapping.
 *   - pages *used* whether or not they were cached (mm_filemap_get_pages for
 *     read(), mm_filemap_map_pages for fault-around, mm_filemap_fault for
 *     mmap faults). With these a launch can be learned while its files are
 *     cached, and pages shared with running programs (the C library) are not
 *     lost — the blind spot Paralfetch found in FAST's blktrace approach.
 *   - fork / exec / exit of the tree, so user space knows when it ends.
 *   - successful opens with the path resolved here, at open time, by walking
 *     dentries across mounts (the same walk d_path does), plus the identity
 *     (dev, ino, mode, size) of what was opened.
 *   - path lookups that cost I/O on a cold start even when they fail:
 *     stat/lstat/statx/access/readlink and failed opens, with the path as given.
 *   - directory reads (getdents64), resolved like opens.
 *
 * Why these hooks. They are stable tracepoints: no kernel patch. All are
 * BTF tracepoints (tp_btf/): they need no tracefs, pass the kernel's own
 * objects (folio, mapping, task), and detach without the RCU grace period
 * each classic tracepoint waits for on close (~70 ms apiece: seconds per
 * recording with one per syscall). Path syscalls come through the
 * raw_syscalls pair, filtered by number.
 *
 * Kernels before today's. Where a hook's arguments or a helper changed,
 * the program comes in variants, and user space (crates/bpf/src/kernel.rs)
 * loads the one the running kernel's BTF fits: sched_process_exit without
 * group_dead (before 6.16), path walks and argv copies without bpf_loop
 * (before 5.17), and page uses from fentry on the page cache's own
 * functions where the mm_filemap_get_pages/map_pages/fault tracepoints do
 * not exist (before 6.12). Layout differences are CO-RE (compat.bpf.h).
 *
 * What it cannot see. Files the kernel opens by itself (the ELF interpreter
 * loaded by exec) have no open event: user space resolves those from the
 * exec'd binary's PT_INTERP. Writes are not recorded. Pages read by kernel
 * threads on behalf of the tree (writeback, some readahead completions) are
 * not attributed to it. Paths deeper than WS_PATH_MAX_DEPTH components are
 * truncated (flagged) and resolved in user space.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "intf.h"
#include "compat.bpf.h"

char LICENSE[] SEC("license") = "GPL";

/* Unused instances so the record types reach BTF and the generated skeleton. */
struct ev_page _ev_page = {};
struct ev_proc _ev_proc = {};
struct ev_file _ev_file = {};
struct ev_pathop _ev_pathop = {};
enum ev_kind _ev_kind = 0;
enum pathop_kind _pathop_kind = 0;

/* Set before load: whether to emit page-use events and namespace events. */
const volatile bool trace_uses = true;
const volatile bool trace_namespace = true;
/* Daemon mode: report (and start tracing) every exec on the system. */
const volatile bool watch_exec = false;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 << 20); /* ~100k page records between two 50 ms polls */
} events SEC(".maps");

/* tgids of the traced process tree. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, u32);
	__type(value, u8);
} tracked SEC(".maps");

/* Records lost because the ring buffer was full. Must stay zero. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u64);
} drops SEC(".maps");

/*
 * Page-use dedup: a read() loop hits filemap_get_pages for the same pages
 * over and over, one call after the other; only the first use of a page
 * range matters for ordering. Each CPU remembers its last few uses and
 * drops exact repeats. This used to be a 32k-entry LRU hash: on a program
 * doing random reads every use is new, and inserting it (evicting another)
 * cost more than everything else the program does per page (1.26 us of
 * 0.6 us per call measured with bpf_stats). Repeats that are further apart
 * reach user space, which merges them anyway.
 */
struct use_key {
	u64 ino;
	u64 index;
	u32 dev;
	u32 count;
	u32 tgid; /* per process, so a long-lived recorder still sees each launch */
	u32 _pad;
};
#define RECENT_USES 4
struct recent_uses {
	struct use_key k[RECENT_USES];
	u32 next;
};
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct recent_uses);
} recent_use SEC(".maps");

/* Path syscalls in flight: user pointer to the path and which op it is. */
struct inflight {
	u64 path_ptr;
	int op;
	int _pad;
};
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, u64);
	__type(value, struct inflight);
} inflight SEC(".maps");

/*
 * Entries in `inflight`: sys_exit runs for every system call of the
 * machine, and while no recorded process is in a path syscall (a daemon
 * watching a storm of execs it leaves alone) it returns on this alone,
 * without a hash lookup (3.7 us of 12 us of BPF time per /bin/true).
 */
u64 inflight_n = 0;

/*
 * Quiet programs (daemon mode): executables the daemon judged not worth
 * following (a `/bin/true` whose launch was too small to learn), until a
 * CLOCK_MONOTONIC deadline. An exec of one by a process nobody follows is
 * neither traced nor reported, and the execve that starts it is not
 * reported either (looked up by the path as given, zero-padded): a storm
 * of short execs then costs the daemon no wake-up at all. Measured:
 * 312 us of daemon CPU per `/bin/true` without this (three wake-ups each).
 */
struct quiet_exe_key {
	u64 ino;
	u32 dev;
	u32 _pad;
};
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct quiet_exe_key);
	__type(value, u64);
} quiet_exe SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, char[WS_ARG_LEN]);
	__type(value, u64);
} quiet_name SEC(".maps");

/* [0]: whether quiet programs are left alone now (user space clears it
 * while a startup is recorded, whose reads are all wanted). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u32);
} quiet_on SEC(".maps");

/* Execs left alone because their program was quiet. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u64);
} quieted SEC(".maps");

static __always_inline bool quiet_enabled(void)
{
	u32 zero = 0;
	u32 *on = bpf_map_lookup_elem(&quiet_on, &zero);

	return on && *on;
}

/* Whether an entry of a quiet map is still in force. */
static __always_inline bool quiet_until(u64 *until)
{
	return until && *until > bpf_ktime_get_ns();
}

/* What `tracked` holds for a process: everything is recorded, or only
 * its process tree (fork, exec, exit), for a launch the daemon prefetches
 * without auditing it. Children inherit their parent's level. */
#define TRACK_ALL 1
#define TRACK_TREE 2

static __always_inline bool is_tracked(void)
{
	u32 tgid = bpf_get_current_pid_tgid() >> 32;
	return bpf_map_lookup_elem(&tracked, &tgid) != NULL;
}

/*
 * Whether any process may be recorded (tracked at TRACK_ALL). sys_enter
 * and the page hooks run for every system call and page of the machine;
 * a daemon that only prefetches the launches it follows records nothing
 * most of the time, and the `tracked` lookup they made before returning
 * cost 0.26 us per system call (bpf_stats), nearly doubling a one-byte
 * read(). While this is zero they return on it alone.
 *
 * The low 32 bits are never fewer than the TRACK_ALL entries: every
 * insertion of one adds RECORDED_ONE after its map update, which also
 * counts it in the high 32 bits. Only user space lowers the count, by
 * counting the map and then swapping its count in with a compare-and-swap
 * against the value it read before counting: an insertion meanwhile
 * changes the value and the swap fails.
 */
#define RECORDED_ONE ((1ULL << 32) | 1)
u64 recorded_n = 0;

static __always_inline void count_recorded(void)
{
	__sync_fetch_and_add(&recorded_n, RECORDED_ONE);
}

/* Tracked, and its pages and path operations recorded. */
static __always_inline bool is_recorded(void)
{
	if (!(u32)recorded_n)
		return false;
	u32 tgid = bpf_get_current_pid_tgid() >> 32;
	u8 *level = bpf_map_lookup_elem(&tracked, &tgid);
	return level && *level == TRACK_ALL;
}

/*
 * Wake-ups. With flags 0 the ring buffer wakes the reader whenever it had
 * caught up, which for a fast reader is once per record: an irq_work and a
 * context switch per page, paid on the traced program's CPUs (tens of
 * thousands per launch). Page, open and path records are written without a
 * wake-up; user space collects them on its poll timeout (10-20 ms). Only
 * fork, exec and exit force one: the daemon starts a replay on exec and
 * the recorder ends on the last exit.
 */
#define WAKE_LATER BPF_RB_NO_WAKEUP
#define WAKE_NOW BPF_RB_FORCE_WAKEUP

static __always_inline void count_drop(void)
{
	u32 zero = 0;
	u64 *n = bpf_map_lookup_elem(&drops, &zero);
	if (n)
		*n += 1;
}

static __always_inline void fill_hdr(struct ev_hdr *h, u32 kind)
{
	u64 id = bpf_get_current_pid_tgid();
	h->kind = kind;
	h->pid = (u32)id;
	h->tgid = id >> 32;
	h->_pad = 0;
	h->ts_ns = bpf_ktime_get_ns();
}

static __always_inline void emit_page(u32 kind, u32 dev, u64 ino, u64 index, u64 count)
{
	struct ev_page *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_drop();
		return;
	}
	fill_hdr(&e->hdr, kind);
	e->dev = dev;
	e->ino = ino;
	e->index = index;
	e->count = count;
	e->_pad = 0;
	bpf_ringbuf_submit(e, WAKE_LATER);
}

/* Callers have checked trace_uses and is_recorded(). */
static __always_inline void page_use(u32 kind, u32 dev, u64 ino, u64 index, u64 last)
{
	u64 count = last >= index ? last - index + 1 : 1;
	struct use_key k = { .ino = ino, .index = index, .dev = dev, .count = (u32)count,
			     .tgid = bpf_get_current_pid_tgid() >> 32 };
	u32 zero = 0;
	struct recent_uses *r = bpf_map_lookup_elem(&recent_use, &zero);
	if (r) {
		for (int i = 0; i < RECENT_USES; i++) {
			struct use_key *o = &r->k[i];
			if (o->ino == k.ino && o->index == k.index && o->dev == k.dev &&
			    o->count == k.count && o->tgid == k.tgid)
				return;
		}
		r->k[r->next % RECENT_USES] = k;
		r->next++;
	}
	emit_page(kind, dev, ino, index, count);
}


/* A folio from 5.16, a page before: see cached_pages(). */
SEC("tp_btf/mm_filemap_add_to_page_cache")
int BPF_PROG(handle_add, void *folio)
{
	struct address_space *mapping = NULL;
	u64 ino, index = 0, count;
	u32 dev;

	if (!is_recorded())
		return 0;
	count = cached_pages(folio, &mapping, &index);
	dev = mapping_dev(mapping, &ino);
	emit_page(EV_PAGE_ADD, dev, ino, index, count);
	return 0;
}

SEC("tp_btf/mm_filemap_get_pages")
int BPF_PROG(handle_get, struct address_space *mapping, unsigned long index, unsigned long last)
{
	u64 ino;
	u32 dev;

	if (!trace_uses || !is_recorded())
		return 0;
	dev = mapping_dev(mapping, &ino);
	page_use(EV_PAGE_GET, dev, ino, index, last);
	return 0;
}

SEC("tp_btf/mm_filemap_map_pages")
int BPF_PROG(handle_map, struct address_space *mapping, unsigned long index, unsigned long last)
{
	u64 ino;
	u32 dev;

	if (!trace_uses || !is_recorded())
		return 0;
	dev = mapping_dev(mapping, &ino);
	page_use(EV_PAGE_MAP, dev, ino, index, last);
	return 0;
}

SEC("tp_btf/mm_filemap_fault")
int BPF_PROG(handle_fault, struct address_space *mapping, unsigned long index)
{
	u64 ino;
	u32 dev;

	if (!trace_uses || !is_recorded())
		return 0;
	dev = mapping_dev(mapping, &ino);
	page_use(EV_PAGE_FAULT, dev, ino, index, index);
	return 0;
}

/*
 * Page uses before 6.12, which has no tracepoint for them: fentry on the
 * functions those tracepoints sit in. A read() is taken as the pages it
 * asks for up to the end of the file (filemap_get_pages is static and may
 * be inlined; its callers are not); faults and fault-around as the
 * tracepoints report them. Loaded only where the tracepoints are missing.
 */
static __always_inline void read_use(struct kiocb *iocb, struct iov_iter *iter)
{
	struct file *f = BPF_CORE_READ(iocb, ki_filp);
	struct address_space *mapping = BPF_CORE_READ(f, f_mapping);
	s64 pos = BPF_CORE_READ(iocb, ki_pos);
	s64 size = BPF_CORE_READ(mapping, host, i_size);
	u64 count = BPF_CORE_READ(iter, count);
	u64 ino;
	u32 dev;

	if (!count || pos < 0 || pos >= size)
		return;
	if (count > (u64)(size - pos))
		count = size - pos;
	dev = mapping_dev(mapping, &ino);
	page_use(EV_PAGE_GET, dev, ino, (u64)pos >> 12, ((u64)pos + count - 1) >> 12);
}

SEC("fentry/filemap_read")
int BPF_PROG(use_read, struct kiocb *iocb, struct iov_iter *iter)
{
	if (trace_uses && is_recorded())
		read_use(iocb, iter);
	return 0;
}

/* filemap_read() before 5.12 */
SEC("fentry/generic_file_buffered_read")
int BPF_PROG(use_read_old, struct kiocb *iocb, struct iov_iter *iter)
{
	if (trace_uses && is_recorded())
		read_use(iocb, iter);
	return 0;
}

SEC("fentry/filemap_map_pages")
int BPF_PROG(use_map, struct vm_fault *vmf, unsigned long start, unsigned long end)
{
	u64 ino;
	u32 dev;

	if (!trace_uses || !is_recorded())
		return 0;
	dev = mapping_dev(BPF_CORE_READ(vmf, vma, vm_file, f_mapping), &ino);
	page_use(EV_PAGE_MAP, dev, ino, start, end);
	return 0;
}

SEC("fentry/filemap_fault")
int BPF_PROG(use_fault, struct vm_fault *vmf)
{
	u64 ino, index;
	u32 dev;

	if (!trace_uses || !is_recorded())
		return 0;
	dev = mapping_dev(BPF_CORE_READ(vmf, vma, vm_file, f_mapping), &ino);
	index = BPF_CORE_READ(vmf, pgoff);
	page_use(EV_PAGE_FAULT, dev, ino, index, index);
	return 0;
}

/* ---- process tree ---- */

SEC("tp_btf/sched_process_fork")
int BPF_PROG(handle_fork, struct task_struct *parent, struct task_struct *child)
{
	u32 ptgid = parent->tgid;
	u32 ctgid = child->tgid;

	u8 *level = bpf_map_lookup_elem(&tracked, &ptgid);
	if (!level)
		return 0;
	if (ctgid == ptgid)
		return 0; /* a new thread: its tgid is already tracked */
	u8 inherited = *level;
	if (bpf_map_update_elem(&tracked, &ctgid, &inherited, BPF_ANY) == 0 &&
	    inherited == TRACK_ALL)
		count_recorded();

	struct ev_proc *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_drop();
		return 0;
	}
	fill_hdr(&e->hdr, EV_FORK);
	e->hdr.pid = parent->pid;
	e->hdr.tgid = ptgid;
	e->child_pid = child->pid;
	e->child_tgid = ctgid;
	bpf_probe_read_kernel_str(e->comm, sizeof(e->comm), child->comm);
	bpf_ringbuf_submit(e, WAKE_NOW);
	return 0;
}

static __always_inline int group_exit(struct task_struct *p)
{
	u32 tgid = BPF_CORE_READ(p, tgid);

	if (bpf_map_delete_elem(&tracked, &tgid))
		return 0;

	struct ev_proc *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_drop();
		return 0;
	}
	fill_hdr(&e->hdr, EV_EXIT);
	e->hdr.tgid = tgid;
	e->child_pid = p->pid;
	e->child_tgid = tgid;
	bpf_probe_read_kernel_str(e->comm, sizeof(e->comm), p->comm);
	bpf_ringbuf_submit(e, WAKE_NOW);
	return 0;
}

/* 6.16 and later (group_dead was added to the tracepoint then). */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(handle_exit, struct task_struct *p, bool group_dead)
{
	return group_dead ? group_exit(p) : 0;
}

/* Before 6.16: the tracepoint passes the task alone. */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(handle_exit_task, struct task_struct *p)
{
	return group_dead_of(p) ? group_exit(p) : 0;
}

/* ---- path resolution ---- */

#include "path.bpf.h"

/*
 * `loop` in what follows: whether the kernel has bpf_loop (5.17). Each
 * entry point comes twice, with it constant true and false; user space
 * loads one of the two (see "Kernels before today's" above).
 */
static __always_inline void emit_file(u32 kind, struct file *f, u64 wake, bool loop)
{
	struct ev_exec *x = fill_file(kind, f, loop);

	if (x && bpf_ringbuf_output(&events, &x->file, sizeof(x->file), wake))
		count_drop();
}

/* An exec: its binary and the new program's arguments (see ev_exec). */
static __always_inline void emit_exec(struct task_struct *p, struct file *f, bool loop)
{
	struct ev_exec *x = fill_file(EV_EXEC, f, loop);

	if (!x)
		return;
	u64 start = BPF_CORE_READ(p, mm, arg_start);
	u64 end = BPF_CORE_READ(p, mm, arg_end);
	u64 len = end > start ? end - start : 0;

	x->args_len = 0;
	x->uid = (u32)bpf_get_current_uid_gid();
	x->pad = 0;
	x->args_truncated = len >= WS_EXEC_ARGS;
	if (len >= WS_EXEC_ARGS)
		len = WS_EXEC_ARGS - 1;
	len &= WS_EXEC_ARGS - 1;
	if (len > 0 && bpf_probe_read_user(x->args, len, (const void *)start) == 0) {
		x->args_len = len;
	} else {
		x->args_truncated = len > 0;
		len = 0;
	}
	/* Only the arguments read: not the rest of the scratch record, which
	 * holds an earlier exec's. */
	if (bpf_ringbuf_output(&events, x, __builtin_offsetof(struct ev_exec, args) + len, WAKE_NOW))
		count_drop();
}

static __always_inline struct file *fd_file(long fd)
{
	struct task_struct *t = (void *)bpf_get_current_task();
	struct fdtable *fdt = BPF_CORE_READ(t, files, fdt);
	struct file **fds = BPF_CORE_READ(fdt, fd);
	unsigned int max = BPF_CORE_READ(fdt, max_fds);
	struct file *f = NULL;

	if (fd < 0 || fd >= max)
		return NULL;
	bpf_probe_read_kernel(&f, sizeof(f), &fds[fd]);
	return f;
}

static __always_inline int on_exec(struct task_struct *p, pid_t old_pid,
				   struct linux_binprm *bprm, bool loop)
{
	/*
	 * A thread other than the leader that execs takes the leader's pid:
	 * its sys_exit no longer finds the entry path_enter() made under its
	 * old id. Removed here, or a long-running daemon would fill the map.
	 */
	u64 now_id = bpf_get_current_pid_tgid();
	if ((u32)now_id != (u32)old_pid) {
		u64 old_id = (now_id & 0xffffffff00000000ULL) | (u32)old_pid;
		if (bpf_map_delete_elem(&inflight, &old_id) == 0)
			__sync_fetch_and_add(&inflight_n, -1);
	}
	if (watch_exec) {
		/* Daemon mode: every exec starts being traced at once, so a
		 * launch to learn loses nothing; user space untracks the rest.
		 * Not a quiet program run outside any followed launch. */
		u32 tgid = bpf_get_current_pid_tgid() >> 32;
		u8 all = TRACK_ALL;
		if (!bpf_map_lookup_elem(&tracked, &tgid) && quiet_enabled()) {
			struct inode *inode = BPF_CORE_READ(bprm, file, f_inode);
			struct quiet_exe_key k = {
				.ino = BPF_CORE_READ(inode, i_ino),
				.dev = BPF_CORE_READ(inode, i_sb, s_dev),
			};
			if (quiet_until(bpf_map_lookup_elem(&quiet_exe, &k))) {
				u32 zero = 0;
				u64 *n = bpf_map_lookup_elem(&quieted, &zero);
				if (n)
					*n += 1;
				return 0;
			}
		}
		if (bpf_map_update_elem(&tracked, &tgid, &all, BPF_ANY) == 0)
			count_recorded();
	} else if (!is_tracked()) {
		return 0;
	}
	emit_exec(p, BPF_CORE_READ(bprm, file), loop);
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(handle_exec, struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)
{
	return on_exec(p, old_pid, bprm, true);
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(handle_exec_bounded, struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)
{
	return on_exec(p, old_pid, bprm, false);
}

/* ---- execve entry (daemon mode) ---- */

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct ev_exec_start);
} exec_start_scratch SEC(".maps");

struct argv_ctx {
	const char *const *argv;
	u32 off;
	u32 done;
	u32 truncated;
};

/* Copies argv[i] after the strings before it; stops at the NULL pointer. */
static long argv_step(u64 i, struct argv_ctx *c)
{
	u32 zero = 0;
	struct ev_exec_start *x = bpf_map_lookup_elem(&exec_start_scratch, &zero);
	const char *p = NULL;

	if (!x)
		return 1;
	if (bpf_probe_read_user(&p, sizeof(p), &c->argv[i])) {
		c->truncated = 1;
		return 1;
	}
	if (!p) {
		c->done = 1;
		return 1;
	}
	u32 off = c->off;
	if (off >= WS_EXEC_ARGS) {
		c->truncated = 1;
		return 1;
	}
	long n = bpf_probe_read_user_str(&x->args[off & (WS_EXEC_ARGS - 1)], WS_EXEC_ARGS, p);
	if (n <= 0) {
		c->truncated = 1;
		return 1;
	}
	c->off = off + n;
	return 0;
}

/* argv_step() over `argv_state`, for kernels without bpf_loop: a global
 * function is verified once (see ws_walk_next in path.bpf.h). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct argv_ctx);
} argv_state SEC(".maps");

__attribute__((noinline)) int ws_argv_next(u32 i)
{
	u32 zero = 0;
	struct argv_ctx *c = bpf_map_lookup_elem(&argv_state, &zero);

	if (!c)
		return 1;
	return argv_step(i, c) ? 1 : 0;
}

/*
 * An execve starting, so that the daemon can start a known program's
 * replay while the kernel is still loading it (10-25 ms on a cold cache
 * here) rather than after.
 */
static __always_inline void exec_start(struct pt_regs *regs, bool loop)
{
	u32 zero = 0;
	struct ev_exec_start *x = bpf_map_lookup_elem(&exec_start_scratch, &zero);

	if (!x)
		return;
	fill_hdr(&x->hdr, EV_EXEC_START);
	/* Zero-padded: the name is also a key of `quiet_name`. */
	__builtin_memset(x->filename, 0, sizeof(x->filename));
	if (bpf_probe_read_user_str(x->filename, sizeof(x->filename),
				    (const char *)PT_REGS_PARM1_CORE_SYSCALL(regs)) <= 0)
		return;
	if (!is_tracked() && quiet_enabled() &&
	    quiet_until(bpf_map_lookup_elem(&quiet_name, x->filename)))
		return;
	struct argv_ctx c = { .argv = (const char *const *)PT_REGS_PARM2_CORE_SYSCALL(regs) };
	if (loop) {
		bpf_loop(64, argv_step, &c, 0);
	} else {
		struct argv_ctx *a = bpf_map_lookup_elem(&argv_state, &zero);
		if (!a)
			return;
		*a = c;
#pragma clang loop unroll(disable)
		for (u32 i = 0; i < 64; i++)
			if (ws_argv_next(i))
				break;
		c = *a;
	}
	u32 len = c.off;
	x->args_truncated = c.truncated || !c.done || len > WS_EXEC_ARGS;
	if (len > WS_EXEC_ARGS)
		len = WS_EXEC_ARGS;
	len &= 2 * WS_EXEC_ARGS - 1;
	x->args_len = len;
	if (bpf_ringbuf_output(&events, x, __builtin_offsetof(struct ev_exec_start, args) + len,
			       WAKE_NOW))
		count_drop();
}

/* ---- path syscalls ---- */

/* sys_enter has checked trace_namespace and is_recorded(). */
static __always_inline int path_enter(u64 ptr, int op)
{
	struct inflight v = { .path_ptr = ptr, .op = op };
	u64 id = bpf_get_current_pid_tgid();
	/* Counted once per entry: a stale one (a thread that never
	 * returned) is overwritten, not counted again. */
	if (bpf_map_update_elem(&inflight, &id, &v, BPF_NOEXIST) == 0)
		__sync_fetch_and_add(&inflight_n, 1);
	else
		bpf_map_update_elem(&inflight, &id, &v, BPF_ANY);
	return 0;
}

static __always_inline int path_exit(long ret, bool loop)
{
	if (!inflight_n)
		return 0;
	u64 id = bpf_get_current_pid_tgid();
	struct inflight *v = bpf_map_lookup_elem(&inflight, &id);
	if (!v)
		return 0;
	u64 ptr = v->path_ptr;
	int op = v->op;
	if (bpf_map_delete_elem(&inflight, &id) == 0)
		__sync_fetch_and_add(&inflight_n, -1);

	if (op == PATHOP_OPEN && ret >= 0) {
		emit_file(EV_OPEN, fd_file(ret), WAKE_LATER, loop);
		return 0;
	}
	/*
	 * An exec that succeeded comes as EV_EXEC; its path pointer belonged
	 * to the old image. A failed one is a lookup like any other: a PATH
	 * search (execvp) tries each directory in turn, and on a cold cache
	 * each miss reads that directory from the disk.
	 */
	if (op == PATHOP_EXEC && ret >= 0)
		return 0;
	struct ev_pathop *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_drop();
		return 0;
	}
	fill_hdr(&e->hdr, EV_PATHOP);
	e->op = op;
	e->ret = (int)ret;
	/* fstat() arrives as newfstatat(fd, "", AT_EMPTY_PATH): no lookup, no I/O */
	if (bpf_probe_read_user_str(e->path, sizeof(e->path), (const void *)ptr) <= 1) {
		bpf_ringbuf_discard(e, WAKE_LATER);
		return 0;
	}
	bpf_ringbuf_submit(e, WAKE_LATER);
	return 0;
}

/*
 * Syscall numbers of the path lookups we follow. One raw_syscalls hook
 * pair instead of a tracepoint per syscall: attaching and, above all,
 * detaching a classic tracepoint waits for an RCU grace period each
 * (~70 ms here), which would add seconds to every recording.
 */
#if defined(__TARGET_ARCH_x86)
#define NR_open 2
#define NR_stat 4
#define NR_lstat 6
#define NR_access 21
#define NR_readlink 89
#define NR_getdents64 217
#define NR_execve 59
#define NR_openat 257
#define NR_newfstatat 262
#define NR_readlinkat 267
#define NR_faccessat 269
#define NR_statx 332
#define NR_execveat 322
#else /* asm-generic numbering (arm64, riscv) has no legacy path syscalls */
#define NR_open -1
#define NR_stat -2
#define NR_lstat -3
#define NR_access -4
#define NR_readlink -5
#define NR_getdents64 61
#define NR_execve 221
#define NR_openat 56
#define NR_newfstatat 79
#define NR_readlinkat 78
#define NR_faccessat 48
#define NR_statx 291
#define NR_execveat 281
#endif
#define NR_openat2 437
#define NR_faccessat2 439

static __always_inline int on_sys_enter(struct pt_regs *regs, long id, bool loop)
{
	if (watch_exec && id == NR_execve)
		exec_start(regs, loop);
	if (!trace_namespace || !is_recorded())
		return 0;
	switch (id) {
	case NR_execve:
		return path_enter(PT_REGS_PARM1_CORE_SYSCALL(regs), PATHOP_EXEC);
	case NR_execveat:
		return path_enter(PT_REGS_PARM2_CORE_SYSCALL(regs), PATHOP_EXEC);
	case NR_open:
		return path_enter(PT_REGS_PARM1_CORE_SYSCALL(regs), PATHOP_OPEN);
	case NR_openat:
	case NR_openat2:
		return path_enter(PT_REGS_PARM2_CORE_SYSCALL(regs), PATHOP_OPEN);
	case NR_stat:
	case NR_lstat:
		return path_enter(PT_REGS_PARM1_CORE_SYSCALL(regs), PATHOP_STAT);
	case NR_newfstatat:
	case NR_statx:
		return path_enter(PT_REGS_PARM2_CORE_SYSCALL(regs), PATHOP_STAT);
	case NR_access:
		return path_enter(PT_REGS_PARM1_CORE_SYSCALL(regs), PATHOP_ACCESS);
	case NR_faccessat:
	case NR_faccessat2:
		return path_enter(PT_REGS_PARM2_CORE_SYSCALL(regs), PATHOP_ACCESS);
	case NR_readlink:
		return path_enter(PT_REGS_PARM1_CORE_SYSCALL(regs), PATHOP_READLINK);
	case NR_readlinkat:
		return path_enter(PT_REGS_PARM2_CORE_SYSCALL(regs), PATHOP_READLINK);
	case NR_getdents64:
		emit_file(EV_DIRREAD, fd_file(PT_REGS_PARM1_CORE_SYSCALL(regs)), WAKE_LATER, loop);
		return 0;
	}
	return 0;
}

SEC("tp_btf/sys_enter")
int BPF_PROG(sys_enter, struct pt_regs *regs, long id)
{
	return on_sys_enter(regs, id, true);
}

SEC("tp_btf/sys_enter")
int BPF_PROG(sys_enter_bounded, struct pt_regs *regs, long id)
{
	return on_sys_enter(regs, id, false);
}

SEC("tp_btf/sys_exit")
int BPF_PROG(sys_exit, struct pt_regs *regs, long ret)
{
	return trace_namespace ? path_exit(ret, true) : 0;
}

SEC("tp_btf/sys_exit")
int BPF_PROG(sys_exit_bounded, struct pt_regs *regs, long ret)
{
	return trace_namespace ? path_exit(ret, false) : 0;
}
