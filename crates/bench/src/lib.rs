//! `warmstart bench`: launch times measured the way FAST (§6.1) and
//! Paralfetch (§5) measure them, with the peers' strategies side by side.
//!
//! For each program: learn the launch (two recordings, one cold and one as
//! found), compile one plan per strategy from those same traces, then run
//! every scenario once per round, rounds interleaved, each launch from the
//! cache state its scenario calls for. Results are medians and min…max,
//! normalised to cold, with the share of the cold–warm gap each strategy
//! captured; every run can be exported (JSON, CSV) and plotted (SVG).
//!
//! Modules: [`scenario`] (what is measured), [`runner`] (the loop, behind
//! an [`runner::Executor`] so statistics are tested with a mock),
//! [`real`] (launching for real), [`launch`] (readiness), [`stats`],
//! [`export`], [`markdown`], [`report`], [`plot`], [`suite`], [`timeline`], [`machine`],
//! [`os`] (residency, process trees); [`usage`] (`warmstart bench usage`:
//! a usage log replayed across simulated boots).

pub mod demand;
pub mod export;
pub mod launch;
pub mod machine;
pub mod markdown;
pub mod os;
pub mod plot;
pub mod real;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod stats;
pub mod suite;
pub mod testbed;
pub mod timeline;
pub mod usage;
pub mod window;
pub mod wrapped;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::export::{ProgramResult, Results, Settings};
use crate::launch::{Ready, Target};
use crate::real::{Config, RealExecutor};
use crate::runner::{Executor, Progress};
use crate::scenario::Scenario;
use crate::timeline::{Sampler, Timeline};

/// `--help` examples, for the CLI's `after_help`.
pub const EXAMPLES: &str = "EXAMPLES:
  warmstart bench -- /usr/bin/python3 -c 'import scipy.optimize'
  warmstart bench --runs 10 --export-json py.json -- python3 -c 'import numpy'
  warmstart bench --scenarios cold,warm,warmstart --evict-files -- gimp -i -b '(gimp-quit 0)'
  warmstart bench --ready 'output:Listening on' -- node server.js
  warmstart bench --ready port:8080 --prepare 'rm -rf /tmp/cache' -- ./server
  warmstart bench --suite bench/suite.toml --plot out/ --export-markdown results.md
  warmstart bench --scenarios cold,warm,prefetch-only,demand,contention,run -- npm -v
  warmstart bench --fs xfs --storage sd --suite bench/suite.toml --only python-scipy
  warmstart bench --testbed-cleanup
  warmstart bench usage --suite bench/suite.toml   # a usage log across simulated boots

Scenarios (FAST §6.1.2, Paralfetch §5), run interleaved round after round:
  cold           the launch's files evicted first (the baseline)
  warm           everything cached by the previous launch
  prefetch-only  warmstart's plan replayed alone until resident (t_SSD)
  bound          max(warm, prefetch-only) per round (FAST's t_bound)
  demand         warm + the longest the launch waits for its data if a free
                 prefetcher read it in use order at the prefetch-only rate
                 (from a warm launch recorded at learning): the best a launch-time
                 one can do
  contention     warm, beside a replay of the plan over private copies of its
                 files (in /var/tmp while it runs): what the replay itself costs
  sorted         app held until a physically sorted prefetch completes (GSoC)
  fast           recorded order, one thread, beside the app (FAST)
  paralfetch     metadata shift + range merge, threaded, beside the app
  preload-all    the launch's files read whole, then the app (vmtouch-style)
  vmtouch        the real `vmtouch -t` on those files, then the app
  warmstart      warmstart's default plan, replayed beside the app (in-process)
  run            the real `warmstart run` wrapper (learned on its own launches)
  daemon         `warmstart daemon` running (it learned the program), no wrapper
  learning       a cold launch while recording it (the cost of learning)
Gap captured = (t_cold - t) / (t_cold - t_warm): 100% is as fast as warm.
run and daemon launch the warmstart binary: WARMSTART_BENCH_BIN (`warmstart bench`
sets it to itself), else the one beside warmstart-bench, else the one on PATH;
daemon needs root and runs only around its own launches.
With --fs every scenario runs inside the testbed: the harness re-runs itself
chrooted over the image (the program, the recorder, the replays, run and the
daemon see the same paths); the report names the testbed and, with --storage,
the device model's fio figures; each run's reads from the loop device are in
the JSON and CSV exports (device_read_bytes).";

/// Measure launch times: cold, warm, the peers' prefetchers and warmstart's.
#[derive(clap::Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct BenchArgs {
    /// Timed rounds; each round runs every scenario once.
    #[arg(short, long, default_value_t = 5, value_name = "N")]
    pub runs: usize,
    /// Untimed launches before the first round (after learning).
    #[arg(short, long, default_value_t = 1, value_name = "N")]
    pub warmup: usize,
    /// Scenarios to run, comma-separated [default: all; vmtouch if
    /// installed; daemon as root].
    #[arg(short, long, value_enum, value_delimiter = ',')]
    pub scenarios: Vec<Scenario>,
    /// Make launches cold by evicting only the launch's own files (learned
    /// by recording) instead of dropping the whole page cache.
    #[arg(long)]
    pub evict_files: bool,
    /// When a launch is complete: exit, output:REGEX (a stdout/stderr line),
    /// file:PATH (appears), port:[HOST:]PORT (accepts), window:NAME (an X11
    /// window mapped on $DISPLAY whose name matches the case-insensitive
    /// regex NAME), idle:SECONDS (no reads for that long: complete at the
    /// last read).
    #[arg(long, default_value = "exit", value_name = "PROBE")]
    pub ready: Ready,
    /// Shell command run before every launch (outside the timing).
    #[arg(long, value_name = "CMD")]
    pub prepare: Option<String>,
    /// Shell command run after the last launch.
    #[arg(long, value_name = "CMD")]
    pub cleanup: Option<String>,
    /// Give up on a launch that is not complete after this many seconds.
    #[arg(long, default_value_t = 120.0, value_name = "S")]
    pub timeout: f64,
    /// Keep going when the command exits non-zero.
    #[arg(short = 'i', long)]
    pub ignore_failure: bool,
    /// Check, before each launch, how much of the launch's data is cached
    /// (opening the files warms their metadata, so off by default).
    #[arg(long)]
    pub check_residency: bool,
    /// Name of the program in the results [default: the command's name].
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Run every program of a suite file instead of one command.
    #[arg(long, value_name = "FILE", conflicts_with = "command")]
    pub suite: Option<PathBuf>,
    /// With --suite: only these programs (comma-separated names).
    #[arg(long, value_delimiter = ',', value_name = "NAMES", requires = "suite")]
    pub only: Vec<String>,
    /// With --suite: do not install missing Debian packages.
    #[arg(long, requires = "suite")]
    pub no_install: bool,
    /// Write every run and the summaries as JSON.
    #[arg(long, value_name = "FILE")]
    pub export_json: Option<PathBuf>,
    /// Write every run as CSV (`run` rows add the wrapper's own costs:
    /// before the replay, held, after the exit, in ms).
    #[arg(long, value_name = "FILE")]
    pub export_csv: Option<PathBuf>,
    /// Write the results as Markdown: the machine and method, then a table
    /// of each program's medians and gap captured, and their mean.
    #[arg(long, value_name = "FILE")]
    pub export_markdown: Option<PathBuf>,
    /// Write SVG figures (launch times normalised to cold; CPU/storage
    /// activity of one cold, warm and warmstart launch) into DIR.
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    /// Run every scenario in a storage testbed: the program's files on a
    /// filesystem of this type (ext4, xfs, btrfs) in an image on a
    /// direct-I/O loop device, the program chrooted over it; cold drops the
    /// page cache and the loop device's. Built once, reused while valid.
    #[arg(long, value_name = "FS", value_parser = testbed::parse_fs)]
    pub fs: Option<warmstart_testbed::Fs>,
    /// With --fs: put a slow-device model under the image (sd, cloud,
    /// sata-ssd, hdd); its fio figures are printed with the results.
    #[arg(long, value_name = "PROFILE", requires = "fs", value_parser = testbed::parse_profile)]
    pub storage: Option<warmstart_testbed::Profile>,
    /// Where testbed images are kept [default: /var/cache/warmstart-bench].
    #[arg(long, value_name = "DIR")]
    pub testbed_cache: Option<PathBuf>,
    /// With --fs: copy these host paths into the image instead of the
    /// system's (/usr, /etc, /bin, /sbin, /lib*, the font cache);
    /// comma-separated.
    #[arg(long, value_delimiter = ',', value_name = "PATHS", requires = "fs")]
    pub testbed_content: Vec<PathBuf>,
    /// Remove the testbed images and whatever an interrupted run left
    /// (mounts, loop devices), then exit.
    #[arg(long, conflicts_with_all = ["fs", "suite", "command"])]
    pub testbed_cleanup: bool,
    /// The command and its arguments.
    #[arg(
        last = true,
        value_name = "CMD",
        required_unless_present_any = ["suite", "testbed_cleanup"]
    )]
    pub command: Vec<String>,
}

impl BenchArgs {
    fn scenarios(&self) -> Vec<Scenario> {
        if !self.scenarios.is_empty() {
            let mut s = self.scenarios.clone();
            s.sort();
            s.dedup();
            return s;
        }
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let bin = wrapped::warmstart_binary().is_some();
        Scenario::ALL
            .into_iter()
            .filter(|s| *s != Scenario::Vmtouch || real::which("vmtouch"))
            .filter(|s| !s.uses_binary() || bin)
            .filter(|s| *s != Scenario::Daemon || root)
            .filter(|s| *s != Scenario::Sequential || testbed::inner().is_some())
            .collect()
    }
}

/// Runs the benchmark; returns the process exit code.
pub fn run(args: BenchArgs, quiet: bool) -> Result<i32> {
    if args.testbed_cleanup {
        let dir = args
            .testbed_cache
            .clone()
            .unwrap_or_else(|| PathBuf::from(warmstart_testbed::DEFAULT_CACHE_DIR));
        return testbed::cleanup(&dir, quiet);
    }
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    if args.testbed_cache.is_some() && args.fs.is_none() {
        bail!("--testbed-cache goes with --fs or --testbed-cleanup");
    }
    if let Some(fs) = args.fs {
        // The suite's packages go onto the host first, so the image
        // (checked against the host's trees) has them.
        if let Some(path) = &args.suite {
            install_suite_packages(path, &args.only, !args.no_install, quiet)?;
        }
        return testbed::run(&args, fs, quiet);
    }
    let scenarios = args.scenarios();
    if scenarios.contains(&Scenario::Vmtouch) && !real::which("vmtouch") {
        bail!("the vmtouch scenario needs vmtouch (apt-get install vmtouch)");
    }
    if scenarios.contains(&Scenario::Sequential) && testbed::inner().is_none() {
        bail!("the sequential scenario reads a testbed's loop device: use it with --fs");
    }
    let warmstart_bin = wrapped::warmstart_binary();
    if scenarios.iter().any(|s| s.uses_binary()) {
        match &warmstart_bin {
            Some(b) if !b.is_file() => {
                bail!(
                    "the run and daemon scenarios launch {}, which does not exist",
                    b.display()
                )
            }
            None => bail!(
                "the run and daemon scenarios need the warmstart binary: not found beside {} \
                 nor on PATH (set WARMSTART_BENCH_BIN)",
                std::env::current_exe().map_or("?".into(), |e| e.display().to_string())
            ),
            _ => {}
        }
    } else if args.scenarios.is_empty() && !quiet {
        eprintln!("warmstart: the warmstart binary was not found: leaving out run and daemon");
    }
    // SAFETY: geteuid has no preconditions.
    if scenarios.contains(&Scenario::Daemon) && unsafe { libc::geteuid() } != 0 {
        bail!("the daemon scenario needs root (warmstart daemon loads the eBPF recorder)");
    }
    if !args.evict_files && !Path::new("/proc/sys/vm/drop_caches").exists() {
        bail!("cannot drop caches here; use --evict-files");
    }
    // SAFETY: geteuid has no preconditions.
    if !args.evict_files && unsafe { libc::geteuid() } != 0 {
        bail!("dropping the page cache needs root; run as root or use --evict-files");
    }
    let timeout = Duration::from_secs_f64(args.timeout);
    // Whether each target needs an X server (started just for it).
    let mut x11 = Vec::new();
    let mut targets = Vec::new();
    if let Some(path) = &args.suite {
        let suite = suite::Suite::load(path)?;
        let dir = path
            .canonicalize()
            .with_context(|| format!("resolving {}", path.display()))?
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        let programs: Vec<_> = suite
            .programs
            .iter()
            .filter(|p| args.only.is_empty() || args.only.contains(&p.name))
            .collect();
        if programs.is_empty() {
            bail!("no program of {} matches --only", path.display());
        }
        // In a testbed the outer harness installed them on the host before
        // the image was checked (the image has no dpkg database to ask).
        if testbed::inner().is_none() {
            install_packages(&programs, !args.no_install, quiet)?;
        }
        for p in programs {
            let mut t = p.target(&dir, timeout);
            if let Some(x) = &args.prepare {
                t.prepare.get_or_insert_with(|| x.clone());
            }
            x11.push(p.x11);
            targets.push(t);
        }
    } else {
        let name = args.name.clone().unwrap_or_else(|| {
            Path::new(&args.command[0])
                .file_name()
                .map_or_else(|| args.command[0].clone(), |n| n.to_string_lossy().into())
        });
        targets.push(Target {
            name,
            argv: args.command.clone(),
            cwd: None,
            env: Vec::new(),
            ready: args.ready.clone(),
            prepare: args.prepare.clone(),
            cleanup: args.cleanup.clone(),
            timeout,
        });
    }

    let cfg = Config {
        evict_files: args.evict_files,
        check_residency: args.check_residency,
        ignore_failure: args.ignore_failure,
        backend: warmstart_record::BackendChoice::Auto,
        warmstart_bin,
        scenarios: scenarios.clone(),
    };
    let per_round = runner::launches_per_round(&scenarios);
    // Learning: two recordings, plus the wrapper's and the daemon's own.
    let learning = 2 + 2 * scenarios.iter().filter(|s| s.uses_binary()).count();
    let total = (targets.len() * (args.runs * per_round + learning + args.warmup)) as u64;
    let bar = if quiet || !std::io::stderr().is_terminal() {
        ProgressBar::hidden()
    } else {
        let b = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        b.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b
    };
    let machine = machine::Machine::probe();
    let mut results = Results {
        testbed: testbed::inner().map(|t| t.info.clone()),
        machine,
        settings: Settings {
            rounds: args.runs,
            warmup: args.warmup,
            cold_by: if args.evict_files {
                "evict-files"
            } else {
                "drop-caches"
            }
            .into(),
            scenarios: scenarios.iter().map(|s| s.name().to_string()).collect(),
        },
        programs: Vec::new(),
    };
    let mut failed = Vec::new();
    for (i, mut t) in targets.into_iter().enumerate() {
        // A private X server per GUI program, up only while it is measured.
        let xvfb = if x11.get(i).copied().unwrap_or(false) {
            match suite::Xvfb::start() {
                Ok(x) => {
                    t.env.push(("DISPLAY".into(), x.display.clone()));
                    Some(x)
                }
                Err(e) => {
                    bar.suspend(|| eprintln!("warmstart: {}: {e:#}", t.name));
                    failed.push(t.name.clone());
                    continue;
                }
            }
        } else {
            None
        };
        let mut exec = RealExecutor::new(t.clone(), cfg.clone());
        let mut prog = BarProgress {
            bar: &bar,
            name: t.name.clone(),
            learning: learning as u64,
        };
        let outcome = runner::run_program(
            &t.name,
            &mut exec,
            &scenarios,
            args.runs,
            args.warmup,
            &mut prog,
        );
        let (learned, runs) = match outcome {
            Ok(x) => x,
            Err(e) if args.suite.is_some() => {
                // One broken program must not lose the others' results.
                bar.suspend(|| eprintln!("warmstart: {}: {e:#}", t.name));
                failed.push(t.name.clone());
                continue;
            }
            Err(e) => {
                bar.finish_and_clear();
                return Err(e.context(format!("benchmarking {}", t.name)));
            }
        };
        let timelines = if args.plot.is_some() {
            bar.set_message(format!("{}: activity timelines", t.name));
            timelines(&mut exec, &scenarios).unwrap_or_else(|e| {
                bar.suspend(|| eprintln!("warmstart: {}: no timeline: {e:#}", t.name));
                Vec::new()
            })
        } else {
            Vec::new()
        };
        drop(xvfb);
        let summary = runner::summarize(&runs);
        if !quiet && !std::io::stderr().is_terminal() {
            eprintln!("warmstart: {} done ({} runs)", t.name, runs.len());
        }
        results.programs.push(ProgramResult {
            name: t.name.clone(),
            command: t.argv.clone(),
            ready: t.ready.to_string(),
            learned,
            summary,
            runs,
            timelines,
        });
    }
    bar.finish_and_clear();

    print!("{}", report::render(&results));
    for w in report::outlier_warnings(&results) {
        eprintln!("warmstart: warning: {w}");
    }
    for l in report::losses(&results) {
        eprintln!("warmstart: note: {l}");
    }
    if let Some(p) = &args.export_json {
        export::write_file(p, |b| export::write_json(&results, b))?;
    }
    if let Some(p) = &args.export_csv {
        export::write_file(p, |b| export::write_csv(&results, b))?;
    }
    if let Some(p) = &args.export_markdown {
        export::write_file(p, |b| {
            b.extend_from_slice(markdown::render(&results).as_bytes());
            Ok(())
        })?;
    }
    if let Some(dir) = &args.plot {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for f in plot::write_all(&results, dir)? {
            if !quiet {
                eprintln!("warmstart: wrote {}", f.display());
            }
        }
    }
    if !failed.is_empty() {
        eprintln!("warmstart: failed: {}", failed.join(", "));
        return Ok(1);
    }
    Ok(0)
}

/// Installs the Debian packages the suite's programs (those `only` names)
/// need.
fn install_suite_packages(path: &Path, only: &[String], install: bool, quiet: bool) -> Result<()> {
    let suite = suite::Suite::load(path)?;
    let programs: Vec<_> = suite
        .programs
        .iter()
        .filter(|p| only.is_empty() || only.contains(&p.name))
        .collect();
    install_packages(&programs, install, quiet)
}

pub(crate) fn install_packages(
    programs: &[&suite::SuiteProgram],
    install: bool,
    quiet: bool,
) -> Result<()> {
    let mut pkgs: Vec<String> = programs.iter().flat_map(|p| p.packages.clone()).collect();
    if programs.iter().any(|p| p.x11) {
        pkgs.push("xvfb".to_string());
    }
    pkgs.sort();
    pkgs.dedup();
    let missing = suite::missing_packages(&pkgs);
    if !missing.is_empty() && !quiet {
        eprintln!("warmstart: installing {}", missing.join(" "));
    }
    suite::install(&missing, install)
}

/// One cold, one warm and one warmstart launch with the activity sampler
/// on (FAST Fig. 12). Not part of the statistics: sampling costs CPU.
fn timelines(exec: &mut RealExecutor, scenarios: &[Scenario]) -> Result<Vec<Timeline>> {
    let mut out = Vec::new();
    for s in [Scenario::Cold, Scenario::Warm, Scenario::Warmstart] {
        if !scenarios.contains(&s) {
            continue;
        }
        let sampler = Sampler::start(Duration::from_millis(2));
        let origin = sampler.origin;
        let m = exec.measure(s);
        let samples = sampler.stop();
        let m = m?;
        let start = exec.last_start.context("no launch")?;
        // The sampler started before the cache was prepared: shift so that
        // 0 is the launch's start and keep the launch only.
        let offset = start.saturating_duration_since(origin).as_secs_f64() * 1e3;
        let launch_ms = m.time.as_secs_f64() * 1e3;
        let samples = samples
            .into_iter()
            .map(|mut x| {
                x.t_ms -= offset;
                x
            })
            .filter(|x| x.t_ms >= 0.0 && x.t_ms <= launch_ms)
            .collect();
        out.push(Timeline {
            scenario: s,
            launch_ms,
            samples,
        });
    }
    exec.cleanup()?;
    Ok(out)
}

struct BarProgress<'a> {
    bar: &'a ProgressBar,
    name: String,
    /// Launches the learning phase makes.
    learning: u64,
}

impl Progress for BarProgress<'_> {
    fn phase(&mut self, what: &str) {
        self.bar.set_message(format!("{}: {what}", self.name));
        self.bar
            .inc(if what == "learning" { self.learning } else { 1 });
    }
    fn launched(&mut self, round: usize, s: Scenario, t: Duration) {
        self.bar.set_message(format!(
            "{}: round {} {s} {}",
            self.name,
            round + 1,
            report::fmt_time(t.as_secs_f64())
        ));
        self.bar.inc(1);
    }
}
