//! The plan: what replay executes. A file table (paths with the identities
//! they had when recorded) and one ordered schedule of entries: path lookups,
//! metadata blocks on a device, and data ranges of files. Compiled from one
//! or more traces by [`crate::compile`].

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::container::{self, FormatError, Kind};
use crate::limits::{self, within, Limit};
use crate::trace::{FileId, NsOpKind};

/// Plan file format version. Bump the major on incompatible changes
/// (2: the payload is deflated).
pub const PLAN_MAJOR: u16 = 2;
pub const PLAN_MINOR: u16 = 0;

/// How the plan was made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanMeta {
    #[serde(deserialize_with = "limits::bounded_args")]
    pub command: Vec<String>,
    pub created_unix_ms: u64,
    /// Number of traces it was compiled from.
    pub traces: u32,
    /// An access was kept if it appeared in at least this many traces.
    pub min_traces: u32,
    /// The passes applied, in order, with their parameters (human-readable).
    #[serde(deserialize_with = "limits::bounded_args")]
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
    #[serde(deserialize_with = "limits::bounded_files")]
    pub files: Vec<PlanFile>,
    #[serde(deserialize_with = "limits::bounded_lookups")]
    pub lookups: Vec<Lookup>,
    /// The schedule, in the order replay issues it.
    #[serde(deserialize_with = "limits::bounded_entries")]
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
pub const MAX_META_RANGE: u64 = limits::MAX_RANGE;

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
    /// data ranges inside their file's recorded size, and every count,
    /// length and sum within [`crate::limits`]; no file listed twice. A
    /// plan that breaks them is corrupt or forged; replaying it could read
    /// the wrong bytes or never end.
    pub fn check(&self) -> Result<(), FormatError> {
        let bad = |what: String| {
            Err(FormatError::Invalid {
                kind: Kind::Plan,
                what,
            })
        };
        let over = |e, at: String| Err(FormatError::too_large(Kind::Plan, e, at));
        let counts = [
            (Limit::Files, self.files.len(), "the file table"),
            (Limit::Lookups, self.lookups.len(), "the lookup table"),
            (Limit::Entries, self.entries.len(), "the schedule"),
            (Limit::Args, self.meta.command.len(), "the command"),
            (Limit::Args, self.meta.passes.len(), "the pass list"),
        ];
        for (limit, n, at) in counts {
            if let Err(e) = within(limit, n as u64) {
                return over(e, at.into());
            }
        }
        let mut strings = 0u64;
        for s in self.meta.command.iter().chain(&self.meta.passes) {
            strings += s.len() as u64;
        }
        let paths = self.files.iter().map(|f| &f.path);
        for (i, p) in paths
            .chain(self.lookups.iter().map(|l| &l.path))
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
        for f in &self.files {
            if let Err(e) = within(Limit::FileSize, f.id.size) {
                return over(e, f.path.clone());
            }
            if !ids.insert((f.id.dev, f.id.ino)) {
                return bad(format!("{} is listed twice", f.path));
            }
        }
        let mut total = 0u64;
        for (i, e) in self.entries.iter().enumerate() {
            match *e {
                Entry::Data { file, offset, len } => {
                    if file as usize >= self.files.len() {
                        return bad(format!(
                            "entry {i} names file {file} of {}",
                            self.files.len()
                        ));
                    }
                    if let Err(e) = within(Limit::Range, len) {
                        return over(e, format!("entry {i}"));
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
                    total += len;
                }
                Entry::Meta { offset, len, .. } => {
                    if let Err(e) = within(Limit::Range, len) {
                        return over(e, format!("entry {i}"));
                    }
                    if len == 0 || offset.checked_add(len).is_none() {
                        return bad(format!(
                            "entry {i} reads {len} bytes of metadata at {offset}"
                        ));
                    }
                    total += len;
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
            // Cannot overflow: at most 2^22 entries of at most 2^40 bytes.
            if let Err(e) = within(Limit::TotalBytes, total) {
                return over(e, format!("the schedule up to entry {i}"));
            }
        }
        Ok(())
    }

    /// About how many bytes the plan occupies in memory once decoded: its
    /// structures, tables and strings (allocator overhead left out). It
    /// only grows with what the plan holds, so a cache can account plans
    /// by it; a plan within [`crate::limits`] stays under a few hundred MiB.
    pub fn decoded_size(&self) -> u64 {
        use std::mem::size_of;
        let strings = |v: &[String]| {
            v.iter()
                .map(|s| (size_of::<String>() + s.len()) as u64)
                .sum::<u64>()
        };
        size_of::<Plan>() as u64
            + strings(&self.meta.command)
            + strings(&self.meta.passes)
            + self
                .files
                .iter()
                .map(|f| (size_of::<PlanFile>() + f.path.len()) as u64)
                .sum::<u64>()
            + self
                .lookups
                .iter()
                .map(|l| (size_of::<Lookup>() + l.path.len()) as u64)
                .sum::<u64>()
            + (self.entries.len() * size_of::<Entry>()) as u64
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
    use crate::limits;

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

    fn limit_of(p: &Plan) -> Option<(Limit, u64)> {
        match p.check() {
            Err(FormatError::TooLarge { limit, value, .. }) => Some((limit, value)),
            _ => None,
        }
    }

    #[test]
    fn limits_table() {
        let d = |offset, len| Entry::Data {
            file: 0,
            offset,
            len,
        };
        let m = |len| Entry::Meta {
            device: 1,
            offset: 0,
            len,
        };
        let long = "/".repeat(limits::MAX_PATH_LEN as usize + 1);
        type Case<'a> = (
            &'static str,
            Box<dyn Fn(&mut Plan) + 'a>,
            Option<(Limit, u64)>,
        );
        let cases: Vec<Case> = vec![
            ("within every limit", Box::new(|_| {}), None),
            (
                // The forged plan of a u64::MAX-byte file with a 2^62-byte
                // entry: its size is not a file's.
                "file of u64::MAX bytes",
                Box::new(|p| {
                    p.files[0].id.size = u64::MAX;
                    p.entries = vec![d(0, 1 << 62)];
                }),
                Some((Limit::FileSize, u64::MAX)),
            ),
            (
                "one range past the limit",
                Box::new(|p| {
                    p.files[0].id.size = 1 << 41;
                    p.entries = vec![d(0, limits::MAX_RANGE + 1)];
                }),
                Some((Limit::Range, limits::MAX_RANGE + 1)),
            ),
            (
                "ranges summing past the limit",
                Box::new(|p| p.entries = vec![m(limits::MAX_RANGE); 2]),
                Some((Limit::TotalBytes, 2 * limits::MAX_RANGE)),
            ),
            (
                "a path too long",
                Box::new(move |p| p.files[0].path = long.clone()),
                Some((Limit::PathLen, limits::MAX_PATH_LEN + 1)),
            ),
            (
                "too many entries",
                Box::new(|p| p.entries = vec![m(1); limits::MAX_ENTRIES as usize + 1]),
                Some((Limit::Entries, limits::MAX_ENTRIES + 1)),
            ),
            (
                "too many lookups",
                Box::new(|p| {
                    p.lookups = vec![
                        Lookup {
                            kind: NsOpKind::Stat,
                            path: "/".into()
                        };
                        limits::MAX_LOOKUPS as usize + 1
                    ]
                }),
                Some((Limit::Lookups, limits::MAX_LOOKUPS + 1)),
            ),
            (
                "strings too long together",
                Box::new(|p| {
                    p.meta.command = vec!["x".repeat(1 << 20); 65];
                }),
                Some((Limit::StringBytes, (65 << 20) + "/x".len() as u64)),
            ),
        ];
        for (name, edit, want) in cases {
            let mut p = plan(1 << 20, vec![d(0, 4096)]);
            edit(&mut p);
            assert_eq!(limit_of(&p), want, "{name}: {:?}", p.check());
        }
    }

    #[test]
    fn forged_counts_stop_the_decoder_at_the_limit() {
        // More files than allowed, really present in the payload: decoding
        // stops at the limit instead of building the whole table.
        let mut p = plan(1, Vec::new());
        let f = p.files[0].clone();
        p.files = vec![f; limits::MAX_FILES as usize + 1];
        let err = Plan::from_bytes(&p.to_bytes()).unwrap_err();
        assert!(
            matches!(
                err,
                FormatError::TooLarge {
                    limit: Limit::Files,
                    value,
                    ..
                } if value == limits::MAX_FILES + 1
            ),
            "{err}"
        );
        assert!(err.to_string().contains("files"), "{err}");
    }

    #[test]
    fn decoded_size_grows_with_content() {
        let mut p = plan(1 << 20, vec![Entry::Lookup { index: 0 }; 0]);
        let mut last = p.decoded_size();
        type Edit = Box<dyn Fn(&mut Plan)>;
        let mut grow: Vec<Edit> = vec![
            Box::new(|p| p.files[0].path.push_str("/longer")),
            Box::new(|p| {
                p.entries.push(Entry::Data {
                    file: 0,
                    offset: 0,
                    len: 1,
                })
            }),
            Box::new(|p| {
                p.lookups.push(Lookup {
                    kind: NsOpKind::Open,
                    path: "/etc/x".into(),
                })
            }),
            Box::new(|p| p.meta.command.push("--arg".into())),
        ];
        for g in grow.drain(..) {
            g(&mut p);
            let now = p.decoded_size();
            assert!(now > last, "{now} <= {last}");
            last = now;
        }
        // A plan at the entry limit accounts for its schedule.
        let mut big = plan(0, Vec::new());
        big.entries = vec![
            Entry::Meta {
                device: 1,
                offset: 0,
                len: 1
            };
            1 << 20
        ];
        assert!(big.decoded_size() >= (1 << 20) * 24);
    }
}
