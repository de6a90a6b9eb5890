//! The errors the replay engine and its backends return. Each variant names
//! the file, device or path involved, because a replay touches hundreds of
//! them and "permission denied" alone says nothing.

use std::io;
use std::path::PathBuf;

use warmstart_plan::FormatError;

/// Formats an `st_rdev`-style device number as `MAJ:MIN`.
pub fn dev_name(device: u64) -> String {
    format!("{}:{}", libc::major(device), libc::minor(device))
}

/// Why a replay, or one operation of it, failed.
///
/// Only [`ReplayError::Plan`], [`ReplayError::Options`],
/// [`ReplayError::Memory`] (at start) and [`ReplayError::Thread`] end a
/// replay; the others are what a [`crate::Backend`] reports for one file,
/// device or lookup, and the engine turns them into skips and counts.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The plan breaks its own invariants (see `Plan::check`).
    #[error("invalid plan: {0}")]
    Plan(#[from] FormatError),
    /// An option is out of range.
    #[error("invalid replay options: {0}")]
    Options(String),
    /// A file of the plan could not be opened or its identity read.
    #[error("cannot open {path}: {source}", path = .path.display())]
    Open { path: PathBuf, source: io::Error },
    /// A plan path now names something that is not a regular file
    /// (`found`: a symlink, FIFO, directory, device or socket). It was not
    /// opened for reading.
    #[error("{path} is a {found}, not a regular file", path = .path.display())]
    NotRegular { path: PathBuf, found: String },
    /// A block device holding metadata could not be opened (or its node does
    /// not name that device).
    #[error("cannot open block device {dev} ({path}): {source}", dev = dev_name(*.device), path = .path.display())]
    Device {
        device: u64,
        path: PathBuf,
        source: io::Error,
    },
    /// `posix_fadvise(WILLNEED)` on a range failed.
    #[error("prefetch of {path} bytes {offset}+{len} failed: {source}", path = .path.display())]
    Prefetch {
        path: PathBuf,
        offset: u64,
        len: u64,
        source: io::Error,
    },
    /// Reading a range through the page cache (the residency wait's
    /// read of a block device's pages, see [`crate::Backend::read_through`])
    /// failed.
    #[error("reading {path} bytes {offset}+{len} failed: {source}", path = .path.display())]
    Read {
        path: PathBuf,
        offset: u64,
        len: u64,
        source: io::Error,
    },
    /// A path lookup failed for a reason other than the path not existing
    /// (a negative lookup is a normal, useful outcome).
    #[error("{kind} lookup of {path} failed: {source}", path = .path.display())]
    Lookup {
        kind: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    /// The memory state could not be read or parsed.
    #[error("cannot read memory state from {path}: {what}", path = .path.display())]
    Memory { path: PathBuf, what: String },
    /// Page-cache residency of a range could not be queried.
    #[error("cannot query page-cache residency of {path}: {source}", path = .path.display())]
    Residency { path: PathBuf, source: io::Error },
    /// `ioprio_set(2)` refused the requested priority.
    #[error("cannot set I/O priority {prio}: {source}")]
    IoPriority {
        prio: crate::IoPriority,
        source: io::Error,
    },
    /// `sched_setaffinity(2)` or `sched_getaffinity(2)` failed.
    #[error("cannot confine the replay to CPUs {cpus}: {source}")]
    Affinity { cpus: String, source: io::Error },
    /// `sched_setscheduler(2)` refused `SCHED_IDLE`.
    #[error("cannot run the replay at idle priority: {source}")]
    IdlePriority { source: io::Error },
    /// A worker thread could not be started.
    #[error("cannot start a replay worker thread: {source}")]
    Thread { source: io::Error },
}
