//! `warmstart bench usage`: a usage log replayed across simulated boots,
//! once per mode, to measure prefetching *before* the launch (issue 21's
//! benchmark).
//!
//! For each mode, in one run: at every boot of the log, sync and drop the
//! caches, (re)start the mode's prefetcher with the state its earlier
//! boots left, then launch each program of the boot after its gap, with no
//! wrapper, timed as the suite times it. The first boots train, the rest
//! are measured. A launch's baseline is the same launch in the `none` mode
//! (cold) and in the `warm` mode (warm).
//!
//! Modules: [`log`] (the log: files, the default, a daemon's history),
//! [`prefetcher`] (the modes: the daemon's configs, Debian's preload),
//! [`probe`] (memory, preloads, disk reads), [`results`] (arithmetic,
//! tables), [`runs`] (`--runs`: the spread over several runs), [`plot`]
//! (the timeline), [`inside`] (`--fs`: the same run in a storage testbed).

mod inside;
pub mod log;
mod output;
pub mod plot;
pub mod prefetcher;
pub mod probe;
pub mod results;
pub mod runs;
pub mod session;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use warmstart_launch::daemon::DaemonStatus;

use crate::launch::{self, Target};
use log::Boot;
use output::{write_results, write_runs, RunOutput};
use prefetcher::{DaemonProc, Mode, ModeDir, Prefetcher, PreloadProc};
use results::{BootResult, DaemonBoot, LaunchResult, UsageResults, UsageSettings};

/// `--help` examples.
pub const EXAMPLES: &str = "EXAMPLES:
  warmstart bench usage --suite bench/suite.toml
  warmstart bench usage --modes none,predict,warm --json usage.json --export-markdown usage.md
  warmstart bench usage --modes none,predict,warm --runs 3     # median and range of 3 runs
  warmstart bench usage --log my.jsonl --train 4 --suite bench/suite.toml
  warmstart bench usage --from-history /var/lib/warmstart --map python3-u1000-0f3a=python-scipy \\
      --write-log mine.jsonl
  warmstart bench usage --write-log default.jsonl      # the default log, to read or edit
  warmstart bench usage --fs ext4 --storage cloud --modes none,predict,warm
                                                       # on a slow network disk's model

Modes, each replaying the whole log (default: all; preload if installed):
  none         no prefetcher: every launch after a boot is cold (the baseline)
  launch-only  warmstart daemon, prefetching at launch time only
               (startup plans, prediction and idle preloads off)
  startup      warmstart daemon with startup plans, no prediction or preloads
  predict      warmstart daemon as installed: startup plans, prediction, preloads
  preload      Debian's preload daemon with its defaults (apt-get install preload)
  warm         every launch warm (launched once, unmeasured, right before)
A log is JSON lines of steps:
  {\"step\":\"boot\"}
      sync, drop caches, restart the prefetcher
  {\"step\":\"launch\",\"after_ms\":4000,\"program\":\"clang\"}
      wait, then launch the suite's program
  {\"step\":\"login\",\"after_ms\":3000}
      wait, then start a login session (a new audit session id): the boot's
      next launches run in it
  {\"step\":\"evict\",\"after_ms\":2000}
      wait, then sync and drop caches, the prefetcher left running (the cache
      emptied while the machine idled)
Gap captured = (cold - t) / (cold - warm); totals also over the startup
sequences (launches right after a login, see --sequence-gap) and the first
launches after an eviction. Needs root (drop_caches; the daemon loads its
eBPF recorder; a login writes /proc/thread-self/loginuid).";

/// Replay a usage log across simulated boots: no prefetcher, the daemon
/// with and without its foresight, Debian's preload, and warm, side by side.
#[derive(clap::Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct UsageArgs {
    /// The usage log: JSON lines of steps (see below).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["default_log", "from_history"])]
    pub log: Option<PathBuf>,
    /// Replay the shipped default log (what runs without --log or
    /// --from-history): 8 boots of python-scipy, javac, npm, clang and
    /// gedit, each with a login that autostarts gedit and clang, then 1 to
    /// 4 launches, some after an eviction while idle.
    #[arg(long, conflicts_with = "from_history")]
    pub default_log: bool,
    /// Make the log from a daemon's launch history: its state directory
    /// (or its history.jsonl). Boots are its boot startups; launches of
    /// profiles whose command is a suite program's (or named by --map)
    /// are kept, the others left out.
    #[arg(long, value_name = "DIR")]
    pub from_history: Option<PathBuf>,
    /// With --from-history: replay the launches of profile PROFILE as the
    /// suite program PROGRAM.
    #[arg(long, value_name = "PROFILE=PROGRAM", requires = "from_history")]
    pub map: Vec<String>,
    /// With --from-history: longer gaps between launches are shortened to
    /// this many seconds.
    #[arg(long, default_value_t = 30.0, value_name = "S")]
    pub max_gap: f64,
    /// A login's startup sequence is the launches after it, each at most
    /// this many seconds after the step before it; the first longer gap
    /// ends it.
    #[arg(long, default_value_t = 2.0, value_name = "S")]
    pub sequence_gap: f64,
    /// Write the log that would be replayed (JSON lines) and exit.
    #[arg(long, value_name = "FILE")]
    pub write_log: Option<PathBuf>,
    /// The suite whose programs the log names.
    #[arg(long, value_name = "FILE", default_value = "bench/suite.toml")]
    pub suite: PathBuf,
    /// Modes to run, comma-separated, in this order [default: all; preload
    /// if installed].
    #[arg(short, long, value_enum, value_delimiter = ',')]
    pub modes: Vec<Mode>,
    /// Boots that train (the first N); the others are measured [default:
    /// half, rounded down].
    #[arg(long, value_name = "N")]
    pub train: Option<usize>,
    /// Let the daemon learn every program, as installed (`learn = "all"`),
    /// rather than only the log's programs (an allow list, so that other
    /// programs running on the machine do not train it).
    #[arg(long)]
    pub learn_all: bool,
    /// Replay the log N times, the modes in turn (in reverse order every
    /// other run), and give each mode's gap captured as the median and
    /// range over the runs.
    #[arg(long, default_value_t = 1, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub runs: u32,
    /// Give up on a launch not complete after this many seconds.
    #[arg(long, default_value_t = 120.0, value_name = "S")]
    pub timeout: f64,
    /// Keep going when a program exits non-zero.
    #[arg(short = 'i', long)]
    pub ignore_failure: bool,
    /// Do not install missing Debian packages of the log's programs.
    #[arg(long)]
    pub no_install: bool,
    /// Write every launch, boot and sample, and the totals, as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write the machine, the method and the tables as Markdown.
    #[arg(long, value_name = "FILE")]
    pub export_markdown: Option<PathBuf>,
    /// Write the timeline (page cache, preloads' memory and budget,
    /// launches) of every mode as DIR/usage-timeline.svg
    /// (usage-timeline-runK.svg for each run with --runs N > 1).
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    /// A TOML file of daemon settings (config.toml keys) added to every
    /// daemon mode's config; each mode's own switches (`predict_launches`,
    /// `[startup] enabled`, `[preload] enabled`) still win.
    #[arg(long, value_name = "FILE")]
    pub daemon_config: Option<PathBuf>,
    /// Keep each mode's prefetcher state, config and log in DIR/MODE
    /// (emptied at the mode's start) instead of removing them.
    #[arg(long, value_name = "DIR")]
    pub keep_state: Option<PathBuf>,
    /// Replay the log in a storage testbed: the programs' files on a
    /// filesystem of this type (ext4, xfs, btrfs) in an image on a
    /// direct-I/O loop device, chrooted over it; every boot drops the page
    /// cache and the loop device's. The image is the one `warmstart bench
    /// --fs` builds and reuses.
    #[arg(long, value_name = "FS", value_parser = crate::testbed::parse_fs)]
    pub fs: Option<warmstart_testbed::Fs>,
    /// With --fs: put a slow-device model under the image (sd, cloud,
    /// sata-ssd, hdd); its fio figures are printed with the results.
    #[arg(long, value_name = "PROFILE", requires = "fs", value_parser = crate::testbed::parse_profile)]
    pub storage: Option<warmstart_testbed::Profile>,
    /// With --fs: where testbed images are kept [default:
    /// /var/cache/warmstart-bench].
    #[arg(long, value_name = "DIR", requires = "fs")]
    pub testbed_cache: Option<PathBuf>,
    /// With --fs: copy these host paths into the image instead of the
    /// system's (/usr, /etc, /bin, /sbin, /lib*, the font cache);
    /// comma-separated.
    #[arg(long, value_delimiter = ',', value_name = "PATHS", requires = "fs")]
    pub testbed_content: Vec<PathBuf>,
    /// What the results call the log (the inner harness of --fs gets the
    /// log as a file).
    #[arg(long, hide = true, requires = "log")]
    pub log_source: Option<String>,
}

/// Runs `warmstart bench usage`; returns the exit code.
pub fn run(args: UsageArgs, quiet: bool) -> Result<i32> {
    let suite = crate::suite::Suite::load(&args.suite)?;
    let suite_dir = args
        .suite
        .canonicalize()
        .with_context(|| format!("resolving {}", args.suite.display()))?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let (boots, source) = the_log(&args, &suite, quiet)?;
    let known: Vec<String> = suite.programs.iter().map(|p| p.name.clone()).collect();
    log::check_programs(&boots, &known)?;
    if let Some(p) = &args.write_log {
        crate::export::write_file(p, |b| {
            b.extend_from_slice(log::encode(&log::to_steps(&boots)).as_bytes());
            Ok(())
        })?;
        if !quiet {
            eprintln!("warmstart: wrote {} ({source})", p.display());
        }
        return Ok(0);
    }
    let train = args
        .train
        .unwrap_or_else(|| log::default_train(boots.len()));
    log::check_train(train, boots.len())?;
    let modes = modes(&args.modes, quiet);
    if modes.is_empty() {
        bail!("no mode to run");
    }

    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("bench usage needs root: it drops the page cache at every boot and runs the daemon");
    }
    if !Path::new("/proc/sys/vm/drop_caches").exists() {
        bail!("cannot drop caches here (no /proc/sys/vm/drop_caches)");
    }
    // Read before a testbed is prepared: a typo fails now.
    let extra = match &args.daemon_config {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            let t: toml::Table =
                toml::from_str(&text).with_context(|| format!("in {}", p.display()))?;
            Some(t)
        }
        None => None,
    };
    if args.fs.is_some() && crate::testbed::inner().is_none() {
        // The log's packages go onto the host first, so the image (checked
        // against the host's trees) has them.
        crate::install_packages(&log_programs(&suite, &boots), !args.no_install, quiet)?;
        return inside::run(&args, &boots, &source, &modes, train, quiet);
    }
    let logins = boots
        .iter()
        .flat_map(|b| &b.markers)
        .any(|m| m.kind == log::MarkerKind::Login);
    if logins {
        session::check()?;
    }
    if !quiet {
        let waits = log::waits_ms(&boots) as f64 / 1e3;
        eprintln!(
            "warmstart: the log waits {waits:.0} s per mode between its steps ({:.0} min for \
             {} modes), plus the launches and each boot's cache drop, prefetcher start and stop",
            waits * modes.len() as f64 / 60.0,
            modes.len()
        );
    }
    refuse_foreign_prefetchers()?;
    let warmstart_bin = if modes.iter().any(|m| m.uses_daemon()) {
        match crate::wrapped::warmstart_binary() {
            Some(b) if b.is_file() => Some(b),
            Some(b) => bail!("the daemon modes run {}, which does not exist", b.display()),
            None => bail!(
                "the daemon modes need the warmstart binary: not found beside {} nor on PATH \
                 (set WARMSTART_BENCH_BIN)",
                std::env::current_exe().map_or("?".into(), |e| e.display().to_string())
            ),
        }
    } else {
        None
    };
    let preload_bin = if modes.contains(&Mode::Preload) {
        Some(prefetcher::preload_binary()?)
    } else {
        None
    };

    let used = log_programs(&suite, &boots);
    // In a testbed the outer harness installed them on the host before the
    // image was checked (the image has no dpkg database to ask).
    if crate::testbed::inner().is_none() {
        crate::install_packages(&used, !args.no_install, quiet)?;
    }
    let timeout = Duration::from_secs_f64(args.timeout);
    let mut targets: BTreeMap<String, Target> = used
        .iter()
        .map(|p| (p.name.clone(), p.target(&suite_dir, timeout)))
        .collect();
    let _xvfb = if used.iter().any(|p| p.x11) {
        let x = crate::suite::Xvfb::start()?;
        for (name, t) in targets.iter_mut() {
            if used.iter().any(|p| &p.name == name && p.x11) {
                t.env.push(("DISPLAY".into(), x.display.clone()));
            }
        }
        Some(x)
    } else {
        None
    };
    let allow = if args.learn_all {
        None
    } else {
        let mut keys = targets
            .values()
            .map(crate::wrapped::policy_key)
            .collect::<Result<Vec<_>>>()?;
        keys.sort();
        keys.dedup();
        Some(keys)
    };

    // A config the daemon would refuse fails now, not after the modes
    // before it ran.
    for &m in modes.iter().filter(|m| m.uses_daemon()) {
        let text = prefetcher::daemon_config(m, allow.as_deref(), extra.as_ref());
        toml::from_str::<warmstart_launch::daemon::DaemonConfig>(&text)
            .map_err(|e| anyhow::anyhow!("{e}"))
            .and_then(|c| c.validate().map_err(|e| anyhow::anyhow!("{e}")))
            .with_context(|| format!("the daemon's config for mode {m} (see --daemon-config)"))?;
    }
    let machine = crate::machine::Machine::probe();
    let disks = probe::read_disks(&machine.root_device);
    let run = Run {
        boots: &boots,
        train,
        targets: &targets,
        warmstart_bin: warmstart_bin.as_deref(),
        preload_bin: preload_bin.as_deref(),
        allow: allow.as_deref(),
        extra: extra.as_ref(),
        disks: &disks,
        keep: args.keep_state.as_deref(),
        ignore_failure: args.ignore_failure,
        quiet,
        logins,
        sequence_gap_ms: (args.sequence_gap.max(0.0) * 1000.0) as u64,
    };
    let runs = args.runs as usize;
    let mut outputs: Vec<RunOutput> = Vec::new();
    // A mode that fails (a program crashing, preload refusing to start)
    // must not lose the other modes' minutes of measurements.
    let mut failed: Vec<&str> = Vec::new();
    for r in 0..runs {
        if runs > 1 && !quiet {
            eprintln!("warmstart: run {} of {runs}", r + 1);
        }
        let mut out = RunOutput::default();
        for mode in runs::order(&modes, r) {
            match run.mode(mode) {
                Ok((l, b, s)) => {
                    out.launches.extend(l);
                    out.boots.extend(b);
                    out.samples.extend(s);
                    out.done.push(mode);
                }
                Err(e) => {
                    eprintln!("warmstart: mode {mode} failed: {e:#}");
                    if !failed.contains(&mode.name()) {
                        failed.push(mode.name());
                    }
                }
            }
        }
        outputs.push(out);
    }
    if logins {
        // Cleanup commands are no part of a login.
        if let Err(e) = session::leave() {
            eprintln!("warmstart: {e:#}");
        }
    }
    if outputs.iter().all(|o| o.done.is_empty()) {
        bail!("every mode failed");
    }
    for t in targets.values() {
        if let Some(c) = &t.cleanup {
            if let Err(e) = launch::shell(c, t.cwd.as_deref(), "cleanup") {
                eprintln!("warmstart: {}: {e:#}", t.name);
            }
        }
    }

    let settings = |done: &[Mode]| UsageSettings {
        suite: args.suite.display().to_string(),
        log_source: source.clone(),
        boots: boots.len(),
        train_boots: train,
        // In the order asked, whatever order they ran in.
        modes: modes
            .iter()
            .filter(|m| done.contains(m))
            .map(|m| m.name().to_string())
            .collect(),
        learn: if args.learn_all { "all" } else { "allow-list" }.into(),
        disks: disks.clone(),
        sequence_gap_s: Some(args.sequence_gap),
    };
    let mut results: Vec<UsageResults> = outputs
        .into_iter()
        .filter(|o| !o.done.is_empty())
        .map(|o| {
            let set = settings(&o.done);
            o.results(&machine, set, &boots)
        })
        .collect();
    if runs == 1 {
        write_results(&args, &results.remove(0), quiet)?;
    } else {
        let summary = runs::summarize(&results);
        write_runs(
            &args,
            &runs::UsageRuns {
                runs: results,
                summary,
            },
            quiet,
        )?;
    }
    if !failed.is_empty() {
        eprintln!("warmstart: failed modes: {}", failed.join(", "));
        return Ok(1);
    }
    Ok(0)
}

/// The log's programs, as the suite launches them, by name.
fn log_programs<'s>(
    suite: &'s crate::suite::Suite,
    boots: &[Boot],
) -> Vec<&'s crate::suite::SuiteProgram> {
    let mut used: Vec<&crate::suite::SuiteProgram> = suite
        .programs
        .iter()
        .filter(|p| {
            boots
                .iter()
                .flat_map(|b| &b.launches)
                .any(|l| l.program == p.name)
        })
        .collect();
    used.sort_by(|a, b| a.name.cmp(&b.name));
    used
}

/// The log to replay and where it came from.
fn the_log(
    args: &UsageArgs,
    suite: &crate::suite::Suite,
    quiet: bool,
) -> Result<(Vec<Boot>, String)> {
    if let Some(p) = &args.log {
        let source = args
            .log_source
            .clone()
            .unwrap_or_else(|| p.display().to_string());
        return Ok((log::load(p)?, source));
    }
    let Some(h) = &args.from_history else {
        let spec = log::default_spec();
        return Ok((
            log::from_steps(&log::default_steps())?,
            format!("the default log (seed {})", spec.seed),
        ));
    };
    let (file, state_dir) = if h.is_dir() {
        (
            warmstart_launch::history::HistoryFile::path_in(h),
            h.clone(),
        )
    } else {
        (
            h.clone(),
            h.parent()
                .map_or_else(|| PathBuf::from("."), Path::to_path_buf),
        )
    };
    let text =
        std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    let programs: Vec<(String, Vec<String>)> = suite
        .programs
        .iter()
        .map(|p| (p.name.clone(), p.command.clone()))
        .collect();
    let mut map = log::profiles_by_command(&state_dir, &programs);
    for m in &args.map {
        let Some((profile, program)) = m.split_once('=') else {
            bail!("--map {m:?}: give PROFILE=PROGRAM");
        };
        map.insert(profile.to_string(), program.to_string());
    }
    let max_gap_ms = (args.max_gap.max(0.0) * 1000.0) as u64;
    let (steps, unmapped) = log::from_history(&text, &map, max_gap_ms);
    if !unmapped.is_empty() && !quiet {
        let list: Vec<String> = unmapped.iter().map(|(p, n)| format!("{p} ({n})")).collect();
        eprintln!(
            "warmstart: left out the launches of profiles that are no suite program: {}; \
             name them with --map PROFILE=PROGRAM",
            list.join(", ")
        );
    }
    let boots = log::from_steps(&steps)
        .with_context(|| format!("{}: no boot with a launch to replay", file.display()))?;
    Ok((boots, format!("the history {}", file.display())))
}

/// The modes asked for, or all of them (preload only if installed).
fn modes(asked: &[Mode], quiet: bool) -> Vec<Mode> {
    if !asked.is_empty() {
        let mut out: Vec<Mode> = Vec::new();
        for m in asked {
            if !out.contains(m) {
                out.push(*m);
            }
        }
        return out;
    }
    let have_preload = prefetcher::preload_binary().is_ok();
    if !have_preload && !quiet {
        eprintln!("warmstart: Debian's preload is not installed (apt-get install preload): leaving out the preload mode");
    }
    Mode::ALL
        .into_iter()
        .filter(|m| *m != Mode::Preload || have_preload)
        .collect()
}

/// Fails if a prefetcher the bench did not start runs (checked before
/// each boot: one started meanwhile would warm the launches after it).
fn refuse_foreign_prefetchers() -> Result<()> {
    let found = probe::foreign_prefetchers(Path::new("/proc"));
    if found.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = found.iter().map(|(p, c)| format!("{p} ({c})")).collect();
    bail!(
        "another prefetcher is running and would warm every mode's launches: {}; stop it \
         (systemctl stop warmstart preload) and run again",
        list.join(", ")
    )
}

/// What every mode replays, and with what.
struct Run<'a> {
    boots: &'a [Boot],
    train: usize,
    targets: &'a BTreeMap<String, Target>,
    warmstart_bin: Option<&'a Path>,
    preload_bin: Option<&'a Path>,
    allow: Option<&'a [String]>,
    extra: Option<&'a toml::Table>,
    disks: &'a [String],
    keep: Option<&'a Path>,
    ignore_failure: bool,
    quiet: bool,
    /// The log has login steps: each boot leaves the session of the last.
    logins: bool,
    /// See `--sequence-gap`.
    sequence_gap_ms: u64,
}

type ModeOutput = (Vec<LaunchResult>, Vec<BootResult>, Vec<probe::Sample>);

impl Run<'_> {
    /// Every boot of the log in `mode`, with a state directory of its own.
    fn mode(&self, mode: Mode) -> Result<ModeOutput> {
        let dir = ModeDir::new(mode, self.keep)?;
        let config = prefetcher::daemon_config(mode, self.allow, self.extra);
        let limit = prefetcher::stop_limit(self.extra);
        let origin = Instant::now();
        let mut out: ModeOutput = Default::default();
        for (i, boot) in self.boots.iter().enumerate() {
            let measured = i >= self.train;
            refuse_foreign_prefetchers()?;
            if self.logins {
                // A boot starts outside any login, the prefetcher too
                // (this thread starts it).
                session::leave().context("ending the last boot's login session")?;
            }
            crate::testbed::drop_caches()?;
            let read_from = probe::read_bytes(self.disks);
            let pf = match mode {
                m if m.uses_daemon() => Prefetcher::Daemon(DaemonProc::start(
                    self.warmstart_bin.context("no warmstart binary")?,
                    &dir,
                    &config,
                )?),
                Mode::Preload => Prefetcher::Preload(PreloadProc::start(
                    self.preload_bin.context("no preload binary")?,
                    &dir,
                )?),
                _ => Prefetcher::None,
            };
            let sampler = probe::Sampler::start(
                mode.name(),
                i + 1,
                origin,
                pf.socket().map(Path::to_path_buf),
            );
            let mut leader = None;
            let launched = self.launches(mode, i, boot, measured, origin, pf.socket(), &mut leader);
            out.2.extend(sampler.stop());
            let window = matches!(mode, Mode::Startup | Mode::Predict);
            let stopped = pf.stop(window, limit);
            // The session ends with the boot.
            drop(leader);
            let (status, quiet) = stopped.with_context(|| format!("boot {}", i + 1))?;
            if !quiet {
                eprintln!(
                    "warmstart: warning: {mode} boot {}: the daemon was still {} after {:.0} s; \
                     stopped anyway",
                    i + 1,
                    if window {
                        "learning or recording the startup"
                    } else {
                        "learning"
                    },
                    limit.as_secs_f64()
                );
            }
            out.0
                .extend(launched.with_context(|| format!("boot {}", i + 1))?);
            out.1.push(BootResult {
                mode: mode.name().into(),
                boot: i + 1,
                measured,
                read_bytes: probe::read_bytes(self.disks).saturating_sub(read_from),
                daemon: status.as_ref().map(|s| daemon_boot(s, quiet)),
            });
        }
        Ok(out)
    }

    /// The launches of one boot, and its logins and evictions; launches
    /// and logins from this thread, so that they share its session.
    #[allow(clippy::too_many_arguments)]
    fn launches(
        &self,
        mode: Mode,
        i: usize,
        boot: &Boot,
        measured: bool,
        origin: Instant,
        socket: Option<&Path>,
        leader: &mut Option<session::Leader>,
    ) -> Result<Vec<LaunchResult>> {
        let mut out = Vec::new();
        let kinds = log::launch_kinds(boot, self.sequence_gap_ms);
        for (n, l) in boot.launches.iter().enumerate() {
            self.markers(mode, i, boot, n, leader)?;
            let t = &self.targets[&l.program];
            thread::sleep(Duration::from_millis(l.after_ms));
            // What the daemon expected as the launch came: whether it had
            // ranked and preloaded it.
            let before = socket
                .and_then(warmstart_launch::daemon::query)
                .map(|s| s.foresight);
            if mode == Mode::Warm {
                self.prepare(t)?;
                let w = launch::launch(t, Instant::now())?;
                self.check(t, w.exit_code)?;
            }
            self.prepare(t)?;
            let start_s = origin.elapsed().as_secs_f64();
            let done = launch::launch(t, Instant::now())
                .with_context(|| format!("launching {}", t.name))?;
            self.check(t, done.exit_code)?;
            let ms = done.time.as_secs_f64() * 1e3;
            if !self.quiet {
                eprintln!(
                    "warmstart: usage: {mode} boot {}/{}{}: {} {ms:.0} ms",
                    i + 1,
                    self.boots.len(),
                    if measured { "" } else { " (train)" },
                    t.name
                );
            }
            out.push(LaunchResult {
                mode: mode.name().into(),
                boot: i + 1,
                launch: n + 1,
                program: l.program.clone(),
                measured,
                start_s,
                ms,
                cold_ms: None,
                warm_ms: None,
                gap: None,
                preload_state_before: before.as_ref().map(|f| f.preload_state.clone()),
                predictions_before: before.map(|f| f.predictions),
                startup_sequence: kinds[n].startup_sequence,
                after_eviction: kinds[n].after_eviction,
            });
        }
        self.markers(mode, i, boot, boot.launches.len(), leader)?;
        Ok(out)
    }

    /// The logins and evictions of `boot` before its launch `n`.
    fn markers(
        &self,
        mode: Mode,
        i: usize,
        boot: &Boot,
        n: usize,
        leader: &mut Option<session::Leader>,
    ) -> Result<()> {
        for m in boot.markers_before(n) {
            thread::sleep(Duration::from_millis(m.after_ms));
            let what = match m.kind {
                log::MarkerKind::Login => {
                    // The last session's leader ends as its session does.
                    *leader = None;
                    let id = session::begin()?;
                    *leader = Some(session::Leader::start()?);
                    format!("login (session {id})")
                }
                log::MarkerKind::Evict => {
                    crate::testbed::drop_caches().context("for an eviction")?;
                    "caches dropped".to_string()
                }
            };
            if !self.quiet {
                eprintln!(
                    "warmstart: usage: {mode} boot {}/{}: {what}",
                    i + 1,
                    self.boots.len()
                );
            }
        }
        Ok(())
    }

    fn prepare(&self, t: &Target) -> Result<()> {
        match &t.prepare {
            Some(p) => launch::shell(p, t.cwd.as_deref(), "prepare"),
            None => Ok(()),
        }
    }

    fn check(&self, t: &Target, code: Option<i32>) -> Result<()> {
        match code {
            Some(c) if c != 0 && !self.ignore_failure => bail!(
                "{} exited with status {c} (use --ignore-failure to keep going)",
                t.name
            ),
            _ => Ok(()),
        }
    }
}

fn daemon_boot(s: &DaemonStatus, quiet: bool) -> DaemonBoot {
    let f = &s.foresight;
    DaemonBoot {
        finished: quiet,
        launches_learned: s.launches_learned,
        launches_prefetched: s.launches_prefetched,
        startups_recorded: f.startups_recorded,
        startup_replays: f.startup_replays,
        history_events: f.history_events,
        preloads: f.preloads,
        bytes_preloaded: f.bytes_preloaded,
        bytes_used: f.bytes_used,
        preloads_used: f.preloads_used,
        preloads_unused: f.preloads_unused,
        held_bytes: f.held_bytes,
    }
}
