//! Builds a [`Trace`] from classified accesses: pages become extents in
//! first-use order, consecutive pages coalesce, repeats are dropped, and
//! pages the launch never used are marked.

use std::collections::{HashMap, HashSet};

use super::*;

/// A classified access, as the recorder hands it to the builder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Pages `index .. index+count` of file (dev, ino). `from_storage` if
    /// the event was a page-cache insertion.
    Data {
        t_ns: u64,
        dev: u64,
        ino: u64,
        index: u64,
        count: u64,
        from_storage: bool,
    },
    /// Pages of a block device's own mapping (filesystem metadata).
    Meta {
        t_ns: u64,
        device: u64,
        index: u64,
        count: u64,
    },
}

/// What the builder needs to know about a file it saw pages of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileInfo {
    pub path: Option<String>,
    pub id: FileId,
    /// Only regular files carry data worth prefetching.
    pub file_type: FileType,
}

/// Aggregates accesses into a [`Trace`]: pages become extents in
/// first-use order, consecutive pages coalesce, repeats are dropped.
#[derive(Debug, Default)]
pub struct TraceBuilder {
    accesses: Vec<Access>,
    ns_ops: Vec<NamespaceOp>,
    /// With `Some`, a used page joins the extent before it only if it was
    /// first used at most this long after that extent's last page.
    split_ns: Option<u64>,
}

impl TraceBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Keeps pages used at different times in different extents (more
    /// than `gap_ns` apart), so each extent's time is its pages' time.
    /// For measuring when a launch uses its data; plans are compiled
    /// from ordinary traces, whose contiguous pages make one extent
    /// placed at its first use.
    pub fn split_extents_after(mut self, gap_ns: u64) -> Self {
        self.split_ns = Some(gap_ns);
        self
    }

    pub fn push(&mut self, mut a: Access) {
        match &mut a {
            Access::Data { count, .. } | Access::Meta { count, .. } => {
                *count = (*count).min(MAX_ACCESS_PAGES)
            }
        }
        self.accesses.push(a);
    }

    pub fn push_ns(&mut self, op: NamespaceOp) {
        self.ns_ops.push(op);
    }

    /// The distinct files (dev, ino) with data accesses, in first-access order.
    pub fn files_seen(&self) -> Vec<(u64, u64)> {
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for a in &self.accesses {
            if let Access::Data { dev, ino, .. } = *a {
                if seen.insert((dev, ino)) {
                    out.push((dev, ino));
                }
            }
        }
        out
    }

    /// Builds the trace. `resolve` names each (dev, ino); files it returns
    /// `None` for, or non-regular files, are counted as unresolved and left out.
    pub fn finish(
        mut self,
        meta: TraceMeta,
        mut stats: TraceStats,
        mut resolve: impl FnMut(u64, u64) -> Option<FileInfo>,
    ) -> Trace {
        // Events from several CPUs arrive nearly, not exactly, in order.
        self.accesses.sort_by_key(|a| match *a {
            Access::Data { t_ns, .. } | Access::Meta { t_ns, .. } => t_ns,
        });
        let t0 = self
            .accesses
            .first()
            .map(|a| match *a {
                Access::Data { t_ns, .. } | Access::Meta { t_ns, .. } => t_ns,
            })
            .unwrap_or(0);
        let t0 = self
            .ns_ops
            .iter()
            .map(|o| o.t_ns)
            .min()
            .map_or(t0, |n| n.min(t0));

        // Pages that came from storage, per file: an insertion may follow
        // the use event of the same page (a fault is reported before the
        // read it triggers), so this is decided over the whole recording.
        let mut stored: HashMap<(u64, u64), BTreeSet<u64>> = HashMap::new();
        for a in &self.accesses {
            if let Access::Data {
                dev,
                ino,
                index,
                count,
                from_storage: true,
                ..
            } = *a
            {
                stored
                    .entry((dev, ino))
                    .or_default()
                    .extend(index..index.saturating_add(count));
            }
        }

        // A page is placed when the launch first *used* it (read it, mapped
        // it or faulted on it), not when it arrived: on a disk that reads
        // ahead megabytes at once, most of what arrives with a page the
        // launch needs is needed much later, or never. Pages it never used
        // (only read ahead by the kernel) are placed from NEVER_USED on, in
        // the order they arrived: a plan still reads them, last. One entry
        // per distinct page, so repeats cost no memory.
        let mut first_use: HashSet<(u64, u64, u64)> = HashSet::new();
        let mut placed: Vec<Access> = Vec::new();
        for a in &self.accesses {
            match *a {
                Access::Data {
                    t_ns,
                    dev,
                    ino,
                    index,
                    count,
                    from_storage: false,
                } => {
                    for p in index..index.saturating_add(count) {
                        if first_use.insert((dev, ino, p)) {
                            placed.push(page_access(t_ns, dev, ino, p));
                        }
                    }
                }
                Access::Data { .. } => {}
                meta @ Access::Meta { .. } => placed.push(meta),
            }
        }
        let mut unused: HashSet<(u64, u64, u64)> = HashSet::new();
        for a in &self.accesses {
            if let Access::Data {
                t_ns,
                dev,
                ino,
                index,
                count,
                from_storage: true,
            } = *a
            {
                for p in index..index.saturating_add(count) {
                    if !first_use.contains(&(dev, ino, p)) && unused.insert((dev, ino, p)) {
                        let t = NEVER_USED.saturating_add(t_ns.saturating_sub(t0));
                        placed.push(page_access(t, dev, ino, p));
                    }
                }
            }
        }
        drop((first_use, unused));
        // Stable: equal times keep their order.
        placed.sort_by_key(|a| match *a {
            Access::Data { t_ns, .. } | Access::Meta { t_ns, .. } => t_ns,
        });
        self.accesses = placed;
        // Times relative to the start; never-used ones stay as placed.
        let rel = |t: u64| {
            if t >= NEVER_USED {
                t
            } else {
                t.saturating_sub(t0)
            }
        };

        let mut order: Vec<(u64, u64)> = Vec::new();
        // Per file: its pages, its extents, and when the last page was used.
        type FilePages = (BTreeSet<u64>, Vec<Extent>, u64);
        let mut pages: HashMap<(u64, u64), FilePages> = HashMap::new();
        let mut meta_pages: BTreeSet<(u64, u64)> = BTreeSet::new();
        let mut metadata: Vec<MetaExtent> = Vec::new();
        for a in &self.accesses {
            match *a {
                Access::Data {
                    t_ns,
                    dev,
                    ino,
                    index,
                    count,
                    ..
                } => {
                    let entry = pages.entry((dev, ino)).or_insert_with(|| {
                        order.push((dev, ino));
                        Default::default()
                    });
                    let from = stored.get(&(dev, ino));
                    for p in index..index.saturating_add(count) {
                        if !entry.0.insert(p) {
                            continue;
                        }
                        let fs = from.is_some_and(|s| s.contains(&p));
                        let t = rel(t_ns);
                        let late = self
                            .split_ns
                            .is_some_and(|g| t < NEVER_USED && t.saturating_sub(entry.2) > g);
                        if late {
                            entry.1.push(Extent {
                                offset: p * PAGE_SIZE,
                                len: PAGE_SIZE,
                                t_ns: t,
                                from_storage: fs,
                            });
                        } else {
                            append(&mut entry.1, p, t, fs);
                        }
                        entry.2 = t;
                    }
                }
                Access::Meta {
                    t_ns,
                    device,
                    index,
                    count,
                } => {
                    for p in index..index.saturating_add(count) {
                        if !meta_pages.insert((device, p)) {
                            continue;
                        }
                        match metadata.last_mut() {
                            Some(m) if m.device == device && m.offset + m.len == p * PAGE_SIZE => {
                                m.len += PAGE_SIZE
                            }
                            _ => metadata.push(MetaExtent {
                                device,
                                offset: p * PAGE_SIZE,
                                len: PAGE_SIZE,
                                t_ns: rel(t_ns),
                            }),
                        }
                    }
                }
            }
        }

        let mut files = Vec::new();
        for key in order {
            let (set, extents, _) = pages.remove(&key).expect("every ordered key has pages");
            match resolve(key.0, key.1) {
                Some(info) if info.file_type == FileType::Regular => {
                    // A read() reports the pages it asked for, which run past
                    // the end of a small file read with a large buffer.
                    let eof = info.id.size.div_ceil(PAGE_SIZE) * PAGE_SIZE;
                    let extents: Vec<Extent> = extents
                        .into_iter()
                        .filter(|e| e.offset < eof)
                        .map(|e| Extent {
                            len: e.len.min(eof - e.offset),
                            ..e
                        })
                        .collect();
                    if extents.is_empty() {
                        continue;
                    }
                    files.push(FileTrace {
                        path: info.path,
                        id: info.id,
                        extents,
                    });
                }
                Some(_) => {} // directories etc.: their pages are not file data
                None => stats.pages_unresolved += set.len() as u64,
            }
        }

        let mut ns_ops = self.ns_ops;
        ns_ops.sort_by_key(|o| o.t_ns);
        for o in &mut ns_ops {
            o.t_ns -= t0;
        }
        // A repeated lookup of the same path with the same outcome costs
        // nothing the second time: keep the first.
        let mut seen_ops = BTreeSet::new();
        ns_ops.retain(|o| seen_ops.insert((o.kind as u8, o.path.clone(), o.result)));

        stats.bytes = files.iter().map(FileTrace::bytes).sum();
        stats.bytes_from_storage = files
            .iter()
            .flat_map(|f| &f.extents)
            .filter(|e| e.from_storage)
            .map(|e| e.len)
            .sum();
        stats.pages = stats.bytes / PAGE_SIZE;
        stats.metadata_bytes = metadata.iter().map(|m| m.len).sum();
        Trace {
            meta,
            files,
            metadata,
            namespace_ops: ns_ops,
            stats,
        }
    }
}

/// Extends the file's last extent with page `p` if it directly follows it,
/// came from the same place and is on the same side of [`NEVER_USED`] (a
/// page never used does not join a used one).
fn append(extents: &mut Vec<Extent>, p: u64, t_ns: u64, from_storage: bool) {
    let off = p * PAGE_SIZE;
    if let Some(last) = extents.last_mut() {
        if last.end() == off
            && last.from_storage == from_storage
            && (last.t_ns >= NEVER_USED) == (t_ns >= NEVER_USED)
        {
            last.len += PAGE_SIZE;
            return;
        }
    }
    extents.push(Extent {
        offset: off,
        len: PAGE_SIZE,
        t_ns,
        from_storage,
    });
}

/// One page of a file, used (or arriving) at `t_ns`.
fn page_access(t_ns: u64, dev: u64, ino: u64, index: u64) -> Access {
    Access::Data {
        t_ns,
        dev,
        ino,
        index,
        count: 1,
        from_storage: false,
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(crate) fn meta() -> TraceMeta {
        TraceMeta {
            command: vec!["app".into()],
            cwd: "/".into(),
            backend: Backend::Bpf,
            cache: CacheState::AsFound,
            end: EndReason::Exited,
            exit_code: Some(0),
            started_unix_ms: 0,
            hostname: "h".into(),
        }
    }

    pub(crate) fn data(t: u64, ino: u64, index: u64, count: u64, fs: bool) -> Access {
        Access::Data {
            t_ns: t,
            dev: 1,
            ino,
            index,
            count,
            from_storage: fs,
        }
    }

    pub(crate) fn resolve(dev: u64, ino: u64) -> Option<FileInfo> {
        (ino != 99).then(|| FileInfo {
            path: Some(format!("/f{ino}")),
            id: FileId {
                dev,
                ino,
                size: 1 << 20,
                ..Default::default()
            },
            file_type: if ino == 50 {
                FileType::Directory
            } else {
                FileType::Regular
            },
        })
    }

    /// (first page, pages, from storage) of each extent.
    type Shape = Vec<(u64, Vec<(u64, u64, bool)>)>;

    /// The extents of each file, in pages, files in order.
    fn shape(t: &Trace) -> Shape {
        t.files
            .iter()
            .map(|f| {
                (
                    f.id.ino,
                    f.extents
                        .iter()
                        .map(|e| (e.offset / PAGE_SIZE, e.len / PAGE_SIZE, e.from_storage))
                        .collect(),
                )
            })
            .collect()
    }

    #[test]
    fn aggregation_table() {
        let cases: Vec<(&str, Vec<Access>, Shape)> = vec![
            (
                "sequential pages coalesce",
                vec![data(1, 7, 0, 1, false), data(2, 7, 1, 2, false)],
                vec![(7, vec![(0, 3, false)])],
            ),
            (
                "repeats are dropped",
                vec![data(1, 7, 0, 2, false), data(2, 7, 0, 2, false)],
                vec![(7, vec![(0, 2, false)])],
            ),
            (
                "access order kept, not offset order",
                vec![data(1, 7, 10, 1, false), data(2, 7, 0, 1, false)],
                vec![(7, vec![(10, 1, false), (0, 1, false)])],
            ),
            (
                "files in first-touch order",
                vec![
                    data(1, 8, 0, 1, false),
                    data(2, 7, 0, 1, false),
                    data(3, 8, 1, 1, false),
                ],
                vec![(8, vec![(0, 2, false)]), (7, vec![(0, 1, false)])],
            ),
            (
                "insertion after use marks storage",
                vec![data(1, 7, 0, 2, false), data(2, 7, 0, 1, true)],
                vec![(7, vec![(0, 1, true), (1, 1, false)])],
            ),
            (
                "out-of-order timestamps are sorted",
                vec![data(5, 7, 1, 1, false), data(1, 7, 0, 1, false)],
                vec![(7, vec![(0, 2, false)])],
            ),
            (
                "pages are placed at their first use, read-ahead never used last",
                vec![
                    data(1, 7, 0, 4, true),
                    data(2, 7, 2, 1, false),
                    data(3, 7, 0, 1, false),
                    data(4, 8, 0, 1, false),
                ],
                vec![
                    (
                        7,
                        vec![(2, 1, true), (0, 1, true), (1, 1, true), (3, 1, true)],
                    ),
                    (8, vec![(0, 1, false)]),
                ],
            ),
            (
                "large folio counts",
                vec![data(1, 7, 16, 16, true)],
                vec![(7, vec![(16, 16, true)])],
            ),
            (
                "unresolved and directories left out",
                vec![
                    data(1, 99, 0, 3, false),
                    data(2, 50, 0, 1, false),
                    data(3, 7, 0, 1, false),
                ],
                vec![(7, vec![(0, 1, false)])],
            ),
        ];
        for (name, accesses, want) in cases {
            let mut b = TraceBuilder::new();
            accesses.into_iter().for_each(|a| b.push(a));
            let t = b.finish(meta(), TraceStats::default(), resolve);
            assert_eq!(shape(&t), want, "{name}");
        }
    }

    #[test]
    fn split_extents_keep_each_page_at_its_own_time() {
        // One file read page by page over 3 ms, then one page touched
        // together with the one before it (same event time).
        let accesses = || {
            vec![
                data(0, 7, 0, 1, false),
                data(1_000_000, 7, 1, 1, false),
                data(3_000_000, 7, 2, 2, false),
            ]
        };
        let times = |b: TraceBuilder| -> Vec<(u64, u64, u64)> {
            let mut b = b;
            accesses().into_iter().for_each(|a| b.push(a));
            let t = b.finish(meta(), TraceStats::default(), resolve);
            t.files[0]
                .extents
                .iter()
                .map(|e| (e.offset / PAGE_SIZE, e.len / PAGE_SIZE, e.t_ns))
                .collect()
        };
        // Ordinary traces: one extent at its first use.
        assert_eq!(times(TraceBuilder::new()), vec![(0, 4, 0)]);
        assert_eq!(
            times(TraceBuilder::new().split_extents_after(0)),
            vec![(0, 1, 0), (1, 1, 1_000_000), (2, 2, 3_000_000)]
        );
        // Within the gap, pages still join.
        assert_eq!(
            times(TraceBuilder::new().split_extents_after(1_500_000)),
            vec![(0, 2, 0), (2, 2, 3_000_000)]
        );
    }

    #[test]
    fn never_used_pages_are_marked_and_counts_are_capped() {
        let mut b = TraceBuilder::new();
        b.push(data(10, 7, 0, 3, true));
        b.push(data(20, 7, 1, 1, false));
        b.push(data(30, 8, 0, u64::MAX, false));
        let t = b.finish(meta(), TraceStats::default(), resolve);
        let times: Vec<(u64, u64, u64)> = t.files[0]
            .extents
            .iter()
            .map(|e| (e.offset / PAGE_SIZE, e.len / PAGE_SIZE, e.t_ns))
            .collect();
        // Page 1 used 10 ns after the start; pages 0 and 2 only arrived,
        // at 0 ns.
        assert_eq!(
            times,
            vec![(1, 1, 10), (0, 1, NEVER_USED), (2, 1, NEVER_USED)]
        );
        // A corrupt count is cut to MAX_ACCESS_PAGES instead of expanded
        // page by page; the file's size (1 MiB here) trims it further.
        assert_eq!(t.files[1].extents[0].len, 1 << 20);
    }

    #[test]
    fn stats_and_metadata() {
        let mut b = TraceBuilder::new();
        b.push(data(10, 99, 0, 3, false));
        b.push(data(11, 7, 0, 2, true));
        b.push(Access::Meta {
            t_ns: 12,
            device: 5,
            index: 100,
            count: 1,
        });
        b.push(Access::Meta {
            t_ns: 13,
            device: 5,
            index: 101,
            count: 1,
        });
        b.push(Access::Meta {
            t_ns: 14,
            device: 5,
            index: 100,
            count: 1,
        });
        b.push(Access::Meta {
            t_ns: 15,
            device: 5,
            index: 7,
            count: 1,
        });
        let t = b.finish(meta(), TraceStats::default(), resolve);
        assert_eq!(t.stats.pages_unresolved, 3);
        assert_eq!(t.stats.bytes, 2 * PAGE_SIZE);
        assert_eq!(t.stats.bytes_from_storage, 2 * PAGE_SIZE);
        let m: Vec<_> = t
            .metadata
            .iter()
            .map(|m| (m.offset / PAGE_SIZE, m.len / PAGE_SIZE, m.t_ns))
            .collect();
        assert_eq!(m, vec![(100, 2, 2), (7, 1, 5)]);
    }

    #[test]
    fn namespace_ops_dedup_and_rebase() {
        let mut b = TraceBuilder::new();
        b.push(data(100, 7, 0, 1, false));
        for (t, path, r) in [(50, "/a", -2), (60, "/a", -2), (70, "/a", 0)] {
            b.push_ns(NamespaceOp {
                t_ns: t,
                kind: NsOpKind::Stat,
                path: path.into(),
                result: r,
            });
        }
        let t = b.finish(meta(), TraceStats::default(), resolve);
        let ops: Vec<_> = t.namespace_ops.iter().map(|o| (o.t_ns, o.result)).collect();
        assert_eq!(ops, vec![(0, -2), (20, 0)]);
        assert_eq!(t.files[0].extents[0].t_ns, 50);
    }
}
