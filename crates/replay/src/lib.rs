//! warmstart's replay engine: executes a [`warmstart_plan::Plan`] so that the
//! pages and metadata an application will read at launch are already in the
//! page cache when it asks for them.
//!
//! Data ranges are prefetched into each file's own page cache with
//! `posix_fadvise(WILLNEED)` (FAST §4.2), metadata blocks into their block
//! device's page cache (first, merged in device order, on filesystems
//! that read their metadata through it; see [`device_reads_reach`] and
//! [`metadata_paths`]), and path lookups are repeated to warm the dentry and
//! inode caches. Files are checked against their recorded identity first, a
//! memory guard stops before the replay would push the system into reclaim,
//! and nothing is ever written to the application's files.
//!
//! The OS boundary is the [`Backend`] trait: [`RealBackend`] for Linux,
//! [`MockBackend`] for tests.
//!
//! ```no_run
//! use warmstart_replay::{replay, Options, RealBackend};
//! # fn run(plan: &warmstart_plan::Plan) -> Result<(), warmstart_replay::ReplayError> {
//! let report = replay(plan, &Options::default(), &RealBackend::new())?;
//! println!("{} bytes issued, {} files skipped", report.bytes_issued(), report.skipped_files.len());
//! # Ok(()) }
//! ```

mod backend;
mod engine;
mod error;
pub mod mock;
mod real;
mod report;

pub use backend::{Backend, IoPriority, LookupOutcome, MemInfo, ReplayCpus, Residency};
pub use engine::{
    device_reads_reach, metadata_mostly_read, metadata_paths, monotonic_ns, replay, DataGate,
    Engine, Options, MAX_META_REQUEST,
};
pub use error::{dev_name, ReplayError};
pub use mock::MockBackend;
pub use real::{file_id, parse_meminfo, read_ahead_bytes, unusable_cpus, RealBackend, RealHandle};
pub use report::{
    Count, IdField, IssuedRequest, LookupCounts, MemoryReport, MetaDevice, MetaPath, Report,
    SkipReason, SkippedDevice, SkippedFile, Timings, WaitReport,
};
