//! The **lookups** pass and the time-ordered schedule: data, metadata and
//! path lookups (negative ones too: they cost directory reads) in the order
//! a launch first needed them, a lookup never after the first data read of
//! its path. A plain lookup of a file the plan reads is left out: opening
//! the file for that read is the same lookup.

use std::collections::HashMap;

use super::input::{is_walk, FileSlot, LookupSlot, Run};
use super::report::CompileReport;

/// (t, rank, key, offset): at equal times lookups, then metadata, then data,
/// the order in which they depend on each other.
pub(super) type Key = (u64, u8, u32, u64);

#[derive(Debug, Clone, Copy)]
pub(super) enum Item {
    Data(Run),
    Meta(Run),
    Lookup(u32),
}

/// Orders data, metadata and lookups by the time they were first needed.
/// Returns the schedule and the lookups it indexes.
pub(super) fn schedule(
    data: &[Run],
    metadata: &[Run],
    slots: &[FileSlot],
    lookups: Vec<LookupSlot>,
    report: &mut CompileReport,
) -> (Vec<Item>, Vec<LookupSlot>) {
    let mut first_data: HashMap<&str, u64> = HashMap::new();
    for r in data {
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
    let mut items: Vec<(Key, Item)> =
        Vec::with_capacity(data.len() + metadata.len() + lookups.len());
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
    (items.into_iter().map(|(_, item)| item).collect(), lookups)
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;

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
}
