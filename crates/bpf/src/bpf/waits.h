/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The one header shared by waits.bpf.c and the Rust side (its skeleton's
 * generated `types`). Every record is one `struct wt_ev`; `kind` says how
 * to read its fields.
 */
#ifndef WARMSTART_WAITS_H
#define WARMSTART_WAITS_H

enum wt_kind {
	WT_ADD_LAUNCH = 1, /* page(s) inserted by a task of the launch */
	WT_ADD_REPLAY = 2, /* page(s) inserted by a thread of the replay */
	WT_GET = 3,        /* read(): pages looked up, after any wait for them */
	WT_MAP = 4,        /* fault-around: cached, uptodate pages mapped */
	WT_FAULT = 5,      /* a fault on a file mapping, before any wait */
	WT_SLEEP = 6,      /* a launch thread was off-CPU in D state: ts_ns..end_ns */
	WT_EXEC = 7,       /* a launch process exec'd; dev/ino: the binary */
	WT_FORK = 8,       /* the launch grew a process: index = the child's tgid */
	WT_EXIT = 9,       /* a launch process ended */
	WT_RUNNABLE = 10,  /* a launch thread was preempted: runnable, off-CPU ts_ns..end_ns */
};

struct wt_ev {
	unsigned int kind;
	unsigned int pid;  /* thread id */
	unsigned int tgid; /* process id */
	unsigned int dev;  /* kernel encoding (major << 20 | minor) */
	unsigned long long ts_ns; /* CLOCK_MONOTONIC */
	unsigned long long ino;
	unsigned long long index; /* first page; WT_RUNNABLE: 1 if a replay thread took the CPU;
				   WT_SLEEP: the kernel stack's id in `stacks` + 1, 0 if none */
	unsigned long long count; /* pages; for WT_SLEEP and WT_RUNNABLE the end time */
};

#endif
