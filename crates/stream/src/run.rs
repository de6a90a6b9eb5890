//! `warmstart stream`: the prefetchd loop on warmstart's recorder, around a
//! command it starts or a process tree already running.
//!
//! Every polling interval (0.5 s, prefetchd's default) the application's
//! page requests since the last one are run through a detector per
//! (process, file); for each recognised stream the prefetcher keeps
//! `scale × linear share × its request rate × interval` pages asked for
//! ahead of the reader — the application's measured rate — capped by the
//! device's measured throughput minus the application's own random traffic,
//! with `posix_fadvise(WILLNEED)` on warmstart's own descriptor. Like
//! prefetchd it continues from where the last prefetch stopped rather than
//! asking again for pages already asked for. The scale follows the feedback
//! controller.
//!
//! Two details the paper's user-space prototype did not have to face:
//! - One `WILLNEED` reads at most the device's read-ahead size and silently
//!   drops the rest (`force_page_cache_ra()` caps `nr_to_read`), so requests
//!   are cut at `read_ahead_kb`, as the replay engine does; with the usual
//!   128 KiB an uncut request would prefetch almost nothing.
//! - Requests are issued from a thread of their own: `WILLNEED` blocks while
//!   the block layer's queue is full, and the loop must keep draining the
//!   ring buffer meanwhile.
//!
//! warmstart traces its own process too, so the events say exactly which
//! pages the prefetcher brought in (inserted by us), which the application
//! then used, which it still read from storage itself, and which were
//! inserted a second time — evicted before use, or refaulted after use —
//! the signal the controller backs off on. Accuracy and cost come from the
//! same events.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;
use warmstart_bpf::{Event, PageKind, Recorder};
use warmstart_record::resolve::kdev_to_user;
use warmstart_record::{procscan, Exit, HeldChild, SignalForwarder};

use crate::detect::{self, Detector, Reach, Stream, MATCH_THRESHOLD};
use crate::feedback::{Controller, Interval};
use crate::pages::PageSet;

const PAGE: u64 = 4096;
/// Pages a (process, file) not yet prefetched must have requested before
/// it is checked for a stream at every poll instead of every interval.
const FAST_START_PAGES: u64 = 64;
/// The shortest span a request rate is measured over.
const MIN_RATE_SPAN: Duration = Duration::from_millis(10);
/// Request size when the device's read-ahead size is unknown.
const DEFAULT_CHUNK: u64 = 128 << 10;

#[derive(Debug, Clone)]
pub struct Options {
    pub interval: Duration,
    pub threshold: f64,
    /// Bytes per second the device can read; measured when `None`.
    pub max_throughput: Option<u64>,
    /// Stop prefetching while MemAvailable is below this.
    pub memory_floor: u64,
    /// A fixed scale instead of feedback: the static aggressive
    /// prefetcher prefetchd is compared with.
    pub static_scale: Option<f64>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            interval: Duration::from_millis(500),
            threshold: MATCH_THRESHOLD,
            max_throughput: None,
            memory_floor: 256 << 20,
            static_scale: None,
        }
    }
}

/// Per-file results, and the totals, as prefetchd's paper defines them.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FileReport {
    pub path: String,
    pub pattern: Option<String>,
    /// Pages the application read (requested).
    pub used: u64,
    /// Pages the prefetcher brought into the cache.
    pub prefetched: u64,
    /// Prefetched pages the application then read.
    pub prefetched_used: u64,
    /// Pages the application still had to read from storage itself.
    pub app_read: u64,
    /// Prefetched pages evicted before the application reached them.
    pub evicted_unused: u64,
    /// Pages the application used, lost from the cache and read again.
    pub refaulted: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub files: Vec<FileReport>,
    pub used: u64,
    pub prefetched: u64,
    pub prefetched_used: u64,
    pub app_read: u64,
    pub evicted_unused: u64,
    pub refaulted: u64,
    /// (prefetched and used) / used.
    pub accuracy: f64,
    /// prefetched / used.
    pub cost: f64,
    pub final_scale: f64,
    pub max_throughput: u64,
    pub intervals: u64,
    pub drops: u64,
    /// Intervals skipped because MemAvailable was under the floor.
    pub backed_off: u64,
    /// Intervals in which prefetching was found evicting the cache's
    /// useful pages, and the scale was halved.
    pub thrashing: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Record(#[from] warmstart_record::Error),
    #[error(transparent)]
    Bpf(#[from] warmstart_bpf::Error),
    #[error("cannot start {cmd:?}: {source}")]
    Spawn {
        cmd: String,
        #[source]
        source: std::io::Error,
    },
    #[error("no running process {pid}")]
    NoProcess { pid: u32 },
    #[error("cannot install a signal handler: {0}")]
    Signal(std::io::Error),
}

impl Error {
    /// For a command that could not be started, the status a shell
    /// reports: 127 when it was not found, 126 when it was found but could
    /// not be run. `None` for the other errors.
    pub fn shell_code(&self) -> Option<i32> {
        match self {
            Error::Spawn { source, .. } => Some(warmstart_record::spawn::shell_code(source)),
            Error::Record(e) => e.shell_code(),
            _ => None,
        }
    }
}

/// Runs `argv` with adaptive prefetching; returns its exit and the report.
///
/// The command starts at once, before the recorder is loaded (~50 ms of
/// BPF verification and BTF parsing): a prefetcher must not add its own
/// start-up to the program's time. The recorder then follows the process
/// tree as `--pid` does; what the command read before that is not seen,
/// nor counted in the report. Should the recorder fail to load after all,
/// the command runs to its end unprefetched and the reason is printed.
pub fn run<S: AsRef<std::ffi::OsStr>>(argv: &[S], opts: &Options) -> Result<(Exit, Report), Error> {
    if !warmstart_bpf::probe::privileged() {
        return Err(warmstart_bpf::Error::Permission.into());
    }
    let spawn_err = |source| Error::Spawn {
        cmd: warmstart_record::argv_text(argv).join(" "),
        source,
    };
    let held = HeldChild::spawn(argv).map_err(spawn_err)?;
    let mut signals = SignalForwarder::install().map_err(warmstart_record::Error::from)?;
    let mut running = held.release().map_err(spawn_err)?;
    let pid = running.pid();
    let wait = |running: &mut warmstart_record::Running,
                signals: &mut SignalForwarder|
     -> Result<Option<Exit>, Error> {
        signals.forward(running);
        Ok(running.try_wait().map_err(warmstart_record::Error::from)?)
    };
    let rec = match Recorder::start(recorder_options()) {
        Ok(rec) => rec,
        Err(e) => {
            eprintln!("warmstart: not prefetching: {e}");
            let exit = loop {
                if let Some(e) = wait(&mut running, &mut signals)? {
                    break e;
                }
                std::thread::sleep(Duration::from_millis(10));
            };
            return Ok((exit, Report::default()));
        }
    };
    rec.track(pid)?;
    let mut session = Session::new(&rec, opts)?;
    session.alive.insert(pid);
    // Children it started before the recorder was there.
    for child in procscan::descendants(Path::new("/proc"), pid) {
        rec.track(child)?;
        session.alive.insert(child);
    }
    let exit = loop {
        session.step()?;
        if let Some(e) = wait(&mut running, &mut signals)? {
            break e;
        }
    };
    Ok((exit, session.finish()))
}

/// Attaches to the running process `pid` and its descendants (those alive
/// now and those it starts) until it exits or warmstart is interrupted
/// (SIGINT, SIGTERM, SIGHUP); returns the report.
pub fn attach(pid: u32, opts: &Options) -> Result<Report, Error> {
    if !alive(pid) {
        return Err(Error::NoProcess { pid });
    }
    stop_on_signals().map_err(Error::Signal)?;
    let rec = Recorder::start(recorder_options())?;
    let tree = procscan::descendants(Path::new("/proc"), pid);
    for &p in &tree {
        rec.track(p)?;
    }
    let mut session = Session::new(&rec, opts)?;
    session.alive.extend(tree);
    // Its files are already open: name them from /proc, not from opens.
    session.resolve_paths();
    loop {
        session.step()?;
        if STOP.load(Ordering::Relaxed) || !session.alive.contains(&pid) || !alive(pid) {
            break;
        }
    }
    Ok(session.finish())
}

/// Page uses and insertions, and the process tree; no path system calls.
/// Files are named from `/proc` when a stream is found in them, so no
/// system call of the traced programs pays for a probe (sys_enter/sys_exit
/// run on every one).
fn recorder_options() -> warmstart_bpf::Options {
    warmstart_bpf::Options {
        namespace: false,
        ..warmstart_bpf::Options::default()
    }
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn stop_on_signals() -> std::io::Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is
        // async-signal-safe; the sigaction struct is fully initialised.
        let r = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_stop as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut())
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Whether `pid` exists and has not exited (a zombie has).
fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command name, which may itself hold ')'.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, r)| r.trim_start().chars().next());
    !matches!(state, None | Some('Z') | Some('X'))
}

#[derive(Default)]
struct FileState {
    path: Option<String>,
    file: Option<Arc<File>>,
    /// Bytes one WILLNEED reads at most on this file's device.
    chunk: u64,
    pages: u64,
    /// Pages the application used (requested).
    used: PageSet,
    /// Pages seen inserted into the cache, by anyone.
    inserted: PageSet,
    /// Pages the prefetcher inserted, not since found evicted.
    ours: PageSet,
    /// Pages asked for with WILLNEED.
    issued: PageSet,
    /// Pages the application read from storage itself.
    app_read: PageSet,
    prefetched: u64,
    prefetched_used: u64,
    evicted_unused: u64,
    refaulted: u64,
    pattern: Option<detect::Pattern>,
    /// Naming it from /proc was tried since the last interval and failed.
    unnamed: bool,
    /// Found a stream since the last interval: its lookahead is renewed at
    /// every poll until the interval ends.
    young: bool,
}

/// A (process, file)'s detector and when its interval's first request came.
#[derive(Default)]
struct Tracked {
    d: Detector,
    since: Option<Instant>,
}

/// One prefetching session: the recorder's events in, WILLNEEDs out.
struct Session<'a> {
    rec: &'a Recorder,
    opts: &'a Options,
    me: u32,
    files: HashMap<(u32, u64), FileState>,
    detectors: HashMap<(u32, u32, u64), Tracked>,
    ctl: Controller,
    report: Report,
    /// The device's throughput, once measured (or given).
    ceiling: Option<u64>,
    /// The measurement under way: it reads 16 MiB and must not hold up
    /// the first prefetch.
    measuring: Option<mpsc::Receiver<u64>>,
    /// Pages per second the application read at random last interval.
    random_rate: f64,
    /// When this poll's events were taken in.
    now: Instant,
    /// Pages read from storage (by anyone traced) this interval.
    added: u64,
    interval_start: Instant,
    /// The most bytes per second the device was seen to deliver: a floor
    /// under the measured ceiling, which a busy device understates.
    delivered: u64,
    buf: Vec<Event>,
    last: Instant,
    interval: Interval,
    /// The traced processes still running.
    alive: HashSet<u32>,
    worker: Worker,
}

impl<'a> Session<'a> {
    fn new(rec: &'a Recorder, opts: &'a Options) -> Result<Self, Error> {
        // Our own insertions are the prefetcher's: trace them too.
        let me = std::process::id();
        rec.track(me)?;
        Ok(Session {
            rec,
            opts,
            me,
            files: HashMap::new(),
            detectors: HashMap::new(),
            ctl: opts
                .static_scale
                .map_or_else(Controller::default, Controller::fixed),
            report: Report::default(),
            ceiling: opts.max_throughput,
            measuring: None,
            random_rate: 0.0,
            now: Instant::now(),
            added: 0,
            interval_start: Instant::now(),
            delivered: 0,
            buf: Vec::new(),
            last: Instant::now(),
            interval: Interval::default(),
            alive: HashSet::new(),
            worker: Worker::start(),
        })
    }

    /// Takes in what the recorder has; prefetches for streams found since
    /// the last poll, and for all of them when an interval ended.
    fn step(&mut self) -> Result<(), Error> {
        self.rec.poll(Duration::from_millis(10), &mut self.buf)?;
        self.now = Instant::now();
        let mut buf = std::mem::take(&mut self.buf);
        for ev in buf.drain(..) {
            self.event(ev);
        }
        self.buf = buf;
        if self.last.elapsed() >= self.opts.interval {
            self.last = Instant::now();
            self.tick();
        } else {
            self.fast_start();
        }
        Ok(())
    }

    /// Files being read that are not streams yet are checked at every poll
    /// (10-20 ms), not at the end of the interval: a file read in less than
    /// the interval would otherwise never be prefetched, and a longer one
    /// would be read for a whole interval unaided. A stream found here gets
    /// its quota ahead of the reader at once.
    fn fast_start(&mut self) {
        let mut found = Vec::new();
        for (&(tgid, dev, ino), t) in &self.detectors {
            if t.d.requested() < FAST_START_PAGES
                || self
                    .files
                    .get(&(dev, ino))
                    .is_some_and(|st| (st.pattern.is_some() && !st.young) || st.unnamed)
            {
                continue;
            }
            if let Some(s) = t.d.peek(self.opts.threshold) {
                found.push((
                    tgid,
                    (dev, ino),
                    s,
                    span(t.since, self.now, self.opts.interval),
                ));
            }
        }
        if found.is_empty() || mem_available() < self.opts.memory_floor {
            return;
        }
        for (tgid, key, s, secs) in found {
            self.prefetch(tgid, key, s, secs, Reach::FromReader);
            if let Some(st) = self.files.get_mut(&key) {
                st.young = true;
            }
        }
    }

    fn event(&mut self, ev: Event) {
        match ev {
            Event::Open { file, .. } | Event::Exec { file, .. } => {
                if let Some(p) = file.path.absolute() {
                    let st = self.files.entry((file.dev, file.ino)).or_default();
                    st.path.get_or_insert(p);
                    st.pages = file.size.div_ceil(PAGE);
                }
            }
            Event::Fork { child_tgid, .. } => {
                self.alive.insert(child_tgid);
            }
            Event::Exit { tgid, .. } => {
                self.alive.remove(&tgid);
            }
            Event::Page {
                kind,
                tgid,
                dev,
                ino,
                index,
                count,
                ..
            } => {
                let ours = tgid == self.me;
                let st = self.files.entry((dev, ino)).or_default();
                let linear = st.pattern.is_some();
                let iv = &mut self.interval;
                if kind == PageKind::Added {
                    self.added += count;
                    for p in index..index + count {
                        // A second insertion means the page left the cache.
                        if !st.inserted.insert(p) {
                            if st.used.contains(p) {
                                if !ours {
                                    st.refaulted += 1;
                                    iv.refaulted += 1;
                                }
                            } else if st.ours.contains(p) {
                                st.evicted_unused += 1;
                                iv.evicted_unused += 1;
                            }
                        }
                        if ours {
                            st.ours.insert(p);
                            st.prefetched += 1;
                            iv.prefetched += 1;
                        } else {
                            st.ours.remove(p);
                            st.app_read.insert(p);
                            iv.linear_missed += linear as u64;
                        }
                    }
                } else if !ours {
                    // A read() reports the pages it asked for, past the end too.
                    let end = if st.pages > 0 {
                        (index + count).min(st.pages)
                    } else {
                        index + count
                    };
                    for p in index..end {
                        if st.used.insert(p) {
                            st.prefetched_used += st.ours.contains(p) as u64;
                            iv.linear_requested += linear as u64;
                        }
                    }
                    let t = self.detectors.entry((tgid, dev, ino)).or_default();
                    t.since.get_or_insert(self.now);
                    t.d.request(index, count);
                }
            }
            _ => {}
        }
    }

    /// The end of a polling interval: feedback, then the next prefetches.
    fn tick(&mut self) {
        let opts = self.opts;
        self.report.intervals += 1;
        self.ctl.update(std::mem::take(&mut self.interval));
        // Streams of this interval, and the application's random traffic.
        let mut streams = Vec::new();
        let mut random = 0.0;
        let now = self.now;
        for (&(tgid, dev, ino), t) in self.detectors.iter_mut() {
            let requested = t.d.requested();
            let secs = span(t.since.take(), now, opts.interval);
            match t.d.end_interval(opts.threshold) {
                Some(s) => {
                    random += s.pages as f64 * (1.0 - s.linear_share) / secs;
                    streams.push((tgid, (dev, ino), s, secs));
                }
                None => random += requested as f64 / secs,
            }
        }
        self.random_rate = random;
        // Name the files read since the last interval (for the report),
        // while the processes that read them are still there to ask.
        if self
            .files
            .values()
            .any(|st| st.path.is_none() && st.used.len() > 0)
        {
            self.resolve_paths();
        }
        for st in self.files.values_mut() {
            st.pattern = None;
            st.unnamed = false;
            st.young = false;
        }
        // The device has delivered at least what was read from it.
        let secs = now.duration_since(self.interval_start).as_secs_f64();
        if secs > 0.0 {
            let seen = (std::mem::take(&mut self.added) * PAGE) as f64 / secs;
            self.delivered = self.delivered.max(seen as u64);
        }
        self.interval_start = now;
        if mem_available() < opts.memory_floor {
            self.report.backed_off += 1;
            return;
        }
        for (tgid, key, s, secs) in streams {
            self.prefetch(tgid, key, s, secs, Reach::FromStop);
        }
    }

    /// Asks for the next pages of stream `s` of file `key`, read by `tgid`
    /// at `s.pages` pages in `secs`: `scale × linear share × rate ×
    /// interval` of them, under the device's throughput minus the
    /// application's random reads (prefetchd §IV-C).
    fn prefetch(&mut self, tgid: u32, key: (u32, u64), s: Stream, secs: f64, reach: Reach) {
        if self.files.get(&key).is_none_or(|st| st.path.is_none()) {
            // The recorder does not trace opens for `stream`: name the
            // file from the reader's /proc entries, once per interval.
            self.alive.insert(tgid);
            self.resolve_paths();
        }
        let st = self.files.entry(key).or_default();
        st.pattern = Some(s.pattern);
        let Some(path) = st.path.clone() else {
            st.unnamed = true;
            return;
        };
        if st.file.is_none() {
            st.file = open(&path, key).map(Arc::new);
            st.chunk =
                warmstart_replay::read_ahead_bytes(Path::new("/sys"), kdev_to_user(key.0 as u64))
                    .map_or(DEFAULT_CHUNK, |b| (b / PAGE).max(1) * PAGE);
            if st.pages == 0 {
                if let Some(f) = &st.file {
                    st.pages = f.metadata().map_or(0, |m| m.len().div_ceil(PAGE));
                }
            }
        }
        let Some(f) = st.file.clone() else { return };
        let budget = self.budget(&path);
        let rate = s.pages as f64 * s.linear_share / secs;
        let pages = (self.ctl.scale * rate).min(budget) * self.opts.interval.as_secs_f64();
        let st = self.files.get_mut(&key).expect("inserted above");
        let runs = detect::window(&s, pages.ceil() as u64, st.pages, reach, |p| {
            st.issued.contains(p)
        });
        for (first, n) in runs {
            for p in first..first + n {
                st.issued.insert(p);
            }
            self.worker.send(Job {
                file: f.clone(),
                first,
                count: n,
                chunk: st.chunk / PAGE,
            });
        }
    }

    /// Pages per second the prefetcher may read: the device's throughput
    /// minus the application's random reads. The throughput is measured
    /// (16 MiB read from `sample`) in the background the first time, so it
    /// never holds up a prefetch; until it is known only the scale limits.
    fn budget(&mut self, sample: &str) -> f64 {
        if self.ceiling.is_none() {
            match &self.measuring {
                None => {
                    let (tx, rx) = mpsc::channel();
                    let sample = sample.to_string();
                    std::thread::spawn(move || {
                        let _ = tx.send(measure_throughput(Path::new(&sample)));
                    });
                    self.measuring = Some(rx);
                }
                Some(rx) => {
                    if let Ok(max) = rx.try_recv() {
                        self.ceiling = Some(max);
                        self.measuring = None;
                    }
                }
            }
        }
        let delivered = self.delivered;
        self.ceiling.map_or(f64::INFINITY, |max| {
            (max.max(delivered) as f64 / PAGE as f64 - self.random_rate).max(0.0)
        })
    }

    /// Names files the application opened before we saw it (attached to a
    /// running process) from the tree's /proc fd and maps entries.
    fn resolve_paths(&mut self) {
        let mut seen = HashSet::new();
        for &pid in &self.alive {
            procscan::files_of(Path::new("/proc"), pid, &mut seen);
        }
        let by_id: HashMap<(u64, u64), String> =
            seen.into_iter().map(|s| ((s.dev, s.ino), s.path)).collect();
        for (&(dev, ino), st) in self.files.iter_mut() {
            if st.path.is_none() {
                st.path = by_id.get(&(kdev_to_user(dev as u64), ino)).cloned();
            }
        }
        // Files not yet seen in events: keep their names for later.
        for ((udev, ino), path) in by_id {
            let key = (user_to_kdev(udev), ino);
            self.files.entry(key).or_default().path.get_or_insert(path);
        }
    }

    fn finish(mut self) -> Report {
        self.worker.stop();
        let mut report = std::mem::take(&mut self.report);
        report.drops = self.rec.drops();
        report.final_scale = self.ctl.scale;
        report.thrashing = self.ctl.thrashed;
        report.max_throughput = self
            .ceiling
            .or_else(|| self.measuring.as_ref().and_then(|rx| rx.try_recv().ok()))
            .unwrap_or(0);
        for ((dev, ino), st) in std::mem::take(&mut self.files) {
            if st.used.len() == 0 {
                continue;
            }
            // A file read and closed between two intervals has no name.
            let path = st.path.unwrap_or_else(|| {
                let d = kdev_to_user(dev as u64);
                format!(
                    "(inode {ino} on device {}:{})",
                    libc::major(d),
                    libc::minor(d)
                )
            });
            let fr = FileReport {
                path,
                pattern: st.pattern.map(|p| format!("{p:?}")),
                used: st.used.len(),
                prefetched: st.prefetched,
                prefetched_used: st.prefetched_used,
                app_read: st.app_read.len(),
                evicted_unused: st.evicted_unused,
                refaulted: st.refaulted,
            };
            report.used += fr.used;
            report.prefetched += fr.prefetched;
            report.prefetched_used += fr.prefetched_used;
            report.app_read += fr.app_read;
            report.evicted_unused += fr.evicted_unused;
            report.refaulted += fr.refaulted;
            report.files.push(fr);
        }
        report.files.sort_by_key(|f| std::cmp::Reverse(f.used));
        let used = report.used.max(1) as f64;
        report.accuracy = report.prefetched_used as f64 / used;
        report.cost = report.prefetched as f64 / used;
        report
    }
}

/// Seconds a rate measured from `since` (the interval's first request; a
/// whole interval if none) to `now` is over.
fn span(since: Option<Instant>, now: Instant, interval: Duration) -> f64 {
    since
        .map_or(interval, |t| now.duration_since(t))
        .max(MIN_RATE_SPAN)
        .as_secs_f64()
}

/// The kernel's dev_t encoding (major << 20 | minor) of a user-space one.
fn user_to_kdev(dev: u64) -> u32 {
    ((libc::major(dev) << 20) | libc::minor(dev)) as u32
}

/// One WILLNEED request, cut into `chunk`-page pieces when issued.
struct Job {
    file: Arc<File>,
    first: u64,
    count: u64,
    chunk: u64,
}

/// The thread that issues prefetches, so a full block-layer queue never
/// stalls the event loop.
struct Worker {
    tx: Option<mpsc::Sender<Job>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    fn start() -> Self {
        let (tx, rx) = mpsc::channel::<Job>();
        let stop = Arc::new(AtomicBool::new(false));
        let halt = stop.clone();
        let thread = std::thread::spawn(move || {
            for job in rx {
                let mut at = job.first;
                let end = job.first + job.count;
                while at < end && !halt.load(Ordering::Relaxed) {
                    let n = job.chunk.max(1).min(end - at);
                    // A failure leaves the pages to the application's reads.
                    let _ = warmstart_sys::fadvise::willneed(&*job.file, at * PAGE, n * PAGE);
                    at += n;
                }
            }
        });
        Worker {
            tx: Some(tx),
            stop,
            thread: Some(thread),
        }
    }

    fn send(&self, job: Job) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(job);
        }
    }

    /// Drops what is queued and waits for the request in flight.
    fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Opens a file the application reads, named from /proc: the path may
/// name another file by now (the application renamed or replaced it, or
/// an unprivileged user swapped in a FIFO or a device), so only the inode
/// `key` (kernel dev, ino) the events are about is opened, and nothing
/// but a regular file.
fn open(path: &str, key: (u32, u64)) -> Option<File> {
    let seen = warmstart_sys::FileIdentity {
        dev: kdev_to_user(key.0 as u64),
        ino: key.1,
        ..Default::default()
    };
    let f = warmstart_sys::OpenOptions::file()
        .expect(seen, warmstart_sys::identity::Match::Inode)
        .noatime(true)
        .open(path)
        .ok()?
        .file;
    // No readahead beyond what we ask; a failure only reads a little more.
    let _ = warmstart_sys::fadvise::random(&f);
    Some(f)
}

fn mem_available() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| warmstart_replay::parse_meminfo(&t).ok())
        .map_or(u64::MAX, |m| m.available)
}

/// Raw read throughput of the device under `sample`: 16 MiB of O_DIRECT
/// reads (prefetchd reads a large uncached file for this).
pub fn measure_throughput(sample: &Path) -> u64 {
    const FALLBACK: u64 = 200 << 20;
    // A path from /proc: a regular file only (see `open`).
    let Ok(f) = warmstart_sys::OpenOptions::file()
        .custom_flags(libc::O_DIRECT)
        .open(sample)
        .map(|o| o.file)
    else {
        return FALLBACK;
    };
    let chunk = 1usize << 20;
    let mut buf = vec![0u8; chunk + 4096];
    let pad = buf.as_ptr().align_offset(4096);
    let t = Instant::now();
    let mut read = 0u64;
    for i in 0..16u64 {
        // SAFETY: the aligned window [pad, pad+chunk) is inside buf.
        let n = unsafe {
            libc::pread(
                f.as_raw_fd(),
                buf.as_mut_ptr().add(pad).cast(),
                chunk,
                (i * chunk as u64) as i64,
            )
        };
        if n <= 0 {
            break;
        }
        read += n as u64;
    }
    let secs = t.elapsed().as_secs_f64();
    if read < (4 << 20) || secs <= 0.0 {
        return FALLBACK;
    }
    (read as f64 / secs) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_and_user_device_numbers_round_trip() {
        for (major, minor) in [(8u32, 1u32), (254, 0), (7, 3), (259, 65_537)] {
            let user = libc::makedev(major, minor);
            assert_eq!(kdev_to_user(user_to_kdev(user) as u64), user);
        }
    }

    #[test]
    fn only_the_inode_seen_is_opened() {
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("data");
        std::fs::write(&p, vec![0u8; 8192]).unwrap();
        let m = std::fs::metadata(&p).unwrap();
        let key = (user_to_kdev(m.dev()), m.ino());
        let path = p.to_str().unwrap();
        assert!(open(path, key).is_some());
        assert!(open(path, (key.0, key.1 + 1)).is_none());
        // Swapped for a FIFO under the same name: not opened, no hang.
        std::fs::remove_file(&p).unwrap();
        let c = std::ffi::CString::new(path).unwrap();
        // SAFETY: a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let fifo = std::fs::metadata(&p).unwrap();
        assert!(open(path, (user_to_kdev(fifo.dev()), fifo.ino())).is_none());
        assert_eq!(measure_throughput(&p), 200 << 20);
    }

    #[test]
    fn this_process_is_alive_and_a_free_pid_is_not() {
        assert!(alive(std::process::id()));
        assert!(!alive(u32::MAX - 1));
    }
}
