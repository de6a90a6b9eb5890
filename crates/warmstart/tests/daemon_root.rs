//! `warmstart daemon` end to end (root): launches nobody wrapped are
//! learned, then prefetched; changed files relearn; denied programs are
//! never traced; a corrupt plan is reported and ignored; `learn` and
//! `forget` go through the daemon; profiles outlive the daemon, whose
//! crash leaves the programs it watches alone; exec chains are followed.

mod util;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use util::*;

/// One daemon at a time: each traces every exec on the machine.
static SERIAL: Mutex<()> = Mutex::new(());

/// A daemon for one test: its own policy, state directory and socket.
struct Daemon {
    _proc: Background,
    config: PathBuf,
    state: PathBuf,
    socket: PathBuf,
    log: PathBuf,
}

impl Daemon {
    /// `allow` and `deny` are TOML arrays of globs.
    fn start(dir: &Path, allow: &str, deny: &str) -> Daemon {
        let config = dir.join("config.toml");
        // idle_s: a launch held at exec (below) has no I/O for a while.
        // No idle preloads: the tests evict the test file system (unmount
        // it) and measure launches that find it cold.
        std::fs::write(
            &config,
            format!(
                "learn = \"allow-list\"\nallow = {allow}\ndeny = {deny}\nskip_services = false\nmin_launch_kib = 64\nidle_s = 20.0\ntimeout_s = 60.0\n[preload]\nenabled = false\n"
            ),
        )
        .unwrap();
        Daemon::restart(dir, config)
    }

    fn restart(dir: &Path, config: PathBuf) -> Daemon {
        let (state, socket, log) = (dir.join("state"), dir.join("sock"), dir.join("daemon.log"));
        let _ = std::fs::remove_file(&socket);
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let proc = Background::spawn(
            Command::new(warmstart())
                .arg("daemon")
                .arg("--config")
                .arg(&config)
                .arg("--state-dir")
                .arg(&state)
                .arg("--socket")
                .arg(&socket)
                .stdout(Stdio::null())
                .stderr(log_file),
        );
        wait_for("the daemon's socket", Duration::from_secs(20), || {
            socket.exists()
        });
        Daemon {
            _proc: proc,
            config,
            state,
            socket,
            log,
        }
    }

    fn pid(&self) -> u32 {
        self._proc.id()
    }

    /// `warmstart SUBCOMMAND --socket S ARGS`.
    fn cli(&self, sub: &str, args: &[&str]) -> Output {
        run(Command::new(warmstart())
            .arg(sub)
            .arg("--socket")
            .arg(&self.socket)
            .args(args))
    }

    /// The daemon's own status (`warmstart status --json`), null if it
    /// did not answer.
    fn status(&self) -> serde_json::Value {
        let out = self.cli("status", &["--json"]);
        serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .map(|v| v["daemon"].clone())
            .unwrap_or(serde_json::Value::Null)
    }
}

/// Launches `cmd` stopped right after its exec (ptrace), lets it go once
/// `ready(pid)` holds, and returns its output. The exec is the daemon's
/// cue, so this is still a launch nobody wrapped: only the program's
/// first instruction waits.
fn launch_held(cmd: &mut Command, mut ready: impl FnMut(u32) -> bool) -> Output {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure only makes a system call between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.stdout(Stdio::piped()).spawn().expect("spawn");
    let pid = child.id() as i32;
    let mut st = 0;
    // SAFETY: waiting for our own child's exec stop.
    let r = unsafe { libc::waitpid(pid, &mut st, 0) };
    assert!(
        r == pid && libc::WIFSTOPPED(st) && libc::WSTOPSIG(st) == libc::SIGTRAP,
        "the child stops at its exec"
    );
    let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for("the daemon to be ready", Duration::from_secs(30), || {
            ready(pid as u32)
        })
    }));
    // SAFETY: detaching from our stopped tracee; it goes on without a signal.
    unsafe { libc::ptrace(libc::PTRACE_DETACH, pid, 0, 0) };
    let out = child.wait_with_output().expect("wait");
    if let Err(e) = waited {
        std::panic::resume_unwind(e);
    }
    assert!(out.status.success(), "{cmd:?}: {}", out.status);
    out
}

/// Data pages of files under `dir` that the audited launch read from
/// storage itself.
fn self_read_pages(audit: &serde_json::Value, dir: &Path) -> u64 {
    let dir = dir.display().to_string();
    audit["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["path"].as_str().is_some_and(|p| p.starts_with(&dir)))
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
        .sum()
}

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

/// The fixture under `name` in `dir`.
fn fixture_as(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::copy(fixture(), &p).unwrap();
    p
}

fn launches(dir: &Path) -> u64 {
    json(&dir.join("profile.json"))["launches"]
        .as_u64()
        .unwrap_or(0)
}

/// Launches `exe run MNT` (cold) until its profile `prefix` has a plan (at
/// most four times), waiting each time for the daemon to take the launch;
/// `count` is the profile's launch count so far. Returns the profile's
/// directory.
fn until_prefetching(
    fs: &LoopFs,
    state: &Path,
    exe: &Path,
    prefix: &str,
    count: &mut u64,
) -> PathBuf {
    for _ in 0..4 {
        fs.evict();
        run_ok(Command::new(exe).arg("run").arg(&fs.mnt));
        *count += 1;
        let c = *count;
        wait_for(
            "the daemon to take the launch",
            Duration::from_secs(15),
            || profile_dir(state, prefix).is_some_and(|d| launches(&d) == c),
        );
        let d = profile_dir(state, prefix).unwrap();
        if json(&d.join("profile.json"))["phase"] == "prefetching" {
            return d;
        }
    }
    panic!("no plan for {prefix} after four launches");
}

/// Whether the plan (`warmstart show --format json`) has a file under `dir`.
fn has_files_under(plan: &serde_json::Value, dir: &Path) -> bool {
    let dir = dir.display().to_string();
    plan["files"].as_array().is_some_and(|files| {
        files
            .iter()
            .any(|f| f["path"].as_str().is_some_and(|p| p.starts_with(&dir)))
    })
}

/// The profile's last launch was recorded to learn, not prefetched: the
/// daemon decided it from what it knows of the profile (the phase in
/// `last-launch.json` is the one read when the launch ended).
fn assert_learned(profile: &Path) {
    let report = json(&profile.join("last-launch.json"));
    assert!(
        report["phase_before"] == "learning"
            && report["miss_ratio"].is_null()
            && report["replay"].is_null(),
        "the launch was prefetched: {report}"
    );
}

/// Whether the daemon follows `pid` as a prefetched launch whose replay
/// has issued its whole schedule.
fn replay_issued(d: &Daemon, pid: u32) -> bool {
    d.status()["sessions"].as_array().is_some_and(|v| {
        v.iter()
            .any(|s| s["pid"] == pid && s["mode"] == "prefetching" && s["replay_issued"] == true)
    })
}

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
    // latency is measured and reported below, and in docs/daemon.md);
    // what is asserted is that the daemon recognised the launch,
    // prefetched the right pages into the right files, and audited it.
    fs.evict();
    let out = launch_held(Command::new(&fx).arg("run").arg(&fs.mnt), |pid| {
        replay_issued(&d, pid)
    });
    let touched: u64 = touches(&out.stdout).iter().map(|t| t.2).sum();
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
    wait_for("the prefetched launch", Duration::from_secs(15), || {
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
    // While it relearns, its launches are still prefetched with the plan it
    // had: the replay skips the replaced files and reads the others.
    fs.evict();
    run_ok(Command::new(&fx).arg("run").arg(&fs.mnt));
    count += 1;
    wait_for("a relearning launch", Duration::from_secs(15), || {
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
    wait_for(
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
    wait_for(
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

#[test]
fn root_daemon_learn_forget_restart_crash_and_exec_chains() {
    if !require_root("root_daemon_learn_forget_restart_crash_and_exec_chains") {
        return;
    }
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let fs = LoopFs::new("ext4", 96);
    run_ok(Command::new(fixture()).arg("gen").arg(&fs.mnt));
    let work = tempfile::tempdir().unwrap();
    let allowed = work.path().join("allowed");
    let other_dir = work.path().join("other");
    std::fs::create_dir_all(&allowed).unwrap();
    std::fs::create_dir_all(&other_dir).unwrap();
    let fx = fixture_as(&allowed, "ws-launch-fixture");
    let other = fixture_as(&other_dir, "other-fixture");
    let script = |name: &str, body: String| {
        use std::os::unix::fs::PermissionsExt;
        let p = allowed.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    };
    // A launcher that execs the program, and one that runs it as a child.
    let exec_sh = script("exec-fixture.sh", format!("exec {} \"$@\"", fx.display()));
    let child_sh = script("child-fixture.sh", format!("{} \"$@\"", fx.display()));
    let d = Daemon::start(work.path(), &format!("[\"{}/*\"]", allowed.display()), "[]");
    let state = d.state.clone();

    // Outside the allow list: not learned, until `warmstart learn` says so.
    run_ok(Command::new(&other).arg("run").arg(&fs.mnt));
    std::thread::sleep(Duration::from_millis(500));
    assert!(profile_dir(&state, "other-fixture").is_none());
    let out = d.cli("learn", &[other.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("learns"));
    let mut other_count = 0;
    let other_prof = until_prefetching(&fs, &state, &other, "other-fixture", &mut other_count);
    // Learning it again starts it over: back to learning, plan dropped.
    let out = run_ok(
        Command::new(warmstart())
            .args(["learn", "--socket"])
            .arg(&d.socket)
            .arg(&other),
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("back to learning"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(json(&other_prof.join("profile.json"))["phase"], "learning");
    assert!(!other_prof.join("plan").exists());
    // ... and the daemon, which keeps profiles and plans in memory, knows
    // it at once: the next launch is learned, not prefetched.
    let before = launches(&other_prof);
    run_ok(Command::new(&other).arg("run").arg(&fs.mnt));
    wait_for("the relearned launch", Duration::from_secs(15), || {
        launches(&other_prof) == before + 1
    });
    assert_learned(&other_prof);

    // An exec chain is named by the program it ends in: a launcher
    // script that execs the fixture is a launch of the fixture.
    let mut count = 0;
    let fx_prof = until_prefetching(&fs, &state, &fx, "ws-launch-fixture", &mut count);
    fs.evict();
    run_ok(Command::new(&exec_sh).arg("run").arg(&fs.mnt));
    count += 1;
    wait_for("the launcher's launch", Duration::from_secs(15), || {
        launches(&fx_prof) == count
    });
    let report = json(&fx_prof.join("last-launch.json"));
    assert_eq!(report["phase_before"], "prefetching", "{report}");
    assert!(
        profile_dir(&state, "exec-fixture.sh").is_none()
            && profile_dir(&state, "sh-").is_none()
            && profile_dir(&state, "dash-").is_none(),
        "the launcher got a profile of its own"
    );
    // A launcher allowed by the list stays allowed when it execs a program
    // the list does not name (libreoffice's `soffice` script execs
    // `oosplash`): the launch is learned, named by the program it ends in.
    // The script execs at once, usually before the daemon wakes: the exec
    // event's own command line names the script (not /proc, which by then
    // shows the program).
    let outside = work.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let third = fixture_as(&outside, "third-fixture");
    let exec_third = script("exec-third.sh", format!("exec {} \"$@\"", third.display()));
    let mut third_count = 0;
    let third_prof = until_prefetching(&fs, &state, &exec_third, "third-fixture", &mut third_count);
    // Launched directly, outside the list, it is not followed.
    run_ok(Command::new(&third).arg("run").arg(&fs.mnt));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(launches(&third_prof), third_count);

    // The other way round, like `env app`: a launcher outside the list
    // execs a program on it. The launcher's exec is refused, usually once
    // the program's exec has already been traced; that refusal must not
    // stop the program's launch from being recorded and learned.
    let fourth = fixture_as(&allowed, "fourth-fixture");
    let via = {
        use std::os::unix::fs::PermissionsExt;
        let p = outside.join("via-outside.sh");
        std::fs::write(&p, format!("#!/bin/sh\nexec {} \"$@\"\n", fourth.display())).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    };
    let mut fourth_count = 0;
    let fourth_prof = until_prefetching(&fs, &state, &via, "fourth-fixture", &mut fourth_count);
    let plan = show_json(&fourth_prof.join("plan"));
    assert!(
        has_files_under(&plan, &fs.mnt.join("data")),
        "the launch's reads were recorded: {plan}"
    );

    // A script running the program as a child is its own launch, allowed
    // by the script's path (not /bin/sh's; the profile is named after the
    // interpreter in its command line), and its plan holds the child's reads.
    let mut child_count = 0;
    let child_prof = until_prefetching(&fs, &state, &child_sh, "sh-", &mut child_count);
    let command = json(&child_prof.join("profile.json"))["command"].to_string();
    assert!(command.contains("child-fixture.sh"), "{command}");
    let plan = show_json(&child_prof.join("plan"));
    assert!(
        has_files_under(&plan, &fs.mnt.join("data")),
        "the script's plan has the fixture's files: {plan}"
    );
    // Its next launch starts the replay at its execve, as a program's does:
    // the daemon learned from its exec events that the kernel runs it with
    // /bin/sh, whose profile it is.
    let early = |d: &Daemon| d.status()["replays_at_execve"].as_u64().unwrap_or(0);
    let before = early(&d);
    fs.evict();
    run_ok(Command::new(&child_sh).arg("run").arg(&fs.mnt));
    child_count += 1;
    wait_for("the script's launch", Duration::from_secs(15), || {
        launches(&child_prof) == child_count
    });
    assert_eq!(early(&d), before + 1, "{}", d.status());

    // Forgetting goes through the daemon: a launch in progress does not
    // bring the profile back.
    let name = fx_prof.file_name().unwrap().to_str().unwrap().to_string();
    fs.evict();
    launch_held(Command::new(&fx).arg("run").arg(&fs.mnt), |pid| {
        let following = d.status()["sessions"]
            .as_array()
            .is_some_and(|v| v.iter().any(|s| s["pid"] == pid));
        if following {
            let out = d.cli("forget", &[&name]);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                format!("forgot {name}\n")
            );
        }
        following
    });
    wait_for(
        "the forgotten launch to end",
        Duration::from_secs(15),
        || std::fs::read_to_string(&d.log).is_ok_and(|l| l.contains("not kept")),
    );
    assert!(!fx_prof.exists(), "a forgotten profile came back");
    // Forgotten with no launch in progress: the daemon drops what it
    // keeps in memory too, so the next launch is learned afresh, not
    // prefetched with the plan it had.
    let mut count = 0;
    let fx_prof = until_prefetching(&fs, &state, &fx, "ws-launch-fixture", &mut count);
    let out = d.cli("forget", &[&name]);
    assert!(out.status.success());
    run_ok(Command::new(&fx).arg("run").arg(&fs.mnt));
    wait_for(
        "the launch after forgetting",
        Duration::from_secs(15),
        || fx_prof.exists() && launches(&fx_prof) == 1,
    );
    assert_learned(&fx_prof);

    // A crash of the daemon leaves a launch it follows alone.
    fs.evict();
    let launch = Command::new(&fx)
        .arg("run")
        .arg(&fs.mnt)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let config = d.config.clone();
    // SAFETY: SIGKILL to the daemon we started.
    unsafe { libc::kill(d.pid() as i32, libc::SIGKILL) };
    drop(d);
    let out = launch.wait_with_output().unwrap();
    assert!(out.status.success());
    assert!(
        touches(&out.stdout)
            .last()
            .is_some_and(|t| t.0.ends_with("/late")),
        "the launch ran to its end"
    );

    // A profile.json that no longer parses is rebuilt at the start from
    // its traces and plan, not dropped (its counters start over).
    std::fs::write(child_prof.join("profile.json"), b"{\"name\": tru").unwrap();

    // Restarted, the daemon has its profiles and its learn list.
    let d = Daemon::restart(work.path(), config);
    let mut status = serde_json::Value::Null;
    wait_for(
        "the restarted daemon's status",
        Duration::from_secs(10),
        || {
            status = d.status();
            !status.is_null()
        },
    );
    assert!(
        status["learn_list"]
            .as_array()
            .is_some_and(|l| l.iter().any(|k| k == other.to_str().unwrap())),
        "{status}"
    );
    // Ready when its socket appears: its plans are in memory by then, so
    // a launch right after the start (the bench's) is decided from them.
    assert!(
        status["plans_in_memory"].as_u64().is_some_and(|n| n >= 2),
        "{status}"
    );
    // One daemon per state directory and per socket; a file that is not
    // a socket is not taken for one.
    let second = |state: &Path, socket: &Path| {
        run(Command::new(warmstart())
            .arg("daemon")
            .arg("--config")
            .arg(&d.config)
            .arg("--state-dir")
            .arg(state)
            .arg("--socket")
            .arg(socket))
    };
    let out = second(&d.state, &work.path().join("sock2"));
    assert_eq!(out.status.code(), Some(2), "same state dir: {out:?}");
    let out = second(&work.path().join("state2"), &d.socket);
    assert_eq!(out.status.code(), Some(2), "same socket: {out:?}");
    let file = work.path().join("not-a-socket");
    std::fs::write(&file, "keep").unwrap();
    let out = second(&work.path().join("state3"), &file);
    assert_eq!(out.status.code(), Some(2), "a file: {out:?}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
    let log = std::fs::read_to_string(&d.log).unwrap();
    let last = |what: &str| {
        log.rfind(what)
            .unwrap_or_else(|| panic!("{what:?} in {log}"))
    };
    assert!(
        last("plans in memory") < last("control socket"),
        "the socket was opened before the plans were loaded:\n{log}"
    );
    assert!(log.contains("rebuilt"), "{log}");

    // SIGHUP reads the configuration again, in the same process; an
    // invalid one is refused and the daemon goes on as it was.
    let good = std::fs::read_to_string(&d.config).unwrap();
    // Writes the configuration, sends SIGHUP, waits for the n-th reload
    // to be logged and the daemon to answer again.
    let reload = |config: &str, what: &str, n: usize| {
        std::fs::write(&d.config, config).unwrap();
        // SAFETY: SIGHUP to the daemon we started.
        unsafe { libc::kill(d.pid() as i32, libc::SIGHUP) };
        wait_for(what, Duration::from_secs(20), || {
            std::fs::read_to_string(&d.log)
                .unwrap()
                .matches("SIGHUP")
                .count()
                == n
                && d.status()["pid"].as_u64() == Some(u64::from(d.pid()))
        })
    };
    reload(
        "learn = \"sometimes\"\n",
        "the daemon after an invalid reload",
        1,
    );
    assert_eq!(
        d.status()["config"]["idle_s"],
        20.0,
        "the previous one kept"
    );
    reload(
        &good.replace("idle_s = 20.0", "idle_s = 21.0"),
        "the daemon after a reload",
        2,
    );
    assert_eq!(
        d.status()["config"]["idle_s"],
        21.0,
        "the new one in effect"
    );
    let log = std::fs::read_to_string(&d.log).unwrap();
    assert!(
        log.contains("invalid configuration") && log.contains("read again"),
        "{log}"
    );
    assert_eq!(
        json(&child_prof.join("profile.json"))["phase"],
        "prefetching"
    );
    assert!(child_prof.join("profile.json.corrupt").exists());
    child_count = launches(&child_prof);
    let before = launches(&other_prof);
    fs.evict();
    run_ok(Command::new(&other).arg("run").arg(&fs.mnt));
    wait_for(
        "the learned program after a restart",
        Duration::from_secs(15),
        || launches(&other_prof) == before + 1,
    );
    fs.evict();
    run_ok(Command::new(&child_sh).arg("run").arg(&fs.mnt));
    child_count += 1;
    wait_for(
        "the script after a restart",
        Duration::from_secs(15),
        || launches(&child_prof) == child_count,
    );
    assert_eq!(
        json(&child_prof.join("last-launch.json"))["phase_before"],
        "prefetching"
    );

    // `learn --remove` undoes `learn`; without a daemon, a clear error.
    let out = d.cli("learn", &["--remove", other.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(d);
    let out = run(Command::new(warmstart())
        .args(["learn", "--socket"])
        .arg(work.path().join("sock"))
        .arg(&other));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no warmstart daemon is running"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A shell loop running a tiny program hundreds of times (what build
/// systems and scripts do) makes no profile for it: its first launch is
/// found trivial and the rest are left alone.
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
    // (one learner, in order).
    let out = d.cli("learn", &[marker.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    run_ok(&mut Command::new(&marker));
    wait_for("the marker's profile", Duration::from_secs(60), || {
        profile_dir(&d.state, "marker-").is_some()
    });
    assert!(
        profile_dir(&d.state, "true-").is_none(),
        "a profile for `true`; daemon log:\n{}",
        std::fs::read_to_string(&d.log).unwrap_or_default()
    );
    let st = d.status();
    assert!(st["trivial_programs"].as_u64() >= Some(1), "{st}");
}
