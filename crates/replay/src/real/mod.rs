//! The real [`Backend`]: a thin layer of Linux syscalls.
//!
//! Choices that matter for "do no harm":
//! - Plan paths are opened through [`warmstart_sys::OpenOptions`]: `O_PATH`
//!   without following a final symlink (recorded paths are canonical, so a
//!   symlink there is a swap), `fstat`, and only for a regular file (or the
//!   expected block device) a reopen of that very inode through
//!   `PROCFS/self/fd`. A path that now names a FIFO or a device is never
//!   opened for reading, so it can neither block nor have side effects.
//! - Files are read with `O_NOATIME`, so prefetching never writes an access
//!   time; `posix_fadvise(WILLNEED)` does not update atime anyway, and
//!   directories are only listed where `O_NOATIME` is allowed.
//! - `POSIX_FADV_RANDOM` on our own descriptors keeps the kernel from adding
//!   speculative readahead around the ranges we ask for; it does not shrink
//!   the window `WILLNEED` may read in one call.
//!
//! Every system location (`/sys`, `/proc`, `/dev`) is a root that tests can
//! point at fixtures.

mod device;
mod residency;

pub use device::read_ahead_bytes;

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use warmstart_plan::trace::{FileId, NsOpKind};
use warmstart_sys::sched::{self, Policy};
use warmstart_sys::{fadvise, FileKind};

use crate::backend::{Backend, IoPriority, LookupOutcome, MemInfo, Residency};
use crate::ReplayError;

/// How long a [`RealBackend`] trusts what it learned about a device: its
/// read-ahead size, and that opening it was refused.
const DEVICE_MEMO_TTL: Duration = Duration::from_secs(60);

/// The Linux backend. Cheap to create; holds no descriptors itself.
///
/// One backend can serve many replays (the daemon keeps one): it then
/// remembers, for a minute, each device's read-ahead size, the
/// filesystem mounted from it, and a device it was not allowed to open,
/// so that a launch's replay does not start by reading sysfs and the mount
/// table and failing to open `/dev/vda` again. On this
/// project's VM that was ~0.5 ms of the daemon's exec -> first request.
#[derive(Debug)]
pub struct RealBackend {
    sysfs: PathBuf,
    procfs: PathBuf,
    devfs: PathBuf,
    memo: Mutex<DeviceMemo>,
}

#[derive(Debug, Default)]
struct DeviceMemo {
    read_ahead: HashMap<u64, (Option<u64>, Instant)>,
    /// The node tried last and the errno that refused it.
    refused: HashMap<u64, (PathBuf, i32, Instant)>,
    /// The filesystem mounted from a device, if any.
    filesystem: HashMap<u64, (Option<String>, Instant)>,
}

impl Default for RealBackend {
    fn default() -> Self {
        Self::new()
    }
}

/// An open file or block device.
#[derive(Debug)]
pub struct RealHandle {
    file: File,
    name: PathBuf,
    /// Bytes: the file size, or the device size. Residency is clipped to it.
    size: u64,
}

impl RealHandle {
    pub fn name(&self) -> &Path {
        &self.name
    }

    pub fn size(&self) -> u64 {
        self.size
    }
}

impl RealBackend {
    /// Uses `/sys`, `/proc` and `/dev`.
    pub fn new() -> Self {
        Self::with_roots("/sys", "/proc", "/dev")
    }

    fn memo(&self) -> std::sync::MutexGuard<'_, DeviceMemo> {
        self.memo.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Uses other roots for sysfs, procfs and devfs (for tests).
    pub fn with_roots(
        sysfs: impl Into<PathBuf>,
        procfs: impl Into<PathBuf>,
        devfs: impl Into<PathBuf>,
    ) -> Self {
        RealBackend {
            sysfs: sysfs.into(),
            procfs: procfs.into(),
            devfs: devfs.into(),
            memo: Mutex::new(DeviceMemo::default()),
        }
    }

    /// How plan files and devices are opened: read-only, `O_NOATIME` where
    /// allowed, reopened through this backend's procfs.
    fn opener(&self, how: warmstart_sys::OpenOptions) -> warmstart_sys::OpenOptions {
        how.noatime(true).proc_fd(self.procfs.join("self/fd"))
    }
}

impl Backend for RealBackend {
    type Handle = RealHandle;

    fn open_file(&self, path: &Path) -> Result<(RealHandle, FileId), ReplayError> {
        let opened = self
            .opener(warmstart_sys::OpenOptions::file())
            .open(path)
            .map_err(|e| file_error(path, e))?;
        advise_random(&opened.file);
        let id = file_id(&opened.identity);
        let h = RealHandle {
            file: opened.file,
            name: path.to_path_buf(),
            size: id.size,
        };
        Ok((h, id))
    }
    fn open_device(&self, device: u64) -> Result<RealHandle, ReplayError> {
        self.open_block_device(device)
    }

    fn refused_device(&self, device: u64) -> Option<ReplayError> {
        self.device_refused(device)
    }

    fn prefetch(&self, h: &RealHandle, offset: u64, len: u64) -> Result<(), ReplayError> {
        fadvise::willneed(&h.file, offset, len).map_err(|source| ReplayError::Prefetch {
            path: h.name.clone(),
            offset,
            len,
            source,
        })
    }

    fn lookup(&self, kind: NsOpKind, path: &Path) -> Result<LookupOutcome, ReplayError> {
        let outcome = |r: io::Result<LookupOutcome>| match r {
            Ok(o) => Ok(o),
            Err(e) if is_absent(&e) => Ok(LookupOutcome::NotFound),
            Err(source) => Err(ReplayError::Lookup {
                kind: kind.name(),
                path: path.to_path_buf(),
                source,
            }),
        };
        outcome(match kind {
            // The walk and the inode read are the cost of a cold stat.
            NsOpKind::Stat | NsOpKind::Access => fs::metadata(path).map(|_| LookupOutcome::Found),
            NsOpKind::Readlink => match fs::read_link(path) {
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(LookupOutcome::Found),
                r => r.map(|_| LookupOutcome::Found),
            },
            // O_PATH walks the path and instantiates the inode like the
            // application's open or exec did, without opening a device node
            // or FIFO the path may name; the exec'd file's data pages are
            // data entries of their own.
            NsOpKind::Open | NsOpKind::Exec => OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_PATH)
                .open(path)
                .map(|_| LookupOutcome::Found),
            NsOpKind::DirRead => read_dir_noatime(&self.procfs, path),
        })
    }

    fn memory(&self) -> Result<MemInfo, ReplayError> {
        let path = self.procfs.join("meminfo");
        let text = read_proc_file(&path).map_err(|e| ReplayError::Memory {
            path: path.clone(),
            what: e.to_string(),
        })?;
        parse_meminfo(&text).map_err(|what| ReplayError::Memory { path, what })
    }

    fn device_filesystem(&self, device: u64) -> Option<String> {
        if let Some((fs, at)) = self.memo().filesystem.get(&device) {
            if at.elapsed() < DEVICE_MEMO_TTL {
                return fs.clone();
            }
        }
        let fs = self.mounted_filesystem(device);
        self.memo()
            .filesystem
            .insert(device, (fs.clone(), Instant::now()));
        fs
    }

    fn read_ahead(&self, device: u64) -> Option<u64> {
        if let Some((bytes, at)) = self.memo().read_ahead.get(&device) {
            if at.elapsed() < DEVICE_MEMO_TTL {
                return *bytes;
            }
        }
        let bytes = read_ahead_bytes(&self.sysfs, device);
        self.memo()
            .read_ahead
            .insert(device, (bytes, Instant::now()));
        bytes
    }

    fn residency(&self, h: &RealHandle, offset: u64, len: u64) -> Result<Residency, ReplayError> {
        self.pages_in_cache(h, offset, len, false)
    }

    fn read_through(&self, h: &RealHandle, offset: u64, len: u64) -> Result<(), ReplayError> {
        self.read_range(h, offset, len)
    }
    fn thread_cpus(&self) -> Result<Vec<usize>, ReplayError> {
        sched::thread_cpus().map_err(|e| affinity_error("(reading the current ones)".into(), e))
    }

    fn set_thread_cpus(&self, cpus: &[usize]) -> Result<(), ReplayError> {
        sched::set_thread_cpus(cpus)
            .map_err(|e| affinity_error(crate::ReplayCpus::List(cpus.to_vec()).to_string(), e))
    }

    fn leave_realtime(&self) {
        // A failure leaves the thread as it was: still able to replay.
        let _ = sched::leave_realtime();
    }

    fn run_when_idle(&self) -> Result<(), ReplayError> {
        sched::set_policy(Policy::Idle).map_err(|e| ReplayError::IdlePriority {
            source: os_error(e),
        })
    }

    fn set_io_priority(&self, prio: IoPriority) -> Result<(), ReplayError> {
        sched::set_io_priority(prio.into()).map_err(|e| ReplayError::IoPriority {
            prio,
            source: os_error(e),
        })
    }
}

/// A plan's file identity from what `fstat` said (the same five fields).
pub fn file_id(i: &warmstart_sys::FileIdentity) -> FileId {
    FileId {
        dev: i.dev,
        ino: i.ino,
        size: i.size,
        mtime_ns: i.mtime_ns,
        ctime_ns: i.ctime_ns,
    }
}

/// The system error behind an OS-layer error, for the replay's own
/// variants (which name the path or value themselves).
fn os_error(e: warmstart_sys::Error) -> io::Error {
    use warmstart_sys::Error as E;
    match e {
        E::Open { source, .. }
        | E::Stat { source, .. }
        | E::Fiemap { source, .. }
        | E::Residency { source, .. }
        | E::Fadvise { source, .. }
        | E::Scheduler { source, .. }
        | E::IoPriority { source, .. }
        | E::Affinity { source, .. }
        | E::Nice { source, .. } => source,
        other => io::Error::new(io::ErrorKind::InvalidInput, other.to_string()),
    }
}

fn affinity_error(cpus: String, e: warmstart_sys::Error) -> ReplayError {
    ReplayError::Affinity {
        cpus,
        source: os_error(e),
    }
}

/// Why a plan file could not be opened, as the engine sorts it into skip
/// reasons: missing, not a regular file (with what it is now), or failed.
fn file_error(path: &Path, e: warmstart_sys::Error) -> ReplayError {
    match e {
        warmstart_sys::Error::WrongKind { found, .. } => ReplayError::NotRegular {
            path: path.to_path_buf(),
            found: found.to_string(),
        },
        other => ReplayError::Open {
            path: path.to_path_buf(),
            source: os_error(other),
        },
    }
}

/// Tells the kernel not to read ahead around our requests on this
/// descriptor: we ask for exactly what the plan says. A failure only means
/// the kernel may read a little more than asked.
fn advise_random(file: &File) {
    let _ = fadvise::random(file);
}

/// Lists a directory with getdents64 so its blocks enter the cache, as the
/// application's readdir did. Listing updates the directory's atime unless
/// opened with `O_NOATIME`; where that is refused (not the owner, no
/// `CAP_FOWNER`), the open has walked the path and read the inode, as a
/// stat would, and the listing is left out. A final symlink is not
/// followed (recorded paths are canonical): what is not a directory now
/// reads as absent, as `ENOTDIR` did.
fn read_dir_noatime(procfs: &Path, path: &Path) -> io::Result<LookupOutcome> {
    let opened = warmstart_sys::OpenOptions::directory()
        .noatime(true)
        .proc_fd(procfs.join("self/fd"))
        .open(path);
    let dir = match opened {
        Ok(o) if o.noatime => o.file,
        Ok(_) => return Ok(LookupOutcome::StatOnly),
        Err(warmstart_sys::Error::WrongKind { found, .. }) if found != FileKind::Directory => {
            return Ok(LookupOutcome::NotFound)
        }
        Err(e) => return Err(os_error(e)),
    };
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        // SAFETY: getdents64 writes at most `buf.len()` bytes into `buf`,
        // which is live and exclusively borrowed for the call.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                dir.as_raw_fd(),
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        match n {
            0 => return Ok(LookupOutcome::Found),
            n if n < 0 => return Err(io::Error::last_os_error()),
            _ => {}
        }
    }
}

fn is_absent(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENOTDIR)
}

/// Reads a procfs file in one `read` where it fits in 8 KiB. procfs files
/// report size 0, so `fs::read_to_string` probes with 32 bytes and grows
/// the buffer: eight reads for `/proc/meminfo`, each of which makes the
/// kernel generate the whole file again. The replay reads it before its
/// first request.
fn read_proc_file(path: &Path) -> io::Result<String> {
    use std::io::Read;
    let mut f = File::open(path)?;
    let mut buf = vec![0u8; 8192];
    let mut len = 0;
    loop {
        if len == buf.len() {
            buf.resize(len * 2, 0);
        }
        match f.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(len);
    String::from_utf8(buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// `MemTotal` and `MemAvailable` from the text of `/proc/meminfo`.
pub fn parse_meminfo(text: &str) -> Result<MemInfo, String> {
    let field = |name: &str| -> Result<u64, String> {
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .ok_or_else(|| format!("no {name} line"))?;
        let mut parts = line.split_whitespace();
        let n: u64 = parts
            .next()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("bad {name} value {line:?}"))?;
        match parts.next() {
            Some("kB") => Ok(n * 1024),
            None => Ok(n),
            Some(unit) => Err(format!("unknown unit {unit:?} for {name}")),
        }
    };
    Ok(MemInfo {
        total: field("MemTotal")?,
        available: field("MemAvailable")?,
    })
}

/// A warning when `cpus` is a list naming CPUs this process may not use
/// (the replay then uses the others, or runs anywhere).
pub fn unusable_cpus(cpus: &crate::ReplayCpus) -> Option<String> {
    if !matches!(cpus, crate::ReplayCpus::List(_)) {
        return None;
    }
    cpus.check(&RealBackend::new().thread_cpus().ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, MetadataExt};

    #[test]
    fn meminfo_parsing() {
        let text =
            "MemTotal:       24681000 kB\nMemFree:        1 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(
            parse_meminfo(text),
            Ok(MemInfo {
                total: 24681000 * 1024,
                available: 20000000 * 1024
            })
        );
        assert!(parse_meminfo("MemTotal: 5 kB\n")
            .unwrap_err()
            .contains("MemAvailable"));
        assert!(parse_meminfo("MemTotal: x kB\nMemAvailable: 1 kB\n")
            .unwrap_err()
            .contains("bad MemTotal"));
    }

    /// Lookups need no privileges: run them on a temp tree.
    #[test]
    fn lookups_on_a_temp_tree() {
        let root = tempfile::tempdir().unwrap();
        let d = root.path();
        fs::create_dir(d.join("dir")).unwrap();
        for i in 0..50 {
            fs::write(d.join(format!("dir/f{i}")), b"x").unwrap();
        }
        symlink("dir/f0", d.join("link")).unwrap();
        symlink("nowhere", d.join("dangling")).unwrap();
        symlink("dir", d.join("dirlink")).unwrap();
        let b = RealBackend::new();
        let cases = [
            (NsOpKind::Stat, "dir/f1", LookupOutcome::Found),
            (NsOpKind::Access, "dir/f1", LookupOutcome::Found),
            (NsOpKind::Stat, "dir/absent", LookupOutcome::NotFound),
            (
                NsOpKind::Stat,
                "dir/f1/under-a-file",
                LookupOutcome::NotFound,
            ),
            (NsOpKind::Stat, "dangling", LookupOutcome::NotFound),
            (NsOpKind::Readlink, "link", LookupOutcome::Found),
            (NsOpKind::Readlink, "dir/f1", LookupOutcome::Found),
            (NsOpKind::Open, "link", LookupOutcome::Found),
            (NsOpKind::Exec, "dir/absent", LookupOutcome::NotFound),
            (NsOpKind::DirRead, "dir", LookupOutcome::Found),
            (NsOpKind::DirRead, "dir/f1", LookupOutcome::NotFound),
            // Recorded paths are canonical: a symlink there is not followed.
            (NsOpKind::DirRead, "dirlink", LookupOutcome::NotFound),
            (NsOpKind::DirRead, "dir/absent", LookupOutcome::NotFound),
        ];
        for (kind, rel, want) in cases {
            let got = b.lookup(kind, &d.join(rel));
            assert_eq!(got.ok(), Some(want), "{} {rel}", kind.name());
        }
    }

    #[test]
    fn open_file_reports_identity_and_refuses_non_regular() {
        let root = tempfile::tempdir().unwrap();
        let f = root.path().join("f");
        fs::write(&f, vec![7u8; 10_000]).unwrap();
        let b = RealBackend::new();
        let (h, id) = b.open_file(&f).unwrap();
        let m = fs::metadata(&f).unwrap();
        assert_eq!((id.dev, id.ino, id.size), (m.dev(), m.ino(), 10_000));
        assert_eq!(id.mtime_ns, m.mtime() * 1_000_000_000 + m.mtime_nsec());
        assert_eq!(id.ctime_ns, m.ctime() * 1_000_000_000 + m.ctime_nsec());
        assert_eq!(h.size(), 10_000);
        b.prefetch(&h, 0, 10_000).unwrap();
        let r = b.residency(&h, 0, 1 << 20).unwrap();
        assert_eq!(
            r.pages,
            10_000u64.div_ceil(warmstart_sys::residency::page_size()),
            "clipped at end of file"
        );
        assert!(matches!(
            b.open_file(root.path()),
            Err(ReplayError::NotRegular { .. })
        ));
        let missing = b.open_file(&root.path().join("absent")).unwrap_err();
        assert!(missing.to_string().contains("absent"), "{missing}");
    }
}
