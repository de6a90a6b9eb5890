//! Property tests of the compiler: any small set of valid traces compiles
//! without panicking into a plan that passes `check()`, and the merge and
//! metadata-shift passes keep their promises.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use warmstart_plan::compile::{compile, CompileOptions};
use warmstart_plan::plan::PlanFile;
use warmstart_plan::trace::{
    Extent, FileId, FileTrace, MetaExtent, NamespaceOp, NsOpKind, TraceStats, NEVER_USED, PAGE_SIZE,
};
use warmstart_plan::{Entry, Plan, Trace};

const P: u64 = PAGE_SIZE;

fn time() -> impl Strategy<Value = u64> {
    prop_oneof![4 => 0u64..2_000, 1 => (0u64..2_000).prop_map(|t| NEVER_USED + t)]
}

fn extent() -> impl Strategy<Value = Extent> {
    (0u64..64, 0u64..P, 1u64..16 * P, time(), any::<bool>()).prop_map(
        |(page, skew, len, t_ns, from_storage)| Extent {
            offset: page * P + skew / 512 * 512,
            len,
            t_ns,
            from_storage,
        },
    )
}

/// Files by path index (6 is "no path"); one inode per path, so no file is
/// dropped as stale, and ctime 0, so none as written during the launch.
fn files() -> impl Strategy<Value = Vec<FileTrace>> {
    proptest::collection::btree_map(
        0u64..7,
        (any::<bool>(), proptest::collection::vec(extent(), 0..6)),
        0..5,
    )
    .prop_map(|m| {
        m.into_iter()
            .map(|(i, (sized, extents))| FileTrace {
                path: (i < 6).then(|| format!("/p{i}")),
                id: FileId {
                    dev: 1,
                    ino: i + 1,
                    size: if sized { 1 << 20 } else { 0 },
                    ..Default::default()
                },
                extents,
            })
            .collect()
    })
}

fn metadata() -> impl Strategy<Value = Vec<MetaExtent>> {
    proptest::collection::vec(
        (0u64..2, 0u64..100, 1u64..4, time()).prop_map(|(device, page, pages, t_ns)| MetaExtent {
            device: 8 + device,
            offset: page * P,
            len: pages * P,
            t_ns: t_ns % NEVER_USED,
        }),
        0..5,
    )
}

fn ops() -> impl Strategy<Value = Vec<NamespaceOp>> {
    let kinds = vec![
        NsOpKind::Exec,
        NsOpKind::Open,
        NsOpKind::Stat,
        NsOpKind::Access,
        NsOpKind::Readlink,
        NsOpKind::DirRead,
    ];
    proptest::collection::vec(
        (
            proptest::sample::select(kinds),
            0u64..8,
            any::<bool>(),
            0u64..2_000,
        )
            .prop_map(|(kind, i, ok, t_ns)| NamespaceOp {
                t_ns,
                kind,
                path: format!("/p{i}"),
                result: if ok { 0 } else { -2 },
            }),
        0..4,
    )
}

fn trace() -> impl Strategy<Value = Trace> {
    (files(), metadata(), ops(), 0u64..3).prop_map(|(files, metadata, namespace_ops, cmd)| {
        let mut meta = common::meta();
        meta.command = vec![format!("/usr/bin/app{}", cmd % 2)];
        Trace {
            meta,
            files,
            metadata,
            namespace_ops,
            stats: TraceStats {
                drops: cmd / 2,
                ..Default::default()
            },
        }
    })
}

fn options(n: usize) -> impl Strategy<Value = CompileOptions> {
    (
        proptest::option::of(1..=n as u32),
        proptest::sample::select(vec![0, P, 64 << 10]),
        proptest::sample::select(vec![0, 1, 8, u32::MAX]),
        proptest::sample::select(vec![0, P, 2 << 20]),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        proptest::sample::select(vec![0, 64 << 10]),
        any::<bool>(),
    )
        .prop_map(
            |(min_traces, gap, distance, shift, sorted, unused, lookups, min_bytes, exclude)| {
                CompileOptions {
                    min_traces,
                    merge_gap: gap,
                    merge_distance: distance,
                    metadata_shift: shift,
                    sorted,
                    min_launch_bytes: min_bytes,
                    exclude_paths: if exclude { vec!["/p1".into()] } else { vec![] },
                    lookups,
                    unused,
                }
            },
        )
}

fn traces_and_options() -> impl Strategy<Value = (Vec<Trace>, CompileOptions)> {
    proptest::collection::vec(trace(), 1..4).prop_flat_map(|ts| {
        let n = ts.len();
        (Just(ts), options(n))
    })
}

/// A physical layout for the sorted pass: some files mapped, some not.
fn physical(f: &PlanFile, offset: u64) -> Option<u64> {
    (!f.id.ino.is_multiple_of(3)).then(|| (f.id.ino * 7919 % 101) << 30 | offset)
}

/// Page-aligned byte ranges as a set of pages.
fn pages(offset: u64, len: u64) -> impl Iterator<Item = u64> {
    offset / P..(offset + len).div_ceil(P)
}

/// (offset, len) ranges by key.
type Ranges<K> = BTreeMap<K, Vec<(u64, u64)>>;

/// Data ranges of the plan by path, and metadata by device.
fn ranges(p: &Plan) -> (Ranges<String>, Ranges<u64>) {
    let mut data: Ranges<String> = BTreeMap::new();
    let mut meta: Ranges<u64> = BTreeMap::new();
    for e in &p.entries {
        match *e {
            Entry::Data { file, offset, len } => data
                .entry(p.files[file as usize].path.clone())
                .or_default()
                .push((offset, len)),
            Entry::Meta {
                device,
                offset,
                len,
            } => meta.entry(device).or_default().push((offset, len)),
            Entry::Lookup { .. } => {}
        }
    }
    (data, meta)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    /// Anything valid compiles, and what comes out is a valid plan.
    #[test]
    fn compiles_to_a_valid_plan((traces, opts) in traces_and_options()) {
        for t in &traces {
            prop_assume!(t.check().is_ok());
        }
        let c = compile(&traces, &opts, &physical).expect("valid traces and options compile");
        prop_assert!(c.plan.check().is_ok(), "{:?}", c.plan.check());
        // Round trip through the file format.
        prop_assert_eq!(&Plan::from_bytes(&c.plan.to_bytes()).unwrap(), &c.plan);
        for f in &c.plan.files {
            for prefix in &opts.exclude_paths {
                prop_assert!(!f.path.starts_with(prefix.as_str()), "{} excluded", f.path);
            }
        }
        if opts.sorted {
            let metas: Vec<(u64, u64)> = c.plan.entries.iter().filter_map(|e| match *e {
                Entry::Meta { device, offset, .. } => Some((device, offset)),
                _ => None,
            }).collect();
            prop_assert!(metas.windows(2).all(|w| w[0] <= w[1]), "{metas:?}");
        }
    }

    /// Merge: with the union kept and nothing filtered, every page some
    /// trace read is in the plan, ranges of one file or device never
    /// overlap, and what the plan reads beyond those pages is exactly the
    /// holes the report says merge filled.
    #[test]
    fn merge_covers_every_page_and_reports_its_holes(
        (traces, mut opts) in traces_and_options()
    ) {
        for t in &traces {
            prop_assume!(t.check().is_ok());
        }
        opts.min_traces = Some(1);
        opts.unused = true;
        opts.exclude_paths.clear();
        opts.min_launch_bytes = 0;
        let c = compile(&traces, &opts, &physical).unwrap();
        let mut want_data: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
        let mut want_meta: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
        for t in &traces {
            for f in &t.files {
                let Some(path) = &f.path else { continue };
                let set = want_data.entry(path.clone()).or_default();
                for e in &f.extents {
                    set.extend(pages(e.offset, e.len));
                }
            }
            for m in &t.metadata {
                want_meta.entry(m.device).or_default().extend(pages(m.offset, m.len));
            }
        }
        let (data, meta) = ranges(&c.plan);
        let mut read = 0u64;
        let mut needed = 0u64;
        for (path, pages_wanted) in want_data {
            let got_ranges = data.get(&path).cloned().unwrap_or_default();
            let mut covered = BTreeSet::new();
            for &(o, l) in &got_ranges {
                prop_assert_eq!(o % P, 0);
                prop_assert_eq!(l % P, 0);
                for pg in pages(o, l) {
                    prop_assert!(covered.insert(pg), "{} page {} read twice", path, pg);
                }
            }
            prop_assert!(
                pages_wanted.is_subset(&covered),
                "{}: {:?} not in {:?}", path, pages_wanted, got_ranges
            );
            read += covered.len() as u64 * P;
            needed += pages_wanted.len() as u64 * P;
        }
        for (device, pages_wanted) in want_meta {
            let mut covered = BTreeSet::new();
            for &(o, l) in meta.get(&device).map(Vec::as_slice).unwrap_or(&[]) {
                for pg in pages(o, l) {
                    prop_assert!(covered.insert(pg), "device {} page {} read twice", device, pg);
                }
            }
            prop_assert!(pages_wanted.is_subset(&covered));
            read += covered.len() as u64 * P;
            needed += pages_wanted.len() as u64 * P;
        }
        prop_assert_eq!(read, c.plan.data_bytes() + c.plan.meta_bytes());
        prop_assert_eq!(read - needed, c.report.bytes_holes);
        if opts.merge_gap == 0 {
            prop_assert_eq!(c.report.bytes_holes, 0);
        }
    }

    /// Metadata shift: the same entries as without it, data and lookups in
    /// the same order, metadata in the same order among itself, each
    /// metadata range moved earlier past at most `budget` bytes of data.
    #[test]
    fn shift_moves_metadata_earlier_within_its_budget(
        (traces, mut opts) in traces_and_options()
    ) {
        for t in &traces {
            prop_assume!(t.check().is_ok());
        }
        opts.sorted = false;
        let budget = opts.metadata_shift.max(1);
        let unshifted = compile(&traces, &CompileOptions { metadata_shift: 0, ..opts.clone() }, &physical).unwrap().plan;
        let shifted = compile(&traces, &CompileOptions { metadata_shift: budget, ..opts }, &physical).unwrap().plan;
        prop_assert_eq!(&unshifted.files, &shifted.files);
        prop_assert_eq!(&unshifted.lookups, &shifted.lookups);
        let split = |p: &Plan| {
            let mut others = Vec::new();
            let mut metas = Vec::new();
            let mut data_before = 0u64;
            for e in &p.entries {
                match *e {
                    Entry::Meta { .. } => metas.push((*e, data_before)),
                    Entry::Data { len, .. } => {
                        data_before += len;
                        others.push(*e)
                    }
                    Entry::Lookup { .. } => others.push(*e),
                }
            }
            (others, metas)
        };
        let (others0, metas0) = split(&unshifted);
        let (others1, metas1) = split(&shifted);
        prop_assert_eq!(others0, others1);
        prop_assert_eq!(metas0.len(), metas1.len());
        for ((m0, before0), (m1, before1)) in metas0.into_iter().zip(metas1) {
            prop_assert_eq!(m0, m1);
            prop_assert!(before1 <= before0, "moved later");
            prop_assert!(before0 - before1 <= budget, "moved past {} > {}", before0 - before1, budget);
        }
    }
}
