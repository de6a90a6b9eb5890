//! Startup windows, the launch history and idle preloading, driven through
//! the event loop's fake source: a made-up `/proc` says when the machine
//! booted, a fake system says what preloading would find and records what
//! it was asked.

use std::sync::atomic::AtomicBool;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::*;
use crate::daemon::foresight::Foresight;
use crate::history::{HistoryFile, DEFAULT_CAPACITY};
use crate::preload::{PlanResidency, PreloadOs};
use crate::startup::{StartupKind, StartupStore};
use warmstart_replay::MemInfo;

/// What the fake system was asked.
#[derive(Default)]
struct Asked {
    started: Vec<String>,
    cancels: usize,
    running: Option<String>,
}

/// Plenty of memory, no pressure, an idle disk, and every plan 1 MiB with
/// nothing of it resident.
struct FakeOs {
    launch: Arc<AtomicBool>,
    asked: Arc<Mutex<Asked>>,
}

impl PreloadOs for FakeOs {
    fn memory(&mut self) -> Option<MemInfo> {
        Some(MemInfo {
            total: 8 << 30,
            available: 6 << 30,
        })
    }
    fn memory_pressure(&mut self) -> Option<f64> {
        Some(0.0)
    }
    fn disk_busy(&mut self) -> bool {
        false
    }
    fn launch_in_progress(&self) -> bool {
        self.launch.load(Ordering::Relaxed)
    }
    fn residency(&mut self, _: &str) -> Option<PlanResidency> {
        Some(PlanResidency {
            resident: 0,
            total: 1 << 20,
        })
    }
    fn start_preload(&mut self, profile: &str) -> Result<(), String> {
        let mut a = self.asked.lock().unwrap();
        a.started.push(profile.to_string());
        a.running = Some(profile.to_string());
        Ok(())
    }
    fn preload_running(&mut self) -> Option<String> {
        self.asked.lock().unwrap().running.clone()
    }
    fn cancel_preload(&mut self) {
        let mut a = self.asked.lock().unwrap();
        a.cancels += 1;
        a.running = None;
    }
}

/// A `/proc` with an uptime (seconds) and a meminfo.
fn fake_proc(dir: &Path, uptime_s: f64) -> std::path::PathBuf {
    let p = dir.join("proc");
    std::fs::create_dir_all(&p).unwrap();
    std::fs::write(p.join("uptime"), format!("{uptime_s:.2} 1.00\n")).unwrap();
    std::fs::write(
        p.join("meminfo"),
        "MemTotal:       8388608 kB\nMemAvailable:   6291456 kB\n",
    )
    .unwrap();
    p
}

/// Gives the harness's loop a foresight over a fake `/proc` (booted
/// `uptime_s` ago) and the fake system; tells it the daemon started.
fn attach(h: &mut Harness, uptime_s: f64) -> Arc<Mutex<Asked>> {
    // The daemon before this one has saved its history.
    h.lp.foresight.flush_history();
    let proc_root = fake_proc(h.dir.path(), uptime_s);
    let launch = Arc::new(AtomicBool::new(false));
    let asked = Arc::new(Mutex::new(Asked::default()));
    let os = FakeOs {
        launch: Arc::clone(&launch),
        asked: Arc::clone(&asked),
    };
    let mut f = Foresight::new(
        &h.lp.dcfg,
        h.lp.cfg.compile.clone(),
        &proc_root,
        &h.dir.path().join("run"),
        Box::new(os),
        launch,
        PRELOAD_EVERY,
        &mut std::io::sink(),
    );
    f.daemon_started(&h.lp.learners, &mut std::io::sink());
    h.lp.foresight = f;
    asked
}

/// The preloader's round in these tests.
const PRELOAD_EVERY: Duration = Duration::from_millis(10);

/// Waits up to 5 s for `cond`, stepping the loop meanwhile.
fn wait_for(h: &mut Harness, what: &str, cond: impl Fn(&Harness) -> bool) {
    let end = Instant::now() + Duration::from_secs(5);
    while !cond(h) {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(PRELOAD_EVERY);
        h.step(vec![]);
    }
}

fn quick_startups(d: &mut DaemonConfig) {
    d.startup.quiet_s = 0.2;
    d.startup.max_s = 5.0;
    // The test's programs are not followed: the startup wants them anyway.
    d.deny.push(SLEEP.into());
}

#[test]
fn a_boot_records_its_execs_and_its_plan_is_replayed_after_two() {
    let mut h = harness(quick_startups);
    let data = h.data_file("boot.so", 256);
    let startups = StartupStore::new(&h.lp.dcfg.state_dir, &h.lp.dcfg.startup);
    for boot in 0..3 {
        attach(&mut h, 3.0);
        assert!(h.lp.foresight.recording(), "boot {boot}: window open");
        if boot == 2 {
            wait_for(&mut h, "the plan replayed", |h| {
                h.lp.status.foresight.startup_replays == 1
            });
        } else {
            h.step(vec![]);
            assert_eq!(h.lp.status.foresight.startup_replays, 0, "no plan yet");
        }
        let pid = h.launch(Path::new(SLEEP), &["sleep", "600"], &data, 32, false);
        assert!(
            !h.lp.src.untracked.contains(&pid),
            "an ignored exec stays tracked while a startup is recorded"
        );
        assert!(h.lp.foresight.recording());
        std::thread::sleep(Duration::from_millis(250));
        h.step(vec![]);
        assert!(!h.lp.foresight.recording(), "closed after quiet_s");
        assert!(h.lp.src.untracked.contains(&pid), "untracked at the close");
        h.lp.learners.wait_idle();
        let plan = startups.plan(StartupKind::Boot, &h.lp.cfg.compile).plan;
        assert_eq!(plan.is_some(), boot >= 1, "after boot {boot}");
        if let Some(p) = plan {
            assert!(p.data_bytes() >= 32 * 4096, "{}", p.data_bytes());
        }
    }
    assert_eq!(h.lp.status.foresight.startups_recorded, 1);
}

#[test]
fn a_login_opens_a_window_and_launches_ending_in_it_stay_tracked_until_it_closes() {
    let mut h = harness(|d| {
        d.startup.quiet_s = 0.2;
        d.startup.max_s = 5.0;
    });
    attach(&mut h, 3600.0);
    let data = h.data_file("lib.so", 256);
    // A launch from before the login.
    let before = h.launch(Path::new(SLEEP), &["sleep", "600"], &data, 16, false);
    assert!(!h.lp.foresight.recording());
    log_in(&mut h, 7);
    assert!(h.lp.foresight.recording(), "a login's window");
    assert_eq!(
        h.lp.status.foresight.startup_window.as_deref(),
        Some("login")
    );
    h.exit(before);
    assert!(!h.lp.sessions.contains_key(&before), "the launch ended");
    assert!(
        !h.lp.src.untracked.contains(&before),
        "the startup still records it"
    );
    std::thread::sleep(Duration::from_millis(250));
    h.step(vec![]);
    assert!(!h.lp.foresight.recording());
    assert!(
        h.lp.src.untracked.contains(&before),
        "untracked at the close"
    );
}

/// A process of the new login session `session` exec's (the fake `/proc`
/// says so; the fake `/run` has no logind, so every audit session counts).
fn log_in(h: &mut Harness, session: u32) {
    let login = h.process();
    let pdir = h.dir.path().join("proc").join(login.to_string());
    std::fs::create_dir_all(&pdir).unwrap();
    std::fs::write(pdir.join("sessionid"), session.to_string()).unwrap();
    h.step(vec![Event::Exec {
        uid: me_uid(),
        tgid: login,
        ts_ns: monotonic_ns(),
        file: file_info(Path::new("/usr/bin/true")),
        argv: Some(vec!["true".into(), "login".into()]),
    }]);
}

#[test]
fn a_boot_reads_the_login_plan_ahead_of_the_login() {
    for ahead in [true, false] {
        let mut h = harness(|d| {
            quick_startups(d);
            d.startup.login_at_boot = ahead;
        });
        let data = h.data_file("session.so", 256);
        attach(&mut h, 3600.0);
        // Two logins read the same pages: a login plan.
        for session in [7, 8] {
            log_in(&mut h, session);
            assert_eq!(
                h.lp.status.foresight.startup_window.as_deref(),
                Some("login")
            );
            h.launch(Path::new(SLEEP), &["sleep", "600"], &data, 32, false);
            std::thread::sleep(Duration::from_millis(250));
            h.step(vec![]);
            assert!(!h.lp.foresight.recording());
            h.lp.learners.wait_idle();
        }
        let startups = StartupStore::new(&h.lp.dcfg.state_dir, &h.lp.dcfg.startup);
        assert!(startups
            .plan(StartupKind::Login, &h.lp.cfg.compile)
            .plan
            .is_some());
        assert!(startups
            .plan(StartupKind::Boot, &h.lp.cfg.compile)
            .plan
            .is_none());
        // A boot, with no boot plan yet: the login plan is read at once.
        attach(&mut h, 3.0);
        if ahead {
            wait_for(&mut h, "the login plan replayed at the boot", |h| {
                h.lp.status.foresight.startup_replays == 1
            });
        } else {
            std::thread::sleep(Duration::from_millis(300));
            h.step(vec![]);
            assert_eq!(h.lp.status.foresight.startup_replays, 0);
        }
    }
}

#[test]
fn a_daemon_restarted_long_after_boot_opens_no_window() {
    let mut h = harness(quick_startups);
    attach(&mut h, 3600.0);
    assert!(!h.lp.foresight.recording());
    let mut h = harness(|d| {
        quick_startups(d);
        d.startup.enabled = false;
    });
    attach(&mut h, 3.0);
    assert!(!h.lp.foresight.recording(), "[startup] enabled = false");
}

#[test]
fn a_launch_is_kept_in_the_history_and_ranked() {
    let mut h = harness(|_| {});
    attach(&mut h, 3600.0);
    let data = h.data_file("lib.so", 256);
    let pid = h.launch(Path::new(SLEEP), &["sleep", "600"], &data, 16, true);
    h.lp.foresight.flush_history();
    let name = profile_name(&["sleep".into(), "600".into()]);
    let (file, warning) = HistoryFile::load(&h.lp.dcfg.state_dir, DEFAULT_CAPACITY);
    assert_eq!(warning, None);
    let launches: Vec<_> = file
        .history()
        .events()
        .filter_map(|e| match e {
            warmstart_predict::Event::Launch(l) => Some(l.profile.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(launches, vec![name.clone()], "pid {pid}");
    let rank = h.lp.foresight.predictor.lock().unwrap().rank();
    assert_eq!(
        rank.first().map(|c| c.profile.as_str()),
        Some(name.as_str())
    );
    // A daemon started again ranks it from the file.
    attach(&mut h, 3600.0);
    let rank = h.lp.foresight.predictor.lock().unwrap().rank();
    assert_eq!(
        rank.first().map(|c| c.profile.as_str()),
        Some(name.as_str())
    );
    // Forgotten: out of the predictions.
    h.lp.shared.forgotten().push(name.clone());
    h.step(vec![]);
    assert!(h.lp.foresight.predictor.lock().unwrap().rank().is_empty());
}

#[test]
fn an_exec_chain_is_one_launch_of_its_last_program() {
    let mut h = harness(|_| {});
    attach(&mut h, 3600.0);
    let pid = h.process();
    for (exe, argv) in [(SLEEP, ["sleep", "600"]), ("/usr/bin/true", ["true", "x"])] {
        h.step(vec![Event::Exec {
            uid: me_uid(),
            tgid: pid,
            ts_ns: monotonic_ns(),
            file: file_info(Path::new(exe)),
            argv: Some(argv.iter().map(|s| s.to_string()).collect()),
        }]);
    }
    h.exit(pid);
    h.lp.foresight.flush_history();
    let (file, _) = HistoryFile::load(&h.lp.dcfg.state_dir, DEFAULT_CAPACITY);
    let launches: Vec<String> = file
        .history()
        .events()
        .filter_map(|e| match e {
            warmstart_predict::Event::Launch(l) => Some(l.profile.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(launches, vec![profile_name(&["true".into(), "x".into()])]);
}

#[test]
fn nothing_is_preloaded_while_a_launch_runs() {
    let mut h = harness(|_| {});
    let asked = attach(&mut h, 3600.0);
    let data = h.data_file("lib.so", 256);
    let name = profile_name(&["sleep".into(), "600".into()]);
    let pid = h.launch(Path::new(SLEEP), &["sleep", "600"], &data, 16, false);
    for _ in 0..10 {
        std::thread::sleep(PRELOAD_EVERY);
        h.step(vec![]);
    }
    assert!(
        asked.lock().unwrap().started.is_empty(),
        "launch in progress"
    );
    assert_eq!(h.lp.status.foresight.preload_state, "launch_in_progress");
    h.exit(pid);
    wait_for(&mut h, "a preload", |h| h.lp.status.foresight.preloads == 1);
    assert_eq!(asked.lock().unwrap().started, vec![name.clone()], "idle");
    let st = &h.lp.status.foresight;
    assert_eq!(
        st.predictions.first().map(|p| p.profile.as_str()),
        Some(name.as_str())
    );
    assert!(st.budget_bytes > 0);
    // The next launch stops the preload at once, and judges it: the fake
    // page cache never holds anything, so it went unused.
    let cancels = asked.lock().unwrap().cancels;
    h.launch(Path::new(SLEEP), &["sleep", "600"], &data, 16, true);
    wait_for(&mut h, "the preload judged", |h| {
        h.lp.status.foresight.preloads_unused == 1
    });
    assert!(
        asked.lock().unwrap().cancels > cancels,
        "cancelled at the launch"
    );
    let st = &h.lp.status.foresight;
    assert_eq!(st.preloads_used, 0);
    assert_eq!(st.precision, Some(0.0));
}

#[test]
fn config_keys_switch_prediction_and_preloading_off() {
    let mut h = harness(|d| d.preload.enabled = false);
    let asked = attach(&mut h, 3600.0);
    let data = h.data_file("lib.so", 256);
    h.launch(Path::new(SLEEP), &["sleep", "600"], &data, 16, true);
    wait_for(&mut h, "predictions", |h| {
        h.lp.status.foresight.predictions.len() == 1
    });
    assert!(asked.lock().unwrap().started.is_empty(), "[preload] off");
    assert_eq!(h.lp.status.foresight.preload_state, "disabled");

    let mut h = harness(|d| d.predict_launches = false);
    let asked = attach(&mut h, 3600.0);
    let data = h.data_file("lib.so", 256);
    h.launch(Path::new(SLEEP), &["sleep", "600"], &data, 16, true);
    for _ in 0..10 {
        std::thread::sleep(PRELOAD_EVERY);
        h.step(vec![]);
    }
    h.lp.learners.wait_idle();
    assert!(
        asked.lock().unwrap().started.is_empty(),
        "nothing predicted"
    );
    assert!(!HistoryFile::path_in(&h.lp.dcfg.state_dir).exists());
    assert!(h.lp.status.foresight.predictions.is_empty());
    assert_eq!(h.lp.status.foresight.preload_state, "disabled");
}

#[test]
fn state_names_are_the_preloaders_own() {
    use crate::preload::State;
    for s in [
        State::Disabled,
        State::Idle,
        State::LaunchInProgress,
        State::MemoryPressure,
        State::DiskBusy,
        State::LowMemory,
        State::OverBudget,
        State::Preloading,
    ] {
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json.as_str(), Some(crate::daemon::idle::state_name(&s)));
    }
}

/// The uid the test's launches run as.
fn me_uid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

#[test]
fn the_history_is_saved_in_batches_and_when_the_daemon_stops() {
    use crate::daemon::foresight::{write_history, HistoryWrite};
    let d = tempfile::tempdir().unwrap();
    let (file, _) = HistoryFile::load(d.path(), DEFAULT_CAPACITY);
    let (tx, rx) = std::sync::mpsc::channel();
    let every = Duration::from_secs(1);
    let writer = std::thread::spawn(move || write_history(file, rx, every));
    let saved = || {
        std::fs::read_to_string(d.path().join(crate::history::HISTORY_FILE))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("app-"))
            .count()
    };
    let until = |n: usize| {
        let t = Instant::now();
        while saved() < n && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        saved()
    };
    let launch = |n: u64| {
        HistoryWrite::Event(warmstart_predict::Event::Launch(
            warmstart_predict::Launch {
                profile: format!("app-{n}"),
                at_ms: 1_000 + n,
                session: 0,
            },
        ))
    };
    // The first launch is saved at once, the next ones together, a
    // second later.
    tx.send(launch(1)).unwrap();
    assert_eq!(until(1), 1);
    let t = Instant::now();
    tx.send(launch(2)).unwrap();
    tx.send(launch(3)).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(saved(), 1, "saved again within a second");
    assert_eq!(until(3), 3);
    assert!(
        t.elapsed() >= Duration::from_millis(800),
        "{:?}",
        t.elapsed()
    );
    // The daemon stops: what is left is saved.
    tx.send(launch(4)).unwrap();
    drop(tx);
    writer.join().unwrap();
    assert_eq!(saved(), 4);
}
