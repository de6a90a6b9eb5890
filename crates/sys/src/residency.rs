//! How much of a file's range is in the page cache.
//!
//! Two kernel answers, which differ:
//! - `mincore` on a mapping counts pages that are up to date, readable
//!   without I/O. That is residency. Mapping does not fault pages in.
//! - `cachestat(2)` (Linux 6.5, commit cf264e1329fb "cachestat: implement
//!   cachestat syscall") needs no mapping and also counts pages readahead
//!   has inserted and is still reading; it says "being fetched", not
//!   "readable now". It refuses (`EPERM`) files the caller could not
//!   write, where `mincore` would claim every page resident; root is never
//!   refused.
//!
//! [`resident`] is the first, [`cached`] the second (or `None` where the
//! kernel or the filesystem lacks it), [`cached_or_resident`] the cheap
//! one where it exists.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU8, Ordering};

/// `cachestat(2)`'s number on every architecture with the unified syscall
/// table, which is all of Rust's Linux targets; libc does not export it.
const SYS_CACHESTAT: libc::c_long = 451;

/// `struct cachestat_range` from `<linux/mman.h>`.
#[repr(C)]
struct CachestatRange {
    off: u64,
    len: u64,
}

/// `struct cachestat` from `<linux/mman.h>`.
#[repr(C)]
#[derive(Default)]
struct Cachestat {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

/// mincore is asked in windows of this many bytes, bounding the mapping
/// and the result vector.
const MINCORE_WINDOW: u64 = 256 << 20;

const UNKNOWN: u8 = 0;
const PRESENT: u8 = 1;
const ABSENT: u8 = 2;
/// Whether this kernel has cachestat, learned on first use.
static CACHESTAT: AtomicU8 = AtomicU8::new(UNKNOWN);

/// Pages of a range: how many, and how many are in the cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PageCount {
    pub resident: u64,
    pub pages: u64,
}

impl PageCount {
    /// The resident share, 1.0 for an empty range.
    pub fn fraction(&self) -> f64 {
        if self.pages == 0 {
            1.0
        } else {
            self.resident as f64 / self.pages as f64
        }
    }
}

/// The system page size.
pub fn page_size() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

/// The pages [first, last) covering `len` bytes at `offset`, clipped to
/// `size`; None when nothing of the range is below it.
fn page_span(size: u64, offset: u64, len: u64) -> Option<(u64, u64, u64)> {
    let page = page_size();
    let end = offset.saturating_add(len).min(size);
    if offset >= end {
        return None;
    }
    Some((offset / page, end.div_ceil(page), page))
}

/// mincore's vector for `n` pages from page `first`: one byte per page,
/// bit 0 set where the page is up to date.
fn mincore_window(file: &File, first: u64, n: u64, page: u64) -> io::Result<Vec<u8>> {
    let len =
        usize::try_from(n * page).map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
    let off = libc::off_t::try_from(first * page)
        .map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
    // SAFETY: a fresh shared read-only mapping placed by the kernel; it
    // aliases no Rust object, is never dereferenced, and is unmapped
    // below. Mapping does not fault pages in.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            off,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let mut vec = vec![0u8; n as usize];
    // SAFETY: `addr..addr+len` is the mapping made above and `vec` has one
    // byte per page of it, as mincore requires.
    let r = unsafe { libc::mincore(addr, len, vec.as_mut_ptr()) };
    let err = io::Error::last_os_error();
    // SAFETY: unmaps exactly the mapping made above; nothing refers to it.
    unsafe { libc::munmap(addr, len) };
    if r < 0 {
        return Err(err);
    }
    Ok(vec)
}

/// Up-to-date pages of the range, by `mincore`.
pub fn resident(file: &File, offset: u64, len: u64) -> io::Result<PageCount> {
    resident_in(file, file.metadata()?.len(), offset, len)
}

/// [`resident`] of a file or block device whose end the caller knows:
/// `size` clips the range (a block device's `st_size` is 0, and a caller
/// asking many times saves an `fstat` each).
pub fn resident_in(file: &File, size: u64, offset: u64, len: u64) -> io::Result<PageCount> {
    let Some((first, last, page)) = page_span(size, offset, len) else {
        return Ok(PageCount::default());
    };
    let mut resident = 0;
    let mut p = first;
    while p < last {
        let n = (last - p).min(MINCORE_WINDOW / page);
        resident += mincore_window(file, p, n, page)?
            .iter()
            .filter(|&&b| b & 1 != 0)
            .count() as u64;
        p += n;
    }
    Ok(PageCount {
        resident,
        pages: last - first,
    })
}

/// Runs of up-to-date pages of the whole file, as (first page, count),
/// by `mincore` (what a recording without tracing reports as used).
pub fn resident_runs(file: &File) -> io::Result<Vec<(u64, u64)>> {
    let size = file.metadata()?.len();
    let page = page_size();
    let mut runs: Vec<(u64, u64)> = Vec::new();
    let mut p = 0;
    let last = size.div_ceil(page);
    while p < last {
        let n = (last - p).min(MINCORE_WINDOW / page);
        let bits = mincore_window(file, p, n, page)?;
        for (i, b) in bits.iter().enumerate() {
            if b & 1 == 0 {
                continue;
            }
            let index = p + i as u64;
            match runs.last_mut() {
                Some((first, count)) if *first + *count == index => *count += 1,
                _ => runs.push((index, 1)),
            }
        }
        p += n;
    }
    Ok(runs)
}

/// Pages of the range in the cache, reads in flight included, by
/// `cachestat`; `None` where the kernel (before 6.5) or the filesystem
/// (hugetlbfs) does not answer it.
pub fn cached(file: &File, offset: u64, len: u64) -> io::Result<Option<PageCount>> {
    if CACHESTAT.load(Ordering::Relaxed) == ABSENT {
        return Ok(None);
    }
    cached_in(file, file.metadata()?.len(), offset, len)
}

/// [`cached`] of a file or block device whose end the caller knows (see
/// [`resident_in`]). An error is what the kernel refused: `EPERM` means the
/// caller could not write the file, where [`resident_in`] would claim every
/// page resident.
pub fn cached_in(file: &File, size: u64, offset: u64, len: u64) -> io::Result<Option<PageCount>> {
    if CACHESTAT.load(Ordering::Relaxed) == ABSENT {
        return Ok(None);
    }
    let Some((first, last, page)) = page_span(size, offset, len) else {
        return Ok(Some(PageCount::default()));
    };
    let cs = match cachestat(file, first * page, (last - first) * page) {
        Ok(cs) => cs,
        Err(e) => {
            return match e.raw_os_error() {
                Some(libc::ENOSYS) => {
                    CACHESTAT.store(ABSENT, Ordering::Relaxed);
                    Ok(None)
                }
                Some(libc::EOPNOTSUPP) => Ok(None),
                // EPERM is the kernel's answer for a file the caller may not
                // write, or a seccomp filter's for the call itself (a systemd
                // unit whose SystemCallFilter lacks cachestat answers every
                // call so): asked once of a file of its own, the filter is
                // told apart and the call counted missing, not failed.
                Some(libc::EPERM) if cachestat_filtered() => {
                    CACHESTAT.store(ABSENT, Ordering::Relaxed);
                    Ok(None)
                }
                _ => Err(e),
            };
        }
    };
    CACHESTAT.store(PRESENT, Ordering::Relaxed);
    let pages = last - first;
    Ok(Some(PageCount {
        resident: cs.nr_cache.min(pages),
        pages,
    }))
}

/// Whether cachestat is refused even on a file this process made and may
/// write (a memfd): then a filter refuses the call, not the file.
fn cachestat_filtered() -> bool {
    // SAFETY: a NUL-terminated name and flags; returns a new descriptor or -1.
    let fd = unsafe { libc::memfd_create(c"ws-cachestat".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return false;
    }
    // SAFETY: memfd_create returned a descriptor that nothing else owns.
    let f = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    cachestat(&f, 0, 0).is_err_and(|e| e.raw_os_error() == Some(libc::EPERM))
}

/// `cachestat(2)` of `len` bytes at `off` (0: to the end).
fn cachestat(file: &File, off: u64, len: u64) -> io::Result<Cachestat> {
    let range = CachestatRange { off, len };
    let mut cs = Cachestat::default();
    // SAFETY: cachestat reads one struct cachestat_range and writes one
    // struct cachestat; both are live #[repr(C)] locals, and the
    // descriptor is borrowed for the call.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const CachestatRange,
            &mut cs as *mut Cachestat,
            0u32,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cs)
}

/// [`cached`] where the kernel has it, else [`resident`].
pub fn cached_or_resident(file: &File, offset: u64, len: u64) -> io::Result<PageCount> {
    match cached(file, offset, len)? {
        Some(c) => Ok(c),
        None => resident(file, offset, len),
    }
}

/// Whether this kernel answered cachestat (None: not asked yet).
pub fn has_cachestat() -> Option<bool> {
    match CACHESTAT.load(Ordering::Relaxed) {
        PRESENT => Some(true),
        ABSENT => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_file_is_resident_and_ranges_are_clipped() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, vec![1u8; 64 * 1024]).unwrap();
        let f = crate::open(&p).unwrap().file;
        let page = page_size();
        let all = resident(&f, 0, 64 * 1024).unwrap();
        assert_eq!(all.pages, 64 * 1024 / page);
        assert_eq!(all.resident, all.pages);
        assert_eq!(all.fraction(), 1.0);
        // Clipped to the file's end.
        let tail = resident(&f, 64 * 1024 - page, 1 << 20).unwrap();
        assert_eq!(tail.pages, 1);
        assert_eq!(resident(&f, 1 << 20, 4096).unwrap(), PageCount::default());
        // Clipped where the caller says the file ends (a block device's
        // st_size is 0, so its caller passes the device's size).
        let two = PageCount {
            resident: 2,
            pages: 2,
        };
        assert_eq!(resident_in(&f, 2 * page, 0, u64::MAX).unwrap(), two);
        assert_eq!(
            resident_in(&f, 0, 0, u64::MAX).unwrap(),
            PageCount::default()
        );
        if let Some(c) = cached_in(&f, 2 * page - 1, 0, u64::MAX).unwrap() {
            assert_eq!(c, two);
        }
        // cachestat agrees where it exists.
        let c = cached_or_resident(&f, 0, u64::MAX).unwrap();
        assert_eq!(c, all);
        if let Some(c) = cached(&f, 0, 64 * 1024).unwrap() {
            assert_eq!(c, all);
            assert_eq!(has_cachestat(), Some(true));
        }
    }

    #[test]
    fn runs_of_resident_pages() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        let page = page_size();
        std::fs::write(&p, vec![1u8; 8 * page as usize]).unwrap();
        let f = crate::open(&p).unwrap().file;
        // Just written: every page is cached, one run.
        assert_eq!(resident_runs(&f).unwrap(), vec![(0, 8)]);
    }

    #[test]
    fn an_empty_file_has_no_pages() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, b"").unwrap();
        let f = crate::open(&p).unwrap().file;
        assert_eq!(resident(&f, 0, u64::MAX).unwrap(), PageCount::default());
        assert_eq!(cached_or_resident(&f, 0, u64::MAX).unwrap().pages, 0);
    }
}
