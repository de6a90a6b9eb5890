//! The trace model: one recorded launch, as the files, byte ranges,
//! metadata blocks and path lookups it needed, each in first-use order.
//!
//! A trace is built by [`TraceBuilder`] from already-classified accesses (the
//! recorder does the classification at the OS boundary), so everything here
//! is pure and unit-tested. Several traces of one launch can be intersected
//! or merged by the compile passes because files are keyed by identity
//! (dev, ino) and ranges are plain byte extents.

mod builder;

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::container::{self, FormatError, Kind};
use crate::limits::{self, within, Limit};

pub use builder::{Access, FileInfo, TraceBuilder};

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
    #[serde(deserialize_with = "limits::bounded_args")]
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
    #[serde(deserialize_with = "limits::bounded_entries")]
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
    #[serde(deserialize_with = "limits::bounded_files")]
    pub files: Vec<FileTrace>,
    #[serde(deserialize_with = "limits::bounded_entries")]
    pub metadata: Vec<MetaExtent>,
    #[serde(deserialize_with = "limits::bounded_lookups")]
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

    /// Invariants a decoded trace must hold: no file twice, no empty range,
    /// ranges within their file's size, and every count, length and sum
    /// within [`crate::limits`] (extents of all files and metadata extents
    /// count together as entries).
    pub fn check(&self) -> Result<(), FormatError> {
        let bad = |what: String| {
            Err(FormatError::Invalid {
                kind: Kind::Trace,
                what,
            })
        };
        let over = |e, at: String| Err(FormatError::too_large(Kind::Trace, e, at));
        let extents: usize = self.files.iter().map(|f| f.extents.len()).sum();
        let counts = [
            (Limit::Files, self.files.len(), "the file list"),
            (Limit::Lookups, self.namespace_ops.len(), "the lookup list"),
            (
                Limit::Entries,
                extents + self.metadata.len(),
                "the extent lists",
            ),
            (Limit::Args, self.meta.command.len(), "the command"),
        ];
        for (limit, n, at) in counts {
            if let Err(e) = within(limit, n as u64) {
                return over(e, at.into());
            }
        }
        let mut strings: u64 = self.meta.command.iter().map(|s| s.len() as u64).sum();
        strings += (self.meta.cwd.len() + self.meta.hostname.len()) as u64;
        let paths = self.files.iter().filter_map(|f| f.path.as_ref());
        for (i, p) in paths
            .chain(self.namespace_ops.iter().map(|o| &o.path))
            .enumerate()
        {
            if let Err(e) = within(Limit::PathLen, p.len() as u64) {
                return over(e, format!("path {i}"));
            }
            strings += p.len() as u64;
        }
        if let Err(e) = within(Limit::StringBytes, strings) {
            return over(e, "all its strings".into());
        }
        let mut ids = BTreeSet::new();
        let mut total = 0u64;
        for f in &self.files {
            if !ids.insert((f.id.dev, f.id.ino)) {
                return bad(format!(
                    "file dev {} ino {} appears twice",
                    f.id.dev, f.id.ino
                ));
            }
            let at = || format!("dev {} ino {}", f.id.dev, f.id.ino);
            if let Err(e) = within(Limit::FileSize, f.id.size) {
                return over(e, at());
            }
            let limit = crate::plan::range_limit(f.id.size);
            for e in &f.extents {
                if let Err(e) = within(Limit::Range, e.len) {
                    return over(e, at());
                }
                if e.len == 0 || e.offset.checked_add(e.len).is_none_or(|end| end > limit) {
                    return bad(format!(
                        "ino {} has {} bytes at {}, past its size of {}",
                        f.id.ino, e.len, e.offset, f.id.size
                    ));
                }
                total += e.len;
                if let Err(e) = within(Limit::TotalBytes, total) {
                    return over(e, "its extents".into());
                }
            }
        }
        for m in &self.metadata {
            if let Err(e) = within(Limit::Range, m.len) {
                return over(e, format!("device {}", m.device));
            }
            if m.len == 0 || m.offset.checked_add(m.len).is_none() {
                return bad(format!(
                    "{} bytes of metadata at {} of device {}",
                    m.len, m.offset, m.device
                ));
            }
            total += m.len;
            if let Err(e) = within(Limit::TotalBytes, total) {
                return over(e, "its extents".into());
            }
        }
        if self.meta.command.is_empty() {
            return bad("it names no command".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::builder::tests::{data, meta, resolve};
    use super::*;

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
