//! The plan: what replay executes. A file table (paths with the identities
//! they had when recorded) and one ordered schedule of entries: path lookups,
//! metadata blocks on a device, and data ranges of files. Compiled from one
//! or more traces by [`crate::compile`].

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::container::{self, FormatError, Kind};
use crate::trace::{FileId, NsOpKind};

/// Plan file format version. Bump the major on incompatible changes
/// (2: the payload is deflated).
pub const PLAN_MAJOR: u16 = 2;
pub const PLAN_MINOR: u16 = 0;

/// How the plan was made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanMeta {
    pub command: Vec<String>,
    pub created_unix_ms: u64,
    /// Number of traces it was compiled from.
    pub traces: u32,
    /// An access was kept if it appeared in at least this many traces.
    pub min_traces: u32,
    /// The passes applied, in order, with their parameters (human-readable).
    pub passes: Vec<String>,
    /// Whether the schedule is in physical (LBA) order, for rotational disks.
    pub sorted: bool,
}

/// One file the plan reads, with the identity it had when recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanFile {
    pub path: String,
    pub id: FileId,
}

/// One step of the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Entry {
    /// Bytes `offset .. offset+len` of `files[file]`.
    Data { file: u32, offset: u64, len: u64 },
    /// Bytes of block device `device` (`st_rdev` numbering): fs metadata.
    Meta { device: u64, offset: u64, len: u64 },
    /// A path lookup (`lookups[index]`) to warm the dentry/inode caches.
    Lookup { index: u32 },
}

/// A path lookup to repeat at replay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lookup {
    pub kind: NsOpKind,
    pub path: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub meta: PlanMeta,
    pub files: Vec<PlanFile>,
    pub lookups: Vec<Lookup>,
    /// The schedule, in the order replay issues it.
    pub entries: Vec<Entry>,
}

/// Data ranges may end this far past their file's size, rounded up: a
/// page-cache folio is at most this large.
const FILE_SLACK: u64 = 2 << 20;

/// Where data ranges of a file whose size was not known (0) must end.
const UNKNOWN_SIZE_LIMIT: u64 = 64 << 30;

/// Where a data range of a file of `size` bytes must end: its last page,
/// generously rounded up; `size` 0 means the size was not known.
pub(crate) fn range_limit(size: u64) -> u64 {
    match size {
        0 => UNKNOWN_SIZE_LIMIT,
        _ => size.div_ceil(FILE_SLACK).saturating_mul(FILE_SLACK),
    }
}

/// The largest metadata range a plan or trace may hold: far beyond a
/// launch's metadata (a few MiB), and beyond a launch that reads a raw
/// block device (`dd if=/dev/sdX` is recorded as metadata), but small
/// enough that replaying a forged one cannot take long.
pub const MAX_META_RANGE: u64 = 1 << 40;

impl Plan {
    pub fn to_bytes(&self) -> Vec<u8> {
        container::encode_deflated(Kind::Plan, PLAN_MAJOR, PLAN_MINOR, self)
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Plan, FormatError> {
        let p: Plan = container::decode_deflated(Kind::Plan, PLAN_MAJOR, bytes)?;
        p.check()?;
        Ok(p)
    }

    /// Invariants: every index points into its table, no empty extents,
    /// data ranges inside their file's recorded size, metadata ranges of a
    /// sane size, no file listed twice. A plan that breaks them is corrupt
    /// or forged; replaying it could read the wrong bytes or never end.
    pub fn check(&self) -> Result<(), FormatError> {
        let bad = |what: String| {
            Err(FormatError::Invalid {
                kind: Kind::Plan,
                what,
            })
        };
        let mut ids = BTreeSet::new();
        for f in &self.files {
            if !ids.insert((f.id.dev, f.id.ino)) {
                return bad(format!("{} is listed twice", f.path));
            }
        }
        for (i, e) in self.entries.iter().enumerate() {
            match *e {
                Entry::Data { file, offset, len } => {
                    if file as usize >= self.files.len() {
                        return bad(format!(
                            "entry {i} names file {file} of {}",
                            self.files.len()
                        ));
                    }
                    // A range may end in the file's last page, rounded
                    // up generously; beyond it is not the recorded file.
                    let size = self.files[file as usize].id.size;
                    if len == 0
                        || offset
                            .checked_add(len)
                            .is_none_or(|end| end > range_limit(size))
                    {
                        return bad(format!(
                            "entry {i} reads {len} bytes at {offset} of {}, a file of {size} bytes",
                            self.files[file as usize].path
                        ));
                    }
                }
                Entry::Meta { offset, len, .. } => {
                    if len == 0 || len > MAX_META_RANGE || offset.checked_add(len).is_none() {
                        return bad(format!(
                            "entry {i} reads {len} bytes of metadata at {offset}"
                        ));
                    }
                }
                Entry::Lookup { index } => {
                    if index as usize >= self.lookups.len() {
                        return bad(format!(
                            "entry {i} names lookup {index} of {}",
                            self.lookups.len()
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// File data bytes the plan reads.
    pub fn data_bytes(&self) -> u64 {
        self.entries
            .iter()
            .map(|e| match e {
                Entry::Data { len, .. } => *len,
                _ => 0,
            })
            .fold(0, u64::saturating_add)
    }

    /// Metadata bytes the plan reads.
    pub fn meta_bytes(&self) -> u64 {
        self.entries
            .iter()
            .map(|e| match e {
                Entry::Meta { len, .. } => *len,
                _ => 0,
            })
            .fold(0, u64::saturating_add)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(size: u64, entries: Vec<Entry>) -> Plan {
        Plan {
            meta: PlanMeta {
                command: vec!["x".into()],
                created_unix_ms: 0,
                traces: 1,
                min_traces: 1,
                passes: Vec::new(),
                sorted: false,
            },
            files: vec![PlanFile {
                path: "/x".into(),
                id: FileId {
                    dev: 1,
                    ino: 2,
                    size,
                    mtime_ns: 0,
                    ctime_ns: 0,
                },
            }],
            lookups: Vec::new(),
            entries,
        }
    }

    #[test]
    fn ranges_must_fit_their_file_and_sums_saturate() {
        let d = |offset, len| Entry::Data {
            file: 0,
            offset,
            len,
        };
        let m = |offset, len| Entry::Meta {
            device: 1,
            offset,
            len,
        };
        // (name, file size, entries, valid)
        let cases = [
            ("whole file", 10_000, vec![d(0, 12_288)], true),
            ("last page rounded up", 10_000, vec![d(8192, 4096)], true),
            ("past the file", 10_000, vec![d(0, 8 << 20)], false),
            (
                "near the end of u64",
                1 << 20,
                vec![d(u64::MAX - 8191, 4096)],
                false,
            ),
            ("a huge length", 1 << 20, vec![d(0, 1 << 62)], false),
            ("empty", 1 << 20, vec![d(0, 0)], false),
            ("size unknown", 0, vec![d(1 << 30, 1 << 20)], true),
            ("size unknown, huge", 0, vec![d(0, 1 << 62)], false),
            ("metadata", 0, vec![m(1 << 40, 1 << 20)], true),
            ("huge metadata", 0, vec![m(0, 1 << 50)], false),
            ("overflowing metadata", 0, vec![m(u64::MAX, 4096)], false),
        ];
        for (name, size, entries, valid) in cases {
            assert_eq!(plan(size, entries).check().is_ok(), valid, "{name}");
        }
        let p = plan(0, vec![m(0, MAX_META_RANGE); 3]);
        assert_eq!(p.meta_bytes(), 3 * MAX_META_RANGE);
        let mut p = plan(0, Vec::new());
        p.entries = vec![m(0, u64::MAX / 2 + 1); 3];
        assert_eq!(p.meta_bytes(), u64::MAX, "saturates instead of wrapping");
    }
}
