//! The profile a command line named last time (`names/KEY` in the state
//! directory), so that a launch can start its replay before it walks its
//! program's path again.
//!
//! Naming a launch's profile needs the program it runs: the PATH search
//! and every symlink to the real file. On a cold cache that walk is a
//! chain of dependent reads, each waiting for the one before: 4–5 ms for
//! npm on the ext4 testbed, 18–22 ms on the `cloud` model, all of it
//! before the replay could start. With a hint the walk still happens, on
//! a thread of its own beside the replay, and still decides: a launch
//! whose hint named another profile cancels that replay before anything
//! is launched and starts over with the real name.
//!
//! The key is everything the walk depends on besides the file system: the
//! user, the command line as typed, PATH (for a bare program name) and
//! the working directory (for a relative path, or a PATH with a relative
//! entry). A hint that the file system made stale (a program installed earlier in PATH, a symlink
//! repointed) is caught by the walk and rewritten.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::store::valid_name;

/// What a command line named last time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Hint {
    /// The profile.
    pub name: String,
    /// The program it ran, symlinks resolved.
    pub program: PathBuf,
}

/// The directory of hints under the state directory.
pub(super) fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join("names")
}

/// The key of `argv` run by `uid` here: a digest of what the walk reads
/// besides the file system.
pub(super) fn key(uid: u32, argv: &[String]) -> String {
    let mut parts: Vec<Vec<u8>> = vec![uid.to_le_bytes().to_vec()];
    let mut part = |b: &[u8]| parts.push(b.to_vec());
    for a in argv {
        part(a.as_bytes());
    }
    use std::os::unix::ffi::OsStrExt;
    let cmd = &argv[0];
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut relative = !cmd.starts_with('/') && cmd.contains('/');
    if !cmd.contains('/') {
        part(b"PATH");
        part(path.as_bytes());
        relative =
            std::env::split_paths(&path).any(|d| !d.as_os_str().is_empty() && !d.is_absolute());
    }
    if relative {
        part(b"cwd");
        part(
            std::env::current_dir()
                .unwrap_or_default()
                .as_os_str()
                .as_bytes(),
        );
    }
    super::naming::digest(parts.iter().map(Vec::as_slice))
}

/// The file of the hint kept under `key`.
pub(super) fn path(state_dir: &Path, key: &str) -> PathBuf {
    dir(state_dir).join(key)
}

/// The hint kept under `key`, if there is one that reads and names a
/// valid profile.
pub(super) fn read(state_dir: &Path, key: &str) -> Option<Hint> {
    let bytes = std::fs::read(path(state_dir, key)).ok()?;
    let hint: Hint = serde_json::from_slice(&bytes).ok()?;
    (valid_name(&hint.name) && hint.program.is_absolute()).then_some(hint)
}

/// Keeps `hint` under `key`. A hint is only ever an optimisation: a
/// failure (a full or read-only disk) is not reported.
pub(super) fn write(state_dir: &Path, key: &str, hint: &Hint) {
    let d = dir(state_dir);
    if std::fs::create_dir_all(&d).is_err() {
        return;
    }
    if let Ok(bytes) = serde_json::to_vec(hint) {
        let _ = crate::store::write_replace(&d.join(key), &bytes);
    }
}

/// Removes the hints that name a profile no longer in `store` (forgotten
/// since); returns how many. Hints are only ever an optimisation, so one
/// that cannot be read or removed is left.
pub(crate) fn sweep(store: &crate::store::Store) -> usize {
    let Ok(profiles) = store.names() else {
        return 0;
    };
    let Ok(rd) = std::fs::read_dir(dir(store.root())) else {
        return 0;
    };
    let mut removed = 0;
    for e in rd.flatten() {
        let Some(hint) = std::fs::read(e.path())
            .ok()
            .and_then(|b| serde_json::from_slice::<Hint>(&b).ok())
        else {
            continue;
        };
        if !profiles.contains(&hint.name) && std::fs::remove_file(e.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hint_is_kept_per_command_line_and_user() {
        let argv: Vec<String> = vec!["npm".into(), "config".into()];
        let k = key(0, &argv);
        assert_eq!(k, key(0, &argv));
        assert_ne!(k, key(1000, &argv));
        assert_ne!(k, key(0, &["npm".into(), "config list".into()]));
        assert_ne!(k, key(0, &["/usr/bin/npm".into(), "config".into()]));
        assert_eq!(k.len(), 32);
    }

    #[test]
    fn the_sweep_removes_hints_of_forgotten_profiles_only() {
        let d = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(d.path()).unwrap();
        let mut p = crate::store::Profile::new("app-1", &["app".into()]);
        store.save(&mut p).unwrap();
        let hint = |name: &str| Hint {
            name: name.into(),
            program: "/bin/app".into(),
        };
        write(d.path(), "k1", &hint("app-1"));
        write(d.path(), "k2", &hint("gone-1"));
        std::fs::write(dir(d.path()).join("k3"), b"not a hint").unwrap();
        assert_eq!(sweep(&store), 1);
        assert_eq!(read(d.path(), "k1"), Some(hint("app-1")));
        assert_eq!(read(d.path(), "k2"), None);
        assert!(dir(d.path()).join("k3").exists());
    }

    #[test]
    fn hints_round_trip_and_bad_ones_are_ignored() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(read(d.path(), "k"), None);
        let h = Hint {
            name: "npm-u0-00".into(),
            program: "/usr/lib/node_modules/npm/bin/npm-cli.js".into(),
        };
        write(d.path(), "k", &h);
        assert_eq!(read(d.path(), "k"), Some(h));
        // Not JSON, a name that could leave the store, a relative program.
        for bad in [
            &b"{"[..],
            br#"{"name":"../x","program":"/bin/x"}"#,
            br#"{"name":"x","program":"bin/x"}"#,
        ] {
            std::fs::write(dir(d.path()).join("k"), bad).unwrap();
            assert_eq!(read(d.path(), "k"), None);
        }
    }
}
