//! `warmstart run`: one launch through the launch manager. The launch's
//! flow is here; naming a profile, learning (recording and compiling),
//! prefetching a launch, judging it afterwards and the warm check live in
//! a module each.

mod breakdown;
mod hint;
mod judge;
mod learning;
mod naming;
mod prefetch;
mod warm;

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;
use warmstart_plan::compile::CompileOptions;
use warmstart_record::{argv_text, Exit};
use warmstart_replay::Report;

use crate::device;
use crate::store::{valid_name, Phase, Profile, Store};
use crate::Error;

pub(crate) use hint::sweep as sweep_hints;
pub(crate) use judge::judge;
pub(crate) use learning::{add_trace, load_plan, load_previous_plan, relearn};
pub use learning::{compile_traces, mark_relearn};
pub(crate) use naming::{digest, resolve_exe};
pub use naming::{profile_name, profile_name_for};
pub(crate) use prefetch::plain_launch;
pub(crate) use warm::plan_cached;

use learning::learn;
use naming::Walk;
use prefetch::{prefetch, Launch};
use warm::{
    program_cached, program_cold, quick_warm, save_warm_check, warm_windows, windows_cached,
};

/// How to prefetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Replay concurrently with the application (flash).
    Concurrent,
    /// Physically sorted replay, application held until it completes
    /// (rotational disks: the seeks cost more than the overlap gains).
    Sorted,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StrategyChoice {
    /// Decided per device by a measured random-read latency probe.
    Auto,
    Fixed(Strategy),
}

/// The launch manager's parameters (FAST Table 2 names in brackets).
#[derive(Debug, Clone)]
pub struct Config {
    pub state_dir: PathBuf,
    /// Launches recorded before the first plan [N_rawseq].
    pub nrawseq: u32,
    /// Relearn when the miss ratio exceeds this [R_miss].
    pub rmiss: f64,
    /// At most one exact audit per this many prefetched launches [N_chk]:
    /// an audit costs a recorder load, so a noisy cheap check must not
    /// trigger one every other launch.
    pub nchk: u64,
    /// Relearn when more than this share of the plan's files changed.
    pub stale_share: f64,
    pub strategy: StrategyChoice,
    /// Audit prefetching launches with the recorder (exact, costs a BPF load).
    pub audit: bool,
    /// Break a prefetched launch's pages down by who read them and how
    /// long the launch waited ([`LaunchReport::breakdown`]). Costs a second
    /// BPF program, a scheduler hook and the replay's request log, and
    /// implies `audit`; off, a launch pays nothing for it.
    pub breakdown: bool,
    /// The sorted strategy holds the application until the prefetch is
    /// resident, but never longer than this.
    pub sorted_wait_max: Duration,
    /// Before exec, let the replay issue this many requests ...
    pub head_start_requests: u64,
    /// ... or run this long, whichever comes first.
    pub head_start: Duration,
    /// A launch with nothing to prefetch and nothing to judge afterwards
    /// (its plan is already resident, or the profile is too small a launch
    /// to prefetch) is exec'd in place: no wrapper process stays behind, so
    /// it costs only warmstart's own start. Off when the caller wants a
    /// report after the launch.
    pub exec_in_place: bool,
    pub compile: CompileOptions,
    pub replay: warmstart_replay::Options,
    pub record: warmstart_record::Options,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            state_dir: crate::default_state_dir(),
            nrawseq: 2,
            rmiss: 0.1,
            nchk: 10,
            stale_share: 0.1,
            strategy: StrategyChoice::Auto,
            audit: false,
            breakdown: false,
            sorted_wait_max: Duration::from_secs(5),
            head_start_requests: 8,
            head_start: Duration::from_millis(10),
            exec_in_place: true,
            compile: CompileOptions::default(),
            replay: warmstart_replay::Options::default(),
            record: warmstart_record::Options::default(),
        }
    }
}

/// What happened, for the user (`-v`/`--json`) and for tests.
#[derive(Debug, Clone, Serialize)]
pub struct LaunchReport {
    pub profile: String,
    pub phase_before: Phase,
    pub phase_after: Phase,
    pub strategy: Option<Strategy>,
    /// The plan was found resident already, so no replay ran.
    pub warm_skip: bool,
    /// Why the plan was not used, if it was not.
    pub plan_problem: Option<String>,
    pub replay: Option<Report>,
    /// Bytes the application's processes read from storage themselves.
    pub app_read_bytes: Option<u64>,
    pub miss_ratio: Option<f64>,
    /// Set when this launch sent the profile back to learning.
    pub relearn_reason: Option<String>,
    /// Audit trace (with `audit`): pages the application read itself.
    pub audit_pages_from_storage: Option<u64>,
    pub audit_pages: Option<u64>,
    /// Audit: bytes the application read from storage that the plan lacks.
    pub uncovered_bytes: Option<u64>,
    pub compiled: Option<String>,
    /// How long the application was held for the replay's head start (or,
    /// with the sorted strategy, for the whole replay), and, named by a
    /// hint, until its program's path was walked.
    pub held_ms: Option<f64>,
    /// With `breakdown`: every page the launch touched, by class, and
    /// where it waited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breakdown: Option<warmstart_record::breakdown::Breakdown>,
    /// With `breakdown`: why there is none (no plan yet, tracer refused).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breakdown_problem: Option<String>,
    pub exit_code: i32,
    pub wall_ms: f64,
    /// How long the wrapper kept the command's caller waiting after the
    /// program exited: stopping the replay (a thread inside a metadata
    /// read finishes it first), judging the launch and saving the profile.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after_exit_ms: Option<f64>,
    /// When the program exited, for `after_exit_ms`.
    #[serde(skip)]
    pub(crate) exited_at: Option<Instant>,
    /// How long after the wrapper began deciding the launch (reading the
    /// profile, the warm check, loading the plan, the device verdict) the
    /// replay was started: the wrapper's own cost before any prefetching.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub before_replay_ms: Option<f64>,
    /// The profile was named by the command line's hint, its program's
    /// path walked beside the replay (see `hint`).
    pub named_by_hint: bool,
    /// When the wrapper began, for `before_replay_ms`.
    #[serde(skip)]
    pub(crate) started_at: Option<Instant>,
}

/// Saves a profile after a launch. Only counters changed for a prefetched
/// launch that kept its plan: saved without syncing
/// ([`Store::save_counts`]), so that neither `run`'s caller nor the
/// daemon's next launch waits for the disk.
pub(crate) fn save_after_launch(
    store: &Store,
    prof: &mut Profile,
    report: &LaunchReport,
) -> Result<(), Error> {
    let counts_only = report.phase_before == Phase::Prefetching
        && prof.phase == Phase::Prefetching
        && report.compiled.is_none();
    if counts_only {
        store.save_counts(prof)
    } else {
        store.save(prof)
    }
}

impl LaunchReport {
    pub fn new(profile: &str, phase: Phase) -> LaunchReport {
        LaunchReport {
            profile: profile.to_string(),
            phase_before: phase,
            phase_after: phase,
            strategy: None,
            warm_skip: false,
            plan_problem: None,
            replay: None,
            app_read_bytes: None,
            miss_ratio: None,
            relearn_reason: None,
            audit_pages_from_storage: None,
            audit_pages: None,
            uncovered_bytes: None,
            compiled: None,
            held_ms: None,
            breakdown: None,
            breakdown_problem: None,
            exit_code: 0,
            wall_ms: 0.0,
            after_exit_ms: None,
            exited_at: None,
            before_replay_ms: None,
            named_by_hint: false,
            started_at: None,
        }
    }
}

/// How long a launch waits for its profile's lock before it runs
/// unmanaged: longer than the daemon's save, far shorter than a launch.
const PROFILE_LOCK_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

/// Runs `argv` through the launch manager and returns how it ended.
pub fn run(
    argv: &[OsString],
    profile: Option<&str>,
    cfg: &Config,
) -> Result<(Exit, LaunchReport), Error> {
    match run_with::<true>(argv, profile, cfg)? {
        Some(done) => Ok(done),
        None => unreachable!("a launch with the recorder linked in is never handed over"),
    }
}

/// [`run`] for a binary that does not link the recorder (`warmstart`'s
/// small front, which every wrapped launch reads from a cold disk): a
/// launch that needs it (learning, relearning, audited or broken down)
/// returns `None` before anything is launched or saved, for the caller to
/// hand over to the full binary.
pub fn run_without_recorder(
    argv: &[OsString],
    profile: Option<&str>,
    cfg: &Config,
) -> Result<Option<(Exit, LaunchReport)>, Error> {
    run_with::<false>(argv, profile, cfg)
}

/// A plan reading `(offset, len)` ranges of one file, `path`, for tests.
#[cfg(test)]
pub(crate) fn plan_reading(path: &str, ranges: &[(u64, u64)]) -> warmstart_plan::Plan {
    use warmstart_plan::plan::{PlanFile, PlanMeta};
    warmstart_plan::Plan {
        meta: PlanMeta {
            command: vec![],
            created_unix_ms: 0,
            traces: 1,
            min_traces: 1,
            passes: vec![],
            sorted: false,
        },
        files: vec![PlanFile {
            path: path.into(),
            id: Default::default(),
        }],
        lookups: vec![],
        entries: ranges
            .iter()
            .map(|&(offset, len)| warmstart_plan::Entry::Data {
                file: 0,
                offset,
                len,
            })
            .collect(),
    }
}

/// Whether the dentry cache resolves `path` without a read.
fn in_dcache(path: &std::path::Path) -> bool {
    !matches!(
        warmstart_sys::cached::stat_cached(path),
        warmstart_sys::cached::Cached::Unknown
    )
}

/// Reads `files` on a thread of its own, for their pages to be cached
/// when they are read in turn; nothing if the dentry cache has them all
/// (a warm launch), or if no thread can be started.
fn read_ahead(files: &[PathBuf]) {
    if files.iter().all(|f| in_dcache(f)) {
        return;
    }
    let files = files.to_vec();
    let _ = std::thread::Builder::new()
        .name("read-ahead".into())
        .stack_size(64 << 10)
        .spawn(move || {
            for f in files {
                let _ = std::fs::read(f);
            }
        });
}

/// Whether a launch in `phase` needs the recorder: learning and relearning
/// record it; a prefetched launch is traced when audited (`audit_next`,
/// the profile's turn; `cfg.audit`, always) or broken down.
fn needs_recorder(phase: Phase, audit_next: bool, cfg: &Config) -> bool {
    match phase {
        Phase::Learning => true,
        Phase::Prefetching => audit_next || cfg.audit || cfg.breakdown,
        Phase::Ignored => false,
    }
}

/// The launch manager. `RECORDER` false compiles out every path that
/// records (the recorder is most of the binary's size); those launches
/// return `None` instead.
fn run_with<const RECORDER: bool>(
    argv: &[OsString],
    profile: Option<&str>,
    cfg: &Config,
) -> Result<Option<(Exit, LaunchReport)>, Error> {
    run_named::<RECORDER>(argv, profile, cfg, true)
}

/// [`run_with`]; `hints`: whether the profile may be named by the command
/// line's hint (false when a hint proved wrong and the launch starts over).
fn run_named<const RECORDER: bool>(
    argv: &[OsString],
    profile: Option<&str>,
    cfg: &Config,
    hints: bool,
) -> Result<Option<(Exit, LaunchReport)>, Error> {
    let start = Instant::now();
    // The command line as text, for its profile and messages; the command
    // itself runs with its arguments' bytes as given.
    let text = argv_text(argv);
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    // A launch named by its command line may be named by its hint, and its
    // program's path walked beside the hint's read and the replay. Warm,
    // where the dentry cache answers, the walk costs less than a thread.
    let key = profile.is_none().then(|| hint::key(uid, &text));
    let key_read = key.as_deref().filter(|_| hints);
    let early = key_read.is_some_and(|k| !in_dcache(&hint::path(&cfg.state_dir, k)));
    let walk = early.then(|| Walk::beside(uid, &text));
    let hinted = key_read.and_then(|k| hint::read(&cfg.state_dir, k));
    let walk = walk.unwrap_or_else(|| match &hinted {
        Some(h) if !in_dcache(&h.program) => Walk::beside(uid, &text),
        _ => Walk::now(uid, &text),
    });
    let name = match (profile, &hinted) {
        (Some(n), _) if !valid_name(n) => return Err(Error::BadName(n.to_string())),
        (Some(n), _) => n.to_string(),
        (None, Some(h)) => h.name.clone(),
        (None, None) => walk.get().name.clone(),
    };
    // What deciding reads after the profile, read meanwhile on a thread of
    // its own: on a cold cache each is a read the replay would wait for.
    read_ahead(&[
        Store::at(&cfg.state_dir).plan_path(&name),
        cfg.state_dir.join(device::DEVICES_FILE),
    ]);
    // Whether the launch goes on under its command's profile: false when
    // the hint named another, and it must start over, before anything is
    // launched or saved.
    let named_right = || profile.is_some() || walk.get().name == name;
    let over = || run_named::<RECORDER>(argv, profile, cfg, false);
    let program = || walk.get().program.as_deref();
    // No state to keep, or none that can be read: the launch still
    // happens, unmanaged.
    let unmanaged = |why: &dyn std::fmt::Display| -> Result<Option<(Exit, LaunchReport)>, Error> {
        if !named_right() {
            return over();
        }
        eprintln!("warmstart: {why}; launching without prefetching");
        if cfg.exec_in_place {
            let source = warmstart_record::exec_in_place(program(), argv);
            return Err(Error::Spawn {
                cmd: text.join(" "),
                source,
            });
        }
        let mut report = LaunchReport::new(&name, Phase::Ignored);
        let exit = plain_launch(argv)?.0;
        report.phase_after = Phase::Ignored;
        report.exit_code = exit.shell_code();
        report.wall_ms = start.elapsed().as_secs_f64() * 1e3;
        Ok(Some((exit, report)))
    };
    let store = match Store::open(&cfg.state_dir) {
        Ok(s) => s,
        Err(e) => return unmanaged(&e),
    };
    // One writer per profile: a second launch of the same command while
    // the first is learned, or while the daemon saves it, runs unmanaged
    // rather than racing it for trace numbers and the plan. Released when
    // this process ends or execs (the descriptor is close-on-exec).
    let _lock = match store.lock_within(&name, PROFILE_LOCK_WAIT) {
        Ok(Some(l)) => l,
        Ok(None) => {
            return unmanaged(&format!(
            "profile {name} is in use by another warmstart (a concurrent launch of this command)"
        ))
        }
        Err(e) => return unmanaged(&e),
    };
    let mut prof = match store.load(&name) {
        Ok(Some(p)) => p,
        Ok(None) => Profile::new(&name, &text),
        // A corrupt profile must neither stop the launch nor lose what the
        // profile learned: it is rebuilt from its traces and plan.
        Err(Error::CorruptProfile { path, why }) => match store.rebuild(&name, &text, &why) {
            Ok(p) => {
                eprintln!(
                    "warmstart: {} did not parse ({why}); rebuilt the profile from its {} trace(s){}",
                    path.display(),
                    p.traces.len(),
                    if p.phase == Phase::Prefetching { " and its plan" } else { "" }
                );
                p
            }
            Err(e) => {
                return unmanaged(&format!(
                    "{} did not parse ({why}), and rebuilding it failed: {e}",
                    path.display()
                ))
            }
        },
        // Unreadable (permissions, I/O): left as it is.
        Err(e) => return unmanaged(&e),
    };
    if !RECORDER && needs_recorder(prof.phase, prof.audit_next, cfg) {
        return Ok(None);
    }
    // Only a prefetched launch goes on beside its walk (its replay starts
    // first); any other waits for it.
    if prof.phase != Phase::Prefetching && !named_right() {
        drop(_lock);
        return over();
    }
    let mut report = LaunchReport::new(&name, prof.phase);
    report.started_at = Some(start);
    report.named_by_hint = hinted.is_some();
    prof.launches += 1;

    // Called once the name is known to be right.
    let in_place = |store: &Store| {
        // A launch that could not be counted still runs.
        let _ = store.count_launch_in_place(&name);
        let source = warmstart_record::exec_in_place(program(), argv);
        Error::Spawn {
            cmd: text.join(" "),
            source,
        }
    };
    let exit = match prof.phase {
        Phase::Ignored if cfg.exec_in_place => return Err(in_place(&store)),
        Phase::Ignored => plain_launch(argv)?.0,
        Phase::Learning => match load_previous_plan(&store, &name) {
            Some(plan) => prefetch::<RECORDER>(
                argv,
                &plan,
                Launch::Relearn,
                &store,
                &mut prof,
                cfg,
                &mut report,
                &|| true,
            )?
            .expect("a launch confirmed beforehand is never started over"),
            None if RECORDER => learn(argv, &store, &mut prof, cfg, &mut report)?,
            None => unreachable!("handed over above"),
        },
        // Do no harm: a launch whose plan is already in the page cache
        // gains nothing from a replay and would only share its CPUs with
        // it. An audited launch is replayed all the same.
        Phase::Prefetching => {
            let checks = !(cfg.audit || cfg.breakdown || prof.audit_next);
            // The program's own first page absent: a cold launch, known
            // without the warm check's opens (directory walks read from
            // storage on a cold cache, before the replay starts). Named by
            // a hint, the program is the one it names, not yet walked to.
            let cold = checks
                && match &hinted {
                    Some(h) => program_cold(&h.program),
                    None => program().is_some_and(|p| !program_cached(p)),
                };
            // Without decoding the plan, from warm-check.json.
            let quick = (checks && !cold)
                .then(|| quick_warm(&store, &name))
                .flatten();
            if quick == Some(true) && cfg.exec_in_place {
                if !named_right() {
                    drop(_lock);
                    return over();
                }
                return Err(in_place(&store));
            }
            match load_plan(&store, &name) {
                Ok(plan) => {
                    if checks && !cold && quick.is_none() {
                        // Missing or unreadable (a plan older than it).
                        save_warm_check(&store, &name, &plan);
                    }
                    let warm = checks
                        && !cold
                        && quick.unwrap_or_else(|| windows_cached(&warm_windows(&plan)));
                    if warm && cfg.exec_in_place {
                        if !named_right() {
                            drop(_lock);
                            return over();
                        }
                        return Err(in_place(&store));
                    }
                    let launch = Launch::Prefetch { warm };
                    let launched = prefetch::<RECORDER>(
                        argv,
                        &plan,
                        launch,
                        &store,
                        &mut prof,
                        cfg,
                        &mut report,
                        &named_right,
                    )?;
                    match launched {
                        Some(exit) => exit,
                        None => {
                            drop(_lock);
                            return over();
                        }
                    }
                }
                Err(_) if !named_right() => {
                    drop(_lock);
                    return over();
                }
                Err(why) => {
                    eprintln!("warmstart: {why}; launching without prefetching, and relearning");
                    report.plan_problem = Some(why.clone());
                    relearn(&mut prof, &store, why, false, &mut report);
                    plain_launch(argv)?.0
                }
            }
        }
    };
    if cfg.breakdown && report.breakdown.is_none() && report.breakdown_problem.is_none() {
        report.breakdown_problem = Some(match report.phase_before {
            Phase::Learning => {
                "no plan yet: the profile is learning (this launch was recorded, not prefetched)"
                    .to_string()
            }
            Phase::Ignored => "the profile is ignored: nothing was prefetched".to_string(),
            Phase::Prefetching => "no replay ran beside this launch".to_string(),
        });
    }
    report.phase_after = prof.phase;
    report.exit_code = exit.shell_code();
    report.wall_ms = start.elapsed().as_secs_f64() * 1e3;
    // The launch has happened: a profile that cannot be saved (a full or
    // read-only disk) is reported, and the command's status still returned.
    let saved = save_after_launch(&store, &mut prof, &report);
    if let Err(e) = saved {
        eprintln!("warmstart: could not save the profile: {e}");
    }
    report.after_exit_ms = report.exited_at.map(|t| t.elapsed().as_secs_f64() * 1e3);
    // The name is known right by now: kept for the next launch, if it
    // changed.
    if let Some(k) = &key {
        let fresh = hint::Hint {
            name: name.clone(),
            program: PathBuf::from(&walk.get().canonical),
        };
        if fresh.program.is_absolute() && hinted.as_ref() != Some(&fresh) {
            hint::write(&cfg.state_dir, k, &fresh);
        }
    }
    Ok(Some((exit, report)))
}
