//! `posix_fadvise` on descriptors and on recorded paths: ask the kernel to
//! read a range now (`WILLNEED`), to drop a file's clean cached pages
//! (`DONTNEED`, how warmstart makes one launch cold without flushing the
//! machine), or not to read ahead around our own requests (`RANDOM`).

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;

use crate::{Error, OpenOptions};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advice {
    WillNeed,
    DontNeed,
    Random,
    Sequential,
}

impl Advice {
    fn raw(self) -> libc::c_int {
        match self {
            Advice::WillNeed => libc::POSIX_FADV_WILLNEED,
            Advice::DontNeed => libc::POSIX_FADV_DONTNEED,
            Advice::Random => libc::POSIX_FADV_RANDOM,
            Advice::Sequential => libc::POSIX_FADV_SEQUENTIAL,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Advice::WillNeed => "WILLNEED",
            Advice::DontNeed => "DONTNEED",
            Advice::Random => "RANDOM",
            Advice::Sequential => "SEQUENTIAL",
        }
    }
}

/// Advises on `len` bytes at `offset` (`len` 0: to the end of the file).
/// An offset or length beyond `off_t` is refused (`EOVERFLOW`) rather than
/// read as "to the end": a hostile plan must not turn into a whole-file
/// read.
pub fn advise(fd: impl AsFd, offset: u64, len: u64, advice: Advice) -> io::Result<()> {
    let overflow = || io::Error::from_raw_os_error(libc::EOVERFLOW);
    let off = libc::off_t::try_from(offset).map_err(|_| overflow())?;
    let len = libc::off_t::try_from(len).map_err(|_| overflow())?;
    // SAFETY: a plain syscall on a descriptor borrowed for the call; no
    // memory is passed.
    let rc = unsafe { libc::posix_fadvise(fd.as_fd().as_raw_fd(), off, len, advice.raw()) };
    // posix_fadvise returns the error number instead of setting errno.
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Starts reading the range into the page cache without waiting for it.
pub fn willneed(fd: impl AsFd, offset: u64, len: u64) -> io::Result<()> {
    advise(fd, offset, len, Advice::WillNeed)
}

/// Drops the range's clean cached pages; dirty ones stay.
pub fn dontneed(fd: impl AsFd, offset: u64, len: u64) -> io::Result<()> {
    advise(fd, offset, len, Advice::DontNeed)
}

/// No readahead around what we ask for on this descriptor.
pub fn random(fd: impl AsFd) -> io::Result<()> {
    advise(fd, 0, 0, Advice::Random)
}

/// Drops the cached pages of a recorded file (a regular file, no final
/// symlink, opened without blocking; see [`crate::open`]).
pub fn evict(path: impl AsRef<Path>) -> Result<(), Error> {
    let path = path.as_ref();
    let o = crate::open(path)?;
    dontneed(&o.file, 0, 0).map_err(|source| Error::Fadvise {
        path: path.to_path_buf(),
        advice: Advice::DontNeed.name(),
        source,
    })
}

/// Drops the cached pages of block device `rdev` (the filesystem's
/// metadata blocks live there), through its node at `node`.
pub fn evict_device(node: impl AsRef<Path>, rdev: u64) -> Result<(), Error> {
    let node = node.as_ref();
    let o = OpenOptions::block_device(rdev).open(node)?;
    dontneed(&o.file, 0, 0).map_err(|source| Error::Fadvise {
        path: node.to_path_buf(),
        advice: Advice::DontNeed.name(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::residency;

    #[test]
    fn dontneed_empties_and_willneed_fills_the_cache() {
        // tmpfs pages cannot be dropped; /var/tmp is usually on a disk.
        let d = tempfile::Builder::new().tempdir_in("/var/tmp").unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, vec![7u8; 256 * 1024]).unwrap();
        std::fs::File::open(&p).unwrap().sync_all().unwrap();
        evict(&p).unwrap();
        let f = crate::open(&p).unwrap().file;
        let after = residency::resident(&f, 0, u64::MAX).unwrap();
        assert_eq!(after.pages, 64);
        if after.resident != 0 {
            eprintln!("SKIPPED: this filesystem keeps pages after DONTNEED");
            return;
        }
        willneed(&f, 0, 0).unwrap();
        // WILLNEED queues reads; wait on what we can observe.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while residency::resident(&f, 0, u64::MAX).unwrap().resident < 64 {
            assert!(
                std::time::Instant::now() < deadline,
                "WILLNEED never read the file"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    #[test]
    fn ranges_beyond_off_t_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, b"x").unwrap();
        let f = crate::open(&p).unwrap().file;
        for (off, len) in [(u64::MAX, 1), (0, u64::MAX), (1 << 63, 0)] {
            let e = willneed(&f, off, len).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EOVERFLOW), "{off} {len}");
        }
        willneed(&f, 0, i64::MAX as u64).unwrap();
    }

    #[test]
    fn evict_refuses_what_is_not_a_regular_file() {
        let d = tempfile::tempdir().unwrap();
        let l = d.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &l).unwrap();
        assert!(matches!(evict(&l), Err(Error::WrongKind { .. })));
        assert!(matches!(evict(d.path()), Err(Error::WrongKind { .. })));
    }
}
