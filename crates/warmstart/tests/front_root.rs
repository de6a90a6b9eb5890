//! Which binary runs a launch (root): the small `warmstart` runs a
//! prefetched launch itself, and hands launches that record (learning, an
//! audit) to `warmstart-core`, which launches the program with the
//! environment it was given. The daemon knows both as its own.

mod daemon_util;
mod util;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use daemon_util::*;
use util::*;

/// One launch of `sh` printing the binary that launched it and whether it
/// saw the hand-over mark, then exec'ing the fixture over `mnt`. `extra`
/// are `run`'s options; `-q` among them goes before `run`, as the global
/// option.
fn launch(
    state: &Path,
    report: &Path,
    extra: &[&str],
    mnt: &Path,
) -> (String, String, serde_json::Value) {
    let global: Vec<&str> = extra.iter().copied().filter(|a| *a == "-q").collect();
    let extra: Vec<&str> = extra.iter().copied().filter(|a| *a != "-q").collect();
    let script = format!(
        "readlink /proc/$PPID/exe; echo mark=${{WARMSTART_HANDED_OVER-unset}}; exec {} run {}",
        fixture().display(),
        mnt.display()
    );
    let out = run_ok(
        Command::new(warmstart())
            .args(&global)
            .args(["run", "--strategy", "concurrent", "--profile", "fixture"])
            .arg("--state-dir")
            .arg(state)
            .arg("--report")
            .arg(report)
            .args(extra)
            .args(["--", "sh", "-c", &script]),
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = stdout.lines();
    let parent = lines.next().unwrap_or_default().to_string();
    let mark = lines.next().unwrap_or_default().to_string();
    let r = serde_json::from_slice(&std::fs::read(report).unwrap()).unwrap();
    (parent, mark, r)
}

#[test]
fn root_the_front_prefetches_and_the_core_records() {
    if !require_root("root_the_front_prefetches_and_the_core_records") {
        return;
    }
    let fs = LoopFs::new("ext4", 96);
    run_ok(Command::new(fixture()).arg("gen").arg(&fs.mnt));
    let state = tempfile::tempdir().unwrap();
    let rep = state.path().join("report.json");
    let front = warmstart().canonicalize().unwrap().display().to_string();
    let core = warmstart_core()
        .canonicalize()
        .unwrap()
        .display()
        .to_string();

    // Learning: recorded by the core, two launches (N_rawseq).
    for i in 0..2 {
        fs.evict();
        let (parent, mark, r) = launch(state.path(), &rep, &[], &fs.mnt);
        assert_eq!(r["phase_before"], "learning", "launch {i}: {r}");
        assert_eq!(parent, core, "launch {i}");
        assert_eq!(mark, "mark=unset", "launch {i}");
    }
    // Prefetched: by the front itself.
    fs.evict();
    let (parent, mark, r) = launch(state.path(), &rep, &[], &fs.mnt);
    assert_eq!(r["phase_before"], "prefetching", "{r}");
    assert!(
        r["replay"]["data"]["bytes"].as_u64().unwrap() > 2 << 20,
        "the front's replay prefetched the fixture's data: {r}"
    );
    assert_eq!(parent, front);
    assert_eq!(mark, "mark=unset");
    // So with the global `-q` before `run`.
    fs.evict();
    let (parent, _, r) = launch(state.path(), &rep, &["-q"], &fs.mnt);
    assert_eq!(r["phase_before"], "prefetching", "{r}");
    assert_eq!(parent, front);
    // Audited: traced, so by the core again.
    fs.evict();
    let (parent, _, r) = launch(state.path(), &rep, &["--audit"], &fs.mnt);
    assert_eq!(r["phase_before"], "prefetching", "{r}");
    assert!(r["audit_pages"].as_u64().is_some(), "{r}");
    assert_eq!(parent, core);
}

/// The daemon leaves launches under `warmstart run` to it, whichever of the
/// two binaries runs them: counted and learned twice otherwise.
#[test]
fn root_the_daemon_leaves_launches_of_the_front_and_the_core_alone() {
    if !require_root("root_the_daemon_leaves_launches_of_the_front_and_the_core_alone") {
        return;
    }
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let fs = LoopFs::new("ext4", 96);
    run_ok(Command::new(fixture()).arg("gen").arg(&fs.mnt));
    let work = tempfile::tempdir().unwrap();
    let fx = fixture_as(work.path(), "ws-front-fixture");
    let d = Daemon::start(
        work.path(),
        &format!("[\"{}/*\"]", work.path().display()),
        "[]",
    );
    let state = work.path().join("run-state");
    let rep = work.path().join("report.json");
    // Two learning launches (the core), then a prefetched one (the front).
    for phase in ["learning", "learning", "prefetching"] {
        fs.evict();
        run_ok(
            Command::new(warmstart())
                .args(["run", "--profile", "front", "--state-dir"])
                .arg(&state)
                .arg("--report")
                .arg(&rep)
                .arg("--")
                .arg(&fx)
                .arg("run")
                .arg(&fs.mnt),
        );
        let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&rep).unwrap()).unwrap();
        assert_eq!(r["phase_before"], phase, "{r}");
    }
    // Each wrapper's exec (and each hand-over's) was seen and left alone.
    d.wait_for("the wrappers' execs", Duration::from_secs(15), || {
        d.status()["ignored"].as_u64().unwrap_or(0) >= 3
    });
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        profile_dir(&d.state, "ws-front-fixture"),
        None,
        "the daemon learned a launch of `warmstart run`: {}",
        std::fs::read_to_string(&d.log).unwrap_or_default()
    );
}
