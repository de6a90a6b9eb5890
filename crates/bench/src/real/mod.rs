//! The real [`Executor`]: learns the launch with the recorder, compiles one
//! plan per strategy from the same traces, and makes each scenario's launch
//! from the cache state it calls for.
//!
//! The peers are reimplemented on warmstart's own recorder and replay
//! engine, so that what differs between them is the strategy and nothing
//! else (the papers compare the same way: Paralfetch ported the GSoC
//! prefetcher and FAST into its own framework, §5.1):
//! - `fast`: FAST's prefetcher is one process issuing the launch sequence
//!   in recorded order beside the application, with no merging, shifting
//!   or lookups: one worker, no passes.
//! - `paralfetch`: pre-scheduling as Paralfetch's Algorithms 1 and 2 —
//!   metadata shift, and range merge of *touching* ranges within its I/O
//!   distance — replayed by threads beside the application.
//! - `sorted`: the GSoC prefetcher and Windows prefetch hold the application
//!   until a prefetch in physical (FIEMAP) order has completed.
//! - `preload-all`: vmtouch-style preloaders read the launch's files whole
//!   before starting it.
//! - `warmstart`: the default compile options, replayed beside the
//!   application, started just before exec.
//!
//! Here: the executor and the launch each scenario makes. How a launch is
//! recorded, learned (with `run`'s and the daemon's own learning), which
//! prefetcher runs beside it, and the `contention` scenario's copies live
//! in a module each.

mod learn;
mod prefetchers;
mod record;
mod shadow;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use warmstart_plan::compile::{CompileOptions, DEFAULT_METADATA_SHIFT};
use warmstart_plan::trace::CacheState;
use warmstart_plan::Plan;
use warmstart_record::{evict, BackendChoice};
use warmstart_replay::Options as ReplayOptions;

use crate::launch::{self, Launched, Target};
use crate::os;
use crate::runner::{Executor, Learned, Measurement};
use crate::scenario::Scenario;
use crate::wrapped::Wrapped;

use shadow::Shadow;

/// How the real executor prepares launches.
#[derive(Debug, Clone)]
pub struct Config {
    /// Make launches cold by evicting only the launch's files (known from
    /// the learned traces) instead of dropping every cache.
    pub evict_files: bool,
    /// Measure residency of the learned launch bytes before each launch.
    pub check_residency: bool,
    /// Keep going when the command exits non-zero.
    pub ignore_failure: bool,
    pub backend: BackendChoice,
    /// The `warmstart` binary, for the `run` and `daemon` scenarios.
    pub warmstart_bin: Option<std::path::PathBuf>,
    /// The scenarios to be measured: `learn` also learns the wrapper's and
    /// the daemon's profiles when `run` or `daemon` is among them.
    pub scenarios: Vec<Scenario>,
}

/// The plan options of each strategy. Public so the docs and tests can
/// show exactly what each peer is.
pub fn compile_options(s: Scenario) -> Option<CompileOptions> {
    let peer = CompileOptions {
        // The peers have no small-launch rule; that rule is ours.
        min_launch_bytes: 0,
        lookups: false,
        // They trace block requests, read-ahead and all.
        unused: true,
        ..CompileOptions::default()
    };
    Some(match s {
        Scenario::Warmstart | Scenario::PrefetchOnly => CompileOptions::default(),
        Scenario::Fast => CompileOptions {
            merge_gap: 0,
            merge_distance: 1,
            metadata_shift: 0,
            ..peer
        },
        Scenario::Paralfetch => CompileOptions {
            merge_gap: 0,
            merge_distance: 8,
            metadata_shift: DEFAULT_METADATA_SHIFT,
            ..peer
        },
        Scenario::Sorted => CompileOptions {
            merge_gap: 0,
            merge_distance: 1,
            metadata_shift: 0,
            sorted: true,
            ..peer
        },
        _ => return None,
    })
}

/// The replay options of each strategy.
pub fn replay_options(s: Scenario) -> ReplayOptions {
    let mut o = ReplayOptions::default();
    if s == Scenario::Fast {
        // FAST's generated prefetcher is a single sequential program.
        o.workers = 1;
        o.queue_depth = 1;
    }
    o
}

pub struct RealExecutor {
    target: Target,
    cfg: Config,
    plans: HashMap<Scenario, Arc<Plan>>,
    /// The launch's files in first-access order, with the ranges it read.
    files: Vec<(String, Vec<(u64, u64)>)>,
    devices: Vec<u64>,
    /// Whether the last thing done was a complete launch, which leaves the
    /// cache warm for the `warm` scenario.
    warm: bool,
    vmtouch: bool,
    /// When the last measured launch started (for the activity timeline).
    pub last_start: Option<Instant>,
    /// State of the `run` and `daemon` scenarios (created when first used).
    wrapped: Option<Wrapped>,
    run_learned: bool,
    daemon_learned: bool,
    /// The `contention` scenario's plan over private copies of the plan's
    /// files, and the directory holding them (removed when done).
    shadow: Option<Shadow>,
}

impl RealExecutor {
    pub fn new(target: Target, cfg: Config) -> RealExecutor {
        RealExecutor {
            target,
            cfg,
            plans: HashMap::new(),
            files: Vec::new(),
            devices: Vec::new(),
            warm: false,
            vmtouch: which("vmtouch"),
            last_start: None,
            wrapped: None,
            run_learned: false,
            daemon_learned: false,
            shadow: None,
        }
    }

    pub fn target(&self) -> &Target {
        &self.target
    }

    /// The state of the `run` and `daemon` scenarios, once either ran.
    pub fn wrapped_state(&self) -> Option<&Wrapped> {
        self.wrapped.as_ref()
    }

    /// Makes the launch cold.
    pub fn evict(&mut self) -> Result<()> {
        self.warm = false;
        if self.cfg.evict_files {
            evict::evict_files(self.files.iter().map(|f| f.0.as_str()));
            evict::evict_devices(self.devices.iter().copied());
            Ok(())
        } else {
            // In a testbed also the loop device's own cache (and, without
            // direct I/O, the image's pages), by the testbed's owner.
            crate::testbed::drop_caches()
        }
    }

    /// Share of the learned bytes resident now.
    pub fn resident(&self) -> f64 {
        let (r, t) = os::residency(&self.files);
        if t == 0 {
            0.0
        } else {
            r as f64 / t as f64
        }
    }

    fn check(&self, s: Scenario, l: &Launched) -> Result<()> {
        if let Some(c) = l.exit_code {
            if c != 0 && !self.cfg.ignore_failure {
                bail!(
                    "{} exited with status {c} in scenario {s} (use --ignore-failure to keep going)",
                    self.target.name
                );
            }
        }
        Ok(())
    }
}

impl Executor for RealExecutor {
    fn learn(&mut self) -> Result<Learned> {
        self.learn_launch()
    }

    fn warmup(&mut self) -> Result<()> {
        if let Some(p) = &self.target.prepare {
            launch::shell(p, self.target.cwd.as_deref(), "prepare")?;
        }
        let l = launch::launch(&self.target, Instant::now())?;
        self.check(Scenario::Warm, &l)?;
        self.warm = true;
        Ok(())
    }

    fn measure(&mut self, s: Scenario) -> Result<Measurement> {
        if matches!(s, Scenario::Warm | Scenario::Contention) && !self.warm {
            // The cache is warm after a complete launch; prefetch-only
            // leaves only the plan's pages.
            self.warmup()?;
        }
        if s == Scenario::Run && !self.run_learned {
            self.learn_run()?;
        }
        if s == Scenario::Daemon && !self.daemon_learned {
            self.learn_daemon()?;
        }
        // The daemon runs only around its own scenario's launches, and its
        // start is outside the timing (before the cache is dropped).
        let mut daemon = if s == Scenario::Daemon {
            let t = self.target.clone();
            Some(self.wrapped()?.start_daemon(&t)?)
        } else {
            None
        };
        if let Some(p) = &self.target.prepare {
            launch::shell(p, self.target.cwd.as_deref(), "prepare")?;
        }
        if s.starts_cold() {
            self.evict()?;
        }
        let resident_before = self.cfg.check_residency.then(|| self.resident());
        let device_before = crate::testbed::inner().and_then(|t| t.device_read_bytes());
        self.last_start = Some(Instant::now());
        let mut m = match s {
            Scenario::Cold | Scenario::Warm => {
                let l = launch::launch(&self.target, Instant::now())?;
                self.check(s, &l)?;
                Measurement {
                    time: l.time,
                    exit_code: l.exit_code,
                    ..Default::default()
                }
            }
            Scenario::PrefetchOnly => {
                let t0 = Instant::now();
                let bytes = self.prefetch_and_wait(s)?;
                Measurement {
                    time: t0.elapsed(),
                    prefetched_bytes: Some(bytes),
                    ..Default::default()
                }
            }
            Scenario::Sequential => {
                let t0 = Instant::now();
                let bytes = self.read_sequentially()?;
                Measurement {
                    time: t0.elapsed(),
                    prefetched_bytes: Some(bytes),
                    ..Default::default()
                }
            }
            Scenario::Sorted => {
                let t0 = Instant::now();
                let bytes = self.prefetch_and_wait(s)?;
                let l = launch::launch(&self.target, t0)?;
                self.check(s, &l)?;
                Measurement {
                    time: l.time,
                    exit_code: l.exit_code,
                    prefetched_bytes: Some(bytes),
                    ..Default::default()
                }
            }
            Scenario::Fast | Scenario::Paralfetch | Scenario::Warmstart => self.concurrent(s)?,
            Scenario::Contention => {
                let sh = self
                    .shadow
                    .as_ref()
                    .context("the contention scenario's copies were not made")?;
                evict::evict_files(sh.files.iter().map(String::as_str));
                self.concurrent(s)?
            }
            Scenario::Run => {
                let target = self.target.clone();
                let t = self.wrapped()?.run_target(&target);
                let l = launch::launch(&t, Instant::now())?;
                self.check(s, &l)?;
                let (prefetched_bytes, wrapper) = self.wrapped()?.run_outcome();
                Measurement {
                    time: l.time,
                    exit_code: l.exit_code,
                    prefetched_bytes,
                    wrapper,
                    ..Default::default()
                }
            }
            Scenario::Daemon => {
                let mut d = daemon.take().expect("started above");
                let l = launch::launch(&self.target, Instant::now())?;
                self.check(s, &l)?;
                let bytes = self.wrapped()?.wait_daemon_done(&mut d)?;
                d.stop()?;
                Measurement {
                    time: l.time,
                    exit_code: l.exit_code,
                    // What the daemon's replay issued (None: it did not
                    // prefetch this launch, e.g. it was learning).
                    prefetched_bytes: bytes,
                    ..Default::default()
                }
            }
            Scenario::PreloadAll | Scenario::Vmtouch => {
                let t0 = Instant::now();
                let bytes = if s == Scenario::Vmtouch {
                    if !self.vmtouch {
                        bail!("vmtouch is not installed (apt-get install vmtouch)");
                    }
                    self.vmtouch()?;
                    None
                } else {
                    Some(self.preload_all())
                };
                let l = launch::launch(&self.target, t0)?;
                self.check(s, &l)?;
                Measurement {
                    time: l.time,
                    exit_code: l.exit_code,
                    prefetched_bytes: bytes,
                    ..Default::default()
                }
            }
            Scenario::Learning => {
                let (_, l, _) = self.record(CacheState::Cold)?;
                self.check(s, &l)?;
                Measurement {
                    time: l.time,
                    exit_code: l.exit_code,
                    ..Default::default()
                }
            }
            Scenario::Bound | Scenario::Demand => bail!("{s} is computed, not launched"),
        };
        // Any launch leaves the cache warm; a prefetch alone does not, nor
        // does a read that bypasses the cache.
        self.warm = !matches!(s, Scenario::PrefetchOnly | Scenario::Sequential);
        m.resident_before = resident_before;
        m.device_read_bytes = device_before.and_then(|b| {
            let after = crate::testbed::inner()?.device_read_bytes()?;
            Some(after.saturating_sub(b))
        });
        Ok(m)
    }

    fn cleanup(&mut self) -> Result<()> {
        if let Some(c) = &self.target.cleanup {
            launch::shell(c, self.target.cwd.as_deref(), "cleanup")?;
        }
        Ok(())
    }
}

/// Whether `cmd` is on PATH.
pub fn which(cmd: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p).any(|d| {
            let f = d.join(cmd);
            f.is_file()
        })
    })
}
