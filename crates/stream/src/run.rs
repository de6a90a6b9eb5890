//! `warmstart stream -- CMD`: the prefetchd loop on warmstart's recorder.
//!
//! Every polling interval (0.5 s, prefetchd's default) the application's
//! page requests since the last one are run through a detector per
//! (process, file); for each recognised stream the prefetcher reads ahead
//! `scale × linear share × pages requested` — the application's measured
//! rate — capped by the device's measured throughput minus the
//! application's own random traffic, with `posix_fadvise(WILLNEED)`. The
//! scale follows the feedback controller. Events say exactly which pages
//! the application still had to read itself, which is what accuracy and
//! cost are computed from.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;
use warmstart_bpf::{Event, PageKind};
use warmstart_record::{Exit, HeldChild, SignalForwarder};

use crate::detect::{self, Detector, MATCH_THRESHOLD};
use crate::feedback::{Controller, Interval};

const PAGE: u64 = 4096;

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
    /// Pages the prefetcher brought in.
    pub prefetched: u64,
    /// Prefetched pages the application then read.
    pub prefetched_used: u64,
    /// Pages the application still had to read from storage itself.
    pub app_read: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub files: Vec<FileReport>,
    pub used: u64,
    pub prefetched: u64,
    pub prefetched_used: u64,
    pub app_read: u64,
    /// (prefetched and used) / used.
    pub accuracy: f64,
    /// prefetched / used.
    pub cost: f64,
    pub final_scale: f64,
    pub max_throughput: u64,
    pub intervals: u64,
    pub drops: u64,
    pub backed_off: u64,
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
}

#[derive(Default)]
struct FileState {
    path: Option<String>,
    file: Option<File>,
    pages: u64,
    used: BTreeSet<u64>,
    prefetched: BTreeSet<u64>,
    app_read: BTreeSet<u64>,
    pattern: Option<detect::Pattern>,
}

/// Runs `argv` with adaptive prefetching; returns its exit and the report.
pub fn run(argv: &[String], opts: &Options) -> Result<(Exit, Report), Error> {
    let held = HeldChild::spawn(argv).map_err(|source| Error::Spawn {
        cmd: argv.join(" "),
        source,
    })?;
    let rec = warmstart_bpf::Recorder::start(warmstart_bpf::Options::default())?;
    rec.track(held.pid())?;
    let signals = SignalForwarder::install().map_err(warmstart_record::Error::from)?;
    let mut running = held.release().map_err(|source| Error::Spawn {
        cmd: argv.join(" "),
        source,
    })?;
    let mut signals = signals;

    let mut files: HashMap<(u32, u64), FileState> = HashMap::new();
    let mut detectors: HashMap<(u32, u32, u64), Detector> = HashMap::new();
    let mut ctl = Controller::default();
    if let Some(fixed) = opts.static_scale {
        ctl.scale = fixed;
        ctl.min = fixed;
        ctl.max = fixed;
    }
    let mut report = Report::default();
    let mut ceiling = opts.max_throughput;
    let mut buf = Vec::new();
    let mut last = Instant::now();
    let mut interval = Interval::default();
    let exit = loop {
        rec.poll(Duration::from_millis(10), &mut buf)?;
        for ev in buf.drain(..) {
            match ev {
                Event::Open { file, .. } | Event::Exec { file, .. } => {
                    if let Some(p) = file.path.absolute() {
                        let st = files.entry((file.dev, file.ino)).or_default();
                        st.path.get_or_insert(p);
                        st.pages = file.size.div_ceil(PAGE);
                    }
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
                    let st = files.entry((dev, ino)).or_default();
                    let linear = st.pattern.is_some();
                    if kind == PageKind::Added {
                        st.app_read.extend(index..index + count);
                        if linear {
                            interval.linear_missed += count;
                        }
                    } else {
                        // A read() reports the pages it asked for, past the end too.
                        let end = if st.pages > 0 {
                            (index + count).min(st.pages)
                        } else {
                            index + count
                        };
                        st.used.extend(index..end);
                        if linear {
                            interval.linear_requested += count;
                        }
                        detectors
                            .entry((tgid, dev, ino))
                            .or_default()
                            .request(index, count);
                    }
                }
                _ => {}
            }
        }
        signals.forward(&running);
        if let Some(e) = running.try_wait().map_err(warmstart_record::Error::from)? {
            break e;
        }
        let elapsed = last.elapsed();
        if elapsed < opts.interval {
            continue;
        }
        last = Instant::now();
        report.intervals += 1;
        ctl.update(interval);
        interval = Interval::default();
        if mem_available() < opts.memory_floor {
            report.backed_off += 1;
            continue;
        }
        // Streams of this interval, and the application's random traffic.
        let mut streams = Vec::new();
        let mut random_pages = 0u64;
        for (&(_, dev, ino), d) in detectors.iter_mut() {
            let requested = d.requested();
            match d.end_interval(opts.threshold) {
                Some(s) => {
                    random_pages += (s.pages as f64 * (1.0 - s.linear_share)) as u64;
                    streams.push(((dev, ino), s));
                }
                None => random_pages += requested,
            }
        }
        for st in files.values_mut() {
            st.pattern = None;
        }
        let secs = elapsed.as_secs_f64();
        for ((dev, ino), s) in streams {
            let st = files.entry((dev, ino)).or_default();
            st.pattern = Some(s.pattern);
            let Some(path) = st.path.clone() else {
                continue;
            };
            if st.file.is_none() {
                st.file = open(&path);
            }
            let Some(f) = &st.file else { continue };
            let max = *ceiling.get_or_insert_with(|| measure_throughput(Path::new(&path)));
            // The application's linear rate, scaled, for the next interval,
            // under the ceiling minus its own random reads (prefetchd §IV-C).
            let rate = s.pages as f64 * s.linear_share / secs;
            let budget = (max as f64 / PAGE as f64 - random_pages as f64 / secs).max(0.0);
            let pages = (ctl.scale * rate).min(budget) * opts.interval.as_secs_f64();
            for (first, n) in detect::window(&s, pages.ceil() as u64, st.pages) {
                // SAFETY: fadvise on a descriptor we own; no memory is passed.
                unsafe {
                    libc::posix_fadvise(
                        f.as_raw_fd(),
                        (first * PAGE) as i64,
                        (n * PAGE) as i64,
                        libc::POSIX_FADV_WILLNEED,
                    )
                };
                let before = st.prefetched.len() as u64;
                st.prefetched
                    .extend((first..first + n).filter(|p| !st.used.contains(p)));
                interval.prefetched += st.prefetched.len() as u64 - before;
            }
        }
    };
    report.drops = rec.drops();
    report.final_scale = ctl.scale;
    report.max_throughput = ceiling.unwrap_or(0);
    for st in files.into_values() {
        if st.used.is_empty() || st.path.is_none() {
            continue;
        }
        let fr = FileReport {
            path: st.path.unwrap_or_default(),
            pattern: st.pattern.map(|p| format!("{p:?}")),
            used: st.used.len() as u64,
            prefetched: st.prefetched.len() as u64,
            prefetched_used: st.prefetched.intersection(&st.used).count() as u64,
            app_read: st.app_read.len() as u64,
        };
        report.used += fr.used;
        report.prefetched += fr.prefetched;
        report.prefetched_used += fr.prefetched_used;
        report.app_read += fr.app_read;
        report.files.push(fr);
    }
    report.files.sort_by_key(|f| std::cmp::Reverse(f.used));
    let used = report.used.max(1) as f64;
    report.accuracy = report.prefetched_used as f64 / used;
    report.cost = report.prefetched as f64 / used;
    Ok((exit, report))
}

fn open(path: &str) -> Option<File> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOATIME)
        .open(path)
        .or_else(|_| File::open(path))
        .ok()?;
    // SAFETY: fadvise on a descriptor we own: no readahead beyond what we ask.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
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
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(sample)
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
