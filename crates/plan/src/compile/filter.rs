//! The passes that leave ranges out: **used-only** (pages the kernel only
//! read ahead, which no launch used), **exclude** (paths never worth
//! reading ahead) and **small-launch** (a launch too small to be worth a
//! prefetcher, FAST §6.3.3).

use crate::trace::NEVER_USED;

use super::combine::Kept;
use super::input::{FileSlot, LookupSlot, Run};
use super::options::{UNUSED_KEPT, USED_ONLY};
use super::report::{CompileReport, PassReport};

/// used-only: traces tell the pages a launch used from those the kernel
/// only read ahead (every recorder backend does; a residency snapshot has
/// used ones only; traces of format 1.0 mark none). If no page at all was
/// used, they could not tell. Either way the plan records which was asked
/// for, so that the launch manager can tell a plan compiled before this
/// pass existed ([`UNUSED_KEPT`] or [`USED_ONLY`]).
pub(super) fn used_only(kept: &mut Kept, unused: bool, report: &mut CompileReport) -> PassReport {
    let before = (kept.entries(), kept.bytes());
    if !unused && kept.data.iter().any(|r| r.t < NEVER_USED) {
        report.bytes_unused = kept
            .data
            .iter()
            .filter(|r| r.t >= NEVER_USED)
            .map(Run::len)
            .sum();
        kept.data.retain(|r| r.t < NEVER_USED);
        kept.slot_kept.iter_mut().for_each(|k| *k = 0);
        for r in &kept.data {
            kept.slot_kept[r.key as usize] += r.len();
        }
    }
    PassReport {
        pass: if unused { UNUSED_KEPT } else { USED_ONLY }.into(),
        entries_before: before.0,
        entries_after: kept.entries(),
        bytes_before: before.1,
        bytes_after: kept.bytes(),
    }
}

/// exclude: leaves out the data and lookups of paths under `prefixes`.
/// Returns the lookups left, and the pass's report if there are prefixes.
pub(super) fn exclude(
    kept: &mut Kept,
    slots: &[FileSlot],
    lookups: Vec<LookupSlot>,
    prefixes: &[String],
    report: &mut CompileReport,
) -> (Vec<LookupSlot>, Option<PassReport>) {
    if prefixes.is_empty() {
        return (lookups, None);
    }
    let before = (kept.entries(), kept.bytes());
    let excluded: Vec<bool> = slots
        .iter()
        .map(|s| under_prefix(&s.path, prefixes))
        .collect();
    for (key, &ex) in excluded.iter().enumerate() {
        if ex && kept.slot_kept[key] > 0 && !kept.dropped[key] {
            report.files_excluded += 1;
            report.bytes_excluded += kept.slot_kept[key];
        }
    }
    kept.data.retain(|r| !excluded[r.key as usize]);
    let pass = PassReport {
        pass: format!("exclude {}", prefixes.join(",")),
        entries_before: before.0,
        entries_after: kept.entries(),
        bytes_before: before.1,
        bytes_after: kept.bytes(),
    };
    let lookups = lookups
        .into_iter()
        .filter(|l| !under_prefix(&l.path, prefixes))
        .collect();
    (lookups, Some(pass))
}

/// small-launch: whether a launch needing `needed` bytes gets an empty
/// plan, with the pass's report if the pass is on (`min_bytes` > 0).
pub(super) fn small_launch(
    entries: usize,
    needed: u64,
    min_bytes: u64,
) -> (bool, Option<PassReport>) {
    let small = needed < min_bytes;
    let pass = (min_bytes > 0).then(|| PassReport {
        pass: format!("small-launch min={min_bytes}"),
        entries_before: entries,
        entries_after: if small { 0 } else { entries },
        bytes_before: needed,
        bytes_after: if small { 0 } else { needed },
    });
    (small, pass)
}

/// Whether `path` is under one of `prefixes`, by whole components.
pub(super) fn under_prefix(path: &str, prefixes: &[String]) -> bool {
    prefixes.iter().any(|p| {
        let p = p.trim_end_matches('/');
        p.is_empty()
            || path == p
            || path
                .strip_prefix(p)
                .is_some_and(|rest| rest.starts_with('/'))
    })
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;

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
}
