//! Reading before the launch: startup plans, launch prediction and idle
//! preloading, fed by the event loop.
//!
//! The event loop tells this part what happened (the daemon started, a
//! batch of events, a launch ended, a profile forgotten); nothing here
//! waits on the disk on the loop's behalf but the login session of an
//! exec (two small reads in `/proc` and `/run`). A startup plan is read
//! and replayed by a thread of its own; a startup trace is named, kept
//! and compiled on the learners' pool; the history is written by a
//! thread of its own; the preloader runs on its own thread (see `idle`).
//! Each part is
//! switched by config.toml: `[startup] enabled`, `predict_launches`,
//! `[preload] enabled`.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use warmstart_bpf::Event;
use warmstart_plan::CompileOptions;
use warmstart_predict::{Event as HistEvent, Launch, Predictor, Startup};

use super::config::DaemonConfig;
use super::control::ForesightStatus;
use super::idle::{lock, IdlePreloader, NoOs};
use super::learn::Learners;
use crate::history::{HistoryFile, DEFAULT_CAPACITY};
use crate::preload::{PreloadOs, Preloader};
use crate::startup::{
    known_sessions, login_session, mem_available, replay_startup, uptime_ms, Input, ReplayHandle,
    StartupConfig, StartupKind, StartupRecording, StartupStore, StartupWindow, Transition,
};

/// How often the preloader looks at the system while the daemon idles:
/// often enough to read a program evicted meanwhile again before it is
/// needed, seldom enough that measuring residency costs nothing worth
/// mentioning.
pub(super) const PRELOAD_TICK: Duration = Duration::from_secs(3);

/// Launches in progress whose login session is remembered: beyond this,
/// entries a missed end left behind are dropped.
const MAX_LOGINS: usize = 4096;

/// The daemon's startup windows, launch history, predictor and preloader.
pub(super) struct Foresight {
    proc_root: PathBuf,
    run_root: PathBuf,
    /// The clock of the window and the preloader (milliseconds since).
    clock: Instant,
    startup: StartupConfig,
    window: StartupWindow,
    rec: Option<StartupRecording>,
    /// The running startup replay's handle, once its thread started it.
    replay: Option<Arc<Mutex<Option<ReplayHandle>>>>,
    /// Startup plans replayed.
    replays: Arc<AtomicU64>,
    startups: StartupStore,
    compile: CompileOptions,
    /// The history writer's queue; `None` with `predict_launches = false`.
    history: Option<Sender<HistoryWrite>>,
    /// The login session of each launch in progress, by first process.
    logins: HashMap<u32, u32>,
    /// Joined when the daemon stops, so that a reload reads the history
    /// the previous run saved last.
    writer: Option<std::thread::JoinHandle<()>>,
    /// Shared with the preloader's thread; locked for pure work only.
    pub(super) predictor: Arc<Mutex<Predictor>>,
    /// `None` with `predict_launches = false`.
    idle: Option<IdlePreloader>,
    /// Set while the daemon serves a launch: the preloader stays out.
    launch: Arc<AtomicBool>,
    /// Processes a closed startup window saw: untracked by the loop unless
    /// a launch it follows holds them.
    untrack: Vec<u32>,
    /// Processes of launches that ended while a window was open: left
    /// tracked for the startup, untracked when it closes.
    deferred: Vec<u32>,
    pub(super) status: ForesightStatus,
}

impl Foresight {
    /// Everything off: what the event loop starts with until the daemon
    /// (or a test) gives it the real thing.
    pub(super) fn off() -> Foresight {
        let mut dcfg = DaemonConfig::default();
        dcfg.startup.enabled = false;
        dcfg.preload.enabled = false;
        dcfg.predict_launches = false;
        Foresight::new(
            &dcfg,
            CompileOptions::default(),
            Path::new("/proc"),
            Path::new("/run"),
            Box::new(NoOs),
            Arc::new(AtomicBool::new(false)),
            PRELOAD_TICK,
            &mut std::io::sink(),
        )
    }

    /// Loads the launch history (a damaged one is rebuilt with a warning)
    /// and builds the predictor from it, and starts the preloader's thread,
    /// which looks at the system every `preload_every` while idle.
    /// `launch` is the flag `os` reads.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        dcfg: &DaemonConfig,
        compile: CompileOptions,
        proc_root: &Path,
        run_root: &Path,
        os: Box<dyn PreloadOs + Send>,
        launch: Arc<AtomicBool>,
        preload_every: Duration,
        log: &mut dyn Write,
    ) -> Foresight {
        let history = dcfg.predict_launches.then(|| {
            let (h, warning) = HistoryFile::load(&dcfg.state_dir, DEFAULT_CAPACITY);
            if let Some(w) = warning {
                let _ = writeln!(log, "warmstart daemon: {w}");
            }
            h
        });
        let predictor = match &history {
            Some(h) => Predictor::from_history(dcfg.predict.clone(), h.history()),
            None => Predictor::new(dcfg.predict.clone()),
        };
        let mut preload = dcfg.preload.clone();
        // Preloads follow the predictions: none without them.
        preload.enabled &= dcfg.predict_launches;
        let mut window = StartupWindow::new(dcfg.startup.clone());
        if dcfg.startup.enabled {
            window.seed_sessions(known_sessions(proc_root));
        }
        let predictor = Arc::new(Mutex::new(predictor));
        let idle = if dcfg.predict_launches {
            match IdlePreloader::start(
                Preloader::new(preload),
                os,
                Arc::clone(&predictor),
                Arc::clone(&launch),
                preload_every,
            ) {
                Ok(i) => Some(i),
                Err(e) => {
                    let _ = writeln!(log, "warmstart daemon: no preloading: {e}");
                    None
                }
            }
        } else {
            None
        };
        let mut status = ForesightStatus::default();
        if idle.is_none() {
            status.preload_state = super::idle::state_name(&crate::preload::State::Disabled).into();
        }
        if let Some(h) = &history {
            status.history_events = h.history().len();
        }
        let (history, writer) = match history.map(|h| {
            let (tx, rx) = channel();
            let t = std::thread::Builder::new()
                .name("ws-history".into())
                .spawn(move || write_history(h, rx, SAVE_EVERY));
            (tx, t)
        }) {
            Some((tx, Ok(t))) => (Some(tx), Some(t)),
            Some((_, Err(e))) => {
                let _ = writeln!(log, "warmstart daemon: launch history not kept: {e}");
                (None, None)
            }
            None => (None, None),
        };
        Foresight {
            proc_root: proc_root.to_path_buf(),
            run_root: run_root.to_path_buf(),
            clock: Instant::now(),
            startup: dcfg.startup.clone(),
            window,
            rec: None,
            replay: None,
            replays: Arc::new(AtomicU64::new(0)),
            startups: StartupStore::new(&dcfg.state_dir, &dcfg.startup),
            compile,
            history,
            logins: HashMap::new(),
            writer,
            predictor,
            idle,
            launch,
            untrack: Vec::new(),
            deferred: Vec::new(),
            status,
        }
    }

    fn now_ms(&self) -> u64 {
        self.clock.elapsed().as_millis() as u64
    }

    /// The daemon started: a boot's window opens if the machine just did.
    pub(super) fn daemon_started(&mut self, learners: &Learners, log: &mut dyn Write) {
        let Some(up) = uptime_ms(&self.proc_root) else {
            return;
        };
        let now = self.now_ms();
        let t = self
            .window
            .feed(now, Input::DaemonStarted { uptime_ms: up });
        self.transitions(t, learners, 0, log);
    }

    /// The recorder is attached: an open boot window's quiet time starts
    /// now (see [`StartupWindow::watching_from`]).
    pub(super) fn recorder_attached(&mut self) {
        let now = self.now_ms();
        self.window.watching_from(now);
    }

    /// Whether a startup window is recording: the execs the policy ignores
    /// stay tracked meanwhile, since a startup's reads are mostly theirs.
    pub(super) fn recording(&self) -> bool {
        self.rec.is_some()
    }

    /// Processes of a launch that ended while a startup is recorded: they
    /// stay tracked until the window closes.
    pub(super) fn untrack_later(&mut self, tgids: impl IntoIterator<Item = u32>) {
        self.deferred.extend(tgids);
    }

    /// The processes a closed startup window kept tracked.
    pub(super) fn take_untrack(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.untrack)
    }

    /// A launch (or a replay at an execve) begins: no preload competes
    /// with it, from now on.
    pub(super) fn launch_begins(&mut self) {
        self.launch.store(true, Ordering::Relaxed);
        if let Some(i) = &self.idle {
            i.launch_begins();
        }
    }

    /// After a batch is decided, before its events go to the launches:
    /// logins seen at exec, the startup recording. `launched` are the
    /// first processes of the launches this batch began: their login
    /// session is noted while they still run.
    pub(super) fn after_batch(
        &mut self,
        buf: &[Event],
        launched: &[u32],
        learners: &Learners,
        drops: u64,
        log: &mut dyn Write,
    ) {
        if self.startup.enabled {
            for ev in buf {
                if let Event::Exec { tgid, .. } = ev {
                    let session = if self.startup.login {
                        login_session(&self.proc_root, &self.run_root, *tgid)
                    } else {
                        None
                    };
                    let now = self.now_ms();
                    let t = self.window.feed(now, Input::Exec { session });
                    self.transitions(t, learners, drops, log);
                }
            }
        }
        if let Some(r) = &mut self.rec {
            r.take(buf);
        }
        if self.history.is_some() {
            if self.logins.len() > MAX_LOGINS {
                self.logins.clear();
            }
            for tgid in launched {
                let session = login_session(&self.proc_root, &self.run_root, *tgid).unwrap_or(0);
                self.logins.insert(*tgid, session);
            }
        }
    }

    /// A launch the policy turned down at a later exec: not a launch.
    pub(super) fn launch_dropped(&mut self, tgid: u32) {
        self.logins.remove(&tgid);
    }

    /// Waits until the history writer has saved what was sent to it.
    #[cfg(test)]
    pub(super) fn flush_history(&self) {
        if let Some(h) = &self.history {
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            if h.send(HistoryWrite::Flush(tx)).is_ok() {
                let _ = rx.recv();
            }
        }
    }

    /// A launch of `profile`, begun at `at_ms` (Unix) by `tgid`, ended:
    /// into the history and the predictor; its preload, if any, judged
    /// (the preloader does not look at the system while a launch runs, so
    /// what it measured last is what the launch found).
    pub(super) fn launch_ended(&mut self, profile: &str, tgid: u32, at_ms: u64) {
        let session = self.logins.remove(&tgid).unwrap_or(0);
        let Some(history) = &self.history else {
            return;
        };
        let event = HistEvent::Launch(Launch {
            profile: profile.to_string(),
            at_ms,
            session,
        });
        lock(&self.predictor).observe(&event);
        if let Some(i) = &self.idle {
            i.launched(profile);
        }
        let _ = history.send(HistoryWrite::Event(event));
        self.status.history_events += 1;
    }

    /// Closes a window whose time is up; the wait until its deadline.
    /// `busy`: a launch or an early replay is being served.
    pub(super) fn tick(
        &mut self,
        busy: bool,
        learners: &Learners,
        drops: u64,
        forgotten: Vec<String>,
        log: &mut dyn Write,
    ) -> Option<Duration> {
        self.launch.store(busy, Ordering::Relaxed);
        for name in forgotten {
            lock(&self.predictor).forget(&name);
            if let Some(i) = &self.idle {
                i.forget(&name);
            }
        }
        let now = self.now_ms();
        if let Some(t) = self.window.tick(now) {
            self.transitions(vec![t], learners, drops, log);
        }
        if self
            .replay
            .as_ref()
            .is_some_and(|r| lock(r).as_ref().is_some_and(ReplayHandle::is_finished))
        {
            self.replay = None;
        }
        self.status.startup_replays = self.replays.load(Ordering::Relaxed);
        self.status.startup_window = self.window.open().map(|(k, _)| kind_name(k).to_string());
        if let Some(i) = &self.idle {
            i.publish(&mut self.status, busy);
        }
        self.window
            .deadline()
            .map(|d| Duration::from_millis(d.saturating_sub(self.now_ms())))
    }

    fn transitions(
        &mut self,
        ts: Vec<Transition>,
        learners: &Learners,
        drops: u64,
        log: &mut dyn Write,
    ) {
        for t in ts {
            match t {
                Transition::Opened { kind, session, .. } => self.opened(kind, session, log),
                Transition::Closed { kind, .. } => self.closed(kind, learners, drops),
            }
        }
    }

    /// A startup began: its plan replayed at once, its reads recorded.
    fn opened(&mut self, kind: StartupKind, session: u32, log: &mut dyn Write) {
        // Reading and decoding the plan waits on the disk, busiest at a
        // startup: on a thread of its own, not on the event loop, which a
        // login's first exec is followed by many more. The thread leaves
        // the replay's handle in the slot; a later startup's slot replaces
        // it, and the last one dropped stops the replay.
        let slot = Arc::new(Mutex::new(None));
        self.replay = Some(Arc::clone(&slot));
        // A login follows a boot on a desktop: its plan is read once the
        // boot's is, so that the session's first programs start from the
        // cache. The login's own replay, when it comes, replaces it.
        let mut kinds = vec![kind];
        if kind == StartupKind::Boot && self.startup.login && self.startup.login_at_boot {
            kinds.push(StartupKind::Login);
        }
        let turn = InTurn {
            store: self.startups.clone(),
            opts: self.compile.clone(),
            cfg: self.startup.clone(),
            proc_root: self.proc_root.clone(),
            replays: Arc::clone(&self.replays),
        };
        let started = std::thread::Builder::new()
            .name("ws-startup".into())
            .spawn(move || turn.run(&kinds, &slot));
        if let Err(e) = started {
            let _ = writeln!(log, "warmstart daemon: startup replay: {e}");
        }
        self.rec = Some(StartupRecording::new(kind, session));
        if let Some(history) = &self.history {
            let event = HistEvent::Startup(Startup {
                kind,
                at_ms: crate::store::now_ms(),
                session,
            });
            lock(&self.predictor).observe(&event);
            let _ = history.send(HistoryWrite::Event(event));
            self.status.history_events += 1;
        }
    }

    /// A startup ended: its trace named, kept and compiled on the pool.
    fn closed(&mut self, kind: StartupKind, learners: &Learners, drops: u64) {
        let Some(rec) = self.rec.take() else {
            return;
        };
        self.untrack.extend(rec.processes().iter().copied());
        self.untrack.append(&mut self.deferred);
        let (store, opts) = (self.startups.clone(), self.compile.clone());
        self.status.startups_recorded += 1;
        learners.submit(move || {
            let trace = rec.finish(drops);
            let mut err = std::io::stderr();
            match store.add(kind, &trace, &opts) {
                Ok(out) => {
                    for w in &out.warnings {
                        let _ = writeln!(err, "warmstart daemon: {w}");
                    }
                }
                Err(e) => {
                    let _ = writeln!(err, "warmstart daemon: startup plan: {e}");
                }
            }
        });
    }
}

impl Drop for Foresight {
    fn drop(&mut self) {
        // Its queue closed, the writer saves what it has and ends.
        self.history.take();
        if let Some(t) = self.writer.take() {
            let _ = t.join();
        }
    }
}

/// What the history writer is sent.
pub(super) enum HistoryWrite {
    Event(HistEvent),
    /// Answered once everything sent before is saved (tests wait so).
    #[cfg_attr(not(test), allow(dead_code))]
    Flush(SyncSender<()>),
}

/// The history writer: the file is rewritten whole and atomically at each
/// save, at most `every` ([`SAVE_EVERY`]), so that events arriving together (a
/// login starting many programs, a build running a compiler a hundred
/// times) are saved once, and never on the event loop. Saved at each
/// launch, it took 8% of the daemon's CPU, most of it in `fsync`. It ends,
/// after a last save, when the daemon drops its queue.
pub(super) fn write_history(mut file: HistoryFile, rx: Receiver<HistoryWrite>, every: Duration) {
    let mut flushes = Vec::new();
    let mut saved: Option<Instant> = None;
    loop {
        let next = if file.unsaved() == 0 {
            rx.recv().ok()
        } else {
            let due = saved.map_or_else(Instant::now, |t| t + every);
            match rx.recv_timeout(due.saturating_duration_since(Instant::now())) {
                Ok(w) => Some(w),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => {
                    save_history(&mut file);
                    return;
                }
            }
        };
        if next.is_none() && file.unsaved() == 0 {
            return; // the queue closed with everything saved
        }
        for w in next.into_iter().chain(rx.try_iter()) {
            match w {
                HistoryWrite::Event(e) => file.push(e),
                HistoryWrite::Flush(done) => flushes.push(done),
            }
        }
        let due = saved.is_none_or(|t| t.elapsed() >= every);
        if file.unsaved() > 0 && (due || !flushes.is_empty()) {
            save_history(&mut file);
            saved = Some(Instant::now());
        }
        for done in flushes.drain(..) {
            let _ = done.send(());
        }
    }
}

/// The history is saved at most this often (and when the daemon stops):
/// a crash loses the launches of the last few seconds at most.
const SAVE_EVERY: Duration = Duration::from_secs(5);

fn save_history(file: &mut HistoryFile) {
    if let Err(e) = file.save() {
        let _ = writeln!(std::io::stderr(), "warmstart daemon: {e}");
    }
}

/// Startup plans replayed one after another on the startup thread.
struct InTurn {
    store: StartupStore,
    opts: CompileOptions,
    cfg: StartupConfig,
    proc_root: PathBuf,
    replays: Arc<AtomicU64>,
}

/// How often the startup thread looks whether a replay it waits on ended.
const IN_TURN_POLL: Duration = Duration::from_millis(50);

impl InTurn {
    /// Replays the plan of each kind in turn, each once the one before
    /// ended, leaving the running one's handle in `slot`. Stops when the
    /// daemon let go of the slot (a later startup replaced it, or the
    /// daemon stops): the running replay is then cancelled as its handle
    /// drops.
    fn run(self, kinds: &[StartupKind], slot: &Arc<Mutex<Option<ReplayHandle>>>) {
        let mut err = std::io::stderr();
        let abandoned = || Arc::strong_count(slot) == 1;
        for (i, &kind) in kinds.iter().enumerate() {
            if i > 0 {
                while lock(slot).as_ref().is_some_and(|h| !h.is_finished()) {
                    if abandoned() {
                        return;
                    }
                    std::thread::sleep(IN_TURN_POLL);
                }
            }
            if abandoned() {
                return;
            }
            let loaded = self.store.plan(kind, &self.opts);
            for w in &loaded.warnings {
                let _ = writeln!(err, "warmstart daemon: {w}");
            }
            let Some(plan) = loaded.plan else {
                continue;
            };
            match replay_startup(Arc::new(plan), &self.cfg, || mem_available(&self.proc_root)) {
                Ok(h) => {
                    let ahead = if i > 0 { " ahead of it" } else { "" };
                    let _ = writeln!(
                        err,
                        "warmstart daemon: {} startup: replaying the {} plan{ahead} ({} KiB)",
                        kind_name(kinds[0]),
                        kind_name(kind),
                        h.bytes >> 10
                    );
                    self.replays.fetch_add(1, Ordering::Relaxed);
                    *lock(slot) = Some(h);
                }
                Err(e) => {
                    let _ = writeln!(err, "warmstart daemon: startup replay: {e}");
                    return;
                }
            }
        }
    }
}

fn kind_name(kind: StartupKind) -> &'static str {
    match kind {
        StartupKind::Boot => "boot",
        StartupKind::Login => "login",
    }
}
