//! Block devices holding metadata: finding their node, opening it safely,
//! remembering a refusal, their read-ahead size, and the filesystem
//! mounted from them.

use std::fs;
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::{advise_random, RealBackend, RealHandle, DEVICE_MEMO_TTL};
use crate::error::dev_name;
use crate::ReplayError;

impl RealBackend {
    /// The type of the filesystem mounted from block device `device`, from
    /// `PROCFS/self/mountinfo`.
    pub(super) fn mounted_filesystem(&self, device: u64) -> Option<String> {
        let text = fs::read_to_string(self.procfs.join("self/mountinfo")).ok()?;
        filesystem_of(&text, device, |source| {
            // Only absolute paths can name a device node; O_PATH-free stat
            // of a node has no side effects.
            let m = fs::metadata(source).ok()?;
            m.file_type().is_block_device().then(|| m.rdev())
        })
    }

    /// Candidate device nodes for `device`: udev's `/dev/block/MAJ:MIN`
    /// link, then the kernel's own name from sysfs (there may be no udev,
    /// as on this project's VMs).
    fn device_nodes(&self, device: u64) -> Vec<PathBuf> {
        let name = dev_name(device);
        let mut out = vec![self.devfs.join("block").join(&name)];
        let uevent = self.sysfs.join("dev/block").join(&name).join("uevent");
        if let Ok(text) = fs::read_to_string(uevent) {
            if let Some(dev) = text.lines().find_map(|l| l.strip_prefix("DEVNAME=")) {
                out.push(self.devfs.join(dev));
            }
        }
        out
    }

    /// The device's node under the kernel's name for it (`DEVFS/vda`, from
    /// sysfs), for people to read; `None` where sysfs does not name it.
    pub fn device_node(&self, device: u64) -> Option<PathBuf> {
        self.device_nodes(device).into_iter().nth(1)
    }

    pub(super) fn open_block_device(&self, device: u64) -> Result<RealHandle, ReplayError> {
        if let Some(e) = self.device_refused(device) {
            return Err(e);
        }
        let mut last = None;
        for node in self.device_nodes(device) {
            let opened = self
                .opener(warmstart_sys::OpenOptions::block_device(device))
                .open(&node);
            let mut file = match opened {
                Ok(o) => o.file,
                Err(warmstart_sys::Error::Open { path, source }) => {
                    last = Some(ReplayError::Device {
                        device,
                        path,
                        source,
                    });
                    continue;
                }
                // Another kind of file, or another device's node.
                Err(e) => {
                    last = Some(ReplayError::Device {
                        device,
                        path: node.clone(),
                        source: io::Error::new(io::ErrorKind::InvalidInput, e.to_string()),
                    });
                    continue;
                }
            };
            // A block device's size is where its end is; st_size is 0.
            let size = file
                .seek(SeekFrom::End(0))
                .map_err(|source| ReplayError::Device {
                    device,
                    path: node.clone(),
                    source,
                })?;
            advise_random(&file);
            return Ok(RealHandle {
                file,
                name: node,
                size,
            });
        }
        let err = last.unwrap_or_else(|| ReplayError::Device {
            device,
            path: self.devfs.join("block").join(dev_name(device)),
            source: io::ErrorKind::NotFound.into(),
        });
        // Refused for lack of privilege: that will not change from one
        // launch to the next.
        if let ReplayError::Device { path, source, .. } = &err {
            if let Some(errno @ (libc::EPERM | libc::EACCES)) = source.raw_os_error() {
                self.memo()
                    .refused
                    .insert(device, (path.clone(), errno, Instant::now()));
            }
        }
        Err(err)
    }

    pub(super) fn device_refused(&self, device: u64) -> Option<ReplayError> {
        let memo = self.memo();
        let (path, errno, at) = memo.refused.get(&device)?;
        (at.elapsed() < DEVICE_MEMO_TTL).then(|| ReplayError::Device {
            device,
            path: path.clone(),
            source: io::Error::from_raw_os_error(*errno),
        })
    }
}

/// The most one `WILLNEED` request reads for files on `device` (or on the
/// block device itself), from `SYSFS/dev/block/MAJ:MIN`: the device's own
/// `queue/`, or for a partition its disk's. `read_ahead_kb` is the limit we
/// rely on; when it is 0 the kernel still reads up to `max_sectors_kb` per
/// call. `None` for devices without a queue (btrfs and other anonymous
/// devices, network file systems).
pub fn read_ahead_bytes(sysfs: &Path, device: u64) -> Option<u64> {
    let base = sysfs.join("dev/block").join(dev_name(device));
    let queue = [base.join("queue"), base.join("../queue")]
        .into_iter()
        .find(|q| q.join("read_ahead_kb").is_file())?;
    let kb = |name: &str| -> Option<u64> {
        fs::read_to_string(queue.join(name))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    match kb("read_ahead_kb")? {
        0 => kb("max_sectors_kb").filter(|&k| k > 0).map(|k| k * 1024),
        k => Some(k * 1024),
    }
}

/// The filesystem type mounted from `device`, given the text of a
/// `mountinfo` file. A line matches when its `MAJ:MIN` field is the device
/// (ext4, xfs: `st_dev` of their files is the device), or when its mount
/// source is a node of that device (`rdev_of`): btrfs gives its files an
/// anonymous `st_dev`, so only the source names the disk.
pub(super) fn filesystem_of(
    mountinfo: &str,
    device: u64,
    rdev_of: impl Fn(&str) -> Option<u64>,
) -> Option<String> {
    let name = dev_name(device);
    let mut by_source = None;
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mut right = right.split_whitespace();
        let (Some(fs), Some(source)) = (right.next(), right.next()) else {
            continue;
        };
        if left.split_whitespace().nth(2) == Some(name.as_str()) {
            return Some(fs.to_string());
        }
        if by_source.is_none() && source.starts_with('/') && rdev_of(source) == Some(device) {
            by_source = Some(fs.to_string());
        }
    }
    by_source
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A sysfs fixture shaped like the real one: `dev/block/MAJ:MIN` are
    /// symlinks into `devices/`, partitions sit inside their disk's directory.
    #[test]
    fn read_ahead_from_sysfs_fixture() {
        let root = tempfile::tempdir().unwrap();
        let sys = root.path();
        let put = |rel: &str, text: &str| {
            let p = sys.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, text).unwrap();
        };
        put("devices/pci/sda/queue/read_ahead_kb", "4096\n");
        put("devices/pci/sda/queue/max_sectors_kb", "1280\n");
        put("devices/pci/sda/sda1/partition", "1\n");
        put("devices/virtual/loop0/queue/read_ahead_kb", "0\n");
        put("devices/virtual/loop0/queue/max_sectors_kb", "1280\n");
        put("devices/virtual/zram0/queue/read_ahead_kb", "128\n");
        fs::create_dir_all(sys.join("dev/block")).unwrap();
        for (name, target) in [
            ("8:0", "../../devices/pci/sda"),
            ("8:1", "../../devices/pci/sda/sda1"),
            ("7:0", "../../devices/virtual/loop0"),
            ("253:0", "../../devices/virtual/zram0"),
        ] {
            symlink(target, sys.join("dev/block").join(name)).unwrap();
        }
        let cases = [
            ("disk", libc::makedev(8, 0), Some(4096 * 1024)),
            (
                "partition uses its disk's queue",
                libc::makedev(8, 1),
                Some(4096 * 1024),
            ),
            (
                "read_ahead_kb 0 falls back to max_sectors_kb",
                libc::makedev(7, 0),
                Some(1280 * 1024),
            ),
            ("own queue", libc::makedev(253, 0), Some(128 * 1024)),
            (
                "anonymous device (btrfs, overlay)",
                libc::makedev(0, 35),
                None,
            ),
        ];
        for (name, dev, want) in cases {
            assert_eq!(read_ahead_bytes(sys, dev), want, "{name}");
        }
    }

    #[test]
    fn device_nodes_use_sysfs_devname() {
        let root = tempfile::tempdir().unwrap();
        let p = root.path().join("sys/dev/block/254:0");
        fs::create_dir_all(&p).unwrap();
        fs::write(
            p.join("uevent"),
            "MAJOR=254\nMINOR=0\nDEVNAME=vda\nDEVTYPE=disk\n",
        )
        .unwrap();
        let b = RealBackend::with_roots(root.path().join("sys"), "/proc", root.path().join("dev"));
        assert_eq!(
            b.device_nodes(libc::makedev(254, 0)),
            vec![
                root.path().join("dev/block/254:0"),
                root.path().join("dev/vda")
            ]
        );
        assert_eq!(
            b.device_node(libc::makedev(254, 0)),
            Some(root.path().join("dev/vda"))
        );
        assert_eq!(b.device_node(libc::makedev(254, 1)), None);
    }

    #[test]
    fn filesystem_of_mountinfo_fixture() {
        let text = "\
22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
30 22 0:35 / /home rw,relatime shared:9 - btrfs /dev/loop3 rw,space_cache=v2
31 22 7:4 / /srv rw,relatime shared:10 master:2 - xfs /dev/loop4 rw
32 22 0:22 / /proc rw - proc proc rw
";
        let rdev = |s: &str| match s {
            "/dev/loop3" => Some(libc::makedev(7, 3)),
            "/dev/loop4" => Some(libc::makedev(7, 4)),
            "/dev/vda1" => Some(libc::makedev(254, 1)),
            _ => None,
        };
        let cases = [
            ("by MAJ:MIN", libc::makedev(254, 1), Some("ext4")),
            ("optional fields skipped", libc::makedev(7, 4), Some("xfs")),
            ("btrfs by its source", libc::makedev(7, 3), Some("btrfs")),
            ("not mounted", libc::makedev(8, 0), None),
        ];
        for (name, dev, want) in cases {
            assert_eq!(filesystem_of(text, dev, rdev).as_deref(), want, "{name}");
        }
    }
}
