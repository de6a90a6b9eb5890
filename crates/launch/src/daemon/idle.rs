//! The idle preloader's thread. Deciding a preload measures the residency
//! of plans (a file opened and its page cache looked at, for each file of
//! each plan ranked), which can take long when the files' directory
//! entries were evicted too: it must not run on the event loop, where an
//! exec would wait behind it. The loop only sends what happened and reads
//! what the thread publishes; the predictor is shared, locked only for
//! pure work on either side.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use warmstart_predict::Predictor;

use super::control::{ForesightStatus, PredictionStatus};
use crate::preload::{Action, PlanResidency, PreloadOs, Preloader, State};

/// How often a running preload is looked at, so that the next one
/// follows it: preloads after a boot are what the first launches need.
const FOLLOW_TICK: Duration = Duration::from_millis(250);

/// How often a busy disk is looked at again.
const BUSY_TICK: Duration = Duration::from_secs(1);

/// What the event loop tells the preloader.
enum Msg {
    /// A launch (or a replay at an execve) begins: stop the running
    /// preload now.
    LaunchBegins,
    /// A launch of this profile was decided: judge its preload, if any.
    Launch(String),
    Forget(String),
}

/// The event loop's end of the preloader's thread. Dropping it stops the
/// thread (and its running preload).
pub(super) struct IdlePreloader {
    tx: Sender<Msg>,
    /// The preload part of the status, as of the thread's last round.
    view: Arc<Mutex<ForesightStatus>>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl IdlePreloader {
    /// Starts the thread: every `every` while `launch` is clear, one round
    /// of [`Preloader::tick`] over the predictor's ranking.
    pub(super) fn start(
        preloader: Preloader,
        os: Box<dyn PreloadOs + Send>,
        predictor: Arc<Mutex<Predictor>>,
        launch: Arc<AtomicBool>,
        every: Duration,
    ) -> std::io::Result<IdlePreloader> {
        let (tx, rx) = channel();
        let view = Arc::new(Mutex::new(ForesightStatus {
            preload_state: state_name(&State::Idle).into(),
            ..Default::default()
        }));
        let mut t = Thread {
            preloader,
            os,
            predictor,
            launch,
            view: Arc::clone(&view),
            clock: Instant::now(),
        };
        std::thread::Builder::new()
            .name("ws-preload".into())
            .spawn(move || t.run(&rx, every))?;
        Ok(IdlePreloader { tx, view })
    }

    pub(super) fn launch_begins(&self) {
        let _ = self.tx.send(Msg::LaunchBegins);
    }

    pub(super) fn launched(&self, profile: &str) {
        let _ = self.tx.send(Msg::Launch(profile.to_string()));
    }

    pub(super) fn forget(&self, profile: &str) {
        let _ = self.tx.send(Msg::Forget(profile.to_string()));
    }

    /// Copies what the thread published into `st`.
    pub(super) fn publish(&self, st: &mut ForesightStatus, busy: bool) {
        let v = lock(&self.view);
        st.preload_state = if busy && v.preload_state != state_name(&State::Disabled) {
            state_name(&State::LaunchInProgress).into()
        } else {
            v.preload_state.clone()
        };
        st.preloads = v.preloads;
        st.rereads = v.rereads;
        st.bytes_preloaded = v.bytes_preloaded;
        st.bytes_used = v.bytes_used;
        st.precision = v.precision;
        st.preloads_used = v.preloads_used;
        st.preloads_unused = v.preloads_unused;
        st.held_bytes = v.held_bytes;
        st.budget_bytes = v.budget_bytes;
        st.predictions.clone_from(&v.predictions);
    }
}

struct Thread {
    preloader: Preloader,
    os: Box<dyn PreloadOs + Send>,
    predictor: Arc<Mutex<Predictor>>,
    launch: Arc<AtomicBool>,
    view: Arc<Mutex<ForesightStatus>>,
    clock: Instant,
}

impl Thread {
    fn run(&mut self, rx: &Receiver<Msg>, every: Duration) {
        let mut next = Instant::now();
        loop {
            let wait = next.saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait) {
                Ok(Msg::LaunchBegins) => self.os.cancel_preload(),
                Ok(Msg::Launch(p)) => {
                    let f = self.preloader.last_resident_fraction(&p).unwrap_or(0.0);
                    if let Some(o) = self.preloader.on_launch(&p, f) {
                        lock(&self.predictor).preload_outcome(&o.profile, o.used);
                    }
                    self.publish();
                }
                Ok(Msg::Forget(p)) => self.preloader.forget(&p),
                Err(RecvTimeoutError::Timeout) => {
                    if !self.launch.load(Ordering::Relaxed) {
                        self.round();
                    }
                    // While a preload runs, the next one starts as soon
                    // as it ends, not up to a whole tick later.
                    let tick = match self.preloader.stats().state {
                        State::Preloading => FOLLOW_TICK,
                        // Measured over the last tick: a short one finds
                        // the disk idle soon after it is.
                        State::DiskBusy => BUSY_TICK,
                        _ => every,
                    };
                    next = Instant::now() + tick.min(every);
                }
                Err(RecvTimeoutError::Disconnected) => {
                    self.os.cancel_preload();
                    return;
                }
            }
        }
    }

    fn round(&mut self) {
        let ranking = lock(&self.predictor).rank();
        if !self.preloader.config().enabled {
            // Predictions are still shown.
            let mut v = lock(&self.view);
            v.preload_state = state_name(&State::Disabled).into();
            v.predictions = ranking
                .iter()
                .take(self.preloader.config().top)
                .map(|c| PredictionStatus {
                    profile: c.profile.clone(),
                    score: c.score,
                    soon: c.soon,
                    resident: None,
                    preloaded: false,
                })
                .collect();
            return;
        }
        let now = self.clock.elapsed().as_millis() as u64;
        let mut err = std::io::stderr();
        for a in self.preloader.tick(now, &ranking, self.os.as_mut()) {
            match &a {
                Action::Unused { profile, .. } => {
                    lock(&self.predictor).preload_outcome(profile, false)
                }
                Action::Started {
                    profile,
                    bytes,
                    again,
                } => {
                    let again = if *again { " again" } else { "" };
                    let _ = writeln!(
                        err,
                        "warmstart daemon: preloading {profile}{again} ({} KiB)",
                        bytes >> 10
                    );
                }
                Action::Failed { profile, error } => {
                    let _ = writeln!(err, "warmstart daemon: cannot preload {profile}: {error}");
                }
                Action::Cancelled { .. } => {}
            }
        }
        self.publish();
    }

    fn publish(&self) {
        let s = self.preloader.stats();
        let mut v = lock(&self.view);
        v.preload_state = state_name(&s.state).into();
        v.preloads = s.preloads;
        v.rereads = s.rereads;
        v.bytes_preloaded = s.bytes_preloaded;
        v.bytes_used = s.bytes_used;
        v.precision = s.precision;
        v.preloads_used = s.used;
        v.preloads_unused = s.unused;
        v.held_bytes = s.held_bytes;
        v.budget_bytes = s.budget_bytes;
        v.predictions = s
            .predictions
            .iter()
            .map(|p| PredictionStatus {
                profile: p.profile.clone(),
                score: p.score,
                soon: p.soon,
                resident: p.resident,
                preloaded: p.preloaded,
            })
            .collect();
    }
}

/// As `status --json` and the preloader's own serialization say it.
pub(super) fn state_name(state: &State) -> &'static str {
    match state {
        State::Disabled => "disabled",
        State::Idle => "idle",
        State::LaunchInProgress => "launch_in_progress",
        State::MemoryPressure => "memory_pressure",
        State::DiskBusy => "disk_busy",
        State::LowMemory => "low_memory",
        State::OverBudget => "over_budget",
        State::Preloading => "preloading",
    }
}

/// The system of a preloader that never runs.
pub(super) struct NoOs;

impl PreloadOs for NoOs {
    fn memory(&mut self) -> Option<warmstart_replay::MemInfo> {
        None
    }
    fn memory_pressure(&mut self) -> Option<f64> {
        None
    }
    fn disk_busy(&mut self) -> bool {
        true
    }
    fn launch_in_progress(&self) -> bool {
        true
    }
    fn residency(&mut self, _: &str) -> Option<PlanResidency> {
        None
    }
    fn start_preload(&mut self, profile: &str) -> Result<(), String> {
        Err(format!("{profile}: preloading is off"))
    }
    fn preload_running(&mut self) -> Option<String> {
        None
    }
    fn cancel_preload(&mut self) {}
}
