//! The event loop: execs, forks, exits and page records in; launches
//! decided, followed and handed to the learners out. Its events come from
//! an [`EventSource`]: the BPF recorder when the daemon runs, a scripted
//! fake in tests, so every decision here is tested without root.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use warmstart_bpf::Event;

use super::cache::Check;
use super::config::DaemonConfig;
use super::control::DaemonStatus;
use super::evict::evict_lru;
use super::execs::{self, ExecHints};
use super::follow::{
    decide, execed_again, new_session, own_exes, replaying, session_status, since, start_early,
    start_hinted, stop_replay, Call, Ctx, Early, Mode, Pending, Session,
};
use super::foresight::Foresight;
use super::learn::{finish, Fate, Learners};
use super::policy::{script_prefix, subcommand, QuietExe, Scripts, Wrappers};
use super::recent::Recent;
use super::registry::Registry;
use super::source::EventSource;
use super::tuning::Realtime;
use super::Shared;
use crate::manager::Config;
use crate::store::Store;
use crate::Error;

/// How long the event loop sleeps when it follows no launch: execs (and
/// the signals that stop it) wake it at once; this bounds how stale
/// `status` can be (uptime, drops, the counts of profiles and plans in
/// memory) and how long a stop request set just before the wait waits.
pub(super) const IDLE_POLL: Duration = Duration::from_secs(1);

/// How long after exec'ing `warmstart run` a process's next exec is taken
/// for the wrapped program run in `run`'s place: `run` decides within
/// milliseconds (a large plan's residency check within a second).
const RUN_EXECS_IN_PLACE: Duration = Duration::from_secs(10);

/// The event loop's state between batches.
pub(super) struct Loop<S: EventSource> {
    pub(super) src: S,
    pub(super) dcfg: DaemonConfig,
    pub(super) cfg: Config,
    pub(super) store: Store,
    pub(super) shared: Arc<Shared>,
    pub(super) check: Sender<Check>,
    pub(super) learners: Arc<Learners>,
    /// The daemon's own pid: never followed.
    pub(super) me: u32,
    /// See `Ctx::skip_wrapped`.
    pub(super) skip_wrapped: bool,
    pub(super) rt: Realtime,
    pub(super) status: DaemonStatus,
    started: Instant,
    latencies: Recent,
    first_requests: Recent,
    reactions: Recent,
    first_starts: Recent,
    pub(super) sessions: HashMap<u32, Session>,
    /// Each followed process's launch (its first process).
    pub(super) owner: HashMap<u32, u32>,
    /// Replays started at an execve's entry, until its exec event.
    early: HashMap<u32, Early>,
    /// Execves that started no replay, until their exec event: it tells
    /// whether the file was a script (see `script_prefix`).
    pending: HashMap<u32, Pending>,
    scripts: Scripts,
    /// The profile each execve started last time.
    pub(super) execs: ExecHints,
    buf: Vec<Event>,
    /// Startup plans, predictions, idle preloads.
    pub(super) foresight: Foresight,
    /// Launches this batch began: their first process.
    launched: Vec<u32>,
    /// When the open startup window's deadline passes.
    wake: Option<Duration>,
    /// Plans looked up for programs with no profile.
    pub(super) registry: Option<Registry>,
    /// Whether the kernel side leaves quiet programs alone, as last set.
    quiet_on: Option<bool>,
    /// Processes that exec'd `warmstart run`, and when: their next exec
    /// is the wrapped program run in `run`'s own place (its plan was
    /// resident), a launch that `run` counts itself.
    runs: HashMap<u32, Instant>,
    /// The identities (dev, ino) of the daemon's own binary and of the
    /// front that runs prefetched launches without it.
    pub(crate) own_exes: Vec<(u64, u64)>,
    /// Process trees left to `warmstart run` (a program it exec'd in its
    /// place, and its children, followed for their forks and exits only):
    /// none of their execs is a launch of the daemon's.
    left: HashSet<u32>,
    /// The processes running `warmstart run`.
    pub(super) wrappers: Wrappers,
}

impl<S: EventSource> Loop<S> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        src: S,
        dcfg: DaemonConfig,
        cfg: Config,
        store: Store,
        shared: Arc<Shared>,
        check: Sender<Check>,
        learners: Arc<Learners>,
        rt: Realtime,
        status: DaemonStatus,
    ) -> Loop<S> {
        Loop {
            src,
            dcfg,
            cfg,
            store,
            shared,
            check,
            learners,
            me: std::process::id(),
            skip_wrapped: true,
            rt,
            status,
            started: Instant::now(),
            latencies: Recent::default(),
            first_requests: Recent::default(),
            reactions: Recent::default(),
            first_starts: Recent::default(),
            sessions: HashMap::new(),
            owner: HashMap::new(),
            early: HashMap::new(),
            pending: HashMap::new(),
            scripts: Scripts::default(),
            execs: ExecHints::in_memory(),
            buf: Vec::new(),
            foresight: Foresight::off(),
            launched: Vec::new(),
            wake: None,
            registry: None,
            quiet_on: None,
            runs: HashMap::new(),
            left: HashSet::new(),
            own_exes: own_exes(),
            wrappers: Wrappers::scan(Path::new("/proc"), 0),
        }
    }

    /// One batch: wait for events, decide the launches among them, give
    /// the rest to the launches they belong to, and hand the launches that
    /// ended to the learners.
    pub(super) fn step(&mut self) -> Result<(), Error> {
        // Wait for events as a real-time thread, so an exec is decided and
        // its replay started at once instead of after the launching
        // program's time slice (exec -> event seen: 0.13-0.33 ms instead
        // of 0.65-2.5 ms on a cold launch). The replay threads started
        // meanwhile leave real-time priority before touching their plan
        // (`leave_realtime`). The rest of the batch (page events, sessions
        // ending) is handled at normal priority.
        self.rt.set(true);
        // With no launch followed there are no page records to collect
        // (they come without a wake-up, for followed processes only):
        // sleep until an exec wakes the loop, instead of 50 times a second.
        let following = !self.sessions.is_empty() || !self.early.is_empty();
        let wait = if following {
            Duration::from_millis(20)
        } else {
            IDLE_POLL
        };
        // A startup window closes on time even if nothing happens.
        let wait = self.wake.map_or(wait, |w| w.min(wait));
        let mut buf = std::mem::take(&mut self.buf);
        self.src.poll(wait, &mut buf)?;
        self.status.events += buf.len() as u64;
        let handled = self.decide_launches(&buf);
        // Nothing happened and nothing is followed: stay as we are (two
        // system calls a wake-up otherwise). Threads started from here on
        // must not inherit real-time priority, hence the switch whenever
        // there is work.
        if !buf.is_empty() || !self.sessions.is_empty() {
            self.rt.set(false);
        }
        self.pending
            .retain(|_, p| p.at.elapsed() < Duration::from_secs(1));
        if !self.runs.is_empty() {
            self.runs.retain(|_, at| at.elapsed() < RUN_EXECS_IN_PLACE);
        }
        // An execve that failed has no exec event: its replay stops.
        self.early.retain(|_, e| {
            let keep = e.at.elapsed() < Duration::from_secs(1);
            if !keep {
                stop_replay(&e.mode);
            }
            keep
        });
        // Before the batch goes to the launches: the startup recording
        // takes its copy.
        let launched = std::mem::take(&mut self.launched);
        let drops = self.src.drops();
        self.foresight.after_batch(
            &buf,
            &launched,
            &self.learners,
            drops,
            &mut std::io::stderr(),
        );
        self.collect(&mut buf, &handled);
        self.buf = buf;
        self.finish_done();
        let busy = !self.sessions.is_empty() || !self.early.is_empty();
        let forgotten = std::mem::take(&mut *self.shared.forgotten());
        self.wake = self.foresight.tick(
            busy,
            &self.learners,
            drops,
            forgotten,
            &mut std::io::stderr(),
        );
        for tgid in self.foresight.take_untrack() {
            if !self.owner.contains_key(&tgid) {
                self.src.untrack(tgid);
            }
        }
        self.update_quiet();
        self.publish(drops);
        Ok(())
    }

    /// Launches first: a replay must not wait behind a batch of page
    /// events. An exec is a new launch unless its process was forked
    /// inside a traced tree (in earlier batches or in this one). Returns
    /// the processes whose exec was decided.
    ///
    /// A launch is named by the last program its first process execs:
    /// `sh script` that execs a program, `env python3 tool.py`, a launcher
    /// script ending in `exec app`. Each exec is decided by the command
    /// line its event carries, so a launcher allowed by its path stays
    /// allowed through its exec even when the daemon only wakes after it
    /// (the recorder ends a batch at each exec).
    fn decide_launches(&mut self, buf: &[Event]) -> HashSet<u32> {
        let mut forked_here: HashSet<u32> = HashSet::new();
        let mut handled: HashSet<u32> = HashSet::new();
        for ev in buf {
            match ev {
                Event::Fork {
                    parent_tgid,
                    child_tgid,
                    ..
                } if self.left.contains(parent_tgid) => {
                    self.left.insert(*child_tgid);
                }
                Event::Exit { tgid, .. } if self.left.contains(tgid) => {
                    self.left.remove(tgid);
                }
                Event::ExecStart { tgid, .. } if self.left.contains(tgid) => {}
                Event::Exec { tgid, .. } if self.left.contains(tgid) => {
                    // Each exec makes the kernel side record a process's
                    // pages again: back to its tree only.
                    self.src.track(*tgid, false);
                }
                Event::Fork {
                    parent_tgid,
                    child_tgid,
                    ..
                } if self.owner.contains_key(parent_tgid) || forked_here.contains(parent_tgid) => {
                    forked_here.insert(*child_tgid);
                }
                Event::ExecStart {
                    tgid,
                    ts_ns,
                    filename,
                    argv: Some(argv),
                } if self.dcfg.replay_at_execve => {
                    // A program started inside a launch is that launch's.
                    if *tgid == self.me
                        || self.owner.contains_key(tgid)
                        || forked_here.contains(tgid)
                    {
                        continue;
                    }
                    self.on_exec_start(*tgid, *ts_ns, filename, argv);
                }
                Event::Exec {
                    tgid,
                    ts_ns,
                    file,
                    argv,
                    uid,
                } => {
                    let in_tree = self.owner.contains_key(tgid) || forked_here.contains(tgid);
                    if in_tree && !self.sessions.contains_key(tgid) {
                        continue; // a program started inside a launch
                    }
                    if self.on_exec(*tgid, *uid, *ts_ns, file, argv.as_deref(), in_tree) {
                        handled.insert(*tgid);
                    }
                }
                _ => {}
            }
        }
        handled
    }

    fn on_exec_start(&mut self, tgid: u32, ts_ns: u64, filename: &str, argv: &[String]) {
        if self.runs.contains_key(&tgid) {
            return; // `run` execs its program: its launch
        }
        // An earlier execve of it failed. The next candidate of the same
        // PATH search goes on with the replay its first candidate started;
        // any other execve does not need that replay.
        let early_call = self.early.get(&tgid).and_then(|e| e.call.as_ref());
        if early_call.is_some_and(|c| c.searches_on(filename, argv)) {
            return;
        }
        if let Some(e) = self.early.remove(&tgid) {
            stop_replay(&e.mode);
        }
        // A search is learned under its first candidate's key: the next
        // such launch starts its replay there, before the failing
        // candidates' lookups.
        let first_key = self
            .pending
            .remove(&tgid)
            .filter(|p| p.call.searches_on(filename, argv))
            .and_then(|p| p.call.key);
        self.rt.set(true);
        let skip_wrapped = self.wrapped_may_run();
        let ctx = Ctx {
            dcfg: &self.dcfg,
            cfg: &self.cfg,
            store: &self.store,
            shared: &self.shared,
            check: &self.check,
            me: self.me,
            skip_wrapped,
        };
        let running = replaying(&self.sessions, self.early.len());
        // The hints first: they read nothing.
        let own_key = execs::key_of(tgid, filename, argv);
        let hinted = first_key.iter().chain(own_key.iter()).find_map(|k| {
            let name = self.execs.get(k)?;
            let mut e = start_hinted(&ctx, tgid, ts_ns, name, running)?;
            e.hinted = Some(k.clone());
            Some(e)
        });
        let started = hinted
            .or_else(|| start_early(&ctx, tgid, ts_ns, filename, argv, running, &self.scripts));
        let call = Call {
            filename: filename.to_string(),
            argv: argv.to_vec(),
            key: first_key.or(own_key),
        };
        match started {
            Some(mut e) => {
                e.call = Some(call);
                self.early.insert(tgid, e);
                self.foresight.launch_begins();
                self.status.replays_at_execve += 1;
                // Let the replay thread, waiting on this CPU, run.
                self.rt.set(false);
            }
            None => {
                let at = Instant::now();
                self.pending.insert(tgid, Pending { call, at });
            }
        }
    }

    /// Decides one exec; `false` if it was left for a later exec event of
    /// the same process.
    fn on_exec(
        &mut self,
        tgid: u32,
        uid: u32,
        ts_ns: u64,
        file: &warmstart_bpf::FileInfo,
        argv: Option<&[String]>,
        in_tree: bool,
    ) -> bool {
        let exe = file.path.absolute().unwrap_or_default();
        // `warmstart run`, and the program it execs in its own place
        // (it counts that launch itself), are not the daemon's launches;
        // nor are warmstart's other commands (the front hands them to the
        // core, which no older configuration's `deny` names).
        if self.skip_wrapped && !in_tree {
            let own = self.is_own(file);
            let run = own && argv.and_then(subcommand) == Some("run");
            let in_place = !own && self.runs.remove(&tgid).is_some();
            if own {
                self.wrappers.exec_of_own(tgid, argv);
            }
            if own || in_place {
                if run {
                    self.runs.insert(tgid, Instant::now());
                }
                self.status.ignored += 1;
                if in_place {
                    // Its tree is followed, so that the programs it starts
                    // are known as its own.
                    self.left.insert(tgid);
                    self.src.track(tgid, false);
                } else if !self.foresight.recording() {
                    self.src.untrack(tgid);
                }
                return true;
            }
        }
        // The exec is done: its replay's data need not be paced.
        if let Some(e) = self.early.get(&tgid) {
            e.mode.release_data();
        }
        // A script that is no longer run as it was (replaced by a program,
        // a new interpreter): forgotten.
        if let Some((script, expected)) = self.early.get(&tgid).and_then(|e| e.script.as_ref()) {
            if argv != Some(expected.as_slice()) {
                self.scripts.forget(script);
            }
        }
        // A script run directly: its next execve can start the
        // interpreter's replay (see `start_early`).
        let pending = self.pending.remove(&tgid);
        let quiet = QuietExe::of(
            &exe,
            file.dev,
            file.ino,
            pending.as_ref().map(|p| p.call.filename.as_str()),
        );
        let mut exec_key = None;
        if let Some(Pending { call: c, .. }) = pending {
            if let Some(prefix) = argv.and_then(|now| script_prefix(&c.filename, &c.argv, now)) {
                self.scripts.remember(tgid, &c.filename, &exe, prefix);
            }
            exec_key = c.key;
        }
        if !in_tree && argv.is_none() && execed_again(tgid, file) {
            // No command line in the event, and /proc already shows the
            // next program's: its exec names it.
            return false;
        }
        self.status.execs_seen += 1;
        // Real-time again if an earlier launch of this batch lowered it:
        // each replay thread is placed by it.
        self.rt.set(true);
        let mut started_early = self.early.remove(&tgid);
        if let Some(e) = &started_early {
            exec_key = e.call.as_ref().and_then(|c| c.key.clone());
        }
        let decided = {
            let skip_wrapped = self.wrapped_may_run();
            let ctx = Ctx {
                dcfg: &self.dcfg,
                cfg: &self.cfg,
                store: &self.store,
                shared: &self.shared,
                check: &self.check,
                me: self.me,
                skip_wrapped,
            };
            let rt = &mut self.rt;
            decide(
                &ctx,
                tgid,
                uid,
                &exe,
                argv,
                &mut started_early,
                ts_ns,
                &self.sessions,
                self.early.len(),
                &mut || rt.set(false),
            )
        };
        // Not adopted: another program, or not followed after all.
        if let Some(e) = started_early {
            stop_replay(&e.mode);
            if let Some(k) = &e.hinted {
                self.execs.forget(k);
            }
        }
        let replay_started = matches!(&decided, Some((_, Some(_))));
        if let Some((_, Some(l))) = &decided {
            self.latencies.push(*l);
        }
        match (self.sessions.get_mut(&tgid), decided) {
            // The launch's first process exec'd again: it is now this
            // program's launch (same process tree).
            (Some(s), Some((d, _))) => {
                if s.name == d.name {
                    // The same program again: the launch's replay goes on;
                    // the one just started for it would run unwatched.
                    stop_replay(&d.mode);
                } else {
                    stop_replay(&s.mode);
                    (
                        s.name,
                        s.argv,
                        s.trivial_key,
                        s.listed,
                        s.mode,
                        s.exec_ts_ns,
                    ) = (d.name, d.argv, d.trivial_key, d.listed, d.mode, ts_ns);
                    s.quiet = quiet;
                    if !s.recorded() {
                        for m in &s.members {
                            self.src.track(*m, false);
                        }
                    }
                }
            }
            (Some(_), None) => {
                let s = self.sessions.remove(&tgid).expect("matched above");
                self.foresight.launch_dropped(tgid);
                stop_replay(&s.mode);
                self.status.ignored += 1;
                for m in &s.members {
                    self.owner.remove(m);
                    self.src.untrack(*m);
                }
            }
            (None, Some((d, _))) => {
                self.owner.insert(tgid, tgid);
                // Tracked again explicitly: an earlier exec of this process
                // that the policy refused may have untracked it after this
                // exec had re-tracked it.
                self.src.track(tgid, d.mode.recorded());
                if replay_started {
                    // Recorded in the kernel: the session's bookkeeping
                    // (reading the mount table) can wait behind the
                    // replay's start.
                    self.rt.set(false);
                }
                self.foresight.launch_begins();
                self.launched.push(tgid);
                let mut s = new_session(tgid, d, ts_ns);
                s.quiet = quiet;
                s.exec_key = exec_key;
                self.sessions.insert(tgid, s);
            }
            (None, None) => {
                self.status.ignored += 1;
                // Not if it has exec'd again since: the kernel side tracks
                // it anew for that exec (`env`, a launcher the policy does
                // not name, running a program it does), which its own
                // event decides.
                // Nor while a startup is recorded: its reads are wanted.
                if !execed_again(tgid, file) && !self.foresight.recording() {
                    self.src.untrack(tgid);
                }
            }
        }
        if replay_started {
            // The launch is recorded: let its replay thread, waiting on
            // this CPU, run now.
            self.rt.set(false);
        }
        if let (Some(r), Some(s)) = (&self.registry, self.sessions.get(&tgid)) {
            r.launch(&self.shared.cache, &s.name, &s.argv, &s.mode);
        }
        true
    }

    /// Gives each event to the launch it belongs to.
    fn collect(&mut self, buf: &mut Vec<Event>, handled: &HashSet<u32>) {
        for ev in buf.drain(..) {
            let tgid = ev.tgid();
            if matches!(ev, Event::Exec { .. })
                && handled.contains(&tgid)
                && !self.owner.contains_key(&tgid)
            {
                continue; // ignored by policy
            }
            let Some(&root) = self.owner.get(&tgid) else {
                continue;
            };
            let Some(s) = self.sessions.get_mut(&root) else {
                continue;
            };
            match ev {
                Event::Fork { child_tgid, .. } => {
                    self.owner.insert(child_tgid, root);
                    s.members.insert(child_tgid);
                }
                Event::Exit { ts_ns, .. } => s.last_exit_ns = s.last_exit_ns.max(ts_ns),
                _ => {}
            }
            if s.agg.take(&mut vec![ev]) {
                s.last_io = Instant::now();
            }
        }
    }

    /// Finished sessions: the tree exited, went idle, or ran too long.
    /// Naming files, compiling and writing happen on the learners, so the
    /// next exec is not kept waiting.
    fn finish_done(&mut self) {
        let idle = Duration::from_secs_f64(self.dcfg.idle_s);
        let timeout = Duration::from_secs_f64(self.dcfg.timeout_s);
        let done: Vec<u32> = self
            .sessions
            .iter()
            .filter(|(_, s)| {
                // A launch followed as a tree only has no I/O to go idle
                // on: it ends once its replay has, and the idle time passed.
                let quiet = if s.recorded() {
                    s.last_io.elapsed() >= idle
                } else {
                    s.replay_done() && s.started.elapsed() >= idle
                };
                s.agg.tree_done() || quiet || s.started.elapsed() >= timeout
            })
            .map(|(r, _)| *r)
            .collect();
        for root in done {
            let s = self.sessions.remove(&root).expect("listed above");
            // A startup being recorded still wants their reads: the window
            // untracks them when it closes.
            if self.foresight.recording() {
                self.foresight.untrack_later(s.members.iter().copied());
            }
            for m in &s.members {
                self.owner.remove(m);
                if !self.foresight.recording() {
                    self.src.untrack(*m);
                }
            }
            if let Mode::Prefetching {
                first_request_ns,
                first_start_ns,
                seen_ns,
                cached,
                ..
            } = &s.mode
            {
                self.status.launches_prefetched += 1;
                self.status.launches_cached += u64::from(*cached);
                let first = first_request_ns.load(Ordering::Relaxed);
                if first > 0 {
                    self.first_requests.push(since(s.exec_ts_ns, first) / 1e3);
                    self.reactions
                        .push(first.saturating_sub(*seen_ns) as f64 / 1e3);
                }
                let start = first_start_ns.load(Ordering::Relaxed);
                if start > 0 {
                    self.first_starts.push(since(s.exec_ts_ns, start) / 1e3);
                }
            } else {
                self.status.launches_learned += 1;
            }
            // The launch is over: its replay has nothing left to win. It
            // goes into the history under the program it ended as (an
            // exec chain is one launch, of its last program).
            stop_replay(&s.mode);
            // Only for a profile that exists: a first launch being learned
            // may prove trivial and leave none to name.
            let kept = matches!(s.mode, Mode::Prefetching { .. })
                || self.shared.cache.get(&s.name).is_some();
            if let (Some(k), true) = (s.exec_key.clone(), kept) {
                self.execs.learn(k, &s.name);
            }
            let at_ms =
                crate::store::now_ms().saturating_sub(s.started.elapsed().as_millis() as u64);
            self.foresight.launch_ended(&s.name, root, at_ms);
            let (store, cfg, dcfg, drops, shared) = (
                self.store.clone(),
                self.cfg.clone(),
                self.dcfg.clone(),
                self.src.drops(),
                Arc::clone(&self.shared),
            );
            let max = self.dcfg.store_max_mib << 20;
            self.learners.submit(move || {
                let mut err = std::io::stderr();
                let name = s.name.clone();
                match finish(s, drops, &shared, &store, &cfg, &dcfg, &mut err) {
                    Ok(Fate::Written) => evict_lru(&shared, &store, max, &name),
                    Ok(Fate::Trivial | Fate::Forgotten | Fate::Busy) => {}
                    Err(e) => {
                        let _ = writeln!(err, "warmstart daemon: {e}");
                    }
                }
            });
        }
        if let Some((path, bytes)) = self.execs.take_write() {
            self.learners.submit(move || {
                if let Err(e) = crate::store::write_atomic(&path, &bytes) {
                    eprintln!("warmstart daemon: execve hints not saved: {e}");
                }
            });
        }
    }

    /// Whether a launch may be one that `warmstart run` started, to be
    /// left to it: only while a `run` is known to be running.
    fn wrapped_may_run(&mut self) -> bool {
        self.skip_wrapped && self.wrappers.any(Path::new("/proc"), self.src.drops())
    }

    /// Whether an exec is of warmstart's own binaries (this one, or its
    /// front).
    fn is_own(&self, file: &warmstart_bpf::FileInfo) -> bool {
        let id = (
            warmstart_record::resolve::kdev_to_user(file.dev as u64),
            file.ino,
        );
        self.own_exes.contains(&id)
    }

    /// Tells the kernel side which programs to leave alone: those found
    /// trivial since the last batch; none while a startup is recorded,
    /// whose every read is wanted.
    fn update_quiet(&mut self) {
        let on = !self.foresight.recording();
        if self.quiet_on != Some(on) {
            self.src.set_quiet(on);
            self.quiet_on = Some(on);
        }
        let (new, released) = self.shared.trivial().take_quiet();
        if released {
            self.src.clear_quiet();
        }
        let now = Instant::now();
        for (q, until) in new {
            if until > now {
                self.src.quiet(&q, until - now);
            }
        }
    }

    /// The status the control thread answers with; `drops`, the recorder's
    /// lost events as this step read them (each read sums a per-CPU map).
    fn publish(&mut self, drops: u64) {
        let st = &mut self.status;
        st.uptime_s = self.started.elapsed().as_secs_f64();
        st.active_sessions = self.sessions.len();
        st.drops = drops;
        st.execs_quieted = self.src.quieted();
        st.exec_to_replay_us = self.latencies.percentiles();
        st.exec_to_first_request_us = self.first_requests.percentiles();
        st.start_to_first_request_us = self.reactions.percentiles();
        st.exec_to_first_start_us = self.first_starts.percentiles();
        let c = self.shared.cache.counts();
        (st.profiles_in_memory, st.plans_in_memory) = (c.profiles, c.plans);
        (st.plan_memory_bytes, st.plans_not_in_memory) = (c.plan_bytes, c.spilled);
        st.trivial_programs = self.shared.trivial().len();
        st.learn_queue = self.learners.pending();
        st.learn_dropped = self.learners.dropped();
        st.foresight = self.foresight.status.clone();
        st.sessions = self
            .sessions
            .iter()
            .map(|(pid, s)| session_status(*pid, s))
            .collect();
        *self.shared.status.lock().unwrap_or_else(|e| e.into_inner()) = st.clone();
    }
}

#[cfg(test)]
#[path = "event_loop_tests.rs"]
mod tests;
