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
//!    did ([`NEVER_USED`](crate::trace::NEVER_USED)), are left out unless `unused` asks for them
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
//!
//! Each pass is a module: `input` (the traces regrouped) and `combine` (1),
//! `filter` (2, 3 and used-only), `merge` (4), `schedule` (5), `shift` (6),
//! `sort` (7), and `assemble`, which turns the schedule into a [`Plan`].
//! This module only runs them in order and keeps the report.

mod assemble;
mod combine;
mod filter;
mod input;
mod merge;
mod options;
mod report;
mod schedule;
mod shift;
mod sort;
#[cfg(test)]
mod testkit;

use crate::container::FormatError;
use crate::plan::{Plan, PlanFile, PlanMeta};
use crate::trace::Trace;

pub use merge::BACKWARD_JOIN_LIMIT;
pub use options::{
    CompileError, CompileOptions, DEFAULT_MERGE_DISTANCE, DEFAULT_MERGE_GAP,
    DEFAULT_METADATA_SHIFT, DEFAULT_MIN_LAUNCH_BYTES, UNUSED_KEPT, USED_ONLY,
};
pub use report::{CompileReport, Compiled, EmptyReason, PassReport, Warning};

use input::{bytes, Input};
use report::pass_same;

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
        warnings: report::warnings(traces),
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

    let input = Input::gather(traces, &mut report);
    let (mut kept, pass) = combine::combine_traces(traces, &input, k, &mut report);
    passes.push(pass);
    let Input {
        files: slots,
        devices,
        lookups,
    } = input;
    let lookups = if opts.lookups {
        lookups.into_iter().filter(|l| l.traces >= k).collect()
    } else {
        Vec::new()
    };
    let empty_after_combine = kept.data.is_empty() && kept.metadata.is_empty();

    passes.push(filter::used_only(&mut kept, opts.unused, &mut report));
    let (lookups, pass) =
        filter::exclude(&mut kept, &slots, lookups, &opts.exclude_paths, &mut report);
    passes.extend(pass);
    let needed = kept.bytes();
    let (small, pass) = filter::small_launch(kept.entries(), needed, opts.min_launch_bytes);
    passes.extend(pass);
    let nothing = kept.data.is_empty() && kept.metadata.is_empty();
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
    let before = (kept.entries(), needed);
    let (data, holes_d) = merge::range_merge(kept.data, opts.merge_gap, opts.merge_distance);
    let (metadata, holes_m) =
        merge::range_merge(kept.metadata, opts.merge_gap, opts.merge_distance);
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

    // lookups: the time-ordered schedule, lookups ahead of their files' data.
    let (mut items, lookups) = schedule::schedule(&data, &metadata, &slots, lookups, &mut report);
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
        items = sort::sort_physical(items, &devices, &files, physical);
        passes.push(pass_same(
            "sort physical".into(),
            items.len(),
            items.len(),
            total,
        ));
    } else if opts.metadata_shift > 0 {
        items = shift::shift_metadata(items, opts.metadata_shift);
        let pass = format!("meta-shift budget={}", opts.metadata_shift);
        passes.push(pass_same(pass, items.len(), items.len(), total));
    }

    meta.passes = passes.iter().map(|p| p.pass.clone()).collect();
    let plan = assemble::assemble(meta, &items, &slots, &devices, &lookups);
    report.passes = passes;
    match plan.check() {
        Ok(()) => {}
        // Traces within the limits can still combine past them.
        Err(FormatError::TooLarge {
            limit,
            value,
            max,
            at,
            ..
        }) => {
            return Err(CompileError::TooLarge {
                limit,
                value,
                max,
                at,
            })
        }
        Err(e) => debug_assert!(false, "compiled an invalid plan: {e}"),
    }
    Ok(Compiled { plan, report })
}

#[cfg(test)]
mod tests {
    use super::testkit::*;

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
}
