//! Profiles on disk: one directory per profile under the state directory,
//! holding `profile.json`, the raw traces and the compiled plan. Every
//! write goes through a temporary file and a rename, so a crash never
//! leaves a half-written profile or plan.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::Error;

/// Where a profile is in FAST's launch-manager cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Recording raw launch sequences (the first N_rawseq launches).
    Learning,
    /// Replaying the plan alongside each launch.
    Prefetching,
    /// Too small to benefit: launched as is, never traced again.
    Ignored,
}

/// File in a profile's directory tallying launches exec'd in place (plan
/// resident, or too small a launch to prefetch), one byte each.
const IN_PLACE_TALLY: &str = "launches-in-place";

/// One application's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    pub name: String,
    pub command: Vec<String>,
    pub phase: Phase,
    /// Launches through warmstart, all phases.
    pub launches: u64,
    /// Raw traces kept for the next compile (file names in the profile dir).
    pub traces: Vec<String>,
    /// Plan size in bytes, if there is a plan.
    pub plan_bytes: Option<u64>,
    /// Miss ratio of the last prefetched launch: bytes the application still
    /// read from storage itself / bytes the plan prefetches.
    pub last_miss_ratio: Option<f64>,
    /// Files of the plan found changed or missing at the last replay.
    pub last_stale_files: u64,
    /// How many times the profile went back to learning.
    pub relearned: u64,
    /// Why the profile is where it is (for `status`).
    pub note: Option<String>,
    pub updated_unix_ms: u64,
    /// Counter for trace file names.
    #[serde(default)]
    pub next_trace: u64,
    /// The cheap check saw a high miss ratio: audit the next launch exactly.
    #[serde(default)]
    pub audit_next: bool,
    /// Prefetched launches since the last exact audit [N_chk].
    #[serde(default)]
    pub launches_since_audit: u64,
    /// Prefetched launches in a row whose cheap check saw a miss ratio
    /// above R_miss.
    #[serde(default)]
    pub cheap_over: u32,
    /// Length of the launches-in-place tally already counted in `launches`
    /// ([`Store::count_launch_in_place`]).
    #[serde(default)]
    pub in_place_counted: u64,
}

impl Profile {
    pub fn new(name: &str, command: &[String]) -> Profile {
        Profile {
            name: name.to_string(),
            command: command.to_vec(),
            phase: Phase::Learning,
            launches: 0,
            traces: Vec::new(),
            plan_bytes: None,
            last_miss_ratio: None,
            last_stale_files: 0,
            relearned: 0,
            note: None,
            updated_unix_ms: 0,
            next_trace: 0,
            in_place_counted: 0,
            audit_next: false,
            cheap_over: 0,
            launches_since_audit: 0,
        }
    }
}

/// The state directory.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

/// `$XDG_STATE_HOME/warmstart` (or `~/.local/state/warmstart`) for users,
/// `/var/lib/warmstart` for root.
pub fn default_state_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return PathBuf::from("/var/lib/warmstart");
    }
    if let Some(x) = std::env::var_os("XDG_STATE_HOME").filter(|x| !x.is_empty()) {
        return PathBuf::from(x).join("warmstart");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    home.join(".local/state/warmstart")
}

/// Longest profile name created. Names are built short enough
/// ([`crate::manager::profile_name`] keeps at most 64 characters of the
/// program's name), so every profile created is also listed.
pub const MAX_NAME: usize = 128;

/// A profile name is a file name: letters, digits, `-`, `_`, `.`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// A directory in `profiles/` that `status` shows and `forget` removes:
/// any entry but hidden ones (temporary files) and `..`-like names, so
/// that a profile left by an older version under a name that would not
/// be created today can still be seen and forgotten.
pub fn listable_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 255 && !name.starts_with('.') && !name.contains('/')
}

/// How long a temporary file may stay before [`Store::sweep`] takes it
/// for the leftover of a killed writer. A writer renames its file within
/// milliseconds; an hour leaves room for a stopped (Ctrl-Z) one.
pub const LEFTOVER_AGE: std::time::Duration = std::time::Duration::from_secs(3600);

/// An exclusive lock on one profile, shared by `warmstart run` and the
/// daemon (`flock` on the profile's directory): whoever holds it is the
/// only one adding traces to, compiling or saving that profile. Released
/// when dropped, or when its process dies.
#[derive(Debug)]
pub struct ProfileLock {
    _dir: std::fs::File,
}

impl Store {
    pub fn open(root: &Path) -> Result<Store, Error> {
        let profiles = root.join("profiles");
        std::fs::create_dir_all(&profiles).map_err(|e| Error::io(&profiles, e))?;
        Ok(Store {
            root: root.to_path_buf(),
        })
    }

    /// The store at `root` as it is, creating nothing: for commands that
    /// only look (`status`) or remove (`forget`), so that a mistyped
    /// directory is not created.
    pub fn at(root: &Path) -> Store {
        Store {
            root: root.to_path_buf(),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn dir(&self, name: &str) -> PathBuf {
        self.root.join("profiles").join(name)
    }

    pub fn plan_path(&self, name: &str) -> PathBuf {
        self.dir(name).join("plan")
    }

    /// The plan a relearning profile had before: still prefetched from
    /// while the new launches are recorded.
    pub fn previous_plan_path(&self, name: &str) -> PathBuf {
        self.dir(name).join("plan.previous")
    }

    /// The windows a warm launch samples, saved with the plan so that the
    /// check need not decode it.
    pub fn warm_check_path(&self, name: &str) -> PathBuf {
        self.dir(name).join("warm-check.json")
    }

    pub fn trace_path(&self, name: &str, file: &str) -> PathBuf {
        self.dir(name).join(file)
    }

    pub fn load(&self, name: &str) -> Result<Option<Profile>, Error> {
        let p = self.dir(name).join("profile.json");
        let mut prof: Profile = match std::fs::read(&p) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| Error::CorruptProfile {
                path: p,
                why: e.to_string(),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(&p, e)),
        };
        // Launches in place tallied since the profile was last written.
        if let Ok(m) = std::fs::metadata(self.dir(name).join(IN_PLACE_TALLY)) {
            let new = m.len().saturating_sub(prof.in_place_counted);
            prof.launches += new;
            prof.launches_since_audit += new;
            prof.in_place_counted = m.len();
            let used = m
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_millis() as u64);
            prof.updated_unix_ms = prof.updated_unix_ms.max(used);
        } else {
            prof.in_place_counted = 0;
        }
        Ok(Some(prof))
    }

    /// Counts a launch that ran without the launch manager (its plan was
    /// resident, or it is too small to prefetch), without rewriting the
    /// profile: one byte appended to a tally that [`Store::load`] folds
    /// in. Rewriting profile.json costs
    /// ~0.5 ms here (ext4 starts writeback when a rename replaces a file),
    /// a quarter of what a warm launch may cost in all. Appends are atomic,
    /// so concurrent launches each count.
    pub fn count_launch_in_place(&self, name: &str) -> Result<(), Error> {
        use std::io::Write;
        let p = self.dir(name).join(IN_PLACE_TALLY);
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&p)
            .and_then(|mut f| f.write_all(b"w"))
            .map_err(|e| Error::io(&p, e))
    }

    pub fn save(&self, prof: &mut Profile) -> Result<(), Error> {
        self.save_as(prof, write_atomic)
    }

    /// Saves a profile whose phase and plan are what they were when it was
    /// loaded, only its counters and verdicts changed (a prefetched launch,
    /// judged): replaced atomically but not synced, because the wrapper's
    /// caller waits for it after the program has exited (cold npm and
    /// python launches on this VM's disk, medians of 10: 1.45 and 2.2 ms
    /// after the exit with the two `fsync`s, 1.05 and 1.25 ms without). Lost
    /// in a crash, the counters are a launch behind; left empty by a file
    /// system that does not flush a file renamed over another, the profile
    /// is rebuilt from its traces and plan ([`Store::rebuild`]).
    pub fn save_counts(&self, prof: &mut Profile) -> Result<(), Error> {
        self.save_as(prof, write_replace)
    }

    fn save_as(
        &self,
        prof: &mut Profile,
        write: fn(&Path, &[u8]) -> Result<(), Error>,
    ) -> Result<(), Error> {
        prof.updated_unix_ms = now_ms();
        let dir = self.dir(&prof.name);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        let bytes = serde_json::to_vec_pretty(prof).expect("profile serializes");
        write(&dir.join("profile.json"), &bytes)
    }

    /// The names of all profile directories, sorted, readable or not. A
    /// state directory that cannot be read is an error (permission denied
    /// is not "no profiles"); one that does not exist yet has none.
    pub fn names(&self) -> Result<Vec<String>, Error> {
        let dir = self.root.join("profiles");
        let rd = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io(&dir, e)),
        };
        let mut names = Vec::new();
        for e in rd {
            let e = e.map_err(|e| Error::io(&dir, e))?;
            let Ok(n) = e.file_name().into_string() else {
                continue;
            };
            if listable_name(&n) && e.file_type().is_ok_and(|t| t.is_dir()) {
                names.push(n);
            }
        }
        names.sort();
        Ok(names)
    }

    /// All profiles, by name. Unreadable ones are returned as errors in
    /// place; a state directory that cannot be read is an error.
    pub fn list(&self) -> Result<Vec<Result<Profile, Error>>, Error> {
        Ok(self
            .names()?
            .into_iter()
            .filter_map(|n| self.load(&n).transpose())
            .collect())
    }

    /// Takes the profile's lock without waiting; `None` when another
    /// process holds it (a second launch of the same command: it runs,
    /// but only the first learns from its launch).
    pub fn try_lock(&self, name: &str) -> Result<Option<ProfileLock>, Error> {
        use std::os::fd::AsRawFd;
        if !valid_name(name) {
            return Err(Error::BadName(name.to_string()));
        }
        let dir = self.dir(name);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        let f = std::fs::File::open(&dir).map_err(|e| Error::io(&dir, e))?;
        // SAFETY: flock on a descriptor we own; no memory is involved.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(Some(ProfileLock { _dir: f }));
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Ok(None);
        }
        Err(Error::io(&dir, e))
    }

    /// [`Store::try_lock`], retried for up to `wait`: the daemon holds a
    /// profile's lock only while it saves, a learning `run` for its whole
    /// launch.
    pub fn lock_within(
        &self,
        name: &str,
        wait: std::time::Duration,
    ) -> Result<Option<ProfileLock>, Error> {
        let until = std::time::Instant::now() + wait;
        loop {
            if let Some(l) = self.try_lock(name)? {
                return Ok(Some(l));
            }
            if std::time::Instant::now() >= until {
                return Ok(None);
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// Removes what writers killed mid-write left behind: temporary files
    /// (`.NAME.XXXX.tmp`) older than `max_age` in the state directory and
    /// in `names/` and in each profile. Returns how many were removed.
    pub fn sweep(&self, max_age: std::time::Duration) -> Result<usize, Error> {
        let mut dirs = vec![self.root.clone(), self.root.join("names")];
        dirs.extend(self.names()?.into_iter().map(|n| self.dir(&n)));
        let mut removed = 0;
        let now = std::time::SystemTime::now();
        for d in dirs {
            let Ok(rd) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in rd.flatten() {
                let n = e.file_name();
                let n = n.to_string_lossy();
                if !(n.starts_with('.') && n.ends_with(".tmp")) {
                    continue;
                }
                let old = e
                    .metadata()
                    .ok()
                    .filter(|m| m.is_file())
                    .and_then(|m| m.modified().ok())
                    .and_then(|t| now.duration_since(t).ok())
                    .is_some_and(|age| age >= max_age);
                if old && std::fs::remove_file(e.path()).is_ok() {
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }

    /// Rebuilds a profile whose `profile.json` does not parse (`why`) from
    /// what its directory still holds, so that nothing it learned is lost:
    /// its traces are listed again, and a plan that still decodes puts it
    /// back to prefetching. The unreadable file is kept beside it as
    /// `profile.json.corrupt`. `command` is used when the plan does not
    /// name one. The counters (launches, audits) start over.
    pub fn rebuild(&self, name: &str, command: &[String], why: &str) -> Result<Profile, Error> {
        if !valid_name(name) {
            return Err(Error::BadName(name.to_string()));
        }
        let dir = self.dir(name);
        let json = dir.join("profile.json");
        let kept = dir.join("profile.json.corrupt");
        // Copied, not moved: until the rebuilt profile replaces it (one
        // rename, below), a failure leaves the profile as it was.
        let bytes = std::fs::read(&json).map_err(|e| Error::io(&json, e))?;
        if let Ok(p) = serde_json::from_slice::<Profile>(&bytes) {
            // Another launch rebuilt it meanwhile.
            return Ok(p);
        }
        write_atomic(&kept, &bytes)?;
        let mut traces: Vec<(u64, String)> = std::fs::read_dir(&dir)
            .map_err(|e| Error::io(&dir, e))?
            .flatten()
            .filter_map(|e| {
                let n = e.file_name().into_string().ok()?;
                let i = n.strip_prefix("trace-")?.parse::<u64>().ok()?;
                e.file_type().ok()?.is_file().then_some((i, n))
            })
            .collect();
        traces.sort();
        let mut prof = Profile::new(name, command);
        prof.next_trace = traces.last().map_or(0, |(i, _)| i + 1);
        prof.traces = traces.into_iter().map(|(_, n)| n).collect();
        let plan = std::fs::read(self.plan_path(name))
            .ok()
            .and_then(|b| Some((b.len() as u64, warmstart_plan::Plan::from_bytes(&b).ok()?)));
        if let Some((len, plan)) = plan {
            prof.phase = Phase::Prefetching;
            prof.plan_bytes = Some(len);
            if !plan.meta.command.is_empty() {
                prof.command = plan.meta.command;
            }
        }
        if prof.command.is_empty() {
            // No plan to name it: the newest trace that decodes does.
            prof.command = prof
                .traces
                .iter()
                .rev()
                .find_map(|t| {
                    let b = std::fs::read(self.trace_path(name, t)).ok()?;
                    let t = warmstart_plan::Trace::from_bytes(&b).ok()?;
                    Some(t.meta.command)
                })
                .unwrap_or_default();
        }
        prof.note = Some(format!(
            "rebuilt from {} trace(s){}: profile.json did not parse ({why}), kept as {}",
            prof.traces.len(),
            if prof.phase == Phase::Prefetching {
                " and the plan"
            } else {
                ""
            },
            kept.display()
        ));
        self.save(&mut prof)?;
        Ok(prof)
    }

    /// Removes a profile and everything it learned. Only a profile's name:
    /// an absolute path or `..` would name a directory outside the store.
    pub fn forget(&self, name: &str) -> Result<bool, Error> {
        if !listable_name(name) {
            return Err(Error::BadName(name.to_string()));
        }
        let dir = self.dir(name);
        if !dir.exists() {
            return Ok(false);
        }
        std::fs::remove_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        Ok(true)
    }
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Writes via a temporary file in the same directory, synced, then renamed,
/// then the directory synced. The temporary file gets a random name and is
/// created exclusively (never through a symlink someone planted), and is
/// removed if anything fails; a symlink at `path` is replaced, never
/// written through.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    write_new(path, bytes, true)
}

/// Replaces `path` with `bytes` atomically, as [`write_atomic`] does, but
/// without waiting for them to reach the disk: for files whose loss in a
/// crash costs nothing (a launch report), which a reader must still
/// never find half-written. For a 20 KB report on this VM's disk the two
/// `fsync`s tripled the write: 1.05 ms against 0.35 ms (medians of 30),
/// paid after the program exited.
pub fn write_replace(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    write_new(path, bytes, false)
}

fn write_new(path: &Path, bytes: &[u8], durable: bool) -> Result<(), Error> {
    use std::io::Write;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let prefix = format!(
        ".{}.",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default()
    );
    let mut tmp = tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(".tmp")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .tempfile_in(dir)
        .map_err(|e| Error::io(path, bare(e)))?;
    tmp.write_all(bytes).map_err(|e| Error::io(path, bare(e)))?;
    if durable {
        // Durable before it is visible: after a crash the name holds either
        // the old bytes or all of the new ones, never an empty file (ext4's
        // delayed allocation would otherwise allow that).
        tmp.as_file()
            .sync_all()
            .map_err(|e| Error::io(path, bare(e)))?;
    }
    tmp.persist(path)
        .map_err(|e| Error::io(path, bare(e.error)))?;
    if durable {
        // And the rename itself.
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| Error::io(dir, e))?;
    }
    Ok(())
}

/// The OS error alone: `tempfile` adds the temporary file's name, which
/// the user never asked for; the message names the destination instead.
fn bare(e: std::io::Error) -> std::io::Error {
    use std::io::ErrorKind as K;
    if e.raw_os_error().is_some() {
        return e;
    }
    let errno = match e.kind() {
        K::NotFound => libc::ENOENT,
        K::PermissionDenied => libc::EACCES,
        K::AlreadyExists => libc::EEXIST,
        K::ReadOnlyFilesystem => libc::EROFS,
        K::StorageFull => libc::ENOSPC,
        K::NotADirectory => libc::ENOTDIR,
        K::IsADirectory => libc::EISDIR,
        _ => return e,
    };
    std::io::Error::from_raw_os_error(errno)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_replace_never_follow_and_leave_nothing_behind() {
        type Writer = fn(&Path, &[u8]) -> Result<(), Error>;
        for (what, write) in [
            ("durable", write_atomic as Writer),
            ("not synced", write_replace as Writer),
        ] {
            let d = tempfile::tempdir().unwrap();
            let victim = d.path().join("victim");
            std::fs::write(&victim, "keep").unwrap();
            // A symlink at the destination is replaced, not written through.
            let out = d.path().join("out");
            std::os::unix::fs::symlink(&victim, &out).unwrap();
            write(&out, b"new").unwrap();
            assert_eq!(std::fs::read(&out).unwrap(), b"new", "{what}");
            assert_eq!(std::fs::read(&victim).unwrap(), b"keep", "{what}");
            assert!(!std::fs::symlink_metadata(&out).unwrap().is_symlink());
            // A failed write names the destination and leaves no file.
            let dir = d.path().join("a-dir");
            std::fs::create_dir(&dir).unwrap();
            std::fs::write(dir.join("inside"), "x").unwrap();
            let err = write(&dir, b"x").unwrap_err().to_string();
            assert!(err.starts_with(&dir.display().to_string()), "{what}: {err}");
            let names: Vec<_> = std::fs::read_dir(d.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            assert!(
                names.iter().all(|n| !n.ends_with(".tmp")),
                "{what}: {names:?}"
            );
        }
    }

    #[test]
    fn names() {
        for (n, ok) in [
            ("python3-1a2b", true),
            ("", false),
            ("../x", false),
            (".hidden", false),
            ("a b", false),
        ] {
            assert_eq!(valid_name(n), ok, "{n:?}");
        }
    }

    #[test]
    fn warm_launches_are_tallied_and_folded_once() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path()).unwrap();
        let mut p = Profile::new("app-1", &["app".into()]);
        p.launches = 3;
        s.save(&mut p).unwrap();
        s.count_launch_in_place("app-1").unwrap();
        s.count_launch_in_place("app-1").unwrap();
        let mut p = s.load("app-1").unwrap().unwrap();
        assert_eq!((p.launches, p.launches_since_audit), (5, 2));
        // Saved with the tally folded in: loading again adds nothing.
        s.save(&mut p).unwrap();
        assert_eq!(s.load("app-1").unwrap().unwrap().launches, 5);
        s.count_launch_in_place("app-1").unwrap();
        assert_eq!(s.load("app-1").unwrap().unwrap().launches, 6);
    }

    #[test]
    fn a_profile_that_does_not_parse_is_rebuilt_from_its_traces_and_plan() {
        use warmstart_plan::plan::{PlanFile, PlanMeta};
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path()).unwrap();
        let dir = s.dir("app-1");
        std::fs::create_dir_all(&dir).unwrap();
        for t in ["trace-7", "trace-3", "trace-x", "trace-11"] {
            std::fs::write(dir.join(t), b"a trace").unwrap();
        }
        std::fs::write(dir.join("profile.json"), b"{\"name\": \"app-1\", trunc").unwrap();
        // Traces only: back to learning, with each trace listed in order.
        let Err(Error::CorruptProfile { why, .. }) = s.load("app-1") else {
            panic!("a corrupt profile.json is an error")
        };
        let p = s.rebuild("app-1", &["app".into()], &why).unwrap();
        assert_eq!(p.phase, Phase::Learning);
        assert_eq!(p.traces, ["trace-3", "trace-7", "trace-11"]);
        assert_eq!(p.next_trace, 12);
        assert_eq!(p.command, ["app"]);
        assert_eq!(
            std::fs::read(dir.join("profile.json.corrupt")).unwrap(),
            b"{\"name\": \"app-1\", trunc"
        );
        assert_eq!(s.load("app-1").unwrap().unwrap(), p);
        // With a plan that decodes: prefetching again, under its command.
        let plan = warmstart_plan::Plan {
            meta: PlanMeta {
                command: vec!["/usr/bin/app".into(), "-x".into()],
                created_unix_ms: 0,
                traces: 2,
                min_traces: 2,
                passes: vec![],
                sorted: false,
            },
            files: vec![PlanFile {
                path: "/a".into(),
                id: Default::default(),
            }],
            lookups: vec![],
            entries: vec![warmstart_plan::Entry::Data {
                file: 0,
                offset: 0,
                len: 4096,
            }],
        };
        let bytes = plan.to_bytes();
        std::fs::write(s.plan_path("app-1"), &bytes).unwrap();
        std::fs::write(dir.join("profile.json"), b"").unwrap();
        let p = s.rebuild("app-1", &[], "empty").unwrap();
        assert_eq!(p.phase, Phase::Prefetching);
        assert_eq!(p.plan_bytes, Some(bytes.len() as u64));
        assert_eq!(p.command, ["/usr/bin/app", "-x"]);
        assert!(p.note.unwrap().contains("and the plan"));
        // A plan that does not decode is left for the next compile.
        std::fs::write(s.plan_path("app-1"), b"junk").unwrap();
        std::fs::write(dir.join("profile.json"), b"[]").unwrap();
        assert_eq!(s.rebuild("app-1", &[], "x").unwrap().phase, Phase::Learning);
        assert!(s.rebuild("../x", &[], "x").is_err());
    }

    #[test]
    fn save_load_list_forget() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path()).unwrap();
        let mut p = Profile::new("app-1", &["app".into()]);
        s.save(&mut p).unwrap();
        assert_eq!(
            s.load("app-1").unwrap().unwrap().command,
            vec!["app".to_string()]
        );
        assert!(s.load("nope").unwrap().is_none());
        std::fs::create_dir_all(s.dir("broken")).unwrap();
        std::fs::write(s.dir("broken").join("profile.json"), b"{not json").unwrap();
        let all = s.list().unwrap();
        assert_eq!(all.len(), 2);
        assert!(all
            .iter()
            .any(|r| r.as_ref().is_err_and(|e| e.to_string().contains("broken"))));
        assert!(s.forget("app-1").unwrap());
        assert!(!s.forget("app-1").unwrap());
    }

    #[test]
    fn every_profile_directory_is_listed_and_forgettable() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path()).unwrap();
        // A name no version creates today (too long, odd characters).
        let odd = format!("{}-x y", "n".repeat(200));
        std::fs::create_dir_all(s.dir(&odd)).unwrap();
        std::fs::create_dir_all(s.dir(".hidden")).unwrap();
        std::fs::write(d.path().join("profiles/a-file"), b"").unwrap();
        assert_eq!(s.names().unwrap(), vec![odd.clone()]);
        assert!(s.forget(&odd).unwrap());
        assert!(s.names().unwrap().is_empty());
        assert!(s.forget("../escape").is_err());
        assert!(s.forget("a/b").is_err());
    }

    #[test]
    fn an_unreadable_state_directory_is_an_error_not_an_empty_one() {
        let d = tempfile::tempdir().unwrap();
        // Missing: nothing learned yet.
        assert!(Store::at(&d.path().join("none"))
            .names()
            .unwrap()
            .is_empty());
        // Not a directory (as root, permissions would not stop a read).
        std::fs::write(d.path().join("profiles"), b"").unwrap();
        let err = Store::at(d.path()).list().unwrap_err().to_string();
        assert!(err.contains("profiles"), "{err}");
    }

    #[test]
    fn a_profile_lock_is_exclusive_until_dropped() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path()).unwrap();
        let held = s.try_lock("app-1").unwrap().expect("free");
        // flock locks belong to the open file: a second open conflicts even
        // in this process, as another `run` or the daemon would.
        assert!(s.try_lock("app-1").unwrap().is_none());
        assert!(s.try_lock("app-2").unwrap().is_some());
        drop(held);
        assert!(s.try_lock("app-1").unwrap().is_some());
        assert!(s.try_lock("../x").is_err());
    }

    #[test]
    fn sweep_removes_old_leftovers_only() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path()).unwrap();
        let mut p = Profile::new("app-1", &["app".into()]);
        s.save(&mut p).unwrap();
        let old = s.dir("app-1").join(".plan.abc123.tmp");
        let fresh = s.dir("app-1").join(".profile.json.def456.tmp");
        let top = d.path().join(".learn.json.xyz.tmp");
        for f in [&old, &fresh, &top] {
            std::fs::write(f, b"half").unwrap();
        }
        let long_ago = std::time::SystemTime::now() - 2 * LEFTOVER_AGE;
        for f in [&old, &top] {
            std::fs::File::options()
                .write(true)
                .open(f)
                .unwrap()
                .set_modified(long_ago)
                .unwrap();
        }
        assert_eq!(s.sweep(LEFTOVER_AGE).unwrap(), 2);
        assert!(!old.exists() && !top.exists());
        assert!(fresh.exists(), "a writer may still be using it");
        assert!(s.dir("app-1").join("profile.json").exists());
    }
}
