//! What runs beside the launches in each mode: nothing, `warmstart daemon`
//! with some of its foresight switched off, or Debian's `preload`.
//!
//! Each is started at every simulated boot and stopped at its end, with a
//! state directory of its own that lives from the mode's first boot to its
//! last: earlier boots train what later boots are measured with.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use warmstart_launch::daemon::DaemonStatus;

/// One column of the comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
pub enum Mode {
    /// No prefetcher: every launch after a boot is cold (the baseline).
    None,
    /// `warmstart daemon` prefetching at launch time only: startup plans,
    /// launch prediction and idle preloads off.
    LaunchOnly,
    /// The daemon with startup plans, without prediction or preloads.
    Startup,
    /// The daemon as installed: startup plans, prediction, idle preloads.
    Predict,
    /// Debian's `preload` daemon, with its defaults.
    Preload,
    /// Every launch warm: launched once, unmeasured, right before.
    Warm,
}

impl Mode {
    pub const ALL: [Mode; 6] = [
        Mode::None,
        Mode::LaunchOnly,
        Mode::Startup,
        Mode::Predict,
        Mode::Preload,
        Mode::Warm,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::LaunchOnly => "launch-only",
            Mode::Startup => "startup",
            Mode::Predict => "predict",
            Mode::Preload => "preload",
            Mode::Warm => "warm",
        }
    }

    /// Whether it runs `warmstart daemon`.
    pub fn uses_daemon(self) -> bool {
        matches!(self, Mode::LaunchOnly | Mode::Startup | Mode::Predict)
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A restarted daemon counts as a boot when the machine has been up less
/// than this: the benchmark's boots are daemon restarts on a machine that
/// booted long ago (see `[startup] boot_uptime_max_s`).
const BOOT_UPTIME_MAX_S: f64 = 1e9;

/// The daemon's `config.toml` for `mode`. `allow`: the policy keys to
/// learn (`learn = "allow-list"`), or `None` for the daemon's default
/// policy (learn everything not denied). `extra`: keys of the user's
/// (`--daemon-config`), under the mode's own switches, which win.
pub fn daemon_config(mode: Mode, allow: Option<&[String]>, extra: Option<&toml::Table>) -> String {
    use toml::Value;
    let (startup, predict, preload) = match mode {
        Mode::LaunchOnly => (false, false, false),
        Mode::Startup => (true, false, false),
        _ => (true, true, true),
    };
    let mut t = extra.cloned().unwrap_or_default();
    if let Some(keys) = allow {
        t.insert("learn".into(), Value::String("allow-list".into()));
        t.insert(
            "allow".into(),
            Value::Array(keys.iter().cloned().map(Value::String).collect()),
        );
    }
    // The benchmark's launches come from wherever it runs, a service
    // included.
    t.entry("skip_services").or_insert(Value::Boolean(false));
    t.insert("predict_launches".into(), Value::Boolean(predict));
    let s = section(&mut t, "startup");
    s.insert("enabled".into(), Value::Boolean(startup));
    s.entry("boot_uptime_max_s")
        .or_insert(Value::Float(BOOT_UPTIME_MAX_S));
    section(&mut t, "preload").insert("enabled".into(), Value::Boolean(preload));
    toml::to_string(&t).expect("a table serializes")
}

/// The table `name` of `t`, made one if it is missing or not a table.
fn section<'a>(t: &'a mut toml::Table, name: &str) -> &'a mut toml::Table {
    let v = t
        .entry(name)
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    if !v.is_table() {
        *v = toml::Value::Table(toml::Table::new());
    }
    v.as_table_mut().expect("made a table")
}

/// How long a boot's end waits for the daemon: its startup window closes
/// `[startup] max_s` (60 s by default) after it opened at the latest; a
/// margin for the last launch's learning.
pub fn stop_limit(extra: Option<&toml::Table>) -> Duration {
    let max_s = extra
        .and_then(|t| t.get("startup"))
        .and_then(|s| s.get("max_s"))
        .and_then(|v| v.as_float().or_else(|| v.as_integer().map(|i| i as f64)))
        .unwrap_or(60.0);
    Duration::from_secs_f64(max_s.clamp(0.0, 3600.0) + 30.0)
}

/// A mode's files: the prefetcher's state (kept across the mode's boots),
/// config, socket and log. A temporary directory, removed when dropped,
/// unless the run keeps them (`--keep-state`).
pub enum ModeDir {
    Temp(tempfile::TempDir),
    Kept(PathBuf),
}

impl ModeDir {
    /// A fresh directory for `mode`: `keep/MODE` (emptied first) when
    /// kept, else a temporary one.
    pub fn new(mode: Mode, keep: Option<&Path>) -> Result<ModeDir> {
        if let Some(k) = keep {
            let d = k.join(mode.name());
            match std::fs::remove_dir_all(&d) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).with_context(|| format!("emptying {}", d.display())),
            }
            std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
            return Ok(ModeDir::Kept(d));
        }
        // On disk, not tmpfs: /var/tmp, as the daemon's state would be.
        let prefix = format!("warmstart-usage-{mode}-");
        let dir = tempfile::Builder::new()
            .prefix(&prefix)
            .tempdir_in("/var/tmp")
            .or_else(|_| tempfile::Builder::new().prefix(&prefix).tempdir())
            .context("creating the mode's state directory")?;
        Ok(ModeDir::Temp(dir))
    }

    /// The prefetcher's state directory.
    pub fn state(&self) -> PathBuf {
        self.path().join("state")
    }

    pub fn path(&self) -> &Path {
        match self {
            ModeDir::Temp(t) => t.path(),
            ModeDir::Kept(p) => p,
        }
    }
}

/// A running prefetcher, stopped at the end of its boot (or when dropped).
pub enum Prefetcher {
    None,
    Daemon(DaemonProc),
    Preload(PreloadProc),
}

impl Prefetcher {
    pub fn socket(&self) -> Option<&Path> {
        match self {
            Prefetcher::Daemon(d) => Some(&d.socket),
            _ => None,
        }
    }

    /// Stops it, after letting the daemon finish learning the boot's
    /// launches and recording its startup (so the next boot has their
    /// profiles, history and startup plan), waiting at most `limit`.
    /// Returns the daemon's last status and whether it got that far.
    pub fn stop(self, window: bool, limit: Duration) -> Result<(Option<DaemonStatus>, bool)> {
        match self {
            Prefetcher::None => Ok((None, true)),
            Prefetcher::Daemon(d) => d.stop(window, limit),
            Prefetcher::Preload(p) => p.stop().map(|()| (None, true)),
        }
    }
}

/// `warmstart daemon` with a mode's config and state.
pub struct DaemonProc {
    child: Option<Child>,
    socket: PathBuf,
    log: PathBuf,
    log_from: u64,
}

impl DaemonProc {
    /// Starts the daemon and waits for its socket.
    pub fn start(bin: &Path, dir: &ModeDir, config: &str) -> Result<DaemonProc> {
        let cfg = dir.path().join("config.toml");
        std::fs::write(&cfg, config).with_context(|| format!("writing {}", cfg.display()))?;
        let socket = dir.path().join("daemon.sock");
        let _ = std::fs::remove_file(&socket);
        let log = dir.path().join("daemon.log");
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("opening {}", log.display()))?;
        let log_from = f.metadata().map_or(0, |m| m.len());
        let child = crate::launch::stop_with_us(&mut Command::new(bin))
            .arg("daemon")
            .arg("--config")
            .arg(&cfg)
            .arg("--state-dir")
            .arg(dir.state())
            .arg("--socket")
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(f)
            .spawn()
            .with_context(|| format!("starting {} daemon", bin.display()))?;
        let mut d = DaemonProc {
            child: Some(child),
            socket,
            log,
            log_from,
        };
        let until = Instant::now() + Duration::from_secs(30);
        while !d.socket.exists() {
            if let Some(st) = d.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                d.child = None;
                bail!(
                    "warmstart daemon exited ({st}) before opening its socket; its stderr:\n{}",
                    d.log_tail()
                );
            }
            if Instant::now() >= until {
                bail!(
                    "warmstart daemon did not open its socket within 30 s; its stderr:\n{}",
                    d.log_tail()
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
        Ok(d)
    }

    /// What this start of the daemon wrote on stderr (its last 4 KiB).
    pub fn log_tail(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = File::open(&self.log) {
            let len = f.metadata().map_or(0, |m| m.len());
            let _ = f.seek(SeekFrom::Start(self.log_from.max(len.saturating_sub(4096))));
            let _ = f.read_to_string(&mut s);
        }
        if s.trim().is_empty() {
            "(nothing)".into()
        } else {
            s
        }
    }

    /// Waits until no launch is being followed or waits to be learned and,
    /// with `window`, until the startup window has closed (a window open
    /// when the daemon stops is not recorded, and the next boot would have
    /// no startup plan), then stops the daemon with SIGTERM. Gives up
    /// waiting after `limit`. Returns its last status and whether it was
    /// quiet (all that was waited for happened).
    pub fn stop(mut self, window: bool, limit: Duration) -> Result<(Option<DaemonStatus>, bool)> {
        let until = Instant::now() + limit;
        let mut last = None;
        let quiet = loop {
            if let Some(st) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                bail!(
                    "warmstart daemon exited ({st}) during the boot; its stderr:\n{}",
                    self.log_tail()
                );
            }
            let st = warmstart_launch::daemon::query(&self.socket);
            let quiet = st.as_ref().is_some_and(|s| {
                s.active_sessions == 0
                    && s.learn_queue == 0
                    && !(window && s.foresight.startup_window.is_some())
            });
            if st.is_some() {
                last = st;
            }
            if quiet || Instant::now() >= until {
                break quiet;
            }
            thread::sleep(Duration::from_millis(200));
        };
        self.terminate()?;
        Ok((last, quiet))
    }

    fn terminate(&mut self) -> Result<()> {
        let Some(mut c) = self.child.take() else {
            return Ok(());
        };
        let r = term_and_wait(&mut c, "warmstart daemon");
        let _ = std::fs::remove_file(&self.socket);
        r
    }
}

impl Drop for DaemonProc {
    fn drop(&mut self) {
        let _ = self.terminate();
    }
}

/// SIGTERM, then up to 15 s for the process to save and exit, then SIGKILL.
fn term_and_wait(c: &mut Child, what: &str) -> Result<()> {
    // SAFETY: signalling our own child, which has not been reaped.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    let until = Instant::now() + Duration::from_secs(15);
    while Instant::now() < until {
        if c.try_wait()?.is_some() {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(10));
    }
    let _ = c.kill();
    let _ = c.wait();
    bail!("{what} did not stop within 15 s of SIGTERM (killed)")
}

/// Where Debian installs `preload`.
pub const PRELOAD_BIN: &str = "/usr/sbin/preload";

/// The `preload` binary, or an error saying how to install it.
pub fn preload_binary() -> Result<PathBuf> {
    let p = PathBuf::from(PRELOAD_BIN);
    if p.is_file() {
        return Ok(p);
    }
    crate::wrapped::which_path("preload", None).context(
        "the preload mode runs Debian's preload daemon, which is not installed \
         (apt-get install preload; `make deps` installs it)",
    )
}

/// Debian's `preload`, run in the foreground as its init script would run
/// it (its defaults: `/etc/preload.conf`, nice 15), with its state file in
/// the mode's directory.
pub struct PreloadProc {
    child: Option<Child>,
}

impl PreloadProc {
    pub fn start(bin: &Path, dir: &ModeDir) -> Result<PreloadProc> {
        let state = dir.state();
        std::fs::create_dir_all(&state).with_context(|| format!("creating {}", state.display()))?;
        // Ended with us, as the daemons are (see `stop_with_us`).
        let mut child = crate::launch::stop_with_us(&mut Command::new(bin))
            .arg("--foreground")
            .arg("--statefile")
            .arg(state.join("preload.state"))
            .arg("--logfile")
            .arg(dir.path().join("preload.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        // It reads its state and scans /proc at start: give it that moment,
        // and catch a preload that refuses to run.
        thread::sleep(Duration::from_millis(500));
        if let Some(st) = child.try_wait()? {
            bail!(
                "{} exited at start ({st}); see {}",
                bin.display(),
                dir.path().join("preload.log").display()
            );
        }
        Ok(PreloadProc { child: Some(child) })
    }

    /// Stops it; preload saves its state file on SIGTERM.
    pub fn stop(mut self) -> Result<()> {
        match self.child.take() {
            Some(mut c) => term_and_wait(&mut c, "preload"),
            None => Ok(()),
        }
    }
}

impl Drop for PreloadProc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = term_and_wait(&mut c, "preload");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warmstart_launch::daemon::{DaemonConfig, LearnMode};

    fn parsed(text: &str) -> DaemonConfig {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("config.toml");
        std::fs::write(&p, text).unwrap();
        DaemonConfig::load(&p).unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    #[test]
    fn each_mode_switches_its_parts() {
        let keys = vec!["/usr/bin/clang-16".to_string()];
        for (mode, startup, predict, preload) in [
            (Mode::LaunchOnly, false, false, false),
            (Mode::Startup, true, false, false),
            (Mode::Predict, true, true, true),
        ] {
            let c = parsed(&daemon_config(mode, Some(&keys), None));
            assert_eq!(c.startup.enabled, startup, "{mode}");
            assert_eq!(c.predict_launches, predict, "{mode}");
            assert_eq!(c.preload.enabled, preload, "{mode}");
            assert_eq!(c.learn, LearnMode::AllowList);
            assert_eq!(c.allow, keys);
            // Every restart is a boot.
            assert!(c.startup.boot_uptime_max_s >= 1e8);
        }
        // Without an allow list, the daemon's own policy.
        let c = parsed(&daemon_config(Mode::Predict, None, None));
        assert_eq!(c.learn, LearnMode::All);
        assert_eq!(c.deny, DaemonConfig::default().deny);
        // The user's keys are kept, under the mode's switches.
        let extra: toml::Table = toml::from_str(
            "replay_cpus = \"all\"\n[startup]\nmax_s = 8.0\nenabled = true\n\
             [preload]\nenabled = true\nbudget_fraction = 0.1\n",
        )
        .unwrap();
        let c = parsed(&daemon_config(Mode::LaunchOnly, None, Some(&extra)));
        assert_eq!(c.replay_cpus, "all");
        assert_eq!(c.startup.max_s, 8.0);
        assert_eq!(c.preload.budget_fraction, 0.1);
        assert!(!c.startup.enabled && !c.preload.enabled && !c.predict_launches);
        assert_eq!(stop_limit(Some(&extra)), Duration::from_secs(38));
        assert_eq!(stop_limit(None), Duration::from_secs(90));
    }

    #[test]
    fn modes_by_name() {
        use clap::ValueEnum;
        for m in Mode::ALL {
            assert_eq!(Mode::from_str(m.name(), false).unwrap(), m);
        }
        assert!(Mode::LaunchOnly.uses_daemon() && !Mode::Preload.uses_daemon());
    }
}
