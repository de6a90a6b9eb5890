//! Launches the daemon follows: deciding an exec (leave it alone, learn
//! it, or prefetch it with its plan), starting the replay, and what each
//! followed launch carries until it ends.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use warmstart_plan::Plan;
use warmstart_record::Aggregator;
use warmstart_replay::{monotonic_ns, Backend as _, DataGate, Engine, RealBackend, Report};

use super::cache::{Cache, Check};
use super::config::DaemonConfig;
use super::control::SessionStatus;
use super::policy::{
    is_service, launch_key, launch_uid, read_cmdline, started_by_warmstart, trivial_key, QuietExe,
    Scripts,
};
use super::tuning::{leave_realtime, spawn_here};
use super::Shared;
use crate::manager::{load_plan, plan_cached, profile_name_for, Config};
use crate::store::Phase;

pub(super) enum Mode {
    Learning,
    Prefetching {
        /// Shared with the profile cache and the replay thread.
        plan: Arc<Plan>,
        replay: Option<std::thread::JoinHandle<Option<Report>>>,
        cancel: Arc<AtomicBool>,
        /// Requests issued so far, and when the first one was (monotonic
        /// ns; 0 until then).
        requests: Arc<AtomicU64>,
        first_request_ns: Arc<AtomicU64>,
        /// When work on the first entry started (monotonic ns).
        first_start_ns: Arc<AtomicU64>,
        /// When the daemon first knew of the launch (monotonic ns): the
        /// execve's entry for a replay started there, else the exec event.
        seen_ns: u64,
        /// Recorded in full for the audit; otherwise only its process
        /// tree is followed.
        audited: bool,
        /// A relearning profile's launch, prefetched with its previous
        /// plan: recorded in full, and its trace is a learning trace.
        relearn: bool,
        /// Paces the replay's data until the exec is done (see
        /// [`Start::Paced`]).
        gate: Option<Arc<DataGate>>,
        /// Not replayed: its plan was in the page cache ([`Start::Cached`]).
        cached: bool,
    },
}

/// Whether and how a launch's replay starts.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Start {
    /// Not at all: the launch runs unprefetched.
    No,
    /// Not at all, the plan being in the page cache already: a warm
    /// launch gains nothing from a replay, which would only take CPU from
    /// it (clang's, resident, costs 15 ms of CPU beside a 55 ms launch).
    Cached,
    /// Everything at once: the program is loaded.
    Now,
    /// At the execve, before the kernel has found and loaded anything:
    /// its data read through one request at a time until the exec event
    /// opens the gate ([`Mode::release_data`]), so that the exec's own
    /// synchronous reads (a `PATH` search's directories, the script's
    /// `#!` line, the interpreter's headers) do not queue behind it.
    Paced,
}

/// How long a replay's data is paced at most, waiting for its exec: as
/// long as the daemon keeps a replay started at an execve.
const PACE_LIMIT: Duration = Duration::from_secs(1);

/// One launch being followed, from its exec until its process tree
/// exits, goes idle or runs too long.
pub(super) struct Session {
    pub(super) name: String,
    pub(super) argv: Vec<String>,
    /// What a trivial launch of it holds back ([`trivial_key`]), and
    /// whether the user named it (the learn list or an allow glob) when it
    /// was decided: then it is learned even if trivial.
    pub(super) trivial_key: String,
    pub(super) listed: bool,
    /// What the kernel side may leave alone if the launch proves trivial.
    pub(super) quiet: Option<QuietExe>,
    pub(super) agg: Aggregator,
    pub(super) members: HashSet<u32>,
    pub(super) mode: Mode,
    pub(super) exec_ts_ns: u64,
    /// The kernel's times (monotonic ns) of the launch's first exec and
    /// of the last exit of its processes seen so far: its duration, free
    /// of how late the daemon heard of either.
    pub(super) first_exec_ns: u64,
    pub(super) last_exit_ns: u64,
    pub(super) started: Instant,
    pub(super) last_io: Instant,
    /// The key of the execve that began it ([`super::execs`]).
    pub(super) exec_key: Option<String>,
}

/// What a launch is: its profile name, command, trivial key and mode.
pub(super) struct Decision {
    pub(super) name: String,
    pub(super) argv: Vec<String>,
    pub(super) trivial_key: String,
    pub(super) listed: bool,
    pub(super) mode: Mode,
}

/// What deciding a launch needs from the daemon, besides the launch.
pub(super) struct Ctx<'a> {
    pub(super) dcfg: &'a DaemonConfig,
    pub(super) cfg: &'a Config,
    pub(super) store: &'a crate::store::Store,
    pub(super) shared: &'a Shared,
    pub(super) check: &'a std::sync::mpsc::Sender<Check>,
    /// The daemon's own pid: never followed.
    pub(super) me: u32,
    /// Leave launches started by another warmstart (`warmstart run`) to
    /// it ([`started_by_warmstart`]); off in tests whose launches are the
    /// test binary's children.
    pub(super) skip_wrapped: bool,
}

/// Decides what a launch is, and the exec-to-replay latency if a replay
/// was started. `None`: leave it alone. `early_others` replays are running
/// for other launches, started at their execve and not decided yet: they
/// count against the replay limit. `leave_rt` is called before a plan is
/// read from the state directory: per-plan work never runs at real-time
/// priority.
#[allow(clippy::too_many_arguments)]
pub(super) fn decide(
    ctx: &Ctx,
    tgid: u32,
    uid: u32,
    exe: &str,
    argv: Option<&[String]>,
    early: &mut Option<Early>,
    exec_ts_ns: u64,
    sessions: &HashMap<u32, Session>,
    early_others: usize,
    leave_rt: &mut dyn FnMut(),
) -> Option<(Decision, Option<f64>)> {
    let (dcfg, cfg, cache) = (ctx.dcfg, ctx.cfg, &ctx.shared.cache);
    if tgid == ctx.me || exe.is_empty() {
        return None;
    }
    let argv = match argv {
        Some(a) => a.to_vec(),
        None => read_cmdline(tgid)?,
    };
    let (argv, key) = launch_key(tgid, exe, &argv)?;
    // A launch allowed when it started stays allowed when its first process
    // execs the program it launches (`soffice`, a shell script, execs
    // `oosplash`): the user allowed the command they run. Only a deny-list
    // entry for the program it ends in stops it.
    let continued = sessions.contains_key(&tgid);
    let listed = ctx
        .shared
        .learn
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&key);
    let learn = if listed {
        BTreeSet::from([key.clone()])
    } else {
        BTreeSet::new()
    };
    if !dcfg.permits(&key, continued, &learn)
        || (dcfg.skip_services && is_service(tgid))
        || (!continued && ctx.skip_wrapped && started_by_warmstart(Path::new("/proc"), tgid))
    {
        return None;
    }
    // Named by the user (the learn list, or an allow glob): learned
    // however small it is.
    let listed = listed || dcfg.named_by_allow(&key);
    let name = profile_name_for(uid, &argv);
    // From memory: the cache holds every profile (a name it lacks has
    // none), and repairs are left to the checker.
    let known = cache.get(&name);
    // A program found trivial is not recorded again for a while, unless
    // it has a profile or the user asked for it.
    let trivial_key = trivial_key(exe, &argv, &key, &name);
    if known.is_none() && !listed && ctx.shared.trivial().holds(&trivial_key, Instant::now()) {
        return None;
    }
    let audit = known.as_ref().is_none_or(|k| k.audit_due(cfg.nchk));
    let (phase, plan) = match known {
        Some(k) => (k.phase, k.plan.map(|(p, _)| p)),
        None => (Phase::Learning, None),
    };
    let plan = match (phase, plan) {
        (Phase::Prefetching, None) => {
            leave_rt();
            match load_plan(ctx.store, &name) {
                Ok(p) => Some(Arc::new(p)),
                // Reported and relearned by the checker, which reads it too.
                Err(_) => None,
            }
        }
        // A relearning profile's previous plan is in the cache, if any.
        (_, plan) => plan,
    };
    let relearn = phase == Phase::Learning;
    let mut first_request = None;
    let decision = |mode| Decision {
        name: name.clone(),
        argv: argv.clone(),
        trivial_key: trivial_key.clone(),
        listed,
        mode,
    };
    let decided = match (phase, plan) {
        (Phase::Ignored, _) => None,
        (Phase::Prefetching | Phase::Learning, Some(plan)) => {
            let audited = audit || relearn;
            let (m, adopted) = match early.take() {
                // Started when the execve began, for this profile and plan.
                Some(e) if e.name == name && e.plan_is(&plan) => {
                    let mut m = e.mode;
                    if let Mode::Prefetching {
                        audited: a,
                        relearn: r,
                        ..
                    } = &mut m
                    {
                        (*a, *r) = (audited, relearn);
                    }
                    (m, true)
                }
                other => {
                    if let Some(e) = other {
                        stop_replay(&e.mode);
                    }
                    // Replays started at other launches' execve count too.
                    // None when the launch's first process execs the program
                    // its launch is already replaying for (`env` running
                    // `node`): that replay goes on.
                    let again = sessions.get(&tgid).is_some_and(|s| s.name == name);
                    let start = if again
                        || replaying(sessions, early_others) >= dcfg.max_concurrent_replays
                    {
                        Start::No
                    } else if !audited && plan_cached(&plan) {
                        // Do no harm, as `warmstart run` does: an audited
                        // launch is replayed all the same.
                        Start::Cached
                    } else {
                        Start::Now
                    };
                    (
                        start_prefetch(plan, cfg, cache, start, audited, relearn, exec_ts_ns),
                        false,
                    )
                }
            };
            let latency = match &m {
                Mode::Prefetching {
                    replay: Some(_),
                    first_request_ns,
                    ..
                } => {
                    first_request = Some(Arc::clone(first_request_ns));
                    Some(if adopted {
                        0.0
                    } else {
                        monotonic_ns().saturating_sub(exec_ts_ns) as f64 / 1e3
                    })
                }
                _ => None,
            };
            Some((decision(m), latency))
        }
        _ => Some((decision(Mode::Learning), None)),
    };
    // The replay is on its way: now compare what was used with the store.
    let _ = ctx.check.send(Check::Profile {
        name,
        first_request_ns: first_request,
    });
    decided
}

/// Nanoseconds from `from` to `to` (monotonic), negative if `to` came first
/// (a replay started at the execve, before its exec event).
pub(super) fn since(from: u64, to: u64) -> f64 {
    to as f64 - from as f64
}

/// How many launches have a replay running: sessions', and `early` more.
pub(super) fn replaying(sessions: &HashMap<u32, Session>, early: usize) -> usize {
    early
        + sessions
            .values()
            .filter(|s| {
                matches!(
                    s.mode,
                    Mode::Prefetching {
                        replay: Some(_),
                        ..
                    }
                )
            })
            .count()
}

/// A prefetching mode for `plan`, its replay started on a new thread as
/// `start` says (no thread, no replay: the launch runs unprefetched).
fn start_prefetch(
    plan: Arc<Plan>,
    cfg: &Config,
    cache: &Cache,
    start: Start,
    audited: bool,
    relearn: bool,
    seen_ns: u64,
) -> Mode {
    let cancel = Arc::new(AtomicBool::new(false));
    let requests = Arc::new(AtomicU64::new(0));
    let first_request_ns = Arc::new(AtomicU64::new(0));
    let first_start_ns = Arc::new(AtomicU64::new(0));
    let gate = (start == Start::Paced).then(|| Arc::new(DataGate::closed(PACE_LIMIT)));
    let replay = if matches!(start, Start::Now | Start::Paced) {
        let plan = Arc::clone(&plan);
        let opts = cfg.replay.clone();
        let (flag, requests, first, started, paced) = (
            Arc::clone(&cancel),
            Arc::clone(&requests),
            Arc::clone(&first_request_ns),
            Arc::clone(&first_start_ns),
            gate.clone(),
        );
        let backend = Arc::clone(&cache.backend);
        // Started on this thread's CPU: see `spawn_here`.
        spawn_here(&cache.backend, move |cpus| {
            // Normal priority before anything the plan decides the cost
            // of: checking it, counting its requests, opening its files.
            leave_realtime();
            if let Some(cpus) = cpus {
                let _ = backend.set_thread_cpus(&cpus);
            }
            replay(
                &backend,
                &plan,
                opts,
                flag,
                paced,
                requests,
                (first, started),
            )
        })
        .ok()
    } else {
        None
    };
    Mode::Prefetching {
        plan,
        replay,
        cancel,
        requests,
        first_request_ns,
        first_start_ns,
        seen_ns,
        audited,
        relearn,
        gate,
        cached: start == Start::Cached,
    }
}

/// A replay started when an execve began, before the kernel had loaded
/// the program (10-25 ms on a cold cache here): the profile it is for and
/// its prefetching mode. The exec event adopts it, or it is stopped.
pub(super) struct Early {
    pub(super) name: String,
    pub(super) mode: Mode,
    pub(super) at: Instant,
    /// Started for a script known from earlier launches: its resolved path
    /// and the command line its exec was expected to have.
    pub(super) script: Option<(PathBuf, Vec<String>)>,
    /// The execve it was started at, set by the caller.
    pub(super) call: Option<Call>,
    /// Started from the hint under this key (a search's first candidate's
    /// or the execve's own).
    pub(super) hinted: Option<String>,
}

/// An execve that started no replay, until its exec event.
pub(super) struct Pending {
    pub(super) call: Call,
    pub(super) at: Instant,
}

/// An execve as called, from its entry to its exec event.
pub(super) struct Call {
    /// The path and arguments as given.
    pub(super) filename: String,
    pub(super) argv: Vec<String>,
    /// Its hint key ([`super::execs::key`]), if the kernel told whose it
    /// was: for a `PATH` search, the first candidate's.
    pub(super) key: Option<String>,
}

impl Call {
    /// Whether an execve of `filename` with `argv` by the same process is
    /// the next candidate of this call's `PATH` search: `execvp` tries the
    /// name in each directory of `PATH`, with the same arguments, until
    /// one execve succeeds. The search is one launch from its first
    /// candidate on (and with the directories cold, the failing ones take
    /// a disk read each).
    pub(super) fn searches_on(&self, filename: &str, argv: &[String]) -> bool {
        let name = |f: &str| f.rsplit_once('/').map(|(_, n)| n.to_string());
        self.argv == argv
            && self.filename != filename
            && name(&self.filename).is_some_and(|n| !n.is_empty() && Some(n) == name(filename))
    }
}

impl Early {
    fn plan_is(&self, plan: &Arc<Plan>) -> bool {
        matches!(&self.mode, Mode::Prefetching { plan: p, .. } if Arc::ptr_eq(p, plan))
    }
}

/// Starts the replay of the program an execve is about to run, if the
/// policy allows it and the daemon holds its prefetching profile's plan in
/// memory (nothing is read from the state directory here). The path and
/// arguments are the execve's own, which for a binary are what its exec
/// event will carry; a script gets its interpreter's profile only at its
/// exec event.
pub(super) fn start_early(
    ctx: &Ctx,
    tgid: u32,
    execve_ns: u64,
    filename: &str,
    argv: &[String],
    running: usize,
    scripts: &Scripts,
) -> Option<Early> {
    let dcfg = ctx.dcfg;
    if running >= dcfg.max_concurrent_replays {
        return None;
    }
    let cwd = std::fs::read_link(format!("/proc/{tgid}/cwd")).ok()?;
    // From the dentry cache only: a path it cannot resolve would be read
    // from storage behind the exec'ing process's own lookups of it (and,
    // in a PATH search, of every candidate that fails), holding back the
    // next exec's replay. Its exec event decides it instead.
    let exe = warmstart_sys::cached::canonical_cached(&cwd.join(filename)).ok()?;
    // A script seen before: the kernel will run its interpreter with the
    // command line it ran it with then.
    let (exe, argv, script) = match scripts.get(&exe) {
        Some((interpreter, prefix)) => {
            let mut a = prefix.clone();
            a.push(filename.to_string());
            a.extend(argv.iter().skip(1).cloned());
            (interpreter.clone(), a.clone(), Some((exe, a)))
        }
        None => (exe.to_str()?.to_string(), argv.to_vec(), None),
    };
    let (argv, key) = launch_key(tgid, &exe, &argv)?;
    let permitted = {
        let learn = ctx.shared.learn.lock().unwrap_or_else(|e| e.into_inner());
        dcfg.permits(&key, false, &learn)
    };
    if !permitted
        || (dcfg.skip_services && is_service(tgid))
        || (ctx.skip_wrapped && started_by_warmstart(Path::new("/proc"), tgid))
    {
        return None;
    }
    let name = profile_name_for(launch_uid(Path::new("/proc"), tgid)?, &argv);
    let mut e = start_named(ctx, &name, execve_ns)?;
    e.script = script;
    Some(e)
}

/// Starts the replay of the profile an execve hint names (see
/// [`super::execs`]): nothing is resolved or read from storage, so the
/// daemon does not wait behind the exec'ing process's own lookups. The
/// exec event decides the launch as usual, and stops this replay if the
/// hint was wrong.
pub(super) fn start_hinted(
    ctx: &Ctx,
    tgid: u32,
    execve_ns: u64,
    name: &str,
    running: usize,
) -> Option<Early> {
    if running >= ctx.dcfg.max_concurrent_replays
        || (ctx.dcfg.skip_services && is_service(tgid))
        || (ctx.skip_wrapped && started_by_warmstart(Path::new("/proc"), tgid))
    {
        return None;
    }
    start_named(ctx, name, execve_ns)
}

/// Starts profile `name`'s replay at an execve if the daemon holds it
/// prefetching, with its plan in memory.
fn start_named(ctx: &Ctx, name: &str, execve_ns: u64) -> Option<Early> {
    let cache = &ctx.shared.cache;
    let known = cache.get(name)?;
    if known.phase != Phase::Prefetching {
        return None;
    }
    let (plan, _) = known.plan?;
    // Warm: the exec event decides (an audit is replayed all the same).
    if plan_cached(&plan) {
        return None;
    }
    let mode = start_prefetch(plan, ctx.cfg, cache, Start::Paced, false, false, execve_ns);
    matches!(
        mode,
        Mode::Prefetching {
            replay: Some(_),
            ..
        }
    )
    .then(|| Early {
        name: name.to_string(),
        mode,
        at: Instant::now(),
        script: None,
        call: None,
        hinted: None,
    })
}

/// One launch's replay, run on the thread the daemon started for it: stops
/// when `cancel` is set; the engine counts its requests into `requests`
/// and stamps when work on the first entry started and when the first
/// request was issued.
fn replay(
    backend: &RealBackend,
    plan: &Plan,
    opts: warmstart_replay::Options,
    cancel: Arc<AtomicBool>,
    gate: Option<Arc<DataGate>>,
    requests: Arc<AtomicU64>,
    (first_request_ns, first_start_ns): (Arc<AtomicU64>, Arc<AtomicU64>),
) -> Option<Report> {
    let engine = Engine::new(backend, opts)
        .ok()?
        .share_cancel(cancel)
        .share_progress(requests, first_start_ns, first_request_ns);
    match gate {
        Some(g) => engine.pace_data(g),
        None => engine,
    }
    .run(plan)
    .ok()
}

impl Mode {
    /// The exec is done: a paced replay's data is queued from now on.
    pub(super) fn release_data(&self) {
        if let Mode::Prefetching { gate: Some(g), .. } = self {
            g.open();
        }
    }

    /// Whether the launch's pages are recorded (learning, or an audited
    /// prefetched launch).
    pub(super) fn recorded(&self) -> bool {
        !matches!(self, Mode::Prefetching { audited: false, .. })
    }
}

impl Session {
    /// How long the launch ran: from its first exec to its tree's last
    /// exit by the kernel's clock once the tree has exited, else until
    /// now.
    pub(super) fn duration_ns(&self) -> u64 {
        if self.agg.tree_done() && self.last_exit_ns > self.first_exec_ns {
            self.last_exit_ns - self.first_exec_ns
        } else {
            self.started.elapsed().as_nanos() as u64
        }
    }

    /// Whether the launch's pages are being recorded (learning, or an
    /// audited prefetched launch).
    pub(super) fn recorded(&self) -> bool {
        self.mode.recorded()
    }

    /// Whether its replay, if any, has ended.
    pub(super) fn replay_done(&self) -> bool {
        match &self.mode {
            Mode::Prefetching { replay, .. } => replay.as_ref().is_none_or(|h| h.is_finished()),
            Mode::Learning => true,
        }
    }
}

pub(super) fn new_session(tgid: u32, d: Decision, exec_ts_ns: u64) -> Session {
    Session {
        name: d.name,
        argv: d.argv,
        trivial_key: d.trivial_key,
        listed: d.listed,
        quiet: None,
        mode: d.mode,
        agg: Aggregator::new(Path::new("/"), tgid).already_execed(),
        members: HashSet::from([tgid]),
        exec_ts_ns,
        first_exec_ns: exec_ts_ns,
        last_exit_ns: 0,
        started: Instant::now(),
        last_io: Instant::now(),
        exec_key: None,
    }
}

pub(super) fn session_status(pid: u32, s: &Session) -> SessionStatus {
    let (mode, requests, replay_issued) = match &s.mode {
        Mode::Learning => ("learning", 0, true),
        Mode::Prefetching {
            replay,
            requests,
            relearn,
            cached,
            ..
        } => (
            if *relearn {
                "relearning"
            } else if *cached {
                "cached"
            } else {
                "prefetching"
            },
            requests.load(Ordering::Relaxed),
            replay.as_ref().is_none_or(|h| h.is_finished()),
        ),
    };
    SessionStatus {
        pid,
        profile: s.name.clone(),
        mode: mode.into(),
        requests,
        replay_issued,
        age_s: s.started.elapsed().as_secs_f64(),
    }
}

pub(super) fn stop_replay(mode: &Mode) {
    if let Mode::Prefetching { cancel, .. } = mode {
        cancel.store(true, Ordering::Relaxed);
    }
}

/// Whether `tgid` runs another program than the exec event reports: it
/// has exec'd again since (its next exec event follows).
pub(super) fn execed_again(tgid: u32, file: &warmstart_bpf::FileInfo) -> bool {
    match warmstart_sys::open::inspect(format!("/proc/{tgid}/exe"), true) {
        Ok((id, _)) => {
            id.ino != file.ino || id.dev != warmstart_record::resolve::kdev_to_user(file.dev as u64)
        }
        Err(_) => false,
    }
}

/// The identities of this binary and of its front.
pub(super) fn own_exes() -> Vec<(u64, u64)> {
    super::policy::own_binaries(std::path::Path::new("/proc"))
        .into_iter()
        .filter_map(|(id, _)| id)
        .collect()
}
