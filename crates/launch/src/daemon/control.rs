//! The control socket: `warmstart status`, `learn`, `unlearn` and `forget`
//! talk to a running daemon through it. Root only (the socket is 0600 and
//! each peer's uid is checked), one small JSON request per connection,
//! answered in turn by one thread that never touches the event loop.

use std::collections::BTreeSet;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::config::DaemonConfig;
use super::policy::policy_path;
use super::Shared;
use crate::manager::{profile_name, relearn, Config, LaunchReport};
use crate::store::{self, Phase, Store};
use crate::Error;

/// What `warmstart status` shows about the daemon.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct DaemonStatus {
    pub pid: u32,
    pub uptime_s: f64,
    /// The running kernel, as the recorder sees it (`Kernel::describe`).
    #[serde(default)]
    pub kernel: String,
    /// Why the daemon runs without its recorder (it then learns nothing
    /// and sees no launch, and serves the boot plan and preloading), or
    /// `None` when the recorder runs.
    #[serde(default)]
    pub recorder_problem: Option<String>,
    /// What the recorder left out on this kernel, and why (a hook it
    /// lacks, fentry refused): the fidelity it runs at.
    #[serde(default)]
    pub recorder_reduced: Vec<String>,
    /// How the recorder sees pages used from the cache: `tracepoints`,
    /// `fentry`, or `none` (it learns only what is read from storage).
    #[serde(default)]
    pub page_uses: String,
    /// Where the daemon keeps its profiles.
    pub state_dir: PathBuf,
    pub execs_seen: u64,
    /// Execs the kernel side left alone: programs found trivial, run
    /// outside any followed launch (see `trivial_programs`).
    #[serde(default)]
    pub execs_quieted: u64,
    /// Replays started when an execve began, before its exec event.
    #[serde(default)]
    pub replays_at_execve: u64,
    pub launches_learned: u64,
    pub launches_prefetched: u64,
    /// Of those, launches whose plan was in the page cache already, and
    /// that were therefore not replayed.
    #[serde(default)]
    pub launches_cached: u64,
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
    /// What those plans take in memory, decoded (bounded by
    /// `plan_memory_mib`).
    #[serde(default)]
    pub plan_memory_bytes: u64,
    /// Plans left on disk because the memory for plans was full: read at
    /// each launch instead.
    #[serde(default)]
    pub plans_not_in_memory: usize,
    /// Programs whose launches were too short and small to learn, left
    /// alone for a while (`min_learn_ms`, `min_learn_kib`).
    #[serde(default)]
    pub trivial_programs: usize,
    /// Finished launches waiting to be learned, and those dropped because
    /// too many were waiting (`learn_workers`).
    #[serde(default)]
    pub learn_queue: usize,
    #[serde(default)]
    pub learn_dropped: u64,
    /// Programs added with `warmstart learn` (policy keys).
    pub learn_list: Vec<String>,
    /// Launches being recorded or prefetched right now.
    pub sessions: Vec<SessionStatus>,
    /// The configuration in effect (the file as last read, with the
    /// command line's `--state-dir` and `--socket`): what a reload changed.
    pub config: Option<DaemonConfig>,
    /// Startup plans, predictions and idle preloads.
    pub foresight: ForesightStatus,
}

/// What the daemon does before launches: startup windows, predictions,
/// idle preloads.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ForesightStatus {
    /// `boot` or `login` while a startup window is open.
    pub startup_window: Option<String>,
    pub startups_recorded: u64,
    /// Startup plans replayed.
    pub startup_replays: u64,
    /// Events in the launch history.
    pub history_events: usize,
    /// Why the preloader is (not) preloading: `idle`, `preloading`,
    /// `launch_in_progress`, `disk_busy`, `memory_pressure`, `low_memory`,
    /// `over_budget`, `disabled`.
    pub preload_state: String,
    pub preloads: u64,
    /// Of those, reads of programs preloaded before and evicted since.
    pub rereads: u64,
    pub bytes_preloaded: u64,
    pub bytes_used: u64,
    /// Bytes preloaded that a launch used / bytes preloaded, over finished
    /// preloads; `None` before the first.
    pub precision: Option<f64>,
    pub preloads_used: u64,
    pub preloads_unused: u64,
    /// Memory held by preloads whose launch has not come.
    pub held_bytes: u64,
    pub budget_bytes: u64,
    /// The programs ranked likely to start soon, best first.
    pub predictions: Vec<PredictionStatus>,
}

/// One of the current predictions.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct PredictionStatus {
    pub profile: String,
    /// The chance that it is the next launch (times its preloads' feedback).
    pub score: f64,
    /// The chance that it starts before the next boot, within the
    /// predictor's horizon: preloaded only if at least `min_chance`.
    pub soon: Option<f64>,
    /// Fraction of its plan in the page cache at the last check.
    pub resident: Option<f64>,
    pub preloaded: bool,
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

/// `SOCKET.lock`, beside the socket.
pub(super) fn lock_path(socket: &Path) -> PathBuf {
    let mut name = socket.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// Takes an exclusive `flock` on `path`, or says another daemon holds it:
/// the state directory itself (`dir`: nothing is created, so a read-only
/// one still serves its plans), or a lock file, created if missing and
/// never through a symlink. The lock goes with the returned file.
pub(super) fn lock_exclusive(path: &Path, dir: bool) -> Result<std::fs::File, Error> {
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
pub(super) fn socket_ino(socket: &Path) -> Option<u64> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    std::fs::symlink_metadata(socket)
        .ok()
        .filter(|m| m.file_type().is_socket())
        .map(|m| m.ino())
}

/// Creates the socket's directory when it is missing: 0700, so that nobody
/// else can even look up the socket. An existing directory is left as it
/// is (`/run`, or systemd's `RuntimeDirectory=warmstart`, 0755 in the
/// unit; the socket itself is 0600 and answers root only).
pub(super) fn socket_dir(socket: &Path) -> Result<(), Error> {
    use std::os::unix::fs::DirBuilderExt;
    let Some(dir) = socket.parent().filter(|d| !d.as_os_str().is_empty()) else {
        return Ok(());
    };
    if dir.exists() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Error::io(dir, e))
}

/// Binds the control socket so that only root can connect: created under
/// a umask that leaves no access to others (no window with looser
/// permissions), and checked again on each connection.
pub(super) fn bind_root_only(socket: &Path) -> Result<std::os::unix::net::UnixListener, Error> {
    use std::os::unix::fs::FileTypeExt;
    socket_dir(socket)?;
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

/// How long a client has to send its whole request: requests are served
/// one at a time, so a client sending a byte now and then must not hold
/// the socket for longer.
const REQUEST_TIME: Duration = Duration::from_secs(1);
const REQUEST_MAX: usize = 1 << 20;

/// One request: up to end of input, [`REQUEST_MAX`] bytes or `deadline`,
/// whichever comes first (what was read by then is the request).
fn read_request(conn: &mut std::os::unix::net::UnixStream, deadline: Instant) -> Vec<u8> {
    use std::io::Read;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    while buf.len() < REQUEST_MAX {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || conn.set_read_timeout(Some(left)).is_err() {
            break;
        }
        let want = chunk.len().min(REQUEST_MAX - buf.len());
        match conn.read(&mut chunk[..want]) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    buf
}

/// The control thread: one request per connection, answered in turn.
/// Requests never touch the event loop's state directly, so a slow client
/// cannot delay a launch's replay.
pub(super) fn serve(
    listener: std::os::unix::net::UnixListener,
    shared: &Shared,
    store: &Store,
    dcfg: &DaemonConfig,
    cfg: &Config,
) {
    for conn in listener.incoming() {
        if shared.status.lock().unwrap_or_else(|e| e.into_inner()).pid == 0 {
            return; // stopping
        }
        let Ok(mut conn) = conn else { continue };
        let _ = conn.set_write_timeout(Some(Duration::from_secs(1)));
        // Read before a peer is refused: closing on a request not read
        // resets the connection, and the client would see no daemon
        // instead of the reason.
        let buf = read_request(&mut conn, Instant::now() + REQUEST_TIME);
        let reply = if peer_uid(&conn) != Some(0) {
            Reply::Error {
                message: "the control socket is root-only".into(),
            }
        } else {
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

pub(super) fn handle(
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
            // Asked for by name: no longer taken for a trivial program.
            shared.trivial().remove(&key);
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
            let names = match store.names() {
                Ok(n) => n,
                Err(e) => {
                    return Reply::Error {
                        message: e.to_string(),
                    }
                }
            };
            let mut profiles = shared.profiles.lock().unwrap_or_else(|e| e.into_inner());
            for mut p in names.iter().filter_map(|n| store.load(n).ok().flatten()) {
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
                // "Nothing to forget" only when there is nothing: an
                // unreadable state directory is said.
                match store.names() {
                    Ok(n) => n,
                    Err(e) => {
                        return Reply::Error {
                            message: e.to_string(),
                        }
                    }
                }
            } else {
                names
            };
            let (mut forgotten, mut missing) = (Vec::new(), Vec::new());
            for n in names {
                if !crate::store::listable_name(&n) {
                    missing.push(n);
                    continue;
                }
                profiles.insert(n.clone(), Instant::now());
                shared.cache.remove(&n);
                shared.forgotten().push(n.clone());
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
                super::cache::refresh(&shared.cache, store, &n, &mut log);
            }
            Reply::Refreshed { relearned, missing }
        }
    }
}

fn learn_list_path(store: &Store) -> PathBuf {
    store.root().join("learn.json")
}

pub(super) fn load_learn_list(store: &Store, log: &mut dyn Write) -> BTreeSet<String> {
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
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeSet::new(),
        // Unreadable is not empty: said, so that a learn list that
        // seems lost has a reason.
        Err(e) => {
            let _ = writeln!(
                log,
                "warmstart daemon: {}: {e}; starting with an empty learn list",
                p.display()
            );
            BTreeSet::new()
        }
    }
}

fn save_learn_list(store: &Store, list: &BTreeSet<String>) -> Result<(), Error> {
    let json = serde_json::to_vec_pretty(list).expect("serializes");
    store::write_atomic(&learn_list_path(store), &json)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::cache::Cache;

    #[test]
    fn the_socket_directory_is_made_private_when_missing() {
        let d = tempfile::tempdir().unwrap();
        let socket = d.path().join("run/warmstart/warmstart.sock");
        let _listener = bind_root_only(&socket).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(socket.parent().unwrap()), 0o700);
        assert_eq!(mode(&socket), 0o600);
        // An existing directory (`/run`) is left as it is.
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let _second = bind_root_only(&d.path().join("other.sock")).unwrap();
        assert_eq!(mode(d.path()), 0o755);
        assert_eq!(
            DaemonConfig::default().socket,
            Path::new(super::super::DEFAULT_SOCKET)
        );
    }

    #[test]
    fn an_unreadable_state_directory_is_reported_not_taken_for_empty() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(d.path()).unwrap();
        let shared = Shared::new(DaemonStatus::default(), BTreeSet::new(), Cache::default());
        let (dcfg, cfg) = (DaemonConfig::default(), Config::default());
        let forget_all = || {
            handle(
                Request::Forget {
                    names: Vec::new(),
                    all: true,
                },
                &shared,
                &store,
                &dcfg,
                &cfg,
            )
        };
        assert!(matches!(forget_all(), Reply::Forgot { forgotten, .. } if forgotten.is_empty()));
        // Root reads any directory: a file where it belongs stands for
        // one that cannot be read.
        let profiles = d.path().join("profiles");
        std::fs::remove_dir_all(&profiles).unwrap();
        std::fs::write(&profiles, b"").unwrap();
        match forget_all() {
            Reply::Error { message } => assert!(message.contains("profiles"), "{message}"),
            r => panic!("{r:?}"),
        }
        // The same for the learn list.
        std::fs::create_dir(learn_list_path(&store)).unwrap();
        let mut log = Vec::new();
        assert!(load_learn_list(&store, &mut log).is_empty());
        let log = String::from_utf8(log).unwrap();
        assert!(log.contains("learn.json"), "{log}");
    }
}
