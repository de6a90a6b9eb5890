//! What the compiler can be asked to do, with the defaults and the figures
//! that chose them, and why it can refuse.

/// Default [`CompileOptions::merge_gap`]: 64 KiB. A hole of 16 pages costs
/// about one small random read on a SATA SSD (≈100 µs at 550 MB/s) and far
/// less on NVMe, so merging across it does not lose time; the kernel's own
/// readahead (`read_ahead_kb` = 128) reads holes this size on a cold start
/// anyway, so the page cache holds little it would not have held.
pub const DEFAULT_MERGE_GAP: u64 = 64 * 1024;

/// Default [`CompileOptions::merge_distance`]: 8 schedule positions, the
/// I/O distance threshold Paralfetch uses for SSDs with command queuing
/// (Table 2), beyond which it measured little further gain (§3.3).
pub const DEFAULT_MERGE_DISTANCE: u32 = 8;

/// Default [`CompileOptions::metadata_shift`]: 2 MiB of data. Paralfetch
/// shifts metadata by 64–128 KiB *of metadata* on SSDs with command queuing
/// and measured harm from 256 KiB (§3.3, §5). Its traces hold 3–5% metadata
/// by bytes (Table 1), so 64–128 KiB of metadata spans about 1.3–4 MiB of
/// data; 2 MiB sits inside that range, and at 500 MB/s gives each metadata
/// read a 4 ms head start, far more than one SSD read needs.
pub const DEFAULT_METADATA_SHIFT: u64 = 2 * 1024 * 1024;

/// Default [`CompileOptions::min_launch_bytes`]: 256 KiB. FAST's `uname`
/// read 32 KB in 2.2 ms cold and got 5% slower with a prefetcher (§6.3.3).
/// Below about eight times that, a cold launch on an SSD takes a few
/// milliseconds, about what loading and validating a plan costs.
pub const DEFAULT_MIN_LAUNCH_BYTES: u64 = 256 * 1024;

/// The used-only pass's name in [`PlanMeta::passes`](crate::plan::PlanMeta::passes) when it left out the
/// pages no launch used.
pub const USED_ONLY: &str = "used-only";
/// ... and when it kept them ([`CompileOptions::unused`]).
pub const UNUSED_KEPT: &str = "unused-kept";

/// What the compiler does; [`Default`] is right for SSDs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileOptions {
    /// Keep a page, metadata page or lookup if it appears in at least this
    /// many of the traces. `None` means all of them (FAST's intersection).
    pub min_traces: Option<u32>,
    /// Merge two ranges of one file (or device) when the hole between them
    /// is at most this many bytes. 0 merges only touching ranges.
    pub merge_gap: u64,
    /// ... and when they are at most this many positions apart in the
    /// schedule (Paralfetch's I/O distance), so that a range needed late is
    /// not read early at the expense of what comes between.
    pub merge_distance: u32,
    /// Move each metadata range earlier past up to this many bytes of data
    /// reads (lookups do not count). 0 turns the pass off.
    pub metadata_shift: u64,
    /// Order the schedule physically, for rotational disks.
    pub sorted: bool,
    /// A launch needing fewer bytes (data and metadata kept by `combine`,
    /// after `used-only` and `exclude`) gets an empty plan.
    pub min_launch_bytes: u64,
    /// Path prefixes never worth prefetching (always resident, virtual file
    /// systems). A prefix matches whole components: `/usr/lib` matches
    /// `/usr/lib/x` but not `/usr/lib64/x`. Applies to lookups too.
    pub exclude_paths: Vec<String>,
    /// Keep path lookups (namespace operations) in the plan.
    pub lookups: bool,
    /// Keep pages no launch used, which the kernel only read ahead around
    /// the ones it did (half of a cold launch's reads on a disk reading
    /// ahead 8 MiB). Off by default: read last, they still compete with
    /// the launch for the disk and the replay's CPU (clang launched 71 ms
    /// faster without them, LibreOffice 22 ms; see docs/recording.md).
    /// Traces that record no use at all keep everything: they cannot tell.
    pub unused: bool,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            min_traces: None,
            merge_gap: DEFAULT_MERGE_GAP,
            merge_distance: DEFAULT_MERGE_DISTANCE,
            metadata_shift: DEFAULT_METADATA_SHIFT,
            sorted: false,
            min_launch_bytes: DEFAULT_MIN_LAUNCH_BYTES,
            exclude_paths: Vec::new(),
            lookups: true,
            unused: false,
        }
    }
}

/// Why traces could not be compiled at all. An empty plan is not an error:
/// see [`CompileReport::empty`](super::CompileReport::empty).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CompileError {
    #[error("no traces to compile")]
    NoTraces,
    #[error("a page must appear in between 1 and {traces} traces (all of them); {min} was asked")]
    BadMinTraces { min: u32, traces: usize },
    /// The traces hold more than a plan may (see [`crate::limits`]).
    #[error("the plan would be too large: {at} would have {value} {limit}, more than the limit of {max}")]
    TooLarge {
        limit: crate::limits::Limit,
        value: u64,
        max: u64,
        at: String,
    },
}
