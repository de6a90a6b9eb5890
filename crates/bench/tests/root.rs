//! Root tests: the cache states the scenarios promise, checked for real
//! with mincore on a small command reading a file of known size. They say
//! so and return early when not root, unless `WARMSTART_REQUIRE_ROOT=1`
//! (CI runs them as root).

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
        // key is the program the bench starts. The file 16 times over: a
        // warm launch then lasts tens of milliseconds, as launches worth
        // prefetching do, instead of exiting before the daemon has read
        // its /proc entry (the daemon leaves such launches alone).
        argv: std::iter::once("cat".to_string())
            .chain(std::iter::repeat_n(data.display().to_string(), 16))
            .collect(),
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

/// Other programs on the machine can evict a file at any moment (another
/// test dropping caches, memory pressure), so no assertion here rests on
/// one look at the cache between two steps. A step that should leave the
/// cache in some state is tried up to this many times, each try looked
/// at right after it; every try's figure is in the failure message.
const TRIES: usize = 4;

/// Runs `step` until `ok` holds for what it returned; panics with every
/// try's result after [`TRIES`].
fn until<T: std::fmt::Debug>(
    what: &str,
    mut step: impl FnMut() -> T,
    ok: impl Fn(&T) -> bool,
) -> T {
    let mut seen = Vec::new();
    for _ in 0..TRIES {
        let x = step();
        if ok(&x) {
            return x;
        }
        seen.push(x);
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{what}: not after {TRIES} tries: {seen:?}");
}

/// The file read whole, until the cache holds it all.
fn cache(p: &Path) {
    until(
        &format!("{} cached by reading it", p.display()),
        || {
            std::fs::read(p).unwrap();
            file_residency(p)
        },
        |r| *r > 0.99,
    );
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
    if !warmstart_testing::require_root("root_cold_starts_evicted_and_warm_starts_cached") {
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
        // Cold must start without the file: evicting drops it (again if
        // the kernel skipped a page that was busy at that moment).
        cache(&data);
        until(
            &format!("evict_files={evict_files}: the file evicted"),
            || {
                exec.evict().unwrap();
                file_residency(&data)
            },
            |r| *r == 0.0,
        );

        // Shared libraries mapped by other processes stay resident; the
        // 24 MiB file is most of the launch.
        let cold = until(
            &format!("evict_files={evict_files}: cold starts evicted"),
            || exec.measure(Scenario::Cold).unwrap(),
            |m| m.resident_before.unwrap() < 0.2,
        );
        assert_eq!(cold.exit_code, Some(0));
        // Warm starts from what the previous launch left; each try is a
        // launch, so a try after an outside eviction starts warm again.
        let warm = until(
            &format!("evict_files={evict_files}: warm starts cached"),
            || exec.measure(Scenario::Warm).unwrap(),
            |m| m.resident_before.unwrap() > 0.99,
        );
        assert_eq!(warm.exit_code, Some(0));
        // prefetch-only leaves the data cached without a launch, looked
        // at as soon as the prefetch has returned.
        until(
            &format!("evict_files={evict_files}: prefetch-only leaves the file cached"),
            || {
                let pf = exec.measure(Scenario::PrefetchOnly).unwrap();
                assert!(pf.prefetched_bytes.unwrap() >= 24 << 20, "{pf:?}");
                file_residency(&data)
            },
            |r| *r > 0.99,
        );
    }
}

#[test]
fn root_every_scenario_runs_on_a_real_command() {
    let _g = serial();
    if !warmstart_testing::require_root("root_every_scenario_runs_on_a_real_command") {
        return;
    }
    let (_dir, _data, target) = fixture();
    // run and daemon need the warmstart binary (built beside the tests by
    // `cargo test --workspace`, or named by WARMSTART_BENCH_BIN).
    let bin = warmstart_bench::wrapped::warmstart_binary().is_some_and(|b| b.is_file());
    if !bin {
        eprintln!("run and daemon skipped: no warmstart binary beside the tests");
    }
    // The sequential ruler reads a testbed's loop device (tests/testbed.rs).
    let scenarios: Vec<Scenario> = Scenario::ALL
        .into_iter()
        .filter(|s| *s != Scenario::Vmtouch || warmstart_bench::real::which("vmtouch"))
        .filter(|s| !s.uses_binary() || bin)
        .filter(|s| *s != Scenario::Sequential)
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
    if bin {
        // Learned in two launches, then the new plan's first launch (which
        // the daemon audits), untimed, then the two timed rounds.
        let (run, daemon) = exec.wrapped_state().unwrap().launches();
        assert_eq!((run, daemon), (5, 5), "{:?}", learned.notes);
        assert!(
            learned.notes.iter().any(|n| n.starts_with("run:")
                && n.contains("learning launches (its first prefetched launch not timed)")),
            "{:?}",
            learned.notes
        );
    }
}

#[test]
fn root_the_binary_writes_every_export() {
    let _g = serial();
    if !warmstart_testing::require_root("root_the_binary_writes_every_export") {
        return;
    }
    let (dir, data, _) = fixture();
    let out = |f: &str| dir.path().join(f);
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_warmstart-bench"))
        .args(["--quiet", "--evict-files", "--scenarios", "cold,warm"])
        .args(["--runs", "1", "--warmup", "0", "--name", "cat-data"])
        .arg("--export-markdown")
        .arg(out("r.md"))
        .arg("--export-json")
        .arg(out("r.json"))
        .arg("--")
        .arg("cat")
        .arg(&data)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let md = std::fs::read_to_string(out("r.md")).unwrap();
    assert!(md.contains("- **Machine:** "), "{md}");
    assert!(
        md.contains(
            "- **Method:** 1 interleaved round per program after 0 warm-up launches; \
             cold launches start with the launch's own files evicted"
        ),
        "{md}"
    );
    assert!(md.contains("| program | cold | warm |"), "{md}");
    assert!(md.contains("\n| cat-data | "), "{md}");
    // The JSON holds the same results.
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out("r.json")).unwrap()).unwrap();
    assert_eq!(json["programs"][0]["name"], "cat-data");
    // The sequential ruler has no device to read outside a testbed.
    let seq = std::process::Command::new(env!("CARGO_BIN_EXE_warmstart-bench"))
        .args(["--quiet", "--evict-files", "--scenarios", "cold,sequential"])
        .args(["--runs", "1", "--", "cat"])
        .arg(&data)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&seq.stderr);
    assert!(!seq.status.success());
    assert!(
        err.contains("the sequential scenario reads a testbed's loop device: use it with --fs"),
        "{err}"
    );
}
