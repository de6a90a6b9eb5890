/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The one header shared by record.bpf.c and the Rust side, which gets its
 * structs from the generated skeleton's `types` module (build.rs). Every
 * record sent through the ring buffer starts with `struct ev_hdr`; `kind`
 * says which body follows.
 */
#ifndef WARMSTART_INTF_H
#define WARMSTART_INTF_H

#define WS_PATH_MAX_DEPTH 32 /* a power of two: used as a mask */
#define WS_NAME_LEN 96
#define WS_ARG_LEN 256
#define WS_EXEC_ARGS 4096 /* a power of two: used as a mask */

enum ev_kind {
	EV_PAGE_ADD = 1,   /* page(s) inserted into the page cache: read from storage */
	EV_PAGE_GET = 2,   /* read()/splice: pages looked up via filemap_get_pages */
	EV_PAGE_MAP = 3,   /* fault-around: pages mapped into a process */
	EV_PAGE_FAULT = 4, /* page fault on a file mapping */
	EV_FORK = 5,
	EV_EXEC = 6,
	EV_EXIT = 7,
	EV_OPEN = 8,       /* successful open: resolved path + identity */
	EV_PATHOP = 9,     /* stat/access/readlink/failed open: the path as given */
	EV_DIRREAD = 10,   /* getdents64 on a directory: resolved path */
	EV_EXEC_START = 11, /* daemon mode: execve entered (before the kernel reads anything) */
};

enum pathop_kind {
	PATHOP_OPEN = 1,
	PATHOP_STAT = 2,
	PATHOP_ACCESS = 3,
	PATHOP_READLINK = 4,
	PATHOP_EXEC = 5, /* execve/execveat: only failed ones are emitted */
};

struct ev_hdr {
	unsigned int kind;
	unsigned int pid;  /* thread id */
	unsigned int tgid; /* process id */
	unsigned int _pad;
	unsigned long long ts_ns; /* CLOCK_MONOTONIC (bpf_ktime_get_ns) */
};

/* EV_PAGE_*: `dev` is the kernel's encoding (major << 20 | minor). */
struct ev_page {
	struct ev_hdr hdr;
	unsigned long long ino;
	unsigned long long index;    /* first page index */
	unsigned long long count;    /* number of pages */
	unsigned int dev;
	unsigned int _pad;
};

struct ev_proc {
	struct ev_hdr hdr;
	unsigned int child_pid;  /* EV_FORK: new thread id */
	unsigned int child_tgid; /* EV_FORK: new process id */
	char comm[16];
};

/*
 * A resolved path as a chain of names from the file up to the root of the
 * task that used it (its chroot's, else the mount namespace's), as d_path
 * names it, WS_NAME_LEN bytes per name, the basename first (kept flat
 * so the generated Rust type stays simple). depth == WS_PATH_MAX_DEPTH and
 * `truncated` mean the walk stopped early.
 */
struct ws_path {
	unsigned short depth;
	unsigned short truncated;
	unsigned int _pad;
	char comp[WS_PATH_MAX_DEPTH * WS_NAME_LEN];
};

/* EV_OPEN, EV_DIRREAD, EV_EXEC (exec carries the binary it runs). */
struct ev_file {
	struct ev_hdr hdr;
	unsigned long long ino;
	unsigned long long size;
	unsigned int dev;
	unsigned int mode; /* i_mode: file type and permissions */
	struct ws_path path;
};

/*
 * EV_EXEC: the binary the kernel runs (for a script, its interpreter) and
 * the new program's argument area as the kernel laid it out (for a
 * script: interpreter, its optional argument, the script as given to
 * execve, then the original arguments), NUL-separated. Read at the exec,
 * so a program that execs again at once still names its own launch.
 * `args_truncated`: the area was longer than `args` (or unreadable).
 * The record ends after its `args_len` bytes of arguments.
 */
struct ev_exec {
	struct ev_file file;
	unsigned int args_len;
	unsigned int args_truncated;
	/* The real uid the new program runs as: profiles are per user, and a
	 * short program may be gone from /proc before user space reads it. */
	unsigned int uid;
	unsigned int pad;
	char args[WS_EXEC_ARGS];
};

/*
 * EV_EXEC_START: an execve as called, before the kernel has looked up or
 * read anything: the path as given and the argument strings, NUL-separated
 * (at most 64 of them, `args_len` bytes up to WS_EXEC_ARGS; `args` is twice
 * that so each string read has room whatever its offset). The exec may
 * still fail; EV_EXEC follows if it does not. The record ends after its
 * arguments.
 */
struct ev_exec_start {
	struct ev_hdr hdr;
	char filename[WS_ARG_LEN];
	unsigned int args_len;
	unsigned int args_truncated;
	char args[2 * WS_EXEC_ARGS];
};

/* EV_PATHOP: a path-based lookup and its result (negative lookups cost I/O too). */
struct ev_pathop {
	struct ev_hdr hdr;
	int op;
	int ret;
	char path[WS_ARG_LEN];
};

#endif /* WARMSTART_INTF_H */
