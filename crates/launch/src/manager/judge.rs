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
    } else if prof.phase == Phase::Prefetching
        && (predates_used_only(plan, cfg) || wants_physical_order(plan, store, cfg))
    {
        // A plan from a warmstart before the used-only pass still reads
        // what the kernel read ahead and no launch used, and one compiled
        // before its device was found to seek is in first-use order:
        // compiled again from the profile's traces, after this launch.
        // Only from all of them: with one unreadable the plan stays as it
        // is (and this is tried again after the next launch, for the cost
        // of reading them). Traces of format 1.0 mark no page unused;
        // their plan is the same.
        let traces: Option<Vec<Trace>> = read_traces(store, prof)
            .into_iter()
            .map(|(_, t)| t.ok())
            .collect();
        if let Some(traces) = traces.filter(|t| !t.is_empty()) {
            if let Err(e) = compile_profile(&traces, store, prof, cfg, report) {
                eprintln!("warmstart: could not compile the plan again: {e}");
            }
        }
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
        crate::manager::plan_reading("/a", &ranges)
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
}
