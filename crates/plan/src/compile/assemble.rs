//! The last step: the schedule's items become a [`Plan`] with its file and
//! lookup tables.

use std::collections::HashMap;

use crate::plan::{Entry, Lookup, Plan, PlanFile, PlanMeta};

use super::input::{FileSlot, LookupSlot, Span};
use super::schedule::Item;

/// Builds the plan: files and lookups tabled in order of first use, so the
/// tables read like the schedule and each path is stored once.
pub(super) fn assemble(
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
    use super::super::testkit::*;
    use super::super::*;
    use crate::plan::Entry;
    use crate::trace::{FileId, NsOpKind};

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
