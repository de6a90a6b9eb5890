//! Making a launch cold without flushing the whole system: drop the page
//! cache of the launch's own files (POSIX_FADV_DONTNEED), known from a
//! trace or a plan. Dropping every cache is available, but only on request.

use std::fs::File;
use std::os::fd::AsRawFd;

/// Evicts each path's cached pages. Dirty pages are not written here, so
/// they stay (warmstart never writes to an application's files). Returns
/// how many files were evicted; unreadable ones are skipped.
pub fn evict_files<'a>(paths: impl IntoIterator<Item = &'a str>) -> usize {
    let mut n = 0;
    for p in paths {
        let Ok(f) = File::open(p) else { continue };
        // SAFETY: fadvise on a descriptor we own; no memory is passed.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if rc == 0 {
            n += 1;
        }
    }
    n
}

/// Drops the whole page cache, dentries and inodes (needs root). This
/// slows every other program on the machine until it re-reads its data.
pub fn drop_all_caches() -> std::io::Result<()> {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3")
}

/// Evicts the block-device pages holding metadata of the given devices
/// (st_rdev numbers), where the device node can be opened.
pub fn evict_devices(devices: impl IntoIterator<Item = u64>) -> usize {
    let mut n = 0;
    for d in devices {
        let path = format!("/dev/block/{}:{}", libc::major(d), libc::minor(d));
        let Ok(f) = File::open(&path) else { continue };
        // SAFETY: fadvise on a descriptor we own; no memory is passed.
        if unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) } == 0 {
            n += 1;
        }
    }
    n
}
