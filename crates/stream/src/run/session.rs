//! One prefetching session: the recorder's events in, per (process, file)
//! stream detection and the feedback controller, WILLNEED requests out.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::Path;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use warmstart_bpf::{Event, PageKind, Recorder};
use warmstart_record::procscan;
use warmstart_record::resolve::kdev_to_user;

use super::device::{measure_throughput, mem_available, user_to_kdev};
use super::issue::{open, Job, Worker};
use super::{Error, FileReport, Options, Report, PAGE};
use crate::detect::{self, Detector, Reach, Stream};
use crate::feedback::{Controller, Interval};
use crate::pages::PageSet;

/// Pages a (process, file) not yet prefetched must have requested before
/// it is checked for a stream at every poll instead of every interval.
const FAST_START_PAGES: u64 = 64;
/// The shortest span a request rate is measured over.
const MIN_RATE_SPAN: Duration = Duration::from_millis(10);
/// Request size when the device's read-ahead size is unknown.
const DEFAULT_CHUNK: u64 = 128 << 10;

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
pub(super) struct Session<'a> {
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
    pub(super) alive: HashSet<u32>,
    worker: Worker,
}

impl<'a> Session<'a> {
    pub(super) fn new(rec: &'a Recorder, opts: &'a Options) -> Result<Self, Error> {
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
    pub(super) fn step(&mut self) -> Result<(), Error> {
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
    pub(super) fn resolve_paths(&mut self) {
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

    pub(super) fn finish(mut self) -> Report {
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
