//! Combine (FAST §5.1, generalised to k-of-n): the traces' ranges become
//! one set of ranges to read, each page kept if it appears in at least `k`
//! of the `n` traces and scheduled at the earliest time any trace first
//! used it. Files whose identity went stale or that the launch itself
//! wrote are left out here too, since both are judged per file.

use std::collections::{BTreeMap, HashMap};

use crate::trace::{Trace, NEVER_USED, PAGE_SIZE};

use super::input::{bytes, Input, Run, Span};
use super::report::{CompileReport, PassReport};

/// What combine kept, and per file slot, what the later passes need.
pub(super) struct Kept {
    pub(super) data: Vec<Run>,
    pub(super) metadata: Vec<Run>,
    /// Data bytes kept per file slot.
    pub(super) slot_kept: Vec<u64>,
    /// File slots left out as stale or written during the launch.
    pub(super) dropped: Vec<bool>,
}

impl Kept {
    pub(super) fn entries(&self) -> usize {
        self.data.len() + self.metadata.len()
    }

    pub(super) fn bytes(&self) -> u64 {
        bytes(&self.data) + bytes(&self.metadata)
    }
}

/// The combine pass over the gathered input, with its report.
pub(super) fn combine_traces(
    traces: &[Trace],
    input: &Input,
    k: u32,
    report: &mut CompileReport,
) -> (Kept, PassReport) {
    let n = traces.len();
    let slots = &input.files;
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
            size => size.div_ceil(PAGE_SIZE).saturating_mul(PAGE_SIZE),
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
    for (key, (_, spans)) in input.devices.iter().enumerate() {
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
        let start_ns = (traces[slot.newest].meta.started_unix_ms as i64).saturating_mul(1_000_000);
        if slot_kept[key] > 0
            && !dropped[key]
            && slot.id.ctime_ns > start_ns.saturating_add(1_000_000)
        {
            dropped[key] = true;
            report.files_written += 1;
            report.bytes_written += slot_kept[key];
        }
    }
    data.retain(|r| !dropped[r.key as usize]);
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
    let kept = Kept {
        data,
        metadata,
        slot_kept,
        dropped,
    };
    let pass = PassReport {
        pass: format!("combine traces={n} min={k}"),
        entries_before: input_entries,
        entries_after: kept.entries(),
        bytes_before: input_bytes,
        bytes_after: kept.bytes(),
    };
    (kept, pass)
}

/// A piece of the sweep: `start..end`, in enough traces, first touched at
/// `t` by the earliest of them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Seg {
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) t: u64,
}

pub(super) struct Combined {
    /// Pieces in at least k traces, in offset order.
    pub(super) segs: Vec<Seg>,
    /// Bytes in at least one trace.
    pub(super) seen: u64,
    /// Bytes in at least k traces.
    pub(super) kept: u64,
}

/// Counts, for every byte of one file or device, in how many distinct
/// traces it appears, by sweeping the range boundaries (no per-page work).
/// `counts` is scratch space, one zero per trace, and is left zeroed.
pub(super) fn combine(spans: &[Span], k: usize, counts: &mut [u32]) -> Combined {
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
pub(super) fn coalesce(key: u32, mut segs: Vec<Seg>) -> Vec<Run> {
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

#[cfg(test)]
mod tests {
    use super::super::testkit::*;

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
}
