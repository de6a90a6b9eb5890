//! Making a launch cold without flushing the whole system: drop the page
//! cache of the launch's own files (POSIX_FADV_DONTNEED), known from a
//! trace or a plan. Dropping every cache is available, but only on request.
//!
//! The paths come from a trace, which a user may have written: each is
//! opened through [`warmstart_sys::open`], so a path that now names a
//! FIFO, a device or a symlink is skipped without being opened.

/// Evicts each path's cached pages. Dirty pages are not written here, so
/// they stay (warmstart never writes to an application's files). Returns
/// how many files were evicted; anything but a readable regular file is
/// skipped.
pub fn evict_files<'a>(paths: impl IntoIterator<Item = &'a str>) -> usize {
    paths
        .into_iter()
        .filter(|p| warmstart_sys::fadvise::evict(p).is_ok())
        .count()
}

/// Drops the whole page cache, dentries and inodes (needs root). This
/// slows every other program on the machine until it re-reads its data.
pub fn drop_all_caches() -> std::io::Result<()> {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3")
}

/// Evicts the block-device pages holding metadata of the given devices
/// (st_rdev numbers), where udev's `/dev/block/MAJ:MIN` link names that
/// very block device.
pub fn evict_devices(devices: impl IntoIterator<Item = u64>) -> usize {
    devices
        .into_iter()
        .filter(|&d| {
            let node = format!("/dev/block/{}:{}", libc::major(d), libc::minor(d));
            warmstart_sys::fadvise::evict_device(node, d).is_ok()
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_are_evicted() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("f");
        std::fs::write(&f, b"x").unwrap();
        let null = d.path().join("null");
        std::os::unix::fs::symlink("/dev/null", &null).unwrap();
        let paths = [
            f.to_str().unwrap(),
            null.to_str().unwrap(),
            d.path().to_str().unwrap(),
            "/nonexistent",
        ];
        assert_eq!(evict_files(paths), 1);
    }
}
