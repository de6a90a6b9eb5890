//! Benchmark suites: a TOML file listing programs, each with the Debian
//! packages it needs, its command, and when its launch is complete.
//!
//! ```toml
//! [[program]]
//! name = "python-scipy"
//! packages = ["python3-scipy"]
//! command = ["/usr/bin/python3", "-c", "import scipy.optimize"]
//! ready = "exit"              # or output:RE, file:PATH, port:N, window:NAME
//! prepare = "rm -rf out"      # optional, before every launch
//! cleanup = "rm -rf out"      # optional, after the last
//! timeout = 120               # seconds, optional
//! x11 = true                  # run under a private Xvfb, optional
//! ```
//!
//! Commands run in the suite file's directory, so a suite can ship its
//! input files beside it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use crate::launch::{Ready, Target};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Suite {
    #[serde(rename = "program")]
    pub programs: Vec<SuiteProgram>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SuiteProgram {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub packages: Vec<String>,
    pub command: Vec<String>,
    #[serde(default = "default_ready")]
    pub ready: String,
    pub prepare: Option<String>,
    pub cleanup: Option<String>,
    pub timeout: Option<f64>,
    #[serde(default)]
    pub x11: bool,
}

fn default_ready() -> String {
    "exit".into()
}

impl Suite {
    pub fn parse(text: &str) -> Result<Suite> {
        let s: Suite = toml::from_str(text)?;
        for p in &s.programs {
            if p.command.is_empty() {
                bail!("program {} has an empty command", p.name);
            }
            p.ready
                .parse::<Ready>()
                .map_err(|e| anyhow::anyhow!("program {}: {e}", p.name))?;
        }
        Ok(s)
    }

    pub fn load(path: &Path) -> Result<Suite> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Suite::parse(&text).with_context(|| format!("in {}", path.display()))
    }
}

impl SuiteProgram {
    /// The launch target, run in `dir`.
    pub fn target(&self, dir: &Path, default_timeout: Duration) -> Target {
        Target {
            name: self.name.clone(),
            argv: self.command.clone(),
            cwd: Some(dir.to_path_buf()),
            env: Vec::new(),
            ready: self.ready.parse().expect("checked when parsed"),
            prepare: self.prepare.clone(),
            cleanup: self.cleanup.clone(),
            timeout: self
                .timeout
                .map_or(default_timeout, Duration::from_secs_f64),
        }
    }
}

/// The packages of `wanted` that dpkg does not list as installed.
pub fn missing_packages(wanted: &[String]) -> Vec<String> {
    wanted
        .iter()
        .filter(|p| {
            !Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", p])
                .stderr(Stdio::null())
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        })
        .cloned()
        .collect()
}

/// Installs `packages` with apt-get (as root), or says what to install.
pub fn install(packages: &[String], allowed: bool) -> Result<()> {
    if packages.is_empty() {
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !allowed || !root {
        bail!(
            "missing Debian packages: {} (install them with: apt-get install {}{})",
            packages.join(" "),
            packages.join(" "),
            if root { "" } else { "; needs root" }
        );
    }
    let st = Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(packages)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdout(Stdio::null())
        .status()
        .context("running apt-get")?;
    if !st.success() {
        bail!(
            "apt-get install {} failed ({st}); try apt-get update first",
            packages.join(" ")
        );
    }
    Ok(())
}

/// A private X server for GUI programs, stopped when dropped.
pub struct Xvfb {
    child: std::process::Child,
    pub display: String,
}

impl Xvfb {
    pub fn start() -> Result<Xvfb> {
        // The first display without a lock file. A server killed without
        // a chance to clean up leaves its lock and socket behind, so the
        // socket alone does not say the server is ours.
        let n = (90..200)
            .find(|n| !Path::new(&format!("/tmp/.X{n}-lock")).exists())
            .context("no free X display number between :90 and :199")?;
        let display = format!(":{n}");
        // Ended with the thread that starts it: a harness killed inside a
        // testbed (its owner gone) would otherwise leave the server behind,
        // holding the testbed's filesystem mounted over a detached device.
        let child = crate::launch::stop_with_us(&mut Command::new("Xvfb"))
            // -noreset: by default the server resets whenever its last
            // client leaves, as the window watch and the program do after
            // every launch; a program connecting during a reset fails with
            // "cannot open display".
            .args([
                &display,
                "-screen",
                "0",
                "1280x1024x24",
                "-nolisten",
                "tcp",
                "-noreset",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(std::env::temp_dir().join("warmstart-bench-xvfb.log"))
                    .map_or_else(|_| Stdio::null(), Stdio::from),
            )
            .spawn()
            .context("starting Xvfb (apt-get install xvfb)")?;
        let mut x = Xvfb { child, display };
        let sock = PathBuf::from(format!("/tmp/.X11-unix/X{n}"));
        for _ in 0..200 {
            if let Some(st) = x.child.try_wait()? {
                bail!("Xvfb {} exited at start ({st})", x.display);
            }
            if sock.exists() {
                return Ok(x);
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        bail!("Xvfb {} did not start", x.display)
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Xvfb {
    fn drop(&mut self) {
        // TERM, not KILL: Xvfb removes its lock file and socket on TERM.
        crate::os::signal_tree(self.child.id(), libc::SIGTERM);
        for _ in 0..100 {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_suite() {
        let s = Suite::parse(
            r#"
[[program]]
name = "a"
packages = ["python3"]
command = ["python3", "-c", "pass"]

[[program]]
name = "b"
command = ["x"]
ready = "window:B"
x11 = true
timeout = 5
"#,
        )
        .unwrap();
        assert_eq!(s.programs.len(), 2);
        assert_eq!(s.programs[0].ready, "exit");
        let t = s.programs[1].target(Path::new("/d"), Duration::from_secs(60));
        assert_eq!(t.timeout, Duration::from_secs(5));
        assert_eq!(t.cwd.as_deref(), Some(Path::new("/d")));
        assert!(s.programs[1].x11);
    }

    #[test]
    fn rejects_bad_suites() {
        for bad in [
            "[[program]]\nname = \"a\"\ncommand = []\n",
            "[[program]]\nname = \"a\"\ncommand = [\"x\"]\nready = \"soon\"\n",
            "[[program]]\nname = \"a\"\ncommand = [\"x\"]\nbogus = 1\n",
        ] {
            assert!(Suite::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_shipped_suite_parses() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/suite.toml");
        let s = Suite::load(&p).unwrap();
        assert!(s.programs.len() >= 3);
    }
}
