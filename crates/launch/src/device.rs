//! Is the storage under a plan rotational? The kernel's flag is unreliable
//! in virtual machines (virtio disks report rotational=1 while behaving like
//! flash), so we measure: a few random 4 KiB O_DIRECT reads of a large file
//! of the plan. Seek-bound devices take milliseconds per read, flash tens to
//! hundreds of microseconds. The verdict is cached per device.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// Median random-read latency above which a device is treated as rotational.
pub const ROTATIONAL_THRESHOLD_US: f64 = 2000.0;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub rotational: bool,
    pub median_read_us: f64,
}

/// Verdicts by st_dev, kept in `devices.json` in the state directory.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct DeviceCache {
    pub devices: BTreeMap<u64, Verdict>,
}

impl DeviceCache {
    pub fn load(path: &Path) -> DeviceCache {
        std::fs::read(path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    pub fn save(&self, path: &Path) {
        let bytes = serde_json::to_vec_pretty(self).expect("serializes");
        let _ = crate::store::write_atomic(path, &bytes);
    }
}

/// Measures the device holding `sample` (a file of at least a few MiB is
/// best). Returns None if the file cannot be read with O_DIRECT.
pub fn probe(sample: &Path) -> Option<(u64, Verdict)> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT | libc::O_NOATIME)
        .open(sample)
        .or_else(|_| {
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(sample)
        })
        .ok()?;
    let m = f.metadata().ok()?;
    let pages = m.size() / 4096;
    if pages < 16 {
        return None;
    }
    let mut lat = Vec::new();
    let mut buf = AlignedPage::new();
    // A fixed pseudo-random walk over the file: reproducible, spread out.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for _ in 0..24 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let off = (x % pages) * 4096;
        let t = Instant::now();
        if !buf.read_at(&f, off) {
            return None;
        }
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    lat.sort_by(f64::total_cmp);
    let median = lat[lat.len() / 2];
    Some((
        m.dev(),
        Verdict {
            rotational: median > ROTATIONAL_THRESHOLD_US,
            median_read_us: median,
        },
    ))
}

/// A 4 KiB buffer aligned for O_DIRECT.
struct AlignedPage(Box<[u8; 8192]>);

impl AlignedPage {
    fn new() -> Self {
        AlignedPage(Box::new([0u8; 8192]))
    }

    fn read_at(&mut self, f: &File, off: u64) -> bool {
        let base = self.0.as_mut_ptr();
        let pad = base.align_offset(4096);
        // SAFETY: pad < 4096 and the buffer is 8 KiB, so [pad, pad+4096) is
        // inside it; pread writes at most 4096 bytes there.
        let n = unsafe { libc::pread(f.as_raw_fd(), base.add(pad).cast(), 4096, off as i64) };
        n > 0
    }
}

/// FIEMAP: the physical byte address of a file offset, for sorted plans.
pub mod fiemap {
    use std::collections::HashMap;
    use std::fs::File;
    use std::os::fd::AsRawFd;
    use std::sync::Mutex;

    const FS_IOC_FIEMAP: libc::c_ulong = 0xC020660B;
    const EXTENTS: usize = 256;

    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Extent {
        logical: u64,
        physical: u64,
        length: u64,
        reserved64: [u64; 2],
        flags: u32,
        reserved: [u32; 3],
    }

    #[repr(C)]
    struct Request {
        start: u64,
        length: u64,
        flags: u32,
        mapped: u32,
        count: u32,
        reserved: u32,
        extents: [Extent; EXTENTS],
    }

    /// (logical, physical, length) in bytes.
    pub type Span = (u64, u64, u64);

    /// The first extents of a file.
    pub fn extents(path: &str) -> Vec<Span> {
        let Ok(f) = File::open(path) else {
            return Vec::new();
        };
        let mut req = Box::new(Request {
            start: 0,
            length: u64::MAX,
            flags: 0,
            mapped: 0,
            count: EXTENTS as u32,
            reserved: 0,
            extents: [Extent::default(); EXTENTS],
        });
        // SAFETY: FS_IOC_FIEMAP reads and writes a struct fiemap followed by
        // `count` extents, which is exactly the layout of Request.
        let rc = unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_FIEMAP, &mut *req as *mut Request) };
        if rc != 0 {
            return Vec::new();
        }
        req.extents[..(req.mapped as usize).min(EXTENTS)]
            .iter()
            .map(|e| (e.logical, e.physical, e.length))
            .collect()
    }

    /// Caches extents per path for a compile's `physical` callback.
    #[derive(Default)]
    pub struct Mapper(Mutex<HashMap<String, Vec<Span>>>);

    impl Mapper {
        pub fn physical(&self, path: &str, offset: u64) -> Option<u64> {
            let mut m = self.0.lock().ok()?;
            let ext = m.entry(path.to_string()).or_insert_with(|| extents(path));
            ext.iter()
                .find(|(l, _, len)| offset >= *l && offset < l + len)
                .map(|(l, p, _)| p + (offset - l))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_round_trip() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("devices.json");
        let mut c = DeviceCache::default();
        c.devices.insert(
            7,
            Verdict {
                rotational: false,
                median_read_us: 80.0,
            },
        );
        c.save(&p);
        assert_eq!(DeviceCache::load(&p).devices[&7].median_read_us, 80.0);
        assert!(DeviceCache::load(&d.path().join("none")).devices.is_empty());
    }

    #[test]
    fn fiemap_of_a_real_file() {
        let d = tempfile::Builder::new().tempdir_in("/var/tmp").unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, vec![1u8; 1 << 20]).unwrap();
        std::fs::File::open(&p).unwrap().sync_all().unwrap();
        let path = p.to_str().unwrap();
        let ext = fiemap::extents(path);
        if ext.is_empty() {
            eprintln!("SKIPPED: /var/tmp has no FIEMAP support");
            return;
        }
        let (logical, physical, len) = ext[0];
        assert_eq!(logical, 0);
        let m = fiemap::Mapper::default();
        assert_eq!(m.physical(path, 0), Some(physical));
        if len > 4096 {
            assert_eq!(m.physical(path, 4096), Some(physical + 4096));
        }
        assert_eq!(m.physical(path, 1 << 30), None);
    }
}
