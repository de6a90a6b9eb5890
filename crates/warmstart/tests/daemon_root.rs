//! `warmstart daemon` end to end (root): launches nobody wrapped are
//! learned, then prefetched; changed files relearn; denied programs are
//! never traced; a corrupt plan is reported and ignored.

mod util;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use util::*;

fn wait_for(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let t = Instant::now();
    while !ok() {
        assert!(t.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn profile_dir(state: &Path, prefix: &str) -> Option<PathBuf> {
    std::fs::read_dir(state.join("profiles"))
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
        })
}

fn json(p: &Path) -> serde_json::Value {
    std::fs::read(p)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(serde_json::Value::Null)
}

#[test]
fn root_daemon_learns_prefetches_relearns_and_obeys_policy() {
    if !require_root("root_daemon_learns_prefetches_relearns_and_obeys_policy") {
        return;
    }
    let fs = LoopFs::new("ext4", 96);
    run_ok(Command::new(fixture()).arg("gen").arg(&fs.mnt));
    let work = tempfile::tempdir().unwrap();
    // The fixture under two names: one allowed, one denied.
    let fx = work.path().join("ws-launch-fixture");
    std::fs::copy(fixture(), &fx).unwrap();
    let denied = work.path().join("denied-fixture");
    std::fs::copy(fixture(), &denied).unwrap();
    let state = work.path().join("state");
    let config = work.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "learn = \"allow-list\"\nallow = [\"{}/*\"]\ndeny = [\"*/denied-*\"]\nskip_services = false\nmin_launch_kib = 64\n",
            work.path().display()
        ),
    )
    .unwrap();
    let socket = work.path().join("sock");
    let log = std::fs::File::create(work.path().join("daemon.log")).unwrap();
    let _daemon = Background::spawn(
        Command::new(warmstart())
            .arg("daemon")
            .arg("--config")
            .arg(&config)
            .arg("--state-dir")
            .arg(&state)
            .arg("--socket")
            .arg(&socket)
            .stdout(Stdio::null())
            .stderr(log),
    );
    wait_for("the daemon's socket", Duration::from_secs(20), || {
        socket.exists()
    });
    let launch = |exe: &Path| {
        fs.evict();
        let out = run_ok(Command::new(exe).arg("run").arg(&fs.mnt));
        touches(&out.stdout)
    };
    let launches = |dir: &Path| {
        json(&dir.join("profile.json"))["launches"]
            .as_u64()
            .unwrap_or(0)
    };

    // Direct launches are learned until the profile has a plan (two
    // learning launches; more only if a prefetched launch relearns).
    let mut count = 0;
    let until_prefetching = |count: &mut u64| {
        for _ in 0..4 {
            launch(&fx);
            *count += 1;
            let c = *count;
            wait_for(
                "the daemon to take the launch",
                Duration::from_secs(15),
                || profile_dir(&state, "ws-launch-fixture").is_some_and(|d| launches(&d) == c),
            );
            let d = profile_dir(&state, "ws-launch-fixture").unwrap();
            if json(&d.join("profile.json"))["phase"] == "prefetching" {
                return d;
            }
        }
        panic!("no plan after four launches");
    };
    let dir = until_prefetching(&mut count);
    assert!(count >= 2, "two launches are recorded before a plan");

    // The next launch is prefetched from its exec on, and audited by the
    // daemon's own recording.
    let touched = launch(&fx);
    count += 1;
    wait_for("the prefetched launch", Duration::from_secs(15), || {
        launches(&dir) == count
    });
    let report = json(&dir.join("last-launch.json"));
    assert_eq!(report["phase_before"], "prefetching", "{report}");
    assert!(
        report["replay"]["data"]["bytes"].as_u64().unwrap() > 1 << 20,
        "{report}"
    );
    let audit = show_json(&dir.join("last-audit"));
    let data = fs.mnt.join("data").display().to_string();
    let self_read: u64 = audit["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["path"].as_str().is_some_and(|p| p.starts_with(&data)))
        .flat_map(|f| {
            let flags = f["from_storage"].as_array().unwrap().clone();
            f["ranges"]
                .as_array()
                .unwrap()
                .iter()
                .zip(flags)
                .filter(|(_, s)| *s == true)
                .map(|(r, _)| r[1].as_u64().unwrap() / 4096)
                .collect::<Vec<_>>()
        })
        .sum();
    let total: u64 = touched.iter().map(|t| t.2).sum();
    // Reported, not asserted: in daemon mode the replay starts only once
    // the exec is seen, and on this machine the share read by the program
    // itself is usually 0 but intermittently high (see docs/daemon.md).
    eprintln!("daemon-prefetched launch read {self_read} of {total} data pages itself");
    assert!(
        audit["stats"]["pages"].as_u64().unwrap() >= total,
        "the audit saw the launch"
    );

    // Files replaced (a package update): detected, and the profile relearns.
    let dir = until_prefetching(&mut count);
    for name in ["f00", "f01", "f02", "f03", "f04", "f05"] {
        let p = fs.mnt.join("data").join(name);
        let content = std::fs::read(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        std::fs::write(&p, content).unwrap();
    }
    launch(&fx);
    count += 1;
    wait_for(
        "the launch after the update",
        Duration::from_secs(15),
        || launches(&dir) == count,
    );
    let report = json(&dir.join("last-launch.json"));
    assert_eq!(report["phase_after"], "learning", "{report}");
    assert!(
        report["relearn_reason"]
            .as_str()
            .unwrap_or("")
            .contains("changed"),
        "{report}"
    );

    // A corrupt plan is reported, ignored, and the profile relearns.
    let dir = until_prefetching(&mut count);
    let plan = dir.join("plan");
    let mut bytes = std::fs::read(&plan).unwrap();
    let n = bytes.len();
    bytes[n - 3] ^= 0xff;
    std::fs::write(&plan, bytes).unwrap();
    launch(&fx);
    count += 1;
    wait_for(
        "the corrupt plan to be handled",
        Duration::from_secs(15),
        || launches(&dir) == count,
    );
    assert_eq!(json(&dir.join("profile.json"))["phase"], "learning");
    let log = std::fs::read_to_string(work.path().join("daemon.log")).unwrap();
    assert!(
        log.contains("checksum") && log.contains("relearning"),
        "{log}"
    );

    // A denied program is never traced.
    launch(&denied);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        profile_dir(&state, "denied").is_none(),
        "a denied program got a profile"
    );

    // Status talks to the daemon.
    let out = run_ok(
        Command::new(warmstart())
            .arg("status")
            .arg("--state-dir")
            .arg(&state)
            .arg("--socket")
            .arg(&socket),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("daemon: pid") && text.contains("ws-launch-fixture"),
        "{text}"
    );
}
