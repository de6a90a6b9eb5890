//! Where the BPF recorder cannot load (root without CAP_BPF, CAP_PERFMON
//! and CAP_SYS_ADMIN here, as on a kernel that refuses it): `warmstart
//! run` still runs the program with its exit status and output, and the
//! daemon stays up and says why it records nothing.

mod daemon_util;
mod util;

use std::process::Command;
use std::time::Duration;

use daemon_util::*;
use util::*;

/// `cmd` run as root with the BPF capabilities out of its bounding set.
fn without_bpf(cmd: &std::path::Path) -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--bounding-set=-bpf,-perfmon,-sys_admin", "--"])
        .arg(cmd);
    c
}

#[test]
fn root_run_without_bpf_still_runs_the_program() {
    if !require_root("root_run_without_bpf_still_runs_the_program") {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let state = work.path().join("state");
    for launch in 0..3 {
        let out = run(without_bpf(&warmstart())
            .args(["run", "--state-dir"])
            .arg(&state)
            .args(["--", "sh", "-c", "echo out-$0; echo err >&2; exit 7", "x"]));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(7), "launch {launch}: {stderr}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "out-x\n",
            "launch {launch}"
        );
        assert!(stderr.contains("err"), "launch {launch}: {stderr}");
        assert!(
            !stderr.contains("needs root"),
            "root is told to become root: {stderr}"
        );
    }
}

#[test]
fn root_daemon_without_bpf_stays_up_and_says_why() {
    if !require_root("root_daemon_without_bpf_stays_up_and_says_why") {
        return;
    }
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let work = tempfile::tempdir().unwrap();
    let config = work.path().join("config.toml");
    std::fs::write(&config, "[preload]\nenabled = false\n").unwrap();
    let (state, socket) = (work.path().join("state"), work.path().join("sock"));
    let log = work.path().join("daemon.log");
    let mut daemon = KillOnDrop(
        without_bpf(&warmstart_core())
            .args(["daemon", "--config"])
            .arg(&config)
            .arg("--state-dir")
            .arg(&state)
            .arg("--socket")
            .arg(&socket)
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let child = &mut daemon.0;
    let t = std::time::Instant::now();
    while !socket.exists() && t.elapsed() < Duration::from_secs(30) {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the daemon exited: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = run_ok(
        Command::new(warmstart())
            .args(["status", "--json", "--socket"])
            .arg(&socket)
            .arg("--state-dir")
            .arg(&state),
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let problem = v["daemon"]["recorder_problem"].as_str().unwrap_or_default();
    assert!(problem.contains("CAP_BPF"), "status: {v}");
    assert!(v["daemon"]["kernel"]
        .as_str()
        .unwrap_or_default()
        .starts_with("kernel "));
    let text = run_ok(
        Command::new(warmstart())
            .args(["status", "--socket"])
            .arg(&socket)
            .arg("--state-dir")
            .arg(&state),
    );
    assert!(String::from_utf8_lossy(&text.stdout).contains("no recorder"));
    assert!(std::fs::read_to_string(&log)
        .unwrap()
        .contains("no recorder"));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the daemon is still up"
    );
}

/// A daemon that a failed assertion must not leave running.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
