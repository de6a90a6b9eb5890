//! The replay engine: walks a plan's schedule in order and hands each step
//! to a small pool of worker threads through a bounded queue.
//!
//! Why this shape:
//! - One dispatcher keeps the schedule order (FAST replays the launch
//!   sequence in order so that the pages the application needs first arrive
//!   first); several workers keep more than one request in flight, because
//!   opening a file or walking a path blocks on metadata I/O while the disk
//!   could already be reading the next file's data (Paralfetch).
//! - The queue is bounded, so the prefetcher runs at most `workers +
//!   queue_depth` requests ahead of what has completed and never floods the
//!   block layer ahead of the application.
//! - Requests are cut at the device's read-ahead size: one
//!   `posix_fadvise(WILLNEED)` reads at most that much and silently drops
//!   the rest (`force_page_cache_ra()` caps `nr_to_read`). They are also cut
//!   at [`Options::max_request`], so that a page the application wants
//!   does not wait for a multi-megabyte read around it.
//! - Files are opened lazily, on their first request, and checked against
//!   the identity they had when recorded; a stale plan must never make us
//!   read the wrong bytes (DESIGN §4). A file's descriptor is closed as soon
//!   as its last request is issued, so large plans do not exhaust
//!   descriptors.
//! - A memory guard stops before the remaining schedule would push
//!   `MemAvailable` under a floor (DESIGN §5, "do no harm").

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use warmstart_plan::trace::{FileId, PAGE_SIZE};
use warmstart_plan::{Entry, Plan};

use crate::backend::{Backend, IoPriority, LookupOutcome, MemInfo, ReplayCpus};
use crate::error::dev_name;
use crate::report::{
    Count, IdField, LookupCounts, MemoryReport, Report, SkipReason, SkippedDevice, SkippedFile,
    Timings, WaitReport,
};
use crate::ReplayError;

/// How a replay runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Worker threads issuing requests (at least 1).
    pub workers: usize,
    /// Requests queued for the workers beyond the ones they are executing.
    pub queue_depth: usize,
    /// I/O priority of the worker threads; `None` leaves it inherited.
    pub io_priority: Option<IoPriority>,
    /// CPUs the replay's threads run on (see [`ReplayCpus`]).
    pub cpus: ReplayCpus,
    /// Largest request in bytes, below the device's read-ahead size.
    pub max_request: u64,
    /// Stop when `MemAvailable - bytes still to issue` would fall below this
    /// many bytes. `None`: [`Options::default_memory_floor`] of the machine's
    /// RAM; `Some(0)` turns the guard off.
    pub memory_floor: Option<u64>,
    /// How often `MemAvailable` is re-read; in between it is estimated by
    /// subtracting the bytes issued since. Reading `/proc/meminfo` before
    /// every one of thousands of entries would cost the application CPU.
    pub memory_check_interval: Duration,
    /// After issuing, wait up to this long for the issued ranges to be in
    /// the page cache. `None`: return once the last request is issued.
    pub wait: Option<Duration>,
    /// Pause between residency checks while waiting.
    pub wait_poll: Duration,
}

impl Options {
    /// Request size when a device's read-ahead limit is unknown: the
    /// kernel's default `read_ahead_kb`.
    pub const DEFAULT_CHUNK: u64 = 128 * 1024;
    /// Default [`Options::max_request`]. This disk reads ahead 8 MiB, so a
    /// whole binary was one request, and a page the application faulted on
    /// waited for all of it (python3's exec stood 4.1 ms in `elf_load` on a
    /// page already being read). Measured on the project's 2-core VM, cold
    /// launches through `warmstart run`, alternating, 23 November 2026:
    /// 512 KiB against 8 MiB was faster for the Python demo in 19 of 30
    /// rounds (median 7.4 ms) and for `clang -c` (a 211 MB plan) in 14 of
    /// 20 (12.7 ms); 128 KiB and 2 MiB were even with 512 KiB (14 and 17
    /// of 30).
    pub const DEFAULT_MAX_REQUEST: u64 = 512 * 1024;
    /// A reasonable bound for [`Options::wait`].
    pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(30);
    /// Smallest memory floor the default picks.
    pub const MIN_MEMORY_FLOOR: u64 = 256 << 20;

    /// Eight workers whatever the core count: they spend their time blocked
    /// in metadata reads (opens, lookups), not on a CPU. Measured on the
    /// project's 2-core VM (Python plan, 2026-11-22): prefetch-only time
    /// 60-87 ms with 2 workers, 52-63 ms with 8, 50-56 ms with 16; a cold
    /// `warmstart run` captured 42% of the cold-warm gap with 2 and 60%
    /// with 8 (medians of 15 interleaved rounds).
    pub fn default_workers() -> usize {
        8
    }

    /// The floor used when [`Options::memory_floor`] is `None`: 5% of RAM,
    /// but at least 256 MiB, and never more than half of RAM.
    pub fn default_memory_floor(total: u64) -> u64 {
        (total / 20).max(Self::MIN_MEMORY_FLOOR).min(total / 2)
    }
}

impl Default for Options {
    fn default() -> Self {
        let workers = Options::default_workers();
        Options {
            workers,
            queue_depth: 2 * workers,
            io_priority: None,
            cpus: ReplayCpus::default(),
            max_request: Options::DEFAULT_MAX_REQUEST,
            memory_floor: None,
            memory_check_interval: Duration::from_millis(10),
            wait: None,
            wait_poll: Duration::from_millis(2),
        }
    }
}

/// Replays `plan` with `backend`. See [`Engine`].
pub fn replay<B: Backend>(plan: &Plan, opts: &Options, backend: &B) -> Result<Report, ReplayError> {
    Engine::new(backend, opts.clone())?.run(plan)
}

/// Executes plans. Create one per replay, or reuse it for several plans.
pub struct Engine<'b, B: Backend> {
    backend: &'b B,
    opts: Options,
    cancel: Arc<AtomicBool>,
    progress: Arc<AtomicU64>,
    first_started: Arc<AtomicU64>,
    first_issued: Arc<AtomicU64>,
}

impl<'b, B: Backend> Engine<'b, B> {
    pub fn new(backend: &'b B, opts: Options) -> Result<Self, ReplayError> {
        if opts.workers == 0 {
            return Err(ReplayError::Options("workers must be at least 1".into()));
        }
        if opts.max_request < PAGE_SIZE {
            return Err(ReplayError::Options(format!(
                "requests of {} bytes are too small (at least one page)",
                opts.max_request
            )));
        }
        if opts.workers > 64 {
            return Err(ReplayError::Options(format!(
                "{} workers is too many (at most 64)",
                opts.workers
            )));
        }
        Ok(Engine {
            backend,
            opts,
            cancel: Arc::new(AtomicBool::new(false)),
            progress: Arc::new(AtomicU64::new(0)),
            first_started: Arc::new(AtomicU64::new(0)),
            first_issued: Arc::new(AtomicU64::new(0)),
        })
    }

    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// A flag that, once set, stops the replay before its next entry (for
    /// example when the launched application exits). The report then says
    /// `cancelled`. Skips the residency wait too.
    pub fn cancel_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.cancel)
    }

    /// Requests issued so far by [`run`](Self::run) (data, metadata and
    /// lookups), readable while it runs: the launch manager gives the
    /// replay a head start of a few requests before letting the
    /// application exec.
    pub fn progress(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.progress)
    }

    /// Uses `flag` as the [`cancel_flag`](Self::cancel_flag).
    pub fn share_cancel(mut self, flag: Arc<AtomicBool>) -> Self {
        self.cancel = flag;
        self
    }

    /// Publishes into these instead of the engine's own counters:
    /// [`progress`](Self::progress), [`first_started`](Self::first_started)
    /// and [`first_issued`](Self::first_issued). The daemon hands its own
    /// in, so no thread has to copy them while the replay runs.
    pub fn share_progress(
        mut self,
        progress: Arc<AtomicU64>,
        first_started: Arc<AtomicU64>,
        first_issued: Arc<AtomicU64>,
    ) -> Self {
        self.progress = progress;
        self.first_started = first_started;
        self.first_issued = first_issued;
        self
    }

    /// When the first request was issued (its `fadvise` or `readahead`
    /// returned), in `CLOCK_MONOTONIC` nanoseconds; 0 until then.
    pub fn first_issued(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.first_issued)
    }

    /// When work on the first entry of [`run`](Self::run) that is not
    /// skipped started (opening its file, or the lookup; on the dispatcher
    /// or a worker), in `CLOCK_MONOTONIC` nanoseconds
    /// (the clock of the kernel's event timestamps); 0 until then. The
    /// daemon measures from a launch's exec to this and to the first
    /// request issued ([`progress`](Self::progress) turning 1).
    pub fn first_started(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.first_started)
    }

    /// Replays `plan`: issues its schedule, then optionally waits for
    /// residency. Fails only on an invalid plan, unreadable memory state at
    /// start, or a worker thread that cannot be started; everything else is
    /// counted in the [`Report`].
    pub fn run(&self, plan: &Plan) -> Result<Report, ReplayError> {
        plan.check()?;
        let t0 = Instant::now();
        let mem = self.backend.memory()?;
        let floor = self
            .opts
            .memory_floor
            .unwrap_or_else(|| Options::default_memory_floor(mem.total));
        let mut state = State::new(self.backend, plan, &self.opts);
        state.progress = Some(Arc::clone(&self.progress));
        state.first_started = Some(Arc::clone(&self.first_started));
        state.first_issued = Some(Arc::clone(&self.first_issued));
        // This thread dispatches: it is confined with the workers, once the
        // first request is on its way, and gets its CPUs back afterwards.
        let _restore = self.choose_cpus(&mut state).map(|cpus| Restore {
            backend: self.backend,
            cpus,
        });
        let setup = t0.elapsed();

        let t1 = Instant::now();
        let mut dispatch = Dispatch {
            floor,
            mem,
            sample_at: Instant::now(),
            dispatched_at_sample: 0,
            stopped_by_memory: false,
            cancelled: false,
            not_reached: 0,
            available_at_stop: None,
            remaining_at_stop: None,
        };
        let issued = self.issue(plan, &state, &mut dispatch);
        let issue = t1.elapsed();

        let t2 = Instant::now();
        let wait = match self.opts.wait {
            Some(timeout) if issued.is_ok() && !dispatch.cancelled => {
                Some(self.wait(plan, &state, t2 + timeout))
            }
            _ => None,
        };
        issued?;
        let wait_time = if wait.is_some() {
            t2.elapsed()
        } else {
            Duration::ZERO
        };

        let mut report = state.report(plan);
        report.workers = self.opts.workers;
        report.queue_depth = self.opts.queue_depth;
        // Only if a thread did move there.
        report.cpus = state
            .cpus
            .clone()
            .filter(|_| state.moved.load(Ordering::Relaxed));
        report.entries_not_reached = dispatch.not_reached;
        report.stopped_by_memory = dispatch.stopped_by_memory;
        report.cancelled = dispatch.cancelled || self.cancel.load(Ordering::Relaxed);
        report.memory = MemoryReport {
            floor,
            total: mem.total,
            available_at_start: mem.available,
            available_at_stop: dispatch.available_at_stop,
            remaining_at_stop: dispatch.remaining_at_stop,
        };
        report.wait = wait;
        let busy = |a: &AtomicU64| a.load(Ordering::Relaxed);
        report.timings = Timings {
            total_ns: nanos(t0.elapsed()),
            setup_ns: nanos(setup),
            issue_ns: nanos(issue),
            wait_ns: nanos(wait_time),
            busy_open_ns: busy(&state.busy_open),
            busy_data_ns: busy(&state.busy_data),
            busy_meta_ns: busy(&state.busy_meta),
            busy_lookup_ns: busy(&state.busy_lookup),
        };
        Ok(report)
    }

    /// The issue phase: this thread dispatches, the workers execute.
    fn issue(
        &self,
        plan: &Plan,
        state: &State<'_, B>,
        d: &mut Dispatch,
    ) -> Result<(), ReplayError> {
        let (tx, rx) = sync_channel::<Work>(self.opts.queue_depth);
        let rx = Mutex::new(rx);
        thread::scope(|s| {
            // The dispatcher issues the plan's first request itself; then
            // workers are started one per request until all run, so that
            // requests are being worked on while the others start (each
            // start is tens of microseconds, and the daemon measures from
            // the exec to the first request).
            let mut started = 0usize;
            let mut spawn_error = None;
            // `None`: no worker runs; `Some(true)`: one was just started.
            let mut start_worker = || {
                let mut new = false;
                if started < self.opts.workers && spawn_error.is_none() {
                    let spawned = thread::Builder::new()
                        .name(format!("ws-replay-{started}"))
                        .spawn_scoped(s, || self.worker(state, &rx));
                    match spawned {
                        Ok(_) => {
                            started += 1;
                            new = true;
                        }
                        Err(source) => spawn_error = Some(source),
                    }
                }
                (started > 0).then_some(new)
            };
            let total = plan.data_bytes() + plan.meta_bytes();
            let mut dispatched = 0u64;
            let mut inline_first = self.opts.io_priority.is_none();
            let handed = std::cell::Cell::new(false);
            let mut confined = false;
            for (i, entry) in plan.entries.iter().enumerate() {
                if self.cancel.load(Ordering::Relaxed) {
                    d.cancelled = true;
                    d.not_reached = (plan.entries.len() - i) as u64;
                    break;
                }
                if !self.memory_allows(state, d, dispatched, total - dispatched) {
                    d.not_reached = (plan.entries.len() - i) as u64;
                    break;
                }
                // A large entry is many requests: stop between them too.
                let mut send = |w: Work| {
                    if self.cancel.load(Ordering::Relaxed) {
                        return false;
                    }
                    let Some(new) = start_worker() else {
                        return false;
                    };
                    if tx.send(w).is_err() {
                        return false;
                    }
                    handed.set(true);
                    if new {
                        // The new worker has work: let it run. Under the
                        // daemon the replay's threads are real-time and
                        // share one CPU, so without this the dispatcher
                        // started all eight workers (0.4 ms) before the
                        // first of them issued anything.
                        thread::yield_now();
                    }
                    true
                };
                let mut skipped = false;
                let sent = match *entry {
                    Entry::Data { file, offset, len } => {
                        let chunk = state.files[file as usize].chunk;
                        split(offset, len, chunk).all(|(first, offset, len)| {
                            let w = Work::Data {
                                file,
                                offset,
                                len,
                                first,
                            };
                            if !handed.get() && std::mem::take(&mut inline_first) {
                                // The first request is issued by this
                                // thread unless work was handed out before
                                // it (which it must not overtake) or the
                                // replay has an I/O priority (set on the
                                // workers only, not on the caller's
                                // thread): a hand-off costs a thread start
                                // and, under the daemon, a wait for a CPU.
                                // Issued, it counts as reached even if a
                                // cancel arrived meanwhile.
                                state.execute(w);
                                return true;
                            }
                            send(w)
                        })
                    }
                    Entry::Meta { device, len, .. } if state.device_failed(device) => {
                        // Skipped here: no worker needs waking for it (a
                        // plan's head can be many metadata entries, and
                        // each hand-off costs the first request time).
                        let mut c = lock(&state.devices[&device].skipped);
                        c.bytes += len;
                        c.entries += 1;
                        skipped = true;
                        true
                    }
                    Entry::Meta {
                        device,
                        offset,
                        len,
                    } => {
                        let chunk = state.devices[&device].chunk;
                        split(offset, len, chunk).all(|(first, offset, len)| {
                            send(Work::Meta {
                                device,
                                offset,
                                len,
                                first,
                            })
                        })
                    }
                    Entry::Lookup { index } => send(Work::Lookup { index }),
                };
                if !sent {
                    // Cancelled mid-entry (or every worker is gone, which
                    // only a panic can cause and `thread::scope` re-raises).
                    d.cancelled = self.cancel.load(Ordering::Relaxed);
                    d.not_reached = (plan.entries.len() - i) as u64;
                    break;
                }
                dispatched += entry_bytes(entry);
                if !skipped && !std::mem::replace(&mut confined, true) {
                    // The first entry is on its way: now this thread moves.
                    self.confine(state);
                }
            }
            drop(tx);
            match spawn_error {
                // Not one worker: at most the first request was issued.
                Some(source) if started == 0 => Err(ReplayError::Thread { source }),
                // Fewer workers than asked for still replay the plan.
                _ => Ok(()),
            }
        })
    }

    /// The memory guard, checked before each entry.
    fn memory_allows(
        &self,
        state: &State<'_, B>,
        d: &mut Dispatch,
        dispatched: u64,
        remaining: u64,
    ) -> bool {
        if d.floor == 0 {
            return true;
        }
        if d.sample_at.elapsed() >= self.opts.memory_check_interval {
            match self.backend.memory() {
                Ok(m) => {
                    d.mem = m;
                    d.sample_at = Instant::now();
                    d.dispatched_at_sample = dispatched;
                }
                // Keep estimating from the last sample, which only gets more
                // conservative as bytes are issued.
                Err(e) => state.note(e.to_string()),
            }
        }
        let available = d
            .mem
            .available
            .saturating_sub(dispatched - d.dispatched_at_sample);
        if available >= remaining.saturating_add(d.floor) {
            return true;
        }
        d.stopped_by_memory = true;
        d.available_at_stop = Some(available);
        d.remaining_at_stop = Some(remaining);
        false
    }

    /// Picks the replay's CPUs into `state.cpus`; returns the CPUs the
    /// calling thread has, to give back at the end.
    fn choose_cpus(&self, state: &mut State<'_, B>) -> Option<Vec<usize>> {
        if matches!(self.opts.cpus, ReplayCpus::All | ReplayCpus::Idle) {
            return None;
        }
        let had = match self.backend.thread_cpus() {
            Ok(c) => c,
            Err(e) => {
                state.note(e.to_string());
                return None;
            }
        };
        if let Some(w) = self.opts.cpus.check(&had) {
            state.note(w);
        }
        state.cpus = Some(self.opts.cpus.choose(&had).filter(|c| !c.is_empty())?);
        Some(had)
    }

    /// Confines the calling thread to the replay's CPUs, if it has any.
    /// Each thread does this after its first piece of work: when the
    /// dispatcher moved before starting any worker, the daemon's exec to
    /// first request took a median 1.06 ms against 0.91 unconfined (20
    /// cold Python launches each); moving afterwards, 0.85 and 0.81 ms
    /// (p90 1.06 and 1.08) against 1.32 and 0.88 (p90 2.76 and 1.47), 20
    /// and 30 launches. A failure is noted and the thread runs where it is.
    ///
    /// A thread that inherited a real-time priority (the daemon's replays
    /// do, so that their first request is not delayed) returns to normal
    /// scheduling here too: at real-time priority the replay's CPU work
    /// (tens of ms per plan) pre-empted the application's threads on its
    /// CPU. Daemon launches, real-time replay threads against threads
    /// returning to normal after their first piece of work, alternating
    /// (23 November 2026): npm faster in 8 of 12 (median -46.5 ms; 45% of
    /// the gap against 19%), the Python demo in 6 of 12 (-6.8 ms).
    fn confine(&self, state: &State<'_, B>) {
        self.backend.leave_realtime();
        if self.opts.cpus == ReplayCpus::Idle {
            if let Err(e) = self.backend.run_when_idle() {
                if !state.move_failed.swap(true, Ordering::Relaxed) {
                    state.note(e.to_string());
                }
            }
        }
        if let Some(cpus) = &state.cpus {
            match self.backend.set_thread_cpus(cpus) {
                Ok(()) => state.moved.store(true, Ordering::Relaxed),
                // One note, not one per thread.
                Err(e) if !state.move_failed.swap(true, Ordering::Relaxed) => {
                    state.note(e.to_string())
                }
                Err(_) => {}
            }
        }
    }

    fn worker(&self, state: &State<'_, B>, rx: &Mutex<Receiver<Work>>) {
        let mut first = true;
        if let Some(prio) = self.opts.io_priority {
            if let Err(e) = self.backend.set_io_priority(prio) {
                state.note(e.to_string());
            }
        }
        loop {
            // Holding the lock while blocked in recv is fine: the other
            // workers would be waiting for work anyway.
            let work = lock(rx).recv();
            match work {
                Ok(w) => {
                    state.execute(w);
                    if std::mem::take(&mut first) {
                        self.confine(state);
                    }
                }
                Err(_) => return,
            }
        }
    }

    /// The wait phase: poll residency of everything issued, in plan order,
    /// until all of it is cached or the deadline passes.
    fn wait(&self, plan: &Plan, state: &State<'_, B>, deadline: Instant) -> WaitReport {
        let mut report = WaitReport::default();
        for (i, slot) in state.files.iter().enumerate() {
            let ranges = std::mem::take(&mut *lock(&slot.issued));
            if ranges.is_empty() {
                continue;
            }
            // Descriptors were closed after their last request; reopen and
            // make sure it is still the same file.
            let pf = &plan.files[i];
            match self.backend.open_file(Path::new(&pf.path)) {
                Ok((h, id)) if id == pf.id => {
                    self.wait_ranges(state, &h, &ranges, deadline, &mut report)
                }
                _ => report.files_unchecked += 1,
            }
        }
        for slot in state.devices.values() {
            let ranges = std::mem::take(&mut *lock(&slot.issued));
            if let DevState::Open(h) = &*lock(&slot.state) {
                self.wait_ranges(state, h, &ranges, deadline, &mut report);
            }
        }
        report
    }

    fn wait_ranges(
        &self,
        state: &State<'_, B>,
        h: &B::Handle,
        ranges: &[(u64, u64)],
        deadline: Instant,
        report: &mut WaitReport,
    ) {
        let mut pending: Vec<(u64, u64)> = merge(ranges);
        // One note per file: its ranges fail for the same reason.
        let mut noted = false;
        // Once the deadline passed or the replay was cancelled, one more
        // pass counts what is resident without waiting.
        let mut last_pass = report.timed_out || self.cancel.load(Ordering::Relaxed);
        loop {
            let mut still = Vec::new();
            for &(offset, len) in &pending {
                match self.backend.residency(h, offset, len) {
                    Ok(r) if r.complete() || last_pass => {
                        report.pages += r.pages;
                        report.resident += r.resident.min(r.pages);
                    }
                    Ok(_) => still.push((offset, len)),
                    Err(e) => {
                        report.errors += 1;
                        let denied = matches!(&e, ReplayError::Residency { source, .. }
                            if source.raw_os_error() == Some(libc::EPERM));
                        if denied {
                            // The same for every file: said once.
                            if !state.residency_denied.swap(true, Ordering::Relaxed) {
                                state.note(
                                    "cannot check page-cache residency: the kernel hides it \
                                     for files this user may not write (run as root)"
                                        .into(),
                                );
                            }
                        } else if !std::mem::replace(&mut noted, true) {
                            state.note(e.to_string());
                        }
                    }
                }
            }
            if still.is_empty() {
                return;
            }
            pending = still;
            let now = Instant::now();
            if self.cancel.load(Ordering::Relaxed) {
                last_pass = true;
            } else if now >= deadline {
                report.timed_out = true;
                last_pass = true;
            } else {
                thread::sleep(self.opts.wait_poll.min(deadline - now));
            }
        }
    }
}

/// The dispatcher's running state.
struct Dispatch {
    floor: u64,
    mem: MemInfo,
    sample_at: Instant,
    dispatched_at_sample: u64,
    stopped_by_memory: bool,
    cancelled: bool,
    not_reached: u64,
    available_at_stop: Option<u64>,
    remaining_at_stop: Option<u64>,
}

/// One request for a worker.
#[derive(Debug, Clone, Copy)]
enum Work {
    /// `first`: the first chunk of its entry, so entries are counted once.
    Data {
        file: u32,
        offset: u64,
        len: u64,
        first: bool,
    },
    Meta {
        device: u64,
        offset: u64,
        len: u64,
        first: bool,
    },
    Lookup {
        index: u32,
    },
}

enum FileState<H> {
    Unopened,
    Open(Arc<H>),
    /// All its requests are issued; the descriptor is closed.
    Done,
    Skipped(SkipReason),
}

struct FileSlot<H> {
    state: Mutex<FileState<H>>,
    /// Largest request on this file's device.
    chunk: u64,
    /// Requests not yet executed; the descriptor closes at zero.
    chunks_left: AtomicU64,
    skipped: Mutex<Count>,
    /// Ranges issued, kept for the residency wait.
    issued: Mutex<Vec<(u64, u64)>>,
}

enum DevState<H> {
    Unopened,
    Open(Arc<H>),
    Failed(String),
}

struct DeviceSlot<H> {
    state: Mutex<DevState<H>>,
    chunk: u64,
    skipped: Mutex<Count>,
    issued: Mutex<Vec<(u64, u64)>>,
}

/// What the workers share.
struct State<'a, B: Backend> {
    backend: &'a B,
    plan: &'a Plan,
    keep_ranges: bool,
    files: Vec<FileSlot<B::Handle>>,
    devices: BTreeMap<u64, DeviceSlot<B::Handle>>,
    data: Mutex<Count>,
    meta: Mutex<Count>,
    lookups: Mutex<LookupCounts>,
    requests: AtomicU64,
    /// The engine's progress counter, shared with the launch manager.
    progress: Option<Arc<AtomicU64>>,
    first_started: Option<Arc<AtomicU64>>,
    first_issued: Option<Arc<AtomicU64>>,
    files_opened: AtomicU64,
    failed_requests: AtomicU64,
    errors: Mutex<(Vec<String>, u64)>,
    busy_open: AtomicU64,
    busy_data: AtomicU64,
    busy_meta: AtomicU64,
    busy_lookup: AtomicU64,
    /// The CPUs the replay's threads are confined to, if they are.
    cpus: Option<Vec<usize>>,
    /// A thread moved to `cpus`; one failed to.
    moved: AtomicBool,
    move_failed: AtomicBool,
    /// A residency query was refused (EPERM); said once.
    residency_denied: AtomicBool,
}

/// Gives the dispatching thread its CPUs back, however the replay ends.
struct Restore<'b, B: Backend> {
    backend: &'b B,
    cpus: Vec<usize>,
}

impl<B: Backend> Drop for Restore<'_, B> {
    fn drop(&mut self) {
        // It had them a moment ago; nothing to report if it cannot.
        let _ = self.backend.set_thread_cpus(&self.cpus);
    }
}

/// How many problem messages a report keeps.
const MAX_ERRORS: usize = 32;

impl<'a, B: Backend> State<'a, B> {
    fn new(backend: &'a B, plan: &'a Plan, opts: &Options) -> Self {
        let mut chunks: BTreeMap<u64, u64> = BTreeMap::new();
        let mut chunk_of = |dev: u64| {
            *chunks.entry(dev).or_insert_with(|| {
                let ra = backend
                    .read_ahead(dev)
                    .filter(|&b| b > 0)
                    .unwrap_or(Options::DEFAULT_CHUNK)
                    .min(opts.max_request);
                // Whole pages: the kernel's cap counts pages.
                (ra / PAGE_SIZE).max(1) * PAGE_SIZE
            })
        };
        let mut files: Vec<FileSlot<B::Handle>> = plan
            .files
            .iter()
            .map(|f| FileSlot {
                state: Mutex::new(FileState::Unopened),
                chunk: chunk_of(f.id.dev),
                chunks_left: AtomicU64::new(0),
                skipped: Mutex::new(Count::default()),
                issued: Mutex::new(Vec::new()),
            })
            .collect();
        let mut devices = BTreeMap::new();
        for e in &plan.entries {
            match *e {
                Entry::Data { file, offset, len } => {
                    let slot = &mut files[file as usize];
                    *slot.chunks_left.get_mut() += split(offset, len, slot.chunk).count() as u64;
                }
                Entry::Meta { device, .. } => {
                    devices.entry(device).or_insert_with(|| DeviceSlot {
                        // A device known to refuse us is skipped by the
                        // dispatcher: no worker started just to fail.
                        state: Mutex::new(match backend.refused_device(device) {
                            Some(e) => DevState::Failed(e.to_string()),
                            None => DevState::Unopened,
                        }),
                        chunk: chunk_of(device),
                        skipped: Mutex::new(Count::default()),
                        issued: Mutex::new(Vec::new()),
                    });
                }
                Entry::Lookup { .. } => {}
            }
        }
        State {
            backend,
            plan,
            keep_ranges: opts.wait.is_some(),
            files,
            devices,
            data: Mutex::new(Count::default()),
            meta: Mutex::new(Count::default()),
            lookups: Mutex::new(LookupCounts::default()),
            requests: AtomicU64::new(0),
            progress: None,
            first_started: None,
            first_issued: None,
            files_opened: AtomicU64::new(0),
            failed_requests: AtomicU64::new(0),
            errors: Mutex::new((Vec::new(), 0)),
            busy_open: AtomicU64::new(0),
            busy_data: AtomicU64::new(0),
            busy_meta: AtomicU64::new(0),
            busy_lookup: AtomicU64::new(0),
            cpus: None,
            moved: AtomicBool::new(false),
            move_failed: AtomicBool::new(false),
            residency_denied: AtomicBool::new(false),
        }
    }

    /// Whether metadata device `device` could not be opened or read.
    fn device_failed(&self, device: u64) -> bool {
        self.devices
            .get(&device)
            .is_some_and(|d| matches!(*lock(&d.state), DevState::Failed(_)))
    }

    /// Records a problem that does not stop the replay.
    fn note(&self, msg: String) {
        let mut e = lock(&self.errors);
        e.1 += 1;
        if e.0.len() < MAX_ERRORS {
            e.0.push(msg);
        }
    }

    /// Counts an issued request in the shared progress, stamping the first.
    fn issued_one(&self) {
        if let Some(p) = &self.progress {
            if p.fetch_add(1, Ordering::Relaxed) == 0 {
                if let Some(f) = &self.first_issued {
                    let _ =
                        f.compare_exchange(0, monotonic_ns(), Ordering::Relaxed, Ordering::Relaxed);
                }
            }
        }
    }

    fn execute(&self, w: Work) {
        if let Some(f) = &self.first_started {
            if f.load(Ordering::Relaxed) == 0 {
                let _ = f.compare_exchange(0, monotonic_ns(), Ordering::Relaxed, Ordering::Relaxed);
            }
        }
        match w {
            Work::Data {
                file,
                offset,
                len,
                first,
            } => self.data(file, offset, len, first),
            Work::Meta {
                device,
                offset,
                len,
                first,
            } => self.meta(device, offset, len, first),
            Work::Lookup { index } => self.lookup(index),
        }
    }

    fn data(&self, file: u32, offset: u64, len: u64, first: bool) {
        let slot = &self.files[file as usize];
        if let Some(h) = self.file_handle(file) {
            let t = Instant::now();
            let res = self.backend.prefetch(&h, offset, len);
            self.busy_data
                .fetch_add(nanos(t.elapsed()), Ordering::Relaxed);
            match res {
                Ok(()) => {
                    self.requests.fetch_add(1, Ordering::Relaxed);
                    self.issued_one();
                    let mut c = lock(&self.data);
                    c.bytes += len;
                    c.entries += u64::from(first);
                    drop(c);
                    if self.keep_ranges {
                        lock(&slot.issued).push((offset, len));
                    }
                }
                Err(e) => {
                    self.failed_requests.fetch_add(1, Ordering::Relaxed);
                    self.note(e.to_string());
                }
            }
        } else {
            let mut c = lock(&slot.skipped);
            c.bytes += len;
            c.entries += u64::from(first);
        }
        if slot.chunks_left.fetch_sub(1, Ordering::AcqRel) == 1 {
            let mut st = lock(&slot.state);
            if matches!(*st, FileState::Open(_)) {
                // Workers still holding a clone keep it open until they finish.
                *st = FileState::Done;
            }
        }
    }

    /// The open descriptor of plan file `file`, opening and validating it on
    /// first use; `None` if the file is skipped. Other workers wanting the
    /// same file wait on the slot's lock rather than opening it twice.
    fn file_handle(&self, file: u32) -> Option<Arc<B::Handle>> {
        let slot = &self.files[file as usize];
        let mut st = lock(&slot.state);
        match &*st {
            FileState::Open(h) => return Some(Arc::clone(h)),
            FileState::Skipped(_) => return None,
            FileState::Unopened | FileState::Done => {}
        }
        let pf = &self.plan.files[file as usize];
        let t = Instant::now();
        let opened = self.backend.open_file(Path::new(&pf.path));
        self.busy_open
            .fetch_add(nanos(t.elapsed()), Ordering::Relaxed);
        match opened {
            Ok((h, found)) => match check_identity(&pf.id, &found) {
                None => {
                    let h = Arc::new(h);
                    if matches!(*st, FileState::Unopened) {
                        self.files_opened.fetch_add(1, Ordering::Relaxed);
                    }
                    *st = FileState::Open(Arc::clone(&h));
                    Some(h)
                }
                Some(reason) => {
                    *st = FileState::Skipped(reason);
                    None
                }
            },
            Err(e) => {
                *st = FileState::Skipped(skip_reason(&e));
                None
            }
        }
    }

    fn meta(&self, device: u64, offset: u64, len: u64, first: bool) {
        let slot = &self.devices[&device];
        let handle = {
            let mut st = lock(&slot.state);
            if let DevState::Unopened = *st {
                let t = Instant::now();
                *st = match self.backend.open_device(device) {
                    Ok(h) => DevState::Open(Arc::new(h)),
                    Err(e) => DevState::Failed(e.to_string()),
                };
                self.busy_open
                    .fetch_add(nanos(t.elapsed()), Ordering::Relaxed);
            }
            match &*st {
                DevState::Open(h) => Some(Arc::clone(h)),
                _ => None,
            }
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
            self.issued_one();
            let mut c = lock(&self.meta);
            c.bytes += len;
            c.entries += u64::from(first);
            drop(c);
            if self.keep_ranges {
                lock(&slot.issued).push((offset, len));
            }
        } else {
            let mut c = lock(&slot.skipped);
            c.bytes += len;
            c.entries += u64::from(first);
        }
    }

    fn lookup(&self, index: u32) {
        let l = &self.plan.lookups[index as usize];
        let t = Instant::now();
        let res = self.backend.lookup(l.kind, Path::new(&l.path));
        self.busy_lookup
            .fetch_add(nanos(t.elapsed()), Ordering::Relaxed);
        let mut c = lock(&self.lookups);
        c.done += 1;
        match res {
            Ok(LookupOutcome::Found) => c.found += 1,
            Ok(LookupOutcome::NotFound) => c.not_found += 1,
            Ok(LookupOutcome::StatOnly) => c.stat_only += 1,
            Err(e) => {
                c.failed += 1;
                drop(c);
                self.note(e.to_string());
            }
        }
    }

    fn report(&self, plan: &Plan) -> Report {
        let mut r = Report {
            entries_total: plan.entries.len() as u64,
            data: *lock(&self.data),
            meta: *lock(&self.meta),
            lookups: *lock(&self.lookups),
            requests: self.requests.load(Ordering::Relaxed),
            files_opened: self.files_opened.load(Ordering::Relaxed),
            failed_requests: self.failed_requests.load(Ordering::Relaxed),
            ..Report::default()
        };
        r.entries_issued = r.data.entries + r.meta.entries + r.lookups.done;
        for (slot, pf) in self.files.iter().zip(&plan.files) {
            if let FileState::Skipped(reason) = &*lock(&slot.state) {
                let c = *lock(&slot.skipped);
                r.skipped_data.entries += c.entries;
                r.skipped_data.bytes += c.bytes;
                r.skipped_files.push(SkippedFile {
                    path: pf.path.clone(),
                    reason: reason.clone(),
                    entries: c.entries,
                    bytes: c.bytes,
                });
            }
        }
        for (&device, slot) in &self.devices {
            let c = *lock(&slot.skipped);
            if c.entries == 0 && c.bytes == 0 {
                continue;
            }
            r.skipped_meta.entries += c.entries;
            r.skipped_meta.bytes += c.bytes;
            let error = match &*lock(&slot.state) {
                DevState::Failed(e) => e.clone(),
                _ => String::new(),
            };
            r.skipped_devices.push(SkippedDevice {
                device,
                name: dev_name(device),
                error,
                entries: c.entries,
                bytes: c.bytes,
            });
        }
        let e = lock(&self.errors);
        r.errors = e.0.clone();
        r.error_count = e.1;
        r
    }
}

/// `None` if `found` is the file the plan recorded.
fn check_identity(planned: &FileId, found: &FileId) -> Option<SkipReason> {
    let fields = IdField::diff(planned, found);
    if fields.is_empty() {
        return None;
    }
    Some(SkipReason::Changed {
        fields,
        planned: *planned,
        found: *found,
    })
}

fn skip_reason(e: &ReplayError) -> SkipReason {
    match e {
        ReplayError::Open { source, .. }
            if source.kind() == std::io::ErrorKind::NotFound
                || source.raw_os_error() == Some(libc::ENOTDIR) =>
        {
            SkipReason::Missing
        }
        ReplayError::NotRegular { .. } => SkipReason::NotRegular,
        other => SkipReason::OpenFailed {
            error: other.to_string(),
        },
    }
}

/// Splits `offset..offset+len` into requests covering at most `chunk` bytes
/// of whole pages each, yielding `(first, offset, len)`. Boundaries fall on
/// page multiples of `chunk` from the first page, so no request spans more
/// pages than the kernel reads in one call, and the original range is
/// covered exactly.
fn split(offset: u64, len: u64, chunk: u64) -> impl Iterator<Item = (bool, u64, u64)> {
    let end = offset + len;
    let base = offset / PAGE_SIZE * PAGE_SIZE;
    let mut start = offset;
    std::iter::from_fn(move || {
        if start >= end {
            return None;
        }
        let first = start == offset;
        // The next boundary after `start`, counted from the first page.
        let stop = (base + ((start - base) / chunk + 1) * chunk).min(end);
        let piece = (first, start, stop - start);
        start = stop;
        Some(piece)
    })
}

/// Sorts ranges and merges overlapping or touching ones.
fn merge(ranges: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut v = ranges.to_vec();
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for (o, l) in v {
        match out.last_mut() {
            Some((po, pl)) if *po + *pl >= o => *pl = (*pl).max(o + l - *po),
            _ => out.push((o, l)),
        }
    }
    out
}

fn entry_bytes(e: &Entry) -> u64 {
    match *e {
        Entry::Data { len, .. } | Entry::Meta { len, .. } => len,
        Entry::Lookup { .. } => 0,
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Locks, ignoring poisoning: the data behind these locks are counters and
/// slots that stay consistent even if a holder panicked, and the panic
/// itself is re-raised by `thread::scope`.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock BPF's `bpf_ktime_get_ns`
/// stamps events with.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_table() {
        const P: u64 = PAGE_SIZE;
        // (name, offset, len, chunk, want)
        type Case = (&'static str, u64, u64, u64, Vec<(bool, u64, u64)>);
        let cases: Vec<Case> = vec![
            ("fits in one", 0, 8 * P, 32 * P, vec![(true, 0, 8 * P)]),
            (
                "exact multiple",
                0,
                64 * P,
                32 * P,
                vec![(true, 0, 32 * P), (false, 32 * P, 32 * P)],
            ),
            (
                "remainder",
                P,
                70 * P,
                32 * P,
                vec![
                    (true, P, 32 * P),
                    (false, 33 * P, 32 * P),
                    (false, 65 * P, 6 * P),
                ],
            ),
            (
                "unaligned start stays within the page cap",
                100,
                3 * P,
                2 * P,
                vec![(true, 100, 2 * P - 100), (false, 2 * P, P + 100)],
            ),
            (
                "one page chunks",
                0,
                3 * P,
                P,
                vec![(true, 0, P), (false, P, P), (false, 2 * P, P)],
            ),
        ];
        for (name, offset, len, chunk, want) in cases {
            let got: Vec<_> = split(offset, len, chunk).collect();
            assert_eq!(got, want, "{name}");
            let covered: u64 = got.iter().map(|c| c.2).sum();
            assert_eq!(covered, len, "{name}: covers the range exactly");
            for &(_, o, l) in &got {
                let pages = (o + l).div_ceil(P) - o / P;
                assert!(pages * P <= chunk, "{name}: {o}+{l} spans {pages} pages");
            }
        }
    }

    #[test]
    fn merge_table() {
        type Ranges = Vec<(u64, u64)>;
        let cases: Vec<(Ranges, Ranges)> = vec![
            (vec![], vec![]),
            (vec![(10, 5), (0, 10)], vec![(0, 15)]),
            (vec![(0, 4), (8, 4)], vec![(0, 4), (8, 4)]),
            (vec![(0, 10), (2, 3)], vec![(0, 10)]),
        ];
        for (input, want) in cases {
            assert_eq!(merge(&input), want, "{input:?}");
        }
    }

    #[test]
    fn default_memory_floor() {
        const G: u64 = 1 << 30;
        assert_eq!(Options::default_memory_floor(24 * G), 24 * G / 20);
        assert_eq!(Options::default_memory_floor(2 * G), 256 << 20);
        assert_eq!(Options::default_memory_floor(256 << 20), 128 << 20);
    }
}
