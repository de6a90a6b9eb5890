//! Finishing a followed launch: its trace is built (files named), then its
//! profile updated — a trace kept, a plan compiled, a prefetched launch
//! judged — on a small pool of workers, so that the event loop never
//! waits for it and a burst of launches never starts a thread each.
//!
//! Naming a launch's files opens paths the launching user chose (a FIFO
//! or a slow network file can block there). It is done before the
//! profile lock is taken: the control socket and the plan cache's checks
//! take that lock too, and must not wait behind one user's files.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use warmstart_plan::trace::{Backend, CacheState, EndReason, Trace, TraceMeta, TraceStats};
use warmstart_plan::Plan;
use warmstart_replay::Report;

use super::cache::{load_plan_stamped, load_previous_stamped, Cache};
use super::config::DaemonConfig;
use super::follow::{since, Mode, Session};
use super::Shared;
use crate::manager::{add_trace, judge, Config, LaunchReport};
use crate::store::{self, Phase, Profile, Store};
use crate::Error;

/// A followed launch that has ended, with its trace built.
pub(super) struct Finished {
    pub(super) name: String,
    pub(super) argv: Vec<String>,
    pub(super) trivial_key: String,
    pub(super) listed: bool,
    pub(super) quiet: Option<super::policy::QuietExe>,
    pub(super) started: Instant,
    pub(super) trace: Trace,
    pub(super) outcome: Outcome,
}

/// How the launch was followed.
pub(super) enum Outcome {
    Learning,
    Prefetched {
        plan: Arc<Plan>,
        /// The replay's report, once it stopped.
        report: Option<Box<Report>>,
        /// Exec to the first prefetch request, ms (negative: before it).
        first_request_ms: Option<f64>,
        audited: bool,
        relearn: bool,
    },
}

/// Stops the launch's replay and builds its trace: every blocking step of
/// finishing that concerns the launch's own files, done without any lock.
pub(super) fn name_launch(s: Session, drops: u64) -> Finished {
    let duration_ns = s.duration_ns();
    let outcome = match s.mode {
        Mode::Learning => Outcome::Learning,
        Mode::Prefetching {
            plan,
            replay,
            cancel,
            first_request_ns,
            audited,
            relearn,
            ..
        } => {
            cancel.store(true, Ordering::Relaxed);
            let report = replay.and_then(|h| h.join().ok().flatten()).map(Box::new);
            let first = first_request_ns.load(Ordering::Relaxed);
            Outcome::Prefetched {
                plan,
                report,
                first_request_ms: (first > 0).then(|| since(s.exec_ts_ns, first) / 1e6),
                audited,
                relearn,
            }
        }
    };
    let meta = TraceMeta {
        command: s.argv.clone(),
        cwd: "/".into(),
        backend: Backend::Bpf,
        cache: CacheState::AsFound,
        end: if s.agg.tree_done() {
            EndReason::Exited
        } else {
            EndReason::Idle
        },
        exit_code: None,
        started_unix_ms: store::now_ms().saturating_sub(s.started.elapsed().as_millis() as u64),
        hostname: String::new(),
    };
    let stats = TraceStats {
        drops,
        duration_ns,
        ..Default::default()
    };
    Finished {
        trace: s.agg.finish(meta, stats),
        name: s.name,
        argv: s.argv,
        trivial_key: s.trivial_key,
        listed: s.listed,
        quiet: s.quiet,
        started: s.started,
        outcome,
    }
}

/// How long a finishing launch waits for its profile's lock: a `run`
/// saving takes milliseconds; a `run` learning holds it for its launch.
const PROFILE_LOCK_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// What became of a finished launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fate {
    /// Written to its profile.
    Written,
    /// The program's first launch was trivial: no profile was made, and
    /// the program is left alone for a while.
    Trivial,
    /// Its profile was forgotten or reset while it ran.
    Forgotten,
    /// Another process (`warmstart run`) held the profile's lock.
    Busy,
}

/// Finishes a launch: names its files, then updates its profile with the
/// profile lock held, unless it is not worth one.
pub(super) fn finish(
    s: Session,
    drops: u64,
    shared: &Shared,
    store: &Store,
    cfg: &Config,
    dcfg: &DaemonConfig,
    log: &mut dyn Write,
) -> Result<Fate, Error> {
    let f = name_launch(s, drops);
    let first_launch = shared.cache.get(&f.name).is_none();
    if matches!(f.outcome, Outcome::Learning)
        && first_launch
        && !f.listed
        && !dcfg.worth_learning(&f.trace.stats)
    {
        shared
            .trivial()
            .mark(&f.trivial_key, f.quiet, Instant::now());
        return Ok(Fate::Trivial);
    }
    // One writer per profile: a `warmstart run` of the same command holds
    // the lock for its whole launch, and its own record wins. Taken before
    // the daemon's own profile lock, which the control socket needs.
    let Some(_lock) = store.lock_within(&f.name, PROFILE_LOCK_WAIT)? else {
        let _ = writeln!(
            log,
            "warmstart daemon: {}: launch not kept (another warmstart holds the profile)",
            f.name
        );
        return Ok(Fate::Busy);
    };
    let forgotten = shared.profiles.lock().unwrap_or_else(|e| e.into_inner());
    if forgotten.get(&f.name).is_some_and(|t| *t > f.started) {
        let _ = writeln!(
            log,
            "warmstart daemon: {}: launch not kept (forgotten or reset while it ran)",
            f.name
        );
        // Taking the lock made the directory again: gone if it is empty.
        let _ = std::fs::remove_dir(store.dir(&f.name));
        return Ok(Fate::Forgotten);
    }
    // A plan arrived while the program was learned (pulled from the
    // registry, imported, compiled by `warmstart run`): it is kept, not
    // taken back to learning by this launch.
    if matches!(f.outcome, Outcome::Learning)
        && shared
            .cache
            .get(&f.name)
            .is_some_and(|k| k.phase == Phase::Prefetching)
    {
        let _ = writeln!(
            log,
            "warmstart daemon: {}: learning launch not kept (the profile has a plan now)",
            f.name
        );
        return Ok(Fate::Busy);
    }
    record_launch(f, store, &shared.cache, cfg, log)?;
    Ok(Fate::Written)
}

/// Updates the launch's profile with its trace (and the cache: called
/// with `Shared::profiles` held).
fn record_launch(
    f: Finished,
    store: &Store,
    cache: &Cache,
    cfg: &Config,
    log: &mut dyn Write,
) -> Result<(), Error> {
    let trace = f.trace;
    let mut prof = store
        .load(&f.name)?
        .unwrap_or_else(|| Profile::new(&f.name, &f.argv));
    prof.launches += 1;
    let mut report = LaunchReport::new(&f.name, prof.phase);
    let mut first_request = None;
    match f.outcome {
        Outcome::Learning => {
            add_trace(&trace, store, &mut prof, cfg, &mut report)?;
            // A new plan's first launch is audited.
            if prof.phase == Phase::Prefetching {
                prof.audit_next = true;
            }
        }
        Outcome::Prefetched {
            plan,
            report: rep,
            first_request_ms,
            audited,
            relearn,
        } => {
            first_request = first_request_ms;
            if relearn {
                report.replay = rep.map(|r| *r);
                add_trace(&trace, store, &mut prof, cfg, &mut report)?;
                if prof.phase == Phase::Prefetching {
                    prof.audit_next = true;
                }
            } else if audited {
                let _ =
                    store::write_atomic(&store.dir(&f.name).join("last-audit"), &trace.to_bytes());
                judge(
                    &mut prof,
                    store,
                    &plan,
                    Some(trace),
                    rep.map(|r| *r),
                    cfg,
                    &mut report,
                );
            } else {
                // Followed as a tree only: the replay's stale files still
                // decide; the miss ratio is the last audit's (every nchk-th
                // launch is audited again: `Known::audit_due`).
                let last = prof.last_miss_ratio;
                judge(
                    &mut prof,
                    store,
                    &plan,
                    None,
                    rep.map(|r| *r),
                    cfg,
                    &mut report,
                );
                prof.last_miss_ratio = last;
            }
        }
    }
    report.phase_after = prof.phase;
    // Still prefetching: the plan in memory, if it is still the file's (the
    // checker sees to that); a new plan is read back once (from the page
    // cache: it was just written).
    let plan = if prof.phase == Phase::Prefetching {
        cache
            .get(&f.name)
            .and_then(|k| k.plan)
            .filter(|_| report.compiled.is_none())
            .or_else(|| load_plan_stamped(store, &f.name).ok())
    } else if prof.phase == Phase::Learning {
        load_previous_stamped(store, &f.name)
    } else {
        None
    };
    // The report first: whoever sees the launch counted in the profile
    // finds this launch's report.
    // Neither is synced when only counters changed, as `warmstart run`
    // saves them: four `fsync`s a launch sent the disk writes between
    // launches, and took 5% of the daemon's CPU.
    let json = serde_json::to_vec_pretty(&report).expect("serializes");
    let _ = std::fs::create_dir_all(store.dir(&f.name));
    let _ = store::write_replace(&store.dir(&f.name).join("last-launch.json"), &json);
    cache.put(&prof, plan);
    crate::manager::save_after_launch(store, &mut prof, &report)?;
    cache.written(store, &f.name);
    let _ = writeln!(
        log,
        "warmstart daemon: {} {:?} -> {:?}{}{}",
        f.name,
        report.phase_before,
        report.phase_after,
        report
            .miss_ratio
            .map(|m| format!(", miss ratio {m:.3}"))
            .unwrap_or_default(),
        first_request
            .map(|ms| {
                if ms < 0.0 {
                    format!(", first prefetch request {:.2} ms before exec", -ms)
                } else {
                    format!(", first prefetch request {ms:.2} ms after exec")
                }
            })
            .unwrap_or_default()
    );
    Ok(())
}

type Job = Box<dyn FnOnce() + Send>;

/// A fixed pool of learning workers with a bounded queue. Launches that
/// end while the queue is full are dropped (counted), not queued without
/// end: a storm of launches must not turn into a storm of compiles.
pub(super) struct Learners {
    tx: Option<SyncSender<Job>>,
    /// Jobs queued or running, and a signal when it changes.
    pending: Arc<(Mutex<usize>, Condvar)>,
    dropped: AtomicU64,
}

impl Learners {
    /// Finished launches waiting beyond the ones being learned.
    pub(super) const QUEUE: usize = 64;

    pub(super) fn new(workers: usize, queue: usize) -> std::io::Result<Learners> {
        let (tx, rx) = sync_channel::<Job>(queue);
        let rx = Arc::new(Mutex::new(rx));
        let pending = Arc::new((Mutex::new(0usize), Condvar::new()));
        for i in 0..workers.max(1) {
            let (rx, pending) = (Arc::clone(&rx), Arc::clone(&pending));
            std::thread::Builder::new()
                .name(format!("ws-learn-{i}"))
                .spawn(move || work(&rx, &pending))?;
        }
        Ok(Learners {
            tx: Some(tx),
            pending,
            dropped: AtomicU64::new(0),
        })
    }

    /// Queues `job`; `false` if the queue is full (the job is dropped).
    pub(super) fn submit(&self, job: impl FnOnce() + Send + 'static) -> bool {
        let (count, _) = &*self.pending;
        *count.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        let sent = self
            .tx
            .as_ref()
            .map(|tx| tx.try_send(Box::new(job)))
            .is_some_and(|r| {
                !matches!(
                    r,
                    Err(TrySendError::Full(_) | TrySendError::Disconnected(_))
                )
            });
        if !sent {
            self.done_one();
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        sent
    }

    fn done_one(&self) {
        done_one(&self.pending);
    }

    /// Jobs queued or running.
    pub(super) fn pending(&self) -> usize {
        *self.pending.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Waits until every queued job has run.
    #[cfg(test)]
    pub(super) fn wait_idle(&self) {
        let (count, cv) = &*self.pending;
        let mut n = count.lock().unwrap_or_else(|e| e.into_inner());
        while *n > 0 {
            n = cv.wait(n).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// The workers finish what is queued, then end; they are not waited for
/// (one may be stuck on a launch's file, and the daemon must still stop).
impl Drop for Learners {
    fn drop(&mut self) {
        self.tx.take();
    }
}

fn done_one(pending: &(Mutex<usize>, Condvar)) {
    let (count, cv) = pending;
    let mut n = count.lock().unwrap_or_else(|e| e.into_inner());
    *n = n.saturating_sub(1);
    cv.notify_all();
}

fn work(rx: &Mutex<Receiver<Job>>, pending: &(Mutex<usize>, Condvar)) {
    loop {
        let job = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
        let Ok(job) = job else { return };
        // A job that panics must not take its worker, or the count, along.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
        done_one(pending);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::mpsc::channel;

    #[test]
    fn learning_runs_at_most_the_configured_workers_at_once() {
        for workers in [1, 2] {
            let pool = Learners::new(workers, 100).unwrap();
            let (running, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
            // Every job holds its worker until all jobs were submitted.
            let gate = Arc::new((Mutex::new(false), Condvar::new()));
            for _ in 0..20 {
                let (running, most, gate) =
                    (Arc::clone(&running), Arc::clone(&most), Arc::clone(&gate));
                assert!(pool.submit(move || {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    let (open, cv) = &*gate;
                    let mut o = open.lock().unwrap();
                    while !*o {
                        o = cv.wait(o).unwrap();
                    }
                    running.fetch_sub(1, Ordering::SeqCst);
                }));
            }
            assert_eq!(pool.pending(), 20);
            // Every worker has taken a job before any job ends.
            let deadline = Instant::now() + std::time::Duration::from_secs(60);
            while running.load(Ordering::SeqCst) < workers {
                assert!(Instant::now() < deadline, "{workers} workers never all ran");
                std::thread::yield_now();
            }
            *gate.0.lock().unwrap() = true;
            gate.1.notify_all();
            pool.wait_idle();
            assert_eq!(most.load(Ordering::SeqCst), workers, "{workers} workers");
            assert_eq!(pool.dropped(), 0);
        }
    }

    #[test]
    fn a_full_queue_drops_launches_instead_of_growing() {
        let pool = Learners::new(1, 2).unwrap();
        let (hold_tx, hold_rx) = channel::<()>();
        let (started_tx, started_rx) = channel::<()>();
        // The worker is busy with the first job until told.
        assert!(pool.submit(move || {
            started_tx.send(()).unwrap();
            let _ = hold_rx.recv();
        }));
        started_rx.recv().unwrap();
        assert!(pool.submit(|| {}));
        assert!(pool.submit(|| {}));
        assert!(!pool.submit(|| {}), "queue of 2 is full");
        assert_eq!(pool.dropped(), 1);
        assert_eq!(pool.pending(), 3);
        hold_tx.send(()).unwrap();
        pool.wait_idle();
        assert_eq!(pool.pending(), 0);
        // A job that panics leaves the pool working.
        assert!(pool.submit(|| panic!("a bad launch")));
        pool.wait_idle();
        let ran = Arc::new(AtomicUsize::new(0));
        let r = Arc::clone(&ran);
        assert!(pool.submit(move || {
            r.fetch_add(1, Ordering::SeqCst);
        }));
        pool.wait_idle();
        assert_eq!(ran.load(Ordering::SeqCst), 1);
    }
}
