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

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use warmstart_plan::compile::{compile, CompileOptions, DEFAULT_METADATA_SHIFT};
use warmstart_plan::trace::CacheState;
use warmstart_plan::{Plan, Trace};
use warmstart_record::{evict, BackendChoice};
use warmstart_replay::{Engine, Options as ReplayOptions, RealBackend};

use crate::launch::{self, Launched, Ready, Target};
use crate::os;
use crate::runner::{Executor, Learned, Measurement};
use crate::scenario::Scenario;
use crate::wrapped::Wrapped;

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

/// warmstart's plan made over copies of its files: replaying it costs
/// what replaying the real plan does, without warming the application.
struct Shadow {
    /// Private to this run, removed with the shadow.
    dir: tempfile::TempDir,
    plan: Arc<Plan>,
    files: Vec<String>,
}

/// Where `path` lives under `root`.
fn under(root: &Path, path: &str) -> std::path::PathBuf {
    root.join(path.trim_start_matches('/'))
}

/// Copies the files of `plan` into a new directory in `parent` and returns
/// the plan made over the copies: same entries, same order, same sizes.
/// Lookups go to the same names there, where the directories hold only
/// the copies (so they cost a little less than the real ones).
fn make_shadow(plan: &Plan, parent: &Path) -> Result<Shadow> {
    use std::os::unix::fs::PermissionsExt;
    // Only the bench's user may read the copies: some come from
    // directories others cannot read.
    let dir = tempfile::Builder::new()
        .prefix("warmstart-bench-shadow-")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir_in(parent)
        .with_context(|| format!("creating a directory in {}", parent.display()))?;
    let root = dir.path();
    let mut files = Vec::new();
    let mut p = plan.clone();
    for f in &mut p.files {
        let to = under(root, &f.path);
        if let Some(d) = to.parent() {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        // A file that cannot be copied (gone, unreadable) is left out as
        // the real replay leaves it out: its copy's path does not exist.
        if std::fs::copy(&f.path, &to).is_ok() {
            // No set-user-ID or set-group-ID copies.
            let m = std::fs::metadata(&to)?;
            let mode = m.permissions().mode() & 0o777 & !0o022;
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode))?;
            let m = std::fs::metadata(&to)?;
            f.id = warmstart_record::resolve::file_id(&m);
            files.push(to.display().to_string());
        }
        f.path = to.display().to_string();
    }
    for l in &mut p.lookups {
        if l.path.starts_with('/') {
            let to = under(root, &l.path);
            if l.kind == warmstart_plan::trace::NsOpKind::DirRead {
                let _ = std::fs::create_dir_all(&to);
            }
            l.path = to.display().to_string();
        }
    }
    // The copies are written out before they are evicted and replayed.
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    Ok(Shadow {
        dir,
        plan: Arc::new(p),
        files,
    })
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

    /// Makes the launch cold.
    pub fn evict(&mut self) -> Result<()> {
        self.warm = false;
        if self.cfg.evict_files {
            evict::evict_files(self.files.iter().map(|f| f.0.as_str()));
            evict::evict_devices(self.devices.iter().copied());
            Ok(())
        } else if let Some(tb) = crate::testbed::inner() {
            // The page cache and the loop device's own (and, without direct
            // I/O, the image's pages), by the testbed's owner.
            tb.drop_caches()
        } else {
            evict::drop_all_caches().context("dropping caches (needs root; or use --evict-files)")
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

    /// Records one launch; returns the trace and the launch time (exec to
    /// readiness).
    fn record(&self, cache: CacheState) -> Result<(Trace, Launched, Vec<String>)> {
        self.record_split(cache, None)
    }

    /// [`Self::record`], with pages used `split` ns apart kept in separate
    /// extents.
    fn record_split(
        &self,
        cache: CacheState,
        split: Option<u64>,
    ) -> Result<(Trace, Launched, Vec<String>)> {
        let opts = warmstart_record::Options {
            split_extents_ns: split,
            backend: self.cfg.backend,
            // Recording ends when the launch is complete (the probe stops
            // the program if it stays up), not on a pause in its I/O.
            idle: self.target.timeout,
            timeout: self.target.timeout,
            cache,
        };
        let ready = self.target.ready.clone();
        ready.reset();
        let timeout = self.target.timeout;
        let result: Arc<Mutex<Option<(Duration, bool)>>> = Arc::new(Mutex::new(None));
        // An output pattern is watched on a pipe that replaces our stdout
        // and stderr while the recorder forks the command.
        let matched = Arc::new(AtomicBool::new(false));
        let mut pipe_w = None;
        let mut reader = None;
        if let Ready::Output(re) = &ready {
            let (r, w) = os::pipe()?;
            pipe_w = Some(w);
            let (re, m) = (re.clone(), Arc::clone(&matched));
            reader = Some(thread::spawn(move || {
                let mut r = BufReader::new(std::fs::File::from(r));
                let mut line = Vec::new();
                while r.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
                    if re.is_match(&String::from_utf8_lossy(&line)) {
                        m.store(true, Ordering::Relaxed);
                    }
                    line.clear();
                }
            }));
        }
        let mut probe = None;
        let _dir = CwdGuard::enter(self.target.cwd.as_deref())?;
        let _env = EnvGuard::set(&self.target.env);
        let recorded = {
            let show = std::env::var_os("WARMSTART_BENCH_SHOW_OUTPUT").is_some();
            let _quiet = if pipe_w.is_some() || !show {
                Some(os::Silence::new(pipe_w.as_ref())?)
            } else {
                None
            };
            warmstart_record::record(&self.target.argv, &opts, |pid| {
                let t0 = Instant::now();
                let out = Arc::clone(&result);
                let matched = Arc::clone(&matched);
                let pidfd = os::pidfd_open(pid).ok();
                probe = Some(thread::spawn(move || {
                    let deadline = t0 + timeout;
                    let ok = match (&ready, &pidfd) {
                        (Ready::Exit, Some(fd)) => os::wait_readable(fd, deadline),
                        _ => loop {
                            let up = match &ready {
                                Ready::Output(_) => matched.load(Ordering::Relaxed),
                                r => r.poll() == Some(true),
                            };
                            if up {
                                break true;
                            }
                            // Exited without becoming ready: no use waiting
                            // (for output, the last lines may still be on
                            // their way through the pipe).
                            if !matches!(ready, Ready::Output(_))
                                && pidfd
                                    .as_ref()
                                    .is_some_and(|fd| os::wait_readable(fd, Instant::now()))
                            {
                                break false;
                            }
                            if Instant::now() >= deadline {
                                break false;
                            }
                            thread::sleep(ready.interval());
                        },
                    };
                    *out.lock().unwrap_or_else(|e| e.into_inner()) = Some((t0.elapsed(), ok));
                    if !matches!(ready, Ready::Exit) || !ok {
                        os::signal_tree(pid, libc::SIGTERM);
                        thread::sleep(Duration::from_millis(500));
                        os::signal_tree(pid, libc::SIGKILL);
                    }
                }));
            })
            .with_context(|| format!("recording {}", self.target.argv.join(" ")))?
        };
        // Our copy of the write end must go for the reader to see EOF.
        drop(pipe_w);
        if let Some(p) = probe {
            let _ = p.join();
        }
        let trace = recorded.trace.clone();
        if let Some(r) = reader {
            let _ = r.join();
        }
        let fallbacks = recorded.fallbacks.clone();
        let exit = recorded.wait()?;
        let (time, ok) = result
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unwrap_or((Duration::ZERO, false));
        if !ok {
            bail!(
                "{} was not ready ({}) within {:.0}s while recording",
                self.target.name,
                self.target.ready,
                timeout.as_secs_f64()
            );
        }
        let exit_code = matches!(self.target.ready, Ready::Exit).then(|| exit.shell_code());
        Ok((trace, Launched { time, exit_code }, fallbacks))
    }

    /// Replays `plan` beside a launch started right after it.
    fn concurrent(&mut self, s: Scenario) -> Result<Measurement> {
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

    /// Replays `plan` until resident; returns the bytes issued.
    fn prefetch_and_wait(&self, s: Scenario) -> Result<u64> {
        let mut o = replay_options(s);
        o.wait = Some(self.target.timeout);
        let r = warmstart_replay::replay(&self.plans[&s], &o, &RealBackend::new())?;
        Ok(r.bytes_issued())
    }

    fn preload_all(&self) -> u64 {
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

    fn vmtouch(&self) -> Result<()> {
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

impl Executor for RealExecutor {
    fn learn(&mut self) -> Result<Learned> {
        let mut traces = Vec::new();
        let mut notes = Vec::new();
        let mut demand = None;
        // A cold trace needs the files known (or every cache dropped): with
        // --evict-files the as-found launch comes first and names them.
        let order = if self.cfg.evict_files {
            [CacheState::AsFound, CacheState::Cold]
        } else {
            [CacheState::Cold, CacheState::AsFound]
        };
        for cache in order {
            if let Some(p) = &self.target.prepare {
                launch::shell(p, self.target.cwd.as_deref(), "prepare")?;
            }
            if cache == CacheState::Cold {
                self.evict()?;
            }
            let (trace, l, fallbacks) = self.record(cache)?;
            self.check(Scenario::Learning, &l)?;
            for f in fallbacks {
                if !notes.contains(&f) {
                    notes.push(format!("recorder fell back from {f}"));
                }
            }
            if trace.stats.drops > 0 {
                notes.push(format!(
                    "the kernel dropped {} events while recording",
                    trace.stats.drops
                ));
            }
            self.absorb(&trace);
            traces.push(trace);
        }
        if self.cfg.scenarios.contains(&Scenario::Demand) {
            // A launch of its own, warm after the two above, recorded with
            // each page at its own time (a plan's traces place a run of
            // pages at its first page's use). Once more if it still read
            // from storage: a program that stays up past readiness is
            // stopped while it still loads, and its next launch finds
            // pages missing.
            for _ in 0..2 {
                if let Some(p) = &self.target.prepare {
                    launch::shell(p, self.target.cwd.as_deref(), "prepare")?;
                }
                let (trace, l, _) = self.record_split(CacheState::AsFound, Some(0))?;
                self.check(Scenario::Demand, &l)?;
                match crate::demand::Demand::of_warm_trace(&trace, l.time) {
                    Ok(d) => {
                        demand = Some(d);
                        break;
                    }
                    Err(why) => notes.push(format!("demand: no bound from a recording: {why}")),
                }
            }
        }
        self.warm = true;
        // The same FIEMAP lookup as `compile --sorted` and `run`.
        let phys = warmstart_sys::fiemap::PhysicalMap::default();
        let physical = |f: &warmstart_plan::plan::PlanFile, off: u64| phys.physical(&f.path, off);
        let mut plan_bytes = Vec::new();
        let mut plan_entries = Vec::new();
        for s in [
            Scenario::Warmstart,
            Scenario::Fast,
            Scenario::Paralfetch,
            Scenario::Sorted,
        ] {
            let opts = compile_options(s).expect("a strategy");
            let c = compile(&traces, &opts, &physical)
                .with_context(|| format!("compiling the {s} plan"))?;
            if let Some(why) = &c.report.empty {
                notes.push(format!("the {s} plan is empty: {why:?}"));
            }
            plan_bytes.push((s, c.plan.data_bytes() + c.plan.meta_bytes()));
            let count = |f: fn(&warmstart_plan::Entry) -> bool| {
                c.plan.entries.iter().filter(|e| f(e)).count()
            };
            plan_entries.push((
                s,
                count(|e| matches!(e, warmstart_plan::Entry::Data { .. })),
                count(|e| matches!(e, warmstart_plan::Entry::Meta { .. })),
                count(|e| matches!(e, warmstart_plan::Entry::Lookup { .. })),
            ));
            let plan = Arc::new(c.plan);
            if s == Scenario::Warmstart {
                self.plans.insert(Scenario::PrefetchOnly, Arc::clone(&plan));
                if self.cfg.scenarios.contains(&Scenario::Contention) {
                    // On disk, as the originals are (/tmp may be memory).
                    let sh = make_shadow(&plan, Path::new("/var/tmp"))
                        .context("copying the plan's files for the contention scenario")?;
                    let missing = plan.files.len() - sh.files.len();
                    notes.push(format!(
                        "contention: the plan's {} files copied to {}{}",
                        sh.files.len(),
                        sh.dir.path().display(),
                        if missing > 0 {
                            format!(
                                " ({missing} could not be, and are skipped as a replay skips them)"
                            )
                        } else {
                            String::new()
                        }
                    ));
                    self.plans
                        .insert(Scenario::Contention, Arc::clone(&sh.plan));
                    self.shadow = Some(sh);
                }
            }
            self.plans.insert(s, plan);
        }
        if self.cfg.scenarios.contains(&Scenario::Run) {
            notes.push(self.learn_run()?);
        }
        if self.cfg.scenarios.contains(&Scenario::Daemon) {
            notes.push(self.learn_daemon()?);
        }
        let last = traces.last().expect("two traces");
        Ok(Learned {
            traces: traces.len(),
            files: self.files.len(),
            data_bytes: traces.iter().map(|t| t.stats.bytes).max().unwrap_or(0),
            metadata_bytes: traces
                .iter()
                .map(|t| t.stats.metadata_bytes)
                .max()
                .unwrap_or(0),
            backend: last.meta.backend.name().to_string(),
            plan_bytes,
            plan_entries,
            notes,
            demand,
        })
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
                Measurement {
                    time: l.time,
                    exit_code: l.exit_code,
                    prefetched_bytes: self.wrapped()?.run_replay_bytes(),
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
        // Any launch leaves the cache warm; a prefetch alone does not.
        self.warm = s != Scenario::PrefetchOnly;
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

impl RealExecutor {
    fn wrapped(&mut self) -> Result<&mut Wrapped> {
        if self.wrapped.is_none() {
            let bin = self.cfg.warmstart_bin.clone().context(
                "the run and daemon scenarios need the warmstart binary \
                 (not found; set WARMSTART_BENCH_BIN)",
            )?;
            self.wrapped = Some(Wrapped::new(bin)?);
        }
        Ok(self.wrapped.as_mut().expect("set above"))
    }

    /// The wrapper's own learning launches (the first cold, the others as
    /// found), in its private state directory, until its profile has a
    /// plan. Returns a note for the report.
    fn learn_run(&mut self) -> Result<String> {
        let target = self.target.clone();
        let t = self.wrapped()?.run_target(&target);
        for i in 0..4 {
            if let Some(p) = &self.target.prepare {
                launch::shell(p, self.target.cwd.as_deref(), "prepare")?;
            }
            if i == 0 {
                self.evict()?;
            }
            let l = launch::launch(&t, Instant::now()).context("learning through warmstart run")?;
            self.check(Scenario::Run, &l)?;
            self.warm = true;
            if self.wrapped()?.run_prefetching() {
                self.run_learned = true;
                return Ok(format!(
                    "run: `warmstart run` had a plan after {} learning launches",
                    i + 1
                ));
            }
        }
        bail!(
            "warmstart run had no plan for {} after 4 launches",
            self.target.name
        )
    }

    /// The daemon's learning: started with this program allowed, it
    /// records the program's first launches (the first cold) until its
    /// profile has a plan, then is stopped. Returns a note for the report.
    fn learn_daemon(&mut self) -> Result<String> {
        let t = self.target.clone();
        let mut d = self.wrapped()?.start_daemon(&t)?;
        for i in 0..4 {
            if let Some(p) = &self.target.prepare {
                launch::shell(p, self.target.cwd.as_deref(), "prepare")?;
            }
            if i == 0 {
                self.evict()?;
            }
            let l = launch::launch(&t, Instant::now())?;
            self.check(Scenario::Daemon, &l)?;
            self.warm = true;
            let w = self.wrapped()?;
            w.wait_daemon_done(&mut d)
                .context("learning with warmstart daemon")?;
            if w.daemon_prefetching() {
                let note = format!(
                    "daemon: `warmstart daemon` had a plan after {} learning launches (allow = {})",
                    i + 1,
                    w.policy_key.as_deref().unwrap_or("?")
                );
                d.stop()?;
                self.daemon_learned = true;
                return Ok(note);
            }
        }
        let tail = d.log_tail();
        bail!(
            "warmstart daemon had no plan for {} after 4 launches; its stderr:\n{tail}",
            self.target.name
        )
    }

    /// Adds a trace's files and devices to the launch's set.
    fn absorb(&mut self, t: &Trace) {
        for f in &t.files {
            let Some(p) = &f.path else { continue };
            let ranges: Vec<(u64, u64)> = f.extents.iter().map(|e| (e.offset, e.len)).collect();
            match self.files.iter_mut().find(|x| &x.0 == p) {
                Some(x) => {
                    for r in ranges {
                        if !x.1.contains(&r) {
                            x.1.push(r);
                        }
                    }
                }
                None => self.files.push((p.clone(), ranges)),
            }
        }
        for m in &t.metadata {
            if !self.devices.contains(&m.device) {
                self.devices.push(m.device);
            }
        }
    }

    /// The launch's files and ranges (after `learn`).
    pub fn files(&self) -> &[(String, Vec<(u64, u64)>)] {
        &self.files
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

/// Changes the working directory for a recorded launch (the recorder forks
/// with ours) and changes it back.
struct CwdGuard(Option<std::path::PathBuf>);

impl CwdGuard {
    fn enter(dir: Option<&Path>) -> Result<CwdGuard> {
        let Some(d) = dir else {
            return Ok(CwdGuard(None));
        };
        let old = std::env::current_dir()?;
        std::env::set_current_dir(d).with_context(|| format!("entering {}", d.display()))?;
        Ok(CwdGuard(Some(old)))
    }
}

impl Drop for CwdGuard {
    fn drop(&mut self) {
        if let Some(o) = &self.0 {
            let _ = std::env::set_current_dir(o);
        }
    }
}

/// Sets environment variables for a recorded launch and restores them.
struct EnvGuard(Vec<(String, Option<std::ffi::OsString>)>);

impl EnvGuard {
    fn set(vars: &[(String, String)]) -> EnvGuard {
        let mut old = Vec::new();
        for (k, v) in vars {
            old.push((k.clone(), std::env::var_os(k)));
            std::env::set_var(k, v);
        }
        EnvGuard(old)
    }
}

impl Drop for EnvGuard {
    fn drop(&mut self) {
        for (k, v) in &self.0 {
            match v {
                Some(v) => std::env::set_var(k, v),
                None => std::env::remove_var(k),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warmstart_plan::plan::{Lookup, PlanFile, PlanMeta};
    use warmstart_plan::trace::NsOpKind;
    use warmstart_plan::Entry;

    #[test]
    fn shadow_plan_reads_copies_in_the_same_order() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("app");
        std::fs::create_dir_all(src.join("lib")).unwrap();
        let (a, b) = (src.join("bin"), src.join("lib/libx.so"));
        std::fs::write(&a, vec![1u8; 10_000]).unwrap();
        std::fs::write(&b, vec![2u8; 3_000]).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&b, std::fs::Permissions::from_mode(0o4755)).unwrap();
        let file = |p: &Path| PlanFile {
            path: p.display().to_string(),
            id: warmstart_record::resolve::file_id(&std::fs::metadata(p).unwrap()),
        };
        let lookup = |kind, p: &Path| Lookup {
            kind,
            path: p.display().to_string(),
        };
        let plan = Plan {
            meta: PlanMeta {
                command: vec!["bin".into()],
                created_unix_ms: 0,
                traces: 2,
                min_traces: 2,
                passes: Vec::new(),
                sorted: false,
            },
            // The last one is gone by the time the copies are made.
            files: vec![file(&a), file(&b), {
                let gone = src.join("gone");
                std::fs::write(&gone, b"x").unwrap();
                let f = file(&gone);
                std::fs::remove_file(&gone).unwrap();
                f
            }],
            lookups: vec![
                lookup(NsOpKind::DirRead, &src.join("lib")),
                lookup(NsOpKind::Stat, &src.join("missing")),
            ],
            entries: vec![
                Entry::Lookup { index: 0 },
                Entry::Data {
                    file: 1,
                    offset: 0,
                    len: 4096,
                },
                Entry::Lookup { index: 1 },
                Entry::Data {
                    file: 0,
                    offset: 0,
                    len: 8192,
                },
                Entry::Data {
                    file: 2,
                    offset: 0,
                    len: 4096,
                },
            ],
        };
        let sh = make_shadow(&plan, d.path()).unwrap();
        let root = sh.dir.path().to_path_buf();
        assert!(root.starts_with(d.path()));
        // Private, and no set-user-ID copy.
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode();
        assert_eq!(mode(&root) & 0o777, 0o700);
        let p = &sh.plan;
        assert_eq!(mode(Path::new(&p.files[1].path)) & 0o7777, 0o755);
        assert_eq!(p.entries, plan.entries);
        for (orig, copy) in plan.files.iter().zip(&p.files).take(2) {
            assert_eq!(copy.path, under(&root, &orig.path).display().to_string());
            assert_eq!(
                std::fs::read(&copy.path).unwrap(),
                std::fs::read(&orig.path).unwrap()
            );
            // The copy's own identity, so the replay opens it.
            let m = std::fs::metadata(&copy.path).unwrap();
            assert_eq!(copy.id, warmstart_record::resolve::file_id(&m));
            assert_ne!(copy.id.ino, orig.id.ino);
        }
        assert_eq!(sh.files.len(), 2);
        assert!(p
            .lookups
            .iter()
            .all(|l| l.path.starts_with(&*root.to_string_lossy())));
        assert!(Path::new(&p.lookups[0].path).is_dir());
        assert!(!Path::new(&p.lookups[1].path).exists());
        // A replay of the copies reads them, and skips the file that could
        // not be copied, as the real replay skips it.
        assert!(!Path::new(&p.files[2].path).exists());
        let r =
            warmstart_replay::replay(p, &ReplayOptions::default(), &RealBackend::new()).unwrap();
        assert_eq!(r.skipped_files.len(), 1);
        assert_eq!(r.files_opened, 2);
        // The copies go with the shadow; the originals stay.
        drop(sh);
        assert!(!root.exists());
        assert!(a.exists() && b.exists());
    }
}
