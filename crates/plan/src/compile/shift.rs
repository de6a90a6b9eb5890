//! Metadata shift (Paralfetch §3.2, Algorithm 1): each metadata range moves
//! earlier past a budget of data reads, so that the reads depending on it
//! do not wait for it.

use super::schedule::Item;

/// Paralfetch's metadata shift with a budget in data bytes: each metadata
/// range moves earlier past as many data reads as fit in `budget` bytes
/// (and past any lookups), but never past an earlier metadata range.
pub(super) fn shift_metadata(items: Vec<Item>, budget: u64) -> Vec<Item> {
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

#[cfg(test)]
mod tests {
    use super::super::testkit::*;

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
}
