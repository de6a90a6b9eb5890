//! The OS boundary of the bench: physical addresses (FIEMAP) for the sorted
//! peer, page-cache residency (mincore) to check that a cold start is
//! cold, process-tree cleanup, and keeping a recorded launch's output off
//! the terminal.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// `FS_IOC_FIEMAP` = `_IOWR('f', 11, struct fiemap)` with the 32-byte
/// header of `<linux/fiemap.h>`.
const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
/// `FIEMAP_FLAG_SYNC`: flush delayed allocations so the extents are real.
const FIEMAP_FLAG_SYNC: u32 = 1;
/// Extents asked for per call.
const FIEMAP_BATCH: usize = 256;

/// `struct fiemap_extent`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct FiemapExtent {
    fe_logical: u64,
    fe_physical: u64,
    fe_length: u64,
    fe_reserved64: [u64; 2],
    fe_flags: u32,
    fe_reserved: [u32; 3],
}

/// `struct fiemap` followed by its extent array.
#[repr(C)]
struct Fiemap {
    fm_start: u64,
    fm_length: u64,
    fm_flags: u32,
    fm_mapped_extents: u32,
    fm_extent_count: u32,
    fm_reserved: u32,
    fm_extents: [FiemapExtent; FIEMAP_BATCH],
}

/// `FIEMAP_EXTENT_LAST`.
const FIEMAP_EXTENT_LAST: u32 = 1;

/// A file's extents: (logical, physical, length), sorted by logical.
pub fn fiemap(path: &str) -> io::Result<Vec<(u64, u64, u64)>> {
    let f = File::open(path)?;
    let mut out = Vec::new();
    let mut start = 0u64;
    loop {
        let mut fm = Box::new(Fiemap {
            fm_start: start,
            fm_length: u64::MAX - start,
            fm_flags: FIEMAP_FLAG_SYNC,
            fm_mapped_extents: 0,
            fm_extent_count: FIEMAP_BATCH as u32,
            fm_reserved: 0,
            fm_extents: [FiemapExtent::default(); FIEMAP_BATCH],
        });
        // SAFETY: `fm` is a properly sized, initialised struct fiemap with
        // room for fm_extent_count extents; the fd is open for the call.
        let rc = unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_FIEMAP, &mut *fm as *mut Fiemap) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        let n = (fm.fm_mapped_extents as usize).min(FIEMAP_BATCH);
        if n == 0 {
            break;
        }
        let mut last = false;
        for e in &fm.fm_extents[..n] {
            out.push((e.fe_logical, e.fe_physical, e.fe_length));
            last |= e.fe_flags & FIEMAP_EXTENT_LAST != 0;
        }
        let e = fm.fm_extents[n - 1];
        if last || n < FIEMAP_BATCH {
            break;
        }
        start = e.fe_logical + e.fe_length;
    }
    Ok(out)
}

/// Physical address of `offset` within a file's extents.
pub fn physical_in(extents: &[(u64, u64, u64)], offset: u64) -> Option<u64> {
    let i = extents.partition_point(|e| e.0 + e.2 <= offset);
    let &(logical, physical, len) = extents.get(i)?;
    (offset >= logical && offset < logical + len).then(|| physical + (offset - logical))
}

/// A FIEMAP lookup with one ioctl sequence per file, for the compiler's
/// `physical` callback (called once per range).
#[derive(Default)]
pub struct PhysicalMap {
    cache: RefCell<HashMap<String, Extents>>,
}

/// (logical, physical, length) of each extent of a file.
type Extents = Vec<(u64, u64, u64)>;

impl PhysicalMap {
    pub fn lookup(&self, path: &str, offset: u64) -> Option<u64> {
        let mut c = self.cache.borrow_mut();
        let ext = c
            .entry(path.to_string())
            .or_insert_with(|| fiemap(path).unwrap_or_default());
        physical_in(ext, offset)
    }
}

/// Of the byte ranges given per file, how many bytes are in the page cache
/// and how many there are, by mincore. Opening the files warms their inodes
/// and dentries, which is why the bench only checks when asked.
pub fn residency(files: &[(String, Vec<(u64, u64)>)]) -> (u64, u64) {
    let page = 4096u64;
    let (mut resident, mut total) = (0u64, 0u64);
    for (path, ranges) in files {
        let Ok(f) = File::open(path) else { continue };
        let Ok(size) = f.metadata().map(|m| m.len()) else {
            continue;
        };
        if size == 0 {
            continue;
        }
        // SAFETY: a read-only shared mapping of a file we hold open; it is
        // never dereferenced, only passed to mincore, and unmapped below.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size as usize,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            continue;
        }
        let pages = size.div_ceil(page) as usize;
        let mut vec = vec![0u8; pages];
        // SAFETY: `addr` maps `size` bytes and `vec` has one byte per page.
        let rc = unsafe { libc::mincore(addr, size as usize, vec.as_mut_ptr()) };
        if rc == 0 {
            for &(off, len) in ranges {
                let first = (off / page) as usize;
                let end = (off + len).min(size).div_ceil(page) as usize;
                for v in vec.iter().take(end.min(pages)).skip(first) {
                    total += page;
                    if v & 1 != 0 {
                        resident += page;
                    }
                }
            }
        }
        // SAFETY: unmapping exactly the mapping made above.
        unsafe { libc::munmap(addr, size as usize) };
    }
    (resident, total)
}

/// Every descendant of `pid` (not `pid` itself), from `/proc`.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut parent: Vec<(u32, u32)> = Vec::new();
    if let Ok(d) = std::fs::read_dir("/proc") {
        for e in d.flatten() {
            let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
                continue;
            };
            // The command name may contain spaces and parentheses: the
            // fields after the last ')' are fixed.
            if let Some(rest) = stat.rsplit_once(')').map(|x| x.1) {
                if let Some(pp) = rest.split_whitespace().nth(1).and_then(|x| x.parse().ok()) {
                    parent.push((p, pp));
                }
            }
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        for &(c, pp) in &parent {
            if pp == p && !out.contains(&c) {
                out.push(c);
                frontier.push(c);
            }
        }
    }
    out
}

/// Sends `sig` to `pid` and all its descendants.
pub fn signal_tree(pid: u32, sig: i32) {
    for p in descendants(pid).into_iter().chain([pid]) {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(p as i32, sig) };
    }
}

/// Sends `sig` to a process group.
pub fn signal_group(pgid: u32, sig: i32) {
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(-(pgid as i32), sig) };
}

/// A pidfd for `pid` (Linux 5.3, commit 32fcb426ec00 "pid: add
/// pidfd_open()"): readable once the process exits, even before it is
/// reaped, so the exit can be timed by a thread that does not own the
/// child.
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: a plain syscall with integer arguments.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this new descriptor to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Waits until `fd` is readable or `until` passes; returns whether it is.
pub fn wait_readable(fd: &OwnedFd, until: Instant) -> bool {
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = left.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut p, 1, ms) };
        if rc > 0 {
            return true;
        }
        if rc == 0 || left == Duration::ZERO {
            return false;
        }
        // EINTR: poll again.
    }
}

/// A pipe (read end, write end), both close-on-exec.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned here.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Points stdout and stderr at /dev/null (or a pipe) until dropped. A recorded launch
/// (the recorder forks the command with our descriptors) must not print
/// into the results table; the bench prints nothing while it runs.
pub struct Silence {
    saved: Vec<(RawFd, OwnedFd)>,
}

impl Silence {
    /// Sends stdout and stderr to `to`, or to /dev/null.
    pub fn new(to: Option<&OwnedFd>) -> io::Result<Silence> {
        let null = File::options().write(true).open("/dev/null")?;
        let target = to.map_or(null.as_raw_fd(), |f| f.as_raw_fd());
        let mut saved = Vec::new();
        for fd in [1, 2] {
            // SAFETY: dup of a standard descriptor; the copy is owned below.
            let copy = unsafe { libc::dup(fd) };
            if copy < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: `copy` is a fresh descriptor we own.
            saved.push((fd, unsafe { OwnedFd::from_raw_fd(copy) }));
            // SAFETY: dup2 onto a standard descriptor; both are open.
            if unsafe { libc::dup2(target, fd) } < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(Silence { saved })
    }
}

impl Drop for Silence {
    fn drop(&mut self) {
        for (fd, copy) in &self.saved {
            // SAFETY: restoring a standard descriptor from our saved copy.
            unsafe { libc::dup2(copy.as_raw_fd(), *fd) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn physical_lookup_in_extents() {
        let ext = [(0, 1_000_000, 8192), (8192, 5_000_000, 4096)];
        for (off, want) in [
            (0, Some(1_000_000)),
            (4096, Some(1_004_096)),
            (8192, Some(5_000_000)),
            (12287, Some(5_004_095)),
            (12288, None),
        ] {
            assert_eq!(physical_in(&ext, off), want, "{off}");
        }
        assert_eq!(physical_in(&[(4096, 7, 10)], 0), None);
    }

    #[test]
    fn residency_of_a_written_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, vec![1u8; 64 * 1024]).unwrap();
        let path = p.display().to_string();
        // Just written: every page is cached.
        let (res, total) = residency(&[(path.clone(), vec![(0, 64 * 1024)])]);
        assert_eq!(total, 64 * 1024);
        assert_eq!(res, total);
        // Ranges are clipped to the file.
        let (_, total) = residency(&[(path, vec![(60 * 1024, 1 << 20)])]);
        assert_eq!(total, 4096);
    }

    #[test]
    fn descendants_of_a_shell() {
        let mut c = std::process::Command::new("sh")
            .args(["-c", "sleep 5 & wait"])
            .spawn()
            .unwrap();
        let pid = c.id();
        let deadline = Instant::now() + Duration::from_secs(5);
        while descendants(pid).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(descendants(pid).len(), 1);
        signal_tree(pid, libc::SIGKILL);
        c.wait().unwrap();
    }

    #[test]
    fn pidfd_turns_readable_on_exit() {
        let mut c = std::process::Command::new("sleep")
            .arg("0.05")
            .spawn()
            .unwrap();
        let fd = pidfd_open(c.id()).unwrap();
        assert!(wait_readable(&fd, Instant::now() + Duration::from_secs(5)));
        c.wait().unwrap();
    }
}
