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
    use sha2::{Digest, Sha256};
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
    let mut h = Sha256::new();
    // Each part length-prefixed: ["a", "b c"] and ["a b", "c"] differ.
    for part in std::iter::once(exe).chain(argv[1..].iter().map(String::as_str)) {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    let d = h.finalize();
    let hex: String = d[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("{base}-u{uid}-{hex}")
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
    use std::os::unix::fs::PermissionsExt;
    if cmd.contains('/') {
        return Some(PathBuf::from(cmd));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .filter(|d| !d.as_os_str().is_empty())
        .map(|d| d.join(cmd))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
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
}
