//! Which launches the daemon follows: the configured allow and deny globs,
//! the key a launch is judged by (the script for interpreters), and the
//! trivial launches (`true`, `ls`, `grep` in a shell loop) that are not
//! worth a profile.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use warmstart_plan::trace::TraceStats;

use super::config::{DaemonConfig, LearnMode};

impl DaemonConfig {
    /// Whether a launch whose key path is `path` may be traced.
    pub fn allows(&self, path: &str) -> bool {
        let m = |g: &String| glob::Pattern::new(g).is_ok_and(|p| p.matches(path));
        if self.denied_by(path).is_some() {
            return false;
        }
        match self.learn {
            LearnMode::All => true,
            LearnMode::AllowList => self.allow.iter().any(m),
        }
    }

    /// Whether a launch keyed `path` is followed: allowed by the policy,
    /// or named by `warmstart learn` (`learn`), or `continued` (its process
    /// was an allowed launch before this exec) — unless denied.
    pub fn permits(&self, path: &str, continued: bool, learn: &BTreeSet<String>) -> bool {
        self.allows(path) || ((continued || learn.contains(path)) && self.denied_by(path).is_none())
    }

    /// Whether an `allow` glob names `path`.
    pub fn named_by_allow(&self, path: &str) -> bool {
        self.allow
            .iter()
            .any(|g| glob::Pattern::new(g).is_ok_and(|p| p.matches(path)))
    }

    /// The first deny pattern matching `path`.
    pub fn denied_by(&self, path: &str) -> Option<&str> {
        self.deny
            .iter()
            .find(|g| glob::Pattern::new(g).is_ok_and(|p| p.matches(path)))
            .map(String::as_str)
    }

    /// Whether a recorded launch is worth a profile: it ran at least
    /// `min_learn_ms`, or used at least `min_learn_kib` of file data and
    /// metadata. A launch that is neither costs more to learn and replay
    /// than a prefetch could save.
    pub fn worth_learning(&self, stats: &TraceStats) -> bool {
        let ms = stats.duration_ns / 1_000_000;
        let bytes = stats.bytes.saturating_add(stats.metadata_bytes);
        self.min_learn_ms == 0
            || ms >= self.min_learn_ms
            || bytes >= self.min_learn_kib.saturating_mul(1024)
    }
}

/// Policy keys whose launches were found trivial, and until when they are
/// left alone: a storm of `/bin/true` is then decided from memory, without
/// recording another launch. Bounded, so that a machine running many
/// distinct tools does not grow it without end.
#[derive(Default)]
pub(crate) struct Trivial {
    until: HashMap<String, (Instant, Option<QuietExe>)>,
    /// Programs found trivial since the event loop last looked, and until
    /// when: it tells the kernel side to leave them alone ([`QuietExe`]).
    quiet: Vec<(QuietExe, Instant)>,
    /// A held program was let go: the kernel side forgets them all.
    released: bool,
}

/// A program the kernel side leaves alone while it is held as trivial:
/// its executable's identity, and the path an execve named it by (its
/// `execve` calls are not reported either). Only for programs whose
/// launches are named by their binary: an interpreter's are named by the
/// script or command line it runs ([`trivial_key`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QuietExe {
    /// The kernel's `s_dev` of the executable's file system, as exec
    /// events carry it.
    pub(crate) dev: u32,
    pub(crate) ino: u64,
    /// Absolute path as given to execve, if the daemon saw it.
    pub(crate) name: Option<String>,
}

impl QuietExe {
    /// What the kernel side can leave alone of a launch of `exe`, if
    /// anything: nothing for an interpreter, whose launches differ by
    /// what it runs.
    pub(crate) fn of(exe: &str, dev: u32, ino: u64, execve_name: Option<&str>) -> Option<Self> {
        let launcher = Path::new(exe).file_name().is_some_and(|b| b == "env");
        (interpreter(exe).is_none() && !launcher).then(|| QuietExe {
            dev,
            ino,
            name: execve_name
                .filter(|n| n.starts_with('/'))
                .map(str::to_string),
        })
    }
}

impl Trivial {
    /// How long a trivial program is left alone before one launch of it
    /// is recorded again (it may have become a bigger program).
    pub(crate) const HOLD: Duration = Duration::from_secs(3600);
    const MAX: usize = 4096;

    /// Holds `key` back for [`Self::HOLD`], and its program in the kernel
    /// too when it can be told by its binary.
    pub(crate) fn mark(&mut self, key: &str, quiet: Option<QuietExe>, now: Instant) {
        if self.until.len() >= Self::MAX && !self.until.contains_key(key) {
            self.until.retain(|_, (until, _)| *until > now);
            if self.until.len() >= Self::MAX {
                self.until.clear();
            }
        }
        let until = now + Self::HOLD;
        if let Some(q) = &quiet {
            if self.quiet.len() < Self::MAX {
                self.quiet.push((q.clone(), until));
            }
        }
        self.until.insert(key.to_string(), (until, quiet));
    }

    pub(crate) fn holds(&self, key: &str, now: Instant) -> bool {
        self.until.get(key).is_some_and(|(until, _)| *until > now)
    }

    /// Lets `key` go (the user asked for it): the kernel side forgets the
    /// quiet programs and is told again of the others, so that this one's
    /// next exec is seen.
    pub(crate) fn remove(&mut self, key: &str) {
        if self.until.remove(key).is_none() {
            return;
        }
        self.released = true;
        self.quiet = self
            .until
            .values()
            .filter_map(|(until, q)| Some((q.clone()?, *until)))
            .collect();
    }

    pub(crate) fn len(&self) -> usize {
        self.until.len()
    }

    /// Programs to quiet since the last call, and whether every quiet
    /// program must be forgotten first.
    pub(crate) fn take_quiet(&mut self) -> (Vec<(QuietExe, Instant)>, bool) {
        (
            std::mem::take(&mut self.quiet),
            std::mem::take(&mut self.released),
        )
    }
}

/// The path that names a launch for policy: the script or main class for
/// interpreters (`python3 app.py` is `app.py`, not python3), else the binary.
/// A relative script is taken in `cwd`, the launching process's directory.
pub fn policy_path(exe: &str, argv: &[String], cwd: &Path) -> String {
    if let Some((script, java)) = script_of(exe, argv) {
        if let Ok(p) = std::fs::canonicalize(cwd.join(script)) {
            return p.display().to_string();
        }
        if java {
            return script.to_string();
        }
    }
    exe.to_string()
}

/// The command `env` runs, when `exe` is `env` running one with no
/// options but variable assignments (`#!/usr/bin/env node`, `env LANG=C
/// app`): a launch of that command, as if it had been exec'd directly,
/// so that a script started through `env` is keyed and named by its
/// interpreter and script from `env`'s exec on, and `env`'s own start is
/// part of its launch. `None` for anything else, options included (`-i`,
/// `-S`: what runs then is not the command line's to tell).
pub(crate) fn through_env(exe: &str, argv: &[String]) -> Option<Vec<String>> {
    if Path::new(exe).file_name()? != "env" {
        return None;
    }
    let mut rest = argv.get(1..)?.iter();
    let program = loop {
        let a = rest.next()?;
        if a.starts_with('-') {
            return None;
        }
        if !a.contains('=') {
            break a;
        }
    };
    Some(std::iter::once(program).chain(rest).cloned().collect())
}

/// The base name of `exe` if it is an interpreter (of scripts, or of a
/// main class for java).
fn interpreter(exe: &str) -> Option<String> {
    let base = Path::new(exe)
        .file_name()
        .map(|b| b.to_string_lossy().into_owned())
        .unwrap_or_default();
    // /bin/sh is dash on Debian: the executable the kernel reports is dash.
    [
        "python", "perl", "ruby", "node", "bash", "dash", "zsh", "sh", "java",
    ]
    .iter()
    .any(|i| base == *i || base.starts_with(&format!("{i}3")) || base.starts_with(&format!("{i}.")))
    .then_some(base)
}

/// What a trivial launch holds back ([`Trivial`]): the program (its
/// policy key: every `grep` alike, whatever it searches), except for an
/// interpreter running inline code (`sh -c`, `python3 -c`), whose
/// launches have nothing in common but the interpreter: there, only the
/// same command line (its profile `name`).
pub(crate) fn trivial_key(exe: &str, argv: &[String], key: &str, name: &str) -> String {
    if interpreter(exe).is_some() && script_of(exe, argv).is_none() {
        name.to_string()
    } else {
        key.to_string()
    }
}

/// The script an interpreter runs (and whether the interpreter is java,
/// whose "script" is a main class), if it runs one: not for `python3 -c
/// CODE`, `-m module`, `sh -c`, `perl -e`.
fn script_of<'a>(exe: &str, argv: &'a [String]) -> Option<(&'a str, bool)> {
    let base = interpreter(exe)?;
    let java = base == "java";
    let first = argv.iter().skip(1).position(|a| !a.starts_with('-'))?;
    // No lookup of inline code as a file either: after a cache drop that
    // reads the directory from disk on the exec's critical path.
    let inline = first > 0 && !java && ["-c", "-m", "-e", "-E"].contains(&argv[first].as_str());
    (!inline).then(|| (argv[first + 1].as_str(), java))
}

/// For `warmstart learn`: the script an interpreter would run that does
/// not exist (a typo would otherwise put the interpreter itself, and so
/// every script it runs, on the learn list).
pub fn missing_script(exe: &str, argv: &[String], cwd: &Path) -> Option<String> {
    let (script, java) = script_of(exe, argv)?;
    // Only what names a file: the value of an option (`python3 -X
    // importtime app.py`) may come first and is no script.
    let file_like = script.contains('/') || script.contains('.');
    (!java && file_like && !cwd.join(script).exists()).then(|| script.to_string())
}

/// If an execve of `filename` with `given` arguments became an exec of a
/// program with the arguments `now`, as the kernel runs a script (`#!`):
/// the interpreter and its option, before the script as given to execve,
/// then the script's own arguments. Returns what comes before the script.
pub(crate) fn script_prefix(
    filename: &str,
    given: &[String],
    now: &[String],
) -> Option<Vec<String>> {
    let rest = given.get(1..).unwrap_or_default();
    let at = now.len().checked_sub(rest.len() + 1)?;
    (at >= 1 && now[at] == filename && now[at + 1..] == *rest).then(|| now[..at].to_vec())
}

/// Scripts run directly, by their resolved path: the interpreter's resolved
/// path and the arguments before the script. Learned at their exec events
/// (the execve names the script, the exec its interpreter), so that their
/// next execve can start the replay the interpreter's exec would.
#[derive(Default)]
pub(crate) struct Scripts(HashMap<PathBuf, (String, Vec<String>)>);

impl Scripts {
    /// Bounds the memory a machine running many scripts can take.
    const MAX: usize = 1024;

    pub(crate) fn remember(
        &mut self,
        tgid: u32,
        filename: &str,
        interpreter: &str,
        prefix: Vec<String>,
    ) {
        let Ok(cwd) = std::fs::read_link(format!("/proc/{tgid}/cwd")) else {
            return;
        };
        let Ok(script) = std::fs::canonicalize(cwd.join(filename)) else {
            return;
        };
        if self.0.len() >= Self::MAX && !self.0.contains_key(&script) {
            self.0.clear();
        }
        self.0.insert(script, (interpreter.to_string(), prefix));
    }

    pub(crate) fn get(&self, script: &Path) -> Option<&(String, Vec<String>)> {
        self.0.get(script)
    }

    pub(crate) fn forget(&mut self, script: &Path) {
        self.0.remove(script);
    }
}

/// A launch's command line with a relative program made absolute (in the
/// process's working directory), and its policy key ([`policy_path`]).
pub(crate) fn launch_key(tgid: u32, exe: &str, argv: &[String]) -> Option<(Vec<String>, String)> {
    let (exe, mut argv) = match through_env(exe, argv) {
        Some(program) => {
            let exe = crate::manager::resolve_exe(&program[0]);
            (exe, program)
        }
        None => (exe.to_string(), argv.to_vec()),
    };
    if argv.is_empty() {
        return None;
    }
    let exe = exe.as_str();
    // Gone already (nothing to prefetch), or not ours to read: a relative
    // path cannot be placed.
    let cwd = std::fs::read_link(format!("/proc/{tgid}/cwd")).ok()?;
    // `./app` names the same program as `warmstart run -- ./app` did
    // where it was started, not a file relative to the daemon.
    if argv[0].contains('/') && !argv[0].starts_with('/') {
        argv[0] = cwd.join(&argv[0]).display().to_string();
    }
    let key = policy_path(exe, &argv, &cwd);
    Some((argv, key))
}

pub(crate) fn read_cmdline(pid: u32) -> Option<Vec<String>> {
    warmstart_bpf::split_cmdline(&std::fs::read(format!("/proc/{pid}/cmdline")).ok()?)
}

pub(crate) fn is_service(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .is_ok_and(|c| c.contains("/system.slice/"))
}

/// Whether `pid` runs under `warmstart run`, as its child or further
/// down: the daemon's own binary or its front (or one at the same path: a
/// newer build installed while the daemon runs) running its `run`
/// command; the front runs a prefetched launch itself. `run`
/// records and counts the whole tree itself; followed here as well, its
/// launch would be counted and learned twice, the second time once `run`
/// had saved it and let go of the profile's lock, and the programs it
/// starts would get profiles of their own. (`warmstart bench` launches
/// programs for the daemon to follow: it is not `run`.)
pub(crate) fn started_by_warmstart(proc: &Path, pid: u32) -> bool {
    let parent_of = |pid: u32| {
        std::fs::read_to_string(proc.join(pid.to_string()).join("status"))
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))?
            .trim()
            .parse::<u32>()
            .ok()
    };
    // Only asked of an ancestor running a `run` command: finding them
    // stats the daemon's own files, which a cache drop sends back to the
    // disk, on the way to every launch's replay.
    let mut ours: Option<Vec<Binary>> = None;
    let mut pid = pid;
    // Bounded: a loop in a forged table, or a very deep tree, ends it.
    for _ in 0..64 {
        match parent_of(pid) {
            Some(ppid) if ppid > 1 => pid = ppid,
            _ => return false,
        }
        if command_of(proc, pid).as_deref() == Some("run")
            && is_ours(proc, pid, ours.get_or_insert_with(|| own_binaries(proc)))
        {
            return true;
        }
    }
    false
}

/// Whether process `pid` runs one of `ours`.
fn is_ours(proc: &Path, pid: u32, ours: &[Binary]) -> bool {
    let exe = proc.join(pid.to_string()).join("exe");
    let id = id_of(&exe);
    let exe_path = link_path(&exe);
    ours.iter().any(|(my_id, my_path)| {
        (id.is_some() && id == *my_id) || (my_path.is_some() && exe_path == *my_path)
    })
}

/// The processes the daemon knows to run `warmstart run`. A launch's
/// ancestors are searched for one ([`started_by_warmstart`]) only while
/// there is one: the search reads four files of `/proc` a generation on
/// the way to every launch's replay, 0.4 ms a launch here and 8% of the
/// daemon's CPU.
#[derive(Debug, Default)]
pub(crate) struct Wrappers {
    pids: HashSet<u32>,
    /// warmstart's binaries, found once: after a cache drop, finding them
    /// again would read from the disk on the launch's path.
    ours: Vec<Binary>,
    /// The events the recorder had lost when `/proc` was scanned: an exec
    /// of `run` may be among those lost since.
    drops: u64,
}

impl Wrappers {
    /// Those running now, from `proc`.
    pub(crate) fn scan(proc: &Path, drops: u64) -> Wrappers {
        let ours = own_binaries(proc);
        let pids = std::fs::read_dir(proc)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&pid| runs_run(proc, pid, &ours))
            .collect();
        Wrappers { pids, ours, drops }
    }

    /// An exec of one of warmstart's binaries, with its command line if
    /// the event carried one.
    pub(crate) fn exec_of_own(&mut self, pid: u32, argv: Option<&[String]>) {
        if argv.is_none_or(|a| subcommand(a) == Some("run")) {
            self.pids.insert(pid);
        }
    }

    /// Whether any may still be running: those that ended or exec'd
    /// another program are forgotten, and `/proc` is scanned again if the
    /// recorder has lost events since it last was.
    pub(crate) fn any(&mut self, proc: &Path, drops: u64) -> bool {
        if drops != self.drops {
            *self = Wrappers::scan(proc, drops);
        } else if !self.pids.is_empty() {
            let ours = &self.ours;
            self.pids.retain(|&pid| runs_run(proc, pid, ours));
        }
        !self.pids.is_empty()
    }
}

/// Whether process `pid` runs `warmstart run`.
fn runs_run(proc: &Path, pid: u32, ours: &[Binary]) -> bool {
    command_of(proc, pid).as_deref() == Some("run") && is_ours(proc, pid, ours)
}

/// A binary by identity (dev, ino) and by path.
pub(crate) type Binary = (Option<(u64, u64)>, Option<String>);

/// warmstart's own binaries: this process's (`proc/self/exe`) and, when
/// it is the core, its front (see [`crate::install`]).
pub(crate) fn own_binaries(proc: &Path) -> Vec<Binary> {
    let me = proc.join("self/exe");
    let front = link_path(&me).and_then(|p| crate::install::front_binary(Path::new(&p)));
    std::iter::once((id_of(&me), link_path(&me)))
        .chain(front.map(|f| (id_of(&f), Some(f.to_string_lossy().into_owned()))))
        .collect()
}

/// A file's identity; stat, not open: nothing of the file is read.
fn id_of(p: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

/// Where a `/proc` link (`exe`) points, without the mark of a file
/// replaced since.
fn link_path(p: &Path) -> Option<String> {
    let t = std::fs::read_link(p).ok()?.to_string_lossy().into_owned();
    Some(
        t.strip_suffix(" (deleted)")
            .map(str::to_string)
            .unwrap_or(t),
    )
}

/// A warmstart process's command: its first argument that is not an
/// option (the only options before it, `-q`, take no value).
fn command_of(proc: &Path, pid: u32) -> Option<String> {
    let cmdline = std::fs::read(proc.join(pid.to_string()).join("cmdline")).ok()?;
    let argv: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    subcommand(&argv).map(str::to_string)
}

/// A warmstart command line's subcommand: its first argument that is not
/// an option (`run` in `warmstart -q run -- app`).
pub(crate) fn subcommand(argv: &[String]) -> Option<&str> {
    argv.iter()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .map(String::as_str)
}

/// The real uid a process runs as, from `/proc/PID/status`: profiles are
/// per user. `None` once the process is gone.
pub(crate) fn launch_uid(proc: &Path, pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(proc.join(pid.to_string()).join("status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
