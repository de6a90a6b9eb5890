//! What a replay did, in numbers a person (and `warmstart show`/`bench`) can
//! check: what was issued, what was skipped and why, whether the memory
//! guard stopped it, and where the time went. Serializable so the CLI can
//! print it as JSON.

use std::fmt;

use serde::{Deserialize, Serialize};
use warmstart_plan::trace::FileId;

/// An identity field of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdField {
    Dev,
    Ino,
    Size,
    Mtime,
    Ctime,
}

impl IdField {
    pub fn name(self) -> &'static str {
        match self {
            IdField::Dev => "dev",
            IdField::Ino => "ino",
            IdField::Size => "size",
            IdField::Mtime => "mtime",
            IdField::Ctime => "ctime",
        }
    }

    /// The fields in which `found` differs from `planned`, in this order:
    /// dev, ino, size, mtime, ctime.
    pub fn diff(planned: &FileId, found: &FileId) -> Vec<IdField> {
        let mut out = Vec::new();
        if planned.dev != found.dev {
            out.push(IdField::Dev);
        }
        if planned.ino != found.ino {
            out.push(IdField::Ino);
        }
        if planned.size != found.size {
            out.push(IdField::Size);
        }
        if planned.mtime_ns != found.mtime_ns {
            out.push(IdField::Mtime);
        }
        if planned.ctime_ns != found.ctime_ns {
            out.push(IdField::Ctime);
        }
        out
    }
}

/// Why a file of the plan was not prefetched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum SkipReason {
    /// The path no longer exists.
    Missing,
    /// The file is not the one recorded: it was modified or replaced.
    Changed {
        fields: Vec<IdField>,
        planned: FileId,
        found: FileId,
    },
    /// The path now names a symlink, directory, device, FIFO or socket
    /// (`found`), which was not opened for reading.
    NotRegular {
        #[serde(default)]
        found: String,
    },
    /// Opening failed for another reason (permissions, descriptor limit).
    OpenFailed { error: String },
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::Missing => f.write_str("missing"),
            SkipReason::Changed { fields, .. } => {
                let names: Vec<&str> = fields.iter().map(|x| x.name()).collect();
                write!(f, "changed ({})", names.join(", "))
            }
            SkipReason::NotRegular { found } if found.is_empty() => {
                f.write_str("not a regular file")
            }
            SkipReason::NotRegular { found } => write!(f, "not a regular file ({found})"),
            SkipReason::OpenFailed { error } => write!(f, "open failed: {error}"),
        }
    }
}

/// A file skipped with all its entries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedFile {
    pub path: String,
    #[serde(flatten)]
    pub reason: SkipReason,
    /// Entries of the schedule that named it and were reached.
    pub entries: u64,
    pub bytes: u64,
}

/// A block device whose metadata entries were skipped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedDevice {
    /// `st_rdev`-style device number.
    pub device: u64,
    /// `MAJ:MIN`.
    pub name: String,
    pub error: String,
    pub entries: u64,
    pub bytes: u64,
}

/// Which path a metadata device's entries took, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "path", rename_all = "kebab-case")]
pub enum MetaPath {
    /// Read from the block device at the start of the replay.
    DeviceRead,
    /// The device could not be opened, or refused a read (no privilege,
    /// no device node, a virtual disk that refuses root): the plan's path
    /// lookups warm what they can.
    NotOpenable { error: String },
    /// Not read: the filesystem on it keeps its metadata in a cache of its
    /// own, which reads through the device node do not fill; the plan's
    /// path lookups warm it instead.
    FilesystemUnsupported { fs_type: String },
    /// The replay stopped (cancelled, memory guard) before reading it.
    NotReached,
}

impl fmt::Display for MetaPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetaPath::DeviceRead => f.write_str("device-read"),
            MetaPath::NotOpenable { error } => write!(f, "not-openable ({error})"),
            MetaPath::FilesystemUnsupported { fs_type } => {
                write!(f, "filesystem-unsupported ({fs_type})")
            }
            MetaPath::NotReached => f.write_str("not-reached"),
        }
    }
}

/// One block device holding metadata of the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaDevice {
    /// `st_rdev`-style device number.
    pub device: u64,
    /// `MAJ:MIN`.
    pub name: String,
    /// The filesystem mounted from it (`/proc/self/mountinfo`'s name), if
    /// it is mounted.
    pub fs_type: Option<String>,
    #[serde(flatten)]
    pub path: MetaPath,
    /// The plan's metadata entries and bytes on it.
    pub planned: Count,
    /// Merged ranges they make (see `Options::meta_gap`).
    pub ranges: u64,
    /// Requests issued to it, and the bytes they read (holes included).
    pub requests: u64,
    pub requested_bytes: u64,
}

/// Entries and bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Count {
    pub entries: u64,
    pub bytes: u64,
}

/// What the path lookups did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LookupCounts {
    /// Lookups performed, whatever their outcome.
    pub done: u64,
    pub found: u64,
    /// Paths that do not exist (negative dentries warmed).
    pub not_found: u64,
    /// Directories stat'ed but not listed, to leave their atime alone.
    pub stat_only: u64,
    pub failed: u64,
}

/// The memory guard's view.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryReport {
    /// Replay stops before `MemAvailable - bytes still to issue` would fall
    /// below this (0: guard off).
    pub floor: u64,
    pub total: u64,
    pub available_at_start: u64,
    /// `MemAvailable` (as estimated) when the guard stopped the replay.
    pub available_at_stop: Option<u64>,
    /// Bytes of the schedule that were still to issue then.
    pub remaining_at_stop: Option<u64>,
}

/// The residency wait (`Options::wait`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitReport {
    /// Pages of the issued ranges (clipped at end of file).
    pub pages: u64,
    /// Of those, resident when the wait ended.
    pub resident: u64,
    pub timed_out: bool,
    /// The wait gave up on a file or device whose pending pages made no
    /// progress for [`crate::Options::wait_stall`].
    #[serde(default)]
    pub stalled: bool,
    /// Block-device ranges still absent after their read-ahead that the
    /// wait read through the page cache (see
    /// [`crate::Backend::read_through`]).
    #[serde(default)]
    pub ranges_read: u64,
    /// Files not waited for because they could not be reopened unchanged.
    pub files_unchecked: u64,
    /// Residency queries that failed.
    pub errors: u64,
}

/// Where the time went, in nanoseconds. The phases are wall-clock and add up
/// to `total_ns`; the `busy_*` figures are summed over worker threads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timings {
    pub total_ns: u64,
    /// Reading memory state, device read-ahead limits and which filesystem
    /// each metadata device holds.
    pub setup_ns: u64,
    /// From the first request to the last request returning. Requests are
    /// asynchronous, so I/O may still be in flight at its end.
    pub issue_ns: u64,
    /// Waiting for residency (0 without `wait`). `issue_ns + wait_ns` is the
    /// papers' "prefetcher-only" time.
    pub wait_ns: u64,
    pub busy_open_ns: u64,
    pub busy_data_ns: u64,
    pub busy_meta_ns: u64,
    pub busy_lookup_ns: u64,
}

/// What the spare thread did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpareReport {
    /// How long the first worker had to be inside one open or lookup.
    pub after_ns: u64,
    /// Times it found the first worker that long inside one.
    pub turns: u64,
    /// Requests it executed then.
    pub requests: u64,
}

/// The result of a replay.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub workers: usize,
    pub queue_depth: usize,
    /// The spare thread ([`crate::Options::spare_after`]), if the replay
    /// had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spare: Option<SpareReport>,
    /// The CPUs the replay's threads were confined to; `None`: anywhere.
    #[serde(default)]
    pub cpus: Option<Vec<usize>>,
    /// Entries in the schedule.
    pub entries_total: u64,
    /// Entries issued: data and metadata entries whose first request was
    /// accepted, plus lookups performed.
    pub entries_issued: u64,
    /// Data entries and bytes issued (into files' page caches).
    pub data: Count,
    /// Metadata entries and bytes issued (into block devices' page caches),
    /// as the plan counts them; the bytes read, holes of merged ranges
    /// included, are in `meta_devices`.
    pub meta: Count,
    pub lookups: LookupCounts,
    /// Prefetch requests (one per chunk of at most the device's read-ahead
    /// and [`crate::Options::max_request`]).
    pub requests: u64,
    /// Files opened and found unchanged.
    pub files_opened: u64,
    /// Files skipped with all their entries, in plan order.
    pub skipped_files: Vec<SkippedFile>,
    /// Total of `skipped_files`.
    pub skipped_data: Count,
    /// Metadata entries not issued because the device could not be opened
    /// or refused the request (the lookups then warm what they can).
    pub skipped_meta: Count,
    pub skipped_devices: Vec<SkippedDevice>,
    /// Every metadata device: which path its metadata took and why.
    #[serde(default)]
    pub meta_devices: Vec<MetaDevice>,
    /// Data past the end of its file (not read: a file whose identity
    /// matches has no pages there). Fully past the end counts as an entry.
    #[serde(default)]
    pub beyond_eof: Count,
    /// Data requests that failed after the file was opened.
    pub failed_requests: u64,
    /// Entries never reached because the replay stopped early.
    pub entries_not_reached: u64,
    pub stopped_by_memory: bool,
    /// Stopped through [`crate::Engine::cancel_flag`].
    pub cancelled: bool,
    pub memory: MemoryReport,
    pub wait: Option<WaitReport>,
    pub timings: Timings,
    /// Problems that did not stop the replay (first few, with paths).
    pub errors: Vec<String>,
    /// How many problems there were in all.
    pub error_count: u64,
    /// Every data request accepted, in issue order, when
    /// [`crate::Options::log_requests`] asked for them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub issued: Vec<IssuedRequest>,
}

/// One data request the replay issued: bytes `offset .. offset+len` of the
/// plan's `files[file]`, issued at `t_ns` (CLOCK_MONOTONIC, the clock of
/// BPF timestamps).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IssuedRequest {
    pub file: u32,
    pub offset: u64,
    pub len: u64,
    pub t_ns: u64,
}

impl Report {
    /// Data bytes plus metadata bytes issued.
    pub fn bytes_issued(&self) -> u64 {
        self.data.bytes + self.meta.bytes
    }
}
