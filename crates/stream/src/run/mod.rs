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
//!
//! Here: the command or process followed, and the report. The loop over
//! the recorder's events is [`session`]; issuing the requests is
//! [`issue`]; the device's limits are [`device`].

mod device;
mod issue;
mod session;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::Serialize;
use warmstart_bpf::Recorder;
use warmstart_record::{procscan, Exit, HeldChild, SignalForwarder};

use crate::detect::MATCH_THRESHOLD;
use session::Session;

pub use device::measure_throughput;

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
        return Err(warmstart_bpf::Error::permission().into());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_free_pid_is_not() {
        assert!(alive(std::process::id()));
        assert!(!alive(u32::MAX - 1));
    }
}
