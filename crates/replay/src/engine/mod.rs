//! The replay engine: walks a plan's schedule in order and hands each step
//! to a small pool of worker threads through a bounded queue.
//!
//! Why this shape:
//! - One dispatcher keeps the schedule order (FAST replays the launch
//!   sequence in order so that the pages the application needs first arrive
//!   first); several workers keep more than one request in flight, because
//!   opening a file or walking a path blocks on metadata I/O while the disk
//!   could already be reading the next file's data (Paralfetch). Where
//!   that metadata was read in bulk first, two: a request then only
//!   submits I/O, and more threads take CPU from the launch.
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
//!   read the wrong bytes (docs/reference/architecture.md). A file's descriptor is closed as soon
//!   as its last request is issued, so large plans do not exhaust
//!   descriptors.
//! - Metadata goes first: each device's metadata entries are read before
//!   the schedule, merged and in device order (see the `meta` module).
//! - A memory guard stops before the remaining schedule would push
//!   `MemAvailable` under a floor ("do no harm", docs/reference/architecture.md); even with the
//!   guard off, a replay never reads more than the machine's memory.
//! - A forged plan costs no more than a real one: data ranges are clamped
//!   to their file's size, request counts are computed rather than
//!   enumerated, a file found bad has the rest of its entry counted in one
//!   step, and setup checks the cancel flag as it goes.

mod dispatch;
mod gate;
mod meta;
mod wait;
mod worker;

pub use gate::DataGate;
pub use meta::{device_reads_reach, metadata_mostly_read, metadata_paths, MAX_META_REQUEST};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use warmstart_plan::trace::PAGE_SIZE;
use warmstart_plan::Plan;

use crate::backend::{Backend, IoPriority, MemInfo, ReplayCpus};
use crate::report::{MemoryReport, Report, SpareReport, Timings};
use crate::ReplayError;

use dispatch::Dispatch;
use worker::State;

/// How a replay runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Worker threads issuing requests (at least 1).
    pub workers: usize,
    /// Requests queued for the workers beyond the ones they are executing.
    pub queue_depth: usize,
    /// Worker threads instead of `workers` (and a queue of twice as many)
    /// when most of the plan's metadata is on devices read in bulk at the
    /// start (see the `meta` module): the schedule's opens and lookups then
    /// find their blocks cached and do not wait on the disk, so more
    /// threads only take CPU from the launch. Not for a replay that is
    /// waited for ([`Options::wait`]: nothing runs beside it). `None`:
    /// always `workers`.
    pub workers_metadata_read: Option<usize>,
    /// With the smaller pool of [`Options::workers_metadata_read`], one
    /// more thread that takes requests only while the first worker has
    /// waited this long in an open or a path lookup (a metadata block the
    /// bulk read did not cover), so that no request waits behind it.
    /// `None`: no such thread.
    pub spare_after: Option<Duration>,
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
    /// While waiting, give up on a file or device whose pending pages
    /// made no progress for this long (they will not become resident),
    /// rather than hold the caller until [`Options::wait`] ends. Pages
    /// still absent when the wait reaches them are read through first, a
    /// file's once more after a fifth of this without progress.
    pub wait_stall: Duration,
    /// Metadata ranges of one device are read as one where the hole
    /// between them is at most this many bytes. Default: the compiler's
    /// merge gap (64 KiB), the same trade of a little wasted I/O for fewer
    /// requests; on the ext4 image of the metadata tests it turned 113
    /// block reads into 3 ranges.
    pub meta_gap: u64,
    /// Keep every data request with the time it was issued
    /// ([`Report::issued`]), for `warmstart run --breakdown`. Off: a
    /// replay beside a launch keeps nothing per request.
    pub log_requests: bool,
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
    /// Default [`Options::wait_stall`]: far longer than a page read takes
    /// even on the slowest storage profile (an SD card's few milliseconds
    /// per request, a read queued behind the rest of the plan), far
    /// shorter than [`Options::DEFAULT_WAIT_TIMEOUT`].
    pub const DEFAULT_WAIT_STALL: Duration = Duration::from_secs(5);
    /// Smallest memory floor the default picks.
    pub const MIN_MEMORY_FLOOR: u64 = 256 << 20;

    /// Eight workers whatever the core count where they spend their time
    /// blocked in metadata reads (opens, lookups), not on a CPU; fewer
    /// where the metadata is read in bulk first
    /// ([`Options::workers_metadata_read`]). Measured on the
    /// project's 2-core VM (Python plan, 2026-11-22): prefetch-only time
    /// 60-87 ms with 2 workers, 52-63 ms with 8, 50-56 ms with 16; a cold
    /// `warmstart run` captured 42% of the cold-warm gap with 2 and 60%
    /// with 8 (medians of 15 interleaved rounds).
    pub fn default_workers() -> usize {
        8
    }

    /// Default [`Options::workers_metadata_read`], with a spare thread
    /// ([`Options::SPARE_AFTER`]). Measured on the ext4 testbed (the
    /// project's 2-core VM, five programs, 10 balanced rounds, the
    /// in-process replay of the same plan, both variants in the same
    /// rounds; means of the gap captured): one worker and the spare 72%
    /// against 67% with eight (npm 78% against 65%, clang 71% against
    /// 62%), and 74% against 75% with two; a fixed one worker against
    /// eight in five runs 78% against 73% on average, two against eight
    /// in three runs 76% against 74%. On the `cloud` model,
    /// bandwidth-bound, two and eight were level (69% and 70%). Where
    /// lookups read the metadata (this VM's disk, xfs, btrfs), two
    /// against eight was within the programs' spread, so eight are kept
    /// there. (`bench/runs/2026-11-27-replay-workers/`.)
    pub const WORKERS_METADATA_READ: usize = 1;

    /// Default [`Options::spare_after`]: an open whose blocks are cached
    /// takes a few microseconds, one that reads the disk 80 µs (this VM's
    /// disk) to milliseconds (the `cloud` and `sd` models). The spare
    /// checks every half of it.
    pub const SPARE_AFTER: Duration = Duration::from_micros(250);

    /// Sets the worker count whatever the metadata's path (the user's
    /// `--workers`), with a queue of twice as many.
    pub fn fixed_workers(&mut self, workers: usize) {
        self.workers = workers;
        self.queue_depth = 2 * workers;
        self.workers_metadata_read = None;
        self.spare_after = None;
    }

    /// The workers and queue depth of a replay whose metadata is (`true`)
    /// or is not read from its devices in bulk.
    pub fn pool(&self, metadata_read: bool) -> (usize, usize) {
        match self.smaller_pool(metadata_read) {
            Some(w) => (w, 2 * w),
            None => (self.workers, self.queue_depth),
        }
    }

    /// The spare thread's wait, if the replay has one: only with the
    /// smaller pool.
    pub fn spare(&self, metadata_read: bool) -> Option<Duration> {
        self.smaller_pool(metadata_read).and(self.spare_after)
    }

    /// [`Options::workers_metadata_read`], if it applies to this replay.
    fn smaller_pool(&self, metadata_read: bool) -> Option<usize> {
        self.workers_metadata_read
            .filter(|&w| metadata_read && w < self.workers && self.wait.is_none())
            .map(|w| w.max(1))
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
            workers_metadata_read: Some(Options::WORKERS_METADATA_READ),
            spare_after: Some(Options::SPARE_AFTER),
            io_priority: None,
            cpus: ReplayCpus::default(),
            max_request: Options::DEFAULT_MAX_REQUEST,
            memory_floor: None,
            memory_check_interval: Duration::from_millis(10),
            wait: None,
            wait_poll: Duration::from_millis(2),
            wait_stall: Options::DEFAULT_WAIT_STALL,
            meta_gap: warmstart_plan::compile::DEFAULT_MERGE_GAP,
            log_requests: false,
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
    gate: Option<Arc<DataGate>>,
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
            gate: None,
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

    /// Paces the plan's data while `gate` is closed (see [`DataGate`]):
    /// each data request is read through, synchronously, instead of
    /// queued with `WILLNEED`.
    pub fn pace_data(mut self, gate: Arc<DataGate>) -> Self {
        self.gate = Some(gate);
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
        let mut state = State::new(self.backend, plan, &self.opts, &self.cancel);
        // Cancelled before any work: nothing is read, not even meminfo.
        let cancelled = state.setup_cancelled || self.cancel.load(Ordering::Relaxed);
        let mem = if cancelled {
            MemInfo {
                total: 0,
                available: 0,
            }
        } else {
            self.backend.memory()?
        };
        let floor = self
            .opts
            .memory_floor
            .unwrap_or_else(|| Options::default_memory_floor(mem.total));
        state.gate = self.gate.clone();
        state.progress = Some(Arc::clone(&self.progress));
        state.first_started = Some(Arc::clone(&self.first_started));
        state.first_issued = Some(Arc::clone(&self.first_issued));
        // This thread dispatches: it is confined with the workers, once the
        // first request is on its way, and gets its CPUs back afterwards.
        let restore = (!cancelled).then(|| self.choose_cpus(&mut state)).flatten();
        let _restore = restore.map(|cpus| Restore {
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
        let issued = if cancelled {
            dispatch.cancelled = true;
            dispatch.not_reached = plan.entries.len() as u64;
            Ok(())
        } else {
            self.issue(plan, &state, &mut dispatch)
        };
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
        (report.workers, report.queue_depth) = self.opts.pool(state.metadata_read);
        report.spare = self
            .opts
            .spare(state.metadata_read)
            .map(|after| SpareReport {
                after_ns: nanos(after),
                turns: state.spare_turns.load(Ordering::Relaxed),
                requests: state.spare_requests.load(Ordering::Relaxed),
            });
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
    fn default_memory_floor() {
        const G: u64 = 1 << 30;
        assert_eq!(Options::default_memory_floor(24 * G), 24 * G / 20);
        assert_eq!(Options::default_memory_floor(2 * G), 256 << 20);
        assert_eq!(Options::default_memory_floor(256 << 20), 128 << 20);
    }
}
