//! Root tests of `warmstart-bench --fs`: a small command measured inside
//! an ext4 testbed (every scenario producing rows, cold launches reading
//! from the loop device, warm ones not), then on the `sd` device model (its
//! fio figures in the results), then `--testbed-cleanup`. The image holds
//! only what the command and the harness need, so it builds in seconds.
//! They say so and return early when not root, unless
//! `WARMSTART_REQUIRE_ROOT=1`.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// `data`, and what `/bin/sh -c 'cat …'` and the harness binaries need (dynamically
/// linked against libc, libm and libgcc_s), on a merged-/usr Debian system
/// or a split one: those that exist.
fn contents(data: &Path) -> String {
    let mut v: Vec<String> = ["/bin", "/lib", "/lib64", "/usr/lib64"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    v.push(data.display().to_string());
    for b in ["sh", "dash", "cat"] {
        v.push(format!("/usr/bin/{b}"));
    }
    for l in [
        "libc.so.6",
        "libm.so.6",
        "libgcc_s.so.1",
        "ld-linux-x86-64.so.2",
    ] {
        v.push(format!("/usr/lib/x86_64-linux-gnu/{l}"));
        v.push(format!("/lib/x86_64-linux-gnu/{l}"));
    }
    // On a merged-/usr system /lib/x86_64-linux-gnu/X is /usr/lib/…/X
    // through a symlink: keep only real paths, each once.
    let mut out: Vec<String> = Vec::new();
    for p in v {
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        let through_link = Path::new(&p)
            .parent()
            .and_then(|d| std::fs::canonicalize(d).ok())
            .is_some_and(|d| d != Path::new(&p).parent().unwrap());
        if through_link && !m.file_type().is_symlink() && !m.is_dir() {
            continue;
        }
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out.join(",")
}

/// Removes the test's images and leftovers even when an assertion fails.
struct Cache(PathBuf);

impl Drop for Cache {
    fn drop(&mut self) {
        let _ = Command::new(env!("CARGO_BIN_EXE_warmstart-bench"))
            .args(["--testbed-cleanup", "--testbed-cache"])
            .arg(&self.0)
            .status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn bench(cache: &Path, data: &Path, extra: &[&str], json: &Path, cmd: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_warmstart-bench"))
        .args(["--fs", "ext4", "--runs", "1", "--warmup", "0"])
        .arg("--testbed-cache")
        .arg(cache)
        .args(["--testbed-content", &contents(data)])
        .arg("--export-json")
        .arg(json)
        .args(extra)
        .arg("--")
        .args(cmd)
        .output()
        .expect("running warmstart-bench");
    let text = format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(out.stdout.starts_with(b"testbed: ext4 image on "), "{text}");
    serde_json::from_slice(&std::fs::read(json).expect(&text)).expect(&text)
}

fn runs<'a>(r: &'a Value, scenario: &str) -> Vec<&'a Value> {
    r["programs"][0]["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["scenario"] == scenario)
        .collect()
}

fn device_reads(r: &Value, scenario: &str) -> u64 {
    let rows = runs(r, scenario);
    assert!(!rows.is_empty(), "no {scenario} rows: {r:#}");
    rows.iter()
        .map(|x| x["device_read_bytes"].as_u64().expect("device_read_bytes"))
        .sum()
}

/// Nothing of this process's testbeds is left mounted.
fn no_leftovers(cache: &Path) {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let cache = cache.display().to_string();
    assert!(
        !mounts.lines().any(|l| l.contains(&cache)),
        "a mount under {cache} is left:\n{mounts}"
    );
    let losetup = Command::new("losetup").arg("-a").output().unwrap();
    let losetup = String::from_utf8_lossy(&losetup.stdout);
    assert!(
        !losetup.lines().any(|l| l.contains(&cache)),
        "a loop device on {cache} is left:\n{losetup}"
    );
}

#[test]
fn root_bench_runs_every_scenario_inside_the_testbed() {
    if !warmstart_testing::require_root("root_bench_runs_every_scenario_inside_the_testbed") {
        return;
    }
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let cache = Cache(dir.path().join("cache"));
    let json = dir.path().join("r.json");
    // A file nothing else maps (the harness inside maps the image's libc,
    // so libc stays cached through a cache drop).
    let data = dir.path().join("data.bin");
    let block: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&data, block.repeat(4)).unwrap();
    let read = format!("cat {} >/dev/null", data.display());
    // `run` launches the warmstart binary, built beside the harness by
    // `cargo test --workspace` (or named by WARMSTART_BENCH_BIN).
    let bin = warmstart_bench::wrapped::warmstart_binary().is_some_and(|b| b.is_file());
    let mut scenarios = vec![
        "cold",
        "warm",
        "warmstart",
        "fast",
        "prefetch-only",
        "sequential",
    ];
    if bin {
        scenarios.push("run");
    } else {
        eprintln!("run skipped: no warmstart binary beside the tests");
    }
    let list = scenarios.join(",");
    let r = bench(
        &cache.0,
        &data,
        &["--scenarios", &list],
        &json,
        &["/bin/sh", "-c", &read],
    );
    let tb = &r["testbed"];
    assert_eq!(tb["fs"], "ext4", "{r:#}");
    assert!(tb["storage"].is_null(), "{r:#}");
    assert!(tb["loop_device"].as_str().unwrap().starts_with("/dev/loop"));
    assert!(tb["image"]
        .as_str()
        .unwrap()
        .starts_with(&*cache.0.display().to_string()));
    // The recorder named the files inside the testbed.
    let learned = &r["programs"][0]["learned"];
    assert!(learned["files"].as_u64().unwrap() >= 2, "{learned:#}");
    for s in &scenarios {
        assert_eq!(runs(&r, s).len(), 1, "{s}: {r:#}");
    }
    // `run` rows carry the wrapper's own costs from its report; a launch
    // it prefetched says when the replay started.
    for x in runs(&r, "run") {
        let w = &x["wrapper"];
        assert!(w["after_exit_ms"].as_f64().is_some(), "{x:#}");
        if x["prefetched_bytes"].as_u64().is_some() {
            assert!(w["before_replay_ms"].as_f64().unwrap() >= 0.0, "{x:#}");
            assert!(w["held_ms"].as_f64().is_some(), "{x:#}");
        }
    }
    // A cold launch reads the 4 MiB file from the loop device; a warm one
    // finds everything cached.
    let cold = device_reads(&r, "cold");
    assert!(
        cold >= 4 << 20,
        "cold read {cold} bytes from the loop device"
    );
    assert_eq!(device_reads(&r, "warm"), 0, "{r:#}");
    // The replay's reads go to the loop device too.
    let pf = device_reads(&r, "prefetch-only");
    assert!(pf >= 2 << 20, "prefetch-only read {pf} bytes");
    // The sequential ruler reads as many bytes as warmstart's plan holds,
    // from the loop device, past its cache.
    let plan = learned["plan_bytes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x[0] == "warmstart")
        .and_then(|x| x[1].as_u64())
        .expect("warmstart's plan bytes");
    let seq = &runs(&r, "sequential")[0];
    assert!(seq["prefetched_bytes"].as_u64().unwrap() >= plan, "{seq:#}");
    assert!(device_reads(&r, "sequential") >= plan, "{seq:#}");
    no_leftovers(&cache.0);

    // The same on the sd model, with its fio figures in the results.
    let r = bench(
        &cache.0,
        &data,
        &["--storage", "sd", "--scenarios", "cold,warm"],
        &json,
        &["/bin/sh", "-c", &read],
    );
    let tb = &r["testbed"];
    assert_eq!(tb["storage"], "sd", "{r:#}");
    let dev = &tb["device"];
    let lat = dev["rand4k_qd1_lat_us"].as_f64().expect("fio figures");
    // The model's 600 us per request, plus FUSE; far above a loop over
    // the host's disk or cache.
    assert!(lat >= 500.0, "sd 4k QD1 latency {lat} us");
    assert!(dev["seq1m_mb_s"].as_f64().unwrap() < 60.0, "{dev:#}");
    assert!(device_reads(&r, "cold") >= 4 << 20, "{r:#}");
    assert_eq!(device_reads(&r, "warm"), 0, "{r:#}");
    no_leftovers(&cache.0);

    // The clean-up removes the image.
    let st = Command::new(env!("CARGO_BIN_EXE_warmstart-bench"))
        .args(["--testbed-cleanup", "--testbed-cache"])
        .arg(&cache.0)
        .status()
        .unwrap();
    assert!(st.success());
    let left: Vec<_> = std::fs::read_dir(&cache.0)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        !left.iter().any(|n| n.to_string_lossy().ends_with(".img")),
        "{left:?}"
    );
}

#[test]
fn root_usage_log_replays_inside_the_testbed() {
    if !warmstart_testing::require_root("root_usage_log_replays_inside_the_testbed") {
        return;
    }
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let cache = Cache(dir.path().join("cache"));
    let data = dir.path().join("data.bin");
    let block: Vec<u8> = (0..1u32 << 20).map(|i| (i * 13 % 251) as u8).collect();
    std::fs::write(&data, block.repeat(4)).unwrap();
    // The suite's directory is bind-mounted in from the host: not the
    // data's, which must be read from the image.
    std::fs::create_dir(dir.path().join("suite")).unwrap();
    let suite = dir.path().join("suite/suite.toml");
    std::fs::write(
        &suite,
        format!(
            "[[program]]\nname = \"reader\"\ncommand = [\"/bin/sh\", \"-c\", \"cat {} >/dev/null\"]\n",
            data.display()
        ),
    )
    .unwrap();
    let log = dir.path().join("log.jsonl");
    let boot = "{\"step\":\"boot\"}\n{\"step\":\"launch\",\"after_ms\":0,\"program\":\"reader\"}\n";
    std::fs::write(&log, boot.repeat(2)).unwrap();
    let json = dir.path().join("usage.json");
    let md = dir.path().join("usage.md");
    let out = Command::new(env!("CARGO_BIN_EXE_warmstart-bench"))
        .args([
            "usage",
            "--fs",
            "ext4",
            "--modes",
            "none,warm",
            "--train",
            "1",
        ])
        .arg("--testbed-cache")
        .arg(&cache.0)
        .args(["--testbed-content", &contents(&data)])
        .arg("--suite")
        .arg(&suite)
        .arg("--log")
        .arg(&log)
        .arg("--json")
        .arg(&json)
        .arg("--export-markdown")
        .arg(&md)
        .output()
        .expect("running warmstart-bench usage");
    let text = format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("testbed: ext4 image on "), "{text}");
    let r: Value = serde_json::from_slice(&std::fs::read(&json).expect(&text)).expect(&text);
    assert_eq!(r["testbed"]["fs"], "ext4", "{r:#}");
    // The log is named as given outside, not by the copy the inner
    // harness read.
    assert_eq!(r["settings"]["log_source"], log.display().to_string());
    // Reads are counted on the testbed's loop device.
    let disks = r["settings"]["disks"].as_array().unwrap();
    assert!(
        disks
            .iter()
            .any(|d| d.as_str().unwrap().starts_with("loop")),
        "{disks:?}"
    );
    let launches = r["launches"].as_array().unwrap();
    assert_eq!(launches.len(), 4, "{r:#}");
    // Each boot of `none` dropped the testbed's caches: its launch read the
    // 4 MiB file from the loop device again.
    let boots = r["boots"].as_array().unwrap();
    let none: Vec<u64> = boots
        .iter()
        .filter(|b| b["mode"] == "none")
        .map(|b| b["read_bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(none.len(), 2, "{r:#}");
    assert!(none.iter().all(|&b| b >= 4 << 20), "{none:?}");
    let md = std::fs::read_to_string(&md).unwrap();
    assert!(md.contains("Testbed: ext4 image on "), "{md}");
    no_leftovers(&cache.0);
}
