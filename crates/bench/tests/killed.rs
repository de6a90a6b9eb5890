//! Root test: a bench killed outright (SIGKILL, which it cannot catch)
//! leaves no `warmstart daemon` of its behind. Such a daemon would keep
//! prefetching into every later measurement, and inside a testbed it holds
//! the testbed's mounts and loop device.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SUITE: &str = r#"
[[program]]
name = "short"
command = ["/bin/sh", "-c", "cat /etc/hostname >/dev/null"]
"#;

/// One launch, then a long wait with the daemon running.
const LOG: &str = r#"{"step":"boot"}
{"step":"launch","after_ms":0,"program":"short"}
{"step":"launch","after_ms":120000,"program":"short"}
"#;

/// The pids whose parent is `parent` and whose command is `warmstart`.
fn daemons_of(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...
        let Some((head, rest)) = stat.rsplit_once(") ") else {
            continue;
        };
        let ppid: Option<u32> = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok());
        if ppid == Some(parent) && head.ends_with("(warmstart") {
            out.push(pid);
        }
    }
    out
}

#[test]
fn root_a_killed_bench_leaves_no_daemon_behind() {
    if !warmstart_testing::require_root("root_a_killed_bench_leaves_no_daemon_behind") {
        return;
    }
    let bench = Path::new(env!("CARGO_BIN_EXE_warmstart-bench"));
    if !bench.with_file_name("warmstart").is_file() {
        warmstart_testing::skip(
            "root_a_killed_bench_leaves_no_daemon_behind",
            "no warmstart binary beside warmstart-bench (cargo build -p warmstart)",
        );
        return;
    }
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    std::fs::write(d.path().join("suite.toml"), SUITE).unwrap();
    std::fs::write(d.path().join("log.jsonl"), LOG).unwrap();
    let mut child = Command::new(bench)
        .args(["usage", "--modes", "launch-only", "--train", "0"])
        .arg("--suite")
        .arg(d.path().join("suite.toml"))
        .arg("--log")
        .arg(d.path().join("log.jsonl"))
        .arg("--keep-state")
        .arg(d.path().join("state"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let harness = child.id();
    let until = Instant::now() + Duration::from_secs(60);
    let daemons = loop {
        let found = daemons_of(harness);
        if !found.is_empty() {
            break found;
        }
        if let Ok(Some(st)) = child.try_wait() {
            panic!("the bench ended ({st}) before its daemon was seen");
        }
        assert!(Instant::now() < until, "no daemon started within 60 s");
        std::thread::sleep(Duration::from_millis(100));
    };
    child.kill().unwrap();
    child.wait().unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    // Exited, it may stay a zombie until its new parent reaps it.
    let alive = |p: &u32| {
        std::fs::read_to_string(format!("/proc/{p}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, r)| !r.starts_with('Z')))
            .unwrap_or(false)
    };
    while daemons.iter().any(alive) {
        assert!(
            Instant::now() < until,
            "daemon(s) {daemons:?} still running 20 s after the bench was killed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
