//! The daemon with `registry` set, against a real registry (Debian's
//! `docker-registry`) on a loopback port: a plan learned on one side and
//! pushed is found by the program's content when the program first
//! starts on the other side, and its next launch is prefetched with no
//! learning launch there. A registry that is down leaves launches alone
//! and is said in the log.

mod registry_util;
mod util;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use registry_util::*;
use util::*;

/// `warmstart ARGS --state-dir STATE`, with no credential files of the
/// machine's user.
fn ws(args: &[&str], state: &Path) -> std::process::Output {
    run(isolated(
        Command::new(warmstart())
            .args(args)
            .arg("--state-dir")
            .arg(state),
        state,
    ))
}

fn isolated<'a>(cmd: &'a mut Command, home: &Path) -> &'a mut Command {
    cmd.env("HOME", home)
        .env_remove("REGISTRY_AUTH_FILE")
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("DOCKER_CONFIG")
}

fn json(p: &Path) -> serde_json::Value {
    std::fs::read(p)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(serde_json::Value::Null)
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

#[test]
fn root_daemon_pulls_a_plan_for_a_new_program_and_prefetches_its_next_launch() {
    if !require_root("root_daemon_pulls_a_plan_for_a_new_program_and_prefetches_its_next_launch") {
        return;
    }
    if !Path::new(REGISTRY).exists() {
        panic!("{REGISTRY} is missing: apt-get install docker-registry (make deps does)");
    }
    let reg = Registry::start(None);
    let fs = LoopFs::new("ext4", 96);
    run_ok(Command::new(fixture()).arg("gen").arg(&fs.mnt));
    let work = tempfile::tempdir().unwrap();
    let fx = work.path().join("ws-reg-fixture");
    std::fs::copy(fixture(), &fx).unwrap();
    let (fx_s, mnt) = (fx.display().to_string(), fs.mnt.display().to_string());
    let cmd = [fx_s.as_str(), "run", mnt.as_str()];

    // Side A learns the program and pushes its plan (tagged by content).
    let a = work.path().join("a");
    let rep = work.path().join("report.json");
    for _ in 0..2 {
        fs.evict();
        run_ok(
            Command::new(warmstart())
                .args(["run", "--state-dir"])
                .arg(&a)
                .args(["--profile", "fixture", "--report"])
                .arg(&rep)
                .arg("--")
                .args(cmd),
        );
    }
    assert_eq!(json(&rep)["phase_after"], "prefetching");
    let repo = format!("{}/warmstart/plans", reg.addr);
    let out = ws(&["push", "fixture", &format!("{repo}:v1")], &a);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && err.contains("tagged sha256-"),
        "{err}"
    );

    // Side B: a daemon on a fresh state directory, with the registry.
    let b = work.path().join("b");
    let (config, socket, log) = (
        work.path().join("config.toml"),
        work.path().join("sock"),
        work.path().join("daemon.log"),
    );
    std::fs::write(
        &config,
        format!(
            "learn = \"allow-list\"\nallow = [\"{}/*\"]\nskip_services = false\nmin_launch_kib = 64\nidle_s = 2.0\ntimeout_s = 60.0\nregistry = \"{repo}\"\nregistry_timeout_s = 3\n[preload]\nenabled = false\n",
            work.path().display()
        ),
    )
    .unwrap();
    let log_file = std::fs::File::create(&log).unwrap();
    let _daemon = Background::spawn(
        isolated(
            Command::new(warmstart())
                .arg("daemon")
                .arg("--config")
                .arg(&config)
                .arg("--state-dir")
                .arg(&b)
                .arg("--socket")
                .arg(&socket),
            work.path(),
        )
        .stdout(Stdio::null())
        .stderr(log_file),
    );
    wait_for("the daemon's socket", Duration::from_secs(20), || {
        socket.exists()
    });
    let daemon_log = || std::fs::read_to_string(&log).unwrap_or_default();

    // The program's first launch here, nobody wrapping it: the daemon
    // finds the plan by the program's content and installs it.
    fs.evict();
    run_ok(Command::new(&fx).arg("run").arg(&fs.mnt));
    wait_for(
        "the pulled plan in B's profile",
        Duration::from_secs(30),
        || {
            profile_dir(&b, "ws-reg-fixture")
                .is_some_and(|d| json(&d.join("profile.json"))["phase"] == "prefetching")
        },
    );
    let dir = profile_dir(&b, "ws-reg-fixture").unwrap();
    let prof = json(&dir.join("profile.json"));
    assert!(
        prof["note"]
            .as_str()
            .is_some_and(|n| n.contains(&format!("pulled from {repo}@sha256:"))),
        "{prof}\n{}",
        daemon_log()
    );
    // Not learned here: the learning launch that triggered the lookup
    // ends after the plan arrived and is not kept, or ended before it and
    // was replaced (its report is left).
    wait_for(
        "the first launch to be handled",
        Duration::from_secs(30),
        || {
            daemon_log().contains("learning launch not kept")
                || dir.join("last-launch.json").exists()
        },
    );
    let prof = json(&dir.join("profile.json"));
    assert_eq!(prof["phase"], "prefetching", "{prof}\n{}", daemon_log());
    assert_eq!(prof["traces"], serde_json::json!([]), "{prof}");
    assert!(!dir.join("trace-0").exists());

    // Its next launch is prefetched with the pulled plan.
    fs.evict();
    run_ok(Command::new(&fx).arg("run").arg(&fs.mnt));
    wait_for("the prefetched launch", Duration::from_secs(30), || {
        json(&dir.join("profile.json"))["launches"].as_u64() >= Some(1)
    });
    let report = json(&dir.join("last-launch.json"));
    assert_eq!(report["phase_before"], "prefetching", "{report}");
    assert!(
        report["replay"]["data"]["bytes"].as_u64().unwrap_or(0) > 2 << 20,
        "{report}"
    );

    // The registry down: another new program starts and is learned as
    // without a registry, and the log says why nothing was pulled.
    let addr = reg.addr.clone();
    drop(reg);
    let other = work.path().join("ws-reg-other");
    std::fs::copy(fixture(), &other).unwrap();
    fs.evict();
    let out = run_ok(Command::new(&other).arg("run").arg(&fs.mnt));
    assert!(out.status.success());
    wait_for("the lookup to fail", Duration::from_secs(30), || {
        let l = daemon_log();
        l.contains(&format!("no plans from {repo}")) && l.contains(&format!("registry {addr}"))
    });
    wait_for("the launch to be learned", Duration::from_secs(30), || {
        profile_dir(&b, "ws-reg-other")
            .is_some_and(|d| json(&d.join("profile.json"))["launches"] == 1)
    });
    let d = profile_dir(&b, "ws-reg-other").unwrap();
    assert_eq!(json(&d.join("profile.json"))["phase"], "learning");
}
