//! Range merge (Paralfetch §3.2, Algorithm 2), with a hole allowance and a
//! limit on how much a joined range may read ahead of a piece needed first.

use std::collections::BTreeMap;

use crate::trace::NEVER_USED;

use super::input::Run;

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
pub(super) fn range_merge(runs: Vec<Run>, gap: u64, distance: u32) -> (Vec<Run>, u64) {
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

#[cfg(test)]
mod tests {
    use super::super::testkit::*;

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
}
