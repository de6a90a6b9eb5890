//! The dispatcher: walks the schedule in order, applies the memory guard,
//! cuts entries into requests and hands them to the workers through the
//! bounded queue, starting workers as work arrives.

use std::sync::atomic::Ordering;
use std::sync::mpsc::sync_channel;
use std::sync::Mutex;
use std::thread;
use std::time::Instant;

use warmstart_plan::chunk::split;
use warmstart_plan::{Entry, Plan};

use super::worker::{clamp, State, Work};
use super::{lock, Engine};
use crate::backend::{Backend, MemInfo, ReplayCpus};
use crate::report::Count;
use crate::ReplayError;

impl<B: Backend> Engine<'_, B> {
    /// The issue phase: this thread dispatches, the workers execute.
    pub(super) fn issue(
        &self,
        plan: &Plan,
        state: &State<'_, B>,
        d: &mut Dispatch,
    ) -> Result<(), ReplayError> {
        let (workers, queue_depth) = self.opts.pool(state.metadata_read);
        let spare = self.opts.spare(state.metadata_read);
        let (tx, rx) = sync_channel::<Work>(queue_depth);
        let rx = &Mutex::new(rx);
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
                if started < workers && spawn_error.is_none() {
                    let primary = started == 0;
                    let spawned = thread::Builder::new()
                        .name(format!("ws-replay-{started}"))
                        .spawn_scoped(s, move || self.worker(state, rx, primary));
                    match spawned {
                        Ok(_) => {
                            started += 1;
                            new = true;
                            if let Some(after) = spare.filter(|_| primary) {
                                // Without it the replay still runs.
                                let _ = thread::Builder::new()
                                    .name("ws-replay-spare".into())
                                    .spawn_scoped(s, move || self.spare(state, rx, after));
                            }
                        }
                        Err(source) => spawn_error = Some(source),
                    }
                }
                (started > 0).then_some(new)
            };
            let total = state.to_issue;
            let mut dispatched = 0u64;
            let mut inline_first = self.opts.io_priority.is_none();
            let handed = std::cell::Cell::new(false);
            let mut confined = false;
            // Hands `w` to a worker, starting one if not all run; false if
            // the replay was cancelled. `schedule`: work of the schedule,
            // which the first request must not overtake.
            let mut send = |w: Work, schedule: bool| {
                if self.cancel.load(Ordering::Relaxed) {
                    return false;
                }
                let Some(new) = start_worker() else {
                    return false;
                };
                if tx.send(w).is_err() {
                    return false;
                }
                if schedule {
                    handed.set(true);
                }
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

            // Metadata first, each device's in one sweep (see `meta`).
            let meta_entries: u64 = state
                .devices
                .values()
                .flat_map(|d| &d.ranges)
                .map(|r| r.covers.entries)
                .sum();
            let mut meta_done = 0u64;
            let stop = |d: &mut Dispatch, i: usize, meta_done: u64| {
                d.not_reached = not_reached(plan, i, meta_entries - meta_done);
            };
            if !state.devices.is_empty() && !self.memory_allows(state, d, 0, total) {
                stop(d, 0, 0);
                return spawn_result(spawn_error, started);
            }
            for (&device, slot) in &state.devices {
                for r in &slot.ranges {
                    if state.device_failed(device) {
                        // Refused, not worth reading, or failed on an
                        // earlier range: no worker is woken for it.
                        state.skip_meta(device, r.covers);
                        meta_done += r.covers.entries;
                        continue;
                    }
                    for (first, offset, len) in split(r.offset, r.len, slot.chunk) {
                        if !first && state.device_failed(device) {
                            break;
                        }
                        let credit = if first { r.covers } else { Count::default() };
                        let w = Work::Meta {
                            device,
                            offset,
                            len,
                            credit,
                        };
                        if !send(w, false) {
                            d.cancelled = self.cancel.load(Ordering::Relaxed);
                            stop(d, 0, meta_done);
                            return spawn_result(spawn_error, started);
                        }
                        meta_done += credit.entries;
                        dispatched = dispatched.saturating_add(len);
                    }
                }
            }

            for (i, entry) in plan.entries.iter().enumerate() {
                if self.cancel.load(Ordering::Relaxed) {
                    d.cancelled = true;
                    stop(d, i, meta_done);
                    break;
                }
                let (file, offset, len) = match *entry {
                    // Read (or skipped) above.
                    Entry::Meta { .. } => continue,
                    Entry::Lookup { index } => {
                        if !self.memory_allows(state, d, dispatched, total - dispatched) {
                            stop(d, i, meta_done);
                            break;
                        }
                        if !send(Work::Lookup { index }, true) {
                            d.cancelled = self.cancel.load(Ordering::Relaxed);
                            stop(d, i, meta_done);
                            break;
                        }
                        if !std::mem::replace(&mut confined, true) {
                            self.confine(state);
                        }
                        continue;
                    }
                    Entry::Data { file, offset, len } => (file, offset, len),
                };
                let (offset, clamped) = clamp(plan, file, offset, len);
                if clamped < len {
                    let mut c = lock(&state.beyond_eof);
                    c.bytes += len - clamped;
                    c.entries += u64::from(clamped == 0);
                }
                let slot = &state.files[file as usize];
                if clamped == 0 {
                    continue;
                }
                if !self.memory_allows(state, d, dispatched, total - dispatched) {
                    stop(d, i, meta_done);
                    break;
                }
                if state.file_skipped(file) {
                    // Known bad: counted here, no worker is woken for it.
                    let mut c = lock(&slot.skipped);
                    c.entries += 1;
                    c.bytes += clamped;
                    dispatched = dispatched.saturating_add(clamped);
                    continue;
                }
                let mut sent = true;
                for (first, o, l) in split(offset, clamped, slot.chunk) {
                    if !first && state.file_skipped(file) {
                        // Found bad on this entry's first request: the
                        // rest is counted at once, however many requests
                        // it would have been.
                        lock(&slot.skipped).bytes += offset + clamped - o;
                        break;
                    }
                    let w = Work::Data {
                        file,
                        offset: o,
                        len: l,
                        first,
                    };
                    if !handed.get() && std::mem::take(&mut inline_first) {
                        // The first request is issued by this thread
                        // unless work of the schedule was handed out
                        // before it (which it must not overtake) or the
                        // replay has an I/O priority (set on the workers
                        // only, not on the caller's thread): a hand-off
                        // costs a thread start and, under the daemon, a
                        // wait for a CPU. Issued, it counts as reached
                        // even if a cancel arrived meanwhile.
                        state.execute(w);
                        continue;
                    }
                    if !send(w, true) {
                        sent = false;
                        break;
                    }
                }
                if !sent {
                    // Cancelled mid-entry (or every worker is gone, which
                    // only a panic can cause and `thread::scope` re-raises).
                    d.cancelled = self.cancel.load(Ordering::Relaxed);
                    stop(d, i, meta_done);
                    break;
                }
                dispatched = dispatched.saturating_add(clamped);
                if !std::mem::replace(&mut confined, true) {
                    // The first entry is on its way: now this thread moves.
                    self.confine(state);
                }
            }
            drop(tx);
            spawn_result(spawn_error, started)
        })
    }

    /// The memory guard, checked before each entry.
    pub(super) fn memory_allows(
        &self,
        state: &State<'_, B>,
        d: &mut Dispatch,
        dispatched: u64,
        remaining: u64,
    ) -> bool {
        if d.floor == 0 {
            // Guard off, but a replay never reads more than the machine's
            // memory: the rest would evict what it read first. This also
            // ends a forged plan of exabytes at once.
            if remaining <= d.mem.total {
                return true;
            }
            d.stopped_by_memory = true;
            d.available_at_stop = Some(d.mem.available);
            d.remaining_at_stop = Some(remaining);
            return false;
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
    pub(super) fn choose_cpus(&self, state: &mut State<'_, B>) -> Option<Vec<usize>> {
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
    pub(super) fn confine(&self, state: &State<'_, B>) {
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
}

/// The dispatcher's running state.
pub(super) struct Dispatch {
    pub(super) floor: u64,
    pub(super) mem: MemInfo,
    pub(super) sample_at: Instant,
    pub(super) dispatched_at_sample: u64,
    pub(super) stopped_by_memory: bool,
    pub(super) cancelled: bool,
    pub(super) not_reached: u64,
    pub(super) available_at_stop: Option<u64>,
    pub(super) remaining_at_stop: Option<u64>,
}

/// Not one worker: at most the first request was issued. Fewer workers
/// than asked for still replay the plan.
fn spawn_result(spawn_error: Option<std::io::Error>, started: usize) -> Result<(), ReplayError> {
    match spawn_error {
        Some(source) if started == 0 => Err(ReplayError::Thread { source }),
        _ => Ok(()),
    }
}

/// Entries a replay stopping at schedule position `from` never reaches:
/// those left of the schedule other than metadata (read before it), and
/// the metadata entries not yet issued or skipped.
fn not_reached(plan: &Plan, from: usize, meta_left: u64) -> u64 {
    let rest = plan.entries[from..]
        .iter()
        .filter(|e| !matches!(e, Entry::Meta { .. }))
        .count() as u64;
    rest + meta_left
}
