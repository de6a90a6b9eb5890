//! Does the storage under a plan seek? The kernel's rotational flag is
//! unreliable in virtual machines (virtio disks report rotational=1 while
//! behaving like flash), so we measure, with O_DIRECT reads of the plan's
//! largest file: 24 random 4 KiB reads, then 1 MiB read after 1 MiB in
//! order. A device seeks when a random 4 KiB read costs both more than
//! [`SEEK_THRESHOLD_US`] and more than half the time of a sequential
//! 1 MiB: positioning, not the transfer or the request, is its cost. The
//! second condition keeps high-latency network volumes (2-10 ms per
//! request, but 8 ms per sequential MiB at 125 MB/s, and no head to move)
//! from being treated as disks; an SD card or eMMC (about 1 ms per 4 KiB,
//! 26 ms per MiB) is not seek-bound either. The verdict is cached per
//! device.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// Median random 4 KiB read time above which a device may be seek-bound.
pub const SEEK_THRESHOLD_US: f64 = 2000.0;

/// Bytes of each sequential read of the probe.
const SEQ_CHUNK: u64 = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// Seek-bound (a disk with a head): prefetch in physical order, with
    /// the program held (the sorted strategy).
    pub rotational: bool,
    /// Median time of a random 4 KiB read.
    pub median_read_us: f64,
    /// Time of a 1 MiB read following the previous one in order (the
    /// faster of two). `None` in verdicts of older versions, which only
    /// measured random reads: those are measured again.
    #[serde(default)]
    pub seq_mib_us: Option<f64>,
}

impl Verdict {
    /// The verdict on these measurements (see the module documentation).
    pub fn from_times(median_read_us: f64, seq_mib_us: Option<f64>) -> Verdict {
        let seeks = median_read_us > SEEK_THRESHOLD_US
            && seq_mib_us.is_none_or(|seq| median_read_us > seq / 2.0);
        Verdict {
            rotational: seeks,
            median_read_us,
            seq_mib_us,
        }
    }

    /// Measured by this version of the probe.
    pub fn is_current(&self) -> bool {
        self.seq_mib_us.is_some()
    }
}

/// The state directory's file of device verdicts.
pub const DEVICES_FILE: &str = "devices.json";

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

/// Whether the device under `plan` seeks, by the verdict kept in
/// `cache_path` (a state directory's `devices.json`) for the device of
/// the plan's largest file, measured and kept there when it has none.
/// `None` when the plan has no file or the file cannot be measured.
pub fn plan_seeks(plan: &warmstart_plan::Plan, cache_path: &Path) -> Option<bool> {
    let big = plan.files.iter().max_by_key(|f| f.id.size)?;
    let mut cache = DeviceCache::load(cache_path);
    if let Some(v) = cache.devices.get(&big.id.dev).filter(|v| v.is_current()) {
        return Some(v.rotational);
    }
    let (dev, v) = probe(Path::new(&big.path))?;
    cache.devices.insert(dev, v);
    cache.save(cache_path);
    Some(v.rotational)
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
    let mut buf = AlignedBuf::new(SEQ_CHUNK as usize);
    // A fixed pseudo-random walk over the file: reproducible, spread out.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for _ in 0..24 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let off = (x % pages) * 4096;
        let t = Instant::now();
        if !buf.read_at(&f, off, 4096) {
            return None;
        }
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    lat.sort_by(f64::total_cmp);
    let median = lat[lat.len() / 2];
    // Three 1 MiB reads in order: the first pays for positioning, the
    // faster of the other two is the sequential time. A file under 3 MiB
    // reads smaller pieces, scaled to 1 MiB.
    let chunk = (m.size() / 3 / 4096 * 4096).min(SEQ_CHUNK);
    let mut seq = f64::INFINITY;
    for i in 0..3 {
        let t = Instant::now();
        if !buf.read_at(&f, i * chunk, chunk as usize) {
            return None;
        }
        if i > 0 {
            seq = seq.min(t.elapsed().as_secs_f64() * 1e6 * SEQ_CHUNK as f64 / chunk as f64);
        }
    }
    Some((m.dev(), Verdict::from_times(median, Some(seq))))
}

/// A buffer aligned for O_DIRECT.
struct AlignedBuf(Vec<u8>);

impl AlignedBuf {
    fn new(len: usize) -> Self {
        AlignedBuf(vec![0u8; len + 4096])
    }

    /// Reads `len` bytes (at most the buffer's) at `off`; false on an
    /// error or an empty read.
    fn read_at(&mut self, f: &File, off: u64, len: usize) -> bool {
        let base = self.0.as_mut_ptr();
        let pad = base.align_offset(4096);
        let len = len.min(self.0.len() - 4096);
        // SAFETY: pad < 4096 and the vector holds len + 4096 bytes, so
        // [pad, pad+len) is inside it; pread writes at most len bytes there.
        let n = unsafe { libc::pread(f.as_raw_fd(), base.add(pad).cast(), len, off as i64) };
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
        c.devices.insert(7, Verdict::from_times(80.0, Some(400.0)));
        c.save(&p);
        assert_eq!(DeviceCache::load(&p).devices[&7].median_read_us, 80.0);
        // A verdict of the older probe, random reads only: measured again.
        std::fs::write(
            &p,
            r#"{"devices":{"7":{"rotational":true,"median_read_us":2500.0}}}"#,
        )
        .unwrap();
        let old = DeviceCache::load(&p).devices[&7];
        assert!(old.rotational && !old.is_current());
        assert!(DeviceCache::load(&d.path().join("none")).devices.is_empty());
    }

    #[test]
    fn only_a_device_whose_cost_is_positioning_seeks() {
        // (random 4 KiB read, sequential 1 MiB), in microseconds: the
        // figures of the kinds of storage the module names.
        let cases = [
            ("7200 rpm disk", 9_000.0, 6_500.0, true),
            ("USB disk", 14_000.0, 10_000.0, true),
            ("network volume, 3 ms", 3_000.0, 8_400.0, false),
            ("network volume, 1 ms", 1_400.0, 8_000.0, false),
            ("SD card", 1_100.0, 27_000.0, false),
            ("NVMe", 90.0, 400.0, false),
            // Not slow enough to be a disk, whatever the ratio.
            ("fast device with a cache", 1_500.0, 1_200.0, false),
        ];
        for (what, random, seq, seeks) in cases {
            assert_eq!(
                Verdict::from_times(random, Some(seq)).rotational,
                seeks,
                "{what}"
            );
        }
        // Without a sequential figure only the latency decides.
        assert!(Verdict::from_times(2_500.0, None).rotational);
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
        assert!(v.is_current() && v.seq_mib_us.unwrap() > 0.0, "{v:?}");
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
