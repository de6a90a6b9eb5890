//! Where a file's blocks are on disk (`FS_IOC_FIEMAP`), for plans read in
//! physical order on seek-bound devices. Both `compile --sorted` and the
//! bench's `sorted` scenario use [`PhysicalMap`], so they order the same.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::{Mutex, PoisonError};

use crate::Error;

/// `FS_IOC_FIEMAP` = `_IOWR('f', 11, struct fiemap)` with the 32-byte
/// header of `<linux/fiemap.h>`.
const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
/// Extents asked for per call.
const BATCH: usize = 256;
/// `FIEMAP_EXTENT_LAST`.
const EXTENT_LAST: u32 = 0x1;
/// `FIEMAP_EXTENT_UNKNOWN`: the data has no location yet.
const EXTENT_UNKNOWN: u32 = 0x2;
/// `FIEMAP_EXTENT_DELALLOC`: delayed allocation, no location yet.
const EXTENT_DELALLOC: u32 = 0x4;

/// `struct fiemap_extent`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RawExtent {
    logical: u64,
    physical: u64,
    length: u64,
    reserved64: [u64; 2],
    flags: u32,
    reserved: [u32; 3],
}

/// `struct fiemap` followed by its extent array.
#[repr(C)]
struct Request {
    start: u64,
    length: u64,
    flags: u32,
    mapped: u32,
    count: u32,
    reserved: u32,
    extents: [RawExtent; BATCH],
}

/// One extent: `length` bytes at file offset `logical` live at byte
/// `physical` of the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub logical: u64,
    pub physical: u64,
    pub length: u64,
}

/// Every located extent of an open file, sorted by logical offset.
/// Extents without a location yet (delayed allocation) are left out:
/// their `physical` means nothing. No `FIEMAP_FLAG_SYNC`: warmstart does
/// not make the kernel write an application's dirty data.
pub fn extents(file: &File) -> io::Result<Vec<Extent>> {
    let mut out = Vec::new();
    let mut start = 0u64;
    loop {
        let mut req = Box::new(Request {
            start,
            length: u64::MAX - start,
            flags: 0,
            mapped: 0,
            count: BATCH as u32,
            reserved: 0,
            extents: [RawExtent::default(); BATCH],
        });
        // SAFETY: FS_IOC_FIEMAP reads a struct fiemap and writes at most
        // `count` extents after it, which is exactly Request's #[repr(C)]
        // layout; the box and the descriptor outlive the call.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_FIEMAP, &mut *req as *mut Request) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        let n = (req.mapped as usize).min(BATCH);
        if n == 0 {
            break;
        }
        let mut last = false;
        for e in &req.extents[..n] {
            last |= e.flags & EXTENT_LAST != 0;
            if e.flags & (EXTENT_UNKNOWN | EXTENT_DELALLOC) == 0 {
                out.push(Extent {
                    logical: e.logical,
                    physical: e.physical,
                    length: e.length,
                });
            }
        }
        let e = req.extents[n - 1];
        let next = e.logical.saturating_add(e.length);
        if last || n < BATCH || next <= start {
            break;
        }
        start = next;
    }
    Ok(out)
}

/// The extents of a recorded path, opened safely (see [`crate::open`]).
pub fn extents_of(path: impl AsRef<Path>) -> Result<Vec<Extent>, Error> {
    let path = path.as_ref();
    let o = crate::open(path)?;
    extents(&o.file).map_err(|source| Error::Fiemap {
        path: path.to_path_buf(),
        source,
    })
}

/// The device byte address of `offset` within sorted `extents`.
pub fn physical_in(extents: &[Extent], offset: u64) -> Option<u64> {
    let i = extents.partition_point(|e| e.logical.saturating_add(e.length) <= offset);
    let e = extents.get(i)?;
    (offset >= e.logical && offset - e.logical < e.length)
        .then(|| e.physical + (offset - e.logical))
}

/// Physical addresses by path, one FIEMAP sequence per file, for a
/// compile's `physical` callback (called once per range). A file that
/// cannot be opened safely or mapped has no address.
#[derive(Default)]
pub struct PhysicalMap(Mutex<HashMap<String, Vec<Extent>>>);

impl PhysicalMap {
    pub fn physical(&self, path: &str, offset: u64) -> Option<u64> {
        let mut m = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let ext = m
            .entry(path.to_string())
            .or_insert_with(|| extents_of(path).unwrap_or_default());
        physical_in(ext, offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(logical: u64, physical: u64, length: u64) -> Extent {
        Extent {
            logical,
            physical,
            length,
        }
    }

    #[test]
    fn physical_lookup_in_extents() {
        let e = [ext(0, 1_000_000, 8192), ext(8192, 5_000_000, 4096)];
        for (off, want) in [
            (0, Some(1_000_000)),
            (4096, Some(1_004_096)),
            (8192, Some(5_000_000)),
            (12287, Some(5_004_095)),
            (12288, None),
        ] {
            assert_eq!(physical_in(&e, off), want, "{off}");
        }
        assert_eq!(physical_in(&[ext(4096, 7, 10)], 0), None);
        assert_eq!(
            physical_in(&[ext(u64::MAX - 1, 7, 10)], u64::MAX - 1),
            Some(7)
        );
    }

    #[test]
    fn extents_of_a_real_file() {
        // tmpfs has no FIEMAP; /var/tmp is usually on a disk.
        let d = tempfile::Builder::new().tempdir_in("/var/tmp").unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, vec![1u8; 1 << 20]).unwrap();
        File::open(&p).unwrap().sync_all().unwrap();
        let e = match extents_of(&p) {
            Ok(e) => e,
            Err(Error::Fiemap { source, .. })
                if source.raw_os_error() == Some(libc::EOPNOTSUPP) =>
            {
                eprintln!("SKIPPED: /var/tmp has no FIEMAP support");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        assert_eq!(e[0].logical, 0);
        assert_eq!(e.iter().map(|e| e.length).sum::<u64>(), 1 << 20);
        let m = PhysicalMap::default();
        let path = p.to_str().unwrap();
        assert_eq!(m.physical(path, 0), Some(e[0].physical));
        assert_eq!(m.physical(path, 1 << 30), None);
        // A FIFO has no extents and is never opened for reading.
        let fifo = d.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        assert!(matches!(extents_of(&fifo), Err(Error::WrongKind { .. })));
        assert_eq!(m.physical(fifo.to_str().unwrap(), 0), None);
    }
}
