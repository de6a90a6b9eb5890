//! `warmstart run`: one launch through the launch manager.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::Serialize;
use std::ffi::OsString;
use warmstart_plan::compile::{compile, CompileOptions, Compiled};
use warmstart_plan::trace::NEVER_USED;
use warmstart_plan::{Plan, Trace};
use warmstart_record::{argv_text, Exit, HeldChild, SignalForwarder};
use warmstart_replay::{Engine, RealBackend, Report};

use crate::device::{self, DeviceCache};
use crate::store::{self, valid_name, Phase, Profile, Store};
use crate::Error;

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
    /// with the sorted strategy, for the whole replay).
    pub held_ms: Option<f64>,
    pub exit_code: i32,
    pub wall_ms: f64,
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
            exit_code: 0,
            wall_ms: 0.0,
        }
    }
}

/// The profile name for a command run by this process's user: see
/// [`profile_name_for`].
pub fn profile_name(argv: &[String]) -> String {
    // SAFETY: geteuid has no preconditions.
    profile_name_for(unsafe { libc::geteuid() }, argv)
}

/// The profile name for a command run by `uid`: the executable's base
/// name (at most 64 characters), the user, and a digest of the resolved
/// executable and the arguments, so `python3 a.py` and `python3 b.py` are
/// different launches and one user's launches never decide what is read
/// for another's. The digest is SHA-256 cut to 128 bits: a CRC could be
/// forged to collide with another command's profile.
pub fn profile_name_for(uid: u32, argv: &[String]) -> String {
    name_for(uid, &resolve_exe(&argv[0]), argv)
}

/// How long a launch waits for its profile's lock before it runs
/// unmanaged: longer than the daemon's save, far shorter than a launch.
const PROFILE_LOCK_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

/// Characters of the program's name kept in a profile name.
const NAME_BASE_MAX: usize = 64;

/// [`profile_name_for`] for an executable already resolved.
fn name_for(uid: u32, exe: &str, argv: &[String]) -> String {
    use sha2::{Digest, Sha256};
    let base = Path::new(&argv[0])
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "cmd".into());
    let base: String = base
        .trim_start_matches('.')
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(NAME_BASE_MAX)
        .collect();
    let base = if base.is_empty() { "cmd".into() } else { base };
    let mut h = Sha256::new();
    // Each part length-prefixed: ["a", "b c"] and ["a b", "c"] differ.
    for part in std::iter::once(exe).chain(argv[1..].iter().map(String::as_str)) {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    let d = h.finalize();
    let hex: String = d[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("{base}-u{uid}-{hex}")
}

pub(crate) fn resolve_exe(cmd: &str) -> String {
    canonical(find_program(cmd).as_deref(), cmd)
}

fn canonical(found: Option<&Path>, cmd: &str) -> String {
    let p = found.unwrap_or(Path::new(cmd));
    std::fs::canonicalize(p)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| p.display().to_string())
}

/// The file `execvp` would run for `cmd`: `cmd` itself if it names a path,
/// else the first executable regular file of that name in PATH.
pub(crate) fn find_program(cmd: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    if cmd.contains('/') {
        return Some(PathBuf::from(cmd));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .filter(|d| !d.as_os_str().is_empty())
        .map(|d| d.join(cmd))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Compiles traces with FIEMAP available for the sorted order.
pub fn compile_traces(
    traces: &[Trace],
    opts: &CompileOptions,
) -> Result<Compiled, warmstart_plan::compile::CompileError> {
    let mapper = warmstart_sys::fiemap::PhysicalMap::default();
    let mut compiled = compile(traces, opts, &|f, off| mapper.physical(&f.path, off))?;
    compiled.plan.meta.created_unix_ms = store::now_ms();
    Ok(compiled)
}

/// Runs `argv` through the launch manager and returns how it ended.
pub fn run(
    argv: &[OsString],
    profile: Option<&str>,
    cfg: &Config,
) -> Result<(Exit, LaunchReport), Error> {
    let start = Instant::now();
    // The command line as text, for its profile and messages; the command
    // itself runs with its arguments' bytes as given.
    let text = argv_text(argv);
    let program = find_program(&text[0]);
    let name = match profile {
        Some(n) if !valid_name(n) => return Err(Error::BadName(n.to_string())),
        Some(n) => n.to_string(),
        // SAFETY: geteuid has no preconditions.
        None => name_for(
            unsafe { libc::geteuid() },
            &canonical(program.as_deref(), &text[0]),
            &text,
        ),
    };
    // No state to keep, or none that can be read: the launch still
    // happens, unmanaged.
    let unmanaged = |why: &dyn std::fmt::Display| -> Result<(Exit, LaunchReport), Error> {
        eprintln!("warmstart: {why}; launching without prefetching");
        if cfg.exec_in_place {
            let source = warmstart_record::exec_in_place(program.as_deref(), argv);
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
        Ok((exit, report))
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
    let mut report = LaunchReport::new(&name, prof.phase);
    prof.launches += 1;

    let in_place = |store: &Store| {
        // A launch that could not be counted still runs.
        let _ = store.count_launch_in_place(&name);
        let source = warmstart_record::exec_in_place(program.as_deref(), argv);
        Error::Spawn {
            cmd: text.join(" "),
            source,
        }
    };
    let exit = match prof.phase {
        Phase::Ignored if cfg.exec_in_place => return Err(in_place(&store)),
        Phase::Ignored => plain_launch(argv)?.0,
        Phase::Learning => match load_previous_plan(&store, &name) {
            Some(plan) => prefetch(
                argv,
                &plan,
                Launch::Relearn,
                &store,
                &mut prof,
                cfg,
                &mut report,
            )?,
            None => learn(argv, &store, &mut prof, cfg, &mut report)?,
        },
        // Do no harm: a launch whose plan is already in the page cache
        // gains nothing from a replay and would only share its CPUs with
        // it. An audited launch is replayed all the same.
        Phase::Prefetching => {
            let checks = !(cfg.audit || prof.audit_next);
            // Without decoding the plan, from warm-check.json.
            let quick = checks.then(|| quick_warm(&store, &name)).flatten();
            if quick == Some(true) && cfg.exec_in_place {
                return Err(in_place(&store));
            }
            match load_plan(&store, &name) {
                Ok(plan) => {
                    if checks && quick.is_none() {
                        // Missing or unreadable (a plan older than it).
                        save_warm_check(&store, &name, &plan);
                    }
                    let warm =
                        checks && quick.unwrap_or_else(|| windows_cached(&warm_windows(&plan)));
                    if warm && cfg.exec_in_place {
                        return Err(in_place(&store));
                    }
                    let launch = Launch::Prefetch { warm };
                    prefetch(argv, &plan, launch, &store, &mut prof, cfg, &mut report)?
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
    report.phase_after = prof.phase;
    report.exit_code = exit.shell_code();
    report.wall_ms = start.elapsed().as_secs_f64() * 1e3;
    // The launch has happened: a profile that cannot be saved (a full or
    // read-only disk) is reported, and the command's status still returned.
    if let Err(e) = store.save(&mut prof) {
        eprintln!("warmstart: could not save the profile: {e}");
    }
    Ok((exit, report))
}

pub(crate) fn load_plan(store: &Store, name: &str) -> Result<Plan, String> {
    let p = store.plan_path(name);
    let bytes = std::fs::read(&p).map_err(|e| format!("plan {} unreadable: {e}", p.display()))?;
    Plan::from_bytes(&bytes).map_err(|e| format!("plan {} rejected: {e}", p.display()))
}

/// A relearning profile's previous plan, if it has one that still reads.
pub(crate) fn load_previous_plan(store: &Store, name: &str) -> Option<Plan> {
    let bytes = std::fs::read(store.previous_plan_path(name)).ok()?;
    Plan::from_bytes(&bytes).ok()
}

/// Sends a profile back to learning. With `keep_plan` its plan stays, as
/// the previous plan, to prefetch with while the new launches are recorded:
/// the replay skips the files that changed, and the recording still sees
/// every page a launch uses, prefetched or not. A plan that could not be
/// read is not kept.
pub(crate) fn relearn(
    prof: &mut Profile,
    store: &Store,
    why: String,
    keep_plan: bool,
    report: &mut LaunchReport,
) {
    for t in prof.traces.drain(..) {
        let _ = std::fs::remove_file(store.trace_path(&prof.name, &t));
    }
    let _ = std::fs::remove_file(store.warm_check_path(&prof.name));
    let (plan, previous) = (
        store.plan_path(&prof.name),
        store.previous_plan_path(&prof.name),
    );
    if !(keep_plan && std::fs::rename(&plan, &previous).is_ok()) {
        let _ = std::fs::remove_file(&plan);
        let _ = std::fs::remove_file(&previous);
    }
    prof.plan_bytes = None;
    prof.phase = Phase::Learning;
    prof.relearned += 1;
    prof.note = Some(format!("relearning: {why}"));
    report.relearn_reason = Some(why);
}

/// Sends profile `name` back to learning if it is prefetching, keeping its
/// plan to prefetch the unchanged files with meanwhile (`warmstart
/// changed`, after a package upgrade replaced some of its files). Returns
/// whether it was prefetching.
pub fn mark_relearn(store: &Store, name: &str, why: &str) -> Result<bool, Error> {
    let Some(mut prof) = store.load(name)? else {
        return Ok(false);
    };
    if prof.phase != Phase::Prefetching {
        return Ok(false);
    }
    let mut report = LaunchReport::new(name, prof.phase);
    relearn(&mut prof, store, why.to_string(), true, &mut report);
    prof.audit_next = false;
    store.save(&mut prof)?;
    Ok(true)
}

/// Keeps a trace in the profile; compiles once there are enough.
pub(crate) fn add_trace(
    trace: &Trace,
    store: &Store,
    prof: &mut Profile,
    cfg: &Config,
    report: &mut LaunchReport,
) -> Result<(), Error> {
    let file = format!("trace-{}", prof.next_trace);
    prof.next_trace += 1;
    let dir = store.dir(&prof.name);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    store::write_atomic(&store.trace_path(&prof.name, &file), &trace.to_bytes())?;
    prof.traces.push(file);
    // Keep only the newest N_rawseq traces: older ones describe an older app.
    while prof.traces.len() > cfg.nrawseq.max(1) as usize {
        let old = prof.traces.remove(0);
        let _ = std::fs::remove_file(store.trace_path(&prof.name, &old));
    }
    if prof.traces.len() < cfg.nrawseq.max(1) as usize {
        prof.note = Some(format!(
            "learning: {} of {} launches recorded",
            prof.traces.len(),
            cfg.nrawseq
        ));
        return Ok(());
    }
    let mut traces = Vec::new();
    let mut unreadable = Vec::new();
    for (name, (p, t)) in prof
        .traces
        .clone()
        .into_iter()
        .zip(read_traces(store, prof))
    {
        match t {
            Ok(t) => traces.push(t),
            Err(why) => {
                eprintln!("warmstart: ignoring trace {}: {why}", p.display());
                unreadable.push(name);
            }
        }
    }
    // No longer listed: the profile's traces are the ones it can read.
    prof.traces.retain(|t| !unreadable.contains(t));
    compile_profile(&traces, store, prof, cfg, report)
}

/// The profile's traces, each with its path; `None` where one cannot be
/// read or decoded.
fn read_traces(store: &Store, prof: &Profile) -> Vec<(PathBuf, Result<Trace, String>)> {
    prof.traces
        .iter()
        .map(|t| {
            let p = store.trace_path(&prof.name, t);
            let trace = std::fs::read(&p)
                .map_err(|e| e.to_string())
                .and_then(|b| Trace::from_bytes(&b).map_err(|e| e.to_string()));
            (p, trace)
        })
        .collect()
}

/// Compiles `traces` into the profile's plan (or finds the launch not
/// worth one).
fn compile_profile(
    traces: &[Trace],
    store: &Store,
    prof: &mut Profile,
    cfg: &Config,
    report: &mut LaunchReport,
) -> Result<(), Error> {
    let compiled = match compile_traces(traces, &cfg.compile) {
        Ok(c) => c,
        Err(e) => {
            prof.note = Some(format!("compile failed: {e}"));
            return Ok(());
        }
    };
    if let Some(reason) = &compiled.report.empty {
        // Nothing of an earlier plan may stay behind (a plan compiled
        // again can come out empty: see `judge`).
        for p in [
            store.previous_plan_path(&prof.name),
            store.plan_path(&prof.name),
            store.warm_check_path(&prof.name),
        ] {
            let _ = std::fs::remove_file(p);
        }
        prof.plan_bytes = None;
        prof.phase = Phase::Ignored;
        prof.note = Some(format!("not prefetched: {reason:?}"));
        report.compiled = prof.note.clone();
        return Ok(());
    }
    let bytes = compiled.plan.to_bytes();
    store::write_atomic(&store.plan_path(&prof.name), &bytes)?;
    save_warm_check(store, &prof.name, &compiled.plan);
    let _ = std::fs::remove_file(store.previous_plan_path(&prof.name));
    prof.plan_bytes = Some(bytes.len() as u64);
    prof.phase = Phase::Prefetching;
    prof.note = Some(format!(
        "plan: {} entries, {} files, {} bytes to read",
        compiled.plan.entries.len(),
        compiled.plan.files.len(),
        compiled.plan.data_bytes() + compiled.plan.meta_bytes()
    ));
    report.compiled = prof.note.clone();
    Ok(())
}

fn learn(
    argv: &[OsString],
    store: &Store,
    prof: &mut Profile,
    cfg: &Config,
    report: &mut LaunchReport,
) -> Result<Exit, Error> {
    let recorded = warmstart_record::record(argv, &cfg.record, |_| {})?;
    for why in &recorded.fallbacks {
        eprintln!("warmstart: recorder fell back from {why}");
    }
    // Compiling happens while the application goes on running. A failure
    // here costs the profile a trace, never the launch its exit status.
    if let Err(e) = add_trace(&recorded.trace, store, prof, cfg, report) {
        eprintln!("warmstart: could not keep the trace: {e}");
    }
    recorded.wait().map_err(|e| Error::io(Path::new("wait"), e))
}

/// The strategy for this plan: configured, or measured once per device.
fn strategy(plan: &Plan, store: &Store, cfg: &Config) -> Strategy {
    if let StrategyChoice::Fixed(s) = cfg.strategy {
        return s;
    }
    let Some(big) = plan.files.iter().max_by_key(|f| f.id.size) else {
        return Strategy::Concurrent;
    };
    let cache_path = store.root().join("devices.json");
    let mut cache = DeviceCache::load(&cache_path);
    if let Some(v) = cache.devices.get(&big.id.dev) {
        return if v.rotational {
            Strategy::Sorted
        } else {
            Strategy::Concurrent
        };
    }
    match device::probe(Path::new(&big.path)) {
        Some((dev, v)) => {
            cache.devices.insert(dev, v);
            cache.save(&cache_path);
            if v.rotational {
                Strategy::Sorted
            } else {
                Strategy::Concurrent
            }
        }
        None => Strategy::Concurrent,
    }
}

/// What a launch with a plan is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Launch {
    /// Prefetched and judged; `warm`: the plan was found resident already.
    Prefetch { warm: bool },
    /// Recorded for a relearning profile, prefetched with its previous plan.
    Relearn,
}

fn prefetch(
    argv: &[OsString],
    plan: &Plan,
    launch: Launch,
    store: &Store,
    prof: &mut Profile,
    cfg: &Config,
    report: &mut LaunchReport,
) -> Result<Exit, Error> {
    let relearning = launch == Launch::Relearn;
    let do_audit = cfg.audit || prof.audit_next || relearning;
    if launch == (Launch::Prefetch { warm: true }) {
        report.warm_skip = true;
        let (exit, inblock) = plain_launch(argv)?;
        report.app_read_bytes = Some(inblock);
        prof.launches_since_audit += 1;
        return Ok(exit);
    }
    let strat = strategy(plan, store, cfg);
    report.strategy = Some(strat);
    let backend = RealBackend::new();
    let mut ropts = cfg.replay.clone();
    if strat == Strategy::Sorted {
        // The application is held meanwhile: never for long. (A Python
        // launch once waited the replay's default 30 s for pages that did
        // not become resident.)
        ropts.wait = Some(cfg.sorted_wait_max);
    }
    let engine = match Engine::new(&backend, ropts) {
        Ok(e) => e,
        Err(e) => {
            report.plan_problem = Some(format!("replay not started: {e}"));
            return Ok(plain_launch(argv)?.0);
        }
    };
    let cancel = engine.cancel_flag();
    let progress = engine.progress();
    let io_entries = plan
        .entries
        .iter()
        .filter(|e| !matches!(e, warmstart_plan::Entry::Lookup { .. }))
        .count() as u64;

    // The replay runs on its own threads, started before the exec; the
    // sorted strategy waits for it to finish first.
    let (exit, replay_report, audit) = std::thread::scope(|s| -> Result<_, Error> {
        let mut running = None;
        let mut done = None;
        let mut held_ms = None;
        let mut start = || {
            let t0 = Instant::now();
            let h = s.spawn(|| engine.run(plan).ok());
            if strat == Strategy::Sorted {
                done = h.join().ok().flatten();
            } else {
                // A head start: the application's very first reads would
                // otherwise race the replay's first requests and win.
                let t = Instant::now();
                let want = cfg.head_start_requests.min(io_entries);
                while progress.load(Ordering::Relaxed) < want
                    && t.elapsed() < cfg.head_start
                    && !h.is_finished()
                {
                    std::thread::sleep(Duration::from_micros(100));
                }
                running = Some(h);
            }
            held_ms = Some(t0.elapsed().as_secs_f64() * 1e3);
        };
        let (exit, audit) = if do_audit {
            let recorded = warmstart_record::record(argv, &cfg.record, |_| start())?;
            let trace = recorded.trace.clone();
            (
                recorded
                    .wait()
                    .map_err(|e| Error::io(Path::new("wait"), e))?,
                Some(trace),
            )
        } else {
            start();
            let (exit, inblock) = plain_launch(argv)?;
            report.app_read_bytes = Some(inblock);
            (exit, None)
        };
        report.held_ms = held_ms;
        // Whatever the replay has not issued by now nobody needs.
        cancel.store(true, Ordering::Relaxed);
        if let Some(h) = running {
            done = h.join().ok().flatten();
        }
        Ok((exit, done, audit))
    })?;

    if relearning {
        report.replay = replay_report;
        if let Some(t) = audit {
            if let Err(e) = add_trace(&t, store, prof, cfg, report) {
                eprintln!("warmstart: could not keep the trace: {e}");
            }
        }
    } else {
        judge(prof, store, plan, audit, replay_report, cfg, report);
    }
    Ok(exit)
}

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
    } else if prof.phase == Phase::Prefetching && predates_used_only(plan, cfg) {
        // A plan from a warmstart before the used-only pass still reads
        // what the kernel read ahead and no launch used: compiled again
        // from the profile's traces, after this launch. Only from all of
        // them: with one unreadable the plan stays as it is (and this is
        // tried again after the next launch, for the cost of reading them).
        // Traces of format 1.0 mark no page unused; their plan is the same.
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

/// Launches without recording. Returns the exit and the bytes the
/// command's process tree read from storage (block input of waited-for
/// children: the replay's own reads are this process's, not theirs).
pub(crate) fn plain_launch(argv: &[OsString]) -> Result<(Exit, u64), Error> {
    let before = children_inblock();
    let held = HeldChild::spawn(argv).map_err(|source| Error::Spawn {
        cmd: argv_text(argv).join(" "),
        source,
    })?;
    let signals = SignalForwarder::install().map_err(|e| Error::io(Path::new("signals"), e))?;
    let mut running = held.release().map_err(|source| Error::Spawn {
        cmd: argv_text(argv).join(" "),
        source,
    })?;
    let guard = signals.forward_in_background(running.pid());
    let exit = running
        .wait()
        .map_err(|e| Error::io(Path::new("wait"), e))?;
    drop(guard);
    Ok((exit, (children_inblock() - before) * 512))
}

fn children_inblock() -> u64 {
    // SAFETY: getrusage writes into the struct we pass.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru);
        ru.ru_inblock as u64
    }
}

/// The windows the warm check samples: 16 of up to 64 KiB, evenly spaced
/// over the plan's data bytes, as (path, offset, length).
fn warm_windows(plan: &Plan) -> Vec<(String, u64, u64)> {
    const SAMPLES: u64 = 16;
    const WINDOW: u64 = 64 * 1024;
    let data: Vec<(u32, u64, u64)> = plan
        .entries
        .iter()
        .filter_map(|e| match *e {
            warmstart_plan::Entry::Data { file, offset, len } => Some((file, offset, len)),
            _ => None,
        })
        .collect();
    let total: u64 = data.iter().map(|d| d.2).sum();
    if total == 0 {
        return Vec::new();
    }
    // Samples evenly spaced over the plan's bytes, not its entries: the C
    // library and the loader stay resident through a cache drop (every
    // process maps them) and are many small entries, so sampling entries
    // once called a cold launch of the fixture warm and skipped its replay.
    let (mut i, mut before) = (0usize, 0u64);
    (0..SAMPLES)
        .map(|k| {
            let at = total * (2 * k + 1) / (2 * SAMPLES);
            while before + data[i].2 <= at {
                before += data[i].2;
                i += 1;
            }
            let (file, offset, len) = data[i];
            let start = offset + (at - before);
            let path = plan.files[file as usize].path.clone();
            (path, start, WINDOW.min(offset + len - start))
        })
        .collect()
}

/// Whether at least 90% of the windows' pages are in the page cache. Costs
/// an open per distinct file and a cachestat per window: tens of
/// microseconds when warm. It stops as soon as 90% is out of reach: on a
/// cold cache each open walks directories read from disk, and the cold
/// launch's replay waits for this check.
fn windows_cached(windows: &[(String, u64, u64)]) -> bool {
    // Samples often land in the same large file: open each file once.
    let mut open: HashMap<&str, std::fs::File> = HashMap::new();
    let (mut resident, mut pages) = (0u64, 0u64);
    // At least as many pages as the check will count (a window's pages,
    // cut at the end of its file), so stopping early never changes the answer.
    let all: u64 = windows
        .iter()
        .map(|(_, start, len)| start.saturating_add(*len).div_ceil(4096) - start / 4096)
        .sum();
    for (path, start, len) in windows {
        if (pages - resident) * 10 > all {
            return false;
        }
        let f = match open.entry(path.as_str()) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                // A plan's path: a regular file only, never a FIFO or device.
                let Ok(o) = warmstart_sys::open(path) else {
                    return false;
                };
                e.insert(o.file)
            }
        };
        // cachestat counts pages still being read too: enough to tell a
        // warm cache from a cold one, and no mapping per window.
        let Ok(r) = warmstart_sys::residency::cached_or_resident(f, *start, *len) else {
            return false;
        };
        resident += r.resident;
        pages += r.pages;
    }
    // Not all: range merge reads holes a warm launch never touches.
    pages > 0 && resident * 10 >= pages * 9
}

/// The warm check a plan was compiled with (`warm-check.json`), so that a
/// warm launch need not decode its plan: 0.76 ms for LibreOffice's (368
/// files, 1,949 entries) of a 2 ms budget.
#[derive(Debug, Serialize, serde::Deserialize)]
struct WarmCheck {
    windows: Vec<(String, u64, u64)>,
}

fn save_warm_check(store: &Store, name: &str, plan: &Plan) {
    let check = WarmCheck {
        windows: warm_windows(plan),
    };
    let bytes = serde_json::to_vec(&check).expect("serializes");
    // Without it a launch decodes the plan instead.
    let _ = store::write_atomic(&store.warm_check_path(name), &bytes);
}

/// Whether the plan's sampled windows are resident: from `warm-check.json`
/// when it reads, else `None`.
fn quick_warm(store: &Store, name: &str) -> Option<bool> {
    let bytes = std::fs::read(store.warm_check_path(name)).ok()?;
    let check: WarmCheck = serde_json::from_slice(&bytes).ok()?;
    Some(windows_cached(&check.windows))
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

    #[test]
    fn the_warm_check_counts_cached_regular_files_only() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("f");
        std::fs::write(&f, vec![1u8; 64 * 1024]).unwrap();
        let path = f.display().to_string();
        // Just written: cached.
        assert!(windows_cached(&[(path.clone(), 0, 64 * 1024)]));
        // A plan path swapped for a FIFO: not warm, and not opened.
        let fifo = d.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let fifo = fifo.display().to_string();
        assert!(!windows_cached(&[(path, 0, 4096), (fifo, 0, 4096)]));
        assert!(!windows_cached(&[]));
    }

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
    fn profile_names_separate_arguments() {
        let a = profile_name(&["sh".into(), "a.sh".into()]);
        let b = profile_name(&["sh".into(), "b.sh".into()]);
        assert_ne!(a, b);
        assert!(a.starts_with("sh-"));
        assert!(valid_name(&a));
        assert!(valid_name(&profile_name(&["./weird name!".into()])));
        // Argument boundaries count.
        assert_ne!(
            profile_name(&["sh".into(), "a".into(), "b c".into()]),
            profile_name(&["sh".into(), "a b".into(), "c".into()])
        );
    }

    #[test]
    fn profile_names_are_per_user_and_always_valid() {
        let argv: Vec<String> = vec!["/bin/sh".into(), "x".into()];
        let root = profile_name_for(0, &argv);
        let user = profile_name_for(1000, &argv);
        assert_ne!(root, user);
        assert!(root.starts_with("sh-u0-") && user.starts_with("sh-u1000-"));
        // Same command, same user: same profile.
        assert_eq!(user, profile_name_for(1000, &argv));
        // A very long or empty program name still gives a valid name.
        for exe in ["x".repeat(300), "...".into(), "é".repeat(100)] {
            let n = profile_name_for(u32::MAX, std::slice::from_ref(&exe));
            assert!(valid_name(&n), "{exe:?} -> {n:?}");
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
}
