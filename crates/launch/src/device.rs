//! Is the storage under a plan rotational? The kernel's flag is unreliable
//! in virtual machines (virtio disks report rotational=1 while behaving like
//! flash), so we measure: a few random 4 KiB O_DIRECT reads of a large file
//! of the plan. Seek-bound devices take milliseconds per read, flash tens to
//! hundreds of microseconds. The verdict is cached per device.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
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
/// best). Returns None if the file cannot be read with O_DIRECT, or is not
/// a regular file: `sample` is a path from a plan, which an unprivileged
/// program may have replaced by a FIFO, a device or a symlink since, so it
/// is opened through [`warmstart_sys::open`], which refuses those before
/// any read.
pub fn probe(sample: &Path) -> Option<(u64, Verdict)> {
    let f = warmstart_sys::OpenOptions::file()
        .custom_flags(libc::O_DIRECT)
        .noatime(true)
        .open(sample)
        .ok()?
        .file;
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
    fn a_probe_reads_a_regular_file() {
        // O_DIRECT needs a real filesystem; /var/tmp is usually on a disk.
        let d = tempfile::Builder::new().tempdir_in("/var/tmp").unwrap();
        let p = d.path().join("sample");
        std::fs::write(&p, vec![5u8; 1 << 20]).unwrap();
        File::open(&p).unwrap().sync_all().unwrap();
        let Some((dev, v)) = probe(&p) else {
            eprintln!("SKIPPED: /var/tmp refuses O_DIRECT");
            return;
        };
        assert_eq!(dev, std::fs::metadata(&p).unwrap().dev());
        assert!(v.median_read_us > 0.0);
        // Too small to measure: no verdict.
        std::fs::write(&p, vec![5u8; 4096]).unwrap();
        assert!(probe(&p).is_none());
    }

    #[test]
    fn a_probe_never_opens_a_fifo_or_device() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("big");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let zero = d.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send((probe(&fifo), probe(&zero)));
        });
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("probe blocked");
        assert_eq!(got, (None, None));
    }
}
