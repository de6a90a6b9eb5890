//! What a usage run samples: the page cache (`Cached:` of
//! `/proc/meminfo`), what the daemon's preloads hold against their budget
//! (its status, over its socket), and the bytes read from storage
//! (`/proc/diskstats`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// One sample, taken every second of a boot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub mode: String,
    /// 1-based.
    pub boot: usize,
    /// Seconds since the mode's first boot began.
    pub t_s: f64,
    /// `Cached:` of /proc/meminfo.
    pub cached_bytes: u64,
    /// The daemon's preloads: memory held and the budget (modes with the
    /// daemon, when it answered).
    pub held_bytes: Option<u64>,
    pub budget_bytes: Option<u64>,
    /// Its preloader's state (`idle`, `preloading`, ...).
    pub preload_state: Option<String>,
    /// Preloads started since the daemon started.
    pub preloads: Option<u64>,
}

/// `Cached:` of a /proc/meminfo text, in bytes.
pub fn parse_cached(meminfo: &str) -> Option<u64> {
    meminfo
        .lines()
        .find(|l| l.starts_with("Cached:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

/// Bytes read (sectors read, the 6th field, times 512) of the devices
/// named `disks` in a /proc/diskstats text.
pub fn parse_read_bytes(diskstats: &str, disks: &[String]) -> u64 {
    diskstats
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 5 && disks.iter().any(|d| d == f[2]))
                .then(|| f[5].parse::<u64>().unwrap_or(0) * 512)
        })
        .sum()
}

/// The disks whose reads count: the one holding `/` when diskstats knows
/// it, else every disk but RAM-backed and loop devices.
pub fn read_disks(root_device: &str) -> Vec<String> {
    let stats = std::fs::read_to_string("/proc/diskstats").unwrap_or_default();
    let known = |d: &str| {
        stats
            .lines()
            .any(|l| l.split_whitespace().nth(2) == Some(d))
    };
    if !root_device.is_empty() && known(root_device) {
        return vec![root_device.to_string()];
    }
    std::fs::read_dir("/sys/block")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !["loop", "ram", "zram"].iter().any(|p| n.starts_with(p)))
                .collect()
        })
        .unwrap_or_default()
}

/// Bytes read from `disks` so far.
pub fn read_bytes(disks: &[String]) -> u64 {
    parse_read_bytes(
        &std::fs::read_to_string("/proc/diskstats").unwrap_or_default(),
        disks,
    )
}

/// A thread taking a [`Sample`] every second until stopped.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    handle: thread::JoinHandle<Vec<Sample>>,
}

impl Sampler {
    /// Samples boot `boot` of `mode`, times relative to `origin`, the
    /// daemon's preloads through `socket` when there is one.
    pub fn start(mode: &str, boot: usize, origin: Instant, socket: Option<PathBuf>) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let mode = mode.to_string();
        let handle = thread::spawn(move || {
            let mut out = Vec::new();
            let mut next = Instant::now();
            while !s.load(Ordering::Relaxed) {
                let cached = std::fs::read_to_string("/proc/meminfo")
                    .ok()
                    .and_then(|m| parse_cached(&m))
                    .unwrap_or(0);
                let st = socket
                    .as_deref()
                    .and_then(warmstart_launch::daemon::query)
                    .map(|d| d.foresight);
                out.push(Sample {
                    mode: mode.clone(),
                    boot,
                    t_s: origin.elapsed().as_secs_f64(),
                    cached_bytes: cached,
                    held_bytes: st.as_ref().map(|f| f.held_bytes),
                    budget_bytes: st.as_ref().map(|f| f.budget_bytes),
                    preload_state: st.as_ref().map(|f| f.preload_state.clone()),
                    preloads: st.as_ref().map(|f| f.preloads),
                });
                next += Duration::from_secs(1);
                // Short sleeps, so that stopping does not wait a second.
                while !s.load(Ordering::Relaxed) && Instant::now() < next {
                    thread::sleep(Duration::from_millis(20));
                }
            }
            out
        });
        Sampler { stop, handle }
    }

    pub fn stop(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_meminfo_and_diskstats() {
        let m = "MemTotal:       24684084 kB\nBuffers:           1 kB\nCached:          1000 kB\nSwapCached: 5 kB\n";
        assert_eq!(parse_cached(m), Some(1_024_000));
        assert_eq!(parse_cached("MemTotal: 1 kB\n"), None);
        let d = "   7       0 loop0 1737256 133138 118718803 5129895 291122\n \
                 254       0 vda 4001245 1961861 731198513 2707410 698697\n \
                 254       1 vda1 4000000 1961861 731000000 2707410 698697\n";
        assert_eq!(parse_read_bytes(d, &["vda".into()]), 731_198_513 * 512);
        assert_eq!(
            parse_read_bytes(d, &["vda".into(), "loop0".into()]),
            (731_198_513 + 118_718_803) * 512
        );
        assert_eq!(parse_read_bytes(d, &["sda".into()]), 0);
    }

    #[test]
    fn samples_every_second_until_stopped() {
        let s = Sampler::start("none", 1, Instant::now(), None);
        thread::sleep(Duration::from_millis(1100));
        let t = Instant::now();
        let samples = s.stop();
        assert!(t.elapsed() < Duration::from_millis(500), "stopping waited");
        assert_eq!(samples.len(), 2, "{samples:?}");
        assert!(samples
            .iter()
            .all(|x| x.cached_bytes > 0 && x.held_bytes.is_none()));
        assert!(samples[1].t_s >= 1.0);
    }
}

/// Prefetchers running on the machine that the bench did not start (a
/// `warmstart daemon`, Debian's `preload`, with their pids): they would
/// warm the `none` mode's launches and every other mode's, so a run with
/// one of them is no measurement.
pub fn foreign_prefetchers(proc: &std::path::Path) -> Vec<(u32, String)> {
    let Ok(dir) = std::fs::read_dir(proc) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let argv: Vec<String> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if is_prefetcher(&argv) {
            found.push((pid, argv.join(" ")));
        }
    }
    found.sort();
    found
}

/// `warmstart daemon …` (or its core's) or `preload …`, by the
/// program's base name.
fn is_prefetcher(argv: &[String]) -> bool {
    let base = |a: &String| {
        std::path::Path::new(a)
            .file_name()
            .map(|b| b.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    match argv.first().map(base).as_deref() {
        Some("preload") => true,
        Some("warmstart" | "warmstart-core") => argv
            .iter()
            .skip(1)
            .find(|a| !a.starts_with('-'))
            .is_some_and(|a| a == "daemon"),
        _ => false,
    }
}

#[cfg(test)]
mod prefetcher_tests {
    use super::*;

    fn v(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn prefetchers_are_told_by_program_and_command() {
        assert!(is_prefetcher(&v(&["/usr/sbin/preload", "--foreground"])));
        assert!(is_prefetcher(&v(&["/usr/bin/warmstart", "daemon"])));
        assert!(is_prefetcher(&v(&[
            "/usr/lib/warmstart/warmstart-core",
            "daemon"
        ])));
        assert!(is_prefetcher(&v(&[
            "warmstart",
            "--quiet",
            "daemon",
            "--config",
            "x"
        ])));
        assert!(!is_prefetcher(&v(&["/usr/bin/warmstart", "status"])));
        assert!(!is_prefetcher(&v(&[
            "/usr/bin/warmstart",
            "run",
            "--",
            "daemon"
        ])));
        assert!(!is_prefetcher(&v(&["/usr/bin/vim", "preload"])));
        assert!(!is_prefetcher(&[]));
    }

    #[test]
    fn a_running_daemon_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("4242");
        std::fs::create_dir(&p).unwrap();
        std::fs::write(p.join("cmdline"), b"/usr/bin/warmstart\0daemon\0").unwrap();
        let q = dir.path().join("17");
        std::fs::create_dir(&q).unwrap();
        std::fs::write(q.join("cmdline"), b"bash\0").unwrap();
        std::fs::create_dir(dir.path().join("self")).unwrap();
        assert_eq!(
            foreign_prefetchers(dir.path()),
            vec![(4242, "/usr/bin/warmstart daemon".to_string())]
        );
    }
}
