//! Automatic mode: `warmstart daemon` speeds up launches nobody wrapped.
//!
//! One recorder stays loaded with exec watching on: every exec on the
//! system is reported, and is already being traced when user space first
//! hears of it, so nothing a launch reads is lost. The daemon then decides
//! with the same launch manager as `warmstart run` (same profiles, same
//! plans): a program with a plan gets its replay started at once and the
//! launch is audited exactly (the recorder is loaded anyway); a program
//! still learning is recorded; anything else — denied by policy, a system
//! service, too small, warmstart itself — is untracked immediately.
//!
//! A crash of the daemon cannot affect the programs it watches: it never
//! stops, holds or signals them; it only reads their files.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use warmstart_bpf::Event;
use warmstart_plan::trace::{Backend, CacheState, EndReason, TraceMeta, TraceStats};
use warmstart_plan::Plan;
use warmstart_record::Aggregator;
use warmstart_replay::{monotonic_ns, Backend as _, Engine, RealBackend, Report};

use crate::manager::{
    add_trace, judge, load_plan, load_previous_plan, profile_name, relearn, Config, LaunchReport,
};
use crate::store::{self, Phase, Profile, Store};
use crate::Error;

/// `/etc/warmstart/config.toml`. Unknown keys are errors, so a typo is
/// reported instead of silently ignored.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct DaemonConfig {
    /// `all`: learn every program not denied; `allow-list`: only `allow`.
    pub learn: LearnMode,
    /// Globs of executables (or scripts, for interpreters) to learn.
    pub allow: Vec<String>,
    /// Globs never traced, whatever `allow` says.
    pub deny: Vec<String>,
    /// Skip processes in systemd's system.slice (services).
    pub skip_services: bool,
    /// Launches reading less than this are never prefetched.
    pub min_launch_kib: u64,
    pub max_concurrent_replays: usize,
    /// Threads per replay. Lookups and opens wait on the disk one by one,
    /// so replays are latency-bound and want more threads than cores.
    pub replay_workers: usize,
    /// Replay stops when MemAvailable would fall below this.
    pub memory_floor_mib: Option<u64>,
    /// `idle` or `be:0`..`be:7`.
    pub io_priority: Option<String>,
    /// CPUs the replays run on: `one` (the last CPU, leaving the others to
    /// the applications), `all`, or a list such as `0,2-3`.
    pub replay_cpus: String,
    /// Start a known program's replay when its execve begins, while the
    /// kernel is still loading it, rather than at its exec event.
    pub replay_at_execve: bool,
    pub state_dir: PathBuf,
    /// Profiles beyond this total size are evicted, least recently used first.
    pub store_max_mib: u64,
    /// A learning launch ends after this many seconds without I/O.
    pub idle_s: f64,
    /// ... or after this many seconds.
    pub timeout_s: f64,
    pub socket: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LearnMode {
    All,
    AllowList,
}

impl Default for DaemonConfig {
    fn default() -> Self {
        DaemonConfig {
            learn: LearnMode::All,
            allow: Vec::new(),
            deny: [
                "/usr/sbin/*",
                "/sbin/*",
                "/usr/lib/systemd/*",
                "/lib/systemd/*",
                "/usr/libexec/*",
                "*/warmstart",
            ]
            .map(String::from)
            .to_vec(),
            skip_services: true,
            min_launch_kib: 256,
            max_concurrent_replays: 4,
            replay_workers: 8,
            memory_floor_mib: None,
            io_priority: None,
            replay_cpus: "one".into(),
            replay_at_execve: true,
            state_dir: PathBuf::from("/var/lib/warmstart"),
            store_max_mib: 256,
            idle_s: 2.0,
            timeout_s: 30.0,
            socket: PathBuf::from("/run/warmstart.sock"),
        }
    }
}

impl DaemonConfig {
    /// Reads and validates a config file; a missing file means defaults.
    pub fn load(path: &Path) -> Result<DaemonConfig, String> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(DaemonConfig::default())
            }
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        let cfg: DaemonConfig =
            toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        cfg.validate()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), String> {
        for g in self.allow.iter().chain(&self.deny) {
            glob::Pattern::new(g).map_err(|e| format!("bad glob {g:?}: {e}"))?;
        }
        if self.learn == LearnMode::AllowList && self.allow.is_empty() {
            return Err("learn = \"allow-list\" with an empty allow list learns nothing".into());
        }
        if !(1..=64).contains(&self.replay_workers) {
            return Err("replay_workers must be between 1 and 64".into());
        }
        if self.max_concurrent_replays == 0 {
            return Err("max_concurrent_replays must be at least 1".into());
        }
        if let Some(p) = &self.io_priority {
            p.parse::<warmstart_replay::IoPriority>()
                .map_err(|e| format!("io_priority {p:?}: {e}"))?;
        }
        self.replay_cpus
            .parse::<warmstart_replay::ReplayCpus>()
            .map_err(|e| format!("replay_cpus: {e}"))?;
        if !(self.idle_s > 0.0 && self.timeout_s >= self.idle_s && self.timeout_s <= 1e6) {
            return Err("need 0 < idle_s <= timeout_s <= 1000000 (seconds)".into());
        }
        Ok(())
    }

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

    /// The first deny pattern matching `path`.
    pub fn denied_by(&self, path: &str) -> Option<&str> {
        self.deny
            .iter()
            .find(|g| glob::Pattern::new(g).is_ok_and(|p| p.matches(path)))
            .map(String::as_str)
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

/// The script an interpreter runs (and whether the interpreter is java,
/// whose "script" is a main class), if it runs one: not for `python3 -c
/// CODE`, `-m module`, `sh -c`, `perl -e`.
fn script_of<'a>(exe: &str, argv: &'a [String]) -> Option<(&'a str, bool)> {
    let base = Path::new(exe)
        .file_name()
        .map(|b| b.to_string_lossy().into_owned())
        .unwrap_or_default();
    // /bin/sh is dash on Debian: the executable the kernel reports is dash.
    let interpreter = [
        "python", "perl", "ruby", "node", "bash", "dash", "zsh", "sh", "java",
    ]
    .iter()
    .any(|i| {
        base == *i || base.starts_with(&format!("{i}3")) || base.starts_with(&format!("{i}."))
    });
    if !interpreter {
        return None;
    }
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

/// What `warmstart status` shows about the daemon.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct DaemonStatus {
    pub pid: u32,
    pub uptime_s: f64,
    /// Where the daemon keeps its profiles.
    pub state_dir: PathBuf,
    pub execs_seen: u64,
    /// Replays started when an execve began, before its exec event.
    #[serde(default)]
    pub replays_at_execve: u64,
    pub launches_learned: u64,
    pub launches_prefetched: u64,
    pub ignored: u64,
    pub active_sessions: usize,
    /// Exec to the replay's start, microseconds: p50, p90, max.
    pub exec_to_replay_us: [f64; 3],
    /// Exec to the replay starting work on the plan's first entry that is
    /// not skipped (opening its file), microseconds: p50, p90, max.
    pub exec_to_first_start_us: [f64; 3],
    /// Exec to the replay's first prefetch request issued (the first
    /// `fadvise` returned: its I/O is queued), microseconds: p50, p90, max.
    /// Negative when the replay started at the execve (`replay_at_execve`)
    /// and issued its first request before the exec event; exec to replay
    /// started is then 0.
    pub exec_to_first_request_us: [f64; 3],
    /// The daemon's reaction time: from the first moment it knew of the
    /// launch to the replay's first request issued, microseconds: p50,
    /// p90, max. That moment is the execve's entry for a replay started
    /// there (`replay_at_execve`), else the exec event; never negative.
    #[serde(default)]
    pub start_to_first_request_us: [f64; 3],
    pub events: u64,
    pub drops: u64,
    /// Profiles, and plans, held in memory so that a launch is decided
    /// without reading the state directory.
    pub profiles_in_memory: usize,
    pub plans_in_memory: usize,
    /// Programs added with `warmstart learn` (policy keys).
    pub learn_list: Vec<String>,
    /// Launches being recorded or prefetched right now.
    pub sessions: Vec<SessionStatus>,
    /// The configuration in effect (the file as last read, with the
    /// command line's `--state-dir` and `--socket`): what a reload changed.
    pub config: Option<DaemonConfig>,
}

/// One launch the daemon is following.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct SessionStatus {
    /// The launch's first process.
    pub pid: u32,
    pub profile: String,
    /// `learning` or `prefetching`.
    pub mode: String,
    /// Prefetch requests issued so far.
    pub requests: u64,
    /// The replay has issued its whole schedule (or there is none).
    pub replay_issued: bool,
    pub age_s: f64,
}

/// A request on the control socket: one JSON object, then end of input.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "kebab-case")]
pub enum Request {
    Status,
    /// Learn a program: put it on the learn list and send its profiles
    /// back to learning. `exe` is the resolved executable, `argv` the
    /// command as the user gives it, `cwd` where relative scripts are.
    Learn {
        exe: String,
        argv: Vec<String>,
        cwd: PathBuf,
    },
    /// Take a program off the learn list.
    Unlearn {
        exe: String,
        argv: Vec<String>,
        cwd: PathBuf,
    },
    /// Forget profiles (all of them with `all`).
    Forget {
        names: Vec<String>,
        all: bool,
    },
    /// Read these profiles again from the state directory (written by
    /// `warmstart import`); with `relearn`, first send the prefetching ones
    /// back to learning for that reason (`warmstart changed`).
    Refresh {
        names: Vec<String>,
        relearn: Option<String>,
    },
}

/// The daemon's answer to a [`Request`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "kebab-case")]
pub enum Reply {
    Status(Box<DaemonStatus>),
    Learned {
        /// The policy key: the executable, or the script for interpreters.
        key: String,
        /// Profiles sent back to learning.
        reset: Vec<String>,
        /// Launches recorded before the next plan.
        nrawseq: u32,
    },
    Unlearned {
        key: String,
        /// It was on the list.
        was_listed: bool,
        /// The configured policy still learns it.
        policy_allows: bool,
    },
    Forgot {
        forgotten: Vec<String>,
        missing: Vec<String>,
    },
    Refreshed {
        /// Profiles sent back to learning (with `relearn`).
        relearned: Vec<String>,
        missing: Vec<String>,
    },
    Error {
        message: String,
    },
}

/// Why a control request did not get an answer.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("no warmstart daemon is listening on {0}")]
    NotRunning(PathBuf),
    #[error("permission denied on {0}: the control socket is root-only")]
    PermissionDenied(PathBuf),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}: the daemon's answer is not understood ({1}); is it an older warmstart?")]
    Protocol(PathBuf, String),
}

/// Sends one request to a running daemon and returns its reply.
pub fn request(socket: &Path, req: &Request) -> Result<Reply, ControlError> {
    use std::io::{ErrorKind, Read};
    let io = |source: std::io::Error| match source.kind() {
        ErrorKind::NotFound | ErrorKind::ConnectionRefused => {
            ControlError::NotRunning(socket.to_path_buf())
        }
        ErrorKind::PermissionDenied => ControlError::PermissionDenied(socket.to_path_buf()),
        _ => ControlError::Io {
            path: socket.to_path_buf(),
            source,
        },
    };
    let mut conn = std::os::unix::net::UnixStream::connect(socket).map_err(io)?;
    // Forget and learn wait for a launch being written to its profile.
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(io)?;
    conn.write_all(&serde_json::to_vec(req).expect("serializes"))
        .map_err(io)?;
    conn.shutdown(std::net::Shutdown::Write).map_err(io)?;
    let mut buf = Vec::new();
    conn.read_to_end(&mut buf).map_err(io)?;
    serde_json::from_slice(&buf)
        .map_err(|e| ControlError::Protocol(socket.to_path_buf(), e.to_string()))
}

/// Asks a running daemon for its status.
pub fn query(socket: &Path) -> Option<DaemonStatus> {
    query_checked(socket).ok().flatten()
}

/// Like [`query`], but a daemon this user may not ask (the socket is
/// root-only) is an error rather than "no daemon".
pub fn query_checked(socket: &Path) -> Result<Option<DaemonStatus>, ControlError> {
    match request(socket, &Request::Status) {
        Ok(Reply::Status(s)) => Ok(Some(*s)),
        Err(e @ ControlError::PermissionDenied(_)) => Err(e),
        Ok(Reply::Error { message }) if message.contains("root-only") => {
            Err(ControlError::PermissionDenied(socket.to_path_buf()))
        }
        _ => Ok(None),
    }
}

enum Mode {
    Learning,
    Prefetching {
        /// Shared with the profile cache and the replay thread.
        plan: Arc<Plan>,
        replay: Option<std::thread::JoinHandle<Option<Report>>>,
        cancel: Arc<AtomicBool>,
        /// Requests issued so far, and when the first one was (monotonic
        /// ns; 0 until then).
        requests: Arc<AtomicU64>,
        first_request_ns: Arc<AtomicU64>,
        /// When work on the first entry started (monotonic ns).
        first_start_ns: Arc<AtomicU64>,
        /// When the daemon first knew of the launch (monotonic ns): the
        /// execve's entry for a replay started there, else the exec event.
        seen_ns: u64,
        /// Recorded in full for the audit; otherwise only its process
        /// tree is followed.
        audited: bool,
        /// A relearning profile's launch, prefetched with its previous
        /// plan: recorded in full, and its trace is a learning trace.
        relearn: bool,
    },
}

struct Session {
    name: String,
    argv: Vec<String>,
    agg: Aggregator,
    members: HashSet<u32>,
    mode: Mode,
    exec_ts_ns: u64,
    started: Instant,
    last_io: Instant,
}

/// What the control thread and the event loop share.
struct Shared {
    status: Mutex<DaemonStatus>,
    /// Policy keys added with `warmstart learn`; kept in `learn.json`.
    learn: Mutex<BTreeSet<String>>,
    /// Held while a profile is written. Maps the profiles forgotten or
    /// reset to when: a launch that began before is not written back, so
    /// a forgotten profile does not come back from a launch in progress.
    profiles: Mutex<HashMap<String, Instant>>,
    /// What the state directory says, kept in memory so that an exec is
    /// decided without file I/O. Written only with `profiles` held.
    cache: Cache,
}

/// A file's identity and version: `(inode, size, mtime, ctime)` in ns,
/// `None` if there is no file. A file renamed over it (every write of the
/// store) or rewritten in place changes it.
type FileStamp = Option<(u64, u64, i128, i128)>;

fn file_stamp(p: &Path) -> FileStamp {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(p).ok()?;
    let ns = |s: i64, n: i64| s as i128 * 1_000_000_000 + n as i128;
    Some((
        m.ino(),
        m.size(),
        ns(m.mtime(), m.mtime_nsec()),
        ns(m.ctime(), m.ctime_nsec()),
    ))
}

/// A profile's plan read from the store, with the stamp of the file it was
/// read from (taken before reading, so a later change is never missed).
fn load_plan_stamped(store: &Store, name: &str) -> Result<(Arc<Plan>, FileStamp), String> {
    let st = file_stamp(&store.plan_path(name));
    load_plan(store, name).map(|p| (Arc::new(p), st))
}

/// The same for a relearning profile's previous plan, if it has one.
fn load_previous_stamped(store: &Store, name: &str) -> Option<(Arc<Plan>, FileStamp)> {
    let st = file_stamp(&store.previous_plan_path(name));
    load_previous_plan(store, name).map(|p| (Arc::new(p), st))
}

/// The file a profile's plan in memory comes from, by phase.
fn plan_file(store: &Store, name: &str, phase: Phase) -> PathBuf {
    match phase {
        Phase::Learning => store.previous_plan_path(name),
        _ => store.plan_path(name),
    }
}

/// What the daemon knows of a profile on disk.
#[derive(Clone)]
struct Known {
    phase: Phase,
    /// `profile.json` as last read or written; `None`: read it again at
    /// the next check.
    profile: Option<FileStamp>,
    /// A prefetching profile's plan, or a relearning profile's previous
    /// plan, and the stamp of its file. `None` with `Prefetching`: not in
    /// memory, read it from the store; with `Learning`: there is none.
    plan: Option<(Arc<Plan>, FileStamp)>,
    /// The profile's audit schedule: whether the next launch is audited.
    audit_next: bool,
    launches_since_audit: u64,
}

impl Known {
    /// Whether the next prefetched launch is recorded in full and judged
    /// on its exact miss ratio: when the profile asks for it (its first
    /// prefetched launch, or after a miss) and every `nchk`-th launch.
    /// The others are followed as a process tree only, so the daemon
    /// spends no CPU on their pages.
    fn audit_due(&self, nchk: u64) -> bool {
        self.audit_next || self.launches_since_audit + 1 >= nchk
    }
}

/// Profiles' phases and plans, so that deciding a launch and starting its
/// replay need no file I/O: after a cache drop the state directory would
/// be read from a disk busy with the launch's own first reads.
///
/// The daemon updates an entry whenever it writes a profile (with
/// `Shared::profiles` held, before `profile.json` is replaced, so no launch
/// decided after the write sees the old state), and checks each entry
/// against the files after every exec of its program, once that launch's
/// replay has started: a change made behind the daemon's back (`warmstart
/// run` on the same state directory, a user deleting files) is seen by
/// the next launch at the latest.
#[derive(Default)]
struct Cache {
    /// Every profile of the store, loaded before the daemon serves (a name
    /// without an entry has no profile).
    map: Mutex<HashMap<String, Known>>,
    /// The backend every replay uses: it remembers devices' read-ahead
    /// sizes and a metadata device it may not open, so a launch's replay
    /// starts without asking sysfs and `/dev` again.
    backend: Arc<RealBackend>,
}

impl Cache {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Known>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, name: &str) -> Option<Known> {
        self.lock().get(name).cloned()
    }

    /// What the daemon is about to write for `prof`, with its plan if it
    /// is prefetching (its previous plan if it is relearning). Call with
    /// `profiles` held, before `profile.json` is replaced, then
    /// [`Cache::written`].
    fn put(&self, prof: &Profile, plan: Option<(Arc<Plan>, FileStamp)>) {
        let plan = plan.filter(|_| prof.phase != Phase::Ignored);
        self.lock().insert(
            prof.name.clone(),
            Known {
                phase: prof.phase,
                profile: None,
                plan,
                audit_next: prof.audit_next,
                launches_since_audit: prof.launches_since_audit,
            },
        );
    }

    /// The daemon wrote `name`'s `profile.json`: the next check need not
    /// read it again.
    fn written(&self, store: &Store, name: &str) {
        let st = file_stamp(&store.dir(name).join("profile.json"));
        if let Some(k) = self.lock().get_mut(name) {
            k.profile = Some(st);
        }
    }

    /// The profile is gone (forgotten, evicted).
    fn remove(&self, name: &str) {
        self.lock().remove(name);
    }

    /// Profiles and plans in memory.
    fn counts(&self) -> (usize, usize) {
        let m = self.lock();
        (m.len(), m.values().filter(|k| k.plan.is_some()).count())
    }
}

/// Work for the thread that checks the cache against the store.
enum Check {
    /// A launch of this profile was just decided from the cache; once its
    /// replay has issued a first request (or a little while has passed),
    /// compare the entry with the files.
    Profile {
        name: String,
        first_request_ns: Option<Arc<AtomicU64>>,
    },
}

/// The checking thread: one job at a time, each with `profiles` held, so
/// that it never overwrites what the daemon has just written.
/// Loads every profile of the store and its plan into the cache (at
/// startup, before the control socket exists).
fn load_cache(shared: &Shared, store: &Store, log: &mut dyn Write) {
    let t = Instant::now();
    let names: Vec<String> = std::fs::read_dir(store.root().join("profiles"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| store::valid_name(n))
                .collect()
        })
        .unwrap_or_default();
    for n in &names {
        let _held = shared.profiles.lock().unwrap_or_else(|e| e.into_inner());
        refresh(shared, store, n, log);
    }
    let (profiles, plans) = shared.cache.counts();
    let _ = writeln!(
        log,
        "warmstart daemon: {profiles} profiles and {plans} plans in memory ({:.0} ms)",
        t.elapsed().as_secs_f64() * 1e3
    );
}

fn check_cache(jobs: std::sync::mpsc::Receiver<Check>, shared: &Shared, store: &Store) {
    let mut log = std::io::stderr();
    for job in jobs {
        match job {
            Check::Profile {
                name,
                first_request_ns,
            } => {
                // Off the launch's critical path: its replay's first
                // request, not this check, gets the disk first.
                if let Some(first) = first_request_ns {
                    let until = Instant::now() + Duration::from_millis(20);
                    while first.load(Ordering::Relaxed) == 0 && Instant::now() < until {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                let _held = shared.profiles.lock().unwrap_or_else(|e| e.into_inner());
                refresh(shared, store, &name, &mut log);
            }
        }
    }
}

/// Brings `name`'s cache entry in line with the store (with `profiles`
/// held). A corrupt profile is started over and a plan that does not load
/// is reported and relearned, as when a launch finds them.
fn refresh(shared: &Shared, store: &Store, name: &str, log: &mut dyn Write) {
    let cache = &shared.cache;
    let mut prof_st = file_stamp(&store.dir(name).join("profile.json"));
    if prof_st.is_none() {
        cache.remove(name);
        return;
    }
    let old = cache.get(name);
    // The plan in memory is still the file's (a launch counted in
    // `profile.json` by `warmstart run` leaves it alone).
    let old_plan = old.as_ref().and_then(|k| {
        let plan_st = file_stamp(&plan_file(store, name, k.phase));
        k.plan.clone().filter(|(_, st)| *st == plan_st)
    });
    if let Some(k) = &old {
        let plan_ok = k.phase != Phase::Prefetching || old_plan.is_some();
        if k.profile == Some(prof_st) && plan_ok {
            return;
        }
    }
    let mut prof = match store.load(name) {
        Ok(Some(p)) => p,
        Ok(None) => {
            cache.remove(name);
            return;
        }
        // Rebuilt from its traces and plan, so that nothing it learned is
        // lost (as when a launch through `warmstart run` finds it).
        Err(Error::CorruptProfile { path, why }) => {
            cache.remove(name);
            match store.rebuild(name, &[], &why) {
                Ok(p) => {
                    let _ = writeln!(
                        log,
                        "warmstart daemon: {} did not parse ({why}); rebuilt {name} from its {} trace(s){}",
                        path.display(),
                        p.traces.len(),
                        if p.phase == Phase::Prefetching { " and its plan" } else { "" }
                    );
                    prof_st = file_stamp(&store.dir(name).join("profile.json"));
                    p
                }
                Err(e) => {
                    let _ = writeln!(
                        log,
                        "warmstart daemon: {} did not parse ({why}), and rebuilding it failed: {e}; {name} is not prefetched",
                        path.display()
                    );
                    return;
                }
            }
        }
        // Unreadable (permissions, I/O): left as it is, not prefetched.
        Err(e) => {
            let _ = writeln!(log, "warmstart daemon: {e}; {name} is not prefetched");
            cache.remove(name);
            return;
        }
    };
    let plan = match prof.phase {
        Phase::Prefetching => match old_plan.map_or_else(|| load_plan_stamped(store, name), Ok) {
            Ok(plan) => Some(plan),
            Err(why) => {
                let _ = writeln!(
                    log,
                    "warmstart daemon: {why}; ignoring it and relearning {name}"
                );
                let mut report = LaunchReport::new(name, prof.phase);
                prof.phase = Phase::Learning;
                cache.put(&prof, None);
                relearn(&mut prof, store, why, false, &mut report);
                let _ = store.save(&mut prof);
                cache.written(store, name);
                return;
            }
        },
        Phase::Learning => old_plan
            .filter(|_| old.as_ref().is_some_and(|k| k.phase == Phase::Learning))
            .or_else(|| load_previous_stamped(store, name)),
        Phase::Ignored => None,
    };
    cache.lock().insert(
        name.to_string(),
        Known {
            phase: prof.phase,
            profile: Some(prof_st),
            plan,
            audit_next: prof.audit_next,
            launches_since_audit: prof.launches_since_audit,
        },
    );
}

/// Runs until `stop` is set (SIGTERM/SIGINT in the binary).
pub fn run(dcfg: &DaemonConfig, stop: Arc<AtomicBool>, log: &mut dyn Write) -> Result<(), Error> {
    let store = Store::open(&dcfg.state_dir)?;
    // Plans reveal which files a user's programs touched: root only.
    let _ = std::fs::set_permissions(store.root(), std::fs::Permissions::from_mode(0o700));
    let mut cfg = Config {
        state_dir: dcfg.state_dir.clone(),
        ..Config::default()
    };
    cfg.compile.min_launch_bytes = dcfg.min_launch_kib * 1024;
    cfg.replay.memory_floor = dcfg.memory_floor_mib.map(|m| m << 20);
    cfg.replay.workers = dcfg.replay_workers.clamp(1, 64);
    cfg.replay.queue_depth = 2 * cfg.replay.workers;
    cfg.replay.io_priority = dcfg.io_priority.as_ref().and_then(|p| p.parse().ok());
    cfg.replay.cpus = dcfg.replay_cpus.parse().unwrap_or_default();
    if let Some(w) = warmstart_replay::unusable_cpus(&cfg.replay.cpus) {
        let _ = writeln!(log, "warmstart daemon: {w}");
    }

    // Two daemons would trace everything twice and fight over profiles:
    // one per state directory and one per socket, held until exit (a
    // status query alone let two daemons started together both run).
    let _state_lock = lock_exclusive(store.root(), true)?;
    let _socket_lock = lock_exclusive(&lock_path(&dcfg.socket), false)?;
    if let Some(other) = query(&dcfg.socket) {
        return Err(Error::io(
            &dcfg.socket,
            std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                format!("another warmstart daemon (pid {}) is running", other.pid),
            ),
        ));
    }
    let me = std::process::id();
    let mut status = DaemonStatus {
        pid: me,
        state_dir: store.root().to_path_buf(),
        config: Some(dcfg.clone()),
        ..Default::default()
    };
    // The control thread answers from this at once (a status of pid 0
    // means the daemon is stopping).
    let shared = Arc::new(Shared {
        status: Mutex::new(status.clone()),
        learn: Mutex::new(load_learn_list(&store, log)),
        profiles: Mutex::new(HashMap::new()),
        cache: Cache::default(),
    });
    // Ready before the control socket exists, since its appearing is what
    // callers (the bench, scripts, tests) wait for: with the socket bound
    // first, a launch right after it (caches dropped in between, as the
    // bench does) raced the daemon reading its own code back for `mlock`
    // and its profiles and plans from storage.
    lock_own_code(log);
    load_cache(&shared, &store, log);
    (status.profiles_in_memory, status.plans_in_memory) = shared.cache.counts();
    *shared.status.lock().unwrap_or_else(|e| e.into_inner()) = status.clone();
    // Execs are watched from here on, with the plans at hand: events of a
    // slow start-up (a cold cache at boot) are not left queued behind it.
    let rec = warmstart_bpf::Recorder::start(warmstart_bpf::Options {
        watch_exec: true,
        ..Default::default()
    })
    .map_err(warmstart_record::Error::from)?;
    let listener = bind_root_only(&dcfg.socket)?;
    let our_socket = socket_ino(&dcfg.socket);
    // Kept here, so that shutting the socket down at exit never hits a
    // descriptor the control thread has closed and the number reused.
    let wake = listener
        .try_clone()
        .map_err(|e| Error::io(&dcfg.socket, e))?;
    let (check, jobs) = std::sync::mpsc::channel();
    let checker = {
        let (shared, store) = (Arc::clone(&shared), store.clone());
        std::thread::Builder::new()
            .name("ws-cache".into())
            .spawn(move || check_cache(jobs, &shared, &store))
            .map_err(|e| Error::io(&dcfg.state_dir, e))?
    };
    let control = {
        let (shared, store, d, cfg) = (
            Arc::clone(&shared),
            store.clone(),
            dcfg.clone(),
            cfg.clone(),
        );
        std::thread::Builder::new()
            .name("ws-control".into())
            .spawn(move || serve(listener, &shared, &store, &d, &cfg))
            .map_err(|e| Error::io(&dcfg.socket, e))?
    };
    let _ = writeln!(
        log,
        "warmstart daemon: watching execs; state in {}, control socket {}",
        store.root().display(),
        dcfg.socket.display()
    );

    let started = Instant::now();
    let mut latencies: Vec<f64> = Vec::new();
    let mut first_requests: Vec<f64> = Vec::new();
    let mut reactions: Vec<f64> = Vec::new();
    let mut first_starts: Vec<f64> = Vec::new();
    let mut sessions: HashMap<u32, Session> = HashMap::new();
    let mut owner: HashMap<u32, u32> = HashMap::new();
    // Replays started at an execve's entry, until its exec event.
    let mut early: HashMap<u32, Early> = HashMap::new();
    // Execves that started no replay, until their exec event: it tells
    // whether the file was a script (see `script_prefix`).
    let mut pending: HashMap<u32, (String, Vec<String>, Instant)> = HashMap::new();
    let mut scripts = Scripts::default();
    let mut buf = Vec::new();
    let idle = Duration::from_secs_f64(dcfg.idle_s);
    let timeout = Duration::from_secs_f64(dcfg.timeout_s);

    let mut rt = Realtime::new(log);
    while !stop.load(Ordering::Relaxed) {
        // Wait for events as a real-time thread, so an exec is decided and
        // its replay started at once instead of after the launching
        // program's time slice (exec -> event seen: 0.13-0.33 ms instead
        // of 0.65-2.5 ms on a cold launch). The replay threads started
        // meanwhile inherit the priority until their first piece of work
        // (the engine then returns them to normal scheduling). The
        // rest of the batch (page events, sessions ending, their
        // compiling) is handled at normal priority.
        rt.set(true);
        // With no launch followed there are no page records to collect
        // (they come without a wake-up, for followed processes only):
        // sleep until an exec wakes the loop, instead of 50 times a second.
        let following = !sessions.is_empty() || !early.is_empty();
        let wait = if following {
            Duration::from_millis(20)
        } else {
            IDLE_POLL
        };
        rec.poll(wait, &mut buf)
            .map_err(warmstart_record::Error::from)?;
        status.events += buf.len() as u64;
        // Launches first: a replay must not wait behind a batch of page
        // events. An exec is a new launch unless its process was forked
        // inside a traced tree (in earlier batches or in this one).
        //
        // A launch is named by the last program its first process execs:
        // `sh script` that execs a program, `env python3 tool.py`, a
        // launcher script ending in `exec app`. Each exec is decided by
        // the command line its event carries, so a launcher allowed by its
        // path stays allowed through its exec even when the daemon only
        // wakes after it (the recorder ends a batch at each exec).
        let mut forked_here: HashSet<u32> = HashSet::new();
        let mut handled: HashSet<u32> = HashSet::new();
        for ev in &buf {
            match ev {
                Event::Fork {
                    parent_tgid,
                    child_tgid,
                    ..
                } if owner.contains_key(parent_tgid) || forked_here.contains(parent_tgid) => {
                    forked_here.insert(*child_tgid);
                }
                Event::ExecStart {
                    tgid,
                    ts_ns,
                    filename,
                    argv: Some(argv),
                } if dcfg.replay_at_execve => {
                    // A program started inside a launch is that launch's.
                    if *tgid == me || owner.contains_key(tgid) || forked_here.contains(tgid) {
                        continue;
                    }
                    // An earlier execve of it failed (execvp tries each
                    // directory of PATH): its replay is not needed.
                    if let Some(e) = early.remove(tgid) {
                        stop_replay(&e.mode);
                    }
                    rt.set(true);
                    let started = {
                        let learn = shared.learn.lock().unwrap_or_else(|e| e.into_inner());
                        let running = replaying(&sessions, early.len());
                        start_early(
                            *tgid,
                            *ts_ns,
                            filename,
                            argv,
                            dcfg,
                            &learn,
                            &cfg,
                            &shared.cache,
                            running,
                            &scripts,
                        )
                    };
                    if let Some(e) = started {
                        early.insert(*tgid, e);
                        status.replays_at_execve += 1;
                        // Let the replay thread, waiting on this CPU, run.
                        rt.set(false);
                    } else {
                        pending.insert(*tgid, (filename.clone(), argv.clone(), Instant::now()));
                    }
                }
                Event::Exec {
                    tgid,
                    ts_ns,
                    file,
                    argv,
                } => {
                    let in_tree = owner.contains_key(tgid) || forked_here.contains(tgid);
                    if in_tree && !sessions.contains_key(tgid) {
                        continue; // a program started inside a launch
                    }
                    let exe = file.path.absolute().unwrap_or_default();
                    // A script that is no longer run as it was (replaced by
                    // a program, a new interpreter): forgotten.
                    if let Some((script, expected)) =
                        early.get(tgid).and_then(|e| e.script.as_ref())
                    {
                        if argv.as_deref() != Some(expected.as_slice()) {
                            scripts.forget(script);
                        }
                    }
                    // A script run directly: its next execve can start the
                    // interpreter's replay (see `start_early`).
                    if let (Some((name, given, _)), Some(now)) =
                        (pending.remove(tgid), argv.as_deref())
                    {
                        if let Some(prefix) = script_prefix(&name, &given, now) {
                            scripts.remember(*tgid, &name, &exe, prefix);
                        }
                    }
                    if !in_tree && argv.is_none() && execed_again(*tgid, file) {
                        // No command line in the event, and /proc already
                        // shows the next program's: its exec names it.
                        continue;
                    }
                    handled.insert(*tgid);
                    status.execs_seen += 1;
                    // Real-time again if an earlier launch of this batch
                    // lowered it: each replay thread inherits it.
                    rt.set(true);
                    let mut started_early = early.remove(tgid);
                    let decided = {
                        let learn = shared.learn.lock().unwrap_or_else(|e| e.into_inner());
                        decide(
                            *tgid,
                            &exe,
                            argv.as_deref(),
                            &mut started_early,
                            *ts_ns,
                            dcfg,
                            &learn,
                            &cfg,
                            &store,
                            &shared.cache,
                            &check,
                            me,
                            &sessions,
                            early.len(),
                        )
                    };
                    // Not adopted: another program, or not followed after all.
                    if let Some(e) = started_early {
                        stop_replay(&e.mode);
                    }
                    let replay_started = matches!(&decided, Some((_, Some(_))));
                    if let Some((_, Some(l))) = &decided {
                        push_recent(&mut latencies, *l);
                    }
                    match (sessions.get_mut(tgid), decided) {
                        // The launch's first process exec'd again: it is
                        // now this program's launch (same process tree).
                        (Some(s), Some(((name, argv, mode), _))) => {
                            if s.name == name {
                                // The same program again: the launch's
                                // replay goes on; the one just started
                                // for it would run unwatched.
                                stop_replay(&mode);
                            } else {
                                stop_replay(&s.mode);
                                (s.name, s.argv, s.mode, s.exec_ts_ns) = (name, argv, mode, *ts_ns);
                                if !s.recorded() {
                                    for m in &s.members {
                                        let _ = rec.track_tree_only(*m);
                                    }
                                }
                            }
                        }
                        (Some(_), None) => {
                            let s = sessions.remove(tgid).expect("matched above");
                            stop_replay(&s.mode);
                            status.ignored += 1;
                            for m in &s.members {
                                owner.remove(m);
                                rec.untrack(*m);
                            }
                        }
                        (None, Some(((name, argv, mode), _))) => {
                            owner.insert(*tgid, *tgid);
                            // Tracked again explicitly: an earlier exec of
                            // this process that the policy refused may have
                            // untracked it after this exec had re-tracked it.
                            let _ = if mode.recorded() {
                                rec.track(*tgid)
                            } else {
                                rec.track_tree_only(*tgid)
                            };
                            if replay_started {
                                // Recorded in the kernel: the session's
                                // bookkeeping (reading the mount table)
                                // can wait behind the replay's start.
                                rt.set(false);
                            }
                            let s = new_session(*tgid, name, argv, mode, *ts_ns);
                            sessions.insert(*tgid, s);
                        }
                        (None, None) => {
                            status.ignored += 1;
                            // Not if it has exec'd again since: the kernel
                            // side tracks it anew for that exec (`env`, a
                            // launcher the policy does not name, running
                            // a program it does), which its own event decides.
                            if !execed_again(*tgid, file) {
                                rec.untrack(*tgid);
                            }
                        }
                    }
                    if replay_started {
                        // The launch is recorded: let its replay thread,
                        // waiting on this CPU, run now.
                        rt.set(false);
                    }
                }
                _ => {}
            }
        }
        // Nothing happened and nothing is followed: stay as we are (two
        // system calls a wake-up otherwise). Threads started from here on
        // must not inherit real-time priority, hence the switch whenever
        // there is work.
        if !buf.is_empty() || !sessions.is_empty() {
            rt.set(false);
        }
        pending.retain(|_, p| p.2.elapsed() < Duration::from_secs(1));
        // An execve that failed has no exec event: its replay stops.
        early.retain(|_, e| {
            let keep = e.at.elapsed() < Duration::from_secs(1);
            if !keep {
                stop_replay(&e.mode);
            }
            keep
        });
        for ev in buf.drain(..) {
            let tgid = ev.tgid();
            if matches!(ev, Event::Exec { .. })
                && handled.contains(&tgid)
                && !owner.contains_key(&tgid)
            {
                continue; // ignored by policy
            }
            let Some(&root) = owner.get(&tgid) else {
                continue;
            };
            let Some(s) = sessions.get_mut(&root) else {
                continue;
            };
            if let Event::Fork { child_tgid, .. } = ev {
                owner.insert(child_tgid, root);
                s.members.insert(child_tgid);
            }
            if s.agg.take(&mut vec![ev]) {
                s.last_io = Instant::now();
            }
        }
        // Finished sessions: the tree exited, went idle, or ran too long.
        let done: Vec<u32> = sessions
            .iter()
            .filter(|(_, s)| {
                // A launch followed as a tree only has no I/O to go idle
                // on: it ends once its replay has, and the idle time passed.
                let quiet = if s.recorded() {
                    s.last_io.elapsed() >= idle
                } else {
                    s.replay_done() && s.started.elapsed() >= idle
                };
                s.agg.tree_done() || quiet || s.started.elapsed() >= timeout
            })
            .map(|(r, _)| *r)
            .collect();
        for root in done {
            let s = sessions.remove(&root).expect("listed above");
            for m in &s.members {
                owner.remove(m);
                rec.untrack(*m);
            }
            if let Mode::Prefetching {
                first_request_ns,
                first_start_ns,
                seen_ns,
                ..
            } = &s.mode
            {
                status.launches_prefetched += 1;
                let first = first_request_ns.load(Ordering::Relaxed);
                if first > 0 {
                    push_recent(&mut first_requests, since(s.exec_ts_ns, first) / 1e3);
                    push_recent(&mut reactions, first.saturating_sub(*seen_ns) as f64 / 1e3);
                }
                let start = first_start_ns.load(Ordering::Relaxed);
                if start > 0 {
                    push_recent(&mut first_starts, since(s.exec_ts_ns, start) / 1e3);
                }
            } else {
                status.launches_learned += 1;
            }
            // Naming files, compiling and writing happen off the loop, so
            // the next exec is not kept waiting; one at a time, so two
            // launches of one program never race on its profile.
            let (store, cfg, drops, shared) =
                (store.clone(), cfg.clone(), rec.drops(), Arc::clone(&shared));
            let max = dcfg.store_max_mib << 20;
            std::thread::spawn(move || {
                let forgotten = shared.profiles.lock().unwrap_or_else(|e| e.into_inner());
                let mut err = std::io::stderr();
                if forgotten.get(&s.name).is_some_and(|t| *t > s.started) {
                    stop_replay(&s.mode);
                    let _ = writeln!(
                        err,
                        "warmstart daemon: {}: launch not kept (forgotten or reset while it ran)",
                        s.name
                    );
                } else if let Err(e) =
                    finish_session(s, &store, &shared.cache, &cfg, drops, &mut err)
                {
                    let _ = writeln!(err, "warmstart daemon: {e}");
                }
                evict_lru(&store, &shared.cache, max);
            });
        }
        status.uptime_s = started.elapsed().as_secs_f64();
        status.active_sessions = sessions.len();
        status.drops = rec.drops();
        status.exec_to_replay_us = percentiles(&latencies);
        status.exec_to_first_request_us = percentiles(&first_requests);
        status.start_to_first_request_us = percentiles(&reactions);
        status.exec_to_first_start_us = percentiles(&first_starts);
        (status.profiles_in_memory, status.plans_in_memory) = shared.cache.counts();
        status.sessions = sessions
            .iter()
            .map(|(pid, s)| session_status(*pid, s))
            .collect();
        *shared.status.lock().unwrap_or_else(|e| e.into_inner()) = status.clone();
    }
    // Wake the control thread from accept() so it sees the stop: by a
    // connection, and by shutting the listening socket down in case its
    // path was removed or taken meanwhile.
    shared.status.lock().unwrap_or_else(|e| e.into_inner()).pid = 0;
    let _ = std::os::unix::net::UnixStream::connect(&dcfg.socket);
    // SAFETY: shutdown on a descriptor this thread owns.
    unsafe { libc::shutdown(std::os::fd::AsRawFd::as_raw_fd(&wake), libc::SHUT_RDWR) };
    let _ = control.join();
    drop(check);
    let _ = checker.join();
    if socket_ino(&dcfg.socket) == our_socket {
        let _ = std::fs::remove_file(&dcfg.socket);
    }
    Ok(())
}

/// How long the event loop sleeps when it follows no launch: execs (and
/// the signals that stop it) wake it at once; this bounds how stale
/// `status` can be (uptime, drops, the counts of profiles and plans in
/// memory) and how long a stop request set just before the wait waits.
const IDLE_POLL: Duration = Duration::from_secs(1);

/// Locks the daemon's own executable in memory. Code the daemon has not
/// run yet (deciding a launch, a replay) is otherwise read from storage
/// when the first launch needs it, behind that launch's own reads: a
/// freshly started daemon's first request came 7-23 ms after the exec
/// instead of 0.5-1.5 ms (cold `npm` launches, 23 November 2026), and a
/// long-running one loses the same way when memory pressure evicts code
/// it rarely runs. The binary is a few MiB; without the privilege
/// (`CAP_IPC_LOCK` or a large enough `RLIMIT_MEMLOCK`) it says so once.
fn lock_own_code(log: &mut dyn Write) {
    let Ok(exe) = std::fs::read_link("/proc/self/exe") else {
        return;
    };
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return;
    };
    let mut locked = 0usize;
    let mut failed = None;
    for line in maps.lines() {
        // start-end perms offset dev inode path
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 6 || Path::new(fields[5]) != exe {
            continue;
        }
        let Some((start, end)) = fields[0].split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (
            usize::from_str_radix(start, 16),
            usize::from_str_radix(end, 16),
        ) else {
            continue;
        };
        // SAFETY: the range is one of this process's own mappings; mlock
        // reads nothing through the pointer, it pins the pages.
        if unsafe { libc::mlock(start as *const libc::c_void, end - start) } == 0 {
            locked += end - start;
        } else {
            failed = Some(std::io::Error::last_os_error());
        }
    }
    match failed {
        Some(e) => {
            let _ = writeln!(
                log,
                "warmstart daemon: cannot lock its code in memory ({e}); the first launches after a start or under memory pressure wait for it"
            );
        }
        None if locked > 0 => {
            let _ = writeln!(
                log,
                "warmstart daemon: its code ({:.1} MiB) is locked in memory",
                locked as f64 / (1 << 20) as f64
            );
        }
        None => {}
    }
}

/// Switches the calling thread between SCHED_FIFO (lowest priority) and
/// normal scheduling. Without CAP_SYS_NICE (a container) it says so once
/// and stays normal.
struct Realtime {
    on: bool,
    failed: bool,
}

impl Realtime {
    fn new(log: &mut dyn Write) -> Self {
        let mut rt = Realtime {
            on: false,
            failed: false,
        };
        rt.set(true);
        if rt.failed {
            let _ = writeln!(
                log,
                "warmstart daemon: cannot wait for execs at real-time priority ({}); replays start after the launching program's time slice",
                std::io::Error::last_os_error()
            );
        }
        rt
    }

    fn set(&mut self, on: bool) {
        if self.failed || self.on == on {
            return;
        }
        let (policy, priority) = if on {
            (libc::SCHED_FIFO, 1)
        } else {
            (libc::SCHED_OTHER, 0)
        };
        let param = libc::sched_param {
            sched_priority: priority,
        };
        // SAFETY: pid 0 is the calling thread; param is a valid sched_param.
        if unsafe { libc::sched_setscheduler(0, policy, &param) } == 0 {
            self.on = on;
        } else {
            self.failed = true;
        }
    }
}

/// Normal scheduling again when `run` returns: after a reload (SIGHUP)
/// the next `run` starts its threads from this one, and they would
/// inherit real-time priority for good.
impl Drop for Realtime {
    fn drop(&mut self) {
        self.set(false);
    }
}

/// Whether `tgid` runs another program than the exec event reports: it
/// has exec'd again since (its next exec event follows).
fn execed_again(tgid: u32, file: &warmstart_bpf::FileInfo) -> bool {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata(format!("/proc/{tgid}/exe")) {
        Ok(m) => {
            m.ino() != file.ino
                || m.dev() != warmstart_record::resolve::kdev_to_user(file.dev as u64)
        }
        Err(_) => false,
    }
}

fn session_status(pid: u32, s: &Session) -> SessionStatus {
    let (mode, requests, replay_issued) = match &s.mode {
        Mode::Learning => ("learning", 0, true),
        Mode::Prefetching {
            replay,
            requests,
            relearn,
            ..
        } => (
            if *relearn {
                "relearning"
            } else {
                "prefetching"
            },
            requests.load(Ordering::Relaxed),
            replay.as_ref().is_none_or(|h| h.is_finished()),
        ),
    };
    SessionStatus {
        pid,
        profile: s.name.clone(),
        mode: mode.into(),
        requests,
        replay_issued,
        age_s: s.started.elapsed().as_secs_f64(),
    }
}

fn stop_replay(mode: &Mode) {
    if let Mode::Prefetching { cancel, .. } = mode {
        cancel.store(true, Ordering::Relaxed);
    }
}

/// Binds the control socket so that only root can connect: created under
/// a umask that leaves no access to others (no window with looser
/// permissions), and checked again on each connection.
/// `SOCKET.lock`, beside the socket.
fn lock_path(socket: &Path) -> PathBuf {
    let mut name = socket.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// Takes an exclusive `flock` on `path`, or says another daemon holds it:
/// the state directory itself (`dir`: nothing is created, so a read-only
/// one still serves its plans), or a lock file, created if missing and
/// never through a symlink. The lock goes with the returned file.
fn lock_exclusive(path: &Path, dir: bool) -> Result<std::fs::File, Error> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let mut o = std::fs::OpenOptions::new();
    if dir {
        o.read(true).custom_flags(libc::O_DIRECTORY);
    } else {
        o.create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW);
    }
    let f = o.open(path).map_err(|e| Error::io(path, e))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(Error::io(
            path,
            std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                "another warmstart daemon holds this lock",
            ),
        ));
    }
    Ok(f)
}

/// The inode of the socket file, to remove it at exit only if it is still
/// ours.
fn socket_ino(socket: &Path) -> Option<u64> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    std::fs::symlink_metadata(socket)
        .ok()
        .filter(|m| m.file_type().is_socket())
        .map(|m| m.ino())
}

fn bind_root_only(socket: &Path) -> Result<std::os::unix::net::UnixListener, Error> {
    use std::os::unix::fs::FileTypeExt;
    // A stale socket (a daemon killed) is replaced; anything else at that
    // path is somebody's file.
    match std::fs::symlink_metadata(socket) {
        Ok(m) if m.file_type().is_socket() => {
            let _ = std::fs::remove_file(socket);
        }
        Ok(_) => {
            return Err(Error::io(
                socket,
                std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    "exists and is not a socket; choose another path",
                ),
            ))
        }
        Err(_) => {}
    }
    // SAFETY: umask has no preconditions; the old mask is put back below.
    let old = unsafe { libc::umask(0o177) };
    let bound = std::os::unix::net::UnixListener::bind(socket);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let listener = bound.map_err(|e| Error::io(socket, e))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| Error::io(socket, e))?;
    Ok(listener)
}

fn peer_uid(conn: &std::os::unix::net::UnixStream) -> Option<u32> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED writes a ucred of at most `len` bytes into `cred`.
    let r = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(cred.uid)
}

/// The control thread: one request per connection, answered in turn.
/// Requests never touch the event loop's state directly, so a slow client
/// cannot delay a launch's replay.
fn serve(
    listener: std::os::unix::net::UnixListener,
    shared: &Shared,
    store: &Store,
    dcfg: &DaemonConfig,
    cfg: &Config,
) {
    use std::io::Read;
    for conn in listener.incoming() {
        if shared.status.lock().unwrap_or_else(|e| e.into_inner()).pid == 0 {
            return; // stopping
        }
        let Ok(mut conn) = conn else { continue };
        let _ = conn.set_read_timeout(Some(Duration::from_secs(1)));
        let _ = conn.set_write_timeout(Some(Duration::from_secs(1)));
        let reply = if peer_uid(&conn) != Some(0) {
            Reply::Error {
                message: "the control socket is root-only".into(),
            }
        } else {
            let mut buf = Vec::new();
            let _ = (&mut conn).take(1 << 20).read_to_end(&mut buf);
            match serde_json::from_slice::<Request>(&buf) {
                Ok(req) => handle(req, shared, store, dcfg, cfg),
                Err(e) => Reply::Error {
                    message: format!("bad request: {e}"),
                },
            }
        };
        let _ = conn.write_all(&serde_json::to_vec(&reply).expect("serializes"));
    }
}

fn handle(
    req: Request,
    shared: &Shared,
    store: &Store,
    dcfg: &DaemonConfig,
    cfg: &Config,
) -> Reply {
    match req {
        Request::Status => {
            let mut status = shared
                .status
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            // As it is now, not as the event loop last saw it.
            status.learn_list = shared
                .learn
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .cloned()
                .collect();
            Reply::Status(Box::new(status))
        }
        Request::Learn { exe, argv, cwd } => {
            if argv.is_empty() {
                return Reply::Error {
                    message: "no program given".into(),
                };
            }
            let key = policy_path(&exe, &argv, &cwd);
            if let Some(glob) = dcfg.denied_by(&key) {
                return Reply::Error {
                    message: format!(
                        "{key} matches the deny pattern {glob:?} of the daemon's policy, which \
                         `warmstart learn` does not override: remove it from `deny` in the \
                         config file and restart the daemon"
                    ),
                };
            }
            let mut list = shared.learn.lock().unwrap_or_else(|e| e.into_inner());
            let added = list.insert(key.clone());
            if let Err(e) = save_learn_list(store, &list) {
                // Refused: the list in memory stays what is on disk.
                if added {
                    list.remove(&key);
                }
                return Reply::Error {
                    message: e.to_string(),
                };
            }
            drop(list);
            // The profiles of this program, by the command they were
            // learned from, and the one this exact command line gets.
            let exact = profile_name(&argv);
            let mut reset = Vec::new();
            let mut profiles = shared.profiles.lock().unwrap_or_else(|e| e.into_inner());
            for mut p in store.list().unwrap_or_default().into_iter().flatten() {
                let mine = p.name == exact
                    || p.command.first().is_some_and(|c| {
                        policy_path(&crate::manager::resolve_exe(c), &p.command, Path::new("/"))
                            == key
                    });
                if !mine {
                    continue;
                }
                let mut report = LaunchReport::new(&p.name, p.phase);
                p.phase = Phase::Learning;
                shared.cache.put(&p, None);
                relearn(
                    &mut p,
                    store,
                    "asked for with `warmstart learn`".into(),
                    false,
                    &mut report,
                );
                p.audit_next = false;
                if store.save(&mut p).is_ok() {
                    shared.cache.written(store, &p.name);
                    profiles.insert(p.name.clone(), Instant::now());
                    reset.push(p.name);
                }
            }
            Reply::Learned {
                key,
                reset,
                nrawseq: cfg.nrawseq,
            }
        }
        Request::Unlearn { exe, argv, cwd } => {
            if argv.is_empty() {
                return Reply::Error {
                    message: "no program given".into(),
                };
            }
            let key = policy_path(&exe, &argv, &cwd);
            let mut list = shared.learn.lock().unwrap_or_else(|e| e.into_inner());
            let was_listed = list.remove(&key);
            if let Err(e) = save_learn_list(store, &list) {
                if was_listed {
                    list.insert(key.clone());
                }
                return Reply::Error {
                    message: e.to_string(),
                };
            }
            Reply::Unlearned {
                policy_allows: dcfg.allows(&key),
                key,
                was_listed,
            }
        }
        Request::Forget { names, all } => {
            let mut profiles = shared.profiles.lock().unwrap_or_else(|e| e.into_inner());
            let names = if all {
                store.names().unwrap_or_default()
            } else {
                names
            };
            let (mut forgotten, mut missing) = (Vec::new(), Vec::new());
            for n in names {
                if !crate::store::valid_name(&n) {
                    missing.push(n);
                    continue;
                }
                profiles.insert(n.clone(), Instant::now());
                shared.cache.remove(&n);
                match store.forget(&n) {
                    Ok(true) => forgotten.push(n),
                    Ok(false) => missing.push(n),
                    Err(e) => {
                        return Reply::Error {
                            message: e.to_string(),
                        }
                    }
                }
            }
            Reply::Forgot { forgotten, missing }
        }
        Request::Refresh { names, relearn } => {
            let mut profiles = shared.profiles.lock().unwrap_or_else(|e| e.into_inner());
            let (mut relearned, mut missing) = (Vec::new(), Vec::new());
            let mut log = std::io::stderr();
            for n in names {
                if !crate::store::valid_name(&n) || !store.dir(&n).join("profile.json").exists() {
                    missing.push(n);
                    continue;
                }
                if let Some(why) = &relearn {
                    match crate::manager::mark_relearn(store, &n, why) {
                        Ok(true) => {
                            profiles.insert(n.clone(), Instant::now());
                            relearned.push(n.clone());
                        }
                        Ok(false) => {}
                        Err(e) => {
                            return Reply::Error {
                                message: e.to_string(),
                            }
                        }
                    }
                }
                refresh(shared, store, &n, &mut log);
            }
            Reply::Refreshed { relearned, missing }
        }
    }
}

fn learn_list_path(store: &Store) -> PathBuf {
    store.root().join("learn.json")
}

fn load_learn_list(store: &Store, log: &mut dyn Write) -> BTreeSet<String> {
    let p = learn_list_path(store);
    match std::fs::read(&p) {
        Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
            let _ = writeln!(
                log,
                "warmstart daemon: {}: {e}; starting with an empty learn list",
                p.display()
            );
            BTreeSet::new()
        }),
        Err(_) => BTreeSet::new(),
    }
}

fn save_learn_list(store: &Store, list: &BTreeSet<String>) -> Result<(), Error> {
    let json = serde_json::to_vec_pretty(list).expect("serializes");
    store::write_atomic(&learn_list_path(store), &json)
}

/// A launch's profile name, command and mode.
type Decision = (String, Vec<String>, Mode);

/// Decides what a launch is: its profile name, command and mode, and the
/// exec-to-replay latency if a replay was started. `None`: leave it alone.
/// `early_others` replays are running for other launches, started at their
/// execve and not decided yet: they count against the replay limit.
#[allow(clippy::too_many_arguments)]
fn decide(
    tgid: u32,
    exe: &str,
    argv: Option<&[String]>,
    early: &mut Option<Early>,
    exec_ts_ns: u64,
    dcfg: &DaemonConfig,
    learn: &BTreeSet<String>,
    cfg: &Config,
    store: &Store,
    cache: &Cache,
    check: &std::sync::mpsc::Sender<Check>,
    me: u32,
    sessions: &HashMap<u32, Session>,
    early_others: usize,
) -> Option<(Decision, Option<f64>)> {
    if tgid == me || exe.is_empty() {
        return None;
    }
    let argv = match argv {
        Some(a) => a.to_vec(),
        None => read_cmdline(tgid)?,
    };
    let (argv, key) = launch_key(tgid, exe, &argv)?;
    // A launch allowed when it started stays allowed when its first process
    // execs the program it launches (`soffice`, a shell script, execs
    // `oosplash`): the user allowed the command they run. Only a deny-list
    // entry for the program it ends in stops it.
    let continued = sessions.contains_key(&tgid);
    if !dcfg.permits(&key, continued, learn) || (dcfg.skip_services && is_service(tgid)) {
        return None;
    }
    let name = profile_name(&argv);
    // From memory: the cache holds every profile (a name it lacks has
    // none), and repairs are left to the checker.
    let known = cache.get(&name);
    let audit = known.as_ref().is_none_or(|k| k.audit_due(cfg.nchk));
    let (phase, plan) = match known {
        Some(k) => (k.phase, k.plan.map(|(p, _)| p)),
        None => (Phase::Learning, None),
    };
    let plan = match (phase, plan) {
        (Phase::Prefetching, None) => match load_plan(store, &name) {
            Ok(p) => Some(Arc::new(p)),
            // Reported and relearned by the checker, which reads it too.
            Err(_) => None,
        },
        // A relearning profile's previous plan is in the cache, if any.
        (_, plan) => plan,
    };
    let relearn = phase == Phase::Learning;
    let mut first_request = None;
    let decided = match (phase, plan) {
        (Phase::Ignored, _) => None,
        (Phase::Prefetching | Phase::Learning, Some(plan)) => {
            let audited = audit || relearn;
            let (m, adopted) = match early.take() {
                // Started when the execve began, for this profile and plan.
                Some(e) if e.name == name && e.plan_is(&plan) => {
                    let mut m = e.mode;
                    if let Mode::Prefetching {
                        audited: a,
                        relearn: r,
                        ..
                    } = &mut m
                    {
                        (*a, *r) = (audited, relearn);
                    }
                    (m, true)
                }
                other => {
                    if let Some(e) = other {
                        stop_replay(&e.mode);
                    }
                    // Replays started at other launches' execve count too.
                    let start = replaying(sessions, early_others) < dcfg.max_concurrent_replays;
                    (
                        start_prefetch(plan, cfg, cache, start, audited, relearn, exec_ts_ns),
                        false,
                    )
                }
            };
            let latency = match &m {
                Mode::Prefetching {
                    replay: Some(_),
                    first_request_ns,
                    ..
                } => {
                    first_request = Some(Arc::clone(first_request_ns));
                    Some(if adopted {
                        0.0
                    } else {
                        monotonic_ns().saturating_sub(exec_ts_ns) as f64 / 1e3
                    })
                }
                _ => None,
            };
            Some(((name.clone(), argv, m), latency))
        }
        _ => Some(((name.clone(), argv, Mode::Learning), None)),
    };
    // The replay is on its way: now compare what was used with the store.
    let _ = check.send(Check::Profile {
        name,
        first_request_ns: first_request,
    });
    decided
}

/// Nanoseconds from `from` to `to` (monotonic), negative if `to` came first
/// (a replay started at the execve, before its exec event).
fn since(from: u64, to: u64) -> f64 {
    to as f64 - from as f64
}

/// How many launches have a replay running: sessions', and `early` more.
fn replaying(sessions: &HashMap<u32, Session>, early: usize) -> usize {
    early
        + sessions
            .values()
            .filter(|s| {
                matches!(
                    s.mode,
                    Mode::Prefetching {
                        replay: Some(_),
                        ..
                    }
                )
            })
            .count()
}

/// A prefetching mode for `plan`, its replay started on a new thread if
/// `start` (no thread, no replay: the launch runs unprefetched).
fn start_prefetch(
    plan: Arc<Plan>,
    cfg: &Config,
    cache: &Cache,
    start: bool,
    audited: bool,
    relearn: bool,
    seen_ns: u64,
) -> Mode {
    let cancel = Arc::new(AtomicBool::new(false));
    let requests = Arc::new(AtomicU64::new(0));
    let first_request_ns = Arc::new(AtomicU64::new(0));
    let first_start_ns = Arc::new(AtomicU64::new(0));
    let replay = if start {
        let plan = Arc::clone(&plan);
        let opts = cfg.replay.clone();
        let (flag, requests, first, started) = (
            Arc::clone(&cancel),
            Arc::clone(&requests),
            Arc::clone(&first_request_ns),
            Arc::clone(&first_start_ns),
        );
        let backend = Arc::clone(&cache.backend);
        // Started on this thread's CPU: see `spawn_here`.
        spawn_here(&cache.backend, move |cpus| {
            if let Some(cpus) = cpus {
                let _ = backend.set_thread_cpus(&cpus);
            }
            replay(&backend, &plan, opts, flag, requests, (first, started))
        })
        .ok()
    } else {
        None
    };
    Mode::Prefetching {
        plan,
        replay,
        cancel,
        requests,
        first_request_ns,
        first_start_ns,
        seen_ns,
        audited,
        relearn,
    }
}

/// A replay started when an execve began, before the kernel had loaded
/// the program (10-25 ms on a cold cache here): the profile it is for and
/// its prefetching mode. The exec event adopts it, or it is stopped.
struct Early {
    name: String,
    mode: Mode,
    at: Instant,
    /// Started for a script known from earlier launches: its resolved path
    /// and the command line its exec was expected to have.
    script: Option<(PathBuf, Vec<String>)>,
}

impl Early {
    fn plan_is(&self, plan: &Arc<Plan>) -> bool {
        matches!(&self.mode, Mode::Prefetching { plan: p, .. } if Arc::ptr_eq(p, plan))
    }
}

/// Starts the replay of the program an execve is about to run, if the
/// policy allows it and the daemon holds its prefetching profile's plan in
/// memory (nothing is read from the state directory here). The path and
/// arguments are the execve's own, which for a binary are what its exec
/// event will carry; a script gets its interpreter's profile only at its
/// exec event.
#[allow(clippy::too_many_arguments)]
fn start_early(
    tgid: u32,
    execve_ns: u64,
    filename: &str,
    argv: &[String],
    dcfg: &DaemonConfig,
    learn: &BTreeSet<String>,
    cfg: &Config,
    cache: &Cache,
    running: usize,
    scripts: &Scripts,
) -> Option<Early> {
    if running >= dcfg.max_concurrent_replays {
        return None;
    }
    let cwd = std::fs::read_link(format!("/proc/{tgid}/cwd")).ok()?;
    let exe = std::fs::canonicalize(cwd.join(filename)).ok()?;
    // A script seen before: the kernel will run its interpreter with the
    // command line it ran it with then.
    let (exe, argv, script) = match scripts.get(&exe) {
        Some((interpreter, prefix)) => {
            let mut a = prefix.clone();
            a.push(filename.to_string());
            a.extend(argv.iter().skip(1).cloned());
            (interpreter.clone(), a.clone(), Some((exe, a)))
        }
        None => (exe.to_str()?.to_string(), argv.to_vec(), None),
    };
    let (argv, key) = launch_key(tgid, &exe, &argv)?;
    if !dcfg.permits(&key, false, learn) || (dcfg.skip_services && is_service(tgid)) {
        return None;
    }
    let name = profile_name(&argv);
    let known = cache.get(&name)?;
    if known.phase != Phase::Prefetching {
        return None;
    }
    let (plan, _) = known.plan?;
    let mode = start_prefetch(plan, cfg, cache, true, false, false, execve_ns);
    matches!(
        mode,
        Mode::Prefetching {
            replay: Some(_),
            ..
        }
    )
    .then(|| Early {
        name,
        mode,
        at: Instant::now(),
        script,
    })
}

/// Starts `f` on a new thread on the calling thread's CPU when the caller
/// is a real-time thread, passing it the CPUs it may move back to (`None`
/// if it was not pinned).
///
/// The daemon waits for execs at real-time priority, so the replay thread
/// it starts inherits SCHED_FIFO. Left to the kernel, a new real-time
/// thread goes to the CPU whose current task has the lowest priority,
/// which is usually the CPU running the program just exec'd; this kernel
/// does not preempt that program while it is in the kernel (loading the
/// binary, faulting in ld.so) and an idle CPU does not pull a lone waiting
/// real-time thread, so the replay sat there for 1-2 ms of a cold `npm`
/// launch (traced on the project's VM, 23 November 2026) while the other
/// CPU idled. Here it starts behind the daemon's thread, which lowers its
/// priority as soon as the launch is recorded.
fn spawn_here<T: Send + 'static>(
    backend: &RealBackend,
    f: impl FnOnce(Option<Vec<usize>>) -> T + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<T>> {
    // SAFETY: neither call takes a pointer; both only read.
    let (policy, here) = unsafe { (libc::sched_getscheduler(0), libc::sched_getcpu()) };
    // A normal thread goes to an idle CPU by itself.
    let realtime = policy == libc::SCHED_FIFO || policy == libc::SCHED_RR;
    let allowed = backend.thread_cpus().ok();
    let pinned = match (&allowed, usize::try_from(here)) {
        (Some(all), Ok(cpu)) if realtime && all.len() > 1 && all.contains(&cpu) => {
            backend.set_thread_cpus(&[cpu]).is_ok()
        }
        _ => false,
    };
    let back = allowed.clone().filter(|_| pinned);
    let spawned = std::thread::Builder::new().spawn(move || f(back));
    if pinned {
        if let Some(all) = &allowed {
            let _ = backend.set_thread_cpus(all);
        }
    }
    spawned
}

/// One launch's replay, run on the thread the daemon started for it: stops
/// when `cancel` is set; the engine counts its requests into `requests`
/// and stamps when work on the first entry started and when the first
/// request was issued.
fn replay(
    backend: &RealBackend,
    plan: &Plan,
    opts: warmstart_replay::Options,
    cancel: Arc<AtomicBool>,
    requests: Arc<AtomicU64>,
    (first_request_ns, first_start_ns): (Arc<AtomicU64>, Arc<AtomicU64>),
) -> Option<Report> {
    Engine::new(backend, opts)
        .ok()?
        .share_cancel(cancel)
        .share_progress(requests, first_start_ns, first_request_ns)
        .run(plan)
        .ok()
}

impl Mode {
    /// Whether the launch's pages are recorded (learning, or an audited
    /// prefetched launch).
    fn recorded(&self) -> bool {
        !matches!(self, Mode::Prefetching { audited: false, .. })
    }
}

impl Session {
    /// Whether the launch's pages are being recorded (learning, or an
    /// audited prefetched launch).
    fn recorded(&self) -> bool {
        self.mode.recorded()
    }

    /// Whether its replay, if any, has ended.
    fn replay_done(&self) -> bool {
        match &self.mode {
            Mode::Prefetching { replay, .. } => replay.as_ref().is_none_or(|h| h.is_finished()),
            Mode::Learning => true,
        }
    }
}

fn new_session(tgid: u32, name: String, argv: Vec<String>, mode: Mode, exec_ts_ns: u64) -> Session {
    Session {
        name,
        argv,
        agg: Aggregator::new(Path::new("/"), tgid).already_execed(),
        members: HashSet::from([tgid]),
        mode,
        exec_ts_ns,
        started: Instant::now(),
        last_io: Instant::now(),
    }
}

/// Builds the launch's trace and updates its profile (and the cache:
/// called with `Shared::profiles` held).
fn finish_session(
    s: Session,
    store: &Store,
    cache: &Cache,
    cfg: &Config,
    drops: u64,
    log: &mut dyn Write,
) -> Result<(), Error> {
    let meta = TraceMeta {
        command: s.argv.clone(),
        cwd: "/".into(),
        backend: Backend::Bpf,
        cache: CacheState::AsFound,
        end: if s.agg.tree_done() {
            EndReason::Exited
        } else {
            EndReason::Idle
        },
        exit_code: None,
        started_unix_ms: store::now_ms().saturating_sub(s.started.elapsed().as_millis() as u64),
        hostname: String::new(),
    };
    let stats = TraceStats {
        drops,
        duration_ns: s.started.elapsed().as_nanos() as u64,
        ..Default::default()
    };
    let trace = s.agg.finish(meta, stats);
    let mut prof = store
        .load(&s.name)?
        .unwrap_or_else(|| Profile::new(&s.name, &s.argv));
    prof.launches += 1;
    let mut report = LaunchReport::new(&s.name, prof.phase);
    let mut first_request = None;
    match s.mode {
        Mode::Learning => {
            add_trace(&trace, store, &mut prof, cfg, &mut report)?;
            // A new plan's first launch is audited.
            if prof.phase == Phase::Prefetching {
                prof.audit_next = true;
            }
        }
        Mode::Prefetching {
            plan,
            replay,
            cancel,
            first_request_ns,
            audited,
            relearn,
            ..
        } => {
            cancel.store(true, Ordering::Relaxed);
            let rep = replay.and_then(|h| h.join().ok().flatten());
            let first = first_request_ns.load(Ordering::Relaxed);
            first_request = (first > 0).then(|| since(s.exec_ts_ns, first) / 1e6);
            if relearn {
                report.replay = rep;
                add_trace(&trace, store, &mut prof, cfg, &mut report)?;
                if prof.phase == Phase::Prefetching {
                    prof.audit_next = true;
                }
            } else if audited {
                let _ =
                    store::write_atomic(&store.dir(&s.name).join("last-audit"), &trace.to_bytes());
                judge(&mut prof, store, &plan, Some(trace), rep, cfg, &mut report);
            } else {
                // Followed as a tree only: the replay's stale files still
                // decide; the miss ratio is the last audit's (every nchk-th
                // launch is audited again: `Known::audit_due`).
                let last = prof.last_miss_ratio;
                judge(&mut prof, store, &plan, None, rep, cfg, &mut report);
                prof.last_miss_ratio = last;
            }
        }
    }
    report.phase_after = prof.phase;
    // Still prefetching: the plan in memory, if it is still the file's (the
    // checker sees to that); a new plan is read back once (from the page
    // cache: it was just written).
    let plan = if prof.phase == Phase::Prefetching {
        cache
            .get(&s.name)
            .and_then(|k| k.plan)
            .filter(|_| report.compiled.is_none())
            .or_else(|| load_plan_stamped(store, &s.name).ok())
    } else if prof.phase == Phase::Learning {
        load_previous_stamped(store, &s.name)
    } else {
        None
    };
    // The report first: whoever sees the launch counted in the profile
    // finds this launch's report.
    let json = serde_json::to_vec_pretty(&report).expect("serializes");
    let _ = std::fs::create_dir_all(store.dir(&s.name));
    let _ = store::write_atomic(&store.dir(&s.name).join("last-launch.json"), &json);
    cache.put(&prof, plan);
    store.save(&mut prof)?;
    cache.written(store, &s.name);
    let _ = writeln!(
        log,
        "warmstart daemon: {} {:?} -> {:?}{}{}",
        s.name,
        report.phase_before,
        report.phase_after,
        report
            .miss_ratio
            .map(|m| format!(", miss ratio {m:.3}"))
            .unwrap_or_default(),
        first_request
            .map(|ms| {
                if ms < 0.0 {
                    format!(", first prefetch request {:.2} ms before exec", -ms)
                } else {
                    format!(", first prefetch request {ms:.2} ms after exec")
                }
            })
            .unwrap_or_default()
    );
    Ok(())
}

/// Keeps the store under `max` bytes by forgetting the least recently used
/// profiles.
fn evict_lru(store: &Store, cache: &Cache, max: u64) {
    let mut sizes: BTreeMap<u64, (String, u64)> = BTreeMap::new();
    let mut total = 0;
    for p in store.list().unwrap_or_default().into_iter().flatten() {
        let size: u64 = std::fs::read_dir(store.dir(&p.name))
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0);
        total += size;
        sizes.insert(p.updated_unix_ms, (p.name, size));
    }
    for (_, (name, size)) in sizes {
        if total <= max {
            break;
        }
        cache.remove(&name);
        let _ = store.forget(&name);
        total -= size;
    }
}

/// If an execve of `filename` with `given` arguments became an exec of a
/// program with the arguments `now`, as the kernel runs a script (`#!`):
/// the interpreter and its option, before the script as given to execve,
/// then the script's own arguments. Returns what comes before the script.
fn script_prefix(filename: &str, given: &[String], now: &[String]) -> Option<Vec<String>> {
    let rest = given.get(1..).unwrap_or_default();
    let at = now.len().checked_sub(rest.len() + 1)?;
    (at >= 1 && now[at] == filename && now[at + 1..] == *rest).then(|| now[..at].to_vec())
}

/// Scripts run directly, by their resolved path: the interpreter's resolved
/// path and the arguments before the script. Learned at their exec events
/// (the execve names the script, the exec its interpreter), so that their
/// next execve can start the replay the interpreter's exec would.
#[derive(Default)]
struct Scripts(HashMap<PathBuf, (String, Vec<String>)>);

impl Scripts {
    /// Bounds the memory a machine running many scripts can take.
    const MAX: usize = 1024;

    fn remember(&mut self, tgid: u32, filename: &str, interpreter: &str, prefix: Vec<String>) {
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

    fn get(&self, script: &Path) -> Option<&(String, Vec<String>)> {
        self.0.get(script)
    }

    fn forget(&mut self, script: &Path) {
        self.0.remove(script);
    }
}

/// How many of the latest launches the status percentiles cover. They are
/// recomputed (copied and sorted) on every pass of the event loop, so they
/// must not grow with the daemon's uptime: 100,000 launches would cost
/// milliseconds every 20 ms.
const RECENT_LAUNCHES: usize = 4096;

/// Appends `x`, dropping the oldest beyond [`RECENT_LAUNCHES`].
fn push_recent(v: &mut Vec<f64>, x: f64) {
    if v.len() >= RECENT_LAUNCHES {
        v.drain(..=v.len() - RECENT_LAUNCHES);
    }
    v.push(x);
}

fn percentiles(v: &[f64]) -> [f64; 3] {
    if v.is_empty() {
        return [0.0; 3];
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let at = |q: f64| s[((s.len() - 1) as f64 * q).round() as usize];
    [at(0.5), at(0.9), s[s.len() - 1]]
}

/// A launch's command line with a relative program made absolute (in the
/// process's working directory), and its policy key ([`policy_path`]).
fn launch_key(tgid: u32, exe: &str, argv: &[String]) -> Option<(Vec<String>, String)> {
    let mut argv = argv.to_vec();
    if argv.is_empty() {
        return None;
    }
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

fn read_cmdline(pid: u32) -> Option<Vec<String>> {
    warmstart_bpf::split_cmdline(&std::fs::read(format!("/proc/{pid}/cmdline")).ok()?)
}

fn is_service(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .is_ok_and(|c| c.contains("/system.slice/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_are_told_from_their_exec() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
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
    fn status_percentiles_cover_the_latest_launches() {
        let mut v = Vec::new();
        for i in 0..RECENT_LAUNCHES + 10 {
            push_recent(&mut v, i as f64);
        }
        assert_eq!(v.len(), RECENT_LAUNCHES);
        assert_eq!(v[0], 10.0);
        assert_eq!(percentiles(&v)[2], (RECENT_LAUNCHES + 9) as f64);
    }

    #[test]
    fn a_new_plan_and_every_nchk_th_launch_are_audited() {
        let known = |audit_next, launches_since_audit| Known {
            phase: Phase::Prefetching,
            profile: None,
            plan: None,
            audit_next,
            launches_since_audit,
        };
        for (next, since, due) in [
            (true, 0, true),
            (false, 0, false),
            (false, 8, false),
            (false, 9, true),
            (false, 12, true),
        ] {
            assert_eq!(known(next, since).audit_due(10), due, "{next} {since}");
        }
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
    fn config_validation() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("c.toml");
        assert!(
            DaemonConfig::load(&d.path().join("none.toml")).is_ok(),
            "missing file: defaults"
        );
        let cases = [
            ("learn = \"all\"\ndeny = [\"/x/*\"]\n", None),
            ("lern = \"all\"\n", Some("unknown field")),
            ("learn = \"allow-list\"\n", Some("empty allow list")),
            ("allow = [\"[\"]\n", Some("bad glob")),
            ("max_concurrent_replays = 0\n", Some("at least 1")),
            ("io_priority = \"fast\"\n", Some("io_priority")),
            ("replay_cpus = \"1,3-4\"\n", None),
            ("replay_cpus = \"two\"\n", Some("replay_cpus")),
        ];
        for (text, want) in cases {
            std::fs::write(&p, text).unwrap();
            match (DaemonConfig::load(&p), want) {
                (Ok(_), None) => {}
                (Err(e), Some(w)) => assert!(e.contains(w), "{text}: {e}"),
                (r, w) => panic!("{text}: got {r:?}, wanted {w:?}"),
            }
        }
    }

    #[test]
    fn the_shipped_config_is_valid() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dist/config.toml");
        let c = DaemonConfig::load(&p).unwrap();
        assert_eq!(c.learn, LearnMode::All);
        assert!(!c.allows("/usr/sbin/cron"));
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
        assert_eq!(percentiles(&[3.0, 1.0, 2.0]), [2.0, 3.0, 3.0]);
    }
}
