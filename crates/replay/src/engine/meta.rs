//! Metadata from the block device.
//!
//! A plan's metadata entries (inode tables, directory and extent blocks)
//! name byte ranges of a block device. They are read at the very start of
//! a replay, all of a device's ranges together: merged where the hole
//! between two is at most [`Options::meta_gap`], in device order, in
//! requests as large as the device reads ahead. The schedule's own
//! metadata entries then have nothing left to do. Why up front rather
//! than where the schedule has them: a path lookup or an open waits for
//! these blocks one at a time, synchronously, and every later request of
//! the launch depends on some of them; read in one sweep they cost a few
//! large requests instead of hundreds of small dependent ones.
//!
//! Reading the device only helps a filesystem that keeps its metadata in
//! the device's page cache: ext2/3/4 do (buffer heads on the block
//! device). XFS keeps its own buffer cache and btrfs its trees in a
//! private inode's page cache, so reads through the device node land in a
//! cache they never consult; for them the device is not read and the
//! plan's path lookups warm what they can (see [`device_reads_reach`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use warmstart_plan::trace::PAGE_SIZE;
use warmstart_plan::{Entry, Plan};

use super::worker::State;
use super::{lock, nanos, Options};
use crate::backend::Backend;
use crate::error::dev_name;
use crate::report::{Count, MetaDevice, MetaPath};

/// The largest metadata request: what the kernel's forced readahead
/// reads in one pass of its loop (`force_page_cache_ra()` works in 2 MiB
/// pieces), and beyond which a request only delays the blocks after it.
pub const MAX_META_REQUEST: u64 = 2 << 20;

/// Whether reading block-device pages fills the metadata cache of a
/// filesystem of type `fs` (as `/proc/self/mountinfo` names it).
///
/// Measured on loop-device images (direct I/O, 5,000 files in 80
/// directories, cold mount; Linux 6.18.44): a stat walk
/// of the tree read the device 113 times on ext4 (4 KiB blocks), 243 on
/// xfs and 291 on btrfs. After the blocks it read were read through the
/// device node (merged with a 64 KiB gap: 3-4 ranges, 5-8 requests), the
/// same walk read the device 0 times on ext4 (3 of 276 with 1 KiB
/// blocks), but still 243 times on xfs and 291 on btrfs. Filesystems not
/// measured are tried: a device read costs little, and the report says
/// it was done.
pub fn device_reads_reach(fs: &str) -> bool {
    !matches!(fs, "xfs" | "btrfs")
}

/// One merged range of a device's metadata, with the plan entries and
/// bytes it covers (the hole between them is read too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct MetaRange {
    pub(super) offset: u64,
    pub(super) len: u64,
    pub(super) covers: Count,
}

/// Merges a device's metadata ranges: sorted by offset, joined where they
/// overlap or the hole between them is at most `gap` bytes.
pub(super) fn merge_meta(mut ranges: Vec<(u64, u64)>, gap: u64) -> Vec<MetaRange> {
    ranges.sort_unstable();
    let mut out: Vec<MetaRange> = Vec::new();
    for (offset, len) in ranges {
        // `Plan::check` guarantees offset + len does not overflow.
        let end = offset + len;
        match out.last_mut() {
            Some(r) if offset <= (r.offset + r.len).saturating_add(gap) => {
                r.len = r.len.max(end - r.offset);
                r.covers.entries += 1;
                r.covers.bytes = r.covers.bytes.saturating_add(len);
            }
            _ => out.push(MetaRange {
                offset,
                len,
                covers: Count {
                    entries: 1,
                    bytes: len,
                },
            }),
        }
    }
    out
}

pub(super) enum DevState<H> {
    /// To be read: opened at setup ([`devices`]).
    Open(Arc<H>),
    /// Could not be opened or refused a read.
    Failed(String),
    /// Not read: its filesystem does not use the device's page cache.
    Unsupported(String),
}

pub(super) struct DeviceSlot<H> {
    pub(super) state: Mutex<DevState<H>>,
    /// The filesystem mounted from it, if known.
    pub(super) fs: Option<String>,
    pub(super) chunk: u64,
    pub(super) ranges: Vec<MetaRange>,
    pub(super) skipped: Mutex<Count>,
    pub(super) requests: AtomicU64,
    pub(super) requested_bytes: AtomicU64,
    pub(super) issued: Mutex<Vec<(u64, u64)>>,
}

impl<H> DeviceSlot<H> {
    /// Bytes its merged ranges read (0 if it is not to be read).
    pub(super) fn read_bytes(&self) -> u64 {
        if !matches!(*lock(&self.state), DevState::Open(_)) {
            return 0;
        }
        self.ranges
            .iter()
            .map(|r| r.len)
            .fold(0, u64::saturating_add)
    }
}

/// The metadata devices of `plan`, each with its merged ranges, opened
/// to be read, or why it is not: refused (earlier or now), or a
/// filesystem that device reads do not help. Opened before the replay
/// issues anything, since whether the plan's metadata will be cached
/// before its opens and lookups run decides how many workers the replay
/// starts (see [`Options::workers_metadata_read`]).
pub(super) fn devices<B: Backend>(
    backend: &B,
    plan: &Plan,
    opts: &Options,
) -> BTreeMap<u64, DeviceSlot<B::Handle>> {
    let mut ranges: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
    for e in &plan.entries {
        if let Entry::Meta {
            device,
            offset,
            len,
        } = *e
        {
            ranges.entry(device).or_default().push((offset, len));
        }
    }
    ranges
        .into_iter()
        .map(|(device, r)| {
            // A device known to refuse us, or not worth reading, is
            // skipped by the dispatcher: no worker started just to fail.
            let refused = backend.refused_device(device);
            let fs = refused
                .is_none()
                .then(|| backend.device_filesystem(device))
                .flatten();
            let state = match (refused, &fs) {
                (Some(e), _) => DevState::Failed(e.to_string()),
                (None, Some(fs)) if !device_reads_reach(fs) => DevState::Unsupported(fs.clone()),
                _ => match backend.open_device(device) {
                    Ok(h) => DevState::Open(Arc::new(h)),
                    Err(e) => DevState::Failed(e.to_string()),
                },
            };
            let ra = backend
                .read_ahead(device)
                .filter(|&b| b > 0)
                .unwrap_or(Options::DEFAULT_CHUNK)
                .min(MAX_META_REQUEST);
            let slot = DeviceSlot {
                state: Mutex::new(state),
                fs,
                chunk: (ra / PAGE_SIZE).max(1) * PAGE_SIZE,
                ranges: merge_meta(r, opts.meta_gap),
                skipped: Mutex::new(Count::default()),
                requests: AtomicU64::new(0),
                requested_bytes: AtomicU64::new(0),
                issued: Mutex::new(Vec::new()),
            };
            (device, slot)
        })
        .collect()
}

impl<B: Backend> State<'_, B> {
    /// Whether metadata device `device` is not (or no longer) being read.
    pub(super) fn device_failed(&self, device: u64) -> bool {
        self.devices.get(&device).is_some_and(|d| {
            matches!(
                *lock(&d.state),
                DevState::Failed(_) | DevState::Unsupported(_)
            )
        })
    }

    /// Counts plan metadata as skipped on `device`.
    pub(super) fn skip_meta(&self, device: u64, c: Count) {
        let mut s = lock(&self.devices[&device].skipped);
        s.entries += c.entries;
        s.bytes = s.bytes.saturating_add(c.bytes);
    }

    /// Executes one metadata request; `credit` is what the plan's entries
    /// count for it (nonzero on the first request of a merged range).
    pub(super) fn meta(&self, device: u64, offset: u64, len: u64, credit: Count) {
        let slot = &self.devices[&device];
        // Opened (or found unopenable) at setup: see `devices`.
        let handle = match &*lock(&slot.state) {
            DevState::Open(h) => Some(Arc::clone(h)),
            _ => None,
        };
        let issued = handle.is_some_and(|h| {
            let t = Instant::now();
            let res = self.backend.prefetch(&h, offset, len);
            self.busy_meta
                .fetch_add(nanos(t.elapsed()), Ordering::Relaxed);
            match res {
                Ok(()) => true,
                Err(e) => {
                    // E.g. a device that refuses fadvise: skip all its
                    // metadata from here on rather than fail request by
                    // request.
                    let mut st = lock(&slot.state);
                    if matches!(*st, DevState::Open(_)) {
                        *st = DevState::Failed(e.to_string());
                    }
                    false
                }
            }
        });
        if issued {
            self.requests.fetch_add(1, Ordering::Relaxed);
            slot.requests.fetch_add(1, Ordering::Relaxed);
            slot.requested_bytes.fetch_add(len, Ordering::Relaxed);
            self.issued_one();
            let mut c = lock(&self.meta);
            c.entries += credit.entries;
            c.bytes = c.bytes.saturating_add(credit.bytes);
            drop(c);
            if self.keep_ranges {
                lock(&slot.issued).push((offset, len));
            }
        } else {
            self.skip_meta(device, credit);
        }
    }
}

/// Whether the plan's metadata is read in bulk, as far as opens and
/// lookups go: at least [`MOSTLY_READ_PERCENT`] of its metadata entries
/// are on devices open to be read. A few entries elsewhere (a file on a
/// filesystem that is not read, such as the host disk's under a
/// testbed's bind mount) make a few opens wait on the disk, which the
/// spare thread covers ([`Options::spare_after`]); most of them make most
/// opens wait, and then the full pool runs.
pub(super) fn mostly_read<H>(devices: &BTreeMap<u64, DeviceSlot<H>>) -> bool {
    let entries = |d: &DeviceSlot<H>| d.ranges.iter().map(|r| r.covers.entries).sum::<u64>();
    let total: u64 = devices.values().map(entries).sum();
    let read: u64 = devices
        .values()
        .filter(|d| matches!(*lock(&d.state), DevState::Open(_)))
        .map(entries)
        .sum();
    mostly(read, total)
}

/// [`mostly_read`] for the devices `metadata_paths` describes, as `show`
/// and `status` report them.
pub fn metadata_mostly_read<'a>(devices: impl IntoIterator<Item = &'a MetaDevice>) -> bool {
    let (mut read, mut total) = (0, 0);
    for d in devices {
        total += d.planned.entries;
        if d.path == MetaPath::DeviceRead {
            read += d.planned.entries;
        }
    }
    mostly(read, total)
}

/// The share of metadata entries that must be read from the device for
/// the smaller pool.
const MOSTLY_READ_PERCENT: u64 = 90;

fn mostly(read: u64, total: u64) -> bool {
    read > 0 && read.saturating_mul(100) >= total.saturating_mul(MOSTLY_READ_PERCENT)
}

/// What happened to each metadata device, for the report; `replayed`:
/// after a replay, where an open device none of whose ranges was issued
/// was not reached (not so for `status` and `show`, which only open it).
pub(super) fn describe<H>(
    devices: &BTreeMap<u64, DeviceSlot<H>>,
    replayed: bool,
) -> Vec<MetaDevice> {
    devices
        .iter()
        .map(|(&device, slot)| {
            let requests = slot.requests.load(Ordering::Relaxed);
            let path = match &*lock(&slot.state) {
                DevState::Open(_) if replayed && requests == 0 => MetaPath::NotReached,
                DevState::Open(_) => MetaPath::DeviceRead,
                DevState::Failed(error) => MetaPath::NotOpenable {
                    error: error.clone(),
                },
                DevState::Unsupported(fs) => MetaPath::FilesystemUnsupported {
                    fs_type: fs.clone(),
                },
            };
            let planned = slot.ranges.iter().fold(Count::default(), |a, r| Count {
                entries: a.entries + r.covers.entries,
                bytes: a.bytes.saturating_add(r.covers.bytes),
            });
            MetaDevice {
                device,
                name: dev_name(device),
                fs_type: slot.fs.clone(),
                path,
                planned,
                ranges: slot.ranges.len() as u64,
                requests,
                requested_bytes: slot.requested_bytes.load(Ordering::Relaxed),
            }
        })
        .collect()
}

/// Which path each metadata device of `plan` would take on this machine,
/// without reading anything: for `status` and `show`. A device that would
/// be read is opened (and closed) to find out whether it can be.
pub fn metadata_paths<B: Backend>(plan: &Plan, backend: &B) -> Vec<MetaDevice> {
    describe(&devices(backend, plan, &Options::default()), false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_meta_table() {
        const K: u64 = 1024;
        let c = |entries, bytes| Count { entries, bytes };
        let r = |offset, len, covers| MetaRange {
            offset,
            len,
            covers,
        };
        // (name, ranges, gap, want)
        type Case = (&'static str, Vec<(u64, u64)>, u64, Vec<MetaRange>);
        let cases: Vec<Case> = vec![
            ("none", vec![], 64 * K, vec![]),
            (
                "sorted into device order",
                vec![(1024 * K, 4 * K), (0, 4 * K)],
                64 * K,
                vec![r(0, 4 * K, c(1, 4 * K)), r(1024 * K, 4 * K, c(1, 4 * K))],
            ),
            (
                "joined across a hole up to the gap",
                vec![(0, 4 * K), (68 * K, 4 * K), (200 * K, 4 * K)],
                64 * K,
                vec![r(0, 72 * K, c(2, 8 * K)), r(200 * K, 4 * K, c(1, 4 * K))],
            ),
            (
                "overlapping and contained",
                vec![(0, 16 * K), (4 * K, 4 * K), (8 * K, 16 * K)],
                0,
                vec![r(0, 24 * K, c(3, 36 * K))],
            ),
            (
                "touching joins with no gap",
                vec![(0, 4 * K), (4 * K, 4 * K), (12 * K, 4 * K)],
                0,
                vec![r(0, 8 * K, c(2, 8 * K)), r(12 * K, 4 * K, c(1, 4 * K))],
            ),
            (
                "near the end of u64",
                vec![(u64::MAX - 8 * K, 4 * K), (u64::MAX - 4 * K, 4 * K)],
                u64::MAX,
                vec![r(u64::MAX - 8 * K, 8 * K, c(2, 8 * K))],
            ),
        ];
        for (name, ranges, gap, want) in cases {
            assert_eq!(merge_meta(ranges, gap), want, "{name}");
        }
    }

    #[test]
    fn device_reads_reach_table() {
        for (fs, want) in [
            ("ext4", true),
            ("ext3", true),
            ("ext2", true),
            ("vfat", true),
            ("xfs", false),
            ("btrfs", false),
        ] {
            assert_eq!(device_reads_reach(fs), want, "{fs}");
        }
    }
}
