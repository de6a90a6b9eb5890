//! Which launches the daemon follows: the configured allow and deny globs,
//! the key a launch is judged by (the script for interpreters), and the
//! trivial launches (`true`, `ls`, `grep` in a shell loop) that are not
//! worth a profile.

use std::collections::{BTreeSet, HashMap};
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
        let exe = proc.join(pid.to_string()).join("exe");
        let id = id_of(&exe);
        let exe_path = link_path(&exe);
        let is_ours = |(my_id, my_path): &Binary| {
            (id.is_some() && id == *my_id) || (my_path.is_some() && exe_path == *my_path)
        };
        if command_of(proc, pid).as_deref() == Some("run")
            && ours
                .get_or_insert_with(|| own_binaries(proc))
                .iter()
                .any(is_ours)
        {
            return true;
        }
    }
    false
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
mod tests {
    use super::*;

    /// `#!/usr/bin/env node` makes the kernel run `env node SCRIPT ARGS`:
    /// a launch of `node SCRIPT ARGS`, keyed by the script and named as
    /// node's own exec will be, from `env`'s exec on.
    #[test]
    fn env_running_a_command_is_a_launch_of_that_command() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            through_env(
                "/usr/bin/env",
                &v(&["/usr/bin/env", "node", "/usr/bin/npm", "ls"])
            ),
            Some(v(&["node", "/usr/bin/npm", "ls"]))
        );
        assert_eq!(
            through_env("/usr/bin/env", &v(&["env", "LANG=C", "A=1", "app", "-x"])),
            Some(v(&["app", "-x"]))
        );
        // Options change what runs (`-i`, `-S`, `-u`): not told apart here.
        assert_eq!(through_env("/usr/bin/env", &v(&["env", "-i", "app"])), None);
        assert_eq!(
            through_env("/usr/bin/env", &v(&["env", "-S", "node x"])),
            None
        );
        // `env` alone, or with assignments only, prints the environment.
        assert_eq!(through_env("/usr/bin/env", &v(&["env"])), None);
        assert_eq!(through_env("/usr/bin/env", &v(&["env", "A=1"])), None);
        assert_eq!(through_env("/usr/bin/node", &v(&["node", "x.js"])), None);
        // Never quieted as a trivial program: its launches differ by what
        // it runs.
        assert!(QuietExe::of("/usr/bin/env", 1, 2, Some("/usr/bin/env")).is_none());
        assert!(QuietExe::of("/usr/bin/true", 1, 2, None).is_some());
    }

    #[test]
    fn a_launch_started_by_warmstart_is_left_to_it() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        let bin = p.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        // The daemon is the core; `run` is the front, beside it here as in
        // the build tree, or the core itself (a launch handed over).
        for b in ["warmstart", "warmstart-core", "sh"] {
            std::fs::write(bin.join(b), "").unwrap();
            std::fs::set_permissions(
                bin.join(b),
                std::os::unix::fs::PermissionsExt::from_mode(0o755),
            )
            .unwrap();
        }
        for (pid, ppid, exe, cmd) in [
            ("self", 0, "warmstart-core", "warmstart\0daemon\0"),
            ("7", 1, "warmstart", "warmstart\0-q\0run\0--\0app\0"),
            ("8", 1, "sh", "sh\0run\0"),
            ("9", 1, "warmstart", "warmstart\0bench\0run\0"),
            ("10", 1, "warmstart-core", "warmstart\0run\0--\0app\0"),
        ] {
            std::fs::create_dir_all(p.join(pid)).unwrap();
            std::fs::write(p.join(pid).join("cmdline"), cmd).unwrap();
            std::fs::write(
                p.join(pid).join("status"),
                format!("Name:\tx\nPPid:\t{ppid}\n"),
            )
            .unwrap();
            std::os::unix::fs::symlink(bin.join(exe), p.join(pid).join("exe")).unwrap();
        }
        for (pid, ppid) in [
            (42, 7),
            (43, 8),
            (44, 99),
            (50, 42),
            (51, 43),
            (52, 9),
            (53, 10),
        ] {
            std::fs::create_dir_all(p.join(pid.to_string())).unwrap();
            std::fs::write(p.join(format!("{pid}/status")), format!("PPid:\t{ppid}\n")).unwrap();
        }
        assert!(started_by_warmstart(p, 42), "a child of `warmstart run`");
        assert!(!started_by_warmstart(p, 43), "a child of a shell");
        assert!(!started_by_warmstart(p, 44), "a parent that is gone");
        assert!(!started_by_warmstart(p, 45), "a process that is gone");
        assert!(
            started_by_warmstart(p, 50),
            "a grandchild of `warmstart run`"
        );
        assert!(!started_by_warmstart(p, 51), "a grandchild of a shell");
        assert!(
            !started_by_warmstart(p, 52),
            "a launch of `warmstart bench`"
        );
        assert!(
            started_by_warmstart(p, 53),
            "a launch handed over to the core"
        );
    }

    #[test]
    fn a_launch_is_its_real_uid() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("42")).unwrap();
        std::fs::write(
            d.path().join("42/status"),
            "Name:\tsh\nUid:\t1000\t0\t0\t0\nGid:\t1000\t1000\t1000\t1000\n",
        )
        .unwrap();
        assert_eq!(launch_uid(d.path(), 42), Some(1000));
        assert_eq!(launch_uid(d.path(), 43), None);
        // SAFETY: getuid has no preconditions.
        let me = unsafe { libc::getuid() };
        assert_eq!(launch_uid(Path::new("/proc"), std::process::id()), Some(me));
    }

    fn v(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn scripts_are_told_from_their_exec() {
        // `./tool -v x` with `#!/usr/bin/python3 -u`.
        assert_eq!(
            script_prefix(
                "./tool",
                &v(&["tool", "-v", "x"]),
                &v(&["/usr/bin/python3", "-u", "./tool", "-v", "x"])
            ),
            Some(v(&["/usr/bin/python3", "-u"]))
        );
        // Without arguments, and without an interpreter option.
        assert_eq!(
            script_prefix("/opt/t", &v(&["t"]), &v(&["/bin/sh", "/opt/t"])),
            Some(v(&["/bin/sh"]))
        );
        // An ELF program: the exec's command line is the execve's.
        assert_eq!(
            script_prefix("/usr/bin/ls", &v(&["ls", "-l"]), &v(&["ls", "-l"])),
            None
        );
        // Arguments that differ, a script name not where it belongs.
        assert_eq!(
            script_prefix("./t", &v(&["t", "a"]), &v(&["/bin/sh", "./t", "b"])),
            None
        );
        assert_eq!(script_prefix("./t", &v(&["t"]), &v(&["./t"])), None);
        assert_eq!(script_prefix("./t", &[], &[]), None);
    }

    #[test]
    fn policy_table() {
        let mut c = DaemonConfig::default();
        let cases = [
            ("/usr/bin/gimp", true),
            ("/usr/sbin/sshd", false),
            ("/usr/lib/systemd/systemd-journald", false),
            ("/usr/local/bin/warmstart", false),
        ];
        for (p, want) in cases {
            assert_eq!(c.allows(p), want, "{p}");
        }
        c.learn = LearnMode::AllowList;
        c.allow = vec!["/opt/app/*".into()];
        assert!(c.allows("/opt/app/bin"));
        assert!(!c.allows("/usr/bin/gimp"));
    }

    #[test]
    fn permits_table() {
        let mut c = DaemonConfig {
            learn: LearnMode::AllowList,
            allow: v(&["/opt/app/*"]),
            ..Default::default()
        };
        c.deny.push("/opt/bad/*".into());
        let listed = BTreeSet::from(["/usr/bin/gimp".to_string(), "/opt/bad/x".to_string()]);
        let none = BTreeSet::new();
        // (key, continued, learn list, followed)
        let cases = [
            ("/opt/app/a", false, &none, true),
            ("/usr/bin/gimp", false, &none, false),
            ("/usr/bin/gimp", false, &listed, true),
            ("/usr/bin/gimp", true, &none, true),
            // A deny entry wins over the learn list and over a launch
            // continuing into it.
            ("/opt/bad/x", false, &listed, false),
            ("/opt/bad/x", true, &none, false),
            ("/usr/sbin/sshd", true, &listed, false),
        ];
        for (key, continued, learn, want) in cases {
            assert_eq!(c.permits(key, continued, learn), want, "{key} {continued}");
        }
    }

    #[test]
    fn trivial_launches_are_not_worth_learning() {
        let c = DaemonConfig::default();
        let stats = |ms: u64, kib: u64, meta_kib: u64| TraceStats {
            duration_ns: ms * 1_000_000,
            bytes: kib * 1024,
            metadata_bytes: meta_kib * 1024,
            ..Default::default()
        };
        // (what, duration ms, data KiB, metadata KiB, worth a profile), the
        // figures measured with `warmstart record` (see DEFAULT_MIN_LEARN_MS).
        let cases = [
            ("true, cold", 2, 1229, 0, false),
            ("ls /usr, warm", 15, 2150, 0, false),
            ("grep, cold", 3, 2765, 0, false),
            ("git --version", 3, 5530, 0, true),
            ("python3 -c pass", 533, 16998, 0, true),
            ("small but slow", 40, 100, 0, true),
            ("fast, metadata heavy", 5, 2048, 2048, true),
        ];
        for (what, ms, kib, meta, want) in cases {
            assert_eq!(c.worth_learning(&stats(ms, kib, meta)), want, "{what}");
        }
        let all = DaemonConfig {
            min_learn_ms: 0,
            ..Default::default()
        };
        assert!(all.worth_learning(&stats(0, 0, 0)), "0 learns everything");
    }

    #[test]
    fn trivial_launches_hold_back_their_program_or_their_inline_code() {
        // (exe, argv, policy key, held back)
        let cases = [
            (
                "/usr/bin/grep",
                v(&["grep", "x", "f"]),
                "/usr/bin/grep",
                "/usr/bin/grep",
            ),
            (
                "/usr/bin/dash",
                v(&["sh", "-c", "true"]),
                "/usr/bin/dash",
                "name",
            ),
            (
                "/usr/bin/python3.11",
                v(&["python3", "-c", "1"]),
                "/usr/bin/python3.11",
                "name",
            ),
            (
                "/usr/bin/python3.11",
                v(&["python3", "/opt/t.py"]),
                "/opt/t.py",
                "/opt/t.py",
            ),
        ];
        for (exe, argv, key, want) in cases {
            assert_eq!(trivial_key(exe, &argv, key, "name"), want, "{argv:?}");
        }
    }

    #[test]
    fn trivial_programs_are_held_for_a_while_and_bounded() {
        let mut t = Trivial::default();
        let now = Instant::now();
        t.mark("/usr/bin/true", None, now);
        assert!(t.holds("/usr/bin/true", now));
        assert!(!t.holds("/usr/bin/ls", now));
        assert!(!t.holds("/usr/bin/true", now + Trivial::HOLD));
        for i in 0..Trivial::MAX + 10 {
            t.mark(&format!("/bin/p{i}"), None, now);
        }
        assert!(t.len() <= Trivial::MAX);
    }

    #[test]
    fn only_programs_named_by_their_binary_are_quieted_in_the_kernel() {
        let q = QuietExe::of("/usr/bin/true", 7, 42, Some("/bin/true")).unwrap();
        assert_eq!(
            (q.dev, q.ino, q.name.as_deref()),
            (7, 42, Some("/bin/true"))
        );
        // A relative execve path names another file in another directory.
        assert_eq!(
            QuietExe::of("/usr/bin/true", 7, 42, Some("./true"))
                .unwrap()
                .name,
            None
        );
        // An interpreter's launches differ by what it runs.
        assert_eq!(QuietExe::of("/usr/bin/python3.13", 7, 43, None), None);
        assert_eq!(QuietExe::of("/usr/bin/dash", 7, 44, Some("/bin/sh")), None);
    }

    #[test]
    fn letting_one_program_go_requiets_the_others() {
        let mut t = Trivial::default();
        let now = Instant::now();
        let q = |ino| QuietExe::of("/usr/bin/x", 1, ino, None);
        t.mark("/usr/bin/true", q(1), now);
        t.mark("/usr/bin/ls", q(2), now);
        t.mark("/usr/bin/python3 -c pass", None, now);
        let (new, released) = t.take_quiet();
        assert_eq!(new.len(), 2);
        assert!(!released);
        assert_eq!(t.take_quiet(), (vec![], false), "told once");
        // Unknown keys change nothing.
        t.remove("/usr/bin/cat");
        assert_eq!(t.take_quiet(), (vec![], false));
        t.remove("/usr/bin/true");
        let (again, released) = t.take_quiet();
        assert!(released, "the kernel side forgets them all");
        assert_eq!(again, vec![(q(2).unwrap(), now + Trivial::HOLD)]);
        assert!(!t.holds("/usr/bin/true", now));
    }

    #[test]
    fn interpreters_are_keyed_by_script() {
        let d = tempfile::tempdir().unwrap();
        let script = d.path().join("app.py");
        std::fs::write(&script, "").unwrap();
        let argv = vec!["python3".into(), "-u".into(), script.display().to_string()];
        let canon = std::fs::canonicalize(&script)
            .unwrap()
            .display()
            .to_string();
        assert_eq!(
            policy_path("/usr/bin/python3.11", &argv, Path::new("/")),
            canon
        );
        assert_eq!(
            policy_path(
                "/usr/bin/gimp",
                &["gimp".into(), "x.png".into()],
                Path::new("/")
            ),
            "/usr/bin/gimp"
        );
        let inline = ["python3".into(), "-c".into(), "app.py".into()];
        assert_eq!(
            policy_path("/usr/bin/python3.11", &inline, d.path()),
            "/usr/bin/python3.11",
            "-c takes code, not a script"
        );
        assert_eq!(
            missing_script("/usr/bin/python3", &v(&["python3", "nope.py"]), d.path()),
            Some("nope.py".into())
        );
    }
}
