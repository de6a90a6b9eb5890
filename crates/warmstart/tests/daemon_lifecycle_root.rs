//! `warmstart daemon` end to end (root): `learn` and `forget` go through
//! the daemon; profiles outlive the daemon, whose crash leaves the
//! programs it watches alone; exec chains are followed.

mod daemon_util;
mod util;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use daemon_util::*;
use util::*;

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
    d.wait_for("the relearned launch", Duration::from_secs(15), || {
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
    d.wait_for("the launcher's launch", Duration::from_secs(15), || {
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
    d.wait_for("the script's launch", Duration::from_secs(15), || {
        launches(&child_prof) == child_count
    });
    assert_eq!(early(&d), before + 1, "{}", d.status());

    // A script run through `env` (`#!/usr/bin/env sh`) is a launch of its
    // interpreter and script from `env`'s exec on: allowed by the script's
    // path, recorded with `env`'s own start, and its next launch's replay
    // started at the execve.
    let env_sh = {
        use std::os::unix::fs::PermissionsExt;
        let p = allowed.join("env-child.sh");
        std::fs::write(&p, format!("#!/usr/bin/env sh\n{} \"$@\"\n", fx.display())).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    };
    let env_prof = || {
        std::fs::read_dir(state.join("profiles"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                *p != child_prof
                    && p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("sh-"))
            })
    };
    let mut env_count = 0;
    let mut env_dir = None;
    for _ in 0..4 {
        fs.evict();
        run_ok(Command::new(&env_sh).arg("run").arg(&fs.mnt));
        env_count += 1;
        d.wait_for("the env script's launch", Duration::from_secs(15), || {
            env_prof().is_some_and(|p| launches(&p) == env_count)
        });
        let p = env_prof().unwrap();
        if json(&p.join("profile.json"))["phase"] == "prefetching" {
            env_dir = Some(p);
            break;
        }
    }
    let env_dir = env_dir.expect("no plan for the env script after four launches");
    let command = json(&env_dir.join("profile.json"))["command"].to_string();
    assert!(command.contains("env-child.sh"), "{command}");
    let plan = show_json(&env_dir.join("plan"));
    assert!(
        has_files_under(&plan, &fs.mnt.join("data")),
        "the env script's plan has the fixture's files: {plan}"
    );
    assert!(
        plan["files"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f["path"] == "/usr/bin/env")),
        "env's own start was recorded: {plan}"
    );
    let before = early(&d);
    fs.evict();
    run_ok(Command::new(&env_sh).arg("run").arg(&fs.mnt));
    env_count += 1;
    d.wait_for("the env script's launch", Duration::from_secs(15), || {
        launches(&env_dir) == env_count
    });
    assert_eq!(early(&d), before + 1, "{}", d.status());
    assert_eq!(
        json(&env_dir.join("last-launch.json"))["phase_before"],
        "prefetching"
    );

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
    d.wait_for(
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
    d.wait_for(
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
    d.wait_for(
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
    d.wait_for(
        "the learned program after a restart",
        Duration::from_secs(15),
        || launches(&other_prof) == before + 1,
    );
    // The script's replay starts at its execve after the restart too:
    // the profile each execve started is kept in the state directory.
    let hints = std::fs::read_to_string(d.state.join("execs.json")).unwrap_or_default();
    let child_name = child_prof
        .file_name()
        .unwrap()
        .to_string_lossy()
        .to_string();
    assert!(hints.contains(&child_name), "{hints}");
    let before = early(&d);
    fs.evict();
    run_ok(Command::new(&child_sh).arg("run").arg(&fs.mnt));
    child_count += 1;
    d.wait_for(
        "the script after a restart",
        Duration::from_secs(15),
        || launches(&child_prof) == child_count,
    );
    assert_eq!(
        json(&child_prof.join("last-launch.json"))["phase_before"],
        "prefetching"
    );
    assert_eq!(early(&d), before + 1, "{}", d.status());

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
