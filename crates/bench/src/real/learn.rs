//! Learning a launch: its traces (cold and as found), one plan per
//! strategy compiled from them, and the learning launches of `warmstart
//! run` and the daemon.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use warmstart_plan::compile::compile;
use warmstart_plan::trace::CacheState;
use warmstart_plan::Trace;

use super::shadow::make_shadow;
use super::{compile_options, RealExecutor};
use crate::launch;
use crate::runner::Learned;
use crate::scenario::Scenario;
use crate::wrapped::Wrapped;
use crate::Target;

impl RealExecutor {
    /// Learns the launch: what [`crate::runner::Executor::learn`] does.
    pub(super) fn learn_launch(&mut self) -> Result<Learned> {
        let mut traces = Vec::new();
        let mut notes = Vec::new();
        let mut demand = None;
        // A cold trace needs the files known (or every cache dropped): with
        // --evict-files the as-found launch comes first and names them.
        let order = if self.cfg.evict_files {
            [CacheState::AsFound, CacheState::Cold]
        } else {
            [CacheState::Cold, CacheState::AsFound]
        };
        for cache in order {
            if let Some(p) = &self.target.prepare {
                launch::shell(p, self.target.cwd.as_deref(), "prepare")?;
            }
            if cache == CacheState::Cold {
                self.evict()?;
            }
            let (trace, l, fallbacks) = self.record(cache)?;
            self.check(Scenario::Learning, &l)?;
            for f in fallbacks {
                if !notes.contains(&f) {
                    notes.push(format!("recorder fell back from {f}"));
                }
            }
            if trace.stats.drops > 0 {
                notes.push(format!(
                    "the kernel dropped {} events while recording",
                    trace.stats.drops
                ));
            }
            self.absorb(&trace);
            traces.push(trace);
        }
        if self.cfg.scenarios.contains(&Scenario::Demand) {
            // A launch of its own, warm after the two above, recorded with
            // each page at its own time (a plan's traces place a run of
            // pages at its first page's use). Once more if it still read
            // from storage: a program that stays up past readiness is
            // stopped while it still loads, and its next launch finds
            // pages missing.
            for _ in 0..2 {
                if let Some(p) = &self.target.prepare {
                    launch::shell(p, self.target.cwd.as_deref(), "prepare")?;
                }
                let (trace, l, _) = self.record_split(CacheState::AsFound, Some(0))?;
                self.check(Scenario::Demand, &l)?;
                match crate::demand::Demand::of_warm_trace(&trace, l.time) {
                    Ok(d) => {
                        demand = Some(d);
                        break;
                    }
                    Err(why) => notes.push(format!("demand: no bound from a recording: {why}")),
                }
            }
        }
        self.warm = true;
        // The same FIEMAP lookup as `compile --sorted` and `run`.
        let phys = warmstart_sys::fiemap::PhysicalMap::default();
        let physical = |f: &warmstart_plan::plan::PlanFile, off: u64| phys.physical(&f.path, off);
        let mut plan_bytes = Vec::new();
        let mut plan_entries = Vec::new();
        for s in [
            Scenario::Warmstart,
            Scenario::Fast,
            Scenario::Paralfetch,
            Scenario::Sorted,
        ] {
            let opts = compile_options(s).expect("a strategy");
            let c = compile(&traces, &opts, &physical)
                .with_context(|| format!("compiling the {s} plan"))?;
            if let Some(why) = &c.report.empty {
                notes.push(format!("the {s} plan is empty: {why:?}"));
            }
            plan_bytes.push((s, c.plan.data_bytes() + c.plan.meta_bytes()));
            let count = |f: fn(&warmstart_plan::Entry) -> bool| {
                c.plan.entries.iter().filter(|e| f(e)).count()
            };
            plan_entries.push((
                s,
                count(|e| matches!(e, warmstart_plan::Entry::Data { .. })),
                count(|e| matches!(e, warmstart_plan::Entry::Meta { .. })),
                count(|e| matches!(e, warmstart_plan::Entry::Lookup { .. })),
            ));
            let plan = Arc::new(c.plan);
            if s == Scenario::Warmstart {
                self.plans.insert(Scenario::PrefetchOnly, Arc::clone(&plan));
                if self.cfg.scenarios.contains(&Scenario::Contention) {
                    // On disk, as the originals are (/tmp may be memory).
                    let sh = make_shadow(&plan, Path::new("/var/tmp"))
                        .context("copying the plan's files for the contention scenario")?;
                    let missing = plan.files.len() - sh.files.len();
                    notes.push(format!(
                        "contention: the plan's {} files copied to {}{}",
                        sh.files.len(),
                        sh.dir.path().display(),
                        if missing > 0 {
                            format!(
                                " ({missing} could not be, and are skipped as a replay skips them)"
                            )
                        } else {
                            String::new()
                        }
                    ));
                    self.plans
                        .insert(Scenario::Contention, Arc::clone(&sh.plan));
                    self.shadow = Some(sh);
                }
            }
            self.plans.insert(s, plan);
        }
        if self.cfg.scenarios.contains(&Scenario::Run) {
            notes.push(self.learn_run()?);
        }
        if self.cfg.scenarios.contains(&Scenario::Daemon) {
            notes.push(self.learn_daemon()?);
        }
        let last = traces.last().expect("two traces");
        Ok(Learned {
            traces: traces.len(),
            files: self.files.len(),
            data_bytes: traces.iter().map(|t| t.stats.bytes).max().unwrap_or(0),
            metadata_bytes: traces
                .iter()
                .map(|t| t.stats.metadata_bytes)
                .max()
                .unwrap_or(0),
            backend: last.meta.backend.name().to_string(),
            plan_bytes,
            plan_entries,
            notes,
            demand,
        })
    }

    pub(super) fn wrapped(&mut self) -> Result<&mut Wrapped> {
        if self.wrapped.is_none() {
            let bin = self.cfg.warmstart_bin.clone().context(
                "the run and daemon scenarios need the warmstart binary \
                 (not found; set WARMSTART_BENCH_BIN)",
            )?;
            self.wrapped = Some(Wrapped::new(bin)?);
        }
        Ok(self.wrapped.as_mut().expect("set above"))
    }

    /// The wrapper's own learning launches (the first cold, the others as
    /// found), in its private state directory, until its profile has a
    /// plan. Returns a note for the report.
    pub(super) fn learn_run(&mut self) -> Result<String> {
        let target = self.target.clone();
        let t = self.wrapped()?.run_target(&target);
        for i in 0..4 {
            self.untimed(&t, Scenario::Run, i == 0)
                .context("learning through warmstart run")?;
            if self.wrapped()?.run_prefetching() {
                self.run_learned = true;
                // The new plan's first launch, cold as a user's would be.
                self.untimed(&t, Scenario::Run, true)
                    .context("the first prefetched launch through warmstart run")?;
                return Ok(format!(
                    "run: `warmstart run` had a plan after {} learning launches \
                     (its first prefetched launch not timed)",
                    i + 1
                ));
            }
        }
        bail!(
            "warmstart run had no plan for {} after 4 launches",
            self.target.name
        )
    }

    /// The daemon's learning: started with this program allowed, it
    /// records the program's first launches (the first cold) until its
    /// profile has a plan, then is stopped. Returns a note for the report.
    pub(super) fn learn_daemon(&mut self) -> Result<String> {
        let t = self.target.clone();
        let mut d = self.wrapped()?.start_daemon(&t)?;
        for i in 0..4 {
            self.untimed(&t, Scenario::Daemon, i == 0)?;
            let w = self.wrapped()?;
            w.wait_daemon_done(&mut d)
                .context("learning with warmstart daemon")?;
            if w.daemon_prefetching() {
                let note = format!(
                    "daemon: `warmstart daemon` had a plan after {} learning launches \
                     (allow = {}; its first prefetched launch, audited, not timed)",
                    i + 1,
                    w.policy_key.as_deref().unwrap_or("?")
                );
                // The new plan's first launch, which the daemon records in
                // full to judge the plan (an exact audit): cold.
                self.untimed(&t, Scenario::Daemon, true)?;
                self.wrapped()?
                    .wait_daemon_done(&mut d)
                    .context("the daemon's first prefetched launch")?;
                d.stop()?;
                self.daemon_learned = true;
                return Ok(note);
            }
        }
        let tail = d.log_tail();
        bail!(
            "warmstart daemon had no plan for {} after 4 launches; its stderr:\n{tail}",
            self.target.name
        )
    }

    /// One untimed launch of `t` for scenario `s` (after its prepare
    /// command; `cold`: with the cache dropped first), which leaves the
    /// cache warm.
    fn untimed(&mut self, t: &Target, s: Scenario, cold: bool) -> Result<()> {
        if let Some(p) = &self.target.prepare {
            launch::shell(p, self.target.cwd.as_deref(), "prepare")?;
        }
        if cold {
            self.evict()?;
        }
        let l = launch::launch(t, Instant::now())?;
        self.check(s, &l)?;
        self.warm = true;
        Ok(())
    }

    /// Adds a trace's files and devices to the launch's set.
    fn absorb(&mut self, t: &Trace) {
        for f in &t.files {
            let Some(p) = &f.path else { continue };
            let ranges: Vec<(u64, u64)> = f.extents.iter().map(|e| (e.offset, e.len)).collect();
            match self.files.iter_mut().find(|x| &x.0 == p) {
                Some(x) => {
                    for r in ranges {
                        if !x.1.contains(&r) {
                            x.1.push(r);
                        }
                    }
                }
                None => self.files.push((p.clone(), ranges)),
            }
        }
        for m in &t.metadata {
            if !self.devices.contains(&m.device) {
                self.devices.push(m.device);
            }
        }
    }

    /// The launch's files and ranges (after `learn`).
    pub fn files(&self) -> &[(String, Vec<(u64, u64)>)] {
        &self.files
    }
}
