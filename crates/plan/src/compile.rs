//! The plan compiler: one or more [`Trace`]s of a launch in, one [`Plan`]
//! out, through a fixed sequence of passes.
//!
//! 1. **combine** (FAST §5.1, generalised to k-of-n): files are matched
//!    across traces by path, since a package update changes the inode but
//!    not the name. A page is kept if it appears in at least `k` of the `n`
//!    traces (`k = n` is FAST's intersection, `k = 1` the union); lookups
//!    the same way by path. Metadata pages, by (device, page), are kept if
//!    any trace read them: a trace sees metadata only when it was not
//!    cached, so requiring it in k traces would drop it whenever one trace
//!    was recorded warm. Each kept page
//!    is scheduled at the earliest time any trace first used it: the
//!    earliest a launch has needed it is when the plan should have it. Kept
//!    pages coalesce as the recorder does: a page that directly follows the
//!    previous range of its file, in that file's access order, extends it.
//!    Pages no launch used, only read ahead by the kernel around those it
//!    did ([`NEVER_USED`]), are left out unless `unused` asks for them
//!    (the **used-only** pass).
//! 2. **exclude**: files under prefixes that are never worth reading ahead.
//! 3. **small-launch**: a launch needing less than `min_launch_bytes` gets an
//!    empty plan; starting a prefetcher costs more than it saves (FAST §6.3.3,
//!    `uname`).
//! 4. **merge** (Paralfetch §3.2, Algorithm 2): ranges of one file (or of one
//!    device, for metadata) are joined when the hole between them is at most
//!    `merge_gap` bytes and they are at most `merge_distance` positions apart
//!    in the schedule. The hole is read too: fewer, larger requests for a
//!    little wasted I/O. The joined range takes the earliest position. A
//!    range is not joined behind more than [`BACKWARD_JOIN_LIMIT`] bytes
//!    that were needed after it, since the replay reads a range from its
//!    start.
//! 5. **lookups**: path lookups (negative ones too: they cost directory
//!    reads) are placed at their time, but never after the first data read
//!    of the same path. A plain lookup of a file the plan reads is left out:
//!    opening the file for that read is the same lookup.
//! 6. **meta-shift** (Paralfetch §3.2, Algorithm 1): a data read can only be
//!    issued once the file's metadata (inode, extent tree) is cached, so each
//!    metadata range moves earlier, past up to `metadata_shift` bytes of data
//!    reads, to be in flight long before the reads that depend on it.
//! 7. **sort** (optional, FAST's sorted prefetch): lookups, then metadata in
//!    device order, then data in physical order, for rotational disks.
//!
//! Every pass is at most `O(n log n)` in the number of ranges: one sort per
//! pass, hash maps for matching, no per-page loops.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use crate::plan::{Entry, Lookup, Plan, PlanFile, PlanMeta};
use crate::trace::{Backend, FileId, NsOpKind, Trace, NEVER_USED, PAGE_SIZE};

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

/// The used-only pass's name in [`PlanMeta::passes`] when it left out the
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
/// see [`CompileReport::empty`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CompileError {
    #[error("no traces to compile")]
    NoTraces,
    #[error("a page must appear in between 1 and {traces} traces (all of them); {min} was asked")]
    BadMinTraces { min: u32, traces: usize },
}

/// Why a compiled plan has no entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EmptyReason {
    /// The traces hold no file data with a path and no metadata.
    NoAccesses,
    /// Nothing appeared in enough traces.
    NothingInCommon { min_traces: u32 },
    /// Everything was under an excluded prefix.
    AllExcluded,
    /// The launch needs too little to be worth prefetching.
    SmallLaunch { bytes: u64, min_bytes: u64 },
}

impl fmt::Display for EmptyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EmptyReason::NoAccesses => {
                f.write_str("the traces recorded no named file data and no metadata")
            }
            EmptyReason::NothingInCommon { min_traces } => {
                write!(f, "no page appeared in {min_traces} or more traces")
            }
            EmptyReason::AllExcluded => f.write_str("every file is under an excluded path"),
            EmptyReason::SmallLaunch { bytes, min_bytes } => write!(
                f,
                "the launch reads {bytes} bytes, less than the {min_bytes} worth prefetching"
            ),
        }
    }
}

/// Something about the input the user should know; compiling went on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Warning {
    /// Traces of different commands were combined (trace indexes as given).
    MixedCommands {
        trace: usize,
        command: Vec<String>,
        newest: Vec<String>,
    },
    /// A trace lost kernel events, so it may lack accesses.
    DroppedEvents { trace: usize, drops: u64 },
    /// A trace from a residency snapshot: its order is not the launch's.
    Unordered { trace: usize },
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Warning::MixedCommands {
                trace,
                command,
                newest,
            } => write!(
                f,
                "trace {trace} is of {command:?}, the newest of {newest:?}; combined anyway"
            ),
            Warning::DroppedEvents { trace, drops } => {
                write!(f, "trace {trace} lost {drops} events and may lack accesses")
            }
            Warning::Unordered { trace } => write!(
                f,
                "trace {trace} is a residency snapshot: its order is approximate"
            ),
        }
    }
}

/// The schedule's size before and after one pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassReport {
    /// As in [`PlanMeta::passes`].
    pub pass: String,
    pub entries_before: usize,
    pub entries_after: usize,
    /// Data and metadata bytes read.
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// What compiling did, for the user and for tests.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CompileReport {
    pub passes: Vec<PassReport>,
    /// Distinct data and metadata bytes in at least one trace.
    pub bytes_seen: u64,
    /// Of those, bytes in fewer than `min_traces` traces: dropped.
    pub bytes_uncommon: u64,
    /// Data bytes of files without a path, summed over traces: dropped,
    /// since replay opens files by path.
    pub bytes_unnamed: u64,
    pub files_unnamed: u32,
    /// Bytes no longer valid under the newest identity: past the end of the
    /// file, or of a path whose inode a newer trace gives another path.
    pub bytes_stale: u64,
    pub files_stale: u32,
    /// Kept bytes of files changed while their newest launch ran (their
    /// ctime is later than its start): outputs and logs, which the next
    /// launch finds changed. Dropped.
    pub bytes_written: u64,
    pub files_written: u32,
    /// Kept data bytes no launch used (only read ahead by the kernel),
    /// dropped since [`CompileOptions::unused`] was off.
    pub bytes_unused: u64,
    /// Kept bytes of files under excluded prefixes.
    pub bytes_excluded: u64,
    pub files_excluded: u32,
    /// Bytes the plan reads that no kept page needs: holes range merge fills.
    pub bytes_holes: u64,
    /// Exec/open/stat/access lookups left out because the path is a file the
    /// plan reads, and opening it for the read repeats the lookup.
    pub lookups_implied: u32,
    /// Set when the plan is empty.
    pub empty: Option<EmptyReason>,
    pub warnings: Vec<Warning>,
}

/// A plan and how it was made.
#[derive(Debug, Clone, PartialEq)]
pub struct Compiled {
    pub plan: Plan,
    pub report: CompileReport,
}

/// Compiles `traces` (oldest first; the last is the newest) into a plan.
///
/// File identities come from the newest trace that has the path.
/// `physical(file, offset)` gives the physical byte address of a file offset
/// (from FIEMAP) and is only called when `opts.sorted`. The plan's
/// `created_unix_ms` is the newest trace's start, since this crate reads no
/// clock; callers stamp the real time if they want it.
pub fn compile(
    traces: &[Trace],
    opts: &CompileOptions,
    physical: &dyn Fn(&PlanFile, u64) -> Option<u64>,
) -> Result<Compiled, CompileError> {
    let newest = traces.last().ok_or(CompileError::NoTraces)?;
    let n = traces.len();
    let k = opts.min_traces.unwrap_or(n as u32);
    if k == 0 || k as usize > n {
        return Err(CompileError::BadMinTraces { min: k, traces: n });
    }
    let mut report = CompileReport {
        warnings: warnings(traces),
        ..Default::default()
    };
    let mut passes = Vec::new();
    let mut meta = PlanMeta {
        command: newest.meta.command.clone(),
        created_unix_ms: newest.meta.started_unix_ms,
        traces: n as u32,
        min_traces: k,
        passes: Vec::new(),
        sorted: opts.sorted,
    };

    // combine
    let Input {
        files: slots,
        devices,
        lookups,
    } = Input::gather(traces, &mut report);
    let mut counts = vec![0u32; n];
    let mut data = Vec::new();
    let mut slot_kept = vec![0u64; slots.len()];
    for (key, slot) in slots.iter().enumerate() {
        let c = combine(&slot.spans, k as usize, &mut counts);
        report.bytes_seen += c.seen;
        report.bytes_uncommon += c.seen - c.kept;
        // Pages past the end of the file as it is now cannot be read.
        let eof = match slot.id.size {
            0 => u64::MAX,
            size => size.div_ceil(PAGE_SIZE) * PAGE_SIZE,
        };
        let mut segs = c.segs;
        for s in &mut segs {
            if s.end > eof {
                report.bytes_stale += s.end - s.start.max(eof);
                s.end = s.end.min(eof);
            }
        }
        segs.retain(|s| s.start < s.end);
        let runs = coalesce(key as u32, segs);
        slot_kept[key] = runs.iter().map(Run::len).sum();
        data.extend(runs);
    }
    let mut metadata = Vec::new();
    // Metadata is seen only when it is read from storage, which depends on
    // what was cached when each trace was recorded, not on what the launch
    // needs: a cold and a warm trace would intersect to nothing. So the
    // union (k = 1) of the metadata is kept.
    for (key, (_, spans)) in devices.iter().enumerate() {
        let c = combine(spans, 1, &mut counts);
        report.bytes_seen += c.seen;
        report.bytes_uncommon += c.seen - c.kept;
        metadata.extend(coalesce(key as u32, c.segs));
    }
    // An inode named by two paths: the path from the newer trace wins, the
    // other is most likely a deleted file whose inode was reused.
    let mut dropped = vec![false; slots.len()];
    let mut by_inode: HashMap<(u64, u64), usize> = HashMap::new();
    for (key, slot) in slots.iter().enumerate() {
        if slot_kept[key] == 0 {
            continue;
        }
        if let Some(other) = by_inode.insert((slot.id.dev, slot.id.ino), key) {
            let loser = if slots[other].newest > slot.newest {
                by_inode.insert((slot.id.dev, slot.id.ino), other);
                key
            } else {
                other
            };
            dropped[loser] = true;
            report.files_stale += 1;
            report.bytes_stale += slot_kept[loser];
        }
    }
    // A file changed while its newest launch ran (an output the program
    // wrote, like `cc -o`, or a log) has, at the end, an identity the next
    // launch will not find: the replay would skip it as changed every
    // time. Its ctime says so: later than the launch's start (plus the
    // start's millisecond, which is all the trace keeps of it).
    for (key, slot) in slots.iter().enumerate() {
        let start_ns = traces[slot.newest].meta.started_unix_ms as i64 * 1_000_000;
        if slot_kept[key] > 0 && !dropped[key] && slot.id.ctime_ns > start_ns + 1_000_000 {
            dropped[key] = true;
            report.files_written += 1;
            report.bytes_written += slot_kept[key];
        }
    }
    data.retain(|r| !dropped[r.key as usize]);
    let lookups = if opts.lookups {
        lookups.into_iter().filter(|l| l.traces >= k).collect()
    } else {
        Vec::new()
    };
    let input_entries = traces
        .iter()
        .map(|t| t.files.iter().map(|f| f.extents.len()).sum::<usize>() + t.metadata.len())
        .sum();
    let input_bytes = traces
        .iter()
        .map(|t| {
            t.files.iter().map(|f| f.bytes()).sum::<u64>()
                + t.metadata.iter().map(|m| m.len).sum::<u64>()
        })
        .sum();
    passes.push(PassReport {
        pass: format!("combine traces={n} min={k}"),
        entries_before: input_entries,
        entries_after: data.len() + metadata.len(),
        bytes_before: input_bytes,
        bytes_after: bytes(&data) + bytes(&metadata),
    });
    let empty_after_combine = data.is_empty() && metadata.is_empty();

    // used-only: traces tell the pages a launch used from those the kernel
    // only read ahead (every recorder backend does; a residency snapshot
    // has used ones only; traces of format 1.0 mark none). If no page at
    // all was used, they could not tell. Either way the plan records which
    // was asked for, so that the launch manager can tell a plan compiled
    // before this pass existed ([`UNUSED_KEPT`] or [`USED_ONLY`]).
    let before = (data.len() + metadata.len(), bytes(&data) + bytes(&metadata));
    if !opts.unused && data.iter().any(|r| r.t < NEVER_USED) {
        report.bytes_unused = data
            .iter()
            .filter(|r| r.t >= NEVER_USED)
            .map(Run::len)
            .sum();
        data.retain(|r| r.t < NEVER_USED);
        slot_kept.iter_mut().for_each(|k| *k = 0);
        for r in &data {
            slot_kept[r.key as usize] += r.len();
        }
    }
    passes.push(PassReport {
        pass: if opts.unused { UNUSED_KEPT } else { USED_ONLY }.into(),
        entries_before: before.0,
        entries_after: data.len() + metadata.len(),
        bytes_before: before.1,
        bytes_after: bytes(&data) + bytes(&metadata),
    });

    // exclude
    let lookups = if opts.exclude_paths.is_empty() {
        lookups
    } else {
        let before = (data.len() + metadata.len(), bytes(&data) + bytes(&metadata));
        let excluded: Vec<bool> = slots
            .iter()
            .map(|s| under_prefix(&s.path, &opts.exclude_paths))
            .collect();
        for (key, &ex) in excluded.iter().enumerate() {
            if ex && slot_kept[key] > 0 && !dropped[key] {
                report.files_excluded += 1;
                report.bytes_excluded += slot_kept[key];
            }
        }
        data.retain(|r| !excluded[r.key as usize]);
        passes.push(PassReport {
            pass: format!("exclude {}", opts.exclude_paths.join(",")),
            entries_before: before.0,
            entries_after: data.len() + metadata.len(),
            bytes_before: before.1,
            bytes_after: bytes(&data) + bytes(&metadata),
        });
        lookups
            .into_iter()
            .filter(|l| !under_prefix(&l.path, &opts.exclude_paths))
            .collect()
    };

    // small-launch
    let needed = bytes(&data) + bytes(&metadata);
    let small = needed < opts.min_launch_bytes;
    if opts.min_launch_bytes > 0 {
        let entries = data.len() + metadata.len();
        passes.push(PassReport {
            pass: format!("small-launch min={}", opts.min_launch_bytes),
            entries_before: entries,
            entries_after: if small { 0 } else { entries },
            bytes_before: needed,
            bytes_after: if small { 0 } else { needed },
        });
    }
    let nothing = data.is_empty() && metadata.is_empty();
    if nothing || small {
        report.empty = Some(if empty_after_combine && report.bytes_seen == 0 {
            EmptyReason::NoAccesses
        } else if empty_after_combine {
            EmptyReason::NothingInCommon { min_traces: k }
        } else if nothing {
            EmptyReason::AllExcluded
        } else {
            EmptyReason::SmallLaunch {
                bytes: needed,
                min_bytes: opts.min_launch_bytes,
            }
        });
        meta.passes = passes.iter().map(|p| p.pass.clone()).collect();
        report.passes = passes;
        let plan = Plan {
            meta,
            files: Vec::new(),
            lookups: Vec::new(),
            entries: Vec::new(),
        };
        return Ok(Compiled { plan, report });
    }

    // merge
    let before = (data.len() + metadata.len(), needed);
    let (data, holes_d) = range_merge(data, opts.merge_gap, opts.merge_distance);
    let (metadata, holes_m) = range_merge(metadata, opts.merge_gap, opts.merge_distance);
    report.bytes_holes = holes_d + holes_m;
    let total = bytes(&data) + bytes(&metadata);
    passes.push(PassReport {
        pass: format!(
            "merge gap={} distance={}",
            opts.merge_gap, opts.merge_distance
        ),
        entries_before: before.0,
        entries_after: data.len() + metadata.len(),
        bytes_before: before.1,
        bytes_after: total,
    });
    let ranges = data.len() + metadata.len();

    // The time-ordered schedule, lookups already ahead of their files' data.
    let mut first_data: HashMap<&str, u64> = HashMap::new();
    for r in &data {
        let t = first_data
            .entry(slots[r.key as usize].path.as_str())
            .or_insert(r.t);
        *t = (*t).min(r.t);
    }
    // Opening a file for its first read walks its path again, so a separate
    // exec/open/stat/access lookup of a path the plan reads data from would
    // only repeat that walk (and store the path a second time).
    let lookups: Vec<LookupSlot> = lookups
        .into_iter()
        .filter(|l| {
            let implied = is_walk(l.kind) && first_data.contains_key(l.path.as_str());
            report.lookups_implied += u32::from(implied);
            !implied
        })
        .collect();
    let mut items: Vec<(Key, Item)> = Vec::with_capacity(ranges + lookups.len());
    items.extend(
        data.iter()
            .map(|r| ((r.t, 2, r.key, r.start), Item::Data(*r))),
    );
    items.extend(
        metadata
            .iter()
            .map(|r| ((r.t, 1, r.key, r.start), Item::Meta(*r))),
    );
    for (i, l) in lookups.iter().enumerate() {
        let t = first_data.get(l.path.as_str()).map_or(l.t, |&d| d.min(l.t));
        items.push(((t, 0, i as u32, 0), Item::Lookup(i as u32)));
    }
    items.sort_unstable_by_key(|(key, _)| *key);
    let mut items: Vec<Item> = items.into_iter().map(|(_, item)| item).collect();

    if opts.lookups {
        passes.push(pass_same("lookups".into(), ranges, items.len(), total));
    }
    if opts.sorted {
        // Physical order overrides any shift: no meta-shift pass.
        let files: Vec<PlanFile> = slots
            .iter()
            .map(|s| PlanFile {
                path: s.path.clone(),
                id: s.id,
            })
            .collect();
        items = sort_physical(items, &devices, &files, physical);
        passes.push(pass_same(
            "sort physical".into(),
            items.len(),
            items.len(),
            total,
        ));
    } else if opts.metadata_shift > 0 {
        items = shift_metadata(items, opts.metadata_shift);
        let pass = format!("meta-shift budget={}", opts.metadata_shift);
        passes.push(pass_same(pass, items.len(), items.len(), total));
    }

    meta.passes = passes.iter().map(|p| p.pass.clone()).collect();
    let plan = assemble(meta, &items, &slots, &devices, &lookups);
    report.passes = passes;
    debug_assert!(
        plan.check().is_ok(),
        "compiled an invalid plan: {:?}",
        plan.check()
    );
    Ok(Compiled { plan, report })
}

/// A pass that reorders or adds entries without reading different bytes.
fn pass_same(pass: String, entries_before: usize, entries_after: usize, bytes: u64) -> PassReport {
    PassReport {
        pass,
        entries_before,
        entries_after,
        bytes_before: bytes,
        bytes_after: bytes,
    }
}

fn warnings(traces: &[Trace]) -> Vec<Warning> {
    let newest = &traces[traces.len() - 1].meta.command;
    let mut out = Vec::new();
    for (i, t) in traces.iter().enumerate() {
        if t.meta.command != *newest {
            out.push(Warning::MixedCommands {
                trace: i,
                command: t.meta.command.clone(),
                newest: newest.clone(),
            });
        }
        if t.stats.drops > 0 {
            out.push(Warning::DroppedEvents {
                trace: i,
                drops: t.stats.drops,
            });
        }
        if t.meta.backend == Backend::Mincore {
            out.push(Warning::Unordered { trace: i });
        }
    }
    out
}

/// Whether a lookup is a plain path walk (as opposed to reading a symlink's
/// target or a directory's entries).
fn is_walk(kind: NsOpKind) -> bool {
    matches!(
        kind,
        NsOpKind::Exec | NsOpKind::Open | NsOpKind::Stat | NsOpKind::Access
    )
}

/// Whether `path` is under one of `prefixes`, by whole components.
fn under_prefix(path: &str, prefixes: &[String]) -> bool {
    prefixes.iter().any(|p| {
        let p = p.trim_end_matches('/');
        p.is_empty()
            || path == p
            || path
                .strip_prefix(p)
                .is_some_and(|rest| rest.starts_with('/'))
    })
}

/// A range of one file or device as one trace saw it, page-aligned.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: u64,
    end: u64,
    t: u64,
    trace: u32,
}

impl Span {
    fn new(offset: u64, len: u64, t: u64, trace: usize) -> Span {
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
struct Run {
    key: u32,
    start: u64,
    end: u64,
    t: u64,
}

impl Run {
    fn len(&self) -> u64 {
        self.end - self.start
    }
}

fn bytes(runs: &[Run]) -> u64 {
    runs.iter().map(Run::len).sum()
}

/// A file seen in any trace, by path.
struct FileSlot {
    path: String,
    /// From the newest trace that has the path.
    id: FileId,
    newest: usize,
    spans: Vec<Span>,
}

/// A lookup seen in any trace, deduplicated.
struct LookupSlot {
    kind: NsOpKind,
    path: String,
    t: u64,
    traces: u32,
    last_trace: usize,
}

/// The traces regrouped by what they touched.
struct Input {
    files: Vec<FileSlot>,
    devices: Vec<(u64, Vec<Span>)>,
    lookups: Vec<LookupSlot>,
}

impl Input {
    fn gather(traces: &[Trace], report: &mut CompileReport) -> Input {
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

/// A piece of the sweep: `start..end`, in enough traces, first touched at
/// `t` by the earliest of them.
#[derive(Debug, Clone, Copy)]
struct Seg {
    start: u64,
    end: u64,
    t: u64,
}

struct Combined {
    /// Pieces in at least k traces, in offset order.
    segs: Vec<Seg>,
    /// Bytes in at least one trace.
    seen: u64,
    /// Bytes in at least k traces.
    kept: u64,
}

/// Counts, for every byte of one file or device, in how many distinct
/// traces it appears, by sweeping the range boundaries (no per-page work).
/// `counts` is scratch space, one zero per trace, and is left zeroed.
fn combine(spans: &[Span], k: usize, counts: &mut [u32]) -> Combined {
    let mut events: Vec<(u64, bool, u64, u32)> = Vec::with_capacity(spans.len() * 2);
    for s in spans.iter().filter(|s| s.start < s.end) {
        events.push((s.start, true, s.t, s.trace));
        events.push((s.end, false, s.t, s.trace));
    }
    events.sort_unstable_by_key(|e| e.0);
    let mut out = Combined {
        segs: Vec::new(),
        seen: 0,
        kept: 0,
    };
    // Times of the ranges covering the sweep position, as a multiset.
    let mut times: BTreeMap<u64, u32> = BTreeMap::new();
    let mut distinct = 0;
    let mut prev = 0;
    let mut i = 0;
    while i < events.len() {
        let pos = events[i].0;
        if distinct > 0 && pos > prev {
            out.seen += pos - prev;
            if distinct >= k {
                out.kept += pos - prev;
                let t = *times.keys().next().expect("covered positions have times");
                out.segs.push(Seg {
                    start: prev,
                    end: pos,
                    t,
                });
            }
        }
        while i < events.len() && events[i].0 == pos {
            let (_, open, t, trace) = events[i];
            let c = &mut counts[trace as usize];
            if open {
                *c += 1;
                distinct += usize::from(*c == 1);
                *times.entry(t).or_default() += 1;
            } else {
                *c -= 1;
                distinct -= usize::from(*c == 0);
                let n = times.get_mut(&t).expect("closing an open range");
                *n -= 1;
                if *n == 0 {
                    times.remove(&t);
                }
            }
            i += 1;
        }
        prev = pos;
    }
    out
}

/// Joins pieces into ranges the way the recorder does: in access order, a
/// piece that directly follows the file's previous range extends it,
/// unless one was used and the other never was ([`NEVER_USED`]).
fn coalesce(key: u32, mut segs: Vec<Seg>) -> Vec<Run> {
    segs.sort_unstable_by_key(|s| (s.t, s.start));
    let mut runs: Vec<Run> = Vec::new();
    for s in segs {
        match runs.last_mut() {
            Some(r) if r.end == s.start && (r.t >= NEVER_USED) == (s.t >= NEVER_USED) => {
                r.end = s.end
            }
            _ => runs.push(Run {
                key,
                start: s.start,
                end: s.end,
                t: s.t,
            }),
        }
    }
    runs
}

/// The most bytes of ranges needed later that a joined range may read
/// ahead of a piece needed before them (the holes between are not
/// counted). The replay issues a range from its start, so in the Python
/// launch the page `execve` faults on first (the bss page at the end of the
/// binary) was joined behind the 4 MiB the kernel then read around it and
/// arrived last; the launch stood 3-6 ms in `elf_load` waiting for it.
pub const BACKWARD_JOIN_LIMIT: u64 = 256 * 1024;

/// Paralfetch's range merge, with a hole allowance: walks each key's ranges
/// in offset order and joins neighbours whose hole is at most `gap` bytes
/// while the group spans at most `distance` schedule positions, unless
/// the group already holds more than [`BACKWARD_JOIN_LIMIT`] bytes needed
/// later than the range joining it. Returns the ranges and the hole bytes
/// added.
fn range_merge(runs: Vec<Run>, gap: u64, distance: u32) -> (Vec<Run>, u64) {
    let mut order: Vec<usize> = (0..runs.len()).collect();
    order.sort_unstable_by_key(|&i| (runs[i].t, runs[i].key, runs[i].start));
    let mut pos = vec![0u64; runs.len()];
    for (p, &i) in order.iter().enumerate() {
        pos[i] = p as u64;
    }
    order.sort_unstable_by_key(|&i| (runs[i].key, runs[i].start));
    let mut out: Vec<Run> = Vec::with_capacity(runs.len());
    let mut holes = 0;
    // The open group: its range, the schedule positions it spans, and its
    // members' bytes by position (positions are distinct).
    let mut group: Option<(Run, u64, u64)> = None;
    let mut members: BTreeMap<u64, u64> = BTreeMap::new();
    // Whether the members placed after `p` hold at most the limit; stops
    // counting past it, so a wide `distance` costs no more.
    let few_later = |members: &BTreeMap<u64, u64>, p: u64| {
        let mut later = 0u64;
        members.range(p + 1..).all(|(_, &b)| {
            later += b;
            later <= BACKWARD_JOIN_LIMIT
        })
    };
    for i in order {
        let r = runs[i];
        let p = pos[i];
        if let Some((g, lo, hi)) = &mut group {
            let hole = r.start.saturating_sub(g.end);
            if g.key == r.key
                && (g.t >= NEVER_USED) == (r.t >= NEVER_USED)
                && hole <= gap
                && (*hi).max(p) - (*lo).min(p) <= u64::from(distance)
                && few_later(&members, p)
            {
                holes += hole;
                g.end = g.end.max(r.end);
                g.t = g.t.min(r.t);
                *lo = (*lo).min(p);
                *hi = (*hi).max(p);
                members.insert(p, r.len());
                continue;
            }
            out.push(*g);
        }
        group = Some((r, p, p));
        members.clear();
        members.insert(p, r.len());
    }
    out.extend(group.map(|(g, _, _)| g));
    (out, holes)
}

/// (t, rank, key, offset): at equal times lookups, then metadata, then data,
/// the order in which they depend on each other.
type Key = (u64, u8, u32, u64);

#[derive(Debug, Clone, Copy)]
enum Item {
    Data(Run),
    Meta(Run),
    Lookup(u32),
}

/// Paralfetch's metadata shift with a budget in data bytes: each metadata
/// range moves earlier past as many data reads as fit in `budget` bytes
/// (and past any lookups), but never past an earlier metadata range.
fn shift_metadata(items: Vec<Item>, budget: u64) -> Vec<Item> {
    // before[i]: data bytes in items[..i].
    let mut before = Vec::with_capacity(items.len() + 1);
    let mut sum = 0;
    for item in &items {
        before.push(sum);
        if let Item::Data(r) = item {
            sum += r.len();
        }
    }
    // The landing point only grows with `i`, so metadata ranges keep their
    // order among themselves (ties go by original index).
    let mut keyed: Vec<((usize, u8, usize), Item)> = items
        .into_iter()
        .enumerate()
        .map(|(i, item)| match item {
            Item::Meta(_) => {
                let land = before[..=i].partition_point(|&b| before[i] - b > budget);
                ((land, 0, i), item)
            }
            _ => ((i, 1, i), item),
        })
        .collect();
    keyed.sort_unstable_by_key(|(key, _)| *key);
    keyed.into_iter().map(|(_, item)| item).collect()
}

/// FAST's sorted prefetch: lookups in schedule order, then metadata by
/// (device, offset), then data by the file's device and physical address;
/// data whose address is unknown keeps its order, last.
fn sort_physical(
    items: Vec<Item>,
    devices: &[(u64, Vec<Span>)],
    files: &[PlanFile],
    physical: &dyn Fn(&PlanFile, u64) -> Option<u64>,
) -> Vec<Item> {
    let mut lookups = Vec::new();
    let mut metas = Vec::new();
    let mut datas = Vec::new();
    for item in items {
        match item {
            Item::Lookup(_) => lookups.push(item),
            Item::Meta(r) => metas.push(((devices[r.key as usize].0, r.start), item)),
            Item::Data(r) => {
                let f = &files[r.key as usize];
                let key = physical(f, r.start).map_or((1, 0, 0), |p| (0, f.id.dev, p));
                datas.push((key, item));
            }
        }
    }
    metas.sort_by_key(|(key, _)| *key);
    datas.sort_by_key(|(key, _)| *key);
    lookups
        .into_iter()
        .chain(metas.into_iter().map(|(_, item)| item))
        .chain(datas.into_iter().map(|(_, item)| item))
        .collect()
}

/// Builds the plan: files and lookups tabled in order of first use, so the
/// tables read like the schedule and each path is stored once.
fn assemble(
    meta: PlanMeta,
    items: &[Item],
    slots: &[FileSlot],
    devices: &[(u64, Vec<Span>)],
    lookups: &[LookupSlot],
) -> Plan {
    let mut files = Vec::new();
    let mut file_ix: HashMap<u32, u32> = HashMap::new();
    let mut table = Vec::new();
    let mut entries = Vec::with_capacity(items.len());
    for item in items {
        entries.push(match *item {
            Item::Data(r) => {
                let file = *file_ix.entry(r.key).or_insert_with(|| {
                    let slot = &slots[r.key as usize];
                    files.push(PlanFile {
                        path: slot.path.clone(),
                        id: slot.id,
                    });
                    files.len() as u32 - 1
                });
                Entry::Data {
                    file,
                    offset: r.start,
                    len: r.len(),
                }
            }
            Item::Meta(r) => Entry::Meta {
                device: devices[r.key as usize].0,
                offset: r.start,
                len: r.len(),
            },
            Item::Lookup(i) => {
                let l = &lookups[i as usize];
                table.push(Lookup {
                    kind: l.kind,
                    path: l.path.clone(),
                });
                Entry::Lookup {
                    index: table.len() as u32 - 1,
                }
            }
        });
    }
    Plan {
        meta,
        files,
        lookups: table,
        entries,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{
        CacheState, EndReason, Extent, FileTrace, MetaExtent, NamespaceOp, TraceMeta, TraceStats,
    };

    const P: u64 = PAGE_SIZE;

    /// A trace written by hand, in pages and plain numbers.
    struct T(Trace);

    fn t() -> T {
        T(Trace {
            meta: TraceMeta {
                command: vec!["app".into()],
                cwd: "/".into(),
                backend: Backend::Bpf,
                cache: CacheState::Cold,
                end: EndReason::Exited,
                exit_code: Some(0),
                started_unix_ms: 1_000,
                hostname: "h".into(),
            },
            files: Vec::new(),
            metadata: Vec::new(),
            namespace_ops: Vec::new(),
            stats: TraceStats::default(),
        })
    }

    impl T {
        /// File `path` (inode `ino`, size unknown) with `(page, pages, t)` extents.
        fn file(self, path: &str, ino: u64, extents: &[(u64, u64, u64)]) -> T {
            self.file_sized(Some(path), ino, 0, extents)
        }

        fn file_sized(
            mut self,
            path: Option<&str>,
            ino: u64,
            size: u64,
            extents: &[(u64, u64, u64)],
        ) -> T {
            self.0.files.push(FileTrace {
                path: path.map(str::to_owned),
                id: FileId {
                    dev: 1,
                    ino,
                    size,
                    ..Default::default()
                },
                extents: extents
                    .iter()
                    .map(|&(page, pages, t_ns)| Extent {
                        offset: page * P,
                        len: pages * P,
                        t_ns,
                        from_storage: true,
                    })
                    .collect(),
            });
            self
        }

        fn meta(mut self, device: u64, page: u64, pages: u64, t_ns: u64) -> T {
            self.0.metadata.push(MetaExtent {
                device,
                offset: page * P,
                len: pages * P,
                t_ns,
            });
            self
        }

        fn op(mut self, kind: NsOpKind, path: &str, result: i32, t_ns: u64) -> T {
            self.0.namespace_ops.push(NamespaceOp {
                t_ns,
                kind,
                path: path.into(),
                result,
            });
            self
        }

        fn done(self) -> Trace {
            self.0
        }
    }

    /// Every pass neutral: what is left is combine and scheduling by time.
    /// [`plain`] with the default range merge.
    fn merging() -> CompileOptions {
        CompileOptions {
            merge_gap: DEFAULT_MERGE_GAP,
            merge_distance: DEFAULT_MERGE_DISTANCE,
            ..plain()
        }
    }

    fn plain() -> CompileOptions {
        CompileOptions {
            min_traces: None,
            merge_gap: 0,
            merge_distance: 0,
            metadata_shift: 0,
            sorted: false,
            min_launch_bytes: 0,
            exclude_paths: Vec::new(),
            lookups: true,
            unused: true,
        }
    }

    fn no_physical(_: &PlanFile, _: u64) -> Option<u64> {
        None
    }

    fn run(traces: &[Trace], opts: &CompileOptions) -> Compiled {
        let c = compile(traces, opts, &no_physical).expect("compiles");
        c.plan.check().expect("a valid plan");
        c
    }

    /// The schedule, readable: `/a 0+2` (pages), `meta8:100+1`, `open /a`.
    fn show(p: &Plan) -> Vec<String> {
        p.entries
            .iter()
            .map(|e| match *e {
                Entry::Data { file, offset, len } => {
                    format!("{} {}+{}", p.files[file as usize].path, offset / P, len / P)
                }
                Entry::Meta {
                    device,
                    offset,
                    len,
                } => format!("meta{device}:{}+{}", offset / P, len / P),
                Entry::Lookup { index } => {
                    let l = &p.lookups[index as usize];
                    format!("{} {}", l.kind.name(), l.path)
                }
            })
            .collect()
    }

    fn three_traces() -> Vec<Trace> {
        vec![
            t().file("/a", 1, &[(0, 4, 10)])
                .file("/b", 2, &[(0, 1, 20)])
                .meta(8, 100, 2, 2)
                .done(),
            t().file("/a", 1, &[(2, 4, 5)])
                .file("/c", 3, &[(0, 1, 1)])
                .meta(8, 101, 2, 3)
                .done(),
            t().file("/a", 1, &[(0, 2, 30), (3, 1, 31)])
                .file("/b", 2, &[(0, 1, 40)])
                .meta(8, 101, 1, 50)
                .done(),
        ]
    }

    #[test]
    fn k_of_n_table() {
        // /a: pages 0-1 in traces 0,2; 2 in 0,1; 3 in all; 4-5 in 1 only.
        // Each page is scheduled at the earliest time a trace touched it.
        let cases: Vec<(Option<u32>, Vec<&str>)> = vec![
            (
                Some(1),
                vec!["/c 0+1", "meta8:100+3", "/a 2+4", "/a 0+2", "/b 0+1"],
            ),
            // Metadata is the union whatever k is (see combine).
            (Some(2), vec!["meta8:100+3", "/a 2+2", "/a 0+2", "/b 0+1"]),
            (None, vec!["meta8:100+3", "/a 3+1"]),
            (Some(3), vec!["meta8:100+3", "/a 3+1"]),
        ];
        for (min, want) in cases {
            let c = run(
                &three_traces(),
                &CompileOptions {
                    min_traces: min,
                    ..plain()
                },
            );
            assert_eq!(show(&c.plan), want, "min_traces {min:?}");
            assert_eq!(c.plan.meta.min_traces, min.unwrap_or(3));
            assert_eq!(c.plan.meta.traces, 3);
        }
    }

    #[test]
    fn k_of_n_accounting() {
        let c = run(
            &three_traces(),
            &CompileOptions {
                min_traces: Some(2),
                ..plain()
            },
        );
        // Seen: /a 6 pages, /b 1, /c 1, metadata 3. Uncommon: /a 4-5, /c;
        // metadata is kept whole (the union).
        assert_eq!(c.report.bytes_seen, 11 * P);
        assert_eq!(c.report.bytes_uncommon, 3 * P);
        assert_eq!(c.plan.data_bytes() + c.plan.meta_bytes(), 8 * P);
        assert_eq!(c.report.empty, None);
    }

    /// An output the launch wrote (ctime after its start) is left out: the
    /// next launch would find it changed. A file changed before the start,
    /// or in the start's own millisecond, is kept.
    #[test]
    fn files_changed_while_the_launch_ran_are_left_out() {
        let started_ms = 1_700_000_000_000u64;
        let start_ns = started_ms as i64 * 1_000_000;
        let mut b = t()
            .file("/usr/bin/cc", 1, &[(0, 4, 0)])
            .file("/tmp/out.o", 2, &[(0, 2, 1)])
            .file("/etc/conf", 3, &[(0, 1, 2)]);
        b.0.meta.started_unix_ms = started_ms;
        for (f, ctime) in b.0.files.iter_mut().zip([
            start_ns - 5_000_000_000,
            start_ns + 250_000_000,
            start_ns + 400_000,
        ]) {
            f.id.ctime_ns = ctime;
        }
        let c = run(&[b.done()], &plain());
        let paths: Vec<&str> = c.plan.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, vec!["/usr/bin/cc", "/etc/conf"]);
        assert_eq!((c.report.files_written, c.report.bytes_written), (1, 2 * P));
        assert_eq!(c.plan.data_bytes(), 5 * P);
    }

    #[test]
    fn file_identity_and_naming() {
        let traces = vec![
            t().file("/a", 1, &[(0, 1, 0)])
                .file("/old", 5, &[(0, 1, 1)])
                .file_sized(Some("/shrunk"), 7, 0, &[(0, 5, 2)])
                .done(),
            t().file("/a", 2, &[(0, 1, 0)])
                .file("/new", 5, &[(0, 1, 1)])
                .file_sized(Some("/shrunk"), 7, 2 * P + 1, &[(0, 1, 2)])
                .file_sized(None, 9, 0, &[(0, 3, 3)])
                .done(),
        ];
        let c = run(
            &traces,
            &CompileOptions {
                min_traces: Some(1),
                ..plain()
            },
        );
        // /a: the newest inode. /old: its inode now belongs to /new.
        // /shrunk: cut at its current end (3 pages). Unnamed: dropped.
        assert_eq!(show(&c.plan), vec!["/a 0+1", "/new 0+1", "/shrunk 0+3"]);
        assert_eq!(c.plan.files[0].id.ino, 2);
        assert_eq!(c.report.files_stale, 1);
        assert_eq!(c.report.bytes_stale, P + 2 * P);
        assert_eq!(c.report.files_unnamed, 1);
        assert_eq!(c.report.bytes_unnamed, 3 * P);
    }

    #[test]
    fn merge_table() {
        // Access order: /a 0 (pos 0), /a 2 (1), /b 0 (2), /a 10 (3), /a 3 (4).
        let trace = t()
            .file("/a", 1, &[(0, 1, 0), (2, 1, 1), (10, 1, 3), (3, 1, 4)])
            .file("/b", 2, &[(0, 1, 2)])
            .done();
        let cases: Vec<(u64, u32, Vec<&str>, u64)> = vec![
            (
                0,
                0,
                vec!["/a 0+1", "/a 2+1", "/b 0+1", "/a 10+1", "/a 3+1"],
                0,
            ),
            // Touching ranges 3 positions apart.
            (0, 3, vec!["/a 0+1", "/a 2+2", "/b 0+1", "/a 10+1"], 0),
            (
                0,
                2,
                vec!["/a 0+1", "/a 2+1", "/b 0+1", "/a 10+1", "/a 3+1"],
                0,
            ),
            // A one-page hole is just over 4095 bytes.
            (P - 1, 8, vec!["/a 0+1", "/a 2+2", "/b 0+1", "/a 10+1"], 0),
            (P, 8, vec!["/a 0+4", "/b 0+1", "/a 10+1"], P),
            (6 * P, 8, vec!["/a 0+11", "/b 0+1"], 7 * P),
            // The distance splits the file; the second group starts at its
            // earliest member (/a 10, position 3).
            (6 * P, 2, vec!["/a 0+3", "/b 0+1", "/a 3+8"], 7 * P),
        ];
        for (gap, distance, want, holes) in cases {
            let c = run(
                std::slice::from_ref(&trace),
                &CompileOptions {
                    merge_gap: gap,
                    merge_distance: distance,
                    ..plain()
                },
            );
            assert_eq!(show(&c.plan), want, "gap {gap} distance {distance}");
            assert_eq!(c.report.bytes_holes, holes, "gap {gap} distance {distance}");
            assert_eq!(c.plan.data_bytes(), 5 * P + holes);
        }
    }

    #[test]
    fn merge_keeps_a_page_needed_first_ahead_of_a_large_read_before_it() {
        // What execve does: it faults on the page where the bss begins,
        // near the binary's end, and the kernel reads 4 MiB around it.
        let big = BACKWARD_JOIN_LIMIT / P;
        // (page, pages, t) extents of /a, and the plan wanted.
        type Case = (Vec<(u64, u64, u64)>, Vec<&'static str>);
        let cases: Vec<Case> = vec![
            (
                vec![(1024, 1, 0), (0, 1024, 1), (1025, 4, 2)],
                vec!["/a 1024+5", "/a 0+1024"],
            ),
            // Up to the limit, the range behind it still joins.
            (vec![(big, 1, 0), (0, big, 1)], vec!["/a 0+65"]),
            (
                vec![(big + 1, 1, 0), (0, big + 1, 1)],
                vec!["/a 65+1", "/a 0+65"],
            ),
            // Read forwards, a large range joins as before.
            (vec![(0, 1024, 0), (1024, 1, 1)], vec!["/a 0+1025"]),
        ];
        for (extents, want) in cases {
            let trace = t().file("/a", 1, &extents).done();
            let c = run(&[trace], &merging());
            assert_eq!(show(&c.plan), want, "{extents:?}");
        }
    }

    #[test]
    fn pages_never_used_stay_after_the_used_ones() {
        // A launch read pages 0..32; the kernel read ahead 32..2048, never
        // used: the tail is not joined to the head, by coalescing (one
        // trace) or merging (no hole between them).
        let late = NEVER_USED + 5;
        let trace = t()
            .file("/a", 1, &[(0, 32, 1), (32, 2016, late)])
            .file("/b", 2, &[(0, 1, 2)])
            .done();
        let c = run(&[trace], &merging());
        assert_eq!(show(&c.plan), vec!["/a 0+32", "/b 0+1", "/a 32+2016"]);
    }

    #[test]
    fn used_only_drops_what_no_launch_used() {
        // Trace 1 used /a 0..32 and /b 0..1; the kernel read ahead /a
        // 32..2048 and /c whole. Trace 2 used /a 32..40 too.
        let late = NEVER_USED + 5;
        let one = t()
            .file("/a", 1, &[(0, 32, 1), (32, 2016, late)])
            .file("/b", 2, &[(0, 1, 2)])
            .file("/c", 3, &[(0, 64, late + 1)])
            .done();
        let two = t()
            .file("/a", 1, &[(0, 40, 1), (40, 2008, late)])
            .file("/b", 2, &[(0, 1, 2)])
            .file("/c", 3, &[(0, 64, late + 1)])
            .done();
        let used_only = CompileOptions {
            unused: false,
            ..merging()
        };
        let c = run(std::slice::from_ref(&one), &used_only);
        assert_eq!(show(&c.plan), vec!["/a 0+32", "/b 0+1"]);
        assert_eq!(c.report.bytes_unused, (2016 + 64) * P);
        let pass = &c.report.passes[1];
        assert_eq!(pass.pass, USED_ONLY);
        assert_eq!((pass.bytes_before, pass.bytes_after), (2113 * P, 33 * P));
        // A page used by one launch and read ahead in the other is used.
        let c = run(&[one.clone(), two], &used_only);
        assert_eq!(show(&c.plan), vec!["/a 0+40", "/b 0+1"]);
        // A file only read ahead is not also counted as excluded.
        let c = run(
            std::slice::from_ref(&one),
            &CompileOptions {
                exclude_paths: vec!["/c".into()],
                ..used_only.clone()
            },
        );
        assert_eq!((c.report.files_excluded, c.report.bytes_excluded), (0, 0));
        // Asked for, the read-ahead stays, last.
        let c = run(&[one], &merging());
        assert_eq!(c.plan.meta.passes[1], UNUSED_KEPT);
        assert_eq!(
            show(&c.plan),
            vec!["/a 0+32", "/b 0+1", "/a 32+2016", "/c 0+64"]
        );
        assert_eq!(c.report.bytes_unused, 0);
        // Traces with no used page cannot tell read-ahead from use: all kept.
        let blind = t().file("/c", 3, &[(0, 64, late)]).done();
        let c = run(&[blind], &used_only);
        assert_eq!(show(&c.plan), vec!["/c 0+64"]);
        assert_eq!(c.report.bytes_unused, 0);
    }

    #[test]
    fn merge_joins_metadata_per_device() {
        let trace = t()
            .file("/a", 1, &[(0, 1, 0)])
            .meta(8, 100, 1, 1)
            .meta(9, 101, 1, 2)
            .meta(8, 102, 1, 3)
            .done();
        let c = run(
            &[trace],
            &CompileOptions {
                merge_gap: P,
                merge_distance: 8,
                ..plain()
            },
        );
        assert_eq!(show(&c.plan), vec!["/a 0+1", "meta8:100+3", "meta9:101+1"]);
    }

    #[test]
    fn metadata_shift_table() {
        // Data a (1 page), b (2), c (1), meta M100, data d (1), meta M200.
        let trace = t()
            .file("/a", 1, &[(0, 1, 10)])
            .file("/b", 2, &[(0, 2, 20)])
            .file("/c", 3, &[(0, 1, 30)])
            .meta(8, 100, 1, 40)
            .file("/d", 4, &[(0, 1, 50)])
            .meta(8, 200, 1, 60)
            .done();
        let cases: Vec<(u64, Vec<&str>)> = vec![
            (
                0,
                vec![
                    "/a 0+1",
                    "/b 0+2",
                    "/c 0+1",
                    "meta8:100+1",
                    "/d 0+1",
                    "meta8:200+1",
                ],
            ),
            (
                P - 1,
                vec![
                    "/a 0+1",
                    "/b 0+2",
                    "/c 0+1",
                    "meta8:100+1",
                    "/d 0+1",
                    "meta8:200+1",
                ],
            ),
            (
                P,
                vec![
                    "/a 0+1",
                    "/b 0+2",
                    "meta8:100+1",
                    "/c 0+1",
                    "meta8:200+1",
                    "/d 0+1",
                ],
            ),
            // b and c together are 3 pages: M100 cannot pass both; M200
            // passes c and d.
            (
                2 * P,
                vec![
                    "/a 0+1",
                    "/b 0+2",
                    "meta8:100+1",
                    "meta8:200+1",
                    "/c 0+1",
                    "/d 0+1",
                ],
            ),
            (
                3 * P,
                vec![
                    "/a 0+1",
                    "meta8:100+1",
                    "/b 0+2",
                    "meta8:200+1",
                    "/c 0+1",
                    "/d 0+1",
                ],
            ),
            (
                u64::MAX,
                vec![
                    "meta8:100+1",
                    "meta8:200+1",
                    "/a 0+1",
                    "/b 0+2",
                    "/c 0+1",
                    "/d 0+1",
                ],
            ),
        ];
        for (budget, want) in cases {
            let c = run(
                std::slice::from_ref(&trace),
                &CompileOptions {
                    metadata_shift: budget,
                    ..plain()
                },
            );
            assert_eq!(show(&c.plan), want, "budget {budget}");
        }
    }

    #[test]
    fn metadata_shift_passes_lookups_for_free() {
        let trace = t()
            .file("/a", 1, &[(0, 1, 10)])
            .op(NsOpKind::Stat, "/x", -2, 20)
            .meta(8, 100, 1, 30)
            .done();
        let cases: Vec<(u64, Vec<&str>)> = vec![
            (0, vec!["/a 0+1", "stat /x", "meta8:100+1"]),
            (P - 1, vec!["/a 0+1", "meta8:100+1", "stat /x"]),
            (P, vec!["meta8:100+1", "/a 0+1", "stat /x"]),
        ];
        for (budget, want) in cases {
            let c = run(
                std::slice::from_ref(&trace),
                &CompileOptions {
                    metadata_shift: budget,
                    ..plain()
                },
            );
            assert_eq!(show(&c.plan), want, "budget {budget}");
        }
    }

    fn lookup_trace(with_missing: bool) -> Trace {
        let mut b = t().op(NsOpKind::Open, "/b", 0, 1);
        if with_missing {
            b = b.op(NsOpKind::Stat, "/missing", -2, 5);
        }
        b.file("/a", 1, &[(0, 1, 10)])
            .op(NsOpKind::DirRead, "/dir", 0, 15)
            .op(NsOpKind::Open, "/a", 0, 20)
            .op(NsOpKind::Readlink, "/a", -22, 26)
            .op(NsOpKind::Stat, "/lib", 0, 27)
            .op(NsOpKind::Access, "/lib", 0, 28)
            .op(NsOpKind::DirRead, "/lib", 0, 29)
            .file("/b", 2, &[(0, 1, 30)])
            .done()
    }

    #[test]
    fn lookup_table() {
        let cases: Vec<(&str, Vec<Trace>, CompileOptions, Vec<&str>)> = vec![
            (
                // open /a and /b: implied by reading them. readlink /a:
                // hoisted ahead of /a's data. stat and access of /lib: one.
                "one trace",
                vec![lookup_trace(true)],
                plain(),
                vec![
                    "stat /missing",
                    "readlink /a",
                    "/a 0+1",
                    "readdir /dir",
                    "stat /lib",
                    "readdir /lib",
                    "/b 0+1",
                ],
            ),
            (
                "repeats across traces collapse",
                vec![lookup_trace(true), lookup_trace(true)],
                plain(),
                vec![
                    "stat /missing",
                    "readlink /a",
                    "/a 0+1",
                    "readdir /dir",
                    "stat /lib",
                    "readdir /lib",
                    "/b 0+1",
                ],
            ),
            (
                "a lookup in one trace of two is dropped",
                vec![lookup_trace(true), lookup_trace(false)],
                plain(),
                vec![
                    "readlink /a",
                    "/a 0+1",
                    "readdir /dir",
                    "stat /lib",
                    "readdir /lib",
                    "/b 0+1",
                ],
            ),
            (
                "... or kept in 1-of-n",
                vec![lookup_trace(false), lookup_trace(true)],
                CompileOptions {
                    min_traces: Some(1),
                    ..plain()
                },
                vec![
                    "stat /missing",
                    "readlink /a",
                    "/a 0+1",
                    "readdir /dir",
                    "stat /lib",
                    "readdir /lib",
                    "/b 0+1",
                ],
            ),
            (
                "lookups off",
                vec![lookup_trace(true)],
                CompileOptions {
                    lookups: false,
                    ..plain()
                },
                vec!["/a 0+1", "/b 0+1"],
            ),
        ];
        for (name, traces, opts, want) in cases {
            let c = run(&traces, &opts);
            assert_eq!(show(&c.plan), want, "{name}");
            assert_eq!(
                c.plan.meta.passes.iter().any(|p| p == "lookups"),
                opts.lookups,
                "{name}"
            );
        }
        let c = run(&[lookup_trace(true)], &plain());
        assert_eq!(c.report.lookups_implied, 2);
        assert_eq!(c.plan.lookups.len(), 5, "each lookup tabled once");
    }

    #[test]
    fn sorted_order() {
        let trace = t()
            .op(NsOpKind::Stat, "/etc/x", -2, 0)
            .meta(9, 50, 1, 0)
            .file("/a", 1, &[(0, 1, 1), (5, 1, 3)])
            .file("/b", 2, &[(0, 1, 2)])
            .file("/c", 3, &[(0, 1, 4)])
            .meta(8, 100, 1, 5)
            .meta(8, 7, 1, 6)
            .done();
        let physical = |f: &PlanFile, off: u64| match (f.path.as_str(), off / P) {
            ("/a", 0) => Some(3000 * P),
            ("/a", 5) => Some(1000 * P),
            ("/b", 0) => Some(2000 * P),
            _ => None,
        };
        let opts = CompileOptions {
            sorted: true,
            metadata_shift: DEFAULT_METADATA_SHIFT,
            ..plain()
        };
        let c = compile(&[trace], &opts, &physical).unwrap();
        assert_eq!(
            show(&c.plan),
            vec![
                "stat /etc/x",
                "meta8:7+1",
                "meta8:100+1",
                "meta9:50+1",
                "/a 5+1",
                "/b 0+1",
                "/a 0+1",
                "/c 0+1",
            ]
        );
        assert!(c.plan.meta.sorted);
        assert_eq!(c.plan.meta.passes.last().unwrap(), "sort physical");
        assert!(!c
            .plan
            .meta
            .passes
            .iter()
            .any(|p| p.starts_with("meta-shift")));
    }

    #[test]
    fn filter_table() {
        let trace = t()
            .op(NsOpKind::Stat, "/usr/lib/gconv", -2, 0)
            .op(NsOpKind::Stat, "/home/u/.app", -2, 0)
            .meta(8, 1, 1, 0)
            .file("/usr/lib/libc.so", 1, &[(0, 10, 1)])
            .file("/usr/lib64/x", 2, &[(0, 2, 2)])
            .file("/home/u/app", 3, &[(0, 4, 3)])
            .done();
        let all = vec![
            "stat /usr/lib/gconv",
            "stat /home/u/.app",
            "meta8:1+1",
            "/usr/lib/libc.so 0+10",
            "/usr/lib64/x 0+2",
            "/home/u/app 0+4",
        ];
        let no_lib = vec![
            "stat /home/u/.app",
            "meta8:1+1",
            "/usr/lib64/x 0+2",
            "/home/u/app 0+4",
        ];
        let small = |bytes, min_bytes| Err(EmptyReason::SmallLaunch { bytes, min_bytes });
        #[allow(clippy::type_complexity)]
        let cases: Vec<(&[&str], u64, Result<Vec<&str>, EmptyReason>)> = vec![
            (&[], 0, Ok(all.clone())),
            (&["/usr/lib"], 0, Ok(no_lib.clone())),
            (&["/usr/lib/"], 0, Ok(no_lib)),
            (
                &["/usr"],
                0,
                Ok(vec!["stat /home/u/.app", "meta8:1+1", "/home/u/app 0+4"]),
            ),
            (&["/"], 0, Ok(vec!["meta8:1+1"])),
            (&[], 17 * P, Ok(all)),
            (&[], 18 * P, small(17 * P, 18 * P)),
            (&["/usr"], 6 * P, small(5 * P, 6 * P)),
        ];
        for (exclude, min_bytes, want) in cases {
            let opts = CompileOptions {
                exclude_paths: exclude.iter().map(|s| s.to_string()).collect(),
                min_launch_bytes: min_bytes,
                ..plain()
            };
            let c = run(std::slice::from_ref(&trace), &opts);
            match want {
                Ok(want) => {
                    assert_eq!(show(&c.plan), want, "{exclude:?} {min_bytes}");
                    assert_eq!(c.report.empty, None);
                }
                Err(reason) => {
                    assert!(c.plan.entries.is_empty() && c.plan.files.is_empty());
                    assert!(c.plan.lookups.is_empty());
                    assert_eq!(c.report.empty, Some(reason), "{exclude:?} {min_bytes}");
                }
            }
        }
        let c = run(
            &[trace],
            &CompileOptions {
                exclude_paths: vec!["/usr/lib".into()],
                ..plain()
            },
        );
        assert_eq!(
            (c.report.files_excluded, c.report.bytes_excluded),
            (1, 10 * P)
        );
    }

    #[test]
    fn empty_inputs() {
        let err = |traces: &[Trace], min| {
            let opts = CompileOptions {
                min_traces: min,
                ..plain()
            };
            compile(traces, &opts, &no_physical).unwrap_err()
        };
        let two = [t().done(), t().done()];
        assert_eq!(err(&[], None), CompileError::NoTraces);
        assert_eq!(
            err(&two, Some(0)),
            CompileError::BadMinTraces { min: 0, traces: 2 }
        );
        assert_eq!(
            err(&two, Some(3)),
            CompileError::BadMinTraces { min: 3, traces: 2 }
        );

        let cases: Vec<(&str, Vec<Trace>, Vec<&str>, EmptyReason)> = vec![
            (
                "nothing recorded",
                vec![t().done()],
                vec![],
                EmptyReason::NoAccesses,
            ),
            (
                "only unnamed data",
                vec![t()
                    .file_sized(None, 1, 0, &[(0, 9, 0)])
                    .op(NsOpKind::Open, "/x", 0, 0)
                    .done()],
                vec![],
                EmptyReason::NoAccesses,
            ),
            (
                "disjoint traces",
                vec![
                    t().file("/a", 1, &[(0, 1, 0)]).done(),
                    t().file("/b", 2, &[(0, 1, 0)]).done(),
                ],
                vec![],
                EmptyReason::NothingInCommon { min_traces: 2 },
            ),
            (
                "everything excluded",
                vec![t().file("/proc/self/x", 1, &[(0, 1, 0)]).done()],
                vec!["/proc"],
                EmptyReason::AllExcluded,
            ),
        ];
        for (name, traces, exclude, reason) in cases {
            let opts = CompileOptions {
                exclude_paths: exclude.iter().map(|s| s.to_string()).collect(),
                ..plain()
            };
            let c = run(&traces, &opts);
            assert_eq!(c.report.empty, Some(reason), "{name}");
            assert!(c.plan.entries.is_empty(), "{name}");
            let back = Plan::from_bytes(&c.plan.to_bytes()).expect("an empty plan round-trips");
            assert_eq!(back, c.plan);
        }
    }

    #[test]
    fn defaults_record_passes() {
        let trace = |started| {
            let mut t = t()
                .op(NsOpKind::Stat, "/etc/missing", -2, 0)
                .meta(8, 10, 1, 0)
                .file("/bin/app", 1, &[(0, 100, 1)]);
            t.0.meta.started_unix_ms = started;
            t.done()
        };
        let opts = CompileOptions {
            exclude_paths: vec!["/proc".into(), "/sys".into()],
            ..Default::default()
        };
        let c = run(&[trace(5), trace(7)], &opts);
        assert_eq!(
            c.plan.meta.passes,
            vec![
                "combine traces=2 min=2",
                "used-only",
                "exclude /proc,/sys",
                "small-launch min=262144",
                "merge gap=65536 distance=8",
                "lookups",
                "meta-shift budget=2097152",
            ]
        );
        let passes: Vec<&str> = c.report.passes.iter().map(|p| p.pass.as_str()).collect();
        assert_eq!(passes, c.plan.meta.passes);
        let combine = &c.report.passes[0];
        assert_eq!(
            (combine.entries_before, combine.entries_after),
            (4, 2),
            "two ranges per trace in, one file and one metadata range out"
        );
        assert_eq!(
            (combine.bytes_before, combine.bytes_after),
            (202 * P, 101 * P)
        );
        let lookups = &c.report.passes[5];
        assert_eq!((lookups.entries_before, lookups.entries_after), (2, 3));
        assert_eq!(c.plan.meta.created_unix_ms, 7);
        assert_eq!(c.plan.meta.command, vec!["app".to_string()]);
        assert_eq!(
            show(&c.plan),
            vec!["meta8:10+1", "stat /etc/missing", "/bin/app 0+100"]
        );
    }

    #[test]
    fn warnings_table() {
        let mut other = t().file("/a", 1, &[(0, 1, 0)]).done();
        other.meta.command = vec!["other".into()];
        other.stats.drops = 3;
        let mut snapshot = t().file("/a", 1, &[(0, 1, 0)]).done();
        snapshot.meta.backend = Backend::Mincore;
        let c = run(&[other, snapshot], &plain());
        assert_eq!(
            c.report.warnings,
            vec![
                Warning::MixedCommands {
                    trace: 0,
                    command: vec!["other".into()],
                    newest: vec!["app".into()],
                },
                Warning::DroppedEvents { trace: 0, drops: 3 },
                Warning::Unordered { trace: 1 },
            ]
        );
        assert_eq!(c.plan.meta.command, vec!["app".to_string()]);
    }

    /// 250 files of 20 two-page extents each, accessed round-robin, so a
    /// file's consecutive extents are 250 schedule positions apart.
    fn big_trace() -> Trace {
        let mut b = t();
        for f in 0..250u64 {
            let extents: Vec<(u64, u64, u64)> = (0..20).map(|j| (j * 4, 2, j * 250 + f)).collect();
            b = b.file(&format!("/usr/lib/lib{f}.so"), f + 1, &extents).op(
                NsOpKind::Stat,
                &format!("/opt/lib{f}.so"),
                -2,
                f,
            );
        }
        for m in 0..500 {
            b = b.meta(8, 1_000 + m * 100, 1, m * 10);
        }
        b.done()
    }

    #[test]
    fn five_thousand_extents() {
        let trace = big_trace();
        assert_eq!(
            trace.files.iter().map(|f| f.extents.len()).sum::<usize>(),
            5_000
        );

        let c = run(std::slice::from_ref(&trace), &CompileOptions::default());
        let count = |f: fn(&Entry) -> bool| c.plan.entries.iter().filter(|e| f(e)).count();
        assert_eq!(
            count(|e| matches!(e, Entry::Data { .. })),
            5_000,
            "too far apart to merge"
        );
        assert_eq!(count(|e| matches!(e, Entry::Meta { .. })), 500);
        assert_eq!(count(|e| matches!(e, Entry::Lookup { .. })), 250);
        assert_eq!(c.plan.files.len(), 250);
        assert_eq!(c.plan.data_bytes(), 5_000 * 2 * P);
        assert_eq!(c.plan.files[0].path, "/usr/lib/lib0.so");

        let merged = CompileOptions {
            merge_gap: 2 * P,
            merge_distance: u32::MAX,
            ..Default::default()
        };
        let c = run(std::slice::from_ref(&trace), &merged);
        let data: Vec<_> = c
            .plan
            .entries
            .iter()
            .filter_map(|e| match *e {
                Entry::Data { offset, len, .. } => Some((offset, len)),
                _ => None,
            })
            .collect();
        assert_eq!(data, vec![(0, 78 * P); 250], "each file one range");
        assert_eq!(c.report.bytes_holes, 250 * 19 * 2 * P);
    }

    #[test]
    fn plan_for_a_few_hundred_files_is_compact() {
        // Realistic identities and paths, 4 ranges per file, 2 metadata
        // blocks per file, a missed lookup for every third file.
        let mut b = t();
        for f in 0..300u64 {
            let extents: Vec<(u64, u64, u64)> = (0..4)
                .map(|j| (j * 37 + f % 7, 1 + j % 3, j * 300 + f))
                .collect();
            b = b.file(
                &format!("/usr/lib/x86_64-linux-gnu/libexample-{f}.so.1"),
                0,
                &extents,
            );
            let file = b.0.files.last_mut().unwrap();
            file.id = FileId {
                dev: 0x10302,
                ino: 4_000_000 + f * 17,
                size: 3 << 20,
                mtime_ns: 1_700_000_000_123_456_789,
                ctime_ns: 1_700_000_001_123_456_789,
            };
            // Implied by reading the file: costs nothing.
            b = b.op(
                NsOpKind::Open,
                &format!("/usr/lib/x86_64-linux-gnu/libexample-{f}.so.1"),
                0,
                f,
            );
            if f % 3 == 0 {
                b = b.op(
                    NsOpKind::Open,
                    &format!("/usr/lib/x86_64-linux-gnu/tls/libexample-{f}.so.1"),
                    -2,
                    f,
                );
            }
        }
        for m in 0..600u64 {
            b = b.meta(0x10300, 30_000_000 + m * 513, 1, m * 2);
        }
        // Recorded after the files last changed.
        b.0.meta.started_unix_ms = 1_700_000_100_000;
        let c = run(&[b.done()], &CompileOptions::default());
        assert_eq!((c.plan.files.len(), c.plan.lookups.len()), (300, 100));
        // About 75 bytes a file, 50 a lookup, 8 a data and 12 a metadata
        // range: the file table dominates.
        let size = c.plan.to_bytes().len();
        assert!(size < 50_000, "plan is {size} bytes");
    }
}
