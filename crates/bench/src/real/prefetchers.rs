//! The prefetchers measured beside (or ahead of) a launch: a replay
//! started just before it, a replay waited for, and whole-file preloaders;
//! and the sequential read a replay waited for is set against.

use std::io::{Read, Seek};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use warmstart_replay::{Engine, RealBackend};

use super::{replay_options, RealExecutor};
use crate::launch;
use crate::runner::Measurement;
use crate::scenario::Scenario;

impl RealExecutor {
    /// Replays `plan` beside a launch started right after it.
    pub(super) fn concurrent(&mut self, s: Scenario) -> Result<Measurement> {
        let plan = Arc::clone(&self.plans[&s]);
        let backend = RealBackend::new();
        let engine = Engine::new(&backend, replay_options(s))?;
        let cancel = engine.cancel_flag();
        let t0 = Instant::now();
        let (launched, report) = thread::scope(|sc| {
            let h = sc.spawn(|| engine.run(&plan));
            let l = launch::launch(&self.target, t0);
            cancel.store(true, Ordering::Relaxed);
            (l, h.join())
        });
        let launched = launched?;
        let bytes = match report {
            Ok(Ok(r)) => Some(r.bytes_issued()),
            _ => None,
        };
        self.check(s, &launched)?;
        self.warm = true;
        Ok(Measurement {
            time: launched.time,
            exit_code: launched.exit_code,
            prefetched_bytes: bytes,
            ..Default::default()
        })
    }

    /// Replays `plan` until resident; returns the bytes issued. A wait that
    /// ended before everything was resident fails the scenario, naming what
    /// was left: its time would be the timeout's, not the prefetch's, and a
    /// launch after it would start with the timeout already spent.
    pub(super) fn prefetch_and_wait(&self, s: Scenario) -> Result<u64> {
        let mut o = replay_options(s);
        o.wait = Some(self.target.timeout);
        let r = warmstart_replay::replay(&self.plans[&s], &o, &RealBackend::new())?;
        if let Some(w) = r.wait.filter(|w| w.timed_out || w.stalled) {
            bail!(
                "{s}: the prefetch's reads did not all become resident ({} of {} pages; {}): {}",
                w.resident,
                w.pages,
                if w.timed_out {
                    "timed out"
                } else {
                    "no progress"
                },
                r.errors.join("; ")
            );
        }
        Ok(r.bytes_issued())
    }

    /// Reads as many bytes as warmstart's plan holds (data and metadata)
    /// from the testbed's loop device in one stream, 1 MiB requests with
    /// direct I/O, eight in flight, from a place that moves from round to
    /// round; returns the bytes read. What a standalone replay of the plan
    /// could at best take on this device, measured in the same round.
    pub(super) fn read_sequentially(&self) -> Result<u64> {
        use std::os::unix::fs::{FileExt, OpenOptionsExt};
        const CHUNK: usize = 1 << 20;
        const DEPTH: usize = 8;
        let tb = crate::testbed::inner()
            .context("the sequential scenario reads the testbed's loop device: it needs --fs")?;
        let plan = &self.plans[&Scenario::PrefetchOnly];
        let want = plan.data_bytes() + plan.meta_bytes();
        let dev = &tb.info.loop_device;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(dev)
            .with_context(|| format!("opening {dev} for a direct sequential read"))?;
        let size = (&f)
            .seek(std::io::SeekFrom::End(0))
            .with_context(|| format!("finding the size of {dev}"))?;
        let span = size.saturating_sub(want) / CHUNK as u64;
        let start = if span == 0 {
            0
        } else {
            // Not the same place every round: the host may cache what it
            // served last.
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::from(d.subsec_nanos()));
            (nanos % span) * CHUNK as u64
        };
        // Chunk i of the stream goes to reader i % DEPTH: DEPTH requests
        // in flight, as fio's sequential job has (warmstart_testbed::fio).
        let chunks = want.div_ceil(CHUNK as u64);
        let read = |first: u64| -> Result<u64> {
            // Direct I/O wants an aligned buffer.
            let mut raw = vec![0u8; CHUNK + 4096];
            let at = raw.as_ptr().align_offset(4096);
            let buf = &mut raw[at..at + CHUNK];
            let mut n = 0u64;
            for c in (first..chunks).step_by(DEPTH) {
                let len = (want - c * CHUNK as u64).min(CHUNK as u64).div_ceil(4096) * 4096;
                let k = f
                    .read_at(&mut buf[..len as usize], start + c * CHUNK as u64)
                    .with_context(|| format!("reading {dev}"))?;
                if k == 0 {
                    bail!("{dev} ended inside the {want} bytes read from {start}");
                }
                n += k as u64;
            }
            Ok(n)
        };
        std::thread::scope(|sc| {
            let readers: Vec<_> = (0..DEPTH as u64)
                .map(|i| sc.spawn(move || read(i)))
                .collect();
            readers
                .into_iter()
                .map(|h| h.join().expect("a reader thread panicked"))
                .sum::<Result<u64>>()
        })
    }

    pub(super) fn preload_all(&self) -> u64 {
        let mut buf = vec![0u8; 1 << 20];
        let mut n = 0u64;
        for (p, _) in &self.files {
            // A recorded path: never a FIFO or a device (see warmstart_sys).
            let Ok(mut f) = warmstart_sys::open(p).map(|o| o.file) else {
                continue;
            };
            while let Ok(k) = f.read(&mut buf) {
                if k == 0 {
                    break;
                }
                n += k as u64;
            }
        }
        n
    }

    pub(super) fn vmtouch(&self) -> Result<()> {
        let st = std::process::Command::new("vmtouch")
            .arg("-tq")
            .args(self.files.iter().map(|f| &f.0))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .context("running vmtouch")?;
        // vmtouch exits non-zero when one of many files vanished; the rest
        // was still read, which is what a preloader does.
        let _ = st;
        Ok(())
    }
}
