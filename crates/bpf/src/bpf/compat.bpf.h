/* SPDX-License-Identifier: GPL-2.0 */
/*
 * compat.bpf.h — reading kernel objects whose layout changed between the
 * kernels warmstart supports (5.10 to today), with CO-RE: each helper asks
 * the running kernel's BTF which layout it has, and libbpf turns the
 * question into a constant at load time, so the branches not taken are
 * dead code the verifier never walks. libbpf-tools' core_fixes.bpf.h is
 * the model. Included by record.bpf.c and waits.bpf.c.
 */
#ifndef WS_COMPAT_BPF_H
#define WS_COMPAT_BPF_H

/* 6.1 to 6.5: a large folio's order has a byte of its own (moved into
 * _flags_1 by ebc1baf5c9b4, "mm: free up a word in the first tail page"). */
struct folio___order_byte {
	unsigned char _folio_order;
} __attribute__((preserve_access_index));

/* Before folios carried it, a compound page's order is in its first tail
 * page (5.10 to 6.3). */
struct page___compound_order {
	unsigned char compound_order;
} __attribute__((preserve_access_index));

/* Before 6.16 a page's index is `index` (renamed __folio_index). */
struct page___index {
	struct address_space *mapping;
	unsigned long index;
} __attribute__((preserve_access_index));

/* Before 5.14 a task's state is `state` (renamed __state by 2f064a59a11f). */
struct task_struct___state {
	long state;
} __attribute__((preserve_access_index));

/*
 * What mm_filemap_add_to_page_cache passes: a folio from 5.16, a page
 * before. Both begin with the flags word and agree on `mapping` and the
 * index (struct folio overlays struct page: FOLIO_MATCH in mm_types.h).
 * Sets the mapping and first index; returns how many pages it holds.
 */
static __always_inline u64 cached_pages(void *obj, struct address_space **mapping, u64 *index)
{
	unsigned long flags = 0;
	u32 order = 0;

	if (bpf_core_type_exists(struct folio)) {
		struct folio *f = obj;
		*mapping = BPF_CORE_READ(f, mapping);
		*index = BPF_CORE_READ(f, index);
	} else {
		struct page___index *p = obj;
		*mapping = BPF_CORE_READ(p, mapping);
		*index = BPF_CORE_READ(p, index);
	}
	/* The flags word is first in both; its type changed (memdesc_flags_t
	 * in 6.17), so it is read raw. */
	bpf_probe_read_kernel(&flags, sizeof(flags), obj);
	if (!(flags & (1UL << bpf_core_enum_value(enum pageflags, PG_head))))
		return 1;
	if (bpf_core_field_exists(struct folio___order_byte, _folio_order)) {
		order = BPF_CORE_READ((struct folio___order_byte *)obj, _folio_order);
	} else if (bpf_core_field_exists(struct page___compound_order, compound_order)) {
		struct page___compound_order *tail = obj + bpf_core_type_size(struct page);
		order = BPF_CORE_READ(tail, compound_order);
	} else if (bpf_core_field_exists(struct folio, _flags_1)) {
		order = BPF_CORE_READ((struct folio *)obj, _flags_1) & 0xff;
	}
	return 1ULL << (order & 31);
}

/*
 * Whether the exiting task was the last of its thread group, for kernels
 * whose sched_process_exit has no group_dead argument (before 6.16):
 * do_exit() has decremented signal->live before it fires the tracepoint.
 * Two threads exiting at once may both see zero; callers act once (they
 * delete the group from a map and act only if it was there).
 */
static __always_inline bool group_dead_of(struct task_struct *p)
{
	return BPF_CORE_READ(p, signal, live.counter) == 0;
}

/* A task's run state (0: runnable), for sched_switch before 5.18, which
 * does not pass it. */
static __always_inline long task_state(struct task_struct *p)
{
	if (bpf_core_field_exists(struct task_struct, __state))
		return BPF_CORE_READ(p, __state);
	return BPF_CORE_READ((struct task_struct___state *)p, state);
}

/*
 * The (device, inode) of a page-cache mapping, as the page tracepoints'
 * own s_dev field gives the device: the superblock's, else i_rdev. For a
 * block device's own mapping (file system metadata) the inode number
 * user space expects is the disk's device number: i_ino is that from
 * 5.11 on, and i_rdev is on every kernel (5.10's bdev inodes have another
 * i_ino, which left ext4's metadata pages unnamed there).
 */
static __always_inline u32 mapping_dev(struct address_space *mapping, u64 *ino)
{
	struct inode *host = BPF_CORE_READ(mapping, host);
	struct super_block *sb = BPF_CORE_READ(host, i_sb);
	unsigned short mode = BPF_CORE_READ(host, i_mode);

	*ino = (mode & 00170000) == 0060000 ? (u64)BPF_CORE_READ(host, i_rdev)
					     : BPF_CORE_READ(host, i_ino);
	return sb ? BPF_CORE_READ(sb, s_dev) : BPF_CORE_READ(host, i_rdev);
}

#endif /* WS_COMPAT_BPF_H */
