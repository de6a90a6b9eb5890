//! The traces regrouped by what they touched: files by path, metadata by
//! device, lookups deduplicated; the shapes the passes work on.

use std::collections::HashMap;

use crate::trace::{FileId, NsOpKind, Trace, PAGE_SIZE};

use super::report::CompileReport;

/// Whether a lookup is a plain path walk (as opposed to reading a symlink's
/// target or a directory's entries).
pub(super) fn is_walk(kind: NsOpKind) -> bool {
    matches!(
        kind,
        NsOpKind::Exec | NsOpKind::Open | NsOpKind::Stat | NsOpKind::Access
    )
}

/// A range of one file or device as one trace saw it, page-aligned.
#[derive(Debug, Clone, Copy)]
pub(super) struct Span {
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) t: u64,
    pub(super) trace: u32,
}

impl Span {
    pub(super) fn new(offset: u64, len: u64, t: u64, trace: usize) -> Span {
        Span {
            start: offset / PAGE_SIZE * PAGE_SIZE,
            end: offset
                .saturating_add(len)
                .div_ceil(PAGE_SIZE)
                .saturating_mul(PAGE_SIZE),
            t,
            trace: trace as u32,
        }
    }
}

/// A range to read: of file slot `key` for data, of device slot `key` for
/// metadata; first needed at `t` nanoseconds into the launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Run {
    pub(super) key: u32,
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) t: u64,
}

impl Run {
    pub(super) fn len(&self) -> u64 {
        self.end - self.start
    }
}

pub(super) fn bytes(runs: &[Run]) -> u64 {
    runs.iter().map(Run::len).sum()
}

/// A file seen in any trace, by path.
pub(super) struct FileSlot {
    pub(super) path: String,
    /// From the newest trace that has the path.
    pub(super) id: FileId,
    pub(super) newest: usize,
    pub(super) spans: Vec<Span>,
}

/// A lookup seen in any trace, deduplicated.
pub(super) struct LookupSlot {
    pub(super) kind: NsOpKind,
    pub(super) path: String,
    pub(super) t: u64,
    pub(super) traces: u32,
    pub(super) last_trace: usize,
}

/// The traces regrouped by what they touched.
pub(super) struct Input {
    pub(super) files: Vec<FileSlot>,
    pub(super) devices: Vec<(u64, Vec<Span>)>,
    pub(super) lookups: Vec<LookupSlot>,
}

impl Input {
    pub(super) fn gather(traces: &[Trace], report: &mut CompileReport) -> Input {
        let mut files: Vec<FileSlot> = Vec::new();
        let mut file_index: HashMap<&str, usize> = HashMap::new();
        let mut devices: Vec<(u64, Vec<Span>)> = Vec::new();
        let mut device_index: HashMap<u64, usize> = HashMap::new();
        let mut lookups: Vec<LookupSlot> = Vec::new();
        let mut lookup_index: HashMap<(u8, &str), usize> = HashMap::new();
        for (ti, t) in traces.iter().enumerate() {
            for f in &t.files {
                let Some(path) = f.path.as_deref() else {
                    report.files_unnamed += 1;
                    report.bytes_unnamed += f.bytes();
                    continue;
                };
                let i = *file_index.entry(path).or_insert_with(|| {
                    files.push(FileSlot {
                        path: path.to_owned(),
                        id: f.id,
                        newest: ti,
                        spans: Vec::new(),
                    });
                    files.len() - 1
                });
                files[i].id = f.id;
                files[i].newest = ti;
                files[i].spans.extend(
                    f.extents
                        .iter()
                        .filter(|e| e.len > 0)
                        .map(|e| Span::new(e.offset, e.len, e.t_ns, ti)),
                );
            }
            for m in t.metadata.iter().filter(|m| m.len > 0) {
                let i = *device_index.entry(m.device).or_insert_with(|| {
                    devices.push((m.device, Vec::new()));
                    devices.len() - 1
                });
                devices[i].1.push(Span::new(m.offset, m.len, m.t_ns, ti));
            }
            for op in &t.namespace_ops {
                // Exec, open, stat and access of a path cost the same path
                // walk and inode read: one lookup stands for all of them.
                let class = match op.kind {
                    k if is_walk(k) => 0,
                    NsOpKind::Readlink => 1,
                    _ => 2,
                };
                let i = *lookup_index
                    .entry((class, op.path.as_str()))
                    .or_insert_with(|| {
                        lookups.push(LookupSlot {
                            kind: op.kind,
                            path: op.path.clone(),
                            t: op.t_ns,
                            traces: 0,
                            last_trace: usize::MAX,
                        });
                        lookups.len() - 1
                    });
                let l = &mut lookups[i];
                if op.t_ns < l.t {
                    l.t = op.t_ns;
                    l.kind = op.kind;
                }
                if l.last_trace != ti {
                    l.last_trace = ti;
                    l.traces += 1;
                }
            }
        }
        Input {
            files,
            devices,
            lookups,
        }
    }
}
