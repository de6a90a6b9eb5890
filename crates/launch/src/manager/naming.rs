//! Profile names: which launches share a profile, and the program a
//! command line runs.

use std::path::{Path, PathBuf};

/// The profile name for a command run by this process's user: see
/// [`profile_name_for`].
pub fn profile_name(argv: &[String]) -> String {
    // SAFETY: geteuid has no preconditions.
    profile_name_for(unsafe { libc::geteuid() }, argv)
}

/// The profile name for a command run by `uid`: the executable's base
/// name (at most 64 characters), the user, and a digest of the resolved
/// executable and the arguments, so `python3 a.py` and `python3 b.py` are
/// different launches and one user's launches never decide what is read
/// for another's. The digest is SHA-256 cut to 128 bits: a CRC could be
/// forged to collide with another command's profile.
pub fn profile_name_for(uid: u32, argv: &[String]) -> String {
    name_for(uid, &resolve_exe(&argv[0]), argv)
}

/// Characters of the program's name kept in a profile name.
const NAME_BASE_MAX: usize = 64;

/// [`profile_name_for`] for an executable already resolved.
pub(super) fn name_for(uid: u32, exe: &str, argv: &[String]) -> String {
    let base = Path::new(&argv[0])
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "cmd".into());
    let base: String = base
        .trim_start_matches('.')
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(NAME_BASE_MAX)
        .collect();
    let base = if base.is_empty() { "cmd".into() } else { base };
    let hex = digest(
        std::iter::once(exe)
            .chain(argv[1..].iter().map(String::as_str))
            .map(str::as_bytes),
    );
    format!("{base}-u{uid}-{hex}")
}

/// The first 16 bytes, in hex, of SHA-256 over `parts`, each
/// length-prefixed so that ["a", "b c"] and ["a b", "c"] differ: profile
/// names and the hints' keys.
pub(crate) fn digest<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for part in parts {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    h.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub(crate) fn resolve_exe(cmd: &str) -> String {
    canonical(find_program(cmd).as_deref(), cmd)
}

pub(super) fn canonical(found: Option<&Path>, cmd: &str) -> String {
    let p = found.unwrap_or(Path::new(cmd));
    std::fs::canonicalize(p)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| p.display().to_string())
}

/// The file `execvp` would run for `cmd`: `cmd` itself if it names a path,
/// else the first executable regular file of that name in PATH.
pub(crate) fn find_program(cmd: &str) -> Option<PathBuf> {
    if cmd.contains('/') {
        return Some(PathBuf::from(cmd));
    }
    let path = std::env::var_os("PATH")?;
    let candidates: Vec<PathBuf> = std::env::split_paths(&path)
        .filter(|d| !d.as_os_str().is_empty())
        .map(|d| d.join(cmd))
        .collect();
    first_program(&candidates)
}

/// What walking a command's program gives: the file `execvp` will run,
/// that file with symlinks resolved, and the profile name.
#[derive(Debug, Clone)]
pub(super) struct Walked {
    pub program: Option<PathBuf>,
    pub canonical: String,
    pub name: String,
}

fn walk(uid: u32, text: &[String]) -> Walked {
    let program = find_program(&text[0]);
    let canonical = canonical(program.as_deref(), &text[0]);
    let name = name_for(uid, &canonical, text);
    Walked {
        program,
        canonical,
        name,
    }
}

/// A command's walk, done now or on a thread of its own and waited for
/// when first needed.
pub(super) struct Walk {
    pending: std::cell::Cell<Option<std::thread::JoinHandle<Walked>>>,
    done: std::cell::OnceCell<Walked>,
}

impl Walk {
    /// Walks now.
    pub fn now(uid: u32, text: &[String]) -> Walk {
        let w = Walk {
            pending: std::cell::Cell::new(None),
            done: std::cell::OnceCell::new(),
        };
        let _ = w.done.set(walk(uid, text));
        w
    }

    /// Walks on a thread of its own (now, if no thread can be started).
    pub fn beside(uid: u32, text: &[String]) -> Walk {
        let owned = text.to_vec();
        match std::thread::Builder::new()
            .name("walk".into())
            .spawn(move || walk(uid, &owned))
        {
            Ok(h) => Walk {
                pending: std::cell::Cell::new(Some(h)),
                done: std::cell::OnceCell::new(),
            },
            Err(_) => Walk::now(uid, text),
        }
    }

    /// The walk's result, waiting for it if it is still under way.
    pub fn get(&self) -> &Walked {
        self.done.get_or_init(|| {
            let h = self.pending.take().expect("a walk not done is under way");
            // A walk that panicked would have panicked in line too.
            h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))
        })
    }
}

/// Candidates looked up side by side at most, each on its own thread.
const LOOKUPS_AT_ONCE: usize = 16;

/// The first of `candidates` that is an executable regular file.
///
/// On a cold cache each PATH entry that lacks the program is a directory
/// read from storage, one after another, and the launch's replay cannot
/// start before the program is named: `npm` through this machine's 12
/// entries took 5.7–14.6 ms on the ext4 testbed. So the candidates are
/// asked of the dentry cache first, in order, and from the first one it
/// cannot answer on, looked up all at once; the first in PATH order still
/// wins, as it would for `execvp`.
fn first_program(candidates: &[PathBuf]) -> Option<PathBuf> {
    use warmstart_sys::cached::{stat_cached, Cached};
    for (i, c) in candidates.iter().enumerate() {
        match stat_cached(c) {
            Cached::Found(m) if is_program(&m) => return Some(c.clone()),
            Cached::Found(_) | Cached::Missing => {}
            Cached::Unknown => return first_program_at_once(&candidates[i..]),
        }
    }
    None
}

/// [`first_program`] with every lookup issued at once, in batches of
/// [`LOOKUPS_AT_ONCE`]. A thread that cannot be started is done in line.
fn first_program_at_once(candidates: &[PathBuf]) -> Option<PathBuf> {
    let found = |c: &PathBuf| std::fs::metadata(c).is_ok_and(|m| is_program(&m));
    for batch in candidates.chunks(LOOKUPS_AT_ONCE) {
        let hits: Vec<bool> = std::thread::scope(|s| {
            let pending: Vec<Result<_, bool>> = batch
                .iter()
                .map(|c| {
                    std::thread::Builder::new()
                        .stack_size(64 << 10)
                        .spawn_scoped(s, move || found(c))
                        .map_err(|_| found(c))
                })
                .collect();
            pending
                .into_iter()
                .map(|p| match p {
                    Ok(h) => h.join().unwrap_or(false),
                    Err(done) => done,
                })
                .collect()
        });
        if let Some(i) = hits.iter().position(|&h| h) {
            return Some(batch[i].clone());
        }
    }
    None
}

fn is_program(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt;
    m.is_file() && m.permissions().mode() & 0o111 != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::valid_name;

    #[test]
    fn profile_names_separate_arguments() {
        let a = profile_name(&["sh".into(), "a.sh".into()]);
        let b = profile_name(&["sh".into(), "b.sh".into()]);
        assert_ne!(a, b);
        assert!(a.starts_with("sh-"));
        assert!(valid_name(&a));
        assert!(valid_name(&profile_name(&["./weird name!".into()])));
        // Argument boundaries count.
        assert_ne!(
            profile_name(&["sh".into(), "a".into(), "b c".into()]),
            profile_name(&["sh".into(), "a b".into(), "c".into()])
        );
    }

    #[test]
    fn profile_names_are_per_user_and_always_valid() {
        let argv: Vec<String> = vec!["/bin/sh".into(), "x".into()];
        let root = profile_name_for(0, &argv);
        let user = profile_name_for(1000, &argv);
        assert_ne!(root, user);
        assert!(root.starts_with("sh-u0-") && user.starts_with("sh-u1000-"));
        // Same command, same user: same profile.
        assert_eq!(user, profile_name_for(1000, &argv));
        // A very long or empty program name still gives a valid name.
        for exe in ["x".repeat(300), "...".into(), "é".repeat(100)] {
            let n = profile_name_for(u32::MAX, std::slice::from_ref(&exe));
            assert!(valid_name(&n), "{exe:?} -> {n:?}");
        }
    }

    /// Dirs a–e under `root`: a lacks `tool`, b's is not executable, c's
    /// is a directory, d's and e's are programs.
    fn path_dirs(root: &Path) -> Vec<PathBuf> {
        use std::os::unix::fs::PermissionsExt;
        let dirs: Vec<PathBuf> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|d| root.join(d))
            .collect();
        for d in &dirs {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(dirs[1].join("tool"), b"#!/bin/sh\n").unwrap();
        std::fs::create_dir(dirs[2].join("tool")).unwrap();
        for d in &dirs[3..] {
            std::fs::write(d.join("tool"), b"#!/bin/sh\n").unwrap();
            std::fs::set_permissions(d.join("tool"), std::fs::Permissions::from_mode(0o755))
                .unwrap();
        }
        dirs
    }

    #[test]
    fn a_walk_beside_names_what_a_walk_now_names() {
        let argv: Vec<String> = vec!["sh".into(), "-c".into(), "true".into()];
        let (now, beside) = (Walk::now(7, &argv), Walk::beside(7, &argv));
        let (a, b) = (now.get(), beside.get());
        assert_eq!(
            (&a.program, &a.canonical, &a.name),
            (&b.program, &b.canonical, &b.name)
        );
        assert!(a.name.starts_with("sh-u7-"), "{a:?}");
        assert!(a.program.is_some(), "sh is on PATH");
    }

    #[test]
    fn the_path_search_finds_the_first_program_whichever_way_it_looks() {
        let d = tempfile::tempdir().unwrap();
        let tools: Vec<PathBuf> = path_dirs(d.path()).iter().map(|d| d.join("tool")).collect();
        assert_eq!(first_program(&tools), Some(tools[3].clone()));
        assert_eq!(first_program_at_once(&tools), Some(tools[3].clone()));
        assert_eq!(first_program(&tools[..3]), None);
        assert_eq!(first_program_at_once(&tools[..3]), None);
        // More candidates than one batch: the program is in the third.
        let mut many: Vec<PathBuf> = (0..2 * LOOKUPS_AT_ONCE + 3)
            .map(|i| d.path().join(format!("missing-{i}")).join("tool"))
            .collect();
        many.extend_from_slice(&tools[1..]);
        assert_eq!(first_program_at_once(&many), Some(tools[3].clone()));
        assert_eq!(first_program(&many), Some(tools[3].clone()));
    }

    #[test]
    fn root_a_cold_path_search_looks_up_at_once_and_finds_the_same_program() {
        use warmstart_sys::cached::{stat_cached, Cached};
        use warmstart_testbed::{Fs, Testbed, TestbedSpec};
        if !warmstart_testing::require_root(
            "root_a_cold_path_search_looks_up_at_once_and_finds_the_same_program",
        ) {
            return;
        }
        let cache = tempfile::tempdir().unwrap();
        let src = tempfile::tempdir_in("/var/tmp").unwrap();
        path_dirs(src.path());
        let mut spec = TestbedSpec::new(Fs::Ext4);
        spec.contents = vec![PathBuf::from("/etc/hostname"), src.path().to_path_buf()];
        spec.cache_dir = cache.path().to_path_buf();
        let tb = Testbed::prepare(spec).unwrap();
        let inside = tb.root().join(src.path().strip_prefix("/").unwrap());
        let tools: Vec<PathBuf> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|d| inside.join(d).join("tool"))
            .collect();
        tb.drop_caches().unwrap();
        // Cold: the cache cannot answer, so the lookups go out at once.
        assert!(matches!(stat_cached(&tools[0]), Cached::Unknown));
        assert_eq!(first_program(&tools), Some(tools[3].clone()));
        // Warm: every candidate is answered from the cache, in order.
        assert!(matches!(stat_cached(&tools[0]), Cached::Missing));
        assert!(matches!(stat_cached(&tools[3]), Cached::Found(_)));
        assert_eq!(first_program(&tools), Some(tools[3].clone()));
    }
}
