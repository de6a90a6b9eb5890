//! Traces written by hand and a readable schedule, shared by the passes'
//! tests.

pub(super) use super::*;
pub(super) use crate::plan::{Entry, Plan, PlanFile};
pub(super) use crate::trace::{
    Backend, CacheState, EndReason, Extent, FileId, FileTrace, MetaExtent, NamespaceOp, NsOpKind,
    Trace, TraceMeta, TraceStats, NEVER_USED, PAGE_SIZE,
};

pub(super) const P: u64 = PAGE_SIZE;

/// A trace written by hand, in pages and plain numbers.
pub(super) struct T(pub(super) Trace);

pub(super) fn t() -> T {
    T(Trace {
        meta: TraceMeta {
            command: vec!["app".into()],
            cwd: "/".into(),
            backend: Backend::Bpf,
            cache: CacheState::Cold,
            end: EndReason::Exited,
            exit_code: Some(0),
            started_unix_ms: 1_000,
            hostname: "h".into(),
        },
        files: Vec::new(),
        metadata: Vec::new(),
        namespace_ops: Vec::new(),
        stats: TraceStats::default(),
    })
}

impl T {
    /// File `path` (inode `ino`, size unknown) with `(page, pages, t)` extents.
    pub(super) fn file(self, path: &str, ino: u64, extents: &[(u64, u64, u64)]) -> T {
        self.file_sized(Some(path), ino, 0, extents)
    }

    pub(super) fn file_sized(
        mut self,
        path: Option<&str>,
        ino: u64,
        size: u64,
        extents: &[(u64, u64, u64)],
    ) -> T {
        self.0.files.push(FileTrace {
            path: path.map(str::to_owned),
            id: FileId {
                dev: 1,
                ino,
                size,
                ..Default::default()
            },
            extents: extents
                .iter()
                .map(|&(page, pages, t_ns)| Extent {
                    offset: page * P,
                    len: pages * P,
                    t_ns,
                    from_storage: true,
                })
                .collect(),
        });
        self
    }

    pub(super) fn meta(mut self, device: u64, page: u64, pages: u64, t_ns: u64) -> T {
        self.0.metadata.push(MetaExtent {
            device,
            offset: page * P,
            len: pages * P,
            t_ns,
        });
        self
    }

    pub(super) fn op(mut self, kind: NsOpKind, path: &str, result: i32, t_ns: u64) -> T {
        self.0.namespace_ops.push(NamespaceOp {
            t_ns,
            kind,
            path: path.into(),
            result,
        });
        self
    }

    pub(super) fn done(self) -> Trace {
        self.0
    }
}

/// Every pass neutral: what is left is combine and scheduling by time.
/// [`plain`] with the default range merge.
pub(super) fn merging() -> CompileOptions {
    CompileOptions {
        merge_gap: DEFAULT_MERGE_GAP,
        merge_distance: DEFAULT_MERGE_DISTANCE,
        ..plain()
    }
}

pub(super) fn plain() -> CompileOptions {
    CompileOptions {
        min_traces: None,
        merge_gap: 0,
        merge_distance: 0,
        metadata_shift: 0,
        sorted: false,
        min_launch_bytes: 0,
        exclude_paths: Vec::new(),
        lookups: true,
        unused: true,
    }
}

pub(super) fn no_physical(_: &PlanFile, _: u64) -> Option<u64> {
    None
}

pub(super) fn run(traces: &[Trace], opts: &CompileOptions) -> Compiled {
    let c = compile(traces, opts, &no_physical).expect("compiles");
    c.plan.check().expect("a valid plan");
    c
}

/// The schedule, readable: `/a 0+2` (pages), `meta8:100+1`, `open /a`.
pub(super) fn show(p: &Plan) -> Vec<String> {
    p.entries
        .iter()
        .map(|e| match *e {
            Entry::Data { file, offset, len } => {
                format!("{} {}+{}", p.files[file as usize].path, offset / P, len / P)
            }
            Entry::Meta {
                device,
                offset,
                len,
            } => format!("meta{device}:{}+{}", offset / P, len / P),
            Entry::Lookup { index } => {
                let l = &p.lookups[index as usize];
                format!("{} {}", l.kind.name(), l.path)
            }
        })
        .collect()
}

pub(super) fn three_traces() -> Vec<Trace> {
    vec![
        t().file("/a", 1, &[(0, 4, 10)])
            .file("/b", 2, &[(0, 1, 20)])
            .meta(8, 100, 2, 2)
            .done(),
        t().file("/a", 1, &[(2, 4, 5)])
            .file("/c", 3, &[(0, 1, 1)])
            .meta(8, 101, 2, 3)
            .done(),
        t().file("/a", 1, &[(0, 2, 30), (3, 1, 31)])
            .file("/b", 2, &[(0, 1, 40)])
            .meta(8, 101, 1, 50)
            .done(),
    ]
}
