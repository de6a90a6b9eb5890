//! Root test of the usage log's `login` and `evict` steps, through the
//! binary: launches after a login run in a new audit session, a boot
//! takes them out of it again, an eviction empties the cache, and the
//! daemon sees each login as a login startup.

use std::path::Path;
use std::process::Command;

/// The session a launch runs in and how much of `data` was cached before
/// it read it, one line per launch.
fn suite(out: &Path, data: &Path) -> String {
    format!(
        r#"
[[program]]
name = "sid"
command = ["/bin/sh", "-c", "printf '%s ' \"$(cat /proc/self/sessionid)\" >> {out}; fincore -nb -o RES {data} >> {out}; cat {data} > /dev/null"]
"#,
        out = out.display(),
        data = data.display()
    )
}

const LOG: &str = r#"{"step":"boot"}
{"step":"launch","after_ms":100,"program":"sid"}
{"step":"login","after_ms":100}
{"step":"launch","after_ms":100,"program":"sid"}
{"step":"launch","after_ms":100,"program":"sid"}
{"step":"evict","after_ms":100}
{"step":"launch","after_ms":100,"program":"sid"}
{"step":"boot"}
{"step":"launch","after_ms":100,"program":"sid"}
{"step":"login","after_ms":100}
{"step":"launch","after_ms":100,"program":"sid"}
"#;

const UNSET: &str = "4294967295";

#[test]
fn root_usage_logins_are_new_sessions_and_evictions_empty_the_cache() {
    let name = "root_usage_logins_are_new_sessions_and_evictions_empty_the_cache";
    if !warmstart_testing::require_root(name) {
        return;
    }
    if !Path::new("/proc/thread-self/loginuid").exists() || !Path::new("/usr/bin/fincore").exists()
    {
        warmstart_testing::skip(name, "no /proc/thread-self/loginuid or no fincore");
        return;
    }
    let bench = Path::new(env!("CARGO_BIN_EXE_warmstart-bench"));
    let warmstart = bench.with_file_name("warmstart");
    let mut modes = vec!["none"];
    if warmstart.is_file() {
        modes.push("predict");
    } else {
        warmstart_testing::skip(
            "the daemon mode of root_usage_logins_are_new_sessions_and_evictions_empty_the_cache",
            "no warmstart binary beside warmstart-bench (cargo build -p warmstart)",
        );
    }
    // On disk, not tmpfs: the eviction must be able to empty it.
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    let data = d.path().join("data");
    std::fs::write(&data, vec![7u8; 1 << 20]).unwrap();
    let out = d.path().join("sessions");
    let suite_file = d.path().join("suite.toml");
    std::fs::write(&suite_file, suite(&out, &data)).unwrap();
    let log = d.path().join("log.jsonl");
    std::fs::write(&log, LOG).unwrap();
    let json = d.path().join("out.json");
    let kept = d.path().join("state");
    let daemon_config = d.path().join("daemon.toml");
    std::fs::write(&daemon_config, "[startup]\nquiet_s = 1.0\nmax_s = 4.0\n").unwrap();
    let run = Command::new(bench)
        .args(["usage", "--log"])
        .arg(&log)
        .arg("--suite")
        .arg(&suite_file)
        .arg("--modes")
        .arg(modes.join(","))
        .arg("--json")
        .arg(&json)
        .arg("--keep-state")
        .arg(&kept)
        .arg("--daemon-config")
        .arg(&daemon_config)
        .env("WARMSTART_BENCH_BIN", &warmstart)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{}\n{stderr}", run.status);
    assert!(stderr.contains("caches dropped"), "{stderr}");
    assert!(stderr.contains("the log waits 1 s per mode"), "{stderr}");

    let text = std::fs::read_to_string(&out).unwrap();
    let lines: Vec<(String, u64)> = text
        .lines()
        .map(|l| {
            let (sid, res) = l.split_once(' ').unwrap();
            (sid.to_string(), res.trim().parse().unwrap())
        })
        .collect();
    assert_eq!(lines.len(), 6 * modes.len(), "{text}");
    let mut seen = Vec::new();
    for (m, launches) in modes.iter().zip(lines.chunks(6)) {
        let sid: Vec<&str> = launches.iter().map(|l| l.0.as_str()).collect();
        // Before the first login, and after a boot: no session.
        assert_eq!(sid[0], UNSET, "{m}: {text}");
        assert_eq!(sid[4], UNSET, "{m}: {text}");
        // The login's launches share one new session, the eviction
        // leaves it; the next boot's login is another.
        let (a, b) = (sid[1], sid[5]);
        assert_ne!(a, UNSET);
        assert_eq!(sid[2], a);
        assert_eq!(sid[3], a);
        assert!(b != UNSET && b != a, "{m}: {text}");
        assert!(!seen.contains(&a) && !seen.contains(&b), "{text}");
        seen.extend([a, b]);
        if *m == "none" {
            // Nothing cached after a boot or an eviction; cached once
            // read, before that.
            let res: Vec<u64> = launches.iter().map(|l| l.1).collect();
            assert_eq!(res[0], 0, "{text}");
            assert!(res[1] > 0 && res[2] > 0, "{text}");
            assert_eq!(res[3], 0, "the eviction left data cached: {text}");
            assert_eq!(res[4], 0, "{text}");
        }
    }

    // The flags of each launch, in log order.
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    for m in &modes {
        let mut ls: Vec<&serde_json::Value> = v["launches"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|l| l["mode"] == *m)
            .collect();
        ls.sort_by_key(|l| (l["boot"].as_u64(), l["launch"].as_u64()));
        let flags: Vec<(bool, bool)> = ls
            .iter()
            .map(|l| {
                (
                    l["startup_sequence"].as_bool().unwrap(),
                    l["after_eviction"].as_bool().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            flags,
            [
                (false, false),
                (true, false),
                (true, false),
                (false, true),
                (false, false),
                (true, false),
            ],
            "{m}"
        );
        let t = v["totals"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["mode"] == *m)
            .unwrap();
        // The second boot is measured: its login's launch.
        assert_eq!(t["startup_launches"], 1, "{t}");
        assert_eq!(t["eviction_launches"], 0, "{t}");
    }
    assert_eq!(v["log"].as_array().unwrap().len(), 11);

    if warmstart.is_file() {
        // The daemon saw each login as a login startup, in the session its
        // launches ran in.
        let history = std::fs::read_to_string(kept.join("predict/state/history.jsonl")).unwrap();
        let logins: Vec<String> = history
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| e["event"] == "startup" && e["kind"] == "login")
            .map(|e| e["session"].to_string())
            .collect();
        let predict: Vec<&str> = lines[6..].iter().map(|l| l.0.as_str()).collect();
        assert_eq!(logins, [predict[1], predict[5]], "{history}");
    }
}
