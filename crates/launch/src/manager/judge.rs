//! After a prefetched launch: its miss ratio, from the cheap count of
//! what the application read itself or from an exact audit, and what the
//! profile does next.

use warmstart_plan::trace::NEVER_USED;
use warmstart_plan::{Plan, Trace};
use warmstart_replay::Report;

use super::learning::{add_trace, compile_profile, read_traces, relearn};
use super::{Config, LaunchReport};
use crate::store::{self, Phase, Profile, Store};

/// After a prefetched launch: the miss ratio and stale files decide whether
/// the profile stays, asks for an exact audit, or relearns. `audit` is the
/// launch's exact recording, if there is one; otherwise the cheap
/// `report.app_read_bytes` is used.
pub(crate) fn judge(
    prof: &mut Profile,
    store: &Store,
    plan: &Plan,
    audit: Option<Trace>,
    replay_report: Option<Report>,
    cfg: &Config,
    report: &mut LaunchReport,
) {
    let plan_bytes = (plan.data_bytes() + plan.meta_bytes()).max(1);
    // The cheap check counts every byte the application read itself,
    // including pages the plan has but the replay had not reached yet (a
    // late prefetch, which relearning cannot fix). So a high cheap miss
    // ratio only asks for an exact audit next time; the exact audit
    // separates pages the plan lacks (coverage misses) and decides.
    let audited = audit.is_some();
    if let Some(t) = &audit {
        // Kept for `warmstart show`: what the application still read itself.
        let _ = store::write_atomic(&store.dir(&prof.name).join("last-audit"), &t.to_bytes());
        let read = t.stats.bytes_from_storage + t.stats.metadata_bytes;
        report.app_read_bytes = Some(read);
        report.audit_pages_from_storage = Some(t.stats.bytes_from_storage / 4096);
        report.audit_pages = Some(t.stats.pages);
        report.uncovered_bytes = Some(uncovered_bytes(plan, t));
    }
    let miss = if audited {
        report.uncovered_bytes.map(|b| b as f64 / plan_bytes as f64)
    } else {
        report.app_read_bytes.map(|b| b as f64 / plan_bytes as f64)
    };
    report.miss_ratio = miss;
    prof.last_miss_ratio = miss;
    prof.audit_next = false;
    if audited {
        prof.launches_since_audit = 0;
    } else {
        prof.launches_since_audit += 1;
    }
    let stale = replay_report
        .as_ref()
        .map_or(0, |r| r.skipped_files.len() as u64);
    prof.last_stale_files = stale;
    report.replay = replay_report;

    let stale_share = stale as f64 / plan.files.len().max(1) as f64;
    if stale_share > cfg.stale_share {
        relearn(
            prof,
            store,
            format!(
                "{stale} of {} files changed since the plan was made",
                plan.files.len()
            ),
            true,
            report,
        );
    } else if let Some(m) = miss.filter(|m| *m > cfg.rmiss) {
        if audited {
            relearn(
                prof,
                store,
                format!("miss ratio {m:.2} above {:.2}", cfg.rmiss),
                true,
                report,
            );
        } else {
            // Twice in a row: one launch can read a lot itself by chance
            // (a fault ahead of the replay reads megabytes around it), and
            // an audit costs a recorder load.
            prof.cheap_over += 1;
            if prof.cheap_over >= 2 && prof.launches_since_audit >= cfg.nchk {
                prof.audit_next = true;
                prof.note = Some(format!(
                    "read {m:.2} of the plan itself: the next launch is audited"
                ));
            }
        }
    }
    if audited || miss.is_none_or(|m| m <= cfg.rmiss) {
        prof.cheap_over = 0;
    }
    // An audited launch is a full recording: it seeds the new profile.
    if prof.phase == Phase::Learning {
        if let Some(t) = audit {
            if let Err(e) = add_trace(&t, store, prof, cfg, report) {
                eprintln!("warmstart: could not keep the audit trace: {e}");
            }
        }
    } else if prof.phase == Phase::Prefetching {
        // A launch the replay speeds up can use pages that the slower
        // recorded launches only read ahead: a JVM's compiler threads get
        // further through its class archive (javac on the `sd` model: 768
        // KiB more, waited for 0.3-0.5 s behind the replay). The audit
        // that saw it amends the plan.
        let amend = audit.filter(|_| report.uncovered_bytes.is_some_and(|b| b > 0));
        // A plan from a warmstart before the used-only pass still reads
        // what the kernel read ahead and no launch used, and one compiled
        // before its device was found to seek is in first-use order:
        // compiled again too.
        if amend.is_some()
            || predates_used_only(plan, cfg)
            || wants_physical_order(plan, store, cfg)
        {
            recompile(store, prof, cfg, report, amend);
        }
    }
}

/// Compiles the profile's plan again, after this launch, from its learned
/// traces and the amending audit's: `amend`, which replaces the one kept,
/// or the one kept. Only from all the learned traces: with one unreadable
/// (or none, for a plan imported from elsewhere) the plan stays as it is.
/// Traces of format 1.0 mark no page unused; their plan is the same.
fn recompile(
    store: &Store,
    prof: &mut Profile,
    cfg: &Config,
    report: &mut LaunchReport,
    amend: Option<Trace>,
) {
    let learned: Option<Vec<Trace>> = read_traces(store, prof)
        .into_iter()
        .map(|(_, t)| t.ok())
        .collect();
    let Some(mut traces) = learned.filter(|t| !t.is_empty()) else {
        return;
    };
    let n = traces.len();
    let amended = amend.is_some();
    let path = store.amend_trace_path(&prof.name);
    match amend {
        Some(t) => {
            if let Err(e) = store::write_atomic(&path, &t.to_bytes()) {
                eprintln!("warmstart: could not keep the audit trace: {e}");
                return;
            }
            traces.push(t);
        }
        None => {
            if let Some(t) = std::fs::read(&path)
                .ok()
                .and_then(|b| Trace::from_bytes(&b).ok())
            {
                traces.push(t);
            }
        }
    }
    if let Err(e) = compile_profile(&traces, n, store, prof, cfg, report) {
        eprintln!("warmstart: could not compile the plan again: {e}");
        return;
    }
    if amended && prof.phase == Phase::Prefetching {
        let lacked = report.uncovered_bytes.unwrap_or(0);
        prof.note = Some(format!(
            "{}; amended by an audited launch that read {} KiB the plan lacked",
            prof.note.as_deref().unwrap_or("plan compiled again"),
            lacked / 1024
        ));
        report.compiled = prof.note.clone();
    }
}

/// Whether `plan` is in first-use order while its device seeks, so that
/// the sorted strategy would want it in physical order.
fn wants_physical_order(plan: &Plan, store: &Store, cfg: &Config) -> bool {
    !plan.meta.sorted
        && !cfg.compile.sorted
        && super::prefetch::strategy(plan, store, cfg) == super::Strategy::Sorted
}

/// Whether `plan` was compiled before the used-only pass existed (its
/// passes name neither outcome of it), while the configuration asks for it.
fn predates_used_only(plan: &Plan, cfg: &Config) -> bool {
    use warmstart_plan::compile::{UNUSED_KEPT, USED_ONLY};
    !cfg.compile.unused
        && !plan
            .meta
            .passes
            .iter()
            .any(|p| p == USED_ONLY || p == UNUSED_KEPT)
}

/// Bytes the audited launch used and read from storage itself in ranges
/// the plan does not prefetch: the plan's coverage misses (files by path).
/// What the kernel read ahead around them and the launch never used is not
/// a miss: plans leave it out on purpose (the used-only pass), and one
/// fault ahead of the replay reads megabytes of it here.
fn uncovered_bytes(plan: &Plan, audit: &Trace) -> u64 {
    use std::collections::HashMap;
    use warmstart_plan::Entry;
    let mut covered: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
    for e in &plan.entries {
        if let Entry::Data { file, offset, len } = *e {
            covered
                .entry(plan.files[file as usize].path.as_str())
                .or_default()
                .push((offset, offset + len));
        }
    }
    for v in covered.values_mut() {
        v.sort_unstable();
        // Merge overlaps so one binary search answers "is this page covered".
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(v.len());
        for &(s, e) in v.iter() {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        *v = merged;
    }
    let mut missing = 0;
    for f in &audit.files {
        let ranges = f.path.as_deref().and_then(|p| covered.get(p));
        let used_from_storage =
            |e: &&warmstart_plan::trace::Extent| e.from_storage && e.t_ns < NEVER_USED;
        for e in f.extents.iter().filter(used_from_storage) {
            let mut page = e.offset;
            while page < e.end() {
                let hit = ranges.is_some_and(|r| {
                    let i = r.partition_point(|(s, _)| *s <= page);
                    i > 0 && r[i - 1].1 > page
                });
                if !hit {
                    missing += warmstart_plan::trace::PAGE_SIZE;
                }
                page += warmstart_plan::trace::PAGE_SIZE;
            }
        }
    }
    missing
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plan reading `(offset, len)` ranges of one file, `/a`.
    fn plan_of_a(ranges: Vec<(u64, u64)>) -> Plan {
        use warmstart_plan::plan::{PlanFile, PlanMeta};
        Plan {
            meta: PlanMeta {
                command: vec![],
                created_unix_ms: 0,
                traces: 1,
                min_traces: 1,
                passes: vec![],
                sorted: false,
            },
            files: vec![PlanFile {
                path: "/a".into(),
                id: Default::default(),
            }],
            lookups: vec![],
            entries: ranges
                .into_iter()
                .map(|(offset, len)| warmstart_plan::Entry::Data {
                    file: 0,
                    offset,
                    len,
                })
                .collect(),
        }
    }

    #[test]
    fn an_audit_needs_two_high_cheap_readings_in_a_row() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let plan = plan_of_a(vec![(0, 100 << 12)]);
        let cfg = Config::default();
        let mut prof = Profile::new("p", &["p".into()]);
        prof.phase = Phase::Prefetching;
        prof.launches_since_audit = cfg.nchk;
        // The application's own reads, in pages of the plan's 100.
        let mut launch = |pages: u64| {
            let mut report = LaunchReport::new("p", Phase::Prefetching);
            report.app_read_bytes = Some(pages << 12);
            judge(&mut prof, &store, &plan, None, None, &cfg, &mut report);
            (prof.audit_next, prof.cheap_over)
        };
        assert_eq!(launch(50), (false, 1), "one high reading");
        assert_eq!(launch(1), (false, 0), "a low one starts over");
        assert_eq!(launch(50), (false, 1));
        assert_eq!(launch(50), (true, 2), "two in a row: audit");
    }

    #[test]
    fn coverage_misses_count_only_what_the_plan_lacks() {
        use warmstart_plan::trace::*;
        let plan = plan_of_a(vec![(0, 8192), (4096, 8192)]);
        let ext = |offset, len, from_storage| Extent {
            offset,
            len,
            t_ns: 0,
            from_storage,
        };
        let file = |path: &str, extents| FileTrace {
            path: Some(path.into()),
            id: FileId::default(),
            extents,
        };
        let audit = Trace {
            meta: TraceMeta {
                command: vec![],
                cwd: "/".into(),
                backend: Backend::Bpf,
                cache: CacheState::AsFound,
                end: EndReason::Exited,
                exit_code: Some(0),
                started_unix_ms: 0,
                hostname: String::new(),
            },
            files: vec![
                // pages 0..3 covered (overlapping entries), page 3 not, page 4 cached
                file("/a", vec![ext(0, 16384, true), ext(16384, 4096, false)]),
                // a file the plan lacks entirely
                file("/b", vec![ext(0, 8192, true)]),
                // read ahead by the kernel, never used: not a miss
                file(
                    "/c",
                    vec![Extent {
                        t_ns: NEVER_USED + 5,
                        ..ext(0, 1 << 20, true)
                    }],
                ),
            ],
            metadata: vec![],
            namespace_ops: vec![],
            stats: TraceStats::default(),
        };
        assert_eq!(uncovered_bytes(&plan, &audit), 4096 + 8192);
    }

    /// A launch of `/a`: `(first page, count, from storage)` used, and
    /// pages read from storage that it never used, in pages.
    fn launch_of_a(used: &[(u64, u64, bool)], ahead: &[(u64, u64)]) -> Trace {
        use warmstart_plan::trace::*;
        let page = |first: u64, n: u64, t_ns, from_storage| Extent {
            offset: first * PAGE_SIZE,
            len: n * PAGE_SIZE,
            t_ns,
            from_storage,
        };
        let mut extents: Vec<Extent> = used
            .iter()
            .map(|&(first, n, stored)| page(first, n, first * 1000, stored))
            .collect();
        extents.extend(
            ahead
                .iter()
                .map(|&(first, n)| page(first, n, NEVER_USED + first, true)),
        );
        Trace {
            meta: TraceMeta {
                command: vec!["p".into()],
                cwd: "/".into(),
                backend: Backend::Bpf,
                cache: CacheState::AsFound,
                end: EndReason::Exited,
                exit_code: Some(0),
                started_unix_ms: 0,
                hostname: String::new(),
            },
            files: vec![FileTrace {
                path: Some("/a".into()),
                id: FileId {
                    dev: 1,
                    ino: 1,
                    size: 4096 * PAGE_SIZE,
                    mtime_ns: 0,
                    ctime_ns: 0,
                },
                extents,
            }],
            metadata: vec![],
            namespace_ops: vec![],
            stats: TraceStats::default(),
        }
    }

    #[test]
    fn an_audit_amends_the_plan_with_pages_the_learned_launches_only_read_ahead() {
        use crate::manager::learning::load_plan;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let cfg = Config::default();
        let mut prof = Profile::new("p", &["p".into()]);
        // Two cold launches use pages 0..512 and read 512..576 ahead.
        let cold = launch_of_a(&[(0, 512, true)], &[(512, 64)]);
        for _ in 0..2 {
            let mut report = LaunchReport::new("p", prof.phase);
            add_trace(&cold, &store, &mut prof, &cfg, &mut report).unwrap();
        }
        assert_eq!(prof.phase, Phase::Prefetching);
        assert!(prof.audit_next, "a new plan's first launch is audited");
        let plan = load_plan(&store, "p").unwrap();
        assert_eq!(plan.data_bytes(), 512 * 4096);

        // The audited launch, prefetched, also used 512..544 and page 1000,
        // which it read itself.
        let audit = launch_of_a(&[(0, 512, false), (512, 32, true), (1000, 1, true)], &[]);
        let mut report = LaunchReport::new("p", Phase::Prefetching);
        judge(
            &mut prof,
            &store,
            &plan,
            Some(audit),
            None,
            &cfg,
            &mut report,
        );
        assert_eq!(report.uncovered_bytes, Some(33 * 4096));
        assert_eq!(prof.phase, Phase::Prefetching, "under R_miss: kept");
        assert!(!prof.audit_next);
        let note = report.compiled.clone().expect("compiled again");
        assert!(
            note.contains("amended by an audited launch that read 132 KiB"),
            "{note}"
        );
        assert!(store.amend_trace_path("p").exists());
        // The pages a learned launch read too; page 1000, which only the
        // audited launch read, is left out.
        let amended = load_plan(&store, "p").unwrap();
        assert_eq!(amended.data_bytes(), 544 * 4096);

        // An audit that finds nothing new leaves the plan as it is.
        let audit = launch_of_a(&[(0, 544, false)], &[]);
        let mut report = LaunchReport::new("p", Phase::Prefetching);
        judge(
            &mut prof,
            &store,
            &amended,
            Some(audit),
            None,
            &cfg,
            &mut report,
        );
        assert_eq!(report.uncovered_bytes, Some(0));
        assert!(report.compiled.is_none());

        // Learning again drops the amendment with the learned traces.
        relearn(&mut prof, &store, "test".into(), false, &mut report);
        assert!(!store.amend_trace_path("p").exists());
    }
}
