//! What the daemon's root tests share: a daemon of their own, launches
//! held at their exec, and the profiles the daemon writes.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use crate::util::*;

/// One daemon at a time: each traces every exec on the machine.
pub static SERIAL: Mutex<()> = Mutex::new(());

/// A daemon for one test: its own policy, state directory and socket.
pub struct Daemon {
    pub _proc: Background,
    pub config: PathBuf,
    pub state: PathBuf,
    pub socket: PathBuf,
    pub log: PathBuf,
}

impl Daemon {
    /// `allow` and `deny` are TOML arrays of globs.
    pub fn start(dir: &Path, allow: &str, deny: &str) -> Daemon {
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

    pub fn restart(dir: &Path, config: PathBuf) -> Daemon {
        let (state, socket, log) = (dir.join("state"), dir.join("sock"), dir.join("daemon.log"));
        let _ = std::fs::remove_file(&socket);
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let proc = spawn_daemon(&config, &state, &socket, log_file);
        Daemon {
            _proc: proc,
            config,
            state,
            socket,
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self._proc.id()
    }

    /// `warmstart SUBCOMMAND --socket S ARGS`.
    pub fn cli(&self, sub: &str, args: &[&str]) -> Output {
        run(Command::new(warmstart())
            .arg(sub)
            .arg("--socket")
            .arg(&self.socket)
            .args(args))
    }

    /// The daemon's own status (`warmstart status --json`), null if it
    /// did not answer.
    pub fn status(&self) -> serde_json::Value {
        let out = self.cli("status", &["--json"]);
        serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .map(|v| v["daemon"].clone())
            .unwrap_or(serde_json::Value::Null)
    }

    /// [`wait_for`], failing with the daemon's status and log: what it
    /// saw is what a timeout needs explained.
    pub fn wait_for(&self, what: &str, timeout: Duration, ok: impl FnMut() -> bool) {
        wait_for_explained(what, timeout, ok, || {
            format!(
                "; daemon status: {}\ndaemon log:\n{}",
                self.status(),
                std::fs::read_to_string(&self.log).unwrap_or_default()
            )
        })
    }
}

/// Launches `cmd` stopped right after its exec (ptrace), lets it go once
/// `ready(pid)` holds, and returns its output. The exec is the daemon's
/// cue, so this is still a launch nobody wrapped: only the program's
/// first instruction waits.
pub fn launch_held(cmd: &mut Command, mut ready: impl FnMut(u32) -> bool) -> Output {
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
pub fn self_read_pages(audit: &serde_json::Value, dir: &Path) -> u64 {
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

pub fn profile_dir(state: &Path, prefix: &str) -> Option<PathBuf> {
    std::fs::read_dir(state.join("profiles"))
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
        })
}

pub fn json(p: &Path) -> serde_json::Value {
    std::fs::read(p)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(serde_json::Value::Null)
}

/// The fixture under `name` in `dir`.
pub fn fixture_as(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::copy(fixture(), &p).unwrap();
    p
}

pub fn launches(dir: &Path) -> u64 {
    json(&dir.join("profile.json"))["launches"]
        .as_u64()
        .unwrap_or(0)
}

/// Launches `exe run MNT` (cold) until its profile `prefix` has a plan (at
/// most four times), waiting each time for the daemon to take the launch;
/// `count` is the profile's launch count so far. Returns the profile's
/// directory.
pub fn until_prefetching(
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
pub fn has_files_under(plan: &serde_json::Value, dir: &Path) -> bool {
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
pub fn assert_learned(profile: &Path) {
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
pub fn replay_issued(d: &Daemon, pid: u32) -> bool {
    d.status()["sessions"].as_array().is_some_and(|v| {
        v.iter()
            .any(|s| s["pid"] == pid && s["mode"] == "prefetching" && s["replay_issued"] == true)
    })
}
