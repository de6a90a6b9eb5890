//! Execve hints: which profile an execve, as called, started last time.
//!
//! At an execve's entry the daemon knows only the path and arguments the
//! caller gave. Turning them into a profile name means resolving the path
//! (`/usr/bin/npm` is a symlink to a script), the script's interpreter
//! and the program `env` runs: lookups the exec'ing process is making at
//! the same moment. After a cache drop they read the disk, and the daemon
//! waits behind the process for them (8 ms of a cold `npm` launch here),
//! so its replay started only when the launch's first program did.
//!
//! So each launch's first execve is remembered with the profile the launch
//! ended as, in memory and in `execs.json` in the state directory (a daemon
//! started after a boot has them). The next execve with the same uid,
//! path and arguments starts that profile's replay at once, reading
//! nothing. The exec event still decides the launch as before: a replay
//! for the wrong profile (the symlink now points elsewhere) is stopped
//! there, and its hint forgotten.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The file under the state directory.
pub(super) const FILE: &str = "execs.json";

/// At most this many hints; the oldest go first.
const MAX: usize = 4096;

#[derive(Default, Serialize, Deserialize)]
struct OnDisk {
    /// Hint key (see [`key`]) -> profile name, with the order learned.
    execs: Vec<(String, String)>,
}

/// The daemon's execve hints.
pub(super) struct ExecHints {
    path: Option<PathBuf>,
    /// key -> (profile name, when learned: a counter).
    map: HashMap<String, (String, u64)>,
    next: u64,
    dirty: bool,
}

/// The key of an execve: the caller's uid, the path as given (in the
/// caller's working directory when relative) and the arguments, each
/// length-prefixed, hashed.
pub(super) fn key(uid: u32, cwd: Option<&Path>, filename: &str, argv: &[String]) -> String {
    let path = match cwd {
        Some(d) if !filename.starts_with('/') => d.join(filename).display().to_string(),
        _ => filename.to_string(),
    };
    let uid = uid.to_le_bytes();
    let parts = [&uid[..], path.as_bytes()]
        .into_iter()
        .chain(argv.iter().map(|a| a.as_bytes()));
    crate::manager::digest(parts)
}

/// The key of `tgid`'s execve of `filename` with `argv`, from what the
/// kernel keeps of the process (its uid, and its directory when the path
/// is relative): nothing is read from storage.
pub(super) fn key_of(tgid: u32, filename: &str, argv: &[String]) -> Option<String> {
    let uid = super::policy::launch_uid(Path::new("/proc"), tgid)?;
    let cwd = (!filename.starts_with('/'))
        .then(|| std::fs::read_link(format!("/proc/{tgid}/cwd")).ok())
        .flatten();
    Some(key(uid, cwd.as_deref(), filename, argv))
}

impl ExecHints {
    /// No file: kept in memory only (tests).
    pub(super) fn in_memory() -> Self {
        ExecHints {
            path: None,
            map: HashMap::new(),
            next: 0,
            dirty: false,
        }
    }

    /// Loads `execs.json` from `state_dir`, keeping the hints whose profile
    /// `exists`. A missing file is no hint; one that does not parse is
    /// said once and replaced at the next write.
    pub(super) fn load(
        state_dir: &Path,
        exists: impl Fn(&str) -> bool,
        log: &mut dyn Write,
    ) -> Self {
        let path = state_dir.join(FILE);
        let mut h = ExecHints {
            path: Some(path.clone()),
            ..ExecHints::in_memory()
        };
        let disk: OnDisk = match std::fs::read(&path) {
            Ok(b) => match serde_json::from_slice(&b) {
                Ok(d) => d,
                Err(e) => {
                    let _ = writeln!(
                        log,
                        "warmstart daemon: {} does not parse ({e}); starting without execve hints",
                        path.display()
                    );
                    h.dirty = true;
                    OnDisk::default()
                }
            },
            Err(_) => OnDisk::default(),
        };
        for (k, name) in disk.execs {
            if exists(&name) {
                h.insert(k, name);
            } else {
                h.dirty = true;
            }
        }
        h
    }

    fn insert(&mut self, key: String, name: String) {
        if self.map.len() >= MAX && !self.map.contains_key(&key) {
            if let Some(oldest) = self
                .map
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(k, _)| k.clone())
            {
                self.map.remove(&oldest);
            }
        }
        self.map.insert(key, (name, self.next));
        self.next += 1;
    }

    /// The profile the execve `key` started last time, if any.
    pub(super) fn get(&self, key: &str) -> Option<&str> {
        self.map.get(key).map(|(n, _)| n.as_str())
    }

    /// A launch started by the execve `key` ended as profile `name`.
    pub(super) fn learn(&mut self, key: String, name: &str) {
        if self.get(&key) != Some(name) {
            self.insert(key, name.to_string());
            self.dirty = true;
        }
    }

    /// The hint `key` named the wrong profile.
    pub(super) fn forget(&mut self, key: &str) {
        if self.map.remove(key).is_some() {
            self.dirty = true;
        }
    }

    /// What to write, if anything changed since the last call: the file
    /// and its bytes (written off the event loop by the caller).
    pub(super) fn take_write(&mut self) -> Option<(PathBuf, Vec<u8>)> {
        if !std::mem::take(&mut self.dirty) {
            return None;
        }
        let path = self.path.clone()?;
        let mut execs: Vec<(&String, &(String, u64))> = self.map.iter().collect();
        execs.sort_by_key(|(_, (_, at))| *at);
        let disk = OnDisk {
            execs: execs
                .into_iter()
                .map(|(k, (n, _))| (k.clone(), n.clone()))
                .collect(),
        };
        Some((path, serde_json::to_vec(&disk).ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn keys_tell_users_paths_arguments_and_directories_apart() {
        let a = argv(&["npm", "config", "list"]);
        let k = key(0, None, "/usr/bin/npm", &a);
        assert_eq!(k, key(0, Some(Path::new("/tmp")), "/usr/bin/npm", &a));
        assert_ne!(k, key(1000, None, "/usr/bin/npm", &a));
        assert_ne!(k, key(0, None, "/usr/local/bin/npm", &a));
        assert_ne!(k, key(0, None, "/usr/bin/npm", &argv(&["npm", "config"])));
        // Length-prefixed: the parts cannot run into each other.
        assert_ne!(
            key(0, None, "/a", &argv(&["b c"])),
            key(0, None, "/a", &argv(&["b", "c"]))
        );
        // A relative path is the file in the caller's directory.
        let rel = key(0, Some(Path::new("/home/u")), "./app", &a);
        assert_ne!(rel, key(0, Some(Path::new("/srv")), "./app", &a));
        assert_eq!(rel, key(0, None, "/home/u/./app", &a));
    }

    #[test]
    fn hints_survive_a_restart_unless_their_profile_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let mut h = ExecHints::load(dir.path(), |_| true, &mut std::io::sink());
        h.learn("k1".into(), "npm-u0-1");
        h.learn("k2".into(), "gone-u0-2");
        let (path, bytes) = h.take_write().expect("changed");
        std::fs::write(&path, bytes).unwrap();
        assert!(h.take_write().is_none(), "nothing new to write");
        h.learn("k1".into(), "npm-u0-1");
        assert!(h.take_write().is_none(), "the same hint again is no change");

        let h = ExecHints::load(dir.path(), |n| n != "gone-u0-2", &mut std::io::sink());
        assert_eq!(h.get("k1"), Some("npm-u0-1"));
        assert_eq!(h.get("k2"), None, "its profile was removed");
    }

    #[test]
    fn a_corrupt_file_is_said_and_replaced() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), b"{not json").unwrap();
        let mut log = Vec::new();
        let mut h = ExecHints::load(dir.path(), |_| true, &mut log);
        assert!(String::from_utf8(log).unwrap().contains("does not parse"));
        assert!(h.get("k1").is_none());
        assert!(h.take_write().is_some(), "rewritten at the next write");
    }

    #[test]
    fn a_wrong_hint_is_forgotten() {
        let mut h = ExecHints::in_memory();
        h.learn("k".into(), "a");
        h.learn("k".into(), "b");
        assert_eq!(h.get("k"), Some("b"), "the launch's latest profile");
        h.forget("k");
        assert_eq!(h.get("k"), None);
    }

    #[test]
    fn the_oldest_hints_go_first() {
        let mut h = ExecHints::in_memory();
        for i in 0..MAX + 1 {
            h.learn(format!("k{i}"), "p");
        }
        assert_eq!(h.map.len(), MAX);
        assert_eq!(h.get("k0"), None);
        assert_eq!(h.get(&format!("k{MAX}")), Some("p"));
    }
}
