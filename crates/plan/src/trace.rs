//! The trace model: one recorded launch, as the files, byte ranges,
//! metadata blocks and path lookups it needed, each in first-use order.
//!
//! A trace is built by [`TraceBuilder`] from already-classified accesses (the
//! recorder does the classification at the OS boundary), so everything here
//! is pure and unit-tested. Several traces of one launch can be intersected
//! or merged by the compile passes because files are keyed by identity
//! (dev, ino) and ranges are plain byte extents.

use std::collections::{BTreeSet, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::container::{self, FormatError, Kind};

/// Page size assumed for page indexes in events.
pub const PAGE_SIZE: u64 = 4096;

/// Trace file format version. Bump the major on incompatible changes.
pub const TRACE_MAJOR: u16 = 1;
/// 1: extents are placed at their first use, and extents never used carry
/// times from [`NEVER_USED`] on (readers of 1.0 read them unchanged).
pub const TRACE_MINOR: u16 = 1;

/// Extent times from this value on mark pages the launch never used (the
/// kernel read them ahead): `t_ns - NEVER_USED` is when they arrived. Far
/// beyond any recording's length, so they sort after every used page.
pub const NEVER_USED: u64 = 1 << 62;

/// The most pages one access may cover: a page count beyond this (2 GiB) is
/// a corrupt event, and is cut rather than expanded page by page.
pub const MAX_ACCESS_PAGES: u64 = 1 << 19;

/// How the events were obtained, which says how far they can be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Backend {
    /// eBPF on tracepoints: ordered, complete, with namespace operations.
    Bpf,
    /// Tracefs text events: ordered, page events and process tree only.
    Tracefs,
    /// A residency snapshot of the files the tree had open or mapped:
    /// unordered and approximate (pages cached before the launch count too).
    Mincore,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Bpf => "bpf",
            Backend::Tracefs => "tracefs",
            Backend::Mincore => "mincore",
        }
    }
}

/// The cache state the launch was recorded from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CacheState {
    /// The launch's files were evicted first.
    Cold,
    /// Nothing was evicted; whatever was cached stayed cached.
    AsFound,
}

/// Why recording stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EndReason {
    /// Every process of the tree exited.
    Exited,
    /// No I/O for the idle period (FAST's T_idle).
    Idle,
    /// The time limit (FAST's T_timeout).
    Timeout,
    /// Interrupted by the user.
    Interrupted,
}

/// What was recorded and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceMeta {
    pub command: Vec<String>,
    pub cwd: String,
    pub backend: Backend,
    pub cache: CacheState,
    pub end: EndReason,
    /// Exit status of the launched command, if it exited while recording.
    pub exit_code: Option<i32>,
    /// Wall-clock start, milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
    pub hostname: String,
}

/// A file's identity: enough to tell whether it changed since recording.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct FileId {
    /// Device, as `st_dev` reports it.
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

/// The type of a namespace entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileType {
    Regular,
    Directory,
    Symlink,
    Other,
}

impl FileType {
    /// From `st_mode` / `i_mode`.
    pub fn from_mode(mode: u32) -> FileType {
        match mode & 0o170000 {
            0o100000 => FileType::Regular,
            0o040000 => FileType::Directory,
            0o120000 => FileType::Symlink,
            _ => FileType::Other,
        }
    }
}

/// A run of bytes of one file, first used at `t_ns` after the start; from
/// [`NEVER_USED`] on, never used (read ahead by the kernel), arriving at
/// `t_ns - NEVER_USED`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Extent {
    pub offset: u64,
    pub len: u64,
    pub t_ns: u64,
    /// Whether these pages were read from storage during the recording (as
    /// opposed to found cached).
    pub from_storage: bool,
}

impl Extent {
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// One file the launch read from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileTrace {
    /// Absolute path, if it could be resolved.
    pub path: Option<String>,
    pub id: FileId,
    /// Ranges in first-use order (not sorted by offset); ranges never used
    /// (read ahead by the kernel only) last, in arrival order.
    pub extents: Vec<Extent>,
}

impl FileTrace {
    pub fn bytes(&self) -> u64 {
        self.extents.iter().map(|e| e.len).sum()
    }

    pub fn first_ns(&self) -> u64 {
        self.extents.first().map_or(0, |e| e.t_ns)
    }
}

/// Filesystem metadata read from a block device's own page cache (inode
/// tables, directory blocks, extent trees).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaExtent {
    /// The block device, as a `st_rdev`-style device number.
    pub device: u64,
    pub offset: u64,
    pub len: u64,
    pub t_ns: u64,
}

/// A path lookup that costs I/O on a cold start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NsOpKind {
    Exec,
    Open,
    Stat,
    Access,
    Readlink,
    DirRead,
}

impl NsOpKind {
    pub fn name(self) -> &'static str {
        match self {
            NsOpKind::Exec => "exec",
            NsOpKind::Open => "open",
            NsOpKind::Stat => "stat",
            NsOpKind::Access => "access",
            NsOpKind::Readlink => "readlink",
            NsOpKind::DirRead => "readdir",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NamespaceOp {
    pub t_ns: u64,
    pub kind: NsOpKind,
    pub path: String,
    /// 0 on success, -errno on failure (a negative lookup).
    pub result: i32,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TraceStats {
    /// Kernel events received.
    pub events: u64,
    /// Events the kernel dropped (ring buffer full). Must be zero.
    pub drops: u64,
    pub duration_ns: u64,
    /// File data bytes touched.
    pub bytes: u64,
    /// Of those, bytes read from storage during the recording.
    pub bytes_from_storage: u64,
    pub metadata_bytes: u64,
    /// Data pages whose file could not be named.
    pub pages_unresolved: u64,
    pub pages: u64,
    /// Processes in the traced tree.
    pub processes: u64,
}

/// One recorded launch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trace {
    pub meta: TraceMeta,
    /// Files in order of first access.
    pub files: Vec<FileTrace>,
    pub metadata: Vec<MetaExtent>,
    pub namespace_ops: Vec<NamespaceOp>,
    pub stats: TraceStats,
}

impl Trace {
    pub fn to_bytes(&self) -> Vec<u8> {
        container::encode(Kind::Trace, TRACE_MAJOR, TRACE_MINOR, self)
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Trace, FormatError> {
        let t: Trace = container::decode(Kind::Trace, TRACE_MAJOR, bytes)?;
        t.check()?;
        Ok(t)
    }

    /// Invariants a decoded trace must hold.
    pub fn check(&self) -> Result<(), FormatError> {
        let bad = |what: String| {
            Err(FormatError::Invalid {
                kind: Kind::Trace,
                what,
            })
        };
        let mut ids = BTreeSet::new();
        for f in &self.files {
            if !ids.insert((f.id.dev, f.id.ino)) {
                return bad(format!(
                    "file dev {} ino {} appears twice",
                    f.id.dev, f.id.ino
                ));
            }
            let limit = crate::plan::range_limit(f.id.size);
            for e in &f.extents {
                if e.len == 0 || e.offset.checked_add(e.len).is_none_or(|end| end > limit) {
                    return bad(format!(
                        "ino {} has {} bytes at {}, past its size of {}",
                        f.id.ino, e.len, e.offset, f.id.size
                    ));
                }
            }
        }
        for m in &self.metadata {
            if m.len == 0
                || m.len > crate::plan::MAX_META_RANGE
                || m.offset.checked_add(m.len).is_none()
            {
                return bad(format!(
                    "{} bytes of metadata at {} of device {}",
                    m.len, m.offset, m.device
                ));
            }
        }
        if self.meta.command.is_empty() {
            return bad("it names no command".into());
        }
        Ok(())
    }
}

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

/// Appends page `p` to a file's extents, extending the last extent when the
/// page directly follows it with the same origin.
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
mod tests {
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

    fn data(t: u64, ino: u64, index: u64, count: u64, fs: bool) -> Access {
        Access::Data {
            t_ns: t,
            dev: 1,
            ino,
            index,
            count,
            from_storage: fs,
        }
    }

    fn resolve(dev: u64, ino: u64) -> Option<FileInfo> {
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

    #[test]
    fn trace_round_trip() {
        let mut b = TraceBuilder::new();
        b.push(data(1, 7, 0, 4, true));
        b.push_ns(NamespaceOp {
            t_ns: 1,
            kind: NsOpKind::Open,
            path: "/f7".into(),
            result: 0,
        });
        let t = b.finish(
            meta(),
            TraceStats {
                events: 2,
                ..Default::default()
            },
            resolve,
        );
        let back = Trace::from_bytes(&t.to_bytes()).unwrap();
        assert_eq!(back, t);
    }

    #[test]
    fn duplicate_files_rejected() {
        let mut b = TraceBuilder::new();
        b.push(data(1, 7, 0, 1, true));
        let mut t = b.finish(meta(), TraceStats::default(), resolve);
        t.files.push(t.files[0].clone());
        let err = Trace::from_bytes(&t.to_bytes()).unwrap_err().to_string();
        assert!(err.contains("appears twice"), "{err}");
    }
}
