//! CPU and storage activity during one launch, as FAST's Fig. 12 shows it:
//! at each sample, is a CPU running something, is a task waiting for I/O,
//! is the disk serving a request? `/proc/stat`'s `procs_running` and
//! `procs_blocked` and `/proc/diskstats`' in-flight counts are instantaneous
//! (unlike the tick counters, which move in 10 ms steps), so a 2 ms sampler
//! sees what FAST's kernel patch saw at 1 kHz, without a patch.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// One sample.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub t_ms: f64,
    /// Runnable tasks other than the sampler itself.
    pub running: u32,
    /// Tasks blocked on I/O.
    pub blocked: u32,
    /// Requests in flight on the machine's disks.
    pub in_flight: u32,
}

/// One launch's samples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    pub scenario: crate::scenario::Scenario,
    pub launch_ms: f64,
    pub samples: Vec<Sample>,
}

/// `procs_running` and `procs_blocked` from `/proc/stat`.
pub fn parse_stat(text: &str) -> (u32, u32) {
    let get = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    (get("procs_running "), get("procs_blocked "))
}

/// Requests in flight (field 12 of a line: major, minor, name, then the
/// ninth statistic) summed over whole disks (`disks`), partitions being
/// counted in their disk already.
pub fn parse_in_flight(text: &str, disks: &[String]) -> u32 {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 11 && disks.iter().any(|d| d == f[2]))
                .then(|| f[11].parse::<u32>().unwrap_or(0))
        })
        .sum()
}

/// The disks worth watching: `/sys/block` minus RAM-backed and loop devices.
fn disks() -> Vec<String> {
    std::fs::read_dir("/sys/block")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !["loop", "ram", "zram"].iter().any(|p| n.starts_with(p)))
                .collect()
        })
        .unwrap_or_default()
}

/// A sampling thread; [`Sampler::stop`] returns what it saw.
pub struct Sampler {
    /// The instant sample times are relative to.
    pub origin: Instant,
    stop: Arc<AtomicBool>,
    handle: thread::JoinHandle<Vec<Sample>>,
}

impl Sampler {
    pub fn start(interval: Duration) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let origin = Instant::now();
        let handle = thread::spawn(move || {
            let disks = disks();
            let t0 = origin;
            let mut out = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
                let io = std::fs::read_to_string("/proc/diskstats").unwrap_or_default();
                let (running, blocked) = parse_stat(&stat);
                out.push(Sample {
                    t_ms: t0.elapsed().as_secs_f64() * 1e3,
                    running: running.saturating_sub(1),
                    blocked,
                    in_flight: parse_in_flight(&io, &disks),
                });
                thread::sleep(interval);
            }
            out
        });
        Sampler {
            origin,
            stop,
            handle,
        }
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
    fn parses_stat_and_diskstats() {
        let stat = "cpu  1 2 3\nctxt 5\nprocs_running 3\nprocs_blocked 1\n";
        assert_eq!(parse_stat(stat), (3, 1));
        assert_eq!(parse_stat(""), (0, 0));
        let ds = " 254       0 vda 100 0 800 50 10 0 80 5 2 60 55 0 0 0 0\n \
                   254       1 vda1 90 0 700 40 10 0 80 5 2 50 45 0 0 0 0\n \
                     7       0 loop0 1 0 8 0 0 0 0 0 4 0 0\n";
        assert_eq!(parse_in_flight(ds, &["vda".to_string()]), 2);
        assert_eq!(parse_in_flight(ds, &[]), 0);
    }
}
