//! Page-cache residency of a range: `cachestat(2)` where it answers and
//! may be trusted, `mincore(2)` on a temporary mapping otherwise.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

use super::{page_size, RealBackend, RealHandle};
use crate::backend::Residency;
use crate::ReplayError;

/// `cachestat(2)`, added in Linux 6.5 (commit cf264e1329fb, "cachestat:
/// implement cachestat syscall"). It is 451 on every architecture that uses
/// the unified syscall table, which is all of those Rust targets; libc does
/// not export it yet.
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

pub(super) const CACHESTAT_UNKNOWN: u8 = 0;
const CACHESTAT_YES: u8 = 1;
const CACHESTAT_NO: u8 = 2;

/// mincore is queried in windows of this many bytes, bounding the mapping
/// and the result vector.
const MINCORE_WINDOW: u64 = 256 << 20;

impl RealBackend {
    /// Pages of the range in the page cache, counting those still being
    /// read: a quick "is this launch warm" that cannot end a wait (see
    /// [`crate::Backend::residency`]). One `cachestat` call instead of a mapping
    /// and `mincore`, which took ~15 µs per window on a warm launch's path;
    /// `mincore` where `cachestat` is missing.
    pub fn cached_pages(
        &self,
        h: &RealHandle,
        offset: u64,
        len: u64,
    ) -> Result<Residency, ReplayError> {
        self.pages_in_cache(h, offset, len, true)
    }

    /// The range's pages in the page cache: with `count_in_flight`, what
    /// `cachestat` counts (reads in progress included) when it answers,
    /// else what `mincore` counts (up to date only).
    pub(super) fn pages_in_cache(
        &self,
        h: &RealHandle,
        offset: u64,
        len: u64,
        count_in_flight: bool,
    ) -> Result<Residency, ReplayError> {
        let page = page_size();
        let end = offset.saturating_add(len).min(h.size);
        if offset >= end {
            return Ok(Residency::default());
        }
        let first = offset / page;
        let last = end.div_ceil(page);
        let pages = last - first;
        let err = |source| ReplayError::Residency {
            path: h.name.clone(),
            source,
        };
        // Residency means "readable without I/O", which only mincore tells:
        // it counts up-to-date pages. cachestat's nr_cache also counts the
        // folios readahead has inserted and is still reading (measured here:
        // right after a WILLNEED of 8 MiB it reports all 2048 pages while
        // mincore sees a quarter of them), so it cannot end a wait. It is
        // still asked first because both calls hide the page-cache state of
        // files the caller could not write (a side channel): cachestat says
        // so with EPERM, whereas mincore then claims every page resident.
        // Before Linux 6.5 (ENOSYS) that lie cannot be detected; root is
        // never affected (CAP_FOWNER).
        if self.cachestat.load(Ordering::Relaxed) != CACHESTAT_NO {
            match self.residency_cachestat(h, first, last, page) {
                Ok(n) => {
                    self.cachestat.store(CACHESTAT_YES, Ordering::Relaxed);
                    if count_in_flight {
                        return Ok(Residency {
                            resident: n.min(pages),
                            pages,
                        });
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                    self.cachestat.store(CACHESTAT_NO, Ordering::Relaxed);
                }
                // hugetlbfs refuses cachestat; mincore still answers.
                Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {}
                Err(e) => return Err(err(e)),
            }
        }
        let resident = self.residency_mincore(h, first, last, page).map_err(err)?;
        Ok(Residency { resident, pages })
    }

    /// Pages of the range in the page cache, including those still being
    /// read (see [`crate::Backend::residency`] for why that is not residency).
    fn residency_cachestat(
        &self,
        h: &RealHandle,
        first: u64,
        end: u64,
        page: u64,
    ) -> io::Result<u64> {
        let range = CachestatRange {
            off: first * page,
            len: (end - first) * page,
        };
        let mut cs = Cachestat::default();
        // SAFETY: cachestat reads `range` and writes one `struct cachestat`
        // into `cs`; both are live, correctly laid out (#[repr(C)]) locals,
        // and the descriptor stays open for the call.
        let r = unsafe {
            libc::syscall(
                SYS_CACHESTAT,
                h.file.as_raw_fd(),
                &range as *const CachestatRange,
                &mut cs as *mut Cachestat,
                0u32,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(cs.nr_cache)
    }

    fn residency_mincore(
        &self,
        h: &RealHandle,
        first: u64,
        end: u64,
        page: u64,
    ) -> io::Result<u64> {
        let mut resident = 0;
        let mut p = first;
        while p < end {
            let n = (end - p).min(MINCORE_WINDOW / page);
            let len = usize::try_from(n * page)
                .map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
            let off = libc::off_t::try_from(p * page)
                .map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
            // SAFETY: a fresh shared read-only mapping chosen by the kernel;
            // it aliases no Rust object and is unmapped below. Mapping does
            // not fault pages in, so it does not disturb what we measure.
            let addr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    h.file.as_raw_fd(),
                    off,
                )
            };
            if addr == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            let mut vec = vec![0u8; n as usize];
            // SAFETY: `addr..addr+len` is the mapping made above, and `vec`
            // holds one byte per page of it, as mincore requires.
            let r = unsafe { libc::mincore(addr, len, vec.as_mut_ptr()) };
            let err = io::Error::last_os_error();
            // SAFETY: unmaps exactly the mapping made above, which nothing
            // references any more.
            unsafe { libc::munmap(addr, len) };
            if r < 0 {
                return Err(err);
            }
            resident += vec.iter().filter(|&&b| b & 1 != 0).count() as u64;
            p += n;
        }
        Ok(resident)
    }
}
