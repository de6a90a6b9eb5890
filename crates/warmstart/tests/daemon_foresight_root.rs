//! `warmstart daemon` reading before the launch (root): a program with a
//! plan whose pages left the page cache is read again while the machine
//! idles, the next launch finds it preloaded, and `status` says so; a
//! daemon start counted as a boot records what the boot reads, and the
//! third replays the plan of the first two.

mod util;

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use util::*;

/// One test at a time: each drops the page cache, which would evict what
/// the other's daemon preloaded.
static SERIAL: Mutex<()> = Mutex::new(());

fn json(p: &Path) -> serde_json::Value {
    std::fs::read(p)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(serde_json::Value::Null)
}

fn profile(state: &Path, prefix: &str) -> serde_json::Value {
    std::fs::read_dir(state.join("profiles"))
        .ok()
        .and_then(|d| {
            d.flatten().map(|e| e.path()).find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
            })
        })
        .map(|d| json(&d.join("profile.json")))
        .unwrap_or(serde_json::Value::Null)
}

fn drop_caches() {
    run_ok(&mut Command::new("sync"));
    std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
}

/// The daemon's `foresight` status.
fn foresight(socket: &Path) -> serde_json::Value {
    let out = run(Command::new(warmstart())
        .arg("status")
        .arg("--socket")
        .arg(socket)
        .arg("--json"));
    serde_json::from_slice::<serde_json::Value>(&out.stdout)
        .map(|v| v["daemon"]["foresight"].clone())
        .unwrap_or(serde_json::Value::Null)
}

#[test]
fn root_daemon_preloads_an_evicted_program_while_idle() {
    if !require_root("root_daemon_preloads_an_evicted_program_while_idle") {
        return;
    }
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let fs = LoopFs::new("ext4", 96);
    run_ok(Command::new(fixture()).arg("gen").arg(&fs.mnt));
    let work = tempfile::tempdir().unwrap();
    let fx = work.path().join("ws-preload-fixture");
    std::fs::copy(fixture(), &fx).unwrap();
    // Pressure thresholds out of the way: other work on a shared test
    // machine must not keep the disk "busy" for the whole test.
    let config = work.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "learn = \"allow-list\"\nallow = [\"{}/*\"]\nskip_services = false\n\
             min_launch_kib = 64\nidle_s = 2.0\n[startup]\nenabled = false\n\
             [preload]\nio_pressure_max = 100.0\nmemory_pressure_max = 100.0\n",
            work.path().display()
        ),
    )
    .unwrap();
    let (state, socket) = (work.path().join("state"), work.path().join("sock"));
    let log = std::fs::File::create(work.path().join("daemon.log")).unwrap();
    let daemon = spawn_daemon(&config, &state, &socket, log);
    let log_text = || std::fs::read_to_string(work.path().join("daemon.log")).unwrap_or_default();

    // Learned until it has a plan.
    for n in 1..=4u64 {
        drop_caches();
        run_ok(Command::new(&fx).arg("run").arg(&fs.mnt));
        wait_for(
            "the daemon to take the launch",
            Duration::from_secs(20),
            || profile(&state, "ws-preload-fixture")["launches"].as_u64() == Some(n),
        );
        if profile(&state, "ws-preload-fixture")["phase"] == "prefetching" {
            break;
        }
    }
    assert_eq!(
        profile(&state, "ws-preload-fixture")["phase"],
        "prefetching"
    );

    // Evicted while nothing runs: read again, and measured resident.
    drop_caches();
    wait_for("a preload", Duration::from_secs(30), || {
        foresight(&socket)["preloads"].as_u64() >= Some(1)
    });
    let t = Instant::now();
    while !foresight(&socket)["predictions"][0]["resident"]
        .as_f64()
        .is_some_and(|r| r >= 0.9)
    {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the preloaded plan is not resident: {}\n{}",
            foresight(&socket),
            log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let f = foresight(&socket);
    assert!(
        f["predictions"][0]["profile"]
            .as_str()
            .is_some_and(|p| p.starts_with("ws-preload-fixture")),
        "{f}"
    );
    assert!(f["budget_bytes"].as_u64() > Some(0), "{f}");
    assert!(
        log_text().contains("preloading ws-preload-fixture"),
        "{}",
        log_text()
    );

    // Its next launch used the preload.
    run_ok(Command::new(&fx).arg("run").arg(&fs.mnt));
    wait_for("the preload judged", Duration::from_secs(20), || {
        foresight(&socket)["preloads_used"].as_u64() == Some(1)
    });
    let f = foresight(&socket);
    assert!(f["precision"].as_f64().is_some_and(|p| p > 0.0), "{f}");
    // The history is appended by a writer thread of its own: the last
    // launch's line may come just after the preload was judged.
    let history = || std::fs::read_to_string(state.join("history.jsonl")).unwrap_or_default();
    let launches = || {
        history()
            .lines()
            .filter(|l| l.contains("ws-preload-fixture"))
            .count()
    };
    let t = Instant::now();
    while launches() < 3 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(launches() >= 3, "{}", history());

    // No preload left holding the test file system's files.
    wait_for("the preloader idle", Duration::from_secs(30), || {
        foresight(&socket)["preload_state"] != "preloading"
    });
    drop(daemon);
    std::thread::sleep(Duration::from_millis(500));
}

/// How many traces and whether a plan `state/startup/boot` holds.
fn boot_startups(state: &Path) -> (usize, bool) {
    let dir = state.join("startup").join("boot");
    let traces = std::fs::read_dir(&dir)
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().extension().is_some_and(|x| x == "trace"))
                .count()
        })
        .unwrap_or(0);
    (traces, dir.join("plan").exists())
}

#[test]
fn root_daemon_records_boots_and_replays_their_plan() {
    if !require_root("root_daemon_records_boots_and_replays_their_plan") {
        return;
    }
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let fs = LoopFs::new("ext4", 96);
    run_ok(Command::new(fixture()).arg("gen").arg(&fs.mnt));
    let work = tempfile::tempdir().unwrap();
    // Every daemon start counts as a boot; a short window, capped, since
    // other work on the machine keeps exec'ing.
    let config = work.path().join("config.toml");
    std::fs::write(
        &config,
        "learn = \"allow-list\"\nallow = [\"/nothing/*\"]\nskip_services = false\n\
         [startup]\nboot_uptime_max_s = 1000000000.0\nquiet_s = 1.0\nmax_s = 3.0\n\
         [preload]\nenabled = false\n",
    )
    .unwrap();
    let (state, socket) = (work.path().join("state"), work.path().join("sock"));
    let log_path = work.path().join("daemon.log");
    for boot in 1..=3usize {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .unwrap();
        let _ = std::fs::remove_file(&socket);
        let daemon = spawn_daemon(&config, &state, &socket, log);
        // What this boot starts: a program the policy does not follow,
        // reading the test file system cold.
        drop_caches();
        run_ok(Command::new(fixture()).arg("run").arg(&fs.mnt));
        // The trace is written, then the plan compiled from the traces
        // kept: from the second boot on, the pages both read.
        wait_for("the boot's trace and plan", Duration::from_secs(30), || {
            boot_startups(&state) == (boot, boot >= 2)
        });
        drop(daemon);
    }
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert_eq!(
        log.matches("boot startup: replaying the boot plan").count(),
        1,
        "the third boot replays the plan of the first two: {log}"
    );
}
