//! End-to-end tests of `warmstart run` (the launch manager) on the real
//! kernel (root): learning, prefetching audited by the recorder, stale
//! files, bad plans, and the wrapper's transparency.

mod util;

use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::Command;

use util::*;

fn run_cmd(state: &Path, extra: &[&str], report: &Path, cmd: &[&str]) -> std::process::Output {
    run(Command::new(warmstart())
        .args(["run", "--strategy", "concurrent", "--state-dir"])
        .arg(state)
        .args(["--profile", "fixture", "--report"])
        .arg(report)
        .args(extra)
        .arg("--")
        .args(cmd))
}

fn report(p: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(p).expect("launch report written"))
        .expect("report is JSON")
}

#[test]
fn root_run_learns_prefetches_and_relearns() {
    if !require_root("root_run_learns_prefetches_and_relearns") {
        return;
    }
    let fs = LoopFs::new("ext4", 96);
    run_ok(Command::new(fixture()).arg("gen").arg(&fs.mnt));
    let state = tempfile::tempdir().unwrap();
    let rep = state.path().join("report.json");
    let fx = fixture().display().to_string();
    let mnt = fs.mnt.display().to_string();
    let cmd = [fx.as_str(), "run", mnt.as_str()];

    // Two learning launches (N_rawseq = 2), the second compiles the plan.
    for i in 0..2 {
        fs.evict();
        let out = run_cmd(state.path(), &[], &rep, &cmd);
        assert!(
            out.status.success(),
            "learning launch {i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r = report(&rep);
        assert_eq!(r["phase_before"], "learning");
    }
    assert_eq!(
        report(&rep)["phase_after"],
        "prefetching",
        "{}",
        report(&rep)
    );

    // Plans say whether the pages the kernel read ahead and no launch used
    // were left out. One asked to keep them (`compile --keep-unused`) is
    // left alone; one from before that pass existed is compiled again
    // after its next launch, without them.
    let prof = state.path().join("profiles").join("fixture");
    let plan_path = prof.join("plan");
    let load = |p: &Path| warmstart_plan::Plan::from_bytes(&std::fs::read(p).unwrap()).unwrap();
    let fresh = load(&plan_path);
    assert!(
        fresh.meta.passes.iter().any(|p| p == "used-only"),
        "{:?}",
        fresh.meta.passes
    );
    run_ok(
        Command::new(warmstart())
            .args(["compile", "-q", "--keep-unused"])
            .arg(prof.join("trace-0"))
            .arg(prof.join("trace-1"))
            .arg("-o")
            .arg(&plan_path),
    );
    let kept = load(&plan_path);
    assert!(kept.meta.passes.iter().any(|p| p == "unused-kept"));
    fs.evict();
    let out = run_cmd(state.path(), &[], &rep, &cmd);
    assert!(out.status.success());
    let r = report(&rep);
    assert!(
        r["compiled"].is_null(),
        "a plan keeping them is left alone: {r}"
    );
    assert_eq!(load(&plan_path).meta.passes, kept.meta.passes);
    // The same plan as an older warmstart wrote it: no word of the pass.
    let mut old = kept.clone();
    old.meta.passes.retain(|p| p != "unused-kept");
    std::fs::write(&plan_path, old.to_bytes()).unwrap();
    fs.evict();
    let out = run_cmd(state.path(), &[], &rep, &cmd);
    assert!(out.status.success());
    let r = report(&rep);
    assert_eq!(r["phase_after"], "prefetching", "{r}");
    assert!(
        r["replay"]["data"]["bytes"].as_u64().unwrap() > 2 << 20,
        "the old plan still prefetches: {r}"
    );
    assert!(r["compiled"].is_string(), "compiled again: {r}");
    let again = load(&plan_path);
    assert_eq!(again.meta.passes, fresh.meta.passes);
    assert_eq!(again.data_bytes(), fresh.data_bytes());
    assert!(again.data_bytes() <= kept.data_bytes());

    // A cold, prefetched, audited launch: the application reads (almost)
    // nothing from storage itself.
    fs.evict();
    let out = run_cmd(state.path(), &["--audit"], &rep, &cmd);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = report(&rep);
    assert_eq!(r["phase_before"], "prefetching");
    assert_eq!(r["phase_after"], "prefetching", "{r}");
    assert!(r["compiled"].is_null(), "compiled again only once: {r}");
    // What the wrapper cost its caller after the program exited: the
    // replay is cancelled at the exit, so no more than a few requests and
    // a profile save (milliseconds here), far from the replay's length.
    let after = r["after_exit_ms"].as_f64().unwrap();
    assert!((0.0..2000.0).contains(&after), "{r}");
    // The replay started before the program, so within the launch.
    let before = r["before_replay_ms"].as_f64().unwrap();
    assert!(
        before >= 0.0 && before < r["wall_ms"].as_f64().unwrap(),
        "{r}"
    );
    let touched: u64 = touches(&out.stdout).iter().map(|t| t.2).sum();
    let self_read = r["audit_pages_from_storage"].as_u64().unwrap();
    assert!(
        r["replay"]["data"]["bytes"].as_u64().unwrap() > 2 << 20,
        "the replay prefetched the fixture's data: {r}"
    );
    // Not none: the tests of this file run side by side, and under their
    // load the fixture can reach a few planned pages before the replay
    // has issued them (7 of 465 in one CI run). Without the replay it
    // reads them all.
    assert!(
        (self_read as f64) <= 0.05 * touched as f64,
        "the fixture read {self_read} of its {touched} touched pages itself (> 5%): {r}"
    );

    // The plan is resident now. A launch that asks for no report is exec'd
    // in place: the command keeps the wrapper's pid, and the launch counts.
    // Its warm check reads the windows saved with the plan, not the plan.
    let windows: serde_json::Value =
        serde_json::from_slice(&std::fs::read(prof.join("warm-check.json")).unwrap()).unwrap();
    assert_eq!(
        windows["windows"].as_array().unwrap().len(),
        16,
        "{windows}"
    );
    let child = Command::new(warmstart())
        .args(["run", "--state-dir"])
        .arg(state.path())
        .args(["--profile", "fixture", "--"])
        .args(cmd)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("pid {pid}\n")),
        "a warm launch runs as the wrapper's own process: {}",
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or("")
    );
    let status = run_ok(
        Command::new(warmstart())
            .args(["status", "--json", "--state-dir"])
            .arg(state.path()),
    );
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["profiles"][0]["launches"], 6, "{status}");

    // Half of the files replaced: detected, skipped, counted, relearned.
    let data = fs.mnt.join("data");
    for name in ["f00", "f02", "f04", "f06", "f01", "f03"] {
        let p = data.join(name);
        let content = std::fs::read(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        std::fs::write(&p, content).unwrap();
    }
    fs.evict();
    let out = run_cmd(state.path(), &[], &rep, &cmd);
    assert!(out.status.success());
    let r = report(&rep);
    let skipped = r["replay"]["skipped_files"].as_array().unwrap();
    assert!(skipped.len() >= 6, "replaced files are skipped: {r}");
    assert!(
        skipped
            .iter()
            .all(|s| s["reason"] == "changed" || s["reason"] == "missing"),
        "{r}"
    );
    assert_eq!(
        r["phase_after"], "learning",
        "changed files trigger relearning: {r}"
    );
    assert!(
        r["relearn_reason"].as_str().unwrap().contains("changed"),
        "{r}"
    );
    assert!(!prof.join("warm-check.json").exists());

    // Relearning launches are still prefetched with the plan it had (the
    // replay skips the replaced files) and recorded; after N_rawseq of them
    // the new plan replaces the previous one.
    for i in 0..2 {
        fs.evict();
        let out = run_cmd(state.path(), &[], &rep, &cmd);
        assert!(out.status.success());
        let r = report(&rep);
        assert_eq!(r["phase_before"], "learning", "{r}");
        assert!(
            r["replay"]["data"]["bytes"].as_u64().unwrap_or(0) > 0
                && r["replay"]["skipped_files"].as_array().unwrap().len() >= 6,
            "relearning launch {i} is prefetched with the previous plan: {r}"
        );
    }
    assert_eq!(report(&rep)["phase_after"], "prefetching");
    assert!(prof.join("plan").exists() && !prof.join("plan.previous").exists());
    assert!(prof.join("warm-check.json").exists());
}

#[test]
fn root_run_sorts_the_plan_of_a_device_that_seeks() {
    if !require_root("root_run_sorts_the_plan_of_a_device_that_seeks") {
        return;
    }
    use std::os::unix::fs::MetadataExt as _;
    let fs = LoopFs::new("ext4", 96);
    run_ok(Command::new(fixture()).arg("gen").arg(&fs.mnt));
    let state = tempfile::tempdir().unwrap();
    // The probe's verdict, as a hard disk measures (a random read costs
    // more than half a sequential MiB), for the devices the launch reads:
    // the loop device and the one holding the fixture and its libraries.
    let mut devices = warmstart_launch::device::DeviceCache::default();
    for p in [fs.mnt.clone(), fixture()] {
        let verdict = warmstart_launch::device::Verdict::from_times(9_000.0, Some(7_000.0));
        devices
            .devices
            .insert(std::fs::metadata(p).unwrap().dev(), verdict);
    }
    devices.save(&state.path().join("devices.json"));
    let rep = state.path().join("report.json");
    let fx = fixture().display().to_string();
    let mnt = fs.mnt.display().to_string();
    let cmd = [fx.as_str(), "run", mnt.as_str()];
    let launch = || {
        fs.evict();
        let out = run(Command::new(warmstart())
            .args(["run", "--state-dir"])
            .arg(state.path())
            .args(["--profile", "fixture", "--report"])
            .arg(&rep)
            .arg("--")
            .args(cmd));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        report(&rep)
    };
    for _ in 0..2 {
        launch();
    }
    let plan_path = state.path().join("profiles/fixture/plan");
    let load = |p: &Path| warmstart_plan::Plan::from_bytes(&std::fs::read(p).unwrap()).unwrap();
    assert!(
        load(&plan_path).meta.sorted,
        "compiled in physical order: {} {}",
        report(&rep),
        std::fs::read_to_string(state.path().join("devices.json")).unwrap()
    );
    let r = launch();
    assert_eq!(r["strategy"], "sorted", "{r}");
    assert!(r["held_ms"].as_f64().is_some(), "the program was held: {r}");

    // A plan in first-use order (compiled before the device was measured)
    // is not held for: it runs beside the program, and is compiled again.
    let prof = state.path().join("profiles/fixture");
    run_ok(
        Command::new(warmstart())
            .args(["compile", "-q"])
            .arg(prof.join("trace-0"))
            .arg(prof.join("trace-1"))
            .arg("-o")
            .arg(&plan_path),
    );
    assert!(!load(&plan_path).meta.sorted);
    let r = launch();
    assert_eq!(r["strategy"], "concurrent", "{r}");
    assert!(r["compiled"].is_string(), "compiled again: {r}");
    assert!(load(&plan_path).meta.sorted);
}

#[test]
fn root_run_rejects_bad_plans_and_still_launches() {
    if !require_root("root_run_rejects_bad_plans_and_still_launches") {
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let rep = state.path().join("report.json");
    let cmd = ["python3", "-c", "import json, email; print('ran')"];
    for _ in 0..2 {
        run_ok(
            Command::new(warmstart())
                .args(["run", "--state-dir"])
                .arg(state.path())
                .args(["--profile", "py", "--"])
                .args(cmd),
        );
    }
    let plan = state.path().join("profiles/py/plan");
    let good = std::fs::read(&plan).expect("a plan after two launches");
    let mut corrupt = good.clone();
    let n = corrupt.len();
    corrupt[n / 2] ^= 0x55;
    let mut future = good.clone();
    future[8] = 99;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("corrupt", corrupt, "checksum"),
        ("truncated", good[..good.len() / 2].to_vec(), "truncated"),
        ("foreign version", future, "version 99"),
        (
            "not a plan",
            b"#!/bin/sh\necho hello\n".to_vec(),
            "not a warmstart plan",
        ),
    ];
    for (name, bytes, want) in cases {
        // Restore a prefetching profile with the bad plan in place.
        let prof_path = state.path().join("profiles/py/profile.json");
        let mut prof: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&prof_path).unwrap()).unwrap();
        prof["phase"] = "prefetching".into();
        std::fs::write(&prof_path, serde_json::to_vec(&prof).unwrap()).unwrap();
        std::fs::write(&plan, &bytes).unwrap();
        let out = run(Command::new(warmstart())
            .args(["run", "--state-dir"])
            .arg(state.path())
            .args(["--profile", "py", "--report"])
            .arg(&rep)
            .arg("--")
            .args(cmd));
        assert!(out.status.success(), "{name}: the launch proceeds");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n", "{name}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(want) && err.contains("without prefetching"),
            "{name}: {err}"
        );
        let r = report(&rep);
        assert!(r["replay"].is_null(), "{name}: nothing replayed");
        assert_eq!(r["phase_after"], "learning", "{name}: relearning");
    }
}

/// A profile.json that does not parse loses nothing: the profile is
/// rebuilt from its traces and plan, and the launch goes on with them.
#[test]
fn root_run_rebuilds_a_profile_that_does_not_parse() {
    if !require_root("root_run_rebuilds_a_profile_that_does_not_parse") {
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let rep = state.path().join("report.json");
    let cmd = ["python3", "-c", "import json, email; print('ran')"];
    let dir = state.path().join("profiles/py2");
    let launch = || {
        run(Command::new(warmstart())
            .args(["run", "--state-dir"])
            .arg(state.path())
            .args(["--profile", "py2", "--report"])
            .arg(&rep)
            .arg("--")
            .args(cmd))
    };
    for _ in 0..2 {
        assert!(launch().status.success());
    }
    let plan = std::fs::read(dir.join("plan")).expect("a plan after two launches");
    std::fs::write(dir.join("profile.json"), b"{\"name\": \"py2\", \"pha").unwrap();
    let out = launch();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("did not parse")
            && err.contains("rebuilt the profile from its 2 trace(s) and its plan"),
        "{err}"
    );
    assert_eq!(report(&rep)["phase_before"], "prefetching");
    assert_eq!(
        std::fs::read(dir.join("plan")).unwrap(),
        plan,
        "the plan is kept"
    );
    assert_eq!(
        std::fs::read(dir.join("profile.json.corrupt")).unwrap(),
        b"{\"name\": \"py2\", \"pha",
        "the unreadable file is kept aside"
    );
    let prof: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("profile.json")).unwrap()).unwrap();
    assert_eq!(prof["phase"], "prefetching");
    assert_eq!(prof["traces"].as_array().map(Vec::len), Some(2));

    // A prefetched launch saves its counters without syncing them, so a
    // crash on a file system that does not flush a file renamed over
    // another can leave it empty: rebuilt the same way.
    std::fs::write(dir.join("profile.json"), b"").unwrap();
    let out = launch();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("rebuilt the profile from its 2 trace(s) and its plan"),
        "{err}"
    );
    let prof: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("profile.json")).unwrap()).unwrap();
    assert_eq!(prof["phase"], "prefetching");
}

#[test]
fn root_run_wrapper_is_transparent() {
    if !require_root("root_run_wrapper_is_transparent") {
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let script = state.path().join("no-shebang");
    std::fs::write(&script, "echo ran \"$@\"\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // Every phase: learning (recorded), then prefetching (replayed).
    for round in 0..4 {
        let w = |args: &[&str]| {
            run(Command::new(warmstart())
                .args(["-q", "run", "--state-dir"])
                .arg(state.path())
                .args(args))
        };
        let out = w(&[
            "--profile",
            "exit",
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; exit 7",
        ]);
        assert_eq!(out.status.code(), Some(7), "round {round}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n");
        assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n");
        let out = w(&["--profile", "sig", "--", "sh", "-c", "kill -TERM $$"]);
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(out.status.signal(), Some(15), "round {round}: same signal");
        // Environment and working directory are the command's.
        let out = run(Command::new(warmstart())
            .args(["-q", "run", "--state-dir"])
            .arg(state.path())
            .args([
                "--profile",
                "env",
                "--",
                "sh",
                "-c",
                "echo $WS_TEST_VAR; pwd",
            ])
            .env("WS_TEST_VAR", "hello")
            .current_dir("/usr"));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n/usr\n");
        // Signals the caller ignored stay ignored (`nohup`).
        let mut cmd = Command::new(warmstart());
        cmd.args(["-q", "run", "--state-dir"])
            .arg(state.path())
            .args([
                "--profile",
                "nohup",
                "--",
                "grep",
                "SigIgn",
                "/proc/self/status",
            ]);
        // SAFETY: only signal(2) between fork and exec. SIGINT is set to
        // its default too: a test run in the background of a shell without
        // job control inherits it ignored.
        unsafe {
            cmd.pre_exec(|| {
                libc::signal(libc::SIGHUP, libc::SIG_IGN);
                libc::signal(libc::SIGINT, libc::SIG_DFL);
                Ok(())
            });
        }
        let out = run(&mut cmd);
        let line = String::from_utf8_lossy(&out.stdout).to_string();
        let mask = u64::from_str_radix(line.split_whitespace().nth(1).unwrap_or("0"), 16).unwrap();
        assert_eq!(
            mask & (1 << (libc::SIGHUP - 1)),
            1 << (libc::SIGHUP - 1),
            "round {round}: {line}"
        );
        assert_eq!(mask & (1 << (libc::SIGINT - 1)), 0, "round {round}: {line}");
        // Arguments are bytes, not necessarily UTF-8.
        let out = run(Command::new(warmstart())
            .args(["-q", "run", "--state-dir"])
            .arg(state.path())
            .args(["--profile", "bytes", "--", "printf", "%s"])
            .arg(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(b"a\xff\xfeb")));
        assert_eq!(out.status.code(), Some(0), "round {round}: {out:?}");
        assert_eq!(out.stdout, b"a\xff\xfeb", "round {round}");
        // A script without `#!` runs with /bin/sh, as from a shell, in
        // place (warm rounds) too.
        let out = w(&[
            "--profile",
            "noshebang",
            "--",
            script.to_str().unwrap(),
            "arg",
        ]);
        assert_eq!(out.status.code(), Some(0), "round {round}: {out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "ran arg\n",
            "round {round}"
        );
    }
    // Job control without a terminal: a command stopped by SIGSTOP and
    // continued by someone else (top, a debugger) does not leave the
    // wrapper stopped for ever; SIGTSTP sent to the wrapper alone stops
    // the command, and SIGCONT to the wrapper resumes it. (With a terminal
    // the wrapper also stops with a command stopped for job control, so a
    // shell gets its terminal back; checked below through a pty.) Each in a
    // process group of its own whose parent (this test) is outside it:
    // the kernel discards SIGTSTP in an orphaned group, which the test's
    // own group may be under `make`.
    let state_of = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(") ")
                    .map(|(_, r)| r.chars().next().unwrap_or('?'))
            })
    };
    let command_of = |wrapper: u32| -> Option<u32> {
        std::fs::read_dir(format!("/proc/{wrapper}/task"))
            .ok()?
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
            .flat_map(|c| {
                c.split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect::<Vec<u32>>()
            })
            .next()
    };
    let until = |what: &str, mut ok: Box<dyn FnMut() -> bool + '_>| {
        let t0 = std::time::Instant::now();
        while !ok() {
            assert!(t0.elapsed().as_secs() < 20, "{what}");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    let launch = |profile: &str, script: &str| {
        Command::new(warmstart())
            .args(["-q", "run", "--state-dir"])
            .arg(state.path())
            .args(["--profile", profile, "--", "sh", "-c", script])
            .process_group(0)
            .spawn()
            .unwrap()
    };
    let mut child = launch("stop", "kill -STOP $$; exit 3");
    let mut cmd = None;
    until(
        "the command did not stop",
        Box::new(|| {
            cmd = command_of(child.id()).filter(|&c| state_of(c) == Some('T'));
            cmd.is_some()
        }),
    );
    // SAFETY: sending a signal to a process we started.
    unsafe { libc::kill(cmd.unwrap() as i32, libc::SIGCONT) };
    assert_eq!(child.wait().unwrap().code(), Some(3), "resumed and ended");
    let mut child = launch("tstp", "sleep 1; exit 4");
    std::thread::sleep(std::time::Duration::from_millis(300));
    // SAFETY: sending a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTSTP) };
    until(
        "SIGTSTP did not stop the command",
        Box::new(|| {
            command_of(child.id()).and_then(state_of) == Some('T')
                || state_of(child.id()) == Some('T')
        }),
    );
    // SAFETY: as above.
    unsafe { libc::kill(child.id() as i32, libc::SIGCONT) };
    assert_eq!(child.wait().unwrap().code(), Some(4), "resumed and ended");
    // With a terminal: Ctrl-Z in an interactive shell stops the command
    // and the wrapper with it, reported as SIGTSTP (148) as for the
    // command alone, and `fg` resumes both, twice. Driven through a pty.
    let pty_script = r#"
import os, pty, select, sys, time
ws, state = sys.argv[1], sys.argv[2]
pid, fd = pty.fork()
if pid == 0:
    os.execvp("bash", ["bash", "--norc", "--noprofile", "-i"])
out = b""
def rd(t):
    global out
    end = time.time() + t
    while time.time() < end:
        if select.select([fd], [], [], 0.05)[0]:
            try:
                out += os.read(fd, 4096)
            except OSError:
                return
rd(0.5)
def until(cond, t):
    end = time.time() + t
    while time.time() < end and not cond():
        rd(0.05)
# The command runs until the flag exists, not for a time: a stopped
# sleep's clock keeps running, and on a loaded machine it once ended
# before the second Ctrl-Z. Each key waits for what the one before it
# does, not for a time: under the whole suite's load the first launch
# (a learning one) once took longer than a fixed pause to start.
flag = os.path.join(state, "go")
started = os.path.join(state, "started")
# The marker is printed, never typed whole (the terminal echoes the line).
cmd = f'{ws} -q run --state-dir {state} --profile pty -- sh -c "touch {started}; until [ -e {flag} ]; do sleep 0.05; done; echo fin""ished"; echo rc=$?\n'
os.write(fd, cmd.encode())
until(lambda: os.path.exists(started), 60)
rd(0.3)
os.write(fd, b"\x1a")
until(lambda: out.count(b"Stopped") >= 1, 30)
os.write(fd, b"fg\n")
rd(0.5)
os.write(fd, b"\x1a")
until(lambda: out.count(b"Stopped") >= 2, 30)
open(flag, "w").close()
os.write(fd, b"fg\n")
until(lambda: b"finished" in out, 30)
os.write(fd, b"exit\n")
rd(0.3)
sys.stdout.write(out.decode(errors="replace"))
"#;
    let out = run(Command::new("python3")
        .args(["-c", pty_script])
        .arg(warmstart())
        .arg(state.path()));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("rc=148"),
        "Ctrl-Z reported as SIGTSTP: {text}"
    );
    assert_eq!(text.matches("Stopped").count(), 2, "stopped twice: {text}");
    assert!(text.contains("finished"), "resumed to its end: {text}");

    // SIGTERM to the wrapper reaches the command.
    let mut child = Command::new(warmstart())
        .args(["-q", "run", "--state-dir"])
        .arg(state.path())
        .args(["--profile", "term", "--", "sleep", "30"])
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(800));
    // SAFETY: sending a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let st = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        st.signal(),
        Some(15),
        "the command died of the forwarded SIGTERM"
    );
    // A missing command is a clear error, with the status a shell gives:
    // 127 not found, 126 found but not runnable.
    let out = run(Command::new(warmstart())
        .args(["run", "--state-dir"])
        .arg(state.path())
        .args(["--", "/nonexistent/cmd"]));
    assert_eq!(out.status.code(), Some(127));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot start"), "{err}");
    assert_eq!(err.matches("No such file").count(), 1, "said once: {err}");
    let out = run(Command::new(warmstart())
        .args(["run", "--state-dir"])
        .arg(state.path())
        .args(["--", "/usr"]));
    assert_eq!(out.status.code(), Some(126));
    // A state directory that cannot be used still launches the command.
    let file = state.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let out = run(Command::new(warmstart())
        .args(["run", "--state-dir"])
        .arg(file.join("state"))
        .args(["--", "sh", "-c", "echo launched; exit 5"]));
    assert_eq!(out.status.code(), Some(5));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "launched\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("launching without prefetching"));
}

/// Whether some process holds `dir`'s flock (the profile lock).
fn locked(dir: &Path) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(f) = std::fs::File::open(dir) else {
        return false;
    };
    // SAFETY: flock on a descriptor we own.
    let free = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    !free
}

#[test]
fn root_run_two_launches_of_one_profile_do_not_race() {
    if !require_root("root_run_two_launches_of_one_profile_do_not_race") {
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let flag = state.path().join("go");
    // The first launch learns until the test lets it finish.
    let script = format!("while [ ! -e {} ]; do sleep 0.05; done", flag.display());
    let first = Command::new(warmstart())
        .args(["run", "--state-dir"])
        .arg(state.path())
        .args(["--profile", "shared", "--report"])
        .arg(state.path().join("first.json"))
        .args(["--", "/bin/sh", "-c", &script])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let dir = state.path().join("profiles/shared");
    let t = std::time::Instant::now();
    while !locked(&dir) {
        assert!(
            t.elapsed().as_secs() < 30,
            "the first run never took the lock"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let second = run(Command::new(warmstart())
        .args(["run", "--state-dir"])
        .arg(state.path())
        .args(["--profile", "shared", "--", "/bin/true"]));
    assert!(second.status.success());
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(err.contains("in use by another warmstart"), "{err}");
    std::fs::write(&flag, b"").unwrap();
    let out = first.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Only the first launch counted and left a trace.
    let prof: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("profile.json")).unwrap()).unwrap();
    assert_eq!(prof["launches"], 1, "{prof}");
    assert_eq!(prof["traces"], serde_json::json!(["trace-0"]), "{prof}");
    assert!(!locked(&dir), "the lock outlived its launch");
}

#[test]
fn root_run_report_never_follows_a_symlink() {
    if !require_root("root_run_report_never_follows_a_symlink") {
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let victim = state.path().join("victim");
    std::fs::write(&victim, b"keep").unwrap();
    let rep = state.path().join("report.json");
    std::os::unix::fs::symlink(&victim, &rep).unwrap();
    run_ok(
        Command::new(warmstart())
            .args(["run", "--state-dir"])
            .arg(state.path())
            .args(["--profile", "rep", "--report"])
            .arg(&rep)
            .args(["--", "/bin/true"]),
    );
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
    assert!(!std::fs::symlink_metadata(&rep).unwrap().is_symlink());
    report(&rep);
}
