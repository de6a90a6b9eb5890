//! The event loop driven by a scripted event source: which launches are
//! followed, learned, left alone, prefetched; what finishing one writes.
//! The processes are real (a `sleep` per launch, for `/proc/PID/cwd`);
//! their events are made up, so nothing here needs root or BPF.

use std::collections::{BTreeSet, VecDeque};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Child, Command};

use warmstart_bpf::{FileInfo, PageKind, WsPath};
use warmstart_replay::monotonic_ns;

use super::*;
use crate::daemon::cache::Cache;
use crate::daemon::control::{handle, Reply, Request};
use crate::daemon::policy::Trivial;
use crate::daemon::{config, manager_config, LearnMode};
use crate::profile_name;
use crate::store::Phase;

/// A scripted [`EventSource`]: hands out one batch per poll, and keeps
/// what the loop asked the kernel side to follow.
#[derive(Default)]
struct Fake {
    batches: VecDeque<Vec<Event>>,
    /// Followed processes: `true` with their pages.
    tracked: HashMap<u32, bool>,
    untracked: Vec<u32>,
    /// Programs the kernel side was told to leave alone, and for how long.
    quiet: Vec<(QuietExe, Duration)>,
    quiet_on: bool,
}

impl EventSource for Fake {
    fn poll(&mut self, _timeout: Duration, out: &mut Vec<Event>) -> Result<(), Error> {
        out.extend(self.batches.pop_front().unwrap_or_default());
        Ok(())
    }
    fn track(&mut self, tgid: u32, pages: bool) {
        self.tracked.insert(tgid, pages);
    }
    fn untrack(&mut self, tgid: u32) {
        self.tracked.remove(&tgid);
        self.untracked.push(tgid);
    }
    fn drops(&self) -> u64 {
        0
    }
    fn quiet(&mut self, q: &QuietExe, hold: Duration) {
        self.quiet.push((q.clone(), hold));
    }
    fn clear_quiet(&mut self) {
        self.quiet.clear();
    }
    fn set_quiet(&mut self, on: bool) {
        self.quiet_on = on;
    }
    fn quieted(&self) -> u64 {
        0
    }
}

/// A loop over a fake source, a temporary state directory, and the
/// processes standing in for launches (killed at the end).
struct Harness {
    lp: Loop<Fake>,
    dir: tempfile::TempDir,
    procs: Vec<Child>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        for c in &mut self.procs {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn harness(tune: impl FnOnce(&mut DaemonConfig)) -> Harness {
    // On a disk, not tmpfs, whose pages cannot be evicted (`evict`).
    let dir = tempfile::Builder::new().tempdir_in("/var/tmp").unwrap();
    let mut dcfg = DaemonConfig {
        skip_services: false,
        replay_at_execve: false,
        state_dir: dir.path().join("state"),
        min_learn_ms: 0,
        min_launch_kib: 64,
        idle_s: 60.0,
        timeout_s: 120.0,
        ..Default::default()
    };
    tune(&mut dcfg);
    let store = Store::open(&dcfg.state_dir).unwrap();
    let cfg = manager_config(&dcfg, &mut std::io::sink());
    let shared = Arc::new(Shared::new(
        DaemonStatus::default(),
        BTreeSet::new(),
        Cache::with_budget(dcfg.plan_memory_mib << 20),
    ));
    // Nobody checks the cache here: a check request goes nowhere.
    let (check, _) = std::sync::mpsc::channel();
    let learners = Arc::new(Learners::new(dcfg.learn_workers, Learners::QUEUE).unwrap());
    let mut lp = Loop::new(
        Fake::default(),
        dcfg,
        cfg,
        store,
        shared,
        check,
        learners,
        Realtime::disabled(),
        DaemonStatus::default(),
    );
    // The launches here are this test binary's children.
    lp.skip_wrapped = false;
    Harness {
        lp,
        dir,
        procs: Vec::new(),
    }
}

/// What the recorder reports for a file.
fn file_info(path: &Path) -> FileInfo {
    let m = std::fs::metadata(path).unwrap();
    let dev = libc::major(m.dev()) << 20 | libc::minor(m.dev());
    FileInfo {
        dev,
        ino: m.ino(),
        mode: m.mode(),
        size: m.size(),
        path: ws_path(path),
    }
}

/// A path as the kernel side reports it: components, basename first.
fn ws_path(path: &Path) -> WsPath {
    let mut components: Vec<String> = path
        .iter()
        .skip(1)
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    components.reverse();
    WsPath {
        components,
        truncated: false,
    }
}

impl Harness {
    /// A live process to stand for a launch.
    fn process(&mut self) -> u32 {
        let c = Command::new("sleep").arg("600").spawn().unwrap();
        let pid = c.id();
        self.procs.push(c);
        pid
    }

    /// A file of `kib` KiB in the test's directory.
    fn data_file(&self, name: &str, kib: usize) -> std::path::PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, vec![7u8; kib * 1024]).unwrap();
        p
    }

    /// Drops `path`'s pages from the page cache, so that a plan reading it
    /// is not found cached (and not left unreplayed, see `Start::Cached`).
    fn evict(&self, path: &Path) {
        let f = std::fs::File::open(path).unwrap();
        f.sync_all().unwrap();
        warmstart_sys::fadvise::dontneed(&f, 0, 0).unwrap();
    }

    /// One batch of events, and the loop's pass over it.
    fn step(&mut self, events: Vec<Event>) {
        self.lp.src.batches.push_back(events);
        self.lp.step().unwrap();
    }

    /// A launch of `exe` with `argv` by a new process: its exec, then an
    /// open and `pages` pages of `data`, then (if `exit`) its exit, each a
    /// batch. Returns its pid.
    fn launch(&mut self, exe: &Path, argv: &[&str], data: &Path, pages: u64, exit: bool) -> u32 {
        let pid = self.process();
        let now = monotonic_ns();
        self.step(vec![Event::Exec {
            uid: me_uid(),
            tgid: pid,
            ts_ns: now,
            file: file_info(exe),
            argv: Some(argv.iter().map(|s| s.to_string()).collect()),
        }]);
        let file = file_info(data);
        let mut io = vec![Event::Open {
            tgid: pid,
            ts_ns: now + 1,
            file: file.clone(),
        }];
        io.extend((0..pages).map(|i| Event::Page {
            kind: PageKind::Read,
            pid,
            tgid: pid,
            ts_ns: now + 2 + i,
            dev: file.dev,
            ino: file.ino,
            index: i,
            count: 1,
        }));
        self.step(io);
        if exit {
            self.exit(pid);
        }
        pid
    }

    fn exit(&mut self, pid: u32) {
        self.step(vec![Event::Exit {
            tgid: pid,
            ts_ns: monotonic_ns(),
        }]);
        self.lp.learners.wait_idle();
    }

    fn profiles(&self) -> Vec<String> {
        self.lp.store.names().unwrap()
    }
}

const SLEEP: &str = "/usr/bin/sleep";

#[test]
fn a_program_is_learned_then_prefetched_with_its_plan() {
    let mut h = harness(|_| {});
    let data = h.data_file("lib.so", 512);
    let exe = Path::new(SLEEP);
    let nrawseq = h.lp.cfg.nrawseq;
    for i in 0..nrawseq {
        let pid = h.launch(exe, &["sleep", "600"], &data, 128, false);
        assert_eq!(
            h.lp.src.tracked.get(&pid),
            Some(&true),
            "learning records pages"
        );
        assert!(h.lp.sessions.contains_key(&pid));
        h.exit(pid);
        assert!(!h.lp.src.tracked.contains_key(&pid), "untracked at its end");
        let name = profile_name(&["sleep".into(), "600".into()]);
        let prof = h.lp.store.load(&name).unwrap().unwrap();
        let want = if i + 1 < nrawseq {
            Phase::Learning
        } else {
            Phase::Prefetching
        };
        assert_eq!(prof.phase, want, "after launch {}", i + 1);
    }
    assert_eq!(h.lp.status.launches_learned, nrawseq as u64);
    // The plan is in memory: the next launch is decided and its replay
    // started without reading the state directory.
    let name = profile_name(&["sleep".into(), "600".into()]);
    let known = h.lp.shared.cache.get(&name).unwrap();
    assert_eq!(known.phase, Phase::Prefetching);
    let plan = known.plan.expect("plan in memory").0;
    assert!(plan.data_bytes() >= 128 * 4096, "{}", plan.data_bytes());
    std::fs::remove_file(h.lp.store.plan_path(&name)).unwrap();
    let pid = h.launch(exe, &["sleep", "600"], &data, 128, false);
    match &h.lp.sessions[&pid].mode {
        Mode::Prefetching {
            replay,
            audited,
            relearn,
            ..
        } => {
            assert!(replay.is_some(), "replay started");
            assert!(*audited, "a new plan's first launch is audited");
            assert!(!relearn);
        }
        Mode::Learning => panic!("a prefetching profile's launch is prefetched"),
    }
    assert_eq!(h.lp.src.tracked.get(&pid), Some(&true), "audited: recorded");
    assert!(
        h.lp.status.exec_to_replay_us[2] > 0.0,
        "exec to replay measured"
    );
}

#[test]
fn a_launch_whose_plan_is_cached_is_not_replayed() {
    let mut h = harness(|_| {});
    let data = h.data_file("lib.so", 512);
    let exe = Path::new(SLEEP);
    let argv = ["sleep", "600"];
    for _ in 0..h.lp.cfg.nrawseq {
        let pid = h.launch(exe, &argv, &data, 128, false);
        h.exit(pid);
    }
    let replayed = |h: &Harness, pid: u32| match &h.lp.sessions[&pid].mode {
        Mode::Prefetching { replay, cached, .. } => {
            assert_eq!(replay.is_none(), *cached);
            replay.is_some()
        }
        Mode::Learning => panic!("a prefetching profile's launch is prefetched"),
    };
    // The new plan's first launch is audited: replayed, cached or not.
    let pid = h.launch(exe, &argv, &data, 128, false);
    assert!(replayed(&h, pid), "an audit is replayed all the same");
    h.exit(pid);
    // Its data is in the page cache: nothing to replay.
    let pid = h.launch(exe, &argv, &data, 128, false);
    assert!(!replayed(&h, pid), "a cached plan is not replayed");
    h.exit(pid);
    assert_eq!(h.lp.status.launches_cached, 1);
    // Evicted, it is replayed again.
    h.evict(&data);
    let pid = h.launch(exe, &argv, &data, 128, false);
    assert!(replayed(&h, pid), "an evicted plan is replayed");
    h.exit(pid);
    assert_eq!(h.lp.status.launches_cached, 1);
    assert_eq!(h.lp.status.launches_prefetched, 3);
}

#[test]
fn policy_decides_which_execs_are_followed() {
    // (exe, allow-list, deny extra, followed)
    let cases: [(&str, Option<&str>, Option<&str>, bool); 6] = [
        ("/usr/bin/sleep", None, None, true),
        ("/usr/sbin/sshd", None, None, false),
        ("/usr/lib/systemd/systemd-logind", None, None, false),
        ("/usr/bin/sleep", Some("/opt/*"), None, false),
        ("/opt/app/bin", Some("/opt/*"), None, true),
        ("/usr/bin/sleep", None, Some("/usr/bin/*"), false),
    ];
    for (exe, allow, deny, followed) in cases {
        let mut h = harness(|d| {
            if let Some(a) = allow {
                d.learn = LearnMode::AllowList;
                d.allow = vec![a.into()];
            }
            if let Some(x) = deny {
                d.deny.push(x.into());
            }
        });
        let pid = h.process();
        // The event names the binary; its identity is the real sleep's.
        let mut file = file_info(Path::new(SLEEP));
        file.path = ws_path(Path::new(exe));
        h.step(vec![Event::Exec {
            uid: me_uid(),
            tgid: pid,
            ts_ns: monotonic_ns(),
            file,
            argv: Some(vec![exe.into(), "600".into()]),
        }]);
        let what = format!("{exe} allow {allow:?} deny {deny:?}");
        assert_eq!(h.lp.sessions.contains_key(&pid), followed, "{what}");
        assert_eq!(h.lp.src.tracked.contains_key(&pid), followed, "{what}");
        assert_eq!(h.lp.status.ignored, u64::from(!followed), "{what}");
        assert_eq!(h.lp.status.execs_seen, 1);
    }
}

#[test]
fn children_belong_to_their_launch_and_the_daemon_is_never_followed() {
    let mut h = harness(|_| {});
    let data = h.data_file("lib.so", 64);
    let pid = h.launch(Path::new(SLEEP), &["sleep", "600"], &data, 4, false);
    let child = h.process();
    // The launch forks and the child execs: the launch's, not a new one.
    h.step(vec![
        Event::Fork {
            parent_tgid: pid,
            child_tgid: child,
            ts_ns: monotonic_ns(),
            comm: "sleep".into(),
        },
        Event::Exec {
            uid: me_uid(),
            tgid: child,
            ts_ns: monotonic_ns(),
            file: file_info(Path::new(SLEEP)),
            argv: Some(vec!["sleep".into(), "1".into()]),
        },
    ]);
    assert_eq!(h.lp.sessions.len(), 1);
    assert_eq!(h.lp.owner.get(&child), Some(&pid));
    assert!(h.lp.sessions[&pid].members.contains(&child));
    // The tree ends when every process in it exited.
    h.step(vec![Event::Exit {
        tgid: pid,
        ts_ns: monotonic_ns(),
    }]);
    assert!(h.lp.sessions.contains_key(&pid), "its child still runs");
    h.exit(child);
    assert!(h.lp.sessions.is_empty());
    // The daemon's own execs are never a launch.
    let me = h.lp.me;
    h.step(vec![Event::Exec {
        uid: me_uid(),
        tgid: me,
        ts_ns: monotonic_ns(),
        file: file_info(Path::new(SLEEP)),
        argv: Some(vec!["warmstart".into()]),
    }]);
    assert!(h.lp.sessions.is_empty());
}

#[test]
fn a_storm_of_trivial_launches_creates_no_profile() {
    // A generous duration bound: a loaded test machine must not make the
    // made-up launches look long (the default's figures are checked in
    // `policy`).
    let mut h = harness(|d| {
        d.min_learn_ms = 10_000;
        d.min_learn_kib = config::DEFAULT_MIN_LEARN_KIB;
    });
    let data = h.data_file("libc.so", 64);
    let exe = Path::new("/usr/bin/true");
    // The first launch is recorded, found trivial (a few pages, ended at
    // once) and dropped; the storm after it is not even recorded.
    let first = h.launch(exe, &["true"], &data, 8, true);
    assert!(h.lp.src.untracked.contains(&first));
    for _ in 0..20 {
        let pid = h.launch(exe, &["true"], &data, 8, true);
        assert!(!h.lp.src.tracked.contains_key(&pid), "not followed");
    }
    assert_eq!(h.profiles(), Vec::<String>::new());
    assert_eq!(h.lp.status.launches_learned, 1);
    assert_eq!(h.lp.status.ignored, 20);
    assert_eq!(h.lp.status.trivial_programs, 1);
    // The kernel side was told to leave the program alone, by the
    // identity of its binary, for as long as it is held.
    let id = file_info(exe);
    assert!(h.lp.src.quiet_on);
    assert_eq!(h.lp.src.quiet.len(), 1, "{:?}", h.lp.src.quiet);
    let (q, hold) = &h.lp.src.quiet[0];
    assert_eq!((q.dev, q.ino), (id.dev, id.ino));
    assert!(*hold > Trivial::HOLD - Duration::from_secs(60) && *hold <= Trivial::HOLD);
    // A trivial inline script does not quiet its interpreter.
    let py = Path::new("/usr/bin/python3");
    if py.exists() {
        h.launch(py, &["python3", "-c", "pass"], &data, 8, true);
        h.step(vec![]);
        assert_eq!(h.lp.src.quiet.len(), 1, "{:?}", h.lp.src.quiet);
    }
    // A launch that uses enough data is learned even if short.
    let big = h.data_file("big.so", 8192);
    h.launch(Path::new(SLEEP), &["sleep", "600"], &big, 2048, true);
    assert_eq!(h.profiles().len(), 1);
    // Asked for by name, a trivial program is learned after all.
    let reply = handle(
        Request::Learn {
            exe: "/usr/bin/true".into(),
            argv: vec!["true".into()],
            cwd: "/".into(),
        },
        &h.lp.shared,
        &h.lp.store,
        &h.lp.dcfg,
        &h.lp.cfg,
    );
    assert!(matches!(reply, Reply::Learned { .. }), "{reply:?}");
    // The kernel side forgets it at once, so its next exec is seen.
    h.step(vec![]);
    assert!(
        !h.lp.src.quiet.iter().any(|(q, _)| q.ino == id.ino),
        "{:?}",
        h.lp.src.quiet
    );
    let pid = h.launch(exe, &["true"], &data, 8, false);
    assert_eq!(h.lp.src.tracked.get(&pid), Some(&true));
    h.exit(pid);
    assert_eq!(h.profiles().len(), 2);
}

#[test]
fn a_launch_forgotten_while_it_ran_is_not_written_back() {
    let mut h = harness(|_| {});
    let data = h.data_file("lib.so", 256);
    let name = profile_name(&["sleep".into(), "600".into()]);
    let pid = h.launch(Path::new(SLEEP), &["sleep", "600"], &data, 32, false);
    let first = h.launch(Path::new(SLEEP), &["sleep", "600"], &data, 32, true);
    assert_ne!(pid, first);
    assert_eq!(h.profiles(), vec![name.clone()]);
    let reply = handle(
        Request::Forget {
            names: vec![name.clone()],
            all: false,
        },
        &h.lp.shared,
        &h.lp.store,
        &h.lp.dcfg,
        &h.lp.cfg,
    );
    assert!(matches!(&reply, Reply::Forgot { forgotten, .. } if *forgotten == vec![name.clone()]));
    h.exit(pid);
    assert_eq!(h.profiles(), Vec::<String>::new(), "not brought back");
}

/// The learner's thread that is blocked in `open` on a FIFO, if any.
fn learner_in_open() -> bool {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return false;
    };
    tasks.flatten().any(|t| {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let call = std::fs::read_to_string(t.path().join("syscall")).unwrap_or_default();
        // openat is 257 on x86_64, 56 on aarch64; open is 2 on x86_64.
        let nr = call.split_whitespace().next().unwrap_or("");
        comm.starts_with("ws-learn") && ["257", "56", "2"].contains(&nr)
    })
}

#[test]
fn naming_a_launchs_files_never_holds_the_profile_lock() {
    let mut h = harness(|_| {});
    // The launch "exec'd" a path that is now a FIFO: finding its ELF
    // interpreter opens it (a plain open blocks until a writer comes).
    let fifo = h.dir.path().join("prog");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let pid = h.process();
    let unnamed = file_info(&h.data_file("gone", 4));
    h.step(vec![
        Event::Exec {
            uid: me_uid(),
            tgid: pid,
            ts_ns: monotonic_ns(),
            file: file_info(&fifo),
            argv: Some(vec![fifo.display().to_string()]),
        },
        // A page of a file the launch never opened: naming it looks at
        // the exec'd binaries' interpreters.
        Event::Page {
            kind: PageKind::Read,
            pid,
            tgid: pid,
            ts_ns: monotonic_ns(),
            dev: unnamed.dev,
            ino: unnamed.ino + 1_000_000,
            index: 0,
            count: 1,
        },
    ]);
    assert!(h.lp.sessions.contains_key(&pid));
    h.step(vec![Event::Exit {
        tgid: pid,
        ts_ns: monotonic_ns(),
    }]);
    // Until the learner is in that open (or done, if opens no longer
    // block), the profile lock and the control socket stay usable.
    let deadline = Instant::now() + Duration::from_secs(60);
    while h.lp.learners.pending() > 0 && !learner_in_open() {
        assert!(
            Instant::now() < deadline,
            "the learner never got to the FIFO"
        );
        std::thread::yield_now();
    }
    if h.lp.learners.pending() > 0 {
        assert!(
            h.lp.shared.profiles.try_lock().is_ok(),
            "the profile lock is held while a launch's files are opened"
        );
        let reply = handle(
            Request::Forget {
                names: vec!["nothing".into()],
                all: true,
            },
            &h.lp.shared,
            &h.lp.store,
            &h.lp.dcfg,
            &h.lp.cfg,
        );
        assert!(matches!(reply, Reply::Forgot { .. }), "{reply:?}");
        // Let the open return: a writer that goes away at once.
        let w = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
        drop(w);
    }
    h.lp.learners.wait_idle();
}

#[test]
fn status_counts() {
    let mut h = harness(|_| {});
    h.step(Vec::new());
    let st = h.lp.shared.status.lock().unwrap().clone();
    assert_eq!(
        (st.execs_seen, st.active_sessions, st.learn_queue),
        (0, 0, 0)
    );
}

#[test]
fn a_plan_read_at_launch_is_read_at_normal_priority() {
    use crate::daemon::cache::refresh;
    use crate::daemon::cache::tests::{plan_of, profile_on_disk};
    use crate::daemon::follow::decide;
    let argv: Vec<String> = vec!["sleep".into(), "600".into()];
    let name = profile_name(&argv);
    // (plan memory budget, plan held in memory, the loop left real-time)
    for (budget, in_memory, left_rt) in [(0, true, 0), (1, false, 1)] {
        let mut h = harness(|_| {});
        profile_on_disk(
            &h.lp.store,
            &name,
            Phase::Prefetching,
            Some(&plan_of(8).to_bytes()),
        );
        let cache = Cache::with_budget(budget);
        refresh(&cache, &h.lp.store, &name, &mut std::io::sink());
        assert_eq!(cache.get(&name).unwrap().plan.is_some(), in_memory);
        let shared = Shared::new(DaemonStatus::default(), BTreeSet::new(), cache);
        let (check, _) = std::sync::mpsc::channel();
        let pid = h.process();
        let ctx = Ctx {
            dcfg: &h.lp.dcfg,
            cfg: &h.lp.cfg,
            store: &h.lp.store,
            shared: &shared,
            check: &check,
            me: h.lp.me,
            skip_wrapped: h.lp.skip_wrapped,
        };
        let mut calls = 0;
        let decided = decide(
            &ctx,
            pid,
            // SAFETY: getuid has no preconditions.
            unsafe { libc::getuid() },
            SLEEP,
            Some(&argv),
            &mut None,
            monotonic_ns(),
            &HashMap::new(),
            0,
            &mut || calls += 1,
        );
        let (d, _) = decided.expect("followed");
        match &d.mode {
            Mode::Prefetching { plan, .. } => assert_eq!(plan.entries.len(), 8),
            Mode::Learning => panic!("budget {budget}: not prefetched"),
        }
        stop_replay(&d.mode);
        assert_eq!(calls, left_rt, "budget {budget}");
    }
}

#[test]
fn programs_named_by_an_allow_glob_are_learned_however_small() {
    let mut h = harness(|d| {
        d.min_learn_ms = 10_000;
        d.learn = LearnMode::AllowList;
        d.allow = vec!["/usr/bin/true".into()];
    });
    let data = h.data_file("libc.so", 64);
    h.launch(Path::new("/usr/bin/true"), &["true"], &data, 8, true);
    assert_eq!(h.profiles().len(), 1);
    assert_eq!(h.lp.status.trivial_programs, 0);
}

#[test]
fn a_launch_is_timed_by_the_kernels_clock_not_the_daemons() {
    let mut h = harness(|d| {
        d.min_learn_ms = 1000;
        d.min_learn_kib = 4096;
    });
    let data = h.data_file("lib.so", 64);
    // (ran for, by the kernel's exit time, ms; learned)
    for (ms, learned) in [(5, false), (3000, true)] {
        let exe = h.data_file(&format!("prog{ms}"), 4);
        let pid = h.launch(&exe, &["prog"], &data, 8, false);
        let exec_ns = h.lp.sessions[&pid].first_exec_ns;
        h.step(vec![Event::Exit {
            tgid: pid,
            ts_ns: exec_ns + ms * 1_000_000,
        }]);
        h.lp.learners.wait_idle();
        assert_eq!(h.profiles().len(), usize::from(learned), "{ms} ms");
    }
}

#[path = "foresight_tests.rs"]
mod foresight;

#[path = "registry_tests.rs"]
mod registry;

#[path = "exec_start_tests.rs"]
mod exec_start;

/// The uid the test's launches run as.
fn me_uid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

#[test]
fn a_program_run_execs_in_its_place_is_left_to_run() {
    let mut h = harness(|_| {});
    h.lp.skip_wrapped = true;
    // This test's binary stands in for warmstart.
    let me = std::env::current_exe().unwrap();
    let id = file_info(&me);
    h.lp.own_exes = vec![(std::fs::metadata(&me).unwrap().dev(), id.ino)];
    let data = h.data_file("lib.so", 256);
    let exec = |pid: u32, file: FileInfo, argv: &[&str]| Event::Exec {
        uid: me_uid(),
        tgid: pid,
        ts_ns: monotonic_ns(),
        file,
        argv: Some(argv.iter().map(|s| s.to_string()).collect()),
    };
    // `warmstart run -- sleep 600`, which found its plan resident and
    // exec'd the program in its own process: not a launch of the daemon's.
    let pid = h.process();
    h.step(vec![exec(
        pid,
        id.clone(),
        &["warmstart", "run", "--", "sleep", "600"],
    )]);
    h.step(vec![exec(
        pid,
        file_info(Path::new(SLEEP)),
        &["sleep", "600"],
    )]);
    assert!(h.lp.sessions.is_empty());
    // Its tree stays followed, for forks and exits only: a program it
    // starts is its own, not a launch.
    assert_eq!(h.lp.src.tracked.get(&pid), Some(&false));
    let child = h.process();
    h.step(vec![Event::Fork {
        parent_tgid: pid,
        child_tgid: child,
        ts_ns: monotonic_ns(),
        comm: "sleep".into(),
    }]);
    h.step(vec![exec(
        child,
        file_info(Path::new(SLEEP)),
        &["sleep", "1"],
    )]);
    assert!(h.lp.sessions.is_empty());
    assert_eq!(h.lp.src.tracked.get(&child), Some(&false));
    h.step(vec![Event::Exit {
        tgid: child,
        ts_ns: monotonic_ns(),
    }]);
    assert!(!h.lp.left.contains(&child));
    // Another command of the same binary is no `run`: the process's
    // next program is a launch like any other.
    let other = h.process();
    h.step(vec![exec(other, id, &["warmstart", "--quiet", "status"])]);
    // (That command is no launch either: warmstart is not learned.)
    assert!(!h.lp.sessions.contains_key(&other));
    assert_eq!(h.lp.src.tracked.get(&other), None);
    h.step(vec![exec(
        other,
        file_info(Path::new(SLEEP)),
        &["sleep", "600"],
    )]);
    assert!(h.lp.sessions.contains_key(&other));
    // And a plain launch is followed as before.
    let plain = h.launch(Path::new(SLEEP), &["sleep", "600"], &data, 8, false);
    assert!(h.lp.sessions.contains_key(&plain));
}
