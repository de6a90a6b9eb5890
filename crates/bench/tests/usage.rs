//! Root test of `warmstart-bench usage`: a tiny log (2 boots, 2 launches
//! each of a Python import) replayed for real in the modes none,
//! launch-only, predict and warm (and preload when Debian's preload is
//! installed), through the binary; the JSON must hold every launch and
//! boot, the totals, and the daemon's state must show what each mode
//! switched on.

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

/// One replay at a time: each refuses to start beside another's daemon
/// (a prefetcher it did not start would warm its launches).
static SERIAL: Mutex<()> = Mutex::new(());

/// A Python launch reading a few MiB of modules: long enough (tens of
/// milliseconds warm) for the daemon to follow it.
const SUITE: &str = r#"
[[program]]
name = "py"
command = ["/usr/bin/python3", "-c", "import json, email.parser, http.client, xml.dom.minidom, sqlite3, decimal"]
"#;

const LOG: &str = r#"{"step":"boot"}
{"step":"launch","after_ms":500,"program":"py"}
{"step":"launch","after_ms":500,"program":"py"}
{"step":"boot"}
{"step":"launch","after_ms":500,"program":"py"}
{"step":"launch","after_ms":500,"program":"py"}
"#;

#[test]
fn root_usage_replays_a_log_in_every_mode() {
    if !warmstart_testing::require_root("root_usage_replays_a_log_in_every_mode") {
        return;
    }
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !Path::new("/usr/bin/python3").exists() {
        warmstart_testing::skip(
            "root_usage_replays_a_log_in_every_mode",
            "no /usr/bin/python3",
        );
        return;
    }
    let bench = Path::new(env!("CARGO_BIN_EXE_warmstart-bench"));
    // The daemon modes run the warmstart binary built beside this one.
    let warmstart = bench.with_file_name("warmstart");
    let mut modes = vec!["none", "warm"];
    if warmstart.is_file() {
        modes.splice(1..1, ["launch-only", "predict"]);
    } else {
        warmstart_testing::skip(
            "the daemon modes of root_usage_replays_a_log_in_every_mode",
            "no warmstart binary beside warmstart-bench (cargo build -p warmstart)",
        );
    }
    let preload = Path::new("/usr/sbin/preload").is_file();
    if preload {
        modes.push("preload");
    } else {
        eprintln!("preload mode not tested: Debian's preload is not installed (make deps)");
    }
    // On disk, not tmpfs: the launches read the suite's directory.
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    let suite = d.path().join("suite.toml");
    std::fs::write(&suite, SUITE).unwrap();
    let log = d.path().join("log.jsonl");
    std::fs::write(&log, LOG).unwrap();
    let json = d.path().join("out.json");
    let md = d.path().join("out.md");
    let kept = d.path().join("state");
    // Startup windows that close within seconds, and a startup plan from
    // one startup: the second boot replays what the first recorded.
    let daemon_config = d.path().join("daemon.toml");
    std::fs::write(
        &daemon_config,
        "[startup]\nquiet_s = 1.0\nmax_s = 4.0\nmin_traces = 1\n",
    )
    .unwrap();
    let out = Command::new(bench)
        .arg("usage")
        .arg("--log")
        .arg(&log)
        .arg("--suite")
        .arg(&suite)
        .arg("--modes")
        .arg(modes.join(","))
        .arg("--json")
        .arg(&json)
        .arg("--export-markdown")
        .arg(&md)
        .arg("--keep-state")
        .arg(&kept)
        .arg("--plot")
        .arg(d.path())
        .arg("--daemon-config")
        .arg(&daemon_config)
        .env("WARMSTART_BENCH_BIN", &warmstart)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("Totals over the measured boots"),
        "{stdout}"
    );
    assert!(std::fs::read_to_string(&md).unwrap().contains("| mode |"));
    let svg = std::fs::read_to_string(d.path().join("usage-timeline.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("none"));

    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    // The default split: the first boot trains, the second is measured.
    assert_eq!(v["settings"]["train_boots"], 1);
    let launches = v["launches"].as_array().unwrap();
    assert_eq!(launches.len(), modes.len() * 4, "{launches:#?}");
    for m in &modes {
        for boot in [1, 2] {
            for n in [1, 2] {
                let l = launches
                    .iter()
                    .find(|l| l["mode"] == *m && l["boot"] == boot && l["launch"] == n)
                    .unwrap_or_else(|| panic!("no launch {n} of boot {boot} in mode {m}"));
                assert!(l["ms"].as_f64().unwrap() > 0.0, "{l}");
                assert_eq!(l["measured"], boot == 2, "{l}");
                assert_eq!(l["program"], "py");
                // Every launch has its baselines.
                assert!(l["cold_ms"].as_f64().unwrap() > 0.0, "{l}");
                assert!(l["warm_ms"].as_f64().unwrap() > 0.0, "{l}");
                // The daemon's predictions, in the modes that run it.
                let daemon = *m == "launch-only" || *m == "predict";
                assert_eq!(l["predictions_before"].is_array(), daemon, "{l}");
            }
        }
    }
    assert_eq!(v["boots"].as_array().unwrap().len(), modes.len() * 2);
    // Samples every second, of every mode.
    let samples = v["samples"].as_array().unwrap();
    for m in &modes {
        assert!(samples
            .iter()
            .any(|s| s["mode"] == *m && s["cached_bytes"].as_u64() > Some(0)));
    }
    let totals = v["totals"].as_array().unwrap();
    assert_eq!(totals.len(), modes.len());
    for t in totals {
        assert_eq!(t["launches"], 2, "{t}");
        assert!(t["total_ms"].as_f64().unwrap() > 0.0, "{t}");
        // Extra reads are relative to the none mode, which ran.
        assert!(t["extra_read_bytes"].is_i64(), "{t}");
        if t["mode"] == "none" {
            assert_eq!(t["extra_read_bytes"], 0);
            assert!(
                t["gap_captured"].is_null() || t["gap_captured"] == 0.0,
                "{t}"
            );
        }
        if t["mode"] == "warm" {
            assert!(
                t["gap_captured"].is_null() || t["gap_captured"] == 1.0,
                "{t}"
            );
        }
        // Precision is the daemon's: never claimed for Debian's preload.
        if t["mode"] == "preload" || t["mode"] == "none" {
            assert!(t["precision"].is_null(), "{t}");
            assert!(t["over_budget"].is_null(), "{t}");
        }
    }

    if warmstart.is_file() {
        let boots = v["boots"].as_array().unwrap();
        for m in ["launch-only", "predict"] {
            let total = totals.iter().find(|t| t["mode"] == m).unwrap();
            assert_eq!(total["over_budget"], false, "{total}");
            // The daemon followed the launches, carrying its state from
            // one boot to the next.
            let followed: u64 = boots
                .iter()
                .filter(|b| b["mode"] == m)
                .map(|b| {
                    b["daemon"]["launches_learned"].as_u64().unwrap()
                        + b["daemon"]["launches_prefetched"].as_u64().unwrap()
                })
                .sum();
            assert!(followed >= 1, "{m}: {boots:#?}");
            for b in boots.iter().filter(|b| b["mode"] == m) {
                assert_eq!(b["daemon"]["finished"], true, "{b}");
            }
            assert!(kept.join(m).join("state/profiles").is_dir(), "{m}");
        }
        // With startup plans on, each boot's startup was recorded before
        // the daemon stopped, and the second boot replayed the first's.
        let predict: Vec<&serde_json::Value> =
            boots.iter().filter(|b| b["mode"] == "predict").collect();
        for b in &predict {
            assert_eq!(b["daemon"]["startups_recorded"], 1, "{b}");
        }
        assert_eq!(predict[1]["daemon"]["startup_replays"], 1, "{predict:#?}");
        for b in boots.iter().filter(|b| b["mode"] == "launch-only") {
            assert_eq!(b["daemon"]["startups_recorded"], 0, "{b}");
        }
        // predict keeps a launch history across boots; launch-only has
        // prediction off, so it keeps none.
        let history = std::fs::read_to_string(kept.join("predict/state/history.jsonl")).unwrap();
        assert!(history.contains("\"launch\""), "{history}");
        assert!(history.contains("\"startup\""), "{history}");
        assert!(!kept.join("launch-only/state/history.jsonl").exists());
        // A history the run can turn back into a log.
        let back = d.path().join("back.jsonl");
        let st = Command::new(bench)
            .args(["usage", "--quiet", "--from-history"])
            .arg(kept.join("predict/state"))
            .arg("--suite")
            .arg(&suite)
            .arg("--write-log")
            .arg(&back)
            .status()
            .unwrap();
        assert!(st.success());
        let back = std::fs::read_to_string(&back).unwrap();
        assert_eq!(back.matches("\"boot\"").count(), 2, "{back}");
        assert!(back.matches("\"program\":\"py\"").count() >= 1, "{back}");
    }
    if preload {
        // preload saves its state when stopped, in the mode's directory.
        assert!(kept.join("preload/state/preload.state").is_file());
    }
}

#[test]
fn root_usage_reports_a_failing_program_by_mode() {
    if !warmstart_testing::require_root("root_usage_reports_a_failing_program_by_mode") {
        return;
    }
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    let suite = d.path().join("suite.toml");
    std::fs::write(
        &suite,
        "[[program]]\nname = \"bad\"\ncommand = [\"/bin/sh\", \"-c\", \"exit 3\"]\n",
    )
    .unwrap();
    let log = d.path().join("log.jsonl");
    std::fs::write(
        &log,
        "{\"step\":\"boot\"}\n{\"step\":\"launch\",\"after_ms\":0,\"program\":\"bad\"}\n\
         {\"step\":\"boot\"}\n{\"step\":\"launch\",\"after_ms\":0,\"program\":\"bad\"}\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_warmstart-bench"))
        .args(["usage", "--modes", "none,warm", "--log"])
        .arg(&log)
        .arg("--suite")
        .arg(&suite)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for want in [
        "mode none failed",
        "mode warm failed",
        "bad exited with status 3",
        "every mode failed",
    ] {
        assert!(err.contains(want), "{want}: {err}");
    }
}

#[test]
fn root_usage_runs_the_log_again_and_gives_the_spread() {
    if !warmstart_testing::require_root("root_usage_runs_the_log_again_and_gives_the_spread") {
        return;
    }
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !Path::new("/usr/bin/python3").exists() {
        warmstart_testing::skip(
            "root_usage_runs_the_log_again_and_gives_the_spread",
            "no /usr/bin/python3",
        );
        return;
    }
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    let suite = d.path().join("suite.toml");
    std::fs::write(&suite, SUITE).unwrap();
    let log = d.path().join("log.jsonl");
    std::fs::write(&log, LOG).unwrap();
    let (json, md) = (d.path().join("out.json"), d.path().join("out.md"));
    let out = Command::new(env!("CARGO_BIN_EXE_warmstart-bench"))
        .args(["usage", "--modes", "none,warm", "--runs", "2", "--log"])
        .arg(&log)
        .arg("--suite")
        .arg(&suite)
        .arg("--json")
        .arg(&json)
        .arg("--export-markdown")
        .arg(&md)
        .arg("--plot")
        .arg(d.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{stdout}\n{stderr}", out.status);
    assert!(stderr.contains("run 2 of 2"), "{stderr}");
    assert!(
        stdout.contains("Run 1 of 2") && stdout.contains("Over 2 runs"),
        "{stdout}"
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for r in runs {
        // Every launch of both modes in each run, its baselines from the
        // same run.
        let launches = r["launches"].as_array().unwrap();
        assert_eq!(launches.len(), 8, "{launches:#?}");
        for l in launches.iter().filter(|l| l["mode"] == "warm") {
            assert_eq!(l["warm_ms"], l["ms"], "{l}");
        }
        assert_eq!(r["settings"]["modes"], serde_json::json!(["none", "warm"]));
    }
    let summary = v["summary"].as_array().unwrap();
    assert_eq!(summary.len(), 2, "{summary:#?}");
    for (s, mode, gap) in [(&summary[0], "none", 0.0), (&summary[1], "warm", 1.0)] {
        assert_eq!(s["mode"], mode);
        assert_eq!(s["runs"], 2);
        // By definition: cold captures none of the gap, warm all of it
        // (in runs where warm was faster than cold).
        if let Some(m) = s["gap_captured"]["median"].as_f64() {
            assert!((m - gap).abs() < 1e-9, "{s}");
        }
    }
    let md = std::fs::read_to_string(&md).unwrap();
    assert!(md.starts_with("## Usage log, over 2 runs"), "{md}");
    assert!(md.contains("## Usage log, run 2 of 2"), "{md}");
    for run in [1, 2] {
        let svg = d.path().join(format!("usage-timeline-run{run}.svg"));
        assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
    }
}
