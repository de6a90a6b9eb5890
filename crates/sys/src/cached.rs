//! What the kernel's caches alone say about a path, without reading
//! storage.
//!
//! `openat2(O_PATH, RESOLVE_CACHED)` (Linux 5.12) walks a path only through
//! the dentry cache and fails with `EAGAIN` where a step would need a
//! directory or inode read. warmstart uses it to tell the lookups it can
//! answer at once from the ones that would wait for the disk, and to issue
//! only the latter side by side.

use std::fs::{File, Metadata};
use std::os::fd::FromRawFd;
use std::path::{Path, PathBuf};

/// The answer of a cache-only lookup.
#[derive(Debug)]
pub enum Cached {
    /// The path resolves (following symlinks); what `stat` says of it.
    Found(Metadata),
    /// The path does not resolve (a name known to be missing, a component
    /// that is not a directory, no permission): what `stat` would say too.
    Missing,
    /// Answering needs storage, or this kernel cannot look up from the
    /// cache only: ask `stat`.
    Unknown,
}

/// Why a cache-only lookup gave no answer: [`Cached::Missing`] and
/// [`Cached::Unknown`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotCached {
    Missing,
    Unknown,
}

/// `struct open_how` of openat2(2) (libc's cannot be built outside it).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// Looks `path` up in the dentry cache only, following symlinks as `stat`
/// does.
pub fn stat_cached(path: &Path) -> Cached {
    let file = match open_cached(path) {
        Ok(f) => f,
        Err(NotCached::Missing) => return Cached::Missing,
        Err(NotCached::Unknown) => return Cached::Unknown,
    };
    // fstat of an O_PATH descriptor: the inode is in memory, pinned by it.
    match file.metadata() {
        Ok(m) => Cached::Found(m),
        Err(_) => Cached::Unknown,
    }
}

/// Where `path` leads, symlinks followed, as `canonicalize` would say,
/// from the dentry cache only.
pub fn canonical_cached(path: &Path) -> Result<PathBuf, NotCached> {
    use std::os::fd::AsRawFd;
    let file = open_cached(path)?;
    // The descriptor's own path, from its dentry: no lookup.
    std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .map_err(|_| NotCached::Unknown)
}

/// `openat2(O_PATH, RESOLVE_CACHED)` of `path`.
fn open_cached(path: &Path) -> Result<File, NotCached> {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return Err(NotCached::Missing);
    };
    let how = OpenHow {
        flags: (libc::O_PATH | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: libc::RESOLVE_CACHED,
    };
    // SAFETY: a NUL-terminated path and an open_how that outlive the call,
    // with the struct's own size; the result is a new descriptor or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            c.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        return Err(match std::io::Error::last_os_error().raw_os_error() {
            // EAGAIN: a step needs storage. ENOSYS, E2BIG, EINVAL: a kernel
            // without openat2 or RESOLVE_CACHED. EPERM: a seccomp filter
            // refusing openat2 (O_PATH needs no permission on the file).
            Some(libc::EAGAIN | libc::ENOSYS | libc::E2BIG | libc::EINVAL | libc::EPERM) => {
                NotCached::Unknown
            }
            _ => NotCached::Missing,
        });
    }
    // SAFETY: openat2 returned a descriptor that nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd as i32) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_just_looked_up_is_answered_from_the_cache() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("f");
        std::fs::write(&f, b"x").unwrap();
        std::fs::metadata(&f).unwrap();
        match stat_cached(&f) {
            Cached::Found(m) => assert!(m.is_file() && m.len() == 1),
            other => panic!("{other:?}"),
        }
        // Through a symlink, as stat follows it.
        let l = d.path().join("l");
        std::os::unix::fs::symlink(&f, &l).unwrap();
        std::fs::metadata(&l).unwrap();
        assert!(matches!(stat_cached(&l), Cached::Found(m) if m.is_file()));
        // And where it leads, as canonicalize says.
        assert_eq!(
            canonical_cached(&l).ok(),
            Some(std::fs::canonicalize(&f).unwrap())
        );
        // (A name known to be missing is answered so only where the file
        // system keeps negative dentries, which tmpfs does not: see the
        // root test of the PATH search on ext4.)
    }
}
