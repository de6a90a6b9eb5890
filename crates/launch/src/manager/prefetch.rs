//! A launch with a plan: the strategy for its device, the replay started
//! ahead of the application, and the launch itself.

use std::ffi::OsString;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use warmstart_plan::Plan;
use warmstart_record::{argv_text, Exit, HeldChild, SignalForwarder};
use warmstart_replay::{Engine, RealBackend};

use super::judge::judge;
use super::learning::add_trace;
use super::{Config, LaunchReport, Strategy, StrategyChoice};
use crate::device;
use crate::store::{Profile, Store};
use crate::Error;

/// The strategy for this plan's device: configured, or measured once per
/// device. (A plan is compiled in physical order for a device that seeks:
/// see `compile_profile`.)
pub(super) fn strategy(plan: &Plan, store: &Store, cfg: &Config) -> Strategy {
    match cfg.strategy {
        StrategyChoice::Fixed(s) => s,
        StrategyChoice::Auto => {
            match device::plan_seeks(plan, &store.root().join(device::DEVICES_FILE)) {
                Some(true) => Strategy::Sorted,
                _ => Strategy::Concurrent,
            }
        }
    }
}

/// What a launch with a plan is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Launch {
    /// Prefetched and judged; `warm`: the plan was found resident already.
    Prefetch { warm: bool },
    /// Recorded for a relearning profile, prefetched with its previous plan.
    Relearn,
}

/// `RECORDER` false: the caller handed over every launch that records or
/// traces (see `run_without_recorder`), and this compiles without them.
///
/// `named_right` says whether the profile is the command's (named by a
/// hint, it is known only once the program's path is walked): asked after
/// the replay has started and before anything is launched. `None`: it was
/// not, so the replay was cancelled, nothing launched and nothing saved.
#[allow(clippy::too_many_arguments)]
pub(super) fn prefetch<const RECORDER: bool>(
    argv: &[OsString],
    plan: &Plan,
    launch: Launch,
    store: &Store,
    prof: &mut Profile,
    cfg: &Config,
    report: &mut LaunchReport,
    named_right: &dyn Fn() -> bool,
) -> Result<Option<Exit>, Error> {
    let relearning = launch == Launch::Relearn;
    // A breakdown names the files the plan lacks from the audit trace.
    let do_audit = RECORDER && (cfg.audit || cfg.breakdown || prof.audit_next || relearning);
    // A traced launch is started by the recorder, before the replay:
    // confirmed first. (A replay beside the walk is for the cold launch.)
    if (do_audit || launch == (Launch::Prefetch { warm: true })) && !named_right() {
        return Ok(None);
    }
    if launch == (Launch::Prefetch { warm: true }) {
        report.warm_skip = true;
        let (exit, inblock) = plain_launch(argv)?;
        report.app_read_bytes = Some(inblock);
        prof.launches_since_audit += 1;
        return Ok(Some(exit));
    }
    let mut strat = strategy(plan, store, cfg);
    if strat == Strategy::Sorted && !plan.meta.sorted {
        // Holding the program while a plan in first-use order is read
        // costs what a cold launch costs on a disk that seeks (the hdd
        // model: python-scipy held 5.2 s, then 0.7 s, against 5.3 s cold):
        // such a plan (compiled before its device was measured) runs
        // beside the program until it is compiled again.
        strat = Strategy::Concurrent;
    }
    report.strategy = Some(strat);
    let backend = RealBackend::new();
    let mut ropts = cfg.replay.clone();
    ropts.log_requests = cfg.breakdown;
    if strat == Strategy::Sorted {
        // The application is held meanwhile: never for long. (A Python
        // launch once waited the replay's default 30 s for pages that did
        // not become resident.)
        ropts.wait = Some(cfg.sorted_wait_max);
    }
    let engine = match Engine::new(&backend, ropts) {
        Ok(e) => e,
        Err(_) if !named_right() => return Ok(None),
        Err(e) => {
            report.plan_problem = Some(format!("replay not started: {e}"));
            return Ok(Some(plain_launch(argv)?.0));
        }
    };
    let cancel = engine.cancel_flag();
    let progress = engine.progress();
    let io_entries = plan
        .entries
        .iter()
        .filter(|e| !matches!(e, warmstart_plan::Entry::Lookup { .. }))
        .count() as u64;

    // Loaded before the launch is spawned: the held child waits only for
    // its pid to be tracked.
    let waits = if RECORDER && cfg.breakdown {
        match warmstart_record::waits::WaitSession::start() {
            Ok(w) => Some(w),
            Err(e) => {
                report.breakdown_problem = Some(format!("the wait tracer did not start: {e}"));
                None
            }
        }
    } else {
        None
    };

    // The replay runs on its own threads, started before the exec; the
    // sorted strategy waits for it to finish first.
    let launched = std::thread::scope(|s| -> Result<_, Error> {
        let mut running = None;
        let mut done = None;
        let mut held_ms = None;
        let began = report.started_at;
        let mut before_replay_ms = None;
        let mut started = None;
        let mut start = || {
            let t0 = Instant::now();
            started = Some(t0);
            before_replay_ms = began.map(|b| t0.duration_since(b).as_secs_f64() * 1e3);
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
        let recorded = if do_audit {
            let recorded = warmstart_record::record(argv, &cfg.record, |pid| {
                if let Some(w) = &waits {
                    if let Err(e) = w.track(pid) {
                        report.breakdown_problem =
                            Some(format!("the wait tracer could not follow the launch: {e}"));
                    }
                }
                start()
            });
            match recorded {
                Ok(r) => Some(r),
                Err(e @ warmstart_record::Error::Spawn { .. }) => return Err(e.into()),
                // Nothing has run: the launch is prefetched, unaudited.
                Err(e) => {
                    eprintln!(
                        "warmstart: cannot audit this launch ({e}); prefetching it unaudited"
                    );
                    None
                }
            }
        } else {
            None
        };
        let (exit, audit) = if let Some(recorded) = recorded {
            let trace = recorded.failed.is_none().then(|| recorded.trace.clone());
            (
                recorded
                    .wait()
                    .map_err(|e| Error::io(Path::new("wait"), e))?,
                trace,
            )
        } else {
            start();
            // Named by a hint, the program is held until its path is
            // walked, the replay running meanwhile.
            if !named_right() {
                cancel.store(true, Ordering::Relaxed);
                if let Some(h) = running {
                    let _ = h.join();
                }
                return Ok(None);
            }
            held_ms = started.map(|t| t.elapsed().as_secs_f64() * 1e3);
            let (exit, inblock) = plain_launch(argv)?;
            report.app_read_bytes = Some(inblock);
            (exit, None)
        };
        report.held_ms = held_ms;
        report.before_replay_ms = before_replay_ms;
        report.exited_at = Some(Instant::now());
        // Whatever the replay has not issued by now nobody needs.
        cancel.store(true, Ordering::Relaxed);
        if let Some(h) = running {
            done = h.join().ok().flatten();
        }
        Ok(Some((exit, done, audit)))
    })?;
    let Some((exit, replay_report, audit)) = launched else {
        return Ok(None);
    };
    let mut replay_report = replay_report;
    if let Some(w) = waits {
        let collected = w.finish();
        // The request log served the breakdown; the JSON report keeps only
        // its summary.
        let issued = replay_report
            .as_mut()
            .map(|r| std::mem::take(&mut r.issued))
            .unwrap_or_default();
        if let Some(e) = &collected.error {
            report.breakdown_problem = Some(format!("the wait tracer stopped early: {e}"));
        }
        if report.breakdown_problem.is_none() {
            report.breakdown = Some(super::breakdown::build(
                plan,
                &collected,
                &issued,
                audit.as_ref(),
            ));
        }
    }

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
    Ok(Some(exit))
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
