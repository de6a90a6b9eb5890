/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Naming a file from BPF: the walk from its dentry up to the calling
 * task's root, component by component, into a scratch record whose file
 * part record.bpf.c sends. Included by record.bpf.c after its ring buffer
 * and header helpers (fill_hdr); not a compilation unit of its own.
 */
#ifndef WS_PATH_BPF_H
#define WS_PATH_BPF_H

/* Records with a path are assembled here, then copied to the ring buffer
 * (an exec's arguments after its file). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct ev_exec);
} file_scratch SEC(".maps");

struct walk_ctx {
	struct dentry *dentry;
	struct mount *mnt;
	struct dentry *mnt_root;
	/* The calling task's root (a chroot's, or the namespace's) */
	struct dentry *root;
	struct vfsmount *root_mnt;
	u32 depth;
	u32 truncated;
	u32 at_root;
};

/*
 * One step of the walk from a dentry up to the calling task's root (or the
 * namespace root, above a root outside it), crossing mount points as d_path
 * does: a program chrooted over another filesystem (as in the bench's
 * testbed) is named by the paths it and a recorder beside it see, not by
 * where its root is mounted outside. A bpf_loop callback is verified once,
 * where an unrolled loop with mount crossings explodes the verifier's
 * states.
 */
static long walk_step(u64 i, struct walk_ctx *c)
{
	/* locals: BPF_CORE_READ must not relocate accesses to walk_ctx itself */
	struct dentry *dentry = c->dentry;
	struct mount *mnt = c->mnt;

	if (dentry == c->root &&
	    (void *)mnt + bpf_core_field_offset(struct mount, mnt) == (void *)c->root_mnt) {
		c->at_root = 1;
		return 1;
	}
	if (dentry == c->mnt_root) {
		struct mount *parent = BPF_CORE_READ(mnt, mnt_parent);
		if (parent == mnt)
			return 1; /* the namespace root */
		c->dentry = BPF_CORE_READ(mnt, mnt_mountpoint);
		c->mnt = parent;
		c->mnt_root = BPF_CORE_READ(parent, mnt.mnt_root);
		return 0;
	}
	struct dentry *up = BPF_CORE_READ(dentry, d_parent);
	if (up == dentry)
		return 1; /* root of a detached tree */
	if (c->depth >= WS_PATH_MAX_DEPTH) {
		c->truncated = 1;
		return 1;
	}
	u32 zero = 0;
	struct ev_exec *x = bpf_map_lookup_elem(&file_scratch, &zero);
	if (!x)
		return 1;
	struct ev_file *e = &x->file;
	const unsigned char *name = BPF_CORE_READ(dentry, d_name.name);
	bpf_probe_read_kernel_str(&e->path.comp[(c->depth & (WS_PATH_MAX_DEPTH - 1)) * WS_NAME_LEN],
				  WS_NAME_LEN, name);
	c->depth++;
	c->dentry = up;
	return 0;
}

/* The walk's state for kernels without bpf_loop (before 5.17). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct walk_ctx);
} walk_state SEC(".maps");

/*
 * One step of the walk in `walk_state`: a global function, which the
 * verifier checks once on its own (5.6 and later) rather than at each of
 * the bounded loop's iterations, as it would an inlined or static one.
 */
__attribute__((noinline)) int ws_walk_next(void)
{
	u32 zero = 0;
	struct walk_ctx *c = bpf_map_lookup_elem(&walk_state, &zero);

	if (!c)
		return 1;
	return walk_step(0, c) ? 1 : 0;
}

/*
 * Fills the scratch record's file part; NULL if there is nothing to send.
 * `loop`: walk with bpf_loop (5.17 and later), else with a bounded loop
 * over ws_walk_next(); a constant in each program.
 */
static __always_inline struct ev_exec *fill_file(u32 kind, struct file *f, bool loop)
{
	u32 zero = 0;
	struct ev_exec *x;
	struct ev_file *e;

	if (!f)
		return NULL;
	x = bpf_map_lookup_elem(&file_scratch, &zero);
	if (!x)
		return NULL;
	e = &x->file;
	struct inode *inode = BPF_CORE_READ(f, f_inode);
	struct vfsmount *vfsmnt = BPF_CORE_READ(f, f_path.mnt);
	/* Not bpf_get_current_task_btf(), which is 5.11 and later. */
	struct task_struct *task = (void *)bpf_get_current_task();
	struct walk_ctx c = {
		.dentry = BPF_CORE_READ(f, f_path.dentry),
		.mnt = (void *)vfsmnt - bpf_core_field_offset(struct mount, mnt),
		.mnt_root = BPF_CORE_READ(vfsmnt, mnt_root),
		.root = BPF_CORE_READ(task, fs, root.dentry),
		.root_mnt = BPF_CORE_READ(task, fs, root.mnt),
	};
	fill_hdr(&e->hdr, kind);
	e->ino = BPF_CORE_READ(inode, i_ino);
	e->dev = BPF_CORE_READ(inode, i_sb, s_dev);
	e->mode = BPF_CORE_READ(inode, i_mode);
	e->size = BPF_CORE_READ(inode, i_size);
	/* budget: every component plus a few mount crossings */
	if (loop) {
		bpf_loop(WS_PATH_MAX_DEPTH + 16, walk_step, &c, 0);
	} else {
		struct walk_ctx *w = bpf_map_lookup_elem(&walk_state, &zero);
		if (!w)
			return NULL;
		*w = c;
#pragma clang loop unroll(disable)
		for (int i = 0; i < WS_PATH_MAX_DEPTH + 16; i++)
			if (ws_walk_next())
				break;
		c = *w;
	}
	e->path.depth = c.depth;
	e->path.truncated = c.truncated || (!c.at_root && c.dentry != c.mnt_root);
	return x;
}

#endif /* WS_PATH_BPF_H */
