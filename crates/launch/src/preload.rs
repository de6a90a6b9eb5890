//! Preloading while idle: reading the plans of the launches most likely to
//! come next before they come (SuperFetch; Debian's `preload`), so that a
//! launch a launch-time prefetcher cannot get ahead of finds its pages
//! already cached.
//!
//! [`Preloader`] holds the decisions and the bookkeeping; everything it
//! asks of the system goes through [`PreloadOs`], so the rules (never while
//! a launch runs or the disk is busy, back off on memory pressure, stay
//! under a budget, read evicted programs again, report unused preloads)
//! are tested against a fake, and [`RealPreloadOs`] is a thin layer over
//! `/proc` and the replay engine.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use warmstart_plan::plan::Entry;
use warmstart_plan::Plan;
use warmstart_predict::Candidate;
use warmstart_replay::{Backend, IdField, MemInfo, Options, RealBackend};

use crate::startup::{mem_available, spawn_replay, BackgroundReplay, ReplayHandle};

/// Idle preloading, in config.toml's `[preload]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PreloadConfig {
    /// Preload predicted launches at all. Off, the predictions are still
    /// made and shown.
    pub enabled: bool,
    /// Only the this many best-ranked profiles are considered.
    pub top: usize,
    /// ... and only those scoring at least this: reading a plan nobody
    /// launches costs disk time and evicts someone else's pages.
    pub min_score: f64,
    /// ... and only those at least this likely to start before the next
    /// boot empties the cache (within the predictor's `horizon`
    /// launches). The chance is conservative: on the usage bench, 0.5
    /// gave a precision of 79-83% and 84-92% of the gap, 0.3 gave 61%
    /// and 94-96%.
    pub min_chance: f64,
    /// A program evicted since it was last cached whole (a launch or a
    /// preload read it in this boot) is read again when at least this
    /// likely to start before the next boot: it was in use, and the
    /// memory that held it is free again (what SuperFetch restores after
    /// memory pressure).
    pub restore_min_chance: f64,
    /// What preloads may hold, as a fraction of MemAvailable.
    pub budget_fraction: f64,
    /// A preload never brings MemAvailable below this many MiB; unset: the
    /// replay engine's floor (5% of RAM, at least 256 MiB).
    pub memory_floor_mib: Option<u64>,
    /// Nothing is preloaded, and a running preload stops, when PSI memory
    /// `some avg10` is above this (percent of time tasks stalled on memory):
    /// reading more would only evict pages someone needs.
    pub memory_pressure_max: f64,
    /// The disk counts as busy when tasks stalled on I/O more than this
    /// share (percent) of the time since the preloader last looked (PSI
    /// io `some total`): no preload starts then.
    pub io_pressure_max: f64,
    /// A plan this resident (fraction of its bytes) needs no preload.
    pub resident_enough: f64,
    /// A launch finding at least this fraction of its preloaded plan still
    /// resident used the preload.
    pub used_min_resident: f64,
    /// A preload whose launch has not come after this many seconds went
    /// unused.
    pub unused_after_s: f64,
    /// I/O priority of the preload: `idle` (by default: only when no one
    /// else reads) or `be:0`..`be:7`.
    pub io_priority: String,
    /// Replay threads of a preload.
    pub workers: usize,
}

impl Default for PreloadConfig {
    fn default() -> Self {
        PreloadConfig {
            enabled: true,
            top: 3,
            min_score: 0.05,
            min_chance: 0.3,
            restore_min_chance: 0.15,
            budget_fraction: 0.25,
            memory_floor_mib: None,
            memory_pressure_max: 1.0,
            io_pressure_max: 10.0,
            resident_enough: 0.9,
            used_min_resident: 0.5,
            unused_after_s: 1800.0,
            io_priority: "idle".into(),
            workers: 1,
        }
    }
}

impl PreloadConfig {
    pub fn validate(&self) -> Result<(), String> {
        let fraction = |x: f64| (0.0..=1.0).contains(&x);
        if !fraction(self.budget_fraction)
            || !fraction(self.min_chance)
            || !fraction(self.restore_min_chance)
            || !fraction(self.resident_enough)
            || !fraction(self.used_min_resident)
        {
            return Err(
                "preload: budget_fraction, min_chance, restore_min_chance, resident_enough and used_min_resident must be in 0..=1"
                    .into(),
            );
        }
        if !(self.memory_pressure_max >= 0.0 && self.io_pressure_max >= 0.0) {
            return Err("preload: pressure thresholds must be >= 0".into());
        }
        if self.unused_after_s.is_nan()
            || self.unused_after_s <= 0.0
            || !(1..=64).contains(&self.workers)
        {
            return Err("preload: need unused_after_s > 0 and 1 <= workers <= 64".into());
        }
        self.io_priority
            .parse::<warmstart_replay::IoPriority>()
            .map_err(|e| format!("preload: io_priority {:?}: {e}", self.io_priority))?;
        Ok(())
    }
}

/// How much of a plan's data is in the page cache, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct PlanResidency {
    pub resident: u64,
    pub total: u64,
}

impl PlanResidency {
    pub fn fraction(&self) -> f64 {
        if self.total == 0 {
            1.0
        } else {
            self.resident.min(self.total) as f64 / self.total as f64
        }
    }

    /// Bytes a preload would read.
    pub fn missing(&self) -> u64 {
        self.total.saturating_sub(self.resident)
    }
}

/// What the preloader asks of the system.
pub trait PreloadOs {
    /// MemTotal and MemAvailable; `None` if unknown (nothing is preloaded).
    fn memory(&mut self) -> Option<MemInfo>;
    /// PSI memory `some avg10` (percent); `None` without PSI.
    fn memory_pressure(&mut self) -> Option<f64>;
    /// Whether storage is busy with someone else's I/O.
    fn disk_busy(&mut self) -> bool;
    /// Whether the daemon is serving a launch (replaying or recording it).
    fn launch_in_progress(&self) -> bool;
    /// The residency of the profile's plan; `None` if it has none.
    fn residency(&mut self, profile: &str) -> Option<PlanResidency>;
    /// Starts reading the profile's plan in the background.
    fn start_preload(&mut self, profile: &str) -> Result<(), String>;
    /// The profile being preloaded, if a preload is still running.
    fn preload_running(&mut self) -> Option<String>;
    /// Stops the running preload, if any.
    fn cancel_preload(&mut self);
}

/// What a tick did.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// A preload started, to read about `bytes`; `again` when the profile
    /// was cached whole before (launched or preloaded) and evicted since.
    Started {
        profile: String,
        bytes: u64,
        again: bool,
    },
    /// A preload could not start.
    Failed { profile: String, error: String },
    /// The running preload was stopped (a launch began, memory pressure).
    Cancelled { profile: String, why: State },
    /// No launch came for a preloaded profile in time: tell the predictor
    /// (`preload_outcome(profile, false)`).
    Unused { profile: String, bytes: u64 },
}

/// Why the preloader is (not) preloading, for `warmstart status`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Disabled,
    #[default]
    Idle,
    LaunchInProgress,
    MemoryPressure,
    DiskBusy,
    /// MemAvailable unknown, or at the floor.
    LowMemory,
    /// Nothing ranked high enough fits in the budget.
    OverBudget,
    Preloading,
}

/// What a launch of a preloaded profile says about its preload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    pub profile: String,
    /// Tell the predictor: `preload_outcome(profile, used)`.
    pub used: bool,
    /// Preloaded bytes counted as used (see [`Preloader::on_launch`]).
    pub bytes_used: u64,
    pub bytes_preloaded: u64,
}

/// One of the current predictions, as `warmstart status` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Prediction {
    pub profile: String,
    pub score: f64,
    /// The chance that it starts before the next boot (see
    /// [`warmstart_predict::Candidate::soon`]).
    pub soon: Option<f64>,
    /// Fraction of its plan resident at the last tick; `None` without plan.
    pub resident: Option<f64>,
    pub preloaded: bool,
}

/// Counters for `warmstart status --json`.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct PreloadStats {
    pub state: State,
    pub preloads: u64,
    /// Of those, reads of profiles cached whole before (launched or
    /// preloaded) and evicted since.
    pub rereads: u64,
    pub bytes_preloaded: u64,
    pub bytes_used: u64,
    /// `bytes_used / bytes_preloaded` over finished preloads (used or
    /// unused); `None` before the first.
    pub precision: Option<f64>,
    pub used: u64,
    pub unused: u64,
    /// Bytes brought in by preloads whose launch has not come, still
    /// resident at the last tick.
    pub held_bytes: u64,
    pub budget_bytes: u64,
    pub predictions: Vec<Prediction>,
}

/// A preload whose launch has not come yet.
#[derive(Debug, Clone)]
struct Held {
    started_ms: u64,
    /// Bytes its reads brought in, over every re-read.
    read_bytes: u64,
    /// Resident bytes of the plan, and its size, at the last tick.
    resident: u64,
    total: u64,
}

impl Held {
    /// What it holds: what it brought in, unless evicted since (pages the
    /// plan shares with others were resident before and are not counted).
    fn holds(&self, running: bool) -> u64 {
        if running {
            self.read_bytes
        } else {
            self.read_bytes.min(self.resident)
        }
    }
}

/// The idle preloader's decisions and bookkeeping. Times are milliseconds
/// of one monotonic clock.
#[derive(Debug, Clone)]
pub struct Preloader {
    cfg: PreloadConfig,
    held: BTreeMap<String, Held>,
    stats: PreloadStats,
    /// Bytes preloaded by finished preloads, for the precision.
    finished_bytes: u64,
    /// A preload ran at the last tick: the disk's pressure since is
    /// mostly its own, so the next one follows without asking.
    chained: bool,
    /// Profiles seen cached whole since the daemon started (launched, or
    /// measured resident): one found evicted since is a restore.
    was_resident: BTreeSet<String>,
}

/// Profiles remembered as once resident, at most; the set starts over
/// beyond it.
const MAX_WAS_RESIDENT: usize = 4096;

impl Preloader {
    pub fn new(cfg: PreloadConfig) -> Self {
        Preloader {
            cfg,
            held: BTreeMap::new(),
            stats: PreloadStats::default(),
            finished_bytes: 0,
            chained: false,
            was_resident: BTreeSet::new(),
        }
    }

    pub fn config(&self) -> &PreloadConfig {
        &self.cfg
    }

    pub fn stats(&self) -> &PreloadStats {
        &self.stats
    }

    /// Profiles preloaded whose launch has not come.
    pub fn preloaded(&self) -> impl Iterator<Item = &str> {
        self.held.keys().map(String::as_str)
    }

    /// One round of decisions, every few seconds while the daemon idles:
    /// expires preloads no launch used, re-measures what preloads hold,
    /// stops a preload when a launch begins or memory runs short, and
    /// otherwise starts at most one preload: the best-ranked profile whose
    /// plan is not resident and fits in the budget. Residency is measured
    /// again at every tick, so a profile whose pages were evicted is read
    /// again.
    pub fn tick(
        &mut self,
        now_ms: u64,
        ranking: &[Candidate],
        os: &mut dyn PreloadOs,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        let running = os.preload_running();
        self.expire(now_ms, running.as_deref(), os, &mut actions);
        // Measured for the running preload too, though what it holds is
        // then counted as all it reads (see `Held::holds`).
        for (profile, h) in self.held.iter_mut() {
            let r = os.residency(profile).unwrap_or_default();
            (h.resident, h.total) = (r.resident, r.total);
        }
        let mem = os.memory();
        self.stats.budget_bytes = mem.map_or(0, |m| {
            (m.available as f64 * self.cfg.budget_fraction.clamp(0.0, 1.0)) as u64
        });
        let measured = self.predict(ranking, os);
        self.stats.held_bytes = self.held_bytes(running.as_deref());

        let state = self.decide(now_ms, mem, running.as_deref(), measured, os, &mut actions);
        if let (Some(p), State::LaunchInProgress | State::MemoryPressure) = (&running, &state) {
            os.cancel_preload();
            actions.push(Action::Cancelled {
                profile: p.clone(),
                why: state.clone(),
            });
        }
        self.stats.state = state;
        self.stats.held_bytes = self.held_bytes(os.preload_running().as_deref());
        actions
    }

    fn held_bytes(&self, running: Option<&str>) -> u64 {
        self.held
            .iter()
            .map(|(p, h)| h.holds(running == Some(p.as_str())))
            .sum()
    }

    fn expire(
        &mut self,
        now_ms: u64,
        running: Option<&str>,
        os: &mut dyn PreloadOs,
        actions: &mut Vec<Action>,
    ) {
        let limit = (self.cfg.unused_after_s * 1000.0) as u64;
        let expired: Vec<String> = self
            .held
            .iter()
            .filter(|(_, h)| now_ms.saturating_sub(h.started_ms) >= limit)
            .map(|(p, _)| p.clone())
            .collect();
        for profile in expired {
            if running == Some(profile.as_str()) {
                os.cancel_preload();
            }
            let h = self.held.remove(&profile).expect("listed above");
            self.finish(h.read_bytes, 0, false);
            actions.push(Action::Unused {
                profile,
                bytes: h.read_bytes,
            });
        }
    }

    /// Measures the top candidates, for the status and for [`Preloader::tick`]'s decision:
    /// those with a plan, best first, with its residency.
    fn predict(
        &mut self,
        ranking: &[Candidate],
        os: &mut dyn PreloadOs,
    ) -> Vec<(Candidate, PlanResidency)> {
        let mut measured = Vec::new();
        self.stats.predictions = ranking
            .iter()
            .take(self.cfg.top)
            .map(|c| {
                let r = os.residency(&c.profile);
                if let Some(r) = r {
                    if r.fraction() >= self.cfg.resident_enough {
                        self.remember_resident(&c.profile);
                    }
                    measured.push((c.clone(), r));
                }
                Prediction {
                    profile: c.profile.clone(),
                    score: c.score,
                    soon: c.soon,
                    resident: r.map(|r| r.fraction()),
                    preloaded: self.held.contains_key(&c.profile),
                }
            })
            .collect();
        measured
    }

    fn decide(
        &mut self,
        now_ms: u64,
        mem: Option<MemInfo>,
        running: Option<&str>,
        measured: Vec<(Candidate, PlanResidency)>,
        os: &mut dyn PreloadOs,
        actions: &mut Vec<Action>,
    ) -> State {
        let chained = std::mem::take(&mut self.chained);
        if !self.cfg.enabled {
            return State::Disabled;
        }
        if os.launch_in_progress() {
            return State::LaunchInProgress;
        }
        if os
            .memory_pressure()
            .is_some_and(|p| p > self.cfg.memory_pressure_max)
        {
            return State::MemoryPressure;
        }
        if running.is_some() {
            self.chained = true;
            return State::Preloading;
        }
        // Asked only with no preload running, and not right after one: a
        // preload's own reads make the disk look busy. Preloads in a row
        // are as one, read at idle I/O priority.
        if !chained && os.disk_busy() {
            return State::DiskBusy;
        }
        let Some(mem) = mem else {
            return State::LowMemory;
        };
        let floor = self
            .cfg
            .memory_floor_mib
            .map_or_else(|| Options::default_memory_floor(mem.total), |m| m << 20);
        let room = mem.available.saturating_sub(floor);
        if room == 0 {
            return State::LowMemory;
        }
        let budget_left = self
            .stats
            .budget_bytes
            .saturating_sub(self.stats.held_bytes);
        let mut state = State::Idle;
        for (c, r) in measured {
            if c.score < self.cfg.min_score {
                break; // ranked: the rest score lower still
            }
            if r.fraction() >= self.cfg.resident_enough {
                continue;
            }
            let restore = self.was_resident.contains(&c.profile);
            let bar = if restore {
                self.cfg.restore_min_chance
            } else {
                self.cfg.min_chance
            };
            if c.soon.is_some_and(|p| p < bar) {
                continue;
            }
            let profile = c.profile;
            let need = r.missing();
            // What an earlier preload of it still holds is freed for this
            // one to count: it is the same pages being read back.
            let own = self.held.get(&profile).map_or(0, |h| h.holds(false));
            if need > budget_left + own || need > room {
                state = State::OverBudget;
                continue;
            }
            match os.start_preload(&profile) {
                Ok(()) => {
                    let again = restore || self.held.contains_key(&profile);
                    let h = self.held.entry(profile.clone()).or_insert(Held {
                        started_ms: now_ms,
                        read_bytes: 0,
                        resident: r.resident,
                        total: r.total,
                    });
                    h.read_bytes += need;
                    self.stats.preloads += 1;
                    self.stats.rereads += u64::from(again);
                    self.stats.bytes_preloaded += need;
                    actions.push(Action::Started {
                        profile,
                        bytes: need,
                        again,
                    });
                    self.chained = true;
                    return State::Preloading;
                }
                Err(error) => actions.push(Action::Failed { profile, error }),
            }
        }
        state
    }

    fn finish(&mut self, preloaded: u64, used_bytes: u64, used: bool) {
        self.finished_bytes += preloaded;
        self.stats.bytes_used += used_bytes;
        if used {
            self.stats.used += 1;
        } else {
            self.stats.unused += 1;
        }
        self.stats.precision = (self.finished_bytes > 0)
            .then(|| self.stats.bytes_used as f64 / self.finished_bytes as f64);
    }

    /// The fraction of a preloaded profile's plan resident at the last tick:
    /// what [`on_launch`](Self::on_launch) wants, without measuring anything
    /// on the launch's path (the daemon starts the launch's replay first).
    pub fn last_resident_fraction(&self, profile: &str) -> Option<f64> {
        self.held.get(profile).map(|h| {
            PlanResidency {
                resident: h.resident,
                total: h.total,
            }
            .fraction()
        })
    }

    /// A launch of `profile` began, finding `resident_fraction` of its plan
    /// in the page cache (measured before its own replay, or
    /// [`last_resident_fraction`](Self::last_resident_fraction)). If
    /// the profile was preloaded, says whether the preload was used: the
    /// launch came and enough of it was still resident. The bytes counted
    /// as used are the preloaded bytes times the resident fraction (the
    /// part evicted before the launch was read for nothing).
    pub fn on_launch(&mut self, profile: &str, resident_fraction: f64) -> Option<Outcome> {
        // Its launch reads it whole, whatever was resident before.
        self.remember_resident(profile);
        let h = self.held.remove(profile)?;
        let f = resident_fraction.clamp(0.0, 1.0);
        let used = f >= self.cfg.used_min_resident;
        let bytes_used = if used {
            (h.read_bytes as f64 * f) as u64
        } else {
            0
        };
        self.finish(h.read_bytes, bytes_used, used);
        self.stats.held_bytes = self.held_bytes(None);
        Some(Outcome {
            profile: profile.to_string(),
            used,
            bytes_used,
            bytes_preloaded: h.read_bytes,
        })
    }

    /// The profile was forgotten: its preload is no one's to judge.
    pub fn forget(&mut self, profile: &str) {
        self.held.remove(profile);
        self.was_resident.remove(profile);
    }

    fn remember_resident(&mut self, profile: &str) {
        if self.was_resident.len() >= MAX_WAS_RESIDENT {
            self.was_resident.clear();
        }
        self.was_resident.insert(profile.to_string());
    }
}

/// Bytes of the plan's file data now in the page cache. Files that changed
/// since the plan was made are left out: replay would skip them, so
/// preloading cannot bring them in. Metadata is left out too: it is small,
/// and measuring it needs the block device opened.
pub fn plan_residency<B: Backend>(backend: &B, plan: &Plan) -> PlanResidency {
    let mut handles: HashMap<u32, Option<B::Handle>> = HashMap::new();
    let mut out = PlanResidency::default();
    for e in &plan.entries {
        let Entry::Data { file, offset, len } = *e else {
            continue;
        };
        let h = handles.entry(file).or_insert_with(|| {
            let f = plan.files.get(file as usize)?;
            let (h, id) = backend.open_file(Path::new(&f.path)).ok()?;
            IdField::diff(&f.id, &id).is_empty().then_some(h)
        });
        let Some(h) = h else { continue };
        out.total += len;
        if let Ok(r) = backend.residency(h, offset, len) {
            out.resident += len
                .saturating_mul(r.resident.min(r.pages))
                .checked_div(r.pages)
                .unwrap_or(0);
        }
    }
    out
}

/// `some avg10` of a PSI file (`/proc/pressure/{memory,io}`).
pub fn parse_psi_some_avg10(text: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix("some "))?
        .split_whitespace()
        .find_map(|f| f.strip_prefix("avg10="))?
        .parse()
        .ok()
}

/// `some total` of a PSI file: microseconds some task stalled, ever.
pub fn parse_psi_some_total(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("some "))?
        .split_whitespace()
        .find_map(|f| f.strip_prefix("total="))?
        .parse()
        .ok()
}

/// The share of time (percent) some task stalled between two samples of
/// `some total`; `None` under 200 ms apart, too short to tell.
fn stall_percent(
    (t0, total0): (std::time::Instant, u64),
    (t1, total1): (std::time::Instant, u64),
) -> Option<f64> {
    let us = t1.saturating_duration_since(t0).as_micros() as f64;
    (us >= 200_000.0).then(|| total1.saturating_sub(total0) as f64 * 100.0 / us)
}

/// Where [`RealPreloadOs`] finds the plan of a profile (the daemon's cache).
pub type PlanSource = Box<dyn FnMut(&str) -> Option<Arc<Plan>> + Send>;

/// The system as it is: `/proc/meminfo`, `/proc/pressure`, the page cache,
/// and background replays.
pub struct RealPreloadOs {
    proc_root: PathBuf,
    plans: PlanSource,
    backend: RealBackend,
    launch: Arc<AtomicBool>,
    io_pressure_max: f64,
    how: BackgroundReplay,
    running: Option<(String, ReplayHandle)>,
    /// PSI's cumulative I/O stall (`some total`, microseconds) when last
    /// read, and when: the disk's busyness since, rather than a 10-second
    /// average that still holds the boot's or a preload's own reads.
    io_seen: Option<(std::time::Instant, u64)>,
}

impl RealPreloadOs {
    /// `launch` is set by the daemon while it serves a launch.
    pub fn new(
        proc_root: &Path,
        cfg: &PreloadConfig,
        plans: PlanSource,
        launch: Arc<AtomicBool>,
    ) -> Result<Self, String> {
        let io_priority = cfg
            .io_priority
            .parse()
            .map_err(|e| format!("preload: io_priority: {e}"))?;
        Ok(RealPreloadOs {
            proc_root: proc_root.to_path_buf(),
            plans,
            backend: RealBackend::new(),
            launch,
            io_pressure_max: cfg.io_pressure_max,
            how: BackgroundReplay {
                workers: cfg.workers,
                io_priority,
                memory_floor: cfg.memory_floor_mib.map(|m| m << 20),
            },
            running: None,
            io_seen: None,
        })
    }

    fn pressure_text(&self, what: &str) -> Option<String> {
        std::fs::read_to_string(self.proc_root.join("pressure").join(what)).ok()
    }

    fn pressure(&self, what: &str) -> Option<f64> {
        parse_psi_some_avg10(&self.pressure_text(what)?)
    }

    /// PSI's I/O `some total` now, stamped.
    fn io_sample(&self) -> Option<(std::time::Instant, u64)> {
        let total = parse_psi_some_total(&self.pressure_text("io")?)?;
        Some((std::time::Instant::now(), total))
    }
}

impl PreloadOs for RealPreloadOs {
    fn memory(&mut self) -> Option<MemInfo> {
        mem_available(&self.proc_root).ok()
    }

    fn memory_pressure(&mut self) -> Option<f64> {
        self.pressure("memory")
    }

    fn disk_busy(&mut self) -> bool {
        // Without PSI (kernel without CONFIG_PSI, or psi=0) the disk is
        // taken as idle: the preload's idle I/O class still yields to
        // everyone else's reads.
        let Some(now) = self.io_sample() else {
            return false;
        };
        // The first look only starts the measurement.
        let Some(since) = self.io_seen.replace(now) else {
            return true;
        };
        match stall_percent(since, now) {
            Some(p) => p > self.io_pressure_max,
            // Too short to tell (just after a preload ended): busy for
            // now, asked again at the next tick.
            None => {
                self.io_seen = Some(since);
                true
            }
        }
    }

    fn launch_in_progress(&self) -> bool {
        self.launch.load(Ordering::Relaxed)
    }

    fn residency(&mut self, profile: &str) -> Option<PlanResidency> {
        let plan = (self.plans)(profile)?;
        Some(plan_residency(&self.backend, &plan))
    }

    fn start_preload(&mut self, profile: &str) -> Result<(), String> {
        let plan = (self.plans)(profile).ok_or_else(|| format!("{profile}: no plan"))?;
        let proc_root = self.proc_root.clone();
        let h = spawn_replay(plan, &self.how, || mem_available(&proc_root))
            .map_err(|e| e.to_string())?;
        // One at a time: a preload still running is stopped (the
        // preloader never starts one while another runs).
        self.running = Some((profile.to_string(), h));
        Ok(())
    }

    fn preload_running(&mut self) -> Option<String> {
        if self.running.as_ref().is_some_and(|(_, h)| h.is_finished()) {
            self.running = None;
            // The disk's busyness is measured from here on, without it.
            self.io_seen = self.io_sample();
        }
        self.running.as_ref().map(|(p, _)| p.clone())
    }

    fn cancel_preload(&mut self) {
        // Dropping the handle cancels the replay.
        self.running = None;
    }
}

#[cfg(test)]
mod tests;
