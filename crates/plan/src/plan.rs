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
    /// no file listed twice.
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
                    if len == 0 || offset.checked_add(len).is_none() {
                        return bad(format!("entry {i} has an empty or overflowing range"));
                    }
                }
                Entry::Meta { offset, len, .. } => {
                    if len == 0 || offset.checked_add(len).is_none() {
                        return bad(format!("entry {i} has an empty or overflowing range"));
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
            .sum()
    }

    /// Metadata bytes the plan reads.
    pub fn meta_bytes(&self) -> u64 {
        self.entries
            .iter()
            .map(|e| match e {
                Entry::Meta { len, .. } => *len,
                _ => 0,
            })
            .sum()
    }
}
