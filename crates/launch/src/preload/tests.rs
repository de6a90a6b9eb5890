//! The preloader's rules against a fake system.

use super::*;
use warmstart_predict::Scores;

const MIB: u64 = 1 << 20;

/// A system whose every answer the test sets. A started preload runs until
/// [`Fake::complete`] reads its plan in.
#[derive(Default)]
struct Fake {
    mem: Option<MemInfo>,
    psi_memory: Option<f64>,
    busy: bool,
    launch: bool,
    plans: HashMap<String, PlanResidency>,
    running: Option<String>,
    started: Vec<String>,
    cancelled: usize,
}

impl Fake {
    /// 1 GiB available of 4 GiB, profiles `a`..`e` with 100 MiB plans,
    /// nothing resident.
    fn new() -> Self {
        let mut f = Fake {
            mem: Some(MemInfo {
                total: 4096 * MIB,
                available: 1024 * MIB,
            }),
            psi_memory: Some(0.0),
            ..Default::default()
        };
        for p in ["a", "b", "c", "d", "e"] {
            f.plan(p, 0, 100 * MIB);
        }
        f
    }

    fn plan(&mut self, profile: &str, resident: u64, total: u64) {
        self.plans
            .insert(profile.into(), PlanResidency { resident, total });
    }

    fn complete(&mut self) {
        let p = self.running.take().expect("a preload runs");
        let r = self.plans.get_mut(&p).unwrap();
        r.resident = r.total;
    }

    fn evict(&mut self, profile: &str) {
        self.plans.get_mut(profile).unwrap().resident = 0;
    }
}

impl PreloadOs for Fake {
    fn memory(&mut self) -> Option<MemInfo> {
        self.mem
    }
    fn memory_pressure(&mut self) -> Option<f64> {
        self.psi_memory
    }
    fn disk_busy(&mut self) -> bool {
        self.busy
    }
    fn launch_in_progress(&self) -> bool {
        self.launch
    }
    fn residency(&mut self, profile: &str) -> Option<PlanResidency> {
        self.plans.get(profile).copied()
    }
    fn start_preload(&mut self, profile: &str) -> Result<(), String> {
        assert!(self.running.is_none(), "one preload at a time");
        self.running = Some(profile.into());
        self.started.push(profile.into());
        Ok(())
    }
    fn preload_running(&mut self) -> Option<String> {
        self.running.clone()
    }
    fn cancel_preload(&mut self) {
        self.running = None;
        self.cancelled += 1;
    }
}

fn ranking(profiles: &[(&str, f64)]) -> Vec<Candidate> {
    profiles
        .iter()
        .map(|(p, score)| Candidate {
            profile: p.to_string(),
            score: *score,
            scores: Scores::default(),
            soon: None,
        })
        .collect()
}

fn cfg() -> PreloadConfig {
    PreloadConfig {
        top: 5,
        memory_floor_mib: Some(256),
        ..Default::default()
    }
}

fn started(actions: &[Action]) -> Vec<&str> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Started { profile, .. } => Some(profile.as_str()),
            _ => None,
        })
        .collect()
}

#[test]
fn preloads_the_best_ranked_within_the_budget() {
    let mut os = Fake::new();
    let mut p = Preloader::new(cfg());
    let r = ranking(&[("a", 0.5), ("b", 0.3), ("c", 0.1), ("d", 0.06)]);
    let mut order = Vec::new();
    for t in 0..10 {
        let acts = p.tick(t * 1000, &r, &mut os);
        order.extend(started(&acts).into_iter().map(String::from));
        // 25% of 1 GiB: never more held than that.
        assert_eq!(p.stats().budget_bytes, 256 * MIB);
        assert!(p.stats().held_bytes <= p.stats().budget_bytes, "tick {t}");
        if os.running.is_some() {
            assert_eq!(p.stats().state, State::Preloading);
            os.complete();
        }
    }
    assert_eq!(order, vec!["a", "b"], "a third 100 MiB plan does not fit");
    assert_eq!(p.stats().state, State::OverBudget);
    assert_eq!(p.stats().held_bytes, 200 * MIB);
    assert_eq!(p.stats().bytes_preloaded, 200 * MIB);
    let shown: Vec<_> = p.stats().predictions.iter().map(|x| x.preloaded).collect();
    assert_eq!(shown, vec![true, true, false, false]);
}

#[test]
fn a_launch_unlikely_before_the_next_boot_is_not_preloaded() {
    let mut os = Fake::new();
    let mut p = Preloader::new(cfg());
    let mut r = ranking(&[("a", 0.5), ("b", 0.3), ("c", 0.2)]);
    // a is the likeliest next launch but the boot is probably over
    // before it comes; b is less likely next but likely soon.
    r[0].soon = Some(0.2);
    r[1].soon = Some(0.7);
    r[2].soon = Some(0.3);
    let mut order = Vec::new();
    for t in 0..5 {
        order.extend(
            started(&p.tick(t * 1000, &r, &mut os))
                .into_iter()
                .map(String::from),
        );
        if os.running.is_some() {
            os.complete();
        }
    }
    assert_eq!(order, vec!["b", "c"]);
    assert_eq!(p.stats().predictions[0].soon, Some(0.2));
}

#[test]
fn a_program_evicted_after_its_launch_is_restored_on_a_lower_bar() {
    let mut os = Fake::new();
    let mut p = Preloader::new(cfg());
    let mut r = ranking(&[("a", 0.5), ("b", 0.3)]);
    // Both are under the bar of a first preload (0.3).
    r[0].soon = Some(0.2);
    r[1].soon = Some(0.2);
    assert!(started(&p.tick(0, &r, &mut os)).is_empty());
    // a is launched (its plan read whole), then the cache is emptied.
    os.plan("a", 100 * MIB, 100 * MIB);
    assert_eq!(p.on_launch("a", 1.0), None, "a was not preloaded");
    os.evict("a");
    let acts = p.tick(1000, &r, &mut os);
    assert_eq!(
        acts,
        vec![Action::Started {
            profile: "a".into(),
            bytes: 100 * MIB,
            again: true
        }],
        "a is restored, b (never cached) is not read"
    );
    assert_eq!(p.stats().rereads, 1);
    os.complete();
    // Below even the restore bar, an evicted program stays evicted.
    os.evict("a");
    r[0].soon = Some(0.1);
    assert!(started(&p.tick(2000, &r, &mut os)).is_empty());
}

#[test]
fn a_smaller_plan_further_down_still_fits() {
    let mut os = Fake::new();
    os.plan("a", 0, 300 * MIB);
    os.plan("b", 0, 10 * MIB);
    let mut p = Preloader::new(cfg());
    let acts = p.tick(0, &ranking(&[("a", 0.5), ("b", 0.3)]), &mut os);
    assert_eq!(started(&acts), vec!["b"]);
}

#[test]
fn only_what_is_missing_is_counted() {
    let mut os = Fake::new();
    os.plan("a", 90 * MIB, 100 * MIB); // resident enough (0.9)
    os.plan("b", 50 * MIB, 100 * MIB);
    let mut p = Preloader::new(cfg());
    let acts = p.tick(0, &ranking(&[("a", 0.5), ("b", 0.3)]), &mut os);
    assert_eq!(
        acts,
        vec![Action::Started {
            profile: "b".into(),
            bytes: 50 * MIB,
            again: false
        }]
    );
}

#[test]
fn nothing_while_a_launch_runs_and_a_running_preload_stops() {
    let mut os = Fake::new();
    os.launch = true;
    let mut p = Preloader::new(cfg());
    let r = ranking(&[("a", 0.5)]);
    assert!(p.tick(0, &r, &mut os).is_empty());
    assert_eq!(p.stats().state, State::LaunchInProgress);
    os.launch = false;
    assert_eq!(started(&p.tick(1000, &r, &mut os)), vec!["a"]);
    os.launch = true;
    let acts = p.tick(2000, &r, &mut os);
    assert_eq!(
        acts,
        vec![Action::Cancelled {
            profile: "a".into(),
            why: State::LaunchInProgress
        }]
    );
    assert_eq!(os.cancelled, 1);
    assert!(os.started.len() == 1);
}

#[test]
fn backs_off_on_memory_pressure_and_a_busy_disk() {
    let mut os = Fake::new();
    let mut p = Preloader::new(cfg());
    let r = ranking(&[("a", 0.5)]);
    os.psi_memory = Some(4.0);
    assert!(p.tick(0, &r, &mut os).is_empty());
    assert_eq!(p.stats().state, State::MemoryPressure);
    os.psi_memory = Some(0.2);
    os.busy = true;
    assert!(p.tick(1000, &r, &mut os).is_empty());
    assert_eq!(p.stats().state, State::DiskBusy);
    os.busy = false;
    assert_eq!(started(&p.tick(2000, &r, &mut os)), vec!["a"]);
    // Pressure while it runs: stopped.
    os.busy = true; // its own reads: not a reason to stop
    assert!(p.tick(3000, &r, &mut os).is_empty());
    os.psi_memory = Some(30.0);
    let acts = p.tick(4000, &r, &mut os);
    assert!(matches!(
        &acts[..],
        [Action::Cancelled {
            why: State::MemoryPressure,
            ..
        }]
    ));
}

#[test]
fn preloads_in_a_row_do_not_wait_for_their_own_reads_to_settle() {
    let mut os = Fake::new();
    let mut p = Preloader::new(cfg());
    os.plan("a", 0, 1 << 20);
    os.plan("b", 0, 1 << 20);
    let r = ranking(&[("a", 0.5), ("b", 0.4)]);
    assert_eq!(started(&p.tick(0, &r, &mut os)), vec!["a"]);
    // Its reads made the disk look busy; once it is done the next one
    // starts at once.
    os.busy = true;
    assert!(p.tick(100, &r, &mut os).is_empty());
    os.complete();
    assert_eq!(started(&p.tick(200, &r, &mut os)), vec!["b"]);
    os.complete();
    // Nothing left to read: the chain ends, and the next preload asks
    // whether the disk is busy again.
    assert!(p.tick(300, &r, &mut os).is_empty());
    os.evict("a");
    assert!(p.tick(400, &r, &mut os).is_empty());
    assert_eq!(p.stats().state, State::DiskBusy);
    // Nor after anything else came between: a launch breaks the chain.
    os.busy = false;
    assert_eq!(started(&p.tick(500, &r, &mut os)), vec!["a"]);
    os.complete();
    os.launch = true;
    assert!(p.tick(600, &r, &mut os).is_empty());
    os.launch = false;
    os.busy = true;
    os.evict("b");
    assert!(p.tick(700, &r, &mut os).is_empty());
    assert_eq!(p.stats().state, State::DiskBusy);
}

#[test]
fn stall_time_between_two_samples() {
    let t0 = std::time::Instant::now();
    let t1 = t0 + std::time::Duration::from_secs(1);
    assert_eq!(stall_percent((t0, 1_000), (t1, 251_000)), Some(25.0));
    assert_eq!(
        stall_percent((t0, 0), (t0 + std::time::Duration::from_millis(50), 10)),
        None,
        "too short"
    );
    // A counter that went back (never, but not a panic) is no stall.
    assert_eq!(stall_percent((t0, 9), (t1, 1)), Some(0.0));
}

#[test]
fn never_below_the_memory_floor() {
    let mut os = Fake::new();
    os.mem = Some(MemInfo {
        total: 4096 * MIB,
        available: 300 * MIB,
    });
    let mut p = Preloader::new(cfg()); // floor 256 MiB: 44 MiB of room
    let r = ranking(&[("a", 0.5)]);
    assert!(p.tick(0, &r, &mut os).is_empty());
    assert_eq!(p.stats().state, State::OverBudget);
    os.mem = None;
    assert!(p.tick(1000, &r, &mut os).is_empty());
    assert_eq!(p.stats().state, State::LowMemory);
    os.mem = Some(MemInfo {
        total: 4096 * MIB,
        available: 200 * MIB,
    });
    assert!(p.tick(2000, &r, &mut os).is_empty());
    assert_eq!(p.stats().state, State::LowMemory);
}

#[test]
fn low_scores_plans_missing_and_switched_off() {
    let mut os = Fake::new();
    os.plans.remove("a");
    let mut p = Preloader::new(cfg());
    // a has no plan, b scores too low.
    let r = ranking(&[("a", 0.5), ("b", 0.01)]);
    assert!(p.tick(0, &r, &mut os).is_empty());
    assert_eq!(p.stats().state, State::Idle);
    assert_eq!(p.stats().predictions[0].resident, None);
    let mut off = Preloader::new(PreloadConfig {
        enabled: false,
        ..cfg()
    });
    assert!(off.tick(0, &ranking(&[("c", 0.9)]), &mut os).is_empty());
    assert_eq!(off.stats().state, State::Disabled);
    assert_eq!(off.stats().predictions.len(), 1, "predictions still shown");
}

#[test]
fn an_evicted_preload_is_read_again() {
    let mut os = Fake::new();
    let mut p = Preloader::new(cfg());
    let r = ranking(&[("a", 0.5)]);
    assert_eq!(started(&p.tick(0, &r, &mut os)), vec!["a"]);
    os.complete();
    assert!(p.tick(1000, &r, &mut os).is_empty());
    assert_eq!(p.stats().held_bytes, 100 * MIB);
    os.evict("a");
    let acts = p.tick(2000, &r, &mut os);
    assert_eq!(
        acts,
        vec![Action::Started {
            profile: "a".into(),
            bytes: 100 * MIB,
            again: true
        }]
    );
    assert_eq!(p.stats().rereads, 1);
    assert_eq!(p.stats().preloads, 2);
}

#[test]
fn unused_preloads_are_reported_and_used_ones_counted() {
    let mut os = Fake::new();
    let mut p = Preloader::new(PreloadConfig {
        unused_after_s: 60.0,
        ..cfg()
    });
    let r = ranking(&[("a", 0.5), ("b", 0.4)]);
    p.tick(0, &r, &mut os);
    os.complete();
    p.tick(1000, &r, &mut os);
    os.complete();
    p.tick(2000, &r, &mut os);
    assert_eq!(p.preloaded().collect::<Vec<_>>(), vec!["a", "b"]);
    // b's launch comes with all of it still resident: used.
    assert_eq!(p.last_resident_fraction("b"), Some(1.0));
    assert_eq!(p.last_resident_fraction("c"), None, "not preloaded");
    let o = p.on_launch("b", 1.0).unwrap();
    assert!(o.used);
    assert_eq!(o.bytes_used, 100 * MIB);
    assert_eq!(p.stats().precision, Some(1.0));
    assert!(p.on_launch("b", 1.0).is_none(), "judged once");
    assert!(p.on_launch("never-preloaded", 1.0).is_none());
    // a's never does.
    let acts = p.tick(59_999, &[], &mut os);
    assert!(acts.is_empty());
    let acts = p.tick(60_000, &[], &mut os);
    assert_eq!(
        acts,
        vec![Action::Unused {
            profile: "a".into(),
            bytes: 100 * MIB
        }]
    );
    let s = p.stats();
    assert_eq!((s.used, s.unused), (1, 1));
    assert_eq!(s.precision, Some(0.5));
    assert_eq!(s.held_bytes, 0);
}

#[test]
fn a_launch_after_eviction_did_not_use_its_preload() {
    let mut os = Fake::new();
    let mut p = Preloader::new(cfg());
    let r = ranking(&[("a", 0.5)]);
    p.tick(0, &r, &mut os);
    os.complete();
    os.plan("a", 20 * MIB, 100 * MIB);
    // Measured at the next tick, while the launch has not come.
    p.tick(1000, &[], &mut os);
    assert_eq!(p.last_resident_fraction("a"), Some(0.2));
    let o = p.on_launch("a", 0.2).unwrap();
    assert!(!o.used);
    assert_eq!(o.bytes_used, 0);
    assert_eq!(p.stats().precision, Some(0.0));
}

#[test]
fn residency_of_a_plan_through_the_replay_backend() {
    use warmstart_plan::plan::{PlanFile, PlanMeta};
    use warmstart_plan::trace::FileId;
    use warmstart_replay::MockBackend;
    let id = |ino| FileId {
        dev: 1,
        ino,
        size: 1 << 20,
        mtime_ns: 5,
        ctime_ns: 5,
    };
    let backend = MockBackend::new()
        .with_file("/a", id(1))
        .with_file("/changed", FileId { size: 7, ..id(2) });
    let plan = Plan {
        meta: PlanMeta {
            command: vec![],
            created_unix_ms: 0,
            traces: 1,
            min_traces: 1,
            passes: vec![],
            sorted: false,
        },
        files: vec![
            PlanFile {
                path: "/a".into(),
                id: id(1),
            },
            PlanFile {
                path: "/changed".into(),
                id: id(2),
            },
            PlanFile {
                path: "/missing".into(),
                id: id(3),
            },
        ],
        lookups: vec![],
        entries: vec![
            Entry::Data {
                file: 0,
                offset: 0,
                len: 8 * 4096,
            },
            Entry::Data {
                file: 1,
                offset: 0,
                len: 4096,
            },
            Entry::Data {
                file: 2,
                offset: 0,
                len: 4096,
            },
            Entry::Data {
                file: 0,
                offset: 64 * 4096,
                len: 8 * 4096,
            },
        ],
    };
    assert_eq!(
        plan_residency(&backend, &plan),
        PlanResidency {
            resident: 0,
            total: 16 * 4096
        }
    );
    let (h, _) = backend.open_file(Path::new("/a")).unwrap();
    backend.prefetch(&h, 0, 4 * 4096).unwrap();
    let r = plan_residency(&backend, &plan);
    assert_eq!(r.resident, 4 * 4096);
    assert_eq!(r.fraction(), 0.25);
}

#[test]
fn psi_lines() {
    let text = "some avg10=1.25 avg60=0.50 avg300=0.10 total=12345\n\
                full avg10=0.75 avg60=0.00 avg300=0.00 total=100\n";
    assert_eq!(parse_psi_some_avg10(text), Some(1.25));
    assert_eq!(parse_psi_some_avg10("full avg10=3.00\n"), None);
    assert_eq!(parse_psi_some_avg10("garbage"), None);
    assert_eq!(parse_psi_some_total(text), Some(12345));
    assert_eq!(parse_psi_some_total("some avg10=1.0\n"), None);
}

#[test]
fn config_validation() {
    assert!(PreloadConfig::default().validate().is_ok());
    for bad in [
        PreloadConfig {
            budget_fraction: 1.5,
            ..Default::default()
        },
        PreloadConfig {
            io_priority: "now".into(),
            ..Default::default()
        },
        PreloadConfig {
            workers: 0,
            ..Default::default()
        },
    ] {
        assert!(bad.validate().is_err(), "{bad:?}");
    }
    let c: PreloadConfig = toml::from_str("enabled = false\ntop = 5\n").unwrap();
    assert!(!c.enabled && c.top == 5);
    assert!(toml::from_str::<PreloadConfig>("budget = 1\n").is_err());
}

#[test]
fn the_real_system_answers() {
    let launch = Arc::new(AtomicBool::new(false));
    let mut os = RealPreloadOs::new(
        Path::new("/proc"),
        &PreloadConfig::default(),
        Box::new(|_| None),
        Arc::clone(&launch),
    )
    .unwrap();
    let m = os.memory().expect("/proc/meminfo");
    assert!(m.available > 0 && m.available <= m.total);
    assert!(!os.launch_in_progress());
    launch.store(true, Ordering::Relaxed);
    assert!(os.launch_in_progress());
    assert_eq!(os.residency("none"), None);
    assert!(os.start_preload("none").is_err());
    assert_eq!(os.preload_running(), None);
}

/// A whole preload on the real system: a file of ours evicted from the
/// page cache is measured missing, preloaded, and measured resident.
#[test]
fn a_real_preload_reads_an_evicted_plan_back() {
    use std::os::unix::fs::MetadataExt;
    use warmstart_plan::compile::{compile, CompileOptions};
    use warmstart_plan::trace::{
        Backend as TraceBackend, CacheState, EndReason, Extent, FileId, FileTrace, TraceMeta,
        TraceStats,
    };
    use warmstart_plan::Trace;

    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("program");
    std::fs::write(&path, vec![3u8; 256 * 1024]).unwrap();
    let f = std::fs::File::open(&path).unwrap();
    f.sync_all().unwrap();
    let m = f.metadata().unwrap();
    let trace = Trace {
        meta: TraceMeta {
            command: vec!["program".into()],
            cwd: "/".into(),
            backend: TraceBackend::Bpf,
            cache: CacheState::AsFound,
            end: EndReason::Exited,
            exit_code: None,
            started_unix_ms: crate::store::now_ms(),
            hostname: String::new(),
        },
        files: vec![FileTrace {
            path: Some(path.display().to_string()),
            id: FileId {
                dev: m.dev(),
                ino: m.ino(),
                size: m.size(),
                mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
                ctime_ns: m.ctime() * 1_000_000_000 + m.ctime_nsec(),
            },
            extents: vec![Extent {
                offset: 0,
                len: m.size(),
                t_ns: 0,
                from_storage: true,
            }],
        }],
        metadata: vec![],
        namespace_ops: vec![],
        stats: TraceStats::default(),
    };
    let opts = CompileOptions {
        min_launch_bytes: 0,
        ..CompileOptions::default()
    };
    let plan = Arc::new(compile(&[trace], &opts, &|_, _| None).unwrap().plan);
    warmstart_sys::fadvise::dontneed(&f, 0, 0).unwrap();

    let cfg = PreloadConfig {
        memory_floor_mib: Some(0),
        ..PreloadConfig::default()
    };
    let mut os = RealPreloadOs::new(
        Path::new("/proc"),
        &cfg,
        Box::new(move |p| (p == "program").then(|| Arc::clone(&plan))),
        Arc::new(AtomicBool::new(false)),
    )
    .unwrap();
    let before = os.residency("program").unwrap();
    assert_eq!(before.total, 256 * 1024);
    assert!(before.fraction() < 0.5, "evicted: {before:?}");
    os.start_preload("program").unwrap();
    // Idle I/O class, and a background thread: wait for it, with a bound
    // far above what 256 KiB takes, so a stuck preload fails the test.
    let mut resident = before;
    for _ in 0..500 {
        resident = os.residency("program").unwrap();
        if os.preload_running().is_none() && resident.fraction() == 1.0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(resident.fraction(), 1.0, "{resident:?}");
    assert_eq!(os.preload_running(), None);
}
