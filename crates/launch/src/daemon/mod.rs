//! Automatic mode: `warmstart daemon` speeds up launches nobody wrapped.
//!
//! One recorder stays loaded with exec watching on: every exec on the
//! system is reported, and is already being traced when user space first
//! hears of it, so nothing a launch reads is lost. The daemon then decides
//! with the same launch manager as `warmstart run` (same profiles, same
//! plans): a program with a plan gets its replay started at once and the
//! launch is audited exactly (the recorder is loaded anyway); a program
//! still learning is recorded; anything else — denied by policy, a system
//! service, too small, warmstart itself — is untracked immediately.
//!
//! A crash of the daemon cannot affect the programs it watches: it never
//! stops, holds or signals them; it only reads their files.
//!
//! The parts, one concern each: `config` (the config file), `policy`
//! (which launches are followed), `control` (the control socket),
//! `cache` (profiles and plans in memory), `evict` (the store kept under
//! its size cap), `follow` (deciding a launch and starting its replay),
//! `learn` (finishing a launch on a bounded pool), `event_loop` (events
//! in, decisions out), `source` (where the events come from: the
//! recorder, or a fake in tests), `tuning` (real-time waits, locked code,
//! replay thread placement), `foresight` (startup plans, the launch
//! history and its predictor), `idle` (the idle preloader's thread),
//! `registry` (plans looked up by program content for new programs),
//! `recent` (recent replay latencies) and `execs` (the profile each
//! execve, as called, started last time).

mod cache;
mod config;
mod control;
mod event_loop;
mod evict;
mod execs;
mod follow;
mod foresight;
mod idle;
mod learn;
mod policy;
mod recent;
mod registry;
mod source;
mod tuning;

use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

pub use config::{DaemonConfig, LearnMode, DEFAULT_SOCKET};
pub use control::{
    query, query_checked, request, ControlError, DaemonStatus, ForesightStatus, PredictionStatus,
    Reply, Request, SessionStatus,
};
pub use policy::{missing_script, policy_path};
pub use registry::{FoundPlan, PlanLookup};

use cache::{check_cache, load_cache, Cache};
use control::{bind_root_only, load_learn_list, lock_exclusive, lock_path, serve, socket_ino};
use event_loop::Loop;
use foresight::{Foresight, PRELOAD_TICK};
use idle::NoOs;
use learn::Learners;
use policy::Trivial;
use tuning::{lock_own_code, Realtime};

use crate::manager::Config;
use crate::preload::{PreloadOs, RealPreloadOs};
use crate::store::Store;
use crate::Error;

/// What the control thread, the event loop, the cache checker and the
/// learners share.
struct Shared {
    status: Mutex<DaemonStatus>,
    /// Policy keys added with `warmstart learn`; kept in `learn.json`.
    learn: Mutex<BTreeSet<String>>,
    /// Held while a profile is written. Maps the profiles forgotten or
    /// reset to when: a launch that began before is not written back, so
    /// a forgotten profile does not come back from a launch in progress.
    /// Never held across I/O on files the daemon did not write.
    profiles: Mutex<HashMap<String, Instant>>,
    /// What the state directory says, kept in memory so that an exec is
    /// decided without file I/O. Written only with `profiles` held.
    cache: Cache,
    /// Programs whose launches are too trivial to learn, for a while.
    trivial: Mutex<Trivial>,
    /// Profiles forgotten since the event loop last looked: the predictor
    /// and the preloader forget them too.
    forgotten: Mutex<Vec<String>>,
    /// The profiles' sizes on disk, for `store_max_mib`.
    sizes: Mutex<evict::StoreSizes>,
}

impl Shared {
    fn new(status: DaemonStatus, learn: BTreeSet<String>, cache: Cache) -> Shared {
        Shared {
            status: Mutex::new(status),
            learn: Mutex::new(learn),
            profiles: Mutex::new(HashMap::new()),
            cache,
            trivial: Mutex::new(Trivial::default()),
            forgotten: Mutex::new(Vec::new()),
            sizes: Mutex::new(evict::StoreSizes::default()),
        }
    }

    fn trivial(&self) -> MutexGuard<'_, Trivial> {
        self.trivial.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn forgotten(&self) -> MutexGuard<'_, Vec<String>> {
        self.forgotten.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The launch manager's settings the daemon's config file sets.
fn manager_config(dcfg: &DaemonConfig, log: &mut dyn Write) -> Config {
    let mut cfg = Config {
        state_dir: dcfg.state_dir.clone(),
        ..Config::default()
    };
    cfg.compile.min_launch_bytes = dcfg.min_launch_kib * 1024;
    cfg.replay.memory_floor = dcfg.memory_floor_mib.map(|m| m << 20);
    if let Some(w) = dcfg.replay_workers {
        cfg.replay.fixed_workers(w.clamp(1, 64));
    }
    cfg.replay.io_priority = dcfg.io_priority.as_ref().and_then(|p| p.parse().ok());
    cfg.replay.cpus = dcfg.replay_cpus.parse().unwrap_or_default();
    if let Some(w) = warmstart_replay::unusable_cpus(&cfg.replay.cpus) {
        let _ = writeln!(log, "warmstart daemon: {w}");
    }
    cfg
}

/// Startup plans, the launch history and its predictor, and the idle
/// preloader, reading plans from the daemon's cache.
fn foresight(
    dcfg: &DaemonConfig,
    cfg: &Config,
    shared: &Arc<Shared>,
    log: &mut dyn Write,
) -> Foresight {
    let launch = Arc::new(AtomicBool::new(false));
    let plans = {
        let shared = Arc::clone(shared);
        Box::new(move |p: &str| shared.cache.get(p).and_then(|k| k.plan).map(|(p, _)| p))
    };
    let proc_root = std::path::Path::new("/proc");
    let os: Box<dyn PreloadOs + Send> =
        match RealPreloadOs::new(proc_root, &dcfg.preload, plans, Arc::clone(&launch)) {
            Ok(os) => Box::new(os),
            Err(e) => {
                let _ = writeln!(log, "warmstart daemon: no preloading: {e}");
                Box::new(NoOs)
            }
        };
    Foresight::new(
        dcfg,
        cfg.compile.clone(),
        proc_root,
        std::path::Path::new("/run"),
        os,
        launch,
        PRELOAD_TICK,
        log,
    )
}

/// Runs until `stop` is set (SIGTERM/SIGINT in the binary). `lookup`
/// finds plans for programs without a profile (`registry` in the config).
pub fn run(
    dcfg: &DaemonConfig,
    stop: Arc<AtomicBool>,
    lookup: Option<Arc<dyn PlanLookup>>,
    log: &mut dyn Write,
) -> Result<(), Error> {
    let store = Store::open(&dcfg.state_dir)?;
    // Plans reveal which files a user's programs touched: root only.
    let _ = std::fs::set_permissions(store.root(), std::fs::Permissions::from_mode(0o700));
    let cfg = manager_config(dcfg, log);

    // Two daemons would trace everything twice and fight over profiles:
    // one per state directory and one per socket, held until exit (a
    // status query alone let two daemons started together both run).
    let _state_lock = lock_exclusive(store.root(), true)?;
    // What writers killed mid-write left behind.
    match store.sweep(crate::store::LEFTOVER_AGE) {
        Ok(0) => {}
        Ok(n) => {
            let _ = writeln!(
                log,
                "warmstart daemon: removed {n} temporary file(s) left by a killed writer"
            );
        }
        Err(e) => {
            let _ = writeln!(
                log,
                "warmstart daemon: cannot sweep the state directory: {e}"
            );
        }
    }
    // And the hints of `warmstart run` naming profiles forgotten since.
    let stale = crate::manager::sweep_hints(&store);
    if stale > 0 {
        let _ = writeln!(
            log,
            "warmstart daemon: removed {stale} hint(s) naming forgotten profiles"
        );
    }
    control::socket_dir(&dcfg.socket)?;
    let _socket_lock = lock_exclusive(&lock_path(&dcfg.socket), false)?;
    if let Some(other) = query(&dcfg.socket) {
        return Err(Error::io(
            &dcfg.socket,
            std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                format!("another warmstart daemon (pid {}) is running", other.pid),
            ),
        ));
    }
    let mut status = DaemonStatus {
        pid: std::process::id(),
        state_dir: store.root().to_path_buf(),
        config: Some(dcfg.clone()),
        ..Default::default()
    };
    // The control thread answers from this at once (a status of pid 0
    // means the daemon is stopping).
    let shared = Arc::new(Shared::new(
        status.clone(),
        load_learn_list(&store, log),
        Cache::with_budget(dcfg.plan_memory_mib << 20),
    ));
    // Ready before the control socket exists, since its appearing is what
    // callers (the bench, scripts, tests) wait for: with the socket bound
    // first, a launch right after it (caches dropped in between, as the
    // bench does) raced the daemon reading its own code back for `mlock`
    // and its profiles and plans from storage.
    lock_own_code(log);
    let learners = Learners::new(dcfg.learn_workers, Learners::QUEUE)
        .map_err(|e| Error::io(&dcfg.state_dir, e))?;
    let registry = lookup
        .map(|l| {
            let source = dcfg.registry.clone().unwrap_or_default();
            let max = dcfg.store_max_mib << 20;
            registry::Registry::start(l, source, Arc::clone(&shared), store.clone(), max)
        })
        .transpose()
        .map_err(|e| Error::io(&dcfg.state_dir, e))?;
    // A boot's startup plan is replayed first of all: the startup does
    // not wait for the profiles to load.
    let mut foresight = foresight(dcfg, &cfg, &shared, log);
    foresight.daemon_started(&learners, log);
    load_cache(&shared, &store, log);
    let c = shared.cache.counts();
    (status.profiles_in_memory, status.plans_in_memory) = (c.profiles, c.plans);
    (status.plan_memory_bytes, status.plans_not_in_memory) = (c.plan_bytes, c.spilled);
    *shared.status.lock().unwrap_or_else(|e| e.into_inner()) = status.clone();
    // Execs are watched from here on, with the plans at hand: events of a
    // slow start-up (a cold cache at boot) are not left queued behind it.
    // Without a recorder the daemon stays up: the boot plan, preloading
    // and `status` need no events, and `warmstart run` still prefetches
    // the plans it has. Why is said in the journal and in `status`.
    status.kernel = warmstart_bpf::Kernel::running().describe();
    let rec: Box<dyn source::EventSource> =
        match warmstart_bpf::Recorder::start(warmstart_bpf::Options {
            watch_exec: true,
            ..Default::default()
        }) {
            Ok(r) => {
                status.recorder_reduced = r.disabled.clone();
                status.page_uses = r.page_uses.to_string();
                let _ = writeln!(
                    log,
                    "warmstart daemon: recorder loaded on {}; page uses seen through {}",
                    status.kernel, r.page_uses
                );
                for why in &r.disabled {
                    let _ = writeln!(log, "warmstart daemon: the recorder runs without {why}");
                }
                Box::new(r)
            }
            Err(e) => {
                let _ = writeln!(
                    log,
                    "warmstart daemon: no recorder ({e}): launches are neither seen nor learned; \
                 the boot plan, preloading and `warmstart run`'s plans still work"
                );
                status.recorder_problem = Some(e.to_string());
                Box::new(source::NoRecorder)
            }
        };
    *shared.status.lock().unwrap_or_else(|e| e.into_inner()) = status.clone();
    foresight.recorder_attached();
    let listener = bind_root_only(&dcfg.socket)?;
    let our_socket = socket_ino(&dcfg.socket);
    // Kept here, so that shutting the socket down at exit never hits a
    // descriptor the control thread has closed and the number reused.
    let wake = listener
        .try_clone()
        .map_err(|e| Error::io(&dcfg.socket, e))?;
    let (check, jobs) = std::sync::mpsc::channel();
    let checker = {
        let (shared, store) = (Arc::clone(&shared), store.clone());
        std::thread::Builder::new()
            .name("ws-cache".into())
            .spawn(move || check_cache(jobs, &shared, &store))
            .map_err(|e| Error::io(&dcfg.state_dir, e))?
    };
    let control = {
        let (shared, store, d, cfg) = (
            Arc::clone(&shared),
            store.clone(),
            dcfg.clone(),
            cfg.clone(),
        );
        std::thread::Builder::new()
            .name("ws-control".into())
            .spawn(move || serve(listener, &shared, &store, &d, &cfg))
            .map_err(|e| Error::io(&dcfg.socket, e))?
    };
    let _ = writeln!(
        log,
        "warmstart daemon: watching execs; state in {}, control socket {}",
        store.root().display(),
        dcfg.socket.display()
    );

    let rt = Realtime::new(log);
    let store_root = store.root().to_path_buf();
    let mut lp = Loop::new(
        rec,
        dcfg.clone(),
        cfg,
        store,
        Arc::clone(&shared),
        check,
        Arc::new(learners),
        rt,
        status,
    );
    lp.foresight = foresight;
    lp.registry = registry;
    lp.execs = execs::ExecHints::load(
        store_root.as_path(),
        |name| shared.cache.get(name).is_some(),
        log,
    );
    let mut result = Ok(());
    while !stop.load(Ordering::Relaxed) {
        if let Err(e) = lp.step() {
            result = Err(e);
            break;
        }
    }
    // Normal scheduling again before anything else: after a reload
    // (SIGHUP) the next `run` starts its threads from this one.
    drop(lp);
    // Wake the control thread from accept() so it sees the stop: by a
    // connection, and by shutting the listening socket down in case its
    // path was removed or taken meanwhile.
    shared.status.lock().unwrap_or_else(|e| e.into_inner()).pid = 0;
    let _ = std::os::unix::net::UnixStream::connect(&dcfg.socket);
    // SAFETY: shutdown on a descriptor this thread owns.
    unsafe { libc::shutdown(std::os::fd::AsRawFd::as_raw_fd(&wake), libc::SHUT_RDWR) };
    let _ = control.join();
    let _ = checker.join();
    if socket_ino(&dcfg.socket) == our_socket {
        let _ = std::fs::remove_file(&dcfg.socket);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `replay_workers` unset leaves the count to the replay (one and a
    /// spare where the plan's metadata is read from its devices); set, it
    /// is fixed, with no spare.
    #[test]
    fn replay_workers_fixed_only_when_configured() {
        let sink = &mut std::io::sink();
        let auto = manager_config(&DaemonConfig::default(), sink).replay;
        assert_eq!(auto.pool(false), (8, 16));
        assert_eq!(auto.pool(true), (1, 2));
        assert!(auto.spare(true).is_some() && auto.spare(false).is_none());
        let dcfg = DaemonConfig {
            replay_workers: Some(4),
            ..DaemonConfig::default()
        };
        let fixed = manager_config(&dcfg, sink).replay;
        assert_eq!(fixed.pool(false), (4, 8));
        assert_eq!(fixed.pool(true), (4, 8));
        assert_eq!(fixed.spare(true), None);
    }
}
