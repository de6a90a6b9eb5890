//! The kernel side of the testbed: loop devices, mounts, cache dropping.
//!
//! Loop devices are attached with `losetup` (util-linux knows every
//! LOOP_CONFIGURE/LOOP_SET_STATUS64 quirk of each kernel; the `loopdev`
//! crate lags behind); everything else is a direct syscall.

use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::mount::{mount, umount2, MntFlags, MsFlags};

use crate::Error;

/// Runs a tool to completion; a non-zero exit becomes [`Error::Command`]
/// with its stderr.
pub(crate) fn run(cmd: &mut Command) -> Result<String, Error> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let args: Vec<String> = cmd
        .get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let out = cmd.output().map_err(|source| Error::Spawn {
        program: program.clone(),
        source,
    })?;
    if !out.status.success() {
        return Err(Error::Command {
            program,
            args,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Attaches `file` to a free loop device; returns the device path.
pub(crate) fn loop_attach(file: &Path, direct_io: bool) -> Result<PathBuf, Error> {
    let mut cmd = Command::new("losetup");
    if direct_io {
        cmd.arg("--direct-io=on");
    }
    cmd.args(["-f", "--show"]).arg(file);
    Ok(PathBuf::from(run(&mut cmd)?))
}

/// Detaches a loop device. If it is still open (a lazily unmounted
/// filesystem, a process inside the chroot) the kernel detaches it when the
/// last user closes it.
///
/// Someone else may hold it open for a moment (udev probing a device that
/// just changed), so this waits up to two seconds for the detach to
/// finish; a device still busy after that goes when it is closed.
pub(crate) fn loop_detach(dev: &Path) -> Result<(), Error> {
    run(Command::new("losetup").arg("-d").arg(dev))?;
    let backing = sys_block(dev).join("loop/backing_file");
    for _ in 0..200 {
        if !backing.exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Ok(())
}

/// `/sys/block/loopN` of a loop device path.
pub(crate) fn sys_block(dev: &Path) -> PathBuf {
    let name = dev.file_name().unwrap_or_default();
    Path::new("/sys/block").join(name)
}

/// Whether the kernel really does direct I/O to the loop's backing file
/// (it falls back to buffered I/O when the file cannot do O_DIRECT).
pub(crate) fn loop_direct_io(dev: &Path) -> bool {
    fs::read_to_string(sys_block(dev).join("loop/dio")).is_ok_and(|s| s.trim() == "1")
}

/// Read and write counters of a block device (`/sys/block/X/stat`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockStat {
    /// Read requests completed.
    pub read_ios: u64,
    /// 512-byte sectors read.
    pub read_sectors: u64,
    /// Write requests completed.
    pub write_ios: u64,
}

impl BlockStat {
    /// Parses the fields of `/sys/block/X/stat` (Documentation/block/stat.rst).
    pub fn parse(text: &str) -> Option<BlockStat> {
        let f: Vec<u64> = text
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        Some(BlockStat {
            read_ios: *f.first()?,
            read_sectors: *f.get(2)?,
            write_ios: *f.get(4)?,
        })
    }
}

pub(crate) fn block_stat(dev: &Path) -> Result<BlockStat, Error> {
    let path = sys_block(dev).join("stat");
    let text = fs::read_to_string(&path).map_err(|source| Error::Io {
        path: path.clone(),
        source,
    })?;
    BlockStat::parse(&text).ok_or(Error::Parse {
        path,
        what: "block device stat",
    })
}

// BLKFLSBUF: _IO(0x12, 97) in <linux/fs.h>.
nix::ioctl_none!(blkflsbuf, 0x12, 97);

/// Writes back and drops the block device's own page cache (where ext4 and
/// xfs keep metadata read through the buffer cache).
pub(crate) fn flush_block_device(dev: &Path) -> Result<(), Error> {
    let file = fs::File::open(dev).map_err(|source| Error::Io {
        path: dev.to_path_buf(),
        source,
    })?;
    // SAFETY: BLKFLSBUF takes no argument; the descriptor is a block device
    // we opened and keep open for the call.
    unsafe { blkflsbuf(file.as_raw_fd()) }.map_err(|e| Error::Io {
        path: dev.to_path_buf(),
        source: e.into(),
    })?;
    Ok(())
}

/// Writes back everything and drops the page cache, dentries and inodes.
pub(crate) fn drop_page_cache() -> Result<(), Error> {
    nix::unistd::sync();
    let path = Path::new("/proc/sys/vm/drop_caches");
    fs::write(path, "3\n").map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Drops a file's pages from the page cache.
pub(crate) fn fadvise_dontneed(path: &Path) -> Result<(), Error> {
    let file = fs::File::open(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    nix::fcntl::posix_fadvise(
        file.as_raw_fd(),
        0,
        0,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    )
    .map_err(|e| Error::Io {
        path: path.to_path_buf(),
        source: e.into(),
    })
}

pub(crate) fn mount_fs(dev: &Path, target: &Path, fstype: &str) -> Result<(), Error> {
    mount(
        Some(dev),
        target,
        Some(fstype),
        MsFlags::MS_NOATIME,
        None::<&str>,
    )
    .map_err(|e| Error::Mount {
        source_path: dev.to_path_buf(),
        target: target.to_path_buf(),
        source: e.into(),
    })
}

/// Unmounts `target`; when it is busy, detaches it lazily (the filesystem
/// goes away when its last user does).
pub(crate) fn unmount(target: &Path) -> Result<(), Error> {
    match umount2(target, MntFlags::empty()) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EBUSY) => {
            umount2(target, MntFlags::MNT_DETACH).map_err(|e| Error::Unmount {
                target: target.to_path_buf(),
                source: e.into(),
            })
        }
        Err(e) => Err(Error::Unmount {
            target: target.to_path_buf(),
            source: e.into(),
        }),
    }
}

/// One line of `/proc/mounts`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    /// What is mounted (a device path for block filesystems).
    pub source: String,
    /// Where.
    pub target: PathBuf,
    /// Filesystem type.
    pub fstype: String,
}

/// Parses `/proc/mounts` text (octal escapes such as `\040` decoded).
pub fn parse_mounts(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.split(' ');
            Some(MountEntry {
                source: unescape(f.next()?),
                target: PathBuf::from(unescape(f.next()?)),
                fstype: f.next()?.to_string(),
            })
        })
        .collect()
}

fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub(crate) fn mounts() -> Result<Vec<MountEntry>, Error> {
    let path = Path::new("/proc/mounts");
    let text = fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(parse_mounts(&text))
}

/// Attached loop devices and their backing files.
pub(crate) fn loops() -> Vec<(PathBuf, PathBuf)> {
    let Ok(dir) = fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in dir.flatten() {
        let name = e.file_name();
        if !name.to_string_lossy().starts_with("loop") {
            continue;
        }
        if let Ok(backing) = fs::read_to_string(e.path().join("loop/backing_file")) {
            let backing = backing.trim_end_matches('\n');
            let backing = backing.strip_suffix(" (deleted)").unwrap_or(backing);
            out.push((Path::new("/dev").join(&name), PathBuf::from(backing)));
        }
    }
    out
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mounts_with_escapes() {
        let m = parse_mounts(
            "/dev/loop3 /run/warmstart-testbed/1-0-ext4/root ext4 rw,noatime 0 0\n\
             img /mnt/a\\040b fuse.warmstart rw 0 0\n",
        );
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].source, "/dev/loop3");
        assert_eq!(m[0].fstype, "ext4");
        assert_eq!(m[1].target, PathBuf::from("/mnt/a b"));
    }

    #[test]
    fn parses_block_stat() {
        let s = BlockStat::parse(
            "     120        0     4242       30        7        0       56        1        0       40       31        0        0        0        0        0        0\n",
        )
        .unwrap();
        assert_eq!(
            s,
            BlockStat {
                read_ios: 120,
                read_sectors: 4242,
                write_ios: 7
            }
        );
        assert!(BlockStat::parse("garbage").is_none());
    }
}
