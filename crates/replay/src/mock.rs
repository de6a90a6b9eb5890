//! A scripted [`Backend`] for tests, here and in the crates that drive
//! replay: it records every call in order, serves configurable file
//! identities, fails the opens it is told to, and can hold prefetches to
//! make concurrency observable. Nothing touches the system.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use warmstart_plan::trace::{FileId, NsOpKind, PAGE_SIZE};

use crate::backend::{Backend, IoPriority, LookupOutcome, MemInfo, Residency};
use crate::error::dev_name;
use crate::ReplayError;

/// One call the engine made, in the order made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    OpenFile(PathBuf),
    OpenDevice(u64),
    /// `target` is the path, or `dev:MAJ:MIN` for a device.
    Prefetch {
        target: String,
        offset: u64,
        len: u64,
    },
    Lookup(NsOpKind, PathBuf),
    Memory,
    Residency {
        target: String,
        offset: u64,
        len: u64,
    },
    IoPriority(IoPriority),
    /// A thread confined itself to these CPUs.
    Cpus(Vec<usize>),
    /// The calling thread moved to idle scheduling priority.
    Idle,
    /// A range read through the page cache (`Backend::read_through`).
    Read {
        target: String,
        offset: u64,
        len: u64,
    },
}

/// A mock open file or device.
#[derive(Debug)]
pub struct MockHandle {
    pub target: String,
    live: Arc<AtomicUsize>,
}

impl MockHandle {
    fn new(target: String, live: &Arc<AtomicUsize>) -> Self {
        live.fetch_add(1, Ordering::SeqCst);
        MockHandle {
            target,
            live: Arc::clone(live),
        }
    }
}

impl Drop for MockHandle {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::SeqCst);
    }
}

enum FileSpec {
    Present(FileId),
    Fails(i32),
    NotRegular,
}

/// See the module documentation. Configure with the `with_*` builders.
pub struct MockBackend {
    files: HashMap<PathBuf, FileSpec>,
    devices: HashSet<u64>,
    device_fs: HashMap<u64, String>,
    read_ahead: HashMap<u64, u64>,
    lookups: HashMap<PathBuf, Result<LookupOutcome, i32>>,
    memory: Mutex<VecDeque<MemInfo>>,
    last_memory: Mutex<MemInfo>,
    calls: Mutex<Vec<Call>>,
    /// `None`: prefetches run; `Some(n)`: n more may run, the rest block.
    held: Mutex<Option<u64>>,
    /// Opens block until [`MockBackend::release`] (see [`MockBackend::hold_opens`]).
    opens_held: Mutex<bool>,
    opening: AtomicUsize,
    max_opening: AtomicUsize,
    released: Condvar,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    not_resident_polls: AtomicU64,
    live: Arc<AtomicUsize>,
    /// Page ranges prefetched, per target.
    prefetched: Mutex<HashMap<String, Vec<(u64, u64)>>>,
    /// Pages, per target, that a prefetch leaves absent and only a read
    /// makes resident (see [`MockBackend::with_stuck_pages`]).
    stuck: Mutex<HashMap<String, HashSet<u64>>>,
    /// Targets whose `read_through` fails (see [`MockBackend::with_failing_reads`]).
    failing_reads: Mutex<HashSet<String>>,
    /// What `thread_cpus` answers: two CPUs unless set.
    cpus: Mutex<Vec<usize>>,
    refuse_moves: bool,
    /// Devices refused so far, remembered as [`crate::RealBackend`] does
    /// when `remember_refusals` is set.
    refused: Mutex<HashSet<u64>>,
    remember_refusals: bool,
}

impl Default for MockBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl MockBackend {
    /// No files (every open fails with `ENOENT`), no openable devices
    /// (`EPERM`), lookups found, 16 GiB of RAM all available.
    pub fn new() -> Self {
        let mem = MemInfo {
            total: 16 << 30,
            available: 16 << 30,
        };
        MockBackend {
            files: HashMap::new(),
            devices: HashSet::new(),
            device_fs: HashMap::new(),
            read_ahead: HashMap::new(),
            lookups: HashMap::new(),
            memory: Mutex::new(VecDeque::new()),
            last_memory: Mutex::new(mem),
            calls: Mutex::new(Vec::new()),
            held: Mutex::new(None),
            opens_held: Mutex::new(false),
            opening: AtomicUsize::new(0),
            max_opening: AtomicUsize::new(0),
            released: Condvar::new(),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            not_resident_polls: AtomicU64::new(0),
            live: Arc::new(AtomicUsize::new(0)),
            prefetched: Mutex::new(HashMap::new()),
            stuck: Mutex::new(HashMap::new()),
            failing_reads: Mutex::new(HashSet::new()),
            cpus: Mutex::new(vec![0, 1]),
            refuse_moves: false,
            refused: Mutex::new(HashSet::new()),
            remember_refusals: false,
        }
    }

    /// Remembers a device it refused, and says so before the next replay
    /// tries it again (as the daemon's long-lived backend does).
    pub fn remembering_refusals(mut self) -> Self {
        self.remember_refusals = true;
        self
    }

    /// Every `set_thread_cpus` fails (a CPU went offline meanwhile).
    pub fn refusing_cpu_moves(mut self) -> Self {
        self.refuse_moves = true;
        self
    }

    /// The CPUs threads may run on.
    pub fn with_cpus(self, cpus: &[usize]) -> Self {
        *lock(&self.cpus) = cpus.to_vec();
        self
    }

    /// A regular file whose open reports identity `id`.
    pub fn with_file(mut self, path: impl Into<PathBuf>, id: FileId) -> Self {
        self.files.insert(path.into(), FileSpec::Present(id));
        self
    }

    /// A path whose open fails with `errno`.
    pub fn with_failing_file(mut self, path: impl Into<PathBuf>, errno: i32) -> Self {
        self.files.insert(path.into(), FileSpec::Fails(errno));
        self
    }

    /// A path that names something other than a regular file.
    pub fn with_non_regular(mut self, path: impl Into<PathBuf>) -> Self {
        self.files.insert(path.into(), FileSpec::NotRegular);
        self
    }

    /// A block device that can be opened.
    pub fn with_device(mut self, device: u64) -> Self {
        self.devices.insert(device);
        self
    }

    /// The filesystem mounted from `device` (`ext4`, `xfs`, ...).
    pub fn with_device_fs(mut self, device: u64, fs: &str) -> Self {
        self.device_fs.insert(device, fs.to_string());
        self
    }

    /// The read-ahead limit of `device`, in bytes.
    pub fn with_read_ahead(mut self, device: u64, bytes: u64) -> Self {
        self.read_ahead.insert(device, bytes);
        self
    }

    /// The outcome of looking up `path` (default: found); `Err(errno)` fails.
    pub fn with_lookup(
        mut self,
        path: impl Into<PathBuf>,
        outcome: Result<LookupOutcome, i32>,
    ) -> Self {
        self.lookups.insert(path.into(), outcome);
        self
    }

    /// Memory states returned by successive `memory()` calls; the last one
    /// repeats.
    pub fn with_memory(self, states: impl IntoIterator<Item = MemInfo>) -> Self {
        let mut q: VecDeque<MemInfo> = states.into_iter().collect();
        if let Some(last) = q.pop_back() {
            *lock(&self.last_memory) = last;
        }
        *lock(&self.memory) = q;
        self
    }

    /// The first `n` residency queries report nothing resident; after that
    /// a range is resident once it was prefetched.
    pub fn with_not_resident_polls(self, n: u64) -> Self {
        self.not_resident_polls.store(n, Ordering::Relaxed);
        self
    }

    /// Pages `pages` of `target` (a path, or `dev:MAJ:MIN`) are in the
    /// cache but not up to date, as a filesystem leaves the device pages of
    /// metadata it read or created through buffer heads: a prefetch leaves
    /// them absent and only `read_through` makes them resident.
    pub fn with_stuck_pages(self, target: &str, pages: std::ops::Range<u64>) -> Self {
        lock(&self.stuck)
            .entry(target.to_string())
            .or_default()
            .extend(pages);
        self
    }

    /// Every `read_through` of `target` fails with EIO and changes
    /// nothing: its stuck pages stay absent.
    pub fn with_failing_reads(self, target: &str) -> Self {
        lock(&self.failing_reads).insert(target.to_string());
        self
    }

    /// Makes every `prefetch` block until [`MockBackend::allow`] or
    /// [`MockBackend::release`].
    pub fn hold(&self) {
        *lock(&self.held) = Some(0);
    }

    /// While held, lets `n` more prefetches through.
    pub fn allow(&self, n: u64) {
        if let Some(k) = lock(&self.held).as_mut() {
            *k += n;
        }
        self.released.notify_all();
    }

    /// Makes every `open_file` block until [`MockBackend::release`], as an
    /// open waiting on a directory block the disk has not returned.
    pub fn hold_opens(&self) {
        *lock(&self.opens_held) = true;
    }

    /// Stops holding: every blocked and future prefetch and open runs.
    pub fn release(&self) {
        *lock(&self.held) = None;
        *lock(&self.opens_held) = false;
        self.released.notify_all();
    }

    /// Opens executing now (blocked by [`MockBackend::hold_opens`]), and
    /// the most at one time.
    pub fn opening(&self) -> (usize, usize) {
        (
            self.opening.load(Ordering::SeqCst),
            self.max_opening.load(Ordering::SeqCst),
        )
    }

    /// All calls so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        lock(&self.calls).clone()
    }

    /// The most prefetches that were executing at the same time.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight.load(Ordering::SeqCst)
    }

    /// Prefetches executing now (blocked by [`MockBackend::hold`]).
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Handles (descriptors) open now.
    pub fn open_handles(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }

    fn record(&self, c: Call) {
        lock(&self.calls).push(c);
    }
}

impl Backend for MockBackend {
    type Handle = MockHandle;

    fn open_file(&self, path: &Path) -> Result<(MockHandle, FileId), ReplayError> {
        self.record(Call::OpenFile(path.to_path_buf()));
        let now = self.opening.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_opening.fetch_max(now, Ordering::SeqCst);
        let mut held = lock(&self.opens_held);
        while *held {
            held = self
                .released
                .wait(held)
                .unwrap_or_else(PoisonError::into_inner);
        }
        drop(held);
        self.opening.fetch_sub(1, Ordering::SeqCst);
        let fail = |errno| ReplayError::Open {
            path: path.to_path_buf(),
            source: io::Error::from_raw_os_error(errno),
        };
        match self.files.get(path) {
            Some(FileSpec::Present(id)) => {
                Ok((MockHandle::new(path.display().to_string(), &self.live), *id))
            }
            Some(FileSpec::Fails(errno)) => Err(fail(*errno)),
            Some(FileSpec::NotRegular) => Err(ReplayError::NotRegular {
                path: path.to_path_buf(),
                found: "FIFO".into(),
            }),
            None => Err(fail(libc::ENOENT)),
        }
    }

    fn open_device(&self, device: u64) -> Result<MockHandle, ReplayError> {
        self.record(Call::OpenDevice(device));
        if self.devices.contains(&device) {
            Ok(MockHandle::new(
                format!("dev:{}", dev_name(device)),
                &self.live,
            ))
        } else {
            lock(&self.refused).insert(device);
            Err(refusal(device))
        }
    }

    fn refused_device(&self, device: u64) -> Option<ReplayError> {
        (self.remember_refusals && lock(&self.refused).contains(&device)).then(|| refusal(device))
    }

    fn device_filesystem(&self, device: u64) -> Option<String> {
        self.device_fs.get(&device).cloned()
    }

    fn prefetch(&self, h: &MockHandle, offset: u64, len: u64) -> Result<(), ReplayError> {
        self.record(Call::Prefetch {
            target: h.target.clone(),
            offset,
            len,
        });
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let mut held = lock(&self.held);
        loop {
            match held.as_mut() {
                None => break,
                Some(n) if *n > 0 => {
                    *n -= 1;
                    break;
                }
                Some(_) => {
                    held = self
                        .released
                        .wait(held)
                        .unwrap_or_else(PoisonError::into_inner)
                }
            }
        }
        drop(held);
        lock(&self.prefetched)
            .entry(h.target.clone())
            .or_default()
            .push((offset / PAGE_SIZE, (offset + len).div_ceil(PAGE_SIZE)));
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }

    fn lookup(&self, kind: NsOpKind, path: &Path) -> Result<LookupOutcome, ReplayError> {
        self.record(Call::Lookup(kind, path.to_path_buf()));
        match self
            .lookups
            .get(path)
            .copied()
            .unwrap_or(Ok(LookupOutcome::Found))
        {
            Ok(o) => Ok(o),
            Err(errno) => Err(ReplayError::Lookup {
                kind: kind.name(),
                path: path.to_path_buf(),
                source: io::Error::from_raw_os_error(errno),
            }),
        }
    }

    fn memory(&self) -> Result<MemInfo, ReplayError> {
        self.record(Call::Memory);
        let next = lock(&self.memory).pop_front();
        Ok(next.unwrap_or_else(|| *lock(&self.last_memory)))
    }

    fn read_ahead(&self, device: u64) -> Option<u64> {
        self.read_ahead.get(&device).copied()
    }

    fn residency(&self, h: &MockHandle, offset: u64, len: u64) -> Result<Residency, ReplayError> {
        self.record(Call::Residency {
            target: h.target.clone(),
            offset,
            len,
        });
        let pages = (offset + len).div_ceil(PAGE_SIZE) - offset / PAGE_SIZE;
        let blind = self
            .not_resident_polls
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if blind {
            return Ok(Residency { resident: 0, pages });
        }
        let (first, last) = (offset / PAGE_SIZE, (offset + len).div_ceil(PAGE_SIZE));
        let mut ranges = lock(&self.prefetched)
            .get(&h.target)
            .cloned()
            .unwrap_or_default();
        ranges.sort_unstable();
        // Pages of first..last covered by the union of the prefetched ranges.
        let mut resident = 0;
        let mut covered_to = first;
        for &(a, b) in &ranges {
            let (a, b) = (a.max(covered_to), b.min(last));
            if a < b {
                resident += b - a;
                covered_to = b;
            }
        }
        // Stuck pages that a prefetch covered count only once read.
        if let Some(stuck) = lock(&self.stuck).get(&h.target) {
            resident -= stuck
                .iter()
                .filter(|&&p| (first..last).contains(&p))
                .filter(|&&p| ranges.iter().any(|&(a, b)| (a..b).contains(&p)))
                .count() as u64;
        }
        Ok(Residency { resident, pages })
    }

    fn read_through(&self, h: &MockHandle, offset: u64, len: u64) -> Result<(), ReplayError> {
        self.record(Call::Read {
            target: h.target.clone(),
            offset,
            len,
        });
        if lock(&self.failing_reads).contains(&h.target) {
            return Err(ReplayError::Read {
                path: h.target.clone().into(),
                offset,
                len,
                source: std::io::Error::from_raw_os_error(libc::EIO),
            });
        }
        let (first, last) = (offset / PAGE_SIZE, (offset + len).div_ceil(PAGE_SIZE));
        if let Some(stuck) = lock(&self.stuck).get_mut(&h.target) {
            stuck.retain(|&p| !(first..last).contains(&p));
        }
        lock(&self.prefetched)
            .entry(h.target.clone())
            .or_default()
            .push((first, last));
        Ok(())
    }

    fn set_io_priority(&self, prio: IoPriority) -> Result<(), ReplayError> {
        self.record(Call::IoPriority(prio));
        Ok(())
    }

    fn thread_cpus(&self) -> Result<Vec<usize>, ReplayError> {
        Ok(lock(&self.cpus).clone())
    }

    /// Fails like the kernel when no CPU of `cpus` is allowed, or always
    /// after [`MockBackend::refusing_cpu_moves`].
    fn set_thread_cpus(&self, cpus: &[usize]) -> Result<(), ReplayError> {
        self.record(Call::Cpus(cpus.to_vec()));
        if self.refuse_moves || !cpus.iter().any(|c| lock(&self.cpus).contains(c)) {
            return Err(ReplayError::Affinity {
                cpus: crate::ReplayCpus::List(cpus.to_vec()).to_string(),
                source: io::Error::from_raw_os_error(libc::EINVAL),
            });
        }
        Ok(())
    }

    fn run_when_idle(&self) -> Result<(), ReplayError> {
        self.record(Call::Idle);
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn refusal(device: u64) -> ReplayError {
    ReplayError::Device {
        device,
        path: PathBuf::from(format!("/dev/block/{}", dev_name(device))),
        source: io::Error::from_raw_os_error(libc::EPERM),
    }
}
