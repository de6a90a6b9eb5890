//! Page-cache residency of a range, through
//! [`warmstart_sys::residency`]: `cachestat(2)` where it answers and may be
//! trusted, `mincore(2)` otherwise.

use std::os::unix::fs::FileExt;

use warmstart_sys::residency::{cached_in, resident_in};

use super::{RealBackend, RealHandle};
use crate::backend::Residency;
use crate::ReplayError;

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
        // so with EPERM, which is returned here, whereas mincore then claims
        // every page resident. Before Linux 6.5 (ENOSYS, remembered by the
        // OS layer) that lie cannot be detected; root is never affected
        // (CAP_FOWNER). The handle's size clips the range: a block device's
        // st_size is 0.
        if let Some(c) = cached_in(&h.file, h.size, offset, len).map_err(err)? {
            if count_in_flight {
                return Ok(Residency {
                    resident: c.resident,
                    pages: c.pages,
                });
            }
        }
        let c = resident_in(&h.file, h.size, offset, len).map_err(err)?;
        Ok(Residency {
            resident: c.resident,
            pages: c.pages,
        })
    }

    /// Reads the range (clipped to the handle's size) through the page
    /// cache into a scratch buffer, which makes its pages up to date: the
    /// kernel reads what is missing and marks a page whose buffers the
    /// filesystem already filled without reading it again. See
    /// [`crate::Backend::read_through`].
    pub(super) fn read_range(
        &self,
        h: &RealHandle,
        offset: u64,
        len: u64,
    ) -> Result<(), ReplayError> {
        const CHUNK: u64 = 256 * 1024;
        let end = offset.saturating_add(len).min(h.size);
        let mut buf = vec![0u8; CHUNK.min(end.saturating_sub(offset)) as usize];
        let mut at = offset;
        while at < end {
            let want = (end - at).min(CHUNK) as usize;
            match h.file.read_at(&mut buf[..want], at) {
                // The device (or file) ended early: nothing more to read.
                Ok(0) => break,
                Ok(n) => at += n as u64,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(ReplayError::Read {
                        path: h.name.clone(),
                        offset: at,
                        len: end - at,
                        source,
                    })
                }
            }
        }
        Ok(())
    }
}
