//! The workers and the state they share: each request is executed here,
//! files are opened and checked against their identity on first use, and
//! every outcome is counted for the report.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use warmstart_plan::trace::{FileId, PAGE_SIZE};
use warmstart_plan::{Entry, Plan};

use super::meta::{self, DevState, DeviceSlot};
use super::{lock, monotonic_ns, nanos, DataGate, Engine, Options};
use crate::backend::{Backend, LookupOutcome};
use crate::error::dev_name;
use crate::report::{
    Count, IdField, IssuedRequest, LookupCounts, Report, SkipReason, SkippedDevice, SkippedFile,
};
use crate::ReplayError;

impl<B: Backend> Engine<'_, B> {
    /// `primary`: the first worker, whose time in a request the spare
    /// thread watches.
    pub(super) fn worker(&self, state: &State<'_, B>, rx: &Mutex<Receiver<Work>>, primary: bool) {
        // However the first worker ends (a panic too), the spare ends.
        let _done = primary.then_some(Done(&state.primary_done));
        PRIMARY.set(primary);
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

    /// The spare thread: checks every half `after` whether the first
    /// worker has been inside one open or lookup for `after` or longer (a
    /// metadata read the bulk read did not cover), and while it has, takes
    /// requests from the queue itself. A data request that waits for the
    /// device's queue does not call it: a second thread would only queue
    /// more behind it.
    pub(super) fn spare(&self, state: &State<'_, B>, rx: &Mutex<Receiver<Work>>, after: Duration) {
        if let Some(prio) = self.opts.io_priority {
            if let Err(e) = self.backend.set_io_priority(prio) {
                state.note(e.to_string());
            }
        }
        let after_ns = nanos(after);
        let mut first = true;
        while !state.primary_done.load(Ordering::Relaxed) {
            std::thread::sleep(after / 2);
            let since = state.primary_since.load(Ordering::Relaxed);
            if since == 0 || monotonic_ns().saturating_sub(since) < after_ns {
                continue;
            }
            state.spare_turns.fetch_add(1, Ordering::Relaxed);
            // The first worker is blocked: work while it stays so.
            while state.primary_since.load(Ordering::Relaxed) == since {
                let Ok(q) = rx.try_lock() else { break };
                let w = match q.try_recv() {
                    Ok(w) => w,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return,
                };
                drop(q);
                state.execute(w);
                state.spare_requests.fetch_add(1, Ordering::Relaxed);
                if std::mem::take(&mut first) {
                    self.confine(state);
                }
            }
        }
    }
}

thread_local! {
    /// This thread is the first worker, watched by the spare.
    static PRIMARY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// While alive on the first worker, tells the spare when it began to wait
/// on the disk for metadata (an open or a lookup).
struct Waiting<'a>(Option<&'a AtomicU64>);

impl<'a> Waiting<'a> {
    fn start(since: &'a AtomicU64) -> Self {
        Waiting(PRIMARY.get().then(|| {
            since.store(monotonic_ns(), Ordering::Relaxed);
            since
        }))
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.0 {
            s.store(0, Ordering::Relaxed);
        }
    }
}

/// Sets its flag when dropped.
struct Done<'a>(&'a AtomicBool);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// One request for a worker.
#[derive(Debug, Clone, Copy)]
pub(super) enum Work {
    /// `first`: the first chunk of its entry, so entries are counted once.
    Data {
        file: u32,
        offset: u64,
        len: u64,
        first: bool,
    },
    /// `credit`: the plan entries and bytes this request stands for
    /// (on the first request of a merged range, else zero).
    Meta {
        device: u64,
        offset: u64,
        len: u64,
        credit: Count,
    },
    Lookup {
        index: u32,
    },
}

pub(super) enum FileState<H> {
    Unopened,
    Open(Arc<H>),
    /// All its requests are issued; the descriptor is closed.
    Done,
    Skipped(SkipReason),
}

pub(super) struct FileSlot<H> {
    pub(super) state: Mutex<FileState<H>>,
    /// Largest request on this file's device.
    pub(super) chunk: u64,
    /// Requests not yet executed; the descriptor closes at zero.
    pub(super) chunks_left: AtomicU64,
    pub(super) skipped: Mutex<Count>,
    /// Ranges issued, kept for the residency wait.
    pub(super) issued: Mutex<Vec<(u64, u64)>>,
}

/// What the workers share.
pub(super) struct State<'a, B: Backend> {
    pub(super) backend: &'a B,
    pub(super) plan: &'a Plan,
    pub(super) keep_ranges: bool,
    pub(super) files: Vec<FileSlot<B::Handle>>,
    pub(super) devices: BTreeMap<u64, DeviceSlot<B::Handle>>,
    /// Most of the plan's metadata is on devices opened at setup, to be
    /// read in bulk before the schedule ([`Options::workers_metadata_read`],
    /// [`meta::mostly_read`]).
    pub(super) metadata_read: bool,
    pub(super) data: Mutex<Count>,
    /// Data past the end of its file, not requested.
    pub(super) beyond_eof: Mutex<Count>,
    /// Bytes the replay will request if it runs to the end: data clamped
    /// to its files, and the merged metadata ranges to be read.
    pub(super) to_issue: u64,
    /// The cancel flag was seen during setup; nothing may be issued.
    pub(super) setup_cancelled: bool,
    pub(super) meta: Mutex<Count>,
    pub(super) lookups: Mutex<LookupCounts>,
    pub(super) requests: AtomicU64,
    /// Data requests with their issue times (`Options::log_requests`).
    pub(super) request_log: Option<Mutex<Vec<IssuedRequest>>>,
    /// While closed, data is read through rather than queued
    /// ([`DataGate`]).
    pub(super) gate: Option<Arc<DataGate>>,
    /// The engine's progress counter, shared with the launch manager.
    pub(super) progress: Option<Arc<AtomicU64>>,
    pub(super) first_started: Option<Arc<AtomicU64>>,
    pub(super) first_issued: Option<Arc<AtomicU64>>,
    pub(super) files_opened: AtomicU64,
    pub(super) failed_requests: AtomicU64,
    pub(super) errors: Mutex<(Vec<String>, u64)>,
    /// When the first worker began its current open or lookup (0: it is
    /// in none), and whether it has ended; read by the spare thread.
    pub(super) primary_since: AtomicU64,
    pub(super) primary_done: AtomicBool,
    /// Times the spare thread found the first worker blocked, and the
    /// requests it executed then.
    pub(super) spare_turns: AtomicU64,
    pub(super) spare_requests: AtomicU64,
    pub(super) busy_open: AtomicU64,
    pub(super) busy_data: AtomicU64,
    pub(super) busy_meta: AtomicU64,
    pub(super) busy_lookup: AtomicU64,
    /// The CPUs the replay's threads are confined to, if they are.
    pub(super) cpus: Option<Vec<usize>>,
    /// A thread moved to `cpus`; one failed to.
    pub(super) moved: AtomicBool,
    pub(super) move_failed: AtomicBool,
    /// A residency query was refused (EPERM); said once.
    pub(super) residency_denied: AtomicBool,
}

/// How many problem messages a report keeps.
const MAX_ERRORS: usize = 32;

/// Setup checks the cancel flag once per this many files or entries.
const CANCEL_CHECK_EVERY: usize = 4096;

impl<'a, B: Backend> State<'a, B> {
    /// Prepares `plan`'s replay: request sizes, descriptor counts and
    /// metadata devices. Work per entry is constant (request counts are
    /// computed, not enumerated), and `cancel` is checked as it goes.
    pub(super) fn new(backend: &'a B, plan: &'a Plan, opts: &Options, cancel: &AtomicBool) -> Self {
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
        let mut files: Vec<FileSlot<B::Handle>> = Vec::with_capacity(plan.files.len());
        let mut setup_cancelled = false;
        for (i, f) in plan.files.iter().enumerate() {
            if i % CANCEL_CHECK_EVERY == 0 && cancel.load(Ordering::Relaxed) {
                setup_cancelled = true;
                break;
            }
            files.push(FileSlot {
                state: Mutex::new(FileState::Unopened),
                chunk: chunk_of(f.id.dev),
                chunks_left: AtomicU64::new(0),
                skipped: Mutex::new(Count::default()),
                issued: Mutex::new(Vec::new()),
            });
        }
        let mut to_issue = 0u64;
        if !setup_cancelled {
            for (i, e) in plan.entries.iter().enumerate() {
                if i % CANCEL_CHECK_EVERY == 0 && cancel.load(Ordering::Relaxed) {
                    setup_cancelled = true;
                    break;
                }
                if let Entry::Data { file, offset, len } = *e {
                    let (offset, len) = clamp(plan, file, offset, len);
                    let slot = &mut files[file as usize];
                    *slot.chunks_left.get_mut() +=
                        warmstart_plan::chunk::request_count(offset, len, slot.chunk);
                    to_issue = to_issue.saturating_add(len);
                }
            }
        }
        let devices = if setup_cancelled {
            BTreeMap::new()
        } else {
            meta::devices(backend, plan, opts)
        };
        for d in devices.values() {
            to_issue = to_issue.saturating_add(d.read_bytes());
        }
        let metadata_read = meta::mostly_read(&devices);
        State {
            backend,
            plan,
            keep_ranges: opts.wait.is_some(),
            files,
            devices,
            metadata_read,
            data: Mutex::new(Count::default()),
            beyond_eof: Mutex::new(Count::default()),
            to_issue,
            setup_cancelled,
            meta: Mutex::new(Count::default()),
            lookups: Mutex::new(LookupCounts::default()),
            requests: AtomicU64::new(0),
            request_log: opts.log_requests.then(|| Mutex::new(Vec::new())),
            gate: None,
            progress: None,
            first_started: None,
            first_issued: None,
            files_opened: AtomicU64::new(0),
            failed_requests: AtomicU64::new(0),
            errors: Mutex::new((Vec::new(), 0)),
            primary_since: AtomicU64::new(0),
            primary_done: AtomicBool::new(false),
            spare_turns: AtomicU64::new(0),
            spare_requests: AtomicU64::new(0),
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

    /// Whether plan file `file` was found missing or changed.
    pub(super) fn file_skipped(&self, file: u32) -> bool {
        matches!(
            *lock(&self.files[file as usize].state),
            FileState::Skipped(_)
        )
    }

    /// Records a problem that does not stop the replay.
    pub(super) fn note(&self, msg: String) {
        let mut e = lock(&self.errors);
        e.1 += 1;
        if e.0.len() < MAX_ERRORS {
            e.0.push(msg);
        }
    }

    /// Counts an issued request in the shared progress, stamping the first.
    pub(super) fn issued_one(&self) {
        if let Some(p) = &self.progress {
            if p.fetch_add(1, Ordering::Relaxed) == 0 {
                if let Some(f) = &self.first_issued {
                    let _ =
                        f.compare_exchange(0, monotonic_ns(), Ordering::Relaxed, Ordering::Relaxed);
                }
            }
        }
    }

    pub(super) fn execute(&self, w: Work) {
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
                credit,
            } => self.meta(device, offset, len, credit),
            Work::Lookup { index } => self.lookup(index),
        }
    }

    fn data(&self, file: u32, offset: u64, len: u64, first: bool) {
        let slot = &self.files[file as usize];
        if let Some(h) = self.file_handle(file) {
            let t = Instant::now();
            let issued_ns = self.request_log.as_ref().map(|_| monotonic_ns());
            let res = match &self.gate {
                Some(g) if !g.is_open() => self.backend.read_through(&h, offset, len),
                _ => self.backend.prefetch(&h, offset, len),
            };
            self.busy_data
                .fetch_add(nanos(t.elapsed()), Ordering::Relaxed);
            match res {
                Ok(()) => {
                    if let (Some(log), Some(t_ns)) = (&self.request_log, issued_ns) {
                        lock(log).push(IssuedRequest {
                            file,
                            offset,
                            len,
                            t_ns,
                        });
                    }
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
        let waiting = Waiting::start(&self.primary_since);
        let opened = self.backend.open_file(Path::new(&pf.path));
        drop(waiting);
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

    fn lookup(&self, index: u32) {
        let l = &self.plan.lookups[index as usize];
        let t = Instant::now();
        let waiting = Waiting::start(&self.primary_since);
        let res = self.backend.lookup(l.kind, Path::new(&l.path));
        drop(waiting);
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

    pub(super) fn report(&self, plan: &Plan) -> Report {
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
                DevState::Unsupported(fs) => format!(
                    "{fs} keeps its metadata in a cache of its own, which reading the device does not fill"
                ),
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
        r.meta_devices = meta::describe(&self.devices, true);
        r.beyond_eof = *lock(&self.beyond_eof);
        if let Some(log) = &self.request_log {
            r.issued = std::mem::take(&mut *lock(log));
            r.issued.sort_by_key(|q| q.t_ns);
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
        ReplayError::NotRegular { found, .. } => SkipReason::NotRegular {
            found: found.clone(),
        },
        other => SkipReason::OpenFailed {
            error: other.to_string(),
        },
    }
}

/// A data range cut at the end of its file, rounded up to a page: past it
/// a file whose identity matches has no pages (identity includes the
/// size), whatever the plan says. The length may come out 0.
pub(super) fn clamp(plan: &Plan, file: u32, offset: u64, len: u64) -> (u64, u64) {
    let size = plan.files[file as usize].id.size;
    let limit = size.div_ceil(PAGE_SIZE).saturating_mul(PAGE_SIZE);
    let end = offset.saturating_add(len).min(limit);
    (offset, end.saturating_sub(offset))
}
