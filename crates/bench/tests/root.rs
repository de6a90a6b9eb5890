//! Root tests: the cache states the scenarios promise, checked for real
//! with mincore on a small command reading a file of known size. They say
//! so and return early when not root (CI runs them as root).

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use warmstart_bench::launch::Target;
use warmstart_bench::os::residency;
use warmstart_bench::real::{Config, RealExecutor};
use warmstart_bench::runner::{run_program, Executor, NoProgress};
use warmstart_bench::scenario::Scenario;

/// The tests drop caches and swap stdout/stderr while recording: they must
/// not overlap.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A directory on a disk-backed filesystem (tmpfs pages cannot be evicted)
/// with a 24 MiB file, and a command that reads it.
fn fixture() -> (tempfile::TempDir, PathBuf, Target) {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let data = dir.path().join("data.bin");
    let block: Vec<u8> = (0..1 << 20).map(|i: u32| (i * 7 % 251) as u8).collect();
    let mut all = Vec::new();
    for _ in 0..24 {
        all.extend_from_slice(&block);
    }
    std::fs::write(&data, &all).unwrap();
    std::fs::File::open(&data).unwrap().sync_all().unwrap();
    let t = Target {
        name: "cat".into(),
        // cat itself, not through a shell: the daemon scenario's policy
        // key is the program the bench starts.
        argv: vec!["cat".into(), data.display().to_string()],
        cwd: None,
        env: Vec::new(),
        ready: "exit".parse().unwrap(),
        prepare: None,
        cleanup: None,
        timeout: Duration::from_secs(60),
    };
    (dir, data, t)
}

fn file_residency(p: &Path) -> f64 {
    let size = std::fs::metadata(p).unwrap().len();
    let (r, t) = residency(&[(p.display().to_string(), vec![(0, size)])]);
    r as f64 / t as f64
}

fn config(evict_files: bool) -> Config {
    Config {
        evict_files,
        check_residency: true,
        ignore_failure: false,
        backend: warmstart_record::BackendChoice::Auto,
        warmstart_bin: warmstart_bench::wrapped::warmstart_binary(),
        scenarios: Vec::new(),
    }
}

#[test]
fn root_cold_starts_evicted_and_warm_starts_cached() {
    let _g = serial();
    if !is_root() {
        eprintln!("skipped: needs root to record and drop caches");
        return;
    }
    for evict_files in [true, false] {
        let (_dir, data, target) = fixture();
        let mut exec = RealExecutor::new(target, config(evict_files));
        let learned = exec.learn().unwrap();
        assert_eq!(learned.traces, 2);
        let name = data.display().to_string();
        assert!(
            exec.files().iter().any(|f| f.0 == name),
            "the learned launch reads {name}"
        );
        // After a launch the file is cached; cold must start without it.
        assert!(file_residency(&data) > 0.99);
        exec.evict().unwrap();
        assert_eq!(file_residency(&data), 0.0, "evict_files={evict_files}");

        let cold = exec.measure(Scenario::Cold).unwrap();
        assert_eq!(cold.exit_code, Some(0));
        // Shared libraries mapped by other processes stay resident; the
        // 24 MiB file is most of the launch.
        let before = cold.resident_before.unwrap();
        assert!(before < 0.2, "cold started with {before} resident");
        let warm = exec.measure(Scenario::Warm).unwrap();
        assert!(warm.resident_before.unwrap() > 0.99);
        // prefetch-only leaves the data cached without a launch.
        let pf = exec.measure(Scenario::PrefetchOnly).unwrap();
        assert!(pf.prefetched_bytes.unwrap() >= 24 << 20);
        assert!(file_residency(&data) > 0.99);
    }
}

#[test]
fn root_every_scenario_runs_on_a_real_command() {
    let _g = serial();
    if !is_root() {
        eprintln!("skipped: needs root to record and drop caches");
        return;
    }
    let (_dir, _data, target) = fixture();
    // run and daemon need the warmstart binary (built beside the tests by
    // `cargo test --workspace`, or named by WARMSTART_BENCH_BIN).
    let bin = warmstart_bench::wrapped::warmstart_binary().is_some_and(|b| b.is_file());
    if !bin {
        eprintln!("run and daemon skipped: no warmstart binary beside the tests");
    }
    let scenarios: Vec<Scenario> = Scenario::ALL
        .into_iter()
        .filter(|s| *s != Scenario::Vmtouch || warmstart_bench::real::which("vmtouch"))
        .filter(|s| !s.uses_binary() || bin)
        .collect();
    let mut cfg = config(true);
    cfg.scenarios = scenarios.clone();
    let mut exec = RealExecutor::new(target, cfg);
    let (learned, runs) = run_program("cat", &mut exec, &scenarios, 2, 1, &mut NoProgress).unwrap();
    assert!(learned.plan_bytes.iter().all(|(_, b)| *b >= 24 << 20));
    for s in &scenarios {
        let n = runs.iter().filter(|r| r.scenario == *s).count();
        assert_eq!(n, 2, "{s}");
    }
    for r in &runs {
        // Bound and demand are computed; prefetch-only launches nothing.
        if r.scenario.is_run() && r.scenario != Scenario::PrefetchOnly {
            assert_eq!(r.exit_code, Some(0), "{r:?}");
        }
        if matches!(r.scenario, Scenario::Warmstart | Scenario::Sorted) {
            assert!(r.prefetched_bytes.unwrap() > 0, "{r:?}");
        }
    }
}
