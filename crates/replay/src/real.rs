//! The real [`Backend`]: a thin layer of Linux syscalls.
//!
//! Choices that matter for "do no harm":
//! - Plan paths are first opened with `O_PATH`, which walks the path and
//!   reads the inode but opens nothing: if a path now names a device node or
//!   a FIFO, opening it for reading could block or have side effects (a
//!   watchdog starts, a tape rewinds). Only after `fstat` shows the expected
//!   kind of file is it reopened for reading through `/proc/self/fd`, which
//!   reopens that very inode, so nothing can be swapped in between.
//! - Files are read with `O_NOATIME`, so prefetching never writes an access
//!   time; `posix_fadvise(WILLNEED)` does not update atime anyway, and
//!   directories are only listed where `O_NOATIME` is allowed.
//! - `POSIX_FADV_RANDOM` on our own descriptors keeps the kernel from adding
//!   speculative readahead around the ranges we ask for; it does not shrink
//!   the window `WILLNEED` may read in one call.
//!
//! Every system location (`/sys`, `/proc`, `/dev`) is a root that tests can
//! point at fixtures.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use warmstart_plan::trace::{FileId, NsOpKind};

use crate::backend::{Backend, IoPriority, LookupOutcome, MemInfo, Residency};
use crate::error::dev_name;
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

/// `IOPRIO_WHO_PROCESS`: with id 0, the calling thread.
const IOPRIO_WHO_PROCESS: libc::c_int = 1;

const CACHESTAT_UNKNOWN: u8 = 0;
const CACHESTAT_YES: u8 = 1;
const CACHESTAT_NO: u8 = 2;

/// mincore is queried in windows of this many bytes, bounding the mapping
/// and the result vector.
const MINCORE_WINDOW: u64 = 256 << 20;

/// How long a [`RealBackend`] trusts what it learned about a device: its
/// read-ahead size, and that opening it was refused.
const DEVICE_MEMO_TTL: Duration = Duration::from_secs(60);

/// The Linux backend. Cheap to create; holds no descriptors itself.
///
/// One backend can serve many replays (the daemon keeps one): it then
/// remembers, for [`DEVICE_MEMO_TTL`], each device's read-ahead size and
/// a device it was not allowed to open, so that a launch's replay does not
/// start by reading sysfs and failing to open `/dev/vda` again. On this
/// project's VM that was ~0.5 ms of the daemon's exec -> first request.
#[derive(Debug)]
pub struct RealBackend {
    sysfs: PathBuf,
    procfs: PathBuf,
    devfs: PathBuf,
    cachestat: AtomicU8,
    memo: Mutex<DeviceMemo>,
}

#[derive(Debug, Default)]
struct DeviceMemo {
    read_ahead: HashMap<u64, (Option<u64>, Instant)>,
    /// The node tried last and the errno that refused it.
    refused: HashMap<u64, (PathBuf, i32, Instant)>,
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

    /// Pages of the range in the page cache, counting those still being
    /// read: a quick "is this launch warm" that cannot end a wait (see
    /// [`Backend::residency`]). One `cachestat` call instead of a mapping
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
    fn pages_in_cache(
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
            cachestat: AtomicU8::new(CACHESTAT_UNKNOWN),
            memo: Mutex::new(DeviceMemo::default()),
        }
    }

    /// Opens `path` with `O_PATH` (no side effects, not even on device
    /// nodes), lets `check` judge its metadata, then reopens that same inode
    /// read-only through procfs.
    fn open_checked(
        &self,
        path: &Path,
        extra_flags: libc::c_int,
        check: impl FnOnce(&fs::Metadata) -> Result<(), ReplayError>,
    ) -> Result<(File, fs::Metadata), ReplayError> {
        let open_err = |source| ReplayError::Open {
            path: path.to_path_buf(),
            source,
        };
        let opath = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH)
            .open(path)
            .map_err(open_err)?;
        let meta = opath.metadata().map_err(open_err)?;
        check(&meta)?;
        let via = self
            .procfs
            .join("self/fd")
            .join(opath.as_raw_fd().to_string());
        let file = open_noatime(&via, extra_flags | libc::O_NOCTTY).map_err(open_err)?;
        Ok((file, meta))
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

    /// Pages of the range in the page cache, including those still being
    /// read (see [`Backend::residency`] for why that is not residency).
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

impl Backend for RealBackend {
    type Handle = RealHandle;

    fn open_file(&self, path: &Path) -> Result<(RealHandle, FileId), ReplayError> {
        let (file, meta) = self.open_checked(path, 0, |m| {
            if m.file_type().is_file() {
                Ok(())
            } else {
                Err(ReplayError::NotRegular {
                    path: path.to_path_buf(),
                })
            }
        })?;
        advise_random(&file);
        let id = FileId {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
            ctime_ns: meta.ctime() * 1_000_000_000 + meta.ctime_nsec(),
        };
        let h = RealHandle {
            file,
            name: path.to_path_buf(),
            size: meta.size(),
        };
        Ok((h, id))
    }

    fn open_device(&self, device: u64) -> Result<RealHandle, ReplayError> {
        if let Some(e) = self.refused_device(device) {
            return Err(e);
        }
        let mut last = None;
        for node in self.device_nodes(device) {
            let checked = self.open_checked(&node, libc::O_NONBLOCK, |m| {
                if m.file_type().is_block_device() && m.rdev() == device {
                    Ok(())
                } else {
                    Err(ReplayError::Device {
                        device,
                        path: node.clone(),
                        source: io::Error::new(
                            io::ErrorKind::InvalidInput,
                            "not that block device",
                        ),
                    })
                }
            });
            let (mut file, _) = match checked {
                Ok(f) => f,
                Err(ReplayError::Open { path, source }) => {
                    last = Some(ReplayError::Device {
                        device,
                        path,
                        source,
                    });
                    continue;
                }
                Err(e) => {
                    last = Some(e);
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

    fn refused_device(&self, device: u64) -> Option<ReplayError> {
        let memo = self.memo();
        let (path, errno, at) = memo.refused.get(&device)?;
        (at.elapsed() < DEVICE_MEMO_TTL).then(|| ReplayError::Device {
            device,
            path: path.clone(),
            source: io::Error::from_raw_os_error(*errno),
        })
    }

    fn prefetch(&self, h: &RealHandle, offset: u64, len: u64) -> Result<(), ReplayError> {
        let err = |source| ReplayError::Prefetch {
            path: h.name.clone(),
            offset,
            len,
            source,
        };
        let overflow = || err(io::Error::from_raw_os_error(libc::EOVERFLOW));
        let off = libc::off_t::try_from(offset).map_err(|_| overflow())?;
        let n = libc::off_t::try_from(len).map_err(|_| overflow())?;
        // SAFETY: plain syscall on a descriptor `h` keeps open; no memory is
        // passed.
        let r =
            unsafe { libc::posix_fadvise(h.file.as_raw_fd(), off, n, libc::POSIX_FADV_WILLNEED) };
        if r != 0 {
            return Err(err(io::Error::from_raw_os_error(r)));
        }
        Ok(())
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
            NsOpKind::DirRead => read_dir_noatime(path),
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

    fn thread_cpus(&self) -> Result<Vec<usize>, ReplayError> {
        // SAFETY: a zeroed cpu_set_t is a valid empty set; the kernel writes
        // at most its size; pid 0 is the calling thread.
        let set = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
                return Err(ReplayError::Affinity {
                    cpus: "(reading the current ones)".into(),
                    source: io::Error::last_os_error(),
                });
            }
            set
        };
        // SAFETY: CPU_ISSET reads the set; every index is below CPU_SETSIZE.
        Ok((0..libc::CPU_SETSIZE as usize)
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
            .collect())
    }

    fn set_thread_cpus(&self, cpus: &[usize]) -> Result<(), ReplayError> {
        let fail = |source| ReplayError::Affinity {
            cpus: crate::ReplayCpus::List(cpus.to_vec()).to_string(),
            source,
        };
        if cpus.iter().any(|&c| c >= libc::CPU_SETSIZE as usize) {
            return Err(fail(io::Error::from_raw_os_error(libc::EINVAL)));
        }
        // SAFETY: a zeroed cpu_set_t is a valid empty set and every index
        // is below CPU_SETSIZE; pid 0 is the calling thread.
        let r = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for &c in cpus {
                libc::CPU_SET(c, &mut set);
            }
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
        };
        if r != 0 {
            return Err(fail(io::Error::last_os_error()));
        }
        Ok(())
    }

    fn leave_realtime(&self) {
        // SAFETY: pid 0 is the calling thread; param is a valid
        // sched_param. A failure leaves the thread as it was.
        unsafe {
            let policy = libc::sched_getscheduler(0);
            if policy == libc::SCHED_FIFO || policy == libc::SCHED_RR {
                let param = libc::sched_param { sched_priority: 0 };
                libc::sched_setscheduler(0, libc::SCHED_OTHER, &param);
            }
        }
    }

    fn run_when_idle(&self) -> Result<(), ReplayError> {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: pid 0 is the calling thread; param is a valid
        // sched_param. Lowering one's own priority needs no privilege.
        if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
            return Err(ReplayError::IdlePriority {
                source: io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    fn set_io_priority(&self, prio: IoPriority) -> Result<(), ReplayError> {
        // SAFETY: plain syscall with integer arguments; it affects only the
        // calling thread (who = IOPRIO_WHO_PROCESS, id = 0).
        let r = unsafe {
            libc::syscall(
                libc::SYS_ioprio_set,
                IOPRIO_WHO_PROCESS,
                0 as libc::c_int,
                libc::c_int::from(prio.raw()),
            )
        };
        if r < 0 {
            return Err(ReplayError::IoPriority {
                prio,
                source: io::Error::last_os_error(),
            });
        }
        Ok(())
    }
}

/// Opens `path` read-only with `O_NOATIME`, or without it where the kernel
/// refuses (`EPERM`: not the owner, no `CAP_FOWNER`). Reading through
/// `posix_fadvise` never touches atime, so the fallback is harmless for
/// files; directories do not use it (see [`read_dir_noatime`]).
fn open_noatime(path: &Path, flags: libc::c_int) -> io::Result<File> {
    let open = |f| OpenOptions::new().read(true).custom_flags(f).open(path);
    match open(flags | libc::O_NOATIME) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => open(flags),
        r => r,
    }
}

/// Tells the kernel not to read ahead around our requests on this
/// descriptor: we ask for exactly what the plan says.
fn advise_random(file: &File) {
    // SAFETY: plain syscall on an open descriptor; no memory is passed.
    // A failure only means the kernel may read a little more than asked.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
}

/// Lists a directory with getdents64 so its blocks enter the cache, as the
/// application's readdir did. Listing updates the directory's atime unless
/// opened with `O_NOATIME`; where that is refused, only stat it.
fn read_dir_noatime(path: &Path) -> io::Result<LookupOutcome> {
    let open = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOATIME)
        .open(path);
    let dir = match open {
        Ok(d) => d,
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
            fs::metadata(path)?;
            return Ok(LookupOutcome::StatOnly);
        }
        Err(e) => return Err(e),
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

fn page_size() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
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
    use std::os::unix::fs::symlink;

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
    fn run_when_idle_moves_the_thread_to_sched_idle() {
        std::thread::spawn(|| {
            let b = RealBackend::new();
            b.run_when_idle().unwrap();
            // SAFETY: pid 0 is the calling thread.
            assert_eq!(unsafe { libc::sched_getscheduler(0) }, libc::SCHED_IDLE);
        })
        .join()
        .unwrap();
    }

    /// A thread started by a real-time thread inherits its priority; the
    /// replay's threads give it up after their first piece of work. Needs
    /// CAP_SYS_NICE to become real-time at all (the root tests have it).
    #[test]
    fn leave_realtime_returns_to_normal_scheduling() {
        std::thread::spawn(|| {
            let p = libc::sched_param { sched_priority: 1 };
            // SAFETY: pid 0 is this test thread; p is a valid sched_param.
            if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) } != 0 {
                eprintln!("skipped: cannot become real-time here");
                return;
            }
            let b = RealBackend::new();
            b.leave_realtime();
            // SAFETY: reads the calling thread's policy.
            assert_eq!(unsafe { libc::sched_getscheduler(0) }, libc::SCHED_OTHER);
            b.leave_realtime();
            // SAFETY: as above.
            assert_eq!(unsafe { libc::sched_getscheduler(0) }, libc::SCHED_OTHER);
        })
        .join()
        .unwrap();
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
        assert_eq!(h.size(), 10_000);
        b.prefetch(&h, 0, 10_000).unwrap();
        let r = b.residency(&h, 0, 1 << 20).unwrap();
        assert_eq!(
            r.pages,
            10_000u64.div_ceil(page_size()),
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
