//! Startup plans: what a boot or a login reads, replayed as the next one
//! begins ("On faster application startup times", Hubert 2005; ureadahead).
//!
//! Three parts, each usable on its own by the daemon's event loop:
//!
//! - [`StartupWindow`], a pure state machine fed the time and what happened
//!   (the daemon started, a process exec'd in some login session), which
//!   says when a startup window opens and closes: it opens at a boot (the
//!   daemon started soon after the machine did) or at the first exec of a
//!   login session never seen before, and closes after
//!   [`StartupConfig::quiet_s`] without a new exec, or at
//!   [`StartupConfig::max_s`] whatever happens.
//! - [`StartupRecording`], which turns the recorder's events of an open
//!   window into one trace of everything the system read: every process
//!   exec'd meanwhile, not only the launches the policy follows, since a
//!   startup's cost is mostly services and desktop helpers.
//! - [`StartupStore`] (in [`store`]), which keeps the last few startup
//!   traces of each kind, compiles a plan from the pages seen in k of the
//!   last n, and [`replay_startup`] which replays it in the background.

mod store;

use std::collections::{BTreeSet, HashSet};
use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use warmstart_bpf::Event;
use warmstart_plan::trace::{Backend, CacheState, EndReason, TraceMeta, TraceStats};
use warmstart_plan::Trace;
pub use warmstart_predict::StartupKind;
use warmstart_record::Aggregator;

pub use store::{
    mem_available, replay_startup, spawn_replay, AddOutcome, BackgroundReplay, LoadedPlan,
    ReplayHandle, StartupError, StartupStore,
};

/// Startup plans, in config.toml's `[startup]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StartupConfig {
    /// Record and replay startup plans at all.
    pub enabled: bool,
    /// ... for boots (the daemon started within `boot_uptime_max_s` of the
    /// machine).
    pub boot: bool,
    /// ... for login sessions (the first exec of a new session).
    pub login: bool,
    /// At a boot, once the boot plan is read, read the login plan too: on
    /// a desktop a login follows every boot, and the session's first
    /// programs then start from the cache. The login's own replay
    /// replaces it when the login comes.
    pub login_at_boot: bool,
    /// A window closes after this many seconds without a new exec: a
    /// startup is a burst of programs starting one after another.
    pub quiet_s: f64,
    /// ... and after this many seconds whatever happens, so that a machine
    /// that keeps starting programs (a build, cron) does not record forever.
    pub max_s: f64,
    /// The daemon starting within this many seconds of the machine is a
    /// boot; later it is a restart, which is not replayed. A benchmark that
    /// simulates boots by restarting the daemon raises it.
    pub boot_uptime_max_s: f64,
    /// Startup traces kept per kind (n).
    pub keep: usize,
    /// A page is in the plan if at least this many of the kept traces read
    /// it (k); no plan before that many startups were recorded. Reads seen
    /// once (a one-off update, a crash report) are not worth replaying at
    /// every startup.
    pub min_traces: usize,
    /// I/O priority of the replay: `idle` or `be:0`..`be:7`. Best-effort 7
    /// by default rather than idle: at boot the disk is never idle, and an
    /// idle-class replay would only start once the startup is over. Level 7
    /// still lets every read of the startup itself go first.
    pub io_priority: String,
    /// Replay threads. Few: the replay must not take the CPUs the startup
    /// needs, and it runs ahead of a startup that lasts seconds anyway.
    pub workers: usize,
    /// The replay stops when MemAvailable would fall below this many MiB;
    /// unset: the replay engine's default (5% of RAM, at least 256 MiB).
    pub memory_floor_mib: Option<u64>,
}

impl Default for StartupConfig {
    fn default() -> Self {
        StartupConfig {
            enabled: true,
            boot: true,
            login: true,
            login_at_boot: true,
            quiet_s: 5.0,
            max_s: 60.0,
            boot_uptime_max_s: 120.0,
            keep: 4,
            min_traces: 2,
            io_priority: "be:7".into(),
            workers: 2,
            memory_floor_mib: None,
        }
    }
}

impl StartupConfig {
    pub fn validate(&self) -> Result<(), String> {
        if !(self.quiet_s > 0.0 && self.max_s >= self.quiet_s && self.max_s <= 3600.0) {
            return Err("startup: need 0 < quiet_s <= max_s <= 3600 (seconds)".into());
        }
        if self.boot_uptime_max_s.is_nan() || self.boot_uptime_max_s < 0.0 {
            return Err("startup: boot_uptime_max_s must be >= 0".into());
        }
        if !(1..=64).contains(&self.keep) || !(1..=self.keep).contains(&self.min_traces) {
            return Err("startup: need 1 <= min_traces <= keep <= 64".into());
        }
        if !(1..=64).contains(&self.workers) {
            return Err("startup: workers must be between 1 and 64".into());
        }
        self.io_priority
            .parse::<warmstart_replay::IoPriority>()
            .map_err(|e| format!("startup: io_priority {:?}: {e}", self.io_priority))?;
        Ok(())
    }

    fn quiet_ms(&self) -> u64 {
        (self.quiet_s * 1000.0) as u64
    }

    fn max_ms(&self) -> u64 {
        (self.max_s * 1000.0) as u64
    }
}

/// What the window is told. Times are milliseconds of one monotonic clock
/// of the caller's choosing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// The daemon started, `uptime_ms` after the machine did.
    DaemonStarted { uptime_ms: u64 },
    /// A process exec'd, in login session `session` (see [`login_session`];
    /// `None` for processes outside any login: services, kernel threads).
    Exec { session: Option<u32> },
}

/// Why a window closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CloseReason {
    /// `quiet_s` passed without a new exec.
    Quiet,
    /// `max_s` passed.
    Cap,
    /// A new login began: its own window starts, so that each kind's plan
    /// holds what that kind of startup reads.
    Superseded,
}

/// A change of the window's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// A startup began: replay its plan now, and start recording.
    Opened {
        kind: StartupKind,
        session: u32,
        at_ms: u64,
    },
    /// The startup ended at `at_ms` (the deadline, which may be earlier
    /// than the call that noticed it): finish the recording and store it.
    Closed {
        kind: StartupKind,
        session: u32,
        opened_ms: u64,
        at_ms: u64,
        execs: u64,
        reason: CloseReason,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Open {
    kind: StartupKind,
    session: u32,
    opened_ms: u64,
    last_exec_ms: u64,
    execs: u64,
}

/// Login sessions remembered; the oldest (lowest: audit session ids only
/// grow) are forgotten beyond this, so the set cannot grow without bound.
const MAX_SEEN_SESSIONS: usize = 65536;

/// Decides when startup windows begin and end. Pure: no clock, no I/O.
#[derive(Debug, Clone)]
pub struct StartupWindow {
    cfg: StartupConfig,
    seen: BTreeSet<u32>,
    open: Option<Open>,
}

impl StartupWindow {
    pub fn new(cfg: StartupConfig) -> Self {
        StartupWindow {
            cfg,
            seen: BTreeSet::new(),
            open: None,
        }
    }

    /// Sessions that already exist when the daemon starts (see
    /// [`known_sessions`]): after a daemon restart, the users logged in
    /// are not starting up.
    pub fn seed_sessions(&mut self, sessions: impl IntoIterator<Item = u32>) {
        for s in sessions {
            self.remember(s);
        }
    }

    fn remember(&mut self, session: u32) -> bool {
        let new = self.seen.insert(session);
        if self.seen.len() > MAX_SEEN_SESSIONS {
            self.seen.pop_first();
        }
        new
    }

    /// The open window's kind and session, if one is open.
    pub fn open(&self) -> Option<(StartupKind, u32)> {
        self.open.map(|o| (o.kind, o.session))
    }

    /// When the open window closes if no exec comes: the time to wake the
    /// event loop by.
    pub fn deadline(&self) -> Option<u64> {
        self.open
            .map(|o| (o.last_exec_ms + self.cfg.quiet_ms()).min(o.opened_ms + self.cfg.max_ms()))
    }

    /// The recorder watches from `now_ms` on: an open window's quiet time
    /// counts from here, not from its opening. Loading the recorder can
    /// take longer than `quiet_s` (seconds in an emulated guest), and a
    /// boot window that closed meanwhile had recorded nothing.
    pub fn watching_from(&mut self, now_ms: u64) {
        if let Some(o) = &mut self.open {
            o.last_exec_ms = o.last_exec_ms.max(now_ms);
        }
    }

    /// Closes the open window if its deadline has passed.
    pub fn tick(&mut self, now_ms: u64) -> Option<Transition> {
        let o = self.open?;
        let quiet_end = o.last_exec_ms + self.cfg.quiet_ms();
        let cap_end = o.opened_ms + self.cfg.max_ms();
        if now_ms < quiet_end.min(cap_end) {
            return None;
        }
        self.open = None;
        let (at_ms, reason) = if quiet_end < cap_end {
            (quiet_end, CloseReason::Quiet)
        } else {
            (cap_end, CloseReason::Cap)
        };
        Some(Transition::Closed {
            kind: o.kind,
            session: o.session,
            opened_ms: o.opened_ms,
            at_ms,
            execs: o.execs,
            reason,
        })
    }

    /// Feeds one input; returns what changed, in order (a window can close
    /// and another open at one input).
    pub fn feed(&mut self, now_ms: u64, input: Input) -> Vec<Transition> {
        let mut out = Vec::new();
        // A window whose deadline passed before this input ended then,
        // whatever the input is.
        out.extend(self.tick(now_ms));
        if !self.cfg.enabled {
            return out;
        }
        match input {
            Input::DaemonStarted { uptime_ms } => {
                let boot = uptime_ms as f64 <= self.cfg.boot_uptime_max_s * 1000.0;
                if self.cfg.boot && boot && self.open.is_none() {
                    out.push(self.begin(StartupKind::Boot, 0, now_ms));
                }
            }
            Input::Exec { session } => {
                let new_login = session.filter(|s| self.remember(*s));
                match (new_login, &mut self.open) {
                    (Some(s), _) if self.cfg.login => {
                        if let Some(o) = self.open.take() {
                            out.push(Transition::Closed {
                                kind: o.kind,
                                session: o.session,
                                opened_ms: o.opened_ms,
                                at_ms: now_ms,
                                execs: o.execs,
                                reason: CloseReason::Superseded,
                            });
                        }
                        out.push(self.begin(StartupKind::Login, s, now_ms));
                    }
                    (_, Some(o)) => {
                        o.last_exec_ms = now_ms;
                        o.execs += 1;
                    }
                    (_, None) => {}
                }
            }
        }
        out
    }

    fn begin(&mut self, kind: StartupKind, session: u32, now_ms: u64) -> Transition {
        self.open = Some(Open {
            kind,
            session,
            opened_ms: now_ms,
            last_exec_ms: now_ms,
            execs: u64::from(kind == StartupKind::Login),
        });
        Transition::Opened {
            kind,
            session,
            at_ms: now_ms,
        }
    }
}

/// `AUDIT_SID_UNSET`: the process belongs to no audit session.
const SESSION_UNSET: u32 = u32::MAX;

/// The login session of process `pid`, if it is in a user's login: its
/// audit session id (`PROC/PID/sessionid`), counted only when logind knows
/// it as a user session (`RUN/systemd/sessions/ID` with `CLASS=user`). Cron
/// jobs and `su` get audit sessions of their own but are not logins; on a
/// system without logind every audit session counts. Without systemd
/// running (no `RUN/systemd/system`, sd_booted(3)) there is no logind,
/// whatever an image left in `RUN/systemd/sessions`. `proc_root` and
/// `run_root` are `/proc` and `/run` except in tests.
pub fn login_session(proc_root: &Path, run_root: &Path, pid: u32) -> Option<u32> {
    let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("sessionid")).ok()?;
    let id: u32 = text.trim().parse().ok()?;
    if id == SESSION_UNSET {
        return None;
    }
    let sessions = run_root.join("systemd/sessions");
    if !sessions.is_dir() || !run_root.join("systemd/system").is_dir() {
        return Some(id);
    }
    let info = std::fs::read_to_string(sessions.join(id.to_string())).ok()?;
    let class = info.lines().find_map(|l| l.strip_prefix("CLASS="));
    matches!(class, None | Some("user")).then_some(id)
}

/// The audit session ids of the processes running now.
pub fn known_sessions(proc_root: &Path) -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir(proc_root) else {
        return Vec::new();
    };
    let mut ids: Vec<u32> = rd
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| std::fs::read_to_string(e.path().join("sessionid")).ok())
        .filter_map(|t| t.trim().parse().ok())
        .filter(|id| *id != SESSION_UNSET)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// The machine's uptime in milliseconds (`PROC/uptime`).
pub fn uptime_ms(proc_root: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(proc_root.join("uptime")).ok()?;
    let secs: f64 = text.split_whitespace().next()?.parse().ok()?;
    Some((secs * 1000.0) as u64)
}

/// The trace of one startup window: every record the recorder delivered
/// while it was open, whichever process it came from.
///
/// The recorder only delivers records of the processes it tracks; in the
/// daemon's `watch_exec` mode it tracks every exec, and the daemon stops
/// tracking those its policy ignores. While a window is open the daemon
/// must keep them tracked instead, and after it closes untrack the ones
/// in [`StartupRecording::processes`] that no launch of its own follows.
pub struct StartupRecording {
    kind: StartupKind,
    session: u32,
    agg: Aggregator,
    started: Instant,
    started_unix_ms: u64,
    processes: HashSet<u32>,
}

impl StartupRecording {
    pub fn new(kind: StartupKind, session: u32) -> Self {
        StartupRecording {
            kind,
            session,
            // Every record is the startup's: there is no launching process
            // whose pre-exec records would have to be dropped.
            agg: Aggregator::new(Path::new("/"), 0).already_execed(),
            started: Instant::now(),
            started_unix_ms: crate::store::now_ms(),
            processes: HashSet::new(),
        }
    }

    pub fn kind(&self) -> StartupKind {
        self.kind
    }

    pub fn session(&self) -> u32 {
        self.session
    }

    /// Takes a copy of a batch of the recorder's records (the daemon's own
    /// launches keep theirs). Returns whether any of them was I/O.
    pub fn take(&mut self, events: &[Event]) -> bool {
        for ev in events {
            match ev {
                Event::Exec { tgid, .. } => {
                    self.processes.insert(*tgid);
                }
                Event::Fork { child_tgid, .. } => {
                    self.processes.insert(*child_tgid);
                }
                _ => {}
            }
        }
        self.agg.take(&mut events.to_vec())
    }

    /// Processes seen exec'ing or forking during the window.
    pub fn processes(&self) -> &HashSet<u32> {
        &self.processes
    }

    /// Names the files and builds the trace. `drops` is the recorder's
    /// count of lost records, kept so that compiling can warn.
    pub fn finish(self, drops: u64) -> Trace {
        let kind = match self.kind {
            StartupKind::Boot => "boot",
            StartupKind::Login => "login",
        };
        let meta = TraceMeta {
            command: vec![format!("startup:{kind}")],
            cwd: "/".into(),
            backend: Backend::Bpf,
            cache: CacheState::AsFound,
            end: EndReason::Idle,
            exit_code: None,
            started_unix_ms: self.started_unix_ms,
            hostname: String::new(),
        };
        let stats = TraceStats {
            drops,
            duration_ns: self.started.elapsed().as_nanos() as u64,
            ..Default::default()
        };
        self.agg.finish(meta, stats)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_boot_window_counts_its_quiet_from_when_the_recorder_watches() {
        let cfg = StartupConfig::default();
        let mut w = StartupWindow::new(cfg.clone());
        let opened = w.feed(0, Input::DaemonStarted { uptime_ms: 1_000 });
        assert!(
            matches!(opened.as_slice(), [Transition::Opened { .. }]),
            "{opened:?}"
        );
        // The recorder took 8 s to load: the window is still open at 10 s.
        w.watching_from(8_000);
        assert!(w.tick(10_000).is_none());
        assert!(w.tick(8_000 + cfg.quiet_ms() + 1).is_some());
    }

    use super::*;
    use CloseReason::*;
    use StartupKind::*;

    /// One step of a timeline: at `t` ms, an input (or only time passing),
    /// and the transitions expected.
    type Step = (u64, Option<Input>, Vec<Transition>);

    fn opened(kind: StartupKind, session: u32, at_ms: u64) -> Transition {
        Transition::Opened {
            kind,
            session,
            at_ms,
        }
    }

    fn closed(
        kind: StartupKind,
        session: u32,
        (opened_ms, at_ms): (u64, u64),
        execs: u64,
        reason: CloseReason,
    ) -> Transition {
        Transition::Closed {
            kind,
            session,
            opened_ms,
            at_ms,
            execs,
            reason,
        }
    }

    fn exec(session: Option<u32>) -> Option<Input> {
        Some(Input::Exec { session })
    }

    fn start(uptime_ms: u64) -> Option<Input> {
        Some(Input::DaemonStarted { uptime_ms })
    }

    fn run(cfg: StartupConfig, seed: &[u32], steps: &[Step]) {
        let mut w = StartupWindow::new(cfg);
        w.seed_sessions(seed.iter().copied());
        for (i, (t, input, want)) in steps.iter().enumerate() {
            let got = match input {
                Some(inp) => w.feed(*t, *inp),
                None => w.tick(*t).into_iter().collect(),
            };
            assert_eq!(&got, want, "step {i} at {t} ms");
        }
    }

    #[test]
    fn timelines() {
        let d = StartupConfig::default; // quiet 5 s, max 60 s, boot within 120 s
        let cases: Vec<(&str, StartupConfig, Vec<u32>, Vec<Step>)> = vec![
            (
                "a boot closes 5 s after its last exec",
                d(),
                vec![],
                vec![
                    (0, start(8_000), vec![opened(Boot, 0, 0)]),
                    (1_000, exec(None), vec![]),
                    (4_000, exec(None), vec![]),
                    (8_999, None, vec![]),
                    (9_000, None, vec![closed(Boot, 0, (0, 9_000), 2, Quiet)]),
                    (9_500, exec(None), vec![]),
                ],
            ),
            (
                "a daemon restart long after boot is no startup",
                d(),
                vec![],
                vec![(0, start(3_600_000), vec![]), (100, exec(None), vec![])],
            ),
            (
                "a machine that keeps starting programs is capped at 60 s",
                d(),
                vec![],
                std::iter::once((0, start(1_000), vec![opened(Boot, 0, 0)]))
                    .chain((1..=70).map(|s| {
                        let want = if s == 60 {
                            vec![closed(Boot, 0, (0, 60_000), 59, Cap)]
                        } else {
                            vec![]
                        };
                        (s * 1_000, exec(None), want)
                    }))
                    .collect(),
            ),
            (
                "a new session is a login; its next execs keep it open",
                d(),
                vec![2],
                vec![
                    (0, exec(Some(2)), vec![]),
                    (1_000, exec(Some(7)), vec![opened(Login, 7, 1_000)]),
                    (3_000, exec(Some(7)), vec![]),
                    (
                        9_000,
                        exec(Some(7)),
                        vec![closed(Login, 7, (1_000, 8_000), 2, Quiet)],
                    ),
                    (9_100, exec(Some(2)), vec![]),
                ],
            ),
            (
                "a login during a boot window gets its own window",
                d(),
                vec![],
                vec![
                    (0, start(5_000), vec![opened(Boot, 0, 0)]),
                    (2_000, exec(None), vec![]),
                    (
                        4_000,
                        exec(Some(3)),
                        vec![
                            closed(Boot, 0, (0, 4_000), 1, Superseded),
                            opened(Login, 3, 4_000),
                        ],
                    ),
                    (
                        9_000,
                        None,
                        vec![closed(Login, 3, (4_000, 9_000), 1, Quiet)],
                    ),
                ],
            ),
            (
                "sessions alive at the daemon's start are not logins",
                d(),
                vec![4, 5],
                vec![(0, exec(Some(4)), vec![]), (10, exec(Some(5)), vec![])],
            ),
            (
                "logins switched off",
                StartupConfig {
                    login: false,
                    ..d()
                },
                vec![],
                vec![
                    (0, start(0), vec![opened(Boot, 0, 0)]),
                    (1_000, exec(Some(9)), vec![]),
                    (6_000, None, vec![closed(Boot, 0, (0, 6_000), 1, Quiet)]),
                ],
            ),
            (
                "everything switched off",
                StartupConfig {
                    enabled: false,
                    ..d()
                },
                vec![],
                vec![(0, start(0), vec![]), (1, exec(Some(9)), vec![])],
            ),
            (
                "a boot the benchmark simulates by restarting the daemon",
                StartupConfig {
                    boot_uptime_max_s: 1e9,
                    quiet_s: 1.0,
                    ..d()
                },
                vec![],
                vec![
                    (0, start(86_400_000), vec![opened(Boot, 0, 0)]),
                    (
                        2_000,
                        exec(None),
                        vec![closed(Boot, 0, (0, 1_000), 0, Quiet)],
                    ),
                ],
            ),
        ];
        for (name, cfg, seed, steps) in cases {
            eprintln!("case: {name}");
            run(cfg, &seed, &steps);
        }
    }

    #[test]
    fn the_deadline_is_when_the_window_would_close() {
        let mut w = StartupWindow::new(StartupConfig::default());
        assert_eq!(w.deadline(), None);
        w.feed(0, Input::DaemonStarted { uptime_ms: 0 });
        assert_eq!(w.deadline(), Some(5_000));
        for t in (4_000..=56_000).step_by(4_000).chain([57_000]) {
            assert!(w.feed(t, Input::Exec { session: None }).is_empty());
        }
        // Capped: 60 s after it opened, not 62 s.
        assert_eq!(w.deadline(), Some(60_000));
        assert_eq!(w.open(), Some((Boot, 0)));
        assert!(w.tick(60_000).is_some());
        assert_eq!(w.open(), None);
    }

    #[test]
    fn config_validation() {
        assert!(StartupConfig::default().validate().is_ok());
        let bad = [
            StartupConfig {
                quiet_s: 0.0,
                ..Default::default()
            },
            StartupConfig {
                min_traces: 5,
                ..Default::default()
            },
            StartupConfig {
                io_priority: "fast".into(),
                ..Default::default()
            },
        ];
        for c in bad {
            assert!(c.validate().is_err(), "{c:?}");
        }
        let parsed: StartupConfig = toml::from_str("quiet_s = 2.5\nlogin = false\n").unwrap();
        assert_eq!(parsed.quiet_s, 2.5);
        assert!(!parsed.login && parsed.boot);
        assert!(toml::from_str::<StartupConfig>("quiet = 1\n").is_err());
    }

    #[test]
    fn sessions_from_a_fixture_proc_and_run() {
        let d = tempfile::tempdir().unwrap();
        let (proc_, run_) = (d.path().join("proc"), d.path().join("run"));
        for (pid, sid) in [
            (1, "4294967295"),
            (100, "3"),
            (101, "3"),
            (200, "8"),
            (300, "9"),
        ] {
            let p = proc_.join(pid.to_string());
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(p.join("sessionid"), sid).unwrap();
        }
        std::fs::write(proc_.join("uptime"), "12.50 20.00\n").unwrap();
        assert_eq!(known_sessions(&proc_), vec![3, 8, 9]);
        assert_eq!(uptime_ms(&proc_), Some(12_500));
        // Without logind, every audit session is a login.
        assert_eq!(login_session(&proc_, &run_, 1), None);
        assert_eq!(login_session(&proc_, &run_, 100), Some(3));
        assert_eq!(login_session(&proc_, &run_, 999), None);
        // A sessions directory without systemd running is no logind.
        let s = run_.join("systemd/sessions");
        std::fs::create_dir_all(&s).unwrap();
        assert_eq!(login_session(&proc_, &run_, 300), Some(9));
        // With logind, only its user sessions.
        std::fs::create_dir_all(run_.join("systemd/system")).unwrap();
        std::fs::write(s.join("3"), "UID=1000\nCLASS=user\nTYPE=x11\n").unwrap();
        std::fs::write(s.join("8"), "UID=0\nCLASS=background\n").unwrap();
        assert_eq!(login_session(&proc_, &run_, 100), Some(3));
        assert_eq!(
            login_session(&proc_, &run_, 200),
            None,
            "not a user session"
        );
        assert_eq!(
            login_session(&proc_, &run_, 300),
            None,
            "unknown to logind: cron"
        );
    }
}
