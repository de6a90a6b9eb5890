//! Errors of the OS layer. Each names the path or value it is about, so a
//! caller can report it without adding context of its own.

use std::io;
use std::path::PathBuf;

use crate::identity::{FileIdentity, FileKind};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The path could not be opened (missing, permission, a symlink where
    /// none is allowed and the kernel said so with `ELOOP`).
    #[error("cannot open {}: {source}", path.display())]
    Open { path: PathBuf, source: io::Error },
    /// `fstat` failed on a descriptor we hold.
    #[error("cannot stat {}: {source}", path.display())]
    Stat { path: PathBuf, source: io::Error },
    /// The path names another kind of file than the caller accepts (a
    /// FIFO, a device, a symlink, ...). Nothing was opened for reading.
    #[error("{} is a {found}, not {wanted}", path.display())]
    WrongKind {
        path: PathBuf,
        found: FileKind,
        wanted: String,
    },
    /// The path names another file, or the file changed, since the
    /// identity the caller expected was taken.
    #[error("{} changed: expected {expected}, found {found}", path.display())]
    Changed {
        path: PathBuf,
        expected: FileIdentity,
        found: FileIdentity,
    },
    /// A device node is not the device the caller asked for.
    #[error("{} is device {found:#x}, not {wanted:#x}", path.display())]
    WrongDevice {
        path: PathBuf,
        found: u64,
        wanted: u64,
    },
    /// `FS_IOC_FIEMAP` failed (the filesystem may not support it).
    #[error("FIEMAP of {}: {source}", path.display())]
    Fiemap { path: PathBuf, source: io::Error },
    /// mincore or cachestat failed.
    #[error("page-cache residency of {}: {source}", path.display())]
    Residency { path: PathBuf, source: io::Error },
    /// posix_fadvise failed.
    #[error("fadvise({advice}) of {}: {source}", path.display())]
    Fadvise {
        path: PathBuf,
        advice: &'static str,
        source: io::Error,
    },
    /// sched_setscheduler refused the policy.
    #[error("cannot set scheduling policy {policy}: {source}")]
    Scheduler { policy: String, source: io::Error },
    /// ioprio_set or ioprio_get failed.
    #[error("I/O priority {prio}: {source}")]
    IoPriority { prio: String, source: io::Error },
    /// sched_getaffinity or sched_setaffinity failed.
    #[error("cannot confine the thread to CPUs {cpus}: {source}")]
    Affinity { cpus: String, source: io::Error },
    /// setpriority refused the nice value.
    #[error("cannot set nice {nice}: {source}")]
    Nice { nice: i32, source: io::Error },
}
