//! The `run` and `daemon` scenarios: warmstart as users run it, through
//! the `warmstart` binary itself rather than the replay engine in-process.
//!
//! - `run`: the launch is `warmstart run -q --state-dir DIR -- CMD…`, timed
//!   from the wrapper's exec to the readiness of the whole (for `exit`,
//!   the wrapper's exit). DIR is a private state directory the wrapper
//!   learned on its own first launches.
//! - `daemon`: `warmstart daemon` with a private config (allow-list of
//!   this program's policy key), state directory and socket is started
//!   before the launch and stopped after the daemon has finished the
//!   launch's session, both outside the timing; the launch itself is the
//!   plain command, as the user would type it. The daemon runs only around
//!   this scenario's launches, so it neither learns nor prefetches the
//!   other scenarios' launches.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::launch::Target;
use crate::runner::WrapperTimes;

/// The `warmstart` binary to launch for `run` and `daemon`: the
/// `WARMSTART_BENCH_BIN` environment variable (`warmstart bench` sets it to
/// itself when it hands over to `warmstart-bench`), else the running binary
/// when it is `warmstart`, else a `warmstart` beside the running binary or
/// one directory up (test binaries live in `target/PROFILE/deps/`), else
/// `warmstart` on PATH.
pub fn warmstart_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("WARMSTART_BENCH_BIN") {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok();
    if let Some(e) = &exe {
        if e.file_name().is_some_and(|n| n == "warmstart") {
            return Some(e.clone());
        }
        for d in e.ancestors().skip(1).take(2) {
            let c = d.join("warmstart");
            if c.is_file() {
                return Some(c);
            }
        }
    }
    which_path("warmstart", None)
}

/// `cmd` resolved as a shell would (PATH unless it holds a slash, then
/// relative to `cwd`).
pub fn which_path(cmd: &str, cwd: Option<&Path>) -> Option<PathBuf> {
    if cmd.contains('/') {
        let p = match cwd {
            Some(d) => d.join(cmd),
            None => PathBuf::from(cmd),
        };
        return p.is_file().then_some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(cmd))
        .find(|f| f.is_file())
}

/// The daemon's policy key for `t`'s launch (what `allow` must match): the
/// executable with symlinks resolved, or the script for interpreters, as
/// the daemon computes it (`warmstart_launch::daemon::policy_path`).
pub fn policy_key(t: &Target) -> Result<String> {
    let cwd = match &t.cwd {
        Some(d) => d.clone(),
        None => std::env::current_dir()?,
    };
    let exe = which_path(&t.argv[0], Some(&cwd))
        .with_context(|| format!("{} not found on PATH", t.argv[0]))?;
    let exe = exe
        .canonicalize()
        .with_context(|| format!("resolving {}", exe.display()))?;
    Ok(warmstart_launch::daemon::policy_path(
        &exe.display().to_string(),
        &t.argv,
        &cwd,
    ))
}

/// The state directories, config and socket of one program's `run` and
/// `daemon` scenarios, removed when the program is done.
pub struct Wrapped {
    pub bin: PathBuf,
    dir: tempfile::TempDir,
    /// Launches the daemon has finished, over all its starts.
    daemon_launches: u64,
    pub policy_key: Option<String>,
}

impl Wrapped {
    pub fn new(bin: PathBuf) -> Result<Wrapped> {
        let dir = tempfile::Builder::new()
            .prefix("warmstart-bench-")
            .tempdir_in("/var/tmp")
            .or_else(|_| {
                tempfile::Builder::new()
                    .prefix("warmstart-bench-")
                    .tempdir()
            })
            .context("creating a state directory for the run/daemon scenarios")?;
        Ok(Wrapped {
            bin,
            dir,
            daemon_launches: 0,
            policy_key: None,
        })
    }

    fn run_state(&self) -> PathBuf {
        self.dir.path().join("run-state")
    }

    fn run_report(&self) -> PathBuf {
        self.dir.path().join("run-report.json")
    }

    /// What the replay of the last `run_target` launch issued (`None` if
    /// it ran no replay: learning, or found warm), and the wrapper's own
    /// costs, from its report.
    pub fn run_outcome(&self) -> (Option<u64>, Option<WrapperTimes>) {
        let p = self.run_report();
        let v: Option<serde_json::Value> = std::fs::read(&p)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        let _ = std::fs::remove_file(&p);
        let Some(v) = v else {
            return (None, None);
        };
        let times = WrapperTimes {
            before_replay_ms: v["before_replay_ms"].as_f64(),
            held_ms: v["held_ms"].as_f64(),
            after_exit_ms: v["after_exit_ms"].as_f64(),
        };
        (replay_bytes(&v), Some(times))
    }

    fn daemon_state(&self) -> PathBuf {
        self.dir.path().join("daemon-state")
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("daemon.sock")
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("daemon.log")
    }

    /// `t` launched through `warmstart run`.
    pub fn run_target(&self, t: &Target) -> Target {
        let mut w = t.clone();
        w.argv = vec![
            self.bin.display().to_string(),
            "run".into(),
            "-q".into(),
            "--state-dir".into(),
            self.run_state().display().to_string(),
            // What the replay issued, for the CSV; a cold launch's wrapper
            // stays to the end anyway, so the report costs it nothing.
            "--report".into(),
            self.run_report().display().to_string(),
            "--".into(),
        ];
        w.argv.extend(t.argv.iter().cloned());
        w
    }

    /// Whether a profile of the wrapper's state directory has a plan.
    pub fn run_prefetching(&self) -> bool {
        profiles(&self.run_state())
            .iter()
            .any(|p| p["phase"] == "prefetching")
    }

    /// Whether a profile of the daemon's state directory has a plan.
    pub fn daemon_prefetching(&self) -> bool {
        profiles(&self.daemon_state())
            .iter()
            .any(|p| p["phase"] == "prefetching")
    }

    /// Launches counted by the profiles of the wrapper's and of the
    /// daemon's state directories.
    pub fn launches(&self) -> (u64, u64) {
        let count = |state: &Path| -> u64 {
            profiles(state)
                .iter()
                .filter_map(|p| p["launches"].as_u64())
                .sum()
        };
        (count(&self.run_state()), count(&self.daemon_state()))
    }

    /// Writes the daemon's config for `t` (once) and returns its path.
    fn config(&mut self, t: &Target) -> Result<PathBuf> {
        let path = self.dir.path().join("config.toml");
        if self.policy_key.is_none() {
            let key = policy_key(t)?;
            let allow = [toml::Value::String(key.clone()).to_string()];
            let text = format!(
                "learn = \"allow-list\"\nallow = [{}]\nskip_services = false\n",
                allow.join(", ")
            );
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
            self.policy_key = Some(key);
        }
        Ok(path)
    }

    /// Starts the daemon and waits for its socket.
    pub fn start_daemon(&mut self, t: &Target) -> Result<Daemon> {
        let config = self.config(t)?;
        let socket = self.socket();
        let _ = std::fs::remove_file(&socket);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log())
            .with_context(|| format!("opening {}", self.log().display()))?;
        let log_from = log.metadata().map(|m| m.len()).unwrap_or(0);
        let child = crate::launch::stop_with_us(&mut Command::new(&self.bin))
            .arg("daemon")
            .arg("--config")
            .arg(&config)
            .arg("--state-dir")
            .arg(self.daemon_state())
            .arg("--socket")
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {} daemon", self.bin.display()))?;
        let mut d = Daemon {
            child: Some(child),
            bin: self.bin.clone(),
            state: self.daemon_state(),
            launches: 0,
            socket,
            log: self.log(),
            log_from,
        };
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            if d.socket.exists() {
                return Ok(d);
            }
            if let Some(st) = d.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                d.child = None;
                bail!(
                    "warmstart daemon exited ({st}) before opening its socket; its stderr:\n{}",
                    d.log_tail()
                );
            }
            if Instant::now() >= until {
                let tail = d.log_tail();
                drop(d);
                bail!("warmstart daemon did not open its socket within 20 s; its stderr:\n{tail}");
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until the daemon has finished one more launch: its counters
    /// (`warmstart status --json`) show it ended with no session left, and
    /// the profile written for it is on disk. Returns the data bytes the
    /// daemon's replay issued for the launch (from the profile's
    /// `last-launch.json`), `None` when it did not prefetch it (learning).
    pub fn wait_daemon_done(&mut self, d: &mut Daemon) -> Result<Option<u64>> {
        self.daemon_launches += 1;
        d.launches += 1;
        let started_here = d.launches;
        let want_total = self.daemon_launches;
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let st = d.status();
            let ended = st.as_ref().is_some_and(|s| {
                let n = s["launches_learned"].as_u64().unwrap_or(0)
                    + s["launches_prefetched"].as_u64().unwrap_or(0);
                n >= started_here && s["active_sessions"].as_u64() == Some(0)
            });
            let written: u64 = profiles(&self.daemon_state())
                .iter()
                .filter_map(|p| p["launches"].as_u64())
                .sum();
            if ended && written >= want_total {
                return Ok(last_replay_bytes(&self.daemon_state()));
            }
            if let Some(s) = d.exited() {
                bail!(
                    "warmstart daemon exited ({s}) during the launch; its stderr:\n{}",
                    d.log_tail()
                );
            }
            if Instant::now() >= until {
                bail!(
                    "warmstart daemon did not finish the launch's session within 60 s \
                     (status: {}; profiles' launches {written}, expected {want_total}; \
                     is {} its policy key? launches reading less than min_launch_kib, \
                     256 KiB, are not learned); its stderr:\n{}",
                    st.map_or("none".into(), |s| s.to_string()),
                    self.policy_key.as_deref().unwrap_or("?"),
                    d.log_tail()
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A running `warmstart daemon`: stopped (SIGTERM, then waited for) when
/// dropped.
pub struct Daemon {
    child: Option<Child>,
    bin: PathBuf,
    state: PathBuf,
    /// Launches made while this start of the daemon ran.
    launches: u64,
    socket: PathBuf,
    log: PathBuf,
    log_from: u64,
}

impl Daemon {
    /// `warmstart status --json` of this daemon (`None` if it did not answer).
    pub fn status(&self) -> Option<serde_json::Value> {
        let out = Command::new(&self.bin)
            .arg("status")
            .arg("--socket")
            .arg(&self.socket)
            .arg("--state-dir")
            .arg(&self.state)
            .arg("--json")
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        Some(v.get("daemon")?.clone()).filter(|d| !d.is_null())
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        let st = self.child.as_mut()?.try_wait().ok().flatten()?;
        self.child = None;
        Some(st)
    }

    /// What this start of the daemon wrote on stderr (its last 4 KiB).
    pub fn log_tail(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = File::open(&self.log) {
            let len = f.metadata().map(|m| m.len()).unwrap_or(0);
            let from = self.log_from.max(len.saturating_sub(4096));
            let _ = f.seek(SeekFrom::Start(from));
            let _ = f.read_to_string(&mut s);
        }
        if s.trim().is_empty() {
            "(nothing)".into()
        } else {
            s
        }
    }

    /// Stops the daemon: SIGTERM, then waits (SIGKILL after 10 s).
    pub fn stop(mut self) -> Result<()> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<()> {
        let Some(mut c) = self.child.take() else {
            return Ok(());
        };
        // SAFETY: signalling our own child, which has not been reaped.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if c.try_wait()?.is_some() {
                let _ = std::fs::remove_file(&self.socket);
                return Ok(());
            }
            thread::sleep(Duration::from_millis(10));
        }
        let _ = c.kill();
        let _ = c.wait();
        let _ = std::fs::remove_file(&self.socket);
        bail!("warmstart daemon did not stop within 10 s of SIGTERM (killed)")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.stop_inner();
    }
}

/// The replayed data bytes of the most recent `last-launch.json` under
/// `state`, if that launch was prefetched.
fn last_replay_bytes(state: &Path) -> Option<u64> {
    let rd = std::fs::read_dir(state.join("profiles")).ok()?;
    let newest = rd
        .flatten()
        .map(|e| e.path().join("last-launch.json"))
        .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
        .max()?;
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(newest.1).ok()?).ok()?;
    replay_bytes(&v)
}

/// Data bytes a launch report's replay issued; `None` without a replay (a
/// relearning launch has one too: it is prefetched with its previous plan).
fn replay_bytes(report: &serde_json::Value) -> Option<u64> {
    report["replay"]["data"]["bytes"].as_u64()
}

/// The `profile.json` of every profile under `state`.
fn profiles(state: &Path) -> Vec<serde_json::Value> {
    let Ok(rd) = std::fs::read_dir(state.join("profiles")) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| std::fs::read(e.path().join("profile.json")).ok())
        .filter_map(|b| serde_json::from_slice(&b).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(argv: &[&str]) -> Target {
        Target {
            name: "t".into(),
            argv: argv.iter().map(|s| s.to_string()).collect(),
            cwd: None,
            env: Vec::new(),
            ready: crate::launch::Ready::Exit,
            prepare: None,
            cleanup: None,
            timeout: Duration::from_secs(10),
        }
    }

    #[test]
    fn wrapper_command_line() {
        let w = Wrapped::new(PathBuf::from("/opt/warmstart")).unwrap();
        let t = w.run_target(&target(&["python3", "-c", "pass"]));
        assert_eq!(t.argv[0], "/opt/warmstart");
        assert_eq!(&t.argv[1..3], ["run", "-q"]);
        assert_eq!(t.argv[3], "--state-dir");
        assert!(t.argv[4].ends_with("run-state"));
        assert_eq!(t.argv[5], "--report");
        assert_eq!(&t.argv[7..], ["--", "python3", "-c", "pass"]);
    }

    #[test]
    fn policy_key_resolves_symlinks_and_scripts() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real-sh");
        std::fs::copy("/bin/sh", &real).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let real = real.canonicalize().unwrap();
        let t = target(&[link.to_str().unwrap(), "-c", "true"]);
        assert_eq!(policy_key(&t).unwrap(), real.display().to_string());
        // An interpreter's launch is keyed by its script.
        let script = dir.path().join("tool.py");
        std::fs::write(&script, "pass\n").unwrap();
        if let Some(py) = which_path("python3", None) {
            let t = target(&[py.to_str().unwrap(), script.to_str().unwrap()]);
            assert_eq!(
                policy_key(&t).unwrap(),
                script.canonicalize().unwrap().display().to_string()
            );
        }
        assert!(policy_key(&target(&["no-such-program-xyz"])).is_err());
    }
}
