//! `warmstart daemon` end to end (root): launches nobody wrapped are
//! learned, then prefetched; changed files relearn; denied programs are
//! never traced; a corrupt plan is reported and ignored; a storm of
//! trivial launches makes no profile. Its `learn`, `forget`, restarts,
//! crashes and exec chains are in `daemon_lifecycle_root.rs`.

mod daemon_util;
mod util;

use std::process::Command;
use std::time::Duration;

use daemon_util::*;
use util::*;

#[test]
fn root_daemon_learns_prefetches_relearns_and_obeys_policy() {
    if !require_root("root_daemon_learns_prefetches_relearns_and_obeys_policy") {
        return;
    }
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let fs = LoopFs::new("ext4", 96);
    run_ok(Command::new(fixture()).arg("gen").arg(&fs.mnt));
    let work = tempfile::tempdir().unwrap();
    // The fixture under two names: one allowed, one denied.
    let fx = fixture_as(work.path(), "ws-launch-fixture");
    let denied = fixture_as(work.path(), "denied-fixture");
    let d = Daemon::start(
        work.path(),
        &format!("[\"{}/*\"]", work.path().display()),
        "[\"*/denied-*\"]",
    );
    let state = d.state.clone();

    // Direct launches are learned until the profile has a plan (two
    // learning launches; more only if a prefetched launch relearns).
    let mut count = 0;
    let dir = until_prefetching(&fs, &state, &fx, "ws-launch-fixture", &mut count);
    assert!(count >= 2, "two launches are recorded before a plan");

    // The next launch is prefetched from its exec on (the daemon has the
    // plan it just compiled in memory: no state file is read at the exec),
    // and audited by the daemon's own recording. It is held at its exec
    // until the daemon's replay has issued the plan: whether a replay that starts at exec
    // beats a program's first reads is a race on a shared machine (its
    // latency is measured and reported below, and in docs/guide/daemon.md);
    // what is asserted is that the daemon recognised the launch,
    // prefetched the right pages into the right files, and audited it.
    fs.evict();
    let out = launch_held(Command::new(&fx).arg("run").arg(&fs.mnt), |pid| {
        replay_issued(&d, pid)
    });
    let touched: u64 = touches(&out.stdout).iter().map(|t| t.2).sum();
    count += 1;
    d.wait_for("the prefetched launch", Duration::from_secs(15), || {
        launches(&dir) == count
    });
    let report = json(&dir.join("last-launch.json"));
    assert_eq!(report["phase_before"], "prefetching", "{report}");
    assert!(
        report["replay"]["data"]["bytes"].as_u64().unwrap() > 1 << 20,
        "{report}"
    );
    let audit = show_json(&dir.join("last-audit"));
    let self_read = self_read_pages(&audit, &fs.mnt.join("data"));
    assert!(
        audit["stats"]["pages"].as_u64().unwrap() >= touched,
        "the audit saw the launch"
    );
    assert!(
        (self_read as f64) <= 0.01 * touched as f64,
        "the prefetched launch read {self_read} of its {touched} data pages itself (> 1%): {report}"
    );
    // Its replay started when its execve began (`replay_at_execve`, the
    // default), before the kernel had loaded it; the first request is
    // measured from the exec event, so it may be negative.
    let st = d.status();
    assert!(st["replays_at_execve"].as_u64().unwrap_or(0) >= 1, "{st}");
    assert!(
        st["exec_to_first_request_us"][2].is_number(),
        "exec to first request is measured: {st}"
    );
    // ... and from the execve's entry, which is never negative.
    assert!(
        st["start_to_first_request_us"][2]
            .as_f64()
            .is_some_and(|us| us >= 0.0),
        "the daemon's reaction is measured: {st}"
    );

    // The same launch not held, and between audits (only a new plan's
    // first launch and every nchk-th are audited): prefetched, followed
    // as a process tree only, so nothing of its pages is recorded.
    fs.evict();
    run_ok(Command::new(&fx).arg("run").arg(&fs.mnt));
    count += 1;
    d.wait_for("the prefetched launch", Duration::from_secs(15), || {
        launches(&dir) == count
    });
    let report = json(&dir.join("last-launch.json"));
    assert_eq!(report["phase_before"], "prefetching", "{report}");
    assert!(
        report["replay"]["data"]["bytes"].as_u64().unwrap() > 1 << 20,
        "prefetched: {report}"
    );
    assert!(
        report["audit_pages"].is_null(),
        "a launch between audits is not recorded: {report}"
    );
    eprintln!(
        "daemon-prefetched launch, not held: exec to first request max {:.0} us",
        d.status()["exec_to_first_request_us"][2]
            .as_f64()
            .unwrap_or(0.0)
    );

    // Files replaced (a package update): detected, and the profile relearns.
    let dir = until_prefetching(&fs, &state, &fx, "ws-launch-fixture", &mut count);
    for name in ["f00", "f01", "f02", "f03", "f04", "f05"] {
        let p = fs.mnt.join("data").join(name);
        let content = std::fs::read(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        std::fs::write(&p, content).unwrap();
    }
    fs.evict();
    run_ok(Command::new(&fx).arg("run").arg(&fs.mnt));
    count += 1;
    d.wait_for(
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
    // While it relearns, its launches are still prefetched with the plan it
    // had: the replay skips the replaced files and reads the others.
    fs.evict();
    run_ok(Command::new(&fx).arg("run").arg(&fs.mnt));
    count += 1;
    d.wait_for("a relearning launch", Duration::from_secs(15), || {
        launches(&dir) == count
    });
    let report = json(&dir.join("last-launch.json"));
    assert_eq!(report["phase_before"], "learning", "{report}");
    assert!(
        report["replay"]["data"]["bytes"].as_u64().unwrap_or(0) > 0
            && report["replay"]["skipped_files"]
                .as_array()
                .is_some_and(|v| v.len() >= 6),
        "a relearning launch is prefetched with the previous plan: {report}"
    );

    // A corrupt plan is reported, ignored, and the profile relearns.
    let dir = until_prefetching(&fs, &state, &fx, "ws-launch-fixture", &mut count);
    let plan = dir.join("plan");
    let mut bytes = std::fs::read(&plan).unwrap();
    let n = bytes.len();
    bytes[n - 3] ^= 0xff;
    std::fs::write(&plan, bytes).unwrap();
    fs.evict();
    run_ok(Command::new(&fx).arg("run").arg(&fs.mnt));
    count += 1;
    d.wait_for(
        "the corrupt plan to be handled",
        Duration::from_secs(15),
        || launches(&dir) == count,
    );
    assert_eq!(json(&dir.join("profile.json"))["phase"], "learning");
    let log = std::fs::read_to_string(&d.log).unwrap();
    assert!(
        log.contains("checksum") && log.contains("relearning"),
        "{log}"
    );
    // The launch that found it may have used the plan the daemon had in
    // memory (it checks the store once the replay has started); the next
    // one sees the change.
    run_ok(Command::new(&fx).arg("run").arg(&fs.mnt));
    count += 1;
    d.wait_for(
        "the launch after the corrupt plan",
        Duration::from_secs(15),
        || launches(&dir) == count,
    );
    assert_learned(&dir);

    // A denied program is never traced, and `learn` does not override it.
    run_ok(Command::new(&denied).arg("run").arg(&fs.mnt));
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        profile_dir(&state, "denied").is_none(),
        "a denied program got a profile"
    );
    let out = d.cli("learn", &[denied.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("deny pattern"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Status talks to the daemon.
    let out = run_ok(
        Command::new(warmstart())
            .arg("status")
            .arg("--state-dir")
            .arg(&state)
            .arg("--socket")
            .arg(&d.socket),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("daemon: pid") && text.contains("ws-launch-fixture"),
        "{text}"
    );
}

/// A shell loop running a tiny program hundreds of times (what build
/// systems and scripts do) makes no profile for it: its first launch is
/// found trivial and the rest are left alone, by the kernel side once
/// the program is known.
#[test]
fn root_daemon_a_storm_of_trivial_launches_makes_no_profile() {
    if !require_root("root_daemon_a_storm_of_trivial_launches_makes_no_profile") {
        return;
    }
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let work = tempfile::tempdir().unwrap();
    let bin = work.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let tiny = bin.join("true");
    let marker = bin.join("marker");
    std::fs::copy("/bin/true", &tiny).unwrap();
    std::fs::copy("/bin/true", &marker).unwrap();
    // The default policy (learn everything) on this test's programs only:
    // the machine's own (the shell running the loop included) are denied.
    // A generous duration bound, so that a loaded machine cannot make
    // `true` look slow; the size bound is the default.
    let config = work.path().join("config.toml");
    std::fs::write(
        &config,
        "learn = \"all\"\ndeny = [\"/usr/*\", \"/bin/*\", \"/sbin/*\", \"/lib/*\", \"/lib64/*\", \
         \"/etc/*\", \"/opt/*\", \"/root/*\", \"/home/*\", \"/work/*\", \"/var/*\", \"/snap/*\", \
         \"*/warmstart\"]\nskip_services = false\nmin_learn_ms = 1000\n[preload]\nenabled = false\n",
    )
    .unwrap();
    let d = Daemon::restart(work.path(), config);
    run_ok(Command::new("/bin/sh").arg("-c").arg(format!(
        "i=0; while [ $i -lt 300 ]; do {}; i=$((i+1)); done",
        tiny.display()
    )));
    // A program asked for by name, launched last: once its profile is
    // written, the launches before it have been decided and finished
    // (one learner, in order). Held at its exec until the daemon follows
    // it: a launch already gone when its exec is read (a loaded machine
    // delays the daemon more than `true` takes) is left alone.
    let out = d.cli("learn", &[marker.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    launch_held(&mut Command::new(&marker), |pid| {
        d.status()["sessions"]
            .as_array()
            .is_some_and(|v| v.iter().any(|s| s["pid"] == pid))
    });
    d.wait_for("the marker's profile", Duration::from_secs(60), || {
        profile_dir(&d.state, "marker-").is_some()
    });
    assert!(
        profile_dir(&d.state, "true-").is_none(),
        "a profile for `true`; daemon log:\n{}",
        std::fs::read_to_string(&d.log).unwrap_or_default()
    );
    let st = d.status();
    assert!(st["trivial_programs"].as_u64() >= Some(1), "{st}");
    // From then on the kernel side leaves `true` alone: its execs wake
    // the daemon no more (a few may still come from a shell it had not
    // yet let go of: its children are followed from their fork).
    let before = st["execs_quieted"].as_u64().unwrap();
    run_ok(Command::new("/bin/sh").arg("-c").arg(format!(
        "i=0; while [ $i -lt 300 ]; do {}; i=$((i+1)); done",
        tiny.display()
    )));
    // The status is published at least once a second.
    let quieted = || d.status()["execs_quieted"].as_u64().unwrap_or(0) - before;
    d.wait_for("execs left to the kernel", Duration::from_secs(10), || {
        quieted() >= 250
    });
}
