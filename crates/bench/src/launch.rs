//! Launching the program and deciding when its launch is complete.
//!
//! Completion is process exit by default. Programs that stay up (servers,
//! GUIs, a REPL) are complete when they can serve their user: a line on
//! stdout/stderr matching a pattern, a file appearing, a TCP port
//! accepting, or an X11 window being mapped. The program is then stopped
//! (its whole process group), so that the next launch starts from the
//! state the scenario prepares.

use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use regex_lite::Regex;

use crate::os;
use crate::window::WindowWatch;

/// When a launch is complete.
#[derive(Debug, Clone)]
pub enum Ready {
    /// The command exits.
    Exit,
    /// A line of stdout or stderr matches.
    Output(Regex),
    /// This path exists (it is removed before each launch).
    File(PathBuf),
    /// A TCP connection to HOST:PORT succeeds.
    Port(String),
    /// A visible X11 window whose name matches, from the X server's events
    /// ([`WindowWatch`]).
    Window(String),
    /// The launch's process group did no reads (from storage or from the
    /// cache) for this long: complete at its last read. FAST's and
    /// Paralfetch's I/O-idle end of a launch, for programs that neither
    /// exit nor print nor open a window.
    Idle(Duration),
}

impl FromStr for Ready {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (kind, arg) = s.split_once(':').unwrap_or((s, ""));
        match kind {
            "exit" if arg.is_empty() => Ok(Ready::Exit),
            "output" => Regex::new(arg)
                .map(Ready::Output)
                .map_err(|e| format!("bad pattern: {e}")),
            "file" if !arg.is_empty() => Ok(Ready::File(PathBuf::from(arg))),
            "port" if !arg.is_empty() => {
                let addr = if arg.contains(':') {
                    arg.to_string()
                } else {
                    format!("127.0.0.1:{arg}")
                };
                Ok(Ready::Port(addr))
            }
            "window" if !arg.is_empty() => Ok(Ready::Window(arg.to_string())),
            "idle" => arg
                .parse::<f64>()
                .ok()
                .filter(|v| *v > 0.0)
                .map(|v| Ready::Idle(Duration::from_secs_f64(v)))
                .ok_or_else(|| format!("idle:SECONDS needs a positive number, not {arg:?}")),
            _ => Err(format!(
                "unknown readiness {s:?}: use exit, output:REGEX, file:PATH, port:[HOST:]PORT, window:NAME or idle:SECONDS"
            )),
        }
    }
}

impl fmt::Display for Ready {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ready::Exit => f.write_str("exit"),
            Ready::Output(r) => write!(f, "output:{}", r.as_str()),
            Ready::File(p) => write!(f, "file:{}", p.display()),
            Ready::Port(a) => write!(f, "port:{a}"),
            Ready::Window(n) => write!(f, "window:{n}"),
            Ready::Idle(d) => write!(f, "idle:{}", d.as_secs_f64()),
        }
    }
}

impl Ready {
    /// Polls a probe that needs no pipe: file, port. `None` for exit,
    /// output, a window and idleness, which are observed otherwise.
    pub fn poll(&self) -> Option<bool> {
        match self {
            Ready::File(p) => Some(p.exists()),
            Ready::Port(a) => Some(
                a.to_socket_addrs()
                    .ok()
                    .and_then(|mut i| i.next())
                    .is_some_and(|sa| {
                        TcpStream::connect_timeout(&sa, Duration::from_millis(50)).is_ok()
                    }),
            ),
            Ready::Exit | Ready::Output(_) | Ready::Window(_) | Ready::Idle(_) => None,
        }
    }

    /// How often to poll (a window is waited for, not polled).
    pub fn interval(&self) -> Duration {
        match self {
            Ready::Idle(_) => Duration::from_millis(5),
            Ready::Port(_) | Ready::File(_) => Duration::from_millis(2),
            _ => Duration::from_micros(500),
        }
    }

    /// Undoes what a previous launch left that would make the probe fire
    /// at once.
    pub fn reset(&self) {
        if let Ready::File(p) = self {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// What to launch and how.
#[derive(Debug, Clone)]
pub struct Target {
    pub name: String,
    pub argv: Vec<String>,
    pub cwd: Option<PathBuf>,
    pub env: Vec<(String, String)>,
    pub ready: Ready,
    pub prepare: Option<String>,
    pub cleanup: Option<String>,
    pub timeout: Duration,
}

impl Target {
    /// A watch for the launch's window, on the display it is given
    /// (`DISPLAY` in its environment, else ours); `None` unless its
    /// launch is complete at a window.
    pub fn window_watch(&self) -> Result<Option<WindowWatch>> {
        let Ready::Window(name) = &self.ready else {
            return Ok(None);
        };
        let display = self
            .env
            .iter()
            .rev()
            .find(|(k, _)| k == "DISPLAY")
            .map(|(_, v)| v.as_str());
        WindowWatch::start(display, name).map(Some)
    }
}

/// One finished launch.
#[derive(Debug, Clone, Copy)]
pub struct Launched {
    pub time: Duration,
    pub exit_code: Option<i32>,
}

/// Makes the child of `cmd` (a prefetcher the bench starts) get SIGTERM
/// when the thread that starts it exits, so that a bench killed outright
/// (SIGKILL, or the testbed's owner gone) leaves no daemon behind holding
/// the testbed's mounts.
pub fn stop_with_us(cmd: &mut Command) -> &mut Command {
    // SAFETY: runs in the forked child before exec; prctl is
    // async-signal-safe and touches no memory of ours.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// Runs a shell command (--prepare, --cleanup) to completion.
pub fn shell(cmd: &str, cwd: Option<&Path>, what: &str) -> Result<()> {
    let mut c = Command::new("sh");
    c.args(["-c", cmd])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(d) = cwd {
        c.current_dir(d);
    }
    let out = c
        .output()
        .with_context(|| format!("running {what} {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{what} command {cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Launches `t` and returns the time from `t0` (taken by the caller, before
/// any prefetch that holds the application) to completion.
pub fn launch(t: &Target, t0: Instant) -> Result<Launched> {
    t.ready.reset();
    // Watching before the spawn: no window is mapped unseen.
    let mut watch = t.window_watch()?;
    let piped = matches!(t.ready, Ready::Output(_));
    let mut c = Command::new(&t.argv[0]);
    c.args(&t.argv[1..])
        .stdin(Stdio::null())
        .process_group(0)
        .envs(t.env.iter().map(|(k, v)| (k, v)));
    if piped {
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
    } else if std::env::var_os("WARMSTART_BENCH_SHOW_OUTPUT").is_some() {
        // For finding out why a program fails under the bench.
        c.stdout(Stdio::inherit()).stderr(Stdio::inherit());
    } else {
        c.stdout(Stdio::null()).stderr(Stdio::null());
    }
    if let Some(d) = &t.cwd {
        c.current_dir(d);
    }
    let mut child = c
        .spawn()
        .with_context(|| format!("starting {}", t.argv.join(" ")))?;
    let pgid = child.id();
    let matched = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    if let Ready::Output(re) = &t.ready {
        let outs: [Option<Box<dyn Read + Send>>; 2] = [
            child.stdout.take().map(|s| Box::new(s) as _),
            child.stderr.take().map(|s| Box::new(s) as _),
        ];
        for s in outs.into_iter().flatten() {
            let re = re.clone();
            let m = Arc::clone(&matched);
            // Keep draining after the match, or a chatty program would
            // block on a full pipe before we stop it.
            readers.push(thread::spawn(move || {
                let mut r = BufReader::new(s);
                let mut line = Vec::new();
                while r.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
                    if !m.load(Ordering::Relaxed) && re.is_match(&String::from_utf8_lossy(&line)) {
                        m.store(true, Ordering::Relaxed);
                    }
                    line.clear();
                }
            }));
        }
    }
    let deadline = t0 + t.timeout;
    let result = wait_ready(
        t,
        &mut child,
        &matched,
        &readers,
        watch.as_mut(),
        deadline,
        t0,
    );
    stop(&mut child, pgid);
    for r in readers {
        let _ = r.join();
    }
    result
}

fn wait_ready(
    t: &Target,
    child: &mut Child,
    matched: &AtomicBool,
    readers: &[thread::JoinHandle<()>],
    mut watch: Option<&mut WindowWatch>,
    deadline: Instant,
    t0: Instant,
) -> Result<Launched> {
    let interval = t.ready.interval();
    let pgid = child.id();
    // A window is waited for on the X connection and the launch's exit.
    let pidfd = watch.as_ref().and_then(|_| os::pidfd_open(pgid).ok());
    // A launch complete at its exit is waited for without waking up in
    // between: polling every 500 µs took 10% from a CPU-bound launch on
    // two vCPUs (javac on the `sd` model: 1.93 s against 1.77 s).
    if matches!(t.ready, Ready::Exit) {
        if let Ok(fd) = os::pidfd_open(pgid) {
            os::wait_readable(&fd, deadline);
        }
    }
    let mut io = (group_reads(pgid), t0.elapsed());
    loop {
        let ready = match &t.ready {
            Ready::Output(_) => matched.load(Ordering::Relaxed),
            Ready::Window(_) => watch.as_deref_mut().map_or(Ok(false), WindowWatch::ready)?,
            Ready::Idle(idle) => {
                let now = group_reads(pgid);
                if now != io.0 {
                    io = (now, t0.elapsed());
                }
                t0.elapsed() >= io.1 + *idle
            }
            r => r.poll().unwrap_or(false),
        };
        if ready {
            // An idle launch completed at its last read, not when we noticed.
            let time = match t.ready {
                Ready::Idle(_) => io.1,
                _ => t0.elapsed(),
            };
            return Ok(Launched {
                time,
                exit_code: None,
            });
        }
        if let Some(st) = child.try_wait()? {
            let time = t0.elapsed();
            let code = st
                .code()
                .or_else(|| std::os::unix::process::ExitStatusExt::signal(&st).map(|s| 128 + s));
            if matches!(t.ready, Ready::Exit | Ready::Idle(_)) {
                return Ok(Launched {
                    time,
                    exit_code: code,
                });
            }
            // The last lines may still be in the pipe: wait for the
            // readers to reach its end (a helper the program left running
            // may hold it open, hence the bound).
            let drained = Instant::now() + Duration::from_secs(2);
            while !matched.load(Ordering::Relaxed)
                && !readers.iter().all(thread::JoinHandle::is_finished)
                && Instant::now() < drained
            {
                thread::sleep(Duration::from_millis(5));
            }
            let window_up = watch.as_deref_mut().map_or(Ok(false), WindowWatch::ready)?;
            if matched.load(Ordering::Relaxed) || window_up || t.ready.poll() == Some(true) {
                return Ok(Launched {
                    time,
                    exit_code: code,
                });
            }
            bail!(
                "{} exited ({}) before it was ready ({})",
                t.name,
                st,
                t.ready
            );
        }
        if Instant::now() >= deadline {
            bail!(
                "{} was not ready ({}) after {:.0}s",
                t.name,
                t.ready,
                t.timeout.as_secs_f64()
            );
        }
        match (&watch, &pidfd) {
            (Some(w), fd) => w.wait(fd.as_ref().map(|f| f.as_fd()), deadline),
            _ => thread::sleep(interval),
        }
    }
}

/// The processes of group `pgid`, from /proc.
fn group_members(pgid: u32) -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            // /proc/PID/stat: "pid (comm) state ppid pgrp ..."; comm may hold spaces.
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    stat.rsplit_once(')')
                        .and_then(|(_, rest)| rest.split_whitespace().nth(2))
                        .and_then(|g| g.parse::<u32>().ok())
                })
                == Some(pgid)
        })
        .collect()
}

/// Bytes read so far (rchar: every read(), cached or not, plus
/// read_bytes: what reached storage, which covers mmap faults) by the
/// processes of group `pgid`, from /proc.
fn group_reads(pgid: u32) -> u64 {
    group_members(pgid)
        .into_iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/io")).ok())
        .map(|io| {
            io.lines()
                .filter(|l| l.starts_with("rchar:") || l.starts_with("read_bytes:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum::<u64>()
        })
        .sum()
}

/// Waits up to `grace` for the child to exit.
fn wait_exit(child: &mut Child, grace: Duration) -> bool {
    let until = Instant::now() + grace;
    loop {
        if child.try_wait().ok().flatten().is_some() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// How long a wrapper (`warmstart run`, the group's leader) may take to
/// save what it learned once the program it ran is gone. GIMP outlives
/// TERM's grace period; killing the whole group then killed the wrapper
/// too before it saved its trace, so `run` never got a plan for it.
const LEADER_GRACE: Duration = Duration::from_secs(15);

/// Stops what is left of the launch: TERM to the group; after a grace
/// period KILL to the rest of the group but its leader, which then gets
/// time to finish (a wrapper saving its trace); then KILL to all, and
/// reaps the child.
fn stop(child: &mut Child, pgid: u32) {
    if child.try_wait().ok().flatten().is_none() {
        os::signal_group(pgid, libc::SIGTERM);
        if !wait_exit(child, Duration::from_secs(3)) {
            let others: Vec<u32> = group_members(pgid)
                .into_iter()
                .filter(|&p| p != child.id())
                .collect();
            for &p in &others {
                // SAFETY: kill has no memory-safety preconditions.
                unsafe { libc::kill(p as i32, libc::SIGKILL) };
            }
            if !others.is_empty() {
                wait_exit(child, LEADER_GRACE);
            }
        }
    }
    // Helpers a program left running in its group (a daemonised server)
    // would keep its files warm and disturb the next scenario.
    os::signal_group(pgid, libc::SIGKILL);
    let _ = child.wait();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A leader that outlives TERM (a wrapper whose program ignores it)
    /// gets to finish once the rest of its group is killed.
    #[test]
    fn stop_lets_the_leader_finish_after_its_group() {
        let d = tempfile::tempdir().unwrap();
        let saved = d.path().join("saved");
        let script = format!("trap '' TERM; sleep 60; echo x > {}", saved.display());
        let mut child = std::process::Command::new("/bin/sh")
            .args(["-c", &script])
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = child.id();
        // The group has its sleep before it is stopped.
        let t = Instant::now();
        while group_members(pgid).len() < 2 {
            assert!(t.elapsed() < Duration::from_secs(10), "sleep never started");
            thread::sleep(Duration::from_millis(10));
        }
        stop(&mut child, pgid);
        assert!(saved.exists(), "the leader was killed before it finished");
        assert!(group_members(pgid).is_empty());
    }

    fn target(argv: &[&str], ready: &str) -> Target {
        Target {
            name: "t".into(),
            argv: argv.iter().map(|s| s.to_string()).collect(),
            cwd: None,
            env: Vec::new(),
            ready: ready.parse().unwrap(),
            prepare: None,
            cleanup: None,
            timeout: Duration::from_secs(10),
        }
    }

    #[test]
    fn parses_readiness() {
        for (s, shown) in [
            ("exit", "exit"),
            ("output:^ready", "output:^ready"),
            ("file:/tmp/x", "file:/tmp/x"),
            ("port:8080", "port:127.0.0.1:8080"),
            ("port:[::1]:80", "port:[::1]:80"),
            ("window:gedit", "window:gedit"),
            ("idle:0.5", "idle:0.5"),
        ] {
            assert_eq!(s.parse::<Ready>().unwrap().to_string(), shown);
        }
        for bad in [
            "", "exit:1", "file:", "output:(", "idle", "idle:0", "idle:x",
        ] {
            assert!(bad.parse::<Ready>().is_err(), "{bad}");
        }
    }

    /// A shell command that writes its pid to a file first; the pid
    /// stays the program's through `exec`.
    fn with_pid(script: &str) -> (tempfile::TempDir, String, std::path::PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("pid");
        let cmd = format!("echo $$ > {}; {script}", f.display());
        (d, cmd, f)
    }

    /// The launch's process is gone (stopped and reaped, not left running
    /// nor waited for until it ends by itself).
    fn assert_stopped(pid_file: &std::path::Path) {
        let pid = std::fs::read_to_string(pid_file).unwrap();
        let proc = std::path::PathBuf::from(format!("/proc/{}", pid.trim()));
        assert!(!proc.exists(), "{} is still there", proc.display());
    }

    #[test]
    fn idle_readiness_ends_at_the_last_read() {
        // Reads for a moment, then sits idle for 30 s: complete at the
        // reads, found idle after 0.3 s, and stopped.
        let (_d, cmd, pid) =
            with_pid("for i in 1 2 3; do cat /etc/passwd > /dev/null; done; exec sleep 30");
        let t = target(&["sh", "-c", &cmd], "idle:0.3");
        let start = Instant::now();
        let l = launch(&t, start).unwrap();
        assert_eq!(l.exit_code, None, "stopped before it exited");
        // Complete at its last read, which came before the idle time
        // that was waited out.
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(300), "{waited:?}");
        assert!(
            l.time + Duration::from_millis(300) <= waited,
            "{l:?} {waited:?}"
        );
        assert_stopped(&pid);
    }

    #[test]
    fn exit_readiness_reports_the_code() {
        let l = launch(&target(&["sh", "-c", "exit 3"], "exit"), Instant::now()).unwrap();
        assert_eq!(l.exit_code, Some(3));
    }

    #[test]
    fn output_readiness_stops_a_program_that_stays_up() {
        let (_d, cmd, pid) = with_pid("echo starting; echo READY >&2; exec sleep 30");
        let t = target(&["sh", "-c", &cmd], "output:^READY");
        let l = launch(&t, Instant::now()).unwrap();
        assert_eq!(l.exit_code, None);
        assert_stopped(&pid);
    }

    #[test]
    fn output_readiness_sees_the_last_line_before_exit() {
        // Ready on the very line it prints as it exits: the readers are
        // waited for, not given a moment.
        for _ in 0..20 {
            let t = target(&["sh", "-c", "echo READY"], "output:^READY");
            let l = launch(&t, Instant::now()).unwrap();
            assert!(matches!(l.exit_code, None | Some(0)), "{l:?}");
        }
    }

    #[test]
    fn file_readiness_and_early_exit() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("up");
        let ready = format!("file:{}", f.display());
        let cmd = format!("touch {}; sleep 30", f.display());
        assert!(launch(&target(&["sh", "-c", &cmd], &ready), Instant::now()).is_ok());
        // The file is removed before the next launch, so this one must
        // fail: it exits without creating it.
        let err = launch(&target(&["true"], &ready), Instant::now()).unwrap_err();
        assert!(err.to_string().contains("before it was ready"), "{err}");
    }

    #[test]
    fn timeout_is_an_error() {
        let mut t = target(&["sleep", "30"], "output:never");
        t.timeout = Duration::from_millis(200);
        let err = launch(&t, Instant::now()).unwrap_err();
        assert!(err.to_string().contains("not ready"), "{err}");
    }

    #[test]
    fn port_readiness() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let t = target(&["sleep", "30"], &format!("port:{port}"));
        assert!(launch(&t, Instant::now()).is_ok());
    }
}
