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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use warmstart_bpf::Event;
use warmstart_plan::trace::{Backend, CacheState, EndReason, TraceMeta, TraceStats};
use warmstart_plan::Plan;
use warmstart_record::Aggregator;
use warmstart_replay::{Engine, RealBackend, Report};

use crate::manager::{add_trace, judge, load_plan, profile_name, relearn, Config, LaunchReport};
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
        if !(self.idle_s > 0.0 && self.timeout_s >= self.idle_s) {
            return Err("need 0 < idle_s <= timeout_s".into());
        }
        Ok(())
    }

    /// Whether a launch whose key path is `path` may be traced.
    pub fn allows(&self, path: &str) -> bool {
        let m = |g: &String| glob::Pattern::new(g).is_ok_and(|p| p.matches(path));
        if self.deny.iter().any(m) {
            return false;
        }
        match self.learn {
            LearnMode::All => true,
            LearnMode::AllowList => self.allow.iter().any(m),
        }
    }
}

/// The path that names a launch for policy: the script or main class for
/// interpreters (`python3 app.py` is `app.py`, not python3), else the binary.
pub fn policy_path(exe: &str, argv: &[String]) -> String {
    let base = Path::new(exe)
        .file_name()
        .map(|b| b.to_string_lossy().into_owned())
        .unwrap_or_default();
    let interpreter = ["python", "perl", "ruby", "node", "bash", "sh", "java"]
        .iter()
        .any(|i| {
            base == *i || base.starts_with(&format!("{i}3")) || base.starts_with(&format!("{i}."))
        });
    if interpreter {
        if let Some(script) = argv.iter().skip(1).find(|a| !a.starts_with('-')) {
            if let Ok(p) = std::fs::canonicalize(script) {
                return p.display().to_string();
            }
            if base == "java" {
                return script.clone();
            }
        }
    }
    exe.to_string()
}

/// What `warmstart status` shows about the daemon.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DaemonStatus {
    pub pid: u32,
    pub uptime_s: f64,
    pub execs_seen: u64,
    pub launches_learned: u64,
    pub launches_prefetched: u64,
    pub ignored: u64,
    pub active_sessions: usize,
    /// Exec to the replay's start, microseconds: p50, p90, max.
    pub exec_to_replay_us: [f64; 3],
    pub events: u64,
    pub drops: u64,
}

enum Mode {
    Learning,
    Prefetching {
        plan: Box<Plan>,
        replay: Option<std::thread::JoinHandle<Option<Report>>>,
        cancel: Arc<AtomicBool>,
    },
}

struct Session {
    name: String,
    argv: Vec<String>,
    agg: Aggregator,
    members: HashSet<u32>,
    mode: Mode,
    started: Instant,
    last_io: Instant,
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

    let rec = warmstart_bpf::Recorder::start(warmstart_bpf::Options {
        watch_exec: true,
        ..Default::default()
    })
    .map_err(warmstart_record::Error::from)?;
    let me = std::process::id();
    let _ = std::fs::remove_file(&dcfg.socket);
    let listener = std::os::unix::net::UnixListener::bind(&dcfg.socket)
        .map_err(|e| Error::io(&dcfg.socket, e))?;
    let _ = std::fs::set_permissions(&dcfg.socket, std::fs::Permissions::from_mode(0o600));
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::io(&dcfg.socket, e))?;
    let _ = writeln!(
        log,
        "warmstart daemon: watching execs; state in {}, control socket {}",
        store.root().display(),
        dcfg.socket.display()
    );

    let started = Instant::now();
    let mut status = DaemonStatus {
        pid: me,
        ..Default::default()
    };
    let mut latencies: Vec<f64> = Vec::new();
    let mut sessions: HashMap<u32, Session> = HashMap::new();
    let mut owner: HashMap<u32, u32> = HashMap::new();
    let mut buf = Vec::new();
    let finishing = Arc::new(std::sync::Mutex::new(()));
    let idle = Duration::from_secs_f64(dcfg.idle_s);
    let timeout = Duration::from_secs_f64(dcfg.timeout_s);

    while !stop.load(Ordering::Relaxed) {
        rec.poll(Duration::from_millis(20), &mut buf)
            .map_err(warmstart_record::Error::from)?;
        status.events += buf.len() as u64;
        // Launches first: a replay must not wait behind a batch of page
        // events. An exec is a new launch unless its process was forked
        // inside a traced tree (in earlier batches or in this one).
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
                Event::Exec { tgid, ts_ns, file }
                    if !owner.contains_key(tgid) && !forked_here.contains(tgid) =>
                {
                    handled.insert(*tgid);
                    status.execs_seen += 1;
                    let exe = file.path.absolute().unwrap_or_default();
                    match start_session(*tgid, &exe, *ts_ns, dcfg, &cfg, &store, me, &sessions, log)
                    {
                        Some((s, lat)) => {
                            if let Some(l) = lat {
                                latencies.push(l);
                            }
                            owner.insert(*tgid, *tgid);
                            sessions.insert(*tgid, s);
                        }
                        None => {
                            status.ignored += 1;
                            rec.untrack(*tgid);
                        }
                    }
                }
                _ => {}
            }
        }
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
                s.agg.tree_done() || s.last_io.elapsed() >= idle || s.started.elapsed() >= timeout
            })
            .map(|(r, _)| *r)
            .collect();
        for root in done {
            let s = sessions.remove(&root).expect("listed above");
            for m in &s.members {
                owner.remove(m);
                rec.untrack(*m);
            }
            if matches!(s.mode, Mode::Prefetching { .. }) {
                status.launches_prefetched += 1;
            } else {
                status.launches_learned += 1;
            }
            // Naming files, compiling and writing happen off the loop, so
            // the next exec is not kept waiting; one at a time, so two
            // launches of one program never race on its profile.
            let (store, cfg, drops, lock) = (
                store.clone(),
                cfg.clone(),
                rec.drops(),
                Arc::clone(&finishing),
            );
            let max = dcfg.store_max_mib << 20;
            std::thread::spawn(move || {
                let _one = lock.lock();
                let mut err = std::io::stderr();
                if let Err(e) = finish_session(s, &store, &cfg, drops, &mut err) {
                    let _ = writeln!(err, "warmstart daemon: {e}");
                }
                evict_lru(&store, max);
            });
        }
        status.uptime_s = started.elapsed().as_secs_f64();
        status.active_sessions = sessions.len();
        status.drops = rec.drops();
        status.exec_to_replay_us = percentiles(&latencies);
        serve(&listener, &status);
    }
    let _ = std::fs::remove_file(&dcfg.socket);
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn start_session(
    tgid: u32,
    exe: &str,
    exec_ts_ns: u64,
    dcfg: &DaemonConfig,
    cfg: &Config,
    store: &Store,
    me: u32,
    sessions: &HashMap<u32, Session>,
    log: &mut dyn Write,
) -> Option<(Session, Option<f64>)> {
    if tgid == me || exe.is_empty() {
        return None;
    }
    let argv = read_cmdline(tgid)?;
    if !dcfg.allows(&policy_path(exe, &argv)) || (dcfg.skip_services && is_service(tgid)) {
        return None;
    }
    let name = profile_name(&argv);
    let prof = match store.load(&name) {
        Ok(p) => p.unwrap_or_else(|| Profile::new(&name, &argv)),
        Err(e) => {
            let _ = writeln!(log, "warmstart daemon: {e}; starting the profile over");
            let _ = store.forget(&name);
            Profile::new(&name, &argv)
        }
    };
    let mode = match prof.phase {
        Phase::Ignored => return None,
        Phase::Learning => Mode::Learning,
        Phase::Prefetching => match load_plan(store, &name) {
            Ok(plan) => {
                let replaying = sessions
                    .values()
                    .filter(|s| matches!(s.mode, Mode::Prefetching { .. }))
                    .count();
                let cancel = Arc::new(AtomicBool::new(false));
                let plan = Box::new(plan);
                let replay = (replaying < dcfg.max_concurrent_replays).then(|| {
                    let plan = plan.clone();
                    let opts = cfg.replay.clone();
                    let flag = Arc::clone(&cancel);
                    std::thread::spawn(move || {
                        let backend = RealBackend::new();
                        let engine = Engine::new(&backend, opts).ok()?;
                        let inner = engine.cancel_flag();
                        std::thread::scope(|s| {
                            let h = s.spawn(|| engine.run(&plan).ok());
                            while !h.is_finished() {
                                if flag.load(Ordering::Relaxed) {
                                    inner.store(true, Ordering::Relaxed);
                                }
                                std::thread::sleep(Duration::from_millis(2));
                            }
                            h.join().ok().flatten()
                        })
                    })
                });
                let latency = replay
                    .as_ref()
                    .map(|_| (monotonic_ns().saturating_sub(exec_ts_ns)) as f64 / 1e3);
                let m = Mode::Prefetching {
                    plan,
                    replay,
                    cancel,
                };
                return Some((new_session(tgid, name, argv, m), latency));
            }
            Err(why) => {
                let _ = writeln!(
                    log,
                    "warmstart daemon: {why}; ignoring it and relearning {name}"
                );
                let mut prof = prof;
                let mut report = LaunchReport::new(&name, prof.phase);
                relearn(&mut prof, store, why, &mut report);
                let _ = store.save(&mut prof);
                Mode::Learning
            }
        },
    };
    Some((new_session(tgid, name, argv, mode), None))
}

fn new_session(tgid: u32, name: String, argv: Vec<String>, mode: Mode) -> Session {
    Session {
        name,
        argv,
        agg: Aggregator::new(Path::new("/"), tgid).already_execed(),
        members: HashSet::from([tgid]),
        mode,
        started: Instant::now(),
        last_io: Instant::now(),
    }
}

/// Builds the launch's trace and updates its profile.
fn finish_session(
    s: Session,
    store: &Store,
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
    match s.mode {
        Mode::Learning => {
            add_trace(&trace, store, &mut prof, cfg, &mut report)?;
        }
        Mode::Prefetching {
            plan,
            replay,
            cancel,
        } => {
            cancel.store(true, Ordering::Relaxed);
            let rep = replay.and_then(|h| h.join().ok().flatten());
            let _ = store::write_atomic(&store.dir(&s.name).join("last-audit"), &trace.to_bytes());
            judge(&mut prof, store, &plan, Some(trace), rep, cfg, &mut report);
        }
    }
    report.phase_after = prof.phase;
    store.save(&mut prof)?;
    let json = serde_json::to_vec_pretty(&report).expect("serializes");
    let _ = store::write_atomic(&store.dir(&s.name).join("last-launch.json"), &json);
    let _ = writeln!(
        log,
        "warmstart daemon: {} {:?} -> {:?}{}",
        s.name,
        report.phase_before,
        report.phase_after,
        report
            .miss_ratio
            .map(|m| format!(", miss ratio {m:.3}"))
            .unwrap_or_default()
    );
    Ok(())
}

/// Keeps the store under `max` bytes by forgetting the least recently used
/// profiles.
fn evict_lru(store: &Store, max: u64) {
    let mut sizes: BTreeMap<u64, (String, u64)> = BTreeMap::new();
    let mut total = 0;
    for p in store.list().into_iter().flatten() {
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
        let _ = store.forget(&name);
        total -= size;
    }
}

fn serve(listener: &std::os::unix::net::UnixListener, status: &DaemonStatus) {
    while let Ok((mut conn, _)) = listener.accept() {
        let _ = conn.set_nonblocking(false);
        let _ = conn.set_write_timeout(Some(Duration::from_millis(200)));
        let _ = conn.write_all(&serde_json::to_vec(status).expect("serializes"));
    }
}

/// Asks a running daemon for its status.
pub fn query(socket: &Path) -> Option<DaemonStatus> {
    use std::io::Read;
    let mut conn = std::os::unix::net::UnixStream::connect(socket).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    let mut buf = Vec::new();
    conn.read_to_end(&mut buf).ok()?;
    serde_json::from_slice(&buf).ok()
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

fn read_cmdline(pid: u32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let v: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    (!v.is_empty()).then_some(v)
}

fn is_service(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .is_ok_and(|c| c.contains("/system.slice/"))
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(policy_path("/usr/bin/python3.11", &argv), canon);
        assert_eq!(
            policy_path("/usr/bin/gimp", &["gimp".into(), "x.png".into()]),
            "/usr/bin/gimp"
        );
        assert_eq!(percentiles(&[3.0, 1.0, 2.0]), [2.0, 3.0, 3.0]);
    }
}
