//! `warmstart run`, `daemon`, `status`, `forget` and `learn`: the launch
//! manager's commands. `status`, `forget` and `learn` talk to the daemon
//! through its control socket when it runs.

use anyhow::{Context, Result};
use warmstart_launch::{Config, Store, Strategy, StrategyChoice};

use std::ffi::OsString;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use warmstart_launch::daemon::{ControlError, DaemonConfig, Reply, Request};

use crate::cli::{DaemonArgs, ForgetArgs, LearnArgs, RunArgs, StatusArgs, StrategyArg};
use crate::cmd::human_bytes;

pub fn run(args: RunArgs, quiet: bool) -> Result<i32> {
    let launch = |argv: &[OsString], profile: Option<&str>, cfg: &Config| {
        warmstart_launch::run(argv, profile, cfg).map(Some)
    };
    Ok(run_with(args, quiet, launch)?.expect("the full launch manager runs every launch"))
}

/// [`run`] in the front binary, which does not link the recorder: `None`
/// when the launch needs it (learning, an audit, a breakdown), before
/// anything was launched or printed.
pub fn run_front(args: RunArgs, quiet: bool) -> Result<Option<i32>> {
    run_with(args, quiet, warmstart_launch::run_without_recorder)
}

type Launched = Option<(warmstart_record::Exit, warmstart_launch::LaunchReport)>;

fn run_with(
    args: RunArgs,
    quiet: bool,
    launch: impl Fn(&[OsString], Option<&str>, &Config) -> Result<Launched, warmstart_launch::Error>,
) -> Result<Option<i32>> {
    let mut cfg = Config {
        state_dir: args
            .state_dir
            .clone()
            .unwrap_or_else(warmstart_launch::default_state_dir),
        nrawseq: args.nrawseq.max(1),
        rmiss: args.rmiss,
        strategy: match args.strategy {
            StrategyArg::Auto => StrategyChoice::Auto,
            StrategyArg::Concurrent => StrategyChoice::Fixed(Strategy::Concurrent),
            StrategyArg::Sorted => StrategyChoice::Fixed(Strategy::Sorted),
        },
        audit: args.audit,
        breakdown: args.breakdown,
        // A report is written after the launch, so the wrapper must stay.
        exec_in_place: args.report.is_none() && !args.verbose && !args.breakdown,
        ..Config::default()
    };
    if let Some(w) = args.workers {
        cfg.replay.fixed_workers(w.clamp(1, 64));
    }
    cfg.replay.cpus = args.replay_cpus.clone();
    if let Some(w) = warmstart_replay::unusable_cpus(&cfg.replay.cpus)
        // Handed over by the front, which has said it already.
        .filter(|_| !quiet && !crate::handover::handed_over())
    {
        eprintln!("warmstart: {w}");
    }
    let Some((exit, report)) = launch(&args.command, args.profile.as_deref(), &cfg)? else {
        return Ok(None);
    };
    if let Some(p) = &args.report {
        // The launch happened: its status is the command's, whatever
        // becomes of the report.
        // Atomically, and never through a symlink planted at that path;
        // not synced to disk: the caller waits for it.
        if let Err(e) =
            warmstart_launch::store::write_replace(p, &serde_json::to_vec_pretty(&report)?)
        {
            eprintln!("warmstart: cannot write the report {}: {e}", p.display());
        }
    }
    if args.verbose && !quiet {
        eprintln!(
            "warmstart: profile {} {:?} -> {:?}{}{}{}",
            report.profile,
            report.phase_before,
            report.phase_after,
            report
                .miss_ratio
                .map(|m| format!(", miss ratio {m:.3}"))
                .unwrap_or_default(),
            report
                .relearn_reason
                .as_ref()
                .map(|r| format!(", relearning: {r}"))
                .unwrap_or_default(),
            report
                .compiled
                .as_ref()
                .map(|c| format!(", {c}"))
                .unwrap_or_default(),
        );
        if let (Some(before), Some(held), Some(after)) = (
            report.before_replay_ms,
            report.held_ms,
            report.after_exit_ms,
        ) {
            eprintln!(
                "warmstart: started the replay {before:.1} ms after starting; held the program \
                 {held:.1} ms for its head start{}; {after:.1} ms after it exited",
                if report.named_by_hint {
                    " and its path's walk (named by its hint)"
                } else {
                    ""
                }
            );
        }
    }
    if args.breakdown && !quiet && (args.verbose || args.report.is_none()) {
        match (&report.breakdown, &report.breakdown_problem) {
            (Some(b), _) => eprint!("{}", breakdown_summary(b)),
            (None, Some(why)) => eprintln!("warmstart: no breakdown: {why}"),
            (None, None) => {}
        }
    }
    warmstart_record::exit_like(exit)
}

/// `--breakdown`'s few lines: the classes, the wait, the replay's lag and
/// the files waited on longest.
fn breakdown_summary(b: &warmstart_record::breakdown::Breakdown) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "warmstart: breakdown: {} pages touched ({}), {:.1} ms waiting in D state ({:.1} ms not for a page), {:.1} ms runnable after {} preemptions ({:.1} ms of it after a replay thread took the CPU)",
        b.touched_pages,
        human_bytes(b.touched_pages * 4096),
        b.wait_ms,
        b.unattributed_wait_ms,
        b.runnable_wait_ms,
        b.preemptions,
        b.runnable_wait_replay_ms
    );
    for (name, c) in [
        ("resident", &b.resident),
        ("prefetched", &b.prefetched),
        ("late", &b.late),
        ("missed", &b.missed),
        ("not-in-plan", &b.not_in_plan),
    ] {
        let _ = writeln!(
            s,
            "  {name:<12} {:>8} pages {:>10}  waited {:>8.1} ms in {} sleeps",
            c.pages,
            human_bytes(c.bytes),
            c.wait_ms,
            c.waits
        );
    }
    let l = &b.missed_lag;
    if b.missed.pages > 0 {
        let _ = writeln!(
            s,
            "  missed: {} issued by the replay after the launch needed them (median {}, max {} behind), {} issued before but read by the launch, {} never issued",
            l.issued_later,
            l.median_ms.map_or("-".into(), |m| format!("{m:.1} ms")),
            l.max_ms.map_or("-".into(), |m| format!("{m:.1} ms")),
            l.issued_before_needed,
            l.never_issued
        );
    }
    let t = &b.timeline;
    let at = |v: Option<f64>| v.map_or("-".into(), |m| format!("{m:+.1} ms"));
    let _ = writeln!(
        s,
        "  replay (from the exec): first request {}, last {} ({} requests); launch ended {}",
        at(t.first_request_ms),
        at(t.last_request_ms),
        t.requests,
        at(t.launch_end_ms)
    );
    if !b.unattributed_by.is_empty() {
        let why: Vec<String> = b
            .unattributed_by
            .iter()
            .take(3)
            .map(|r| format!("{} {:.1} ms", r.function, r.wait_ms))
            .collect();
        let _ = writeln!(s, "  not for a page: {}", why.join(", "));
    }
    for f in b.top_files.iter().take(5) {
        let _ = writeln!(
            s,
            "  {:>8.1} ms  {} ({} pages: {} late, {} missed, {} not in plan)",
            f.wait_ms, f.path, f.pages, f.late, f.missed, f.not_in_plan
        );
    }
    if !b.longest_waits.is_empty() {
        let _ = writeln!(
            s,
            "  longest waits (ms from the exec: needed, issued by the replay, its read began):"
        );
    }
    for w in b.longest_waits.iter().take(5) {
        let _ = writeln!(
            s,
            "  {:>8.1} ms  {} page {} ({}): needed {}, issued {}, read {}",
            w.wait_ms,
            w.path,
            w.page,
            class_name(w.class),
            at(Some(w.needed_ms)),
            at(w.issued_ms),
            at(w.replay_read_ms)
        );
    }
    if b.drops > 0 {
        let _ = writeln!(
            s,
            "  ! {} records lost (ring buffer full): the figures are incomplete",
            b.drops
        );
    }
    s
}

fn class_name(c: warmstart_record::breakdown::PageClass) -> &'static str {
    use warmstart_record::breakdown::PageClass;
    match c {
        PageClass::Resident => "resident",
        PageClass::Prefetched => "prefetched",
        PageClass::Late => "late",
        PageClass::Missed => "missed",
        PageClass::NotInPlan => "not in plan",
    }
}

/// The state directory `status` and `forget` look at when no daemon
/// answers: as given, else the configured one for root (where the daemon
/// keeps it), else the user's; never created.
pub(super) fn store(dir: &Option<std::path::PathBuf>) -> Result<Store> {
    let d = dir.clone().unwrap_or_else(|| {
        // SAFETY: geteuid has no preconditions.
        match (unsafe { libc::geteuid() }, config()) {
            (0, Some(c)) => c.state_dir,
            _ => warmstart_launch::default_state_dir(),
        }
    });
    Ok(Store::at(&d))
}

/// The daemon's configuration, if it reads; `status`, `forget` and
/// `learn` take its socket and state directory from it.
fn config() -> Option<DaemonConfig> {
    DaemonConfig::load(std::path::Path::new(DEFAULT_CONFIG)).ok()
}

const DEFAULT_CONFIG: &str = "/etc/warmstart/config.toml";

/// The control socket: as given, else the configured one, else the default.
pub(super) fn socket_of(arg: &Option<std::path::PathBuf>) -> std::path::PathBuf {
    arg.clone()
        .or_else(|| config().map(|c| c.socket))
        .unwrap_or_else(|| DaemonConfig::default().socket)
}

pub fn daemon(args: DaemonArgs) -> Result<i32> {
    // The command line's --state-dir and --socket win over the file's,
    // at the start and at every reload.
    let load = || {
        DaemonConfig::load(&args.config).map(|mut cfg| {
            if let Some(d) = &args.state_dir {
                cfg.state_dir = d.clone();
            }
            if let Some(s) = &args.socket {
                cfg.socket = s.clone();
            }
            cfg
        })
    };
    let mut cfg = load().map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
    // SIGTERM and SIGINT stop the daemon; SIGHUP (`systemctl reload`)
    // stops it too, then it starts again with the configuration read anew.
    let stop = Arc::new(AtomicBool::new(false));
    let (term, hup) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        signal_hook::flag::register(sig, Arc::clone(&stop))?;
        let which = if sig == libc::SIGHUP { &hup } else { &term };
        signal_hook::flag::register(sig, Arc::clone(which))?;
    }
    // The configuration the daemon last ran with, to go back to when a
    // reloaded one parses but cannot be started (its state directory or
    // socket unusable).
    let mut previous: Option<DaemonConfig> = None;
    loop {
        let ran = match super::registry_lookup::from_config(&cfg) {
            Ok(lookup) => warmstart_launch::daemon::run(
                &cfg,
                Arc::clone(&stop),
                lookup,
                &mut std::io::stderr(),
            )
            .map_err(anyhow::Error::from),
            Err(e) => Err(e.context("invalid configuration")),
        };
        // Cleared before `term` is read: a SIGTERM from here on stops the
        // next run at once.
        stop.store(false, Ordering::SeqCst);
        match (ran, previous.take()) {
            (Ok(()), _) => {}
            (Err(e), Some(prev)) if !term.load(Ordering::SeqCst) => {
                eprintln!(
                    "warmstart daemon: the reloaded configuration cannot be used ({e}); going on with the previous one"
                );
                cfg = prev;
                continue;
            }
            (Err(e), _) => return Err(e),
        }
        if term.load(Ordering::SeqCst) || !hup.swap(false, Ordering::SeqCst) {
            return Ok(0);
        }
        match load() {
            Ok(new) => {
                previous = Some(std::mem::replace(&mut cfg, new));
                eprintln!(
                    "warmstart daemon: SIGHUP: configuration {} read again",
                    args.config.display()
                );
            }
            Err(e) => eprintln!(
                "warmstart daemon: SIGHUP: invalid configuration ({e}); going on with the previous one"
            ),
        }
    }
}

pub fn status(args: StatusArgs) -> Result<i32> {
    let daemon = daemon_or_note(&socket_of(&args.socket));
    // The daemon's profiles, unless another state directory is asked for.
    let store = match (&args.state_dir, &daemon) {
        (None, Some(d)) if !d.state_dir.as_os_str().is_empty() => Store::at(&d.state_dir),
        _ => store(&args.state_dir)?,
    };
    let profiles = store.list().context("cannot read the state directory")?;
    let metadata = metadata_paths(&store, &profiles);
    if args.json {
        // One document, whether or not a daemon answered.
        let v: Vec<_> = profiles
            .iter()
            .map(|p| match p {
                Ok(p) => serde_json::to_value(p).expect("serializes"),
                Err(e) => serde_json::json!({ "error": e.to_string() }),
            })
            .collect();
        let doc = serde_json::json!({
            "daemon": daemon,
            "profiles": v,
            "metadata": metadata.json(),
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(0);
    }
    if let Some(d) = daemon {
        {
            if let Some(why) = &d.recorder_problem {
                println!(
                    "daemon: no recorder on {}: {why}; launches are neither seen nor learned",
                    d.kernel
                );
            }
            for what in &d.recorder_reduced {
                println!("daemon: the recorder runs without {what} ({})", d.kernel);
            }
            println!(
                "daemon: pid {}, up {:.0} s, {} execs seen, {} learned, {} prefetched ({} replays started at execve, {} found cached and not replayed), {} ignored, {} left to the kernel ({} trivial programs); exec->replay p50 {:.0} us, p90 {:.0} us, max {:.0} us; exec->first entry started p50 {:.0} us, p90 {:.0} us; exec->first request issued p50 {:.0} us, p90 {:.0} us, max {:.0} us; launch seen (execve or exec)->first request p50 {:.0} us, p90 {:.0} us, max {:.0} us; {} events, {} dropped",
                d.pid, d.uptime_s, d.execs_seen, d.launches_learned, d.launches_prefetched,
                d.replays_at_execve, d.launches_cached, d.ignored, d.execs_quieted, d.trivial_programs,
                d.exec_to_replay_us[0], d.exec_to_replay_us[1], d.exec_to_replay_us[2],
                d.exec_to_first_start_us[0], d.exec_to_first_start_us[1],
                d.exec_to_first_request_us[0], d.exec_to_first_request_us[1], d.exec_to_first_request_us[2],
                d.start_to_first_request_us[0], d.start_to_first_request_us[1], d.start_to_first_request_us[2],
                d.events, d.drops
            );
            for s in &d.sessions {
                println!(
                    "  launch in progress: pid {} {} ({}, {} requests, {:.1} s)",
                    s.pid, s.profile, s.mode, s.requests, s.age_s
                );
            }
            let f = &d.foresight;
            let predicted: Vec<String> = f
                .predictions
                .iter()
                .map(|p| {
                    format!(
                        "{} next {:.2}{}{}",
                        p.profile,
                        p.score,
                        p.soon
                            .map_or(String::new(), |s| format!(" before reboot {s:.2}")),
                        if p.preloaded { " (preloaded)" } else { "" }
                    )
                })
                .collect();
            // An older daemon says nothing of it.
            if !f.preload_state.is_empty() {
                println!(
                "  ahead of launches: preload {}, {} preloads ({} used, {} unused), precision {}, holding {} of {} MiB; startup window {}, {} startup plans replayed; predicted: {}",
                f.preload_state, f.preloads, f.preloads_used, f.preloads_unused,
                f.precision.map_or("-".to_string(), |p| format!("{:.0}%", p * 100.0)),
                f.held_bytes >> 20, f.budget_bytes >> 20,
                f.startup_window.as_deref().unwrap_or("closed"), f.startup_replays,
                if predicted.is_empty() { "none".to_string() } else { predicted.join(", ") }
            );
            }
            if !d.learn_list.is_empty() {
                println!(
                    "  learn list (`warmstart learn`): {}",
                    d.learn_list.join(", ")
                );
            }
            if let Some(c) = &d.config {
                let globs = |g: &[String]| match g.len() {
                    0 => "none".to_string(),
                    _ => g.join(", "),
                };
                println!(
                    "  policy: learn {}; allow {}; deny {}",
                    match c.learn {
                        warmstart_launch::daemon::LearnMode::All => "all",
                        warmstart_launch::daemon::LearnMode::AllowList => "allow-list",
                    },
                    globs(&c.allow),
                    globs(&c.deny)
                );
            }
        }
    }
    if profiles.is_empty() {
        println!(
            "no profiles in {} yet: launch something with `warmstart run -- CMD`",
            store.root().display()
        );
        return Ok(0);
    }
    println!(
        "{:<32} {:<12} {:>8} {:>8} {:>10}  note",
        "profile", "phase", "launches", "miss", "plan"
    );
    for p in profiles {
        match p {
            Ok(p) => println!(
                "{:<32} {:<12} {:>8} {:>8} {:>10}  {}",
                p.name,
                format!("{:?}", p.phase).to_lowercase(),
                p.launches,
                p.last_miss_ratio
                    .map(|m| format!("{m:.3}"))
                    .unwrap_or_else(|| "-".into()),
                p.plan_bytes.map(human_bytes).unwrap_or_else(|| "-".into()),
                p.note.unwrap_or_default()
            ),
            Err(e @ warmstart_launch::Error::CorruptProfile { .. }) => {
                println!("! {e} (its next launch rebuilds it from its traces and plan)")
            }
            Err(e) => println!("! {e}"),
        }
    }
    metadata.print();
    Ok(0)
}

/// Which path the metadata of the profiles' plans takes on this machine,
/// one entry per device across all plans.
struct StatusMetadata {
    /// Per device: what one plan's check found (with the entries and bytes
    /// of all plans summed), its node, and the profiles whose plans have
    /// metadata on it.
    devices: std::collections::BTreeMap<
        u64,
        (
            warmstart_replay::MetaDevice,
            Option<std::path::PathBuf>,
            Vec<String>,
        ),
    >,
    /// Plans that could not be read, with the first error.
    unreadable: Vec<String>,
}

fn metadata_paths(
    store: &Store,
    profiles: &[Result<warmstart_launch::Profile, warmstart_launch::Error>],
) -> StatusMetadata {
    // One backend: a device refused once is not tried again for each plan.
    let backend = warmstart_replay::RealBackend::new();
    let mut out = StatusMetadata {
        devices: Default::default(),
        unreadable: Vec::new(),
    };
    for p in profiles.iter().flatten().filter(|p| p.plan_bytes.is_some()) {
        let path = store.plan_path(&p.name);
        let plan = crate::cmd::read_container(&path).and_then(|b| {
            warmstart_plan::Plan::from_bytes(&b).with_context(|| path.display().to_string())
        });
        let plan = match plan {
            Ok(plan) => plan,
            Err(e) => {
                out.unreadable.push(format!("{}: {e:#}", p.name));
                continue;
            }
        };
        for (d, node) in super::show::MetadataPaths::of(&plan, &backend).devices {
            let slot = out
                .devices
                .entry(d.device)
                .or_insert_with(|| (d.clone(), node, Vec::new()));
            if slot.2.is_empty() {
                slot.0.planned = Default::default();
            }
            slot.0.planned.entries += d.planned.entries;
            slot.0.planned.bytes = slot.0.planned.bytes.saturating_add(d.planned.bytes);
            slot.2.push(p.name.clone());
        }
    }
    out
}

impl StatusMetadata {
    fn json(&self) -> serde_json::Value {
        let devices: Vec<_> = self
            .devices
            .values()
            .map(|(d, node, profiles)| {
                let mut v = serde_json::to_value(d).expect("serializes");
                if let Some(o) = v.as_object_mut() {
                    // A dry check issues nothing; the plans' own figures are
                    // `planned`.
                    for k in ["requests", "requested_bytes", "ranges"] {
                        o.remove(k);
                    }
                    o.insert("node".into(), serde_json::json!(node));
                    o.insert(
                        "summary".into(),
                        serde_json::json!(super::show::metadata_line(d, node.as_deref())),
                    );
                    o.insert("profiles".into(), serde_json::json!(profiles));
                }
                v
            })
            .collect();
        serde_json::json!({ "devices": devices, "unreadable_plans": self.unreadable })
    }

    fn print(&self) {
        for (d, node, profiles) in self.devices.values() {
            println!(
                "{} [plans of {} profile{}: {} entries, {}]",
                super::show::metadata_line(d, node.as_deref()),
                profiles.len(),
                if profiles.len() == 1 { "" } else { "s" },
                d.planned.entries,
                human_bytes(d.planned.bytes)
            );
        }
        if let Some(first) = self.unreadable.first() {
            println!(
                "! metadata paths unknown for {} plans that cannot be read (first: {first})",
                self.unreadable.len()
            );
        }
    }
}

/// Sends a request to the daemon, with errors that say what to do.
/// The daemon's status, if one answers. One this user may not ask (its
/// socket is root-only) is said, not taken for "no daemon"; the command
/// then goes on with this user's own state.
fn daemon_or_note(socket: &std::path::Path) -> Option<warmstart_launch::daemon::DaemonStatus> {
    warmstart_launch::daemon::query_checked(socket).unwrap_or_else(|e| {
        eprintln!("warmstart: {e}; its profiles are not shown here");
        None
    })
}

pub(super) fn ask_daemon(socket: &std::path::Path, req: &Request) -> Result<Reply> {
    match warmstart_launch::daemon::request(socket, req) {
        Ok(Reply::Error { message }) => anyhow::bail!("the daemon refused: {message}"),
        Ok(r) => Ok(r),
        Err(ControlError::NotRunning(p)) => anyhow::bail!(
            "no warmstart daemon is running (nothing listens on {}): start it with \
             `systemctl start warmstart` or `warmstart daemon`, or give its --socket; \
             `warmstart run -- PROGRAM` learns a program without it",
            p.display()
        ),
        Err(ControlError::PermissionDenied(p)) => anyhow::bail!(
            "permission denied on {}: the daemon's control socket is root-only (its plans \
             reveal which files programs touched); run this as root",
            p.display()
        ),
        Err(e) => Err(e.into()),
    }
}

pub fn forget(args: ForgetArgs) -> Result<i32> {
    // With the daemon running on this state directory, it forgets: a
    // launch it is following would otherwise write the profile back.
    let socket = socket_of(&args.socket);
    if let Some(d) = daemon_or_note(&socket) {
        let same = args.state_dir.as_ref().is_none_or(|s| {
            std::fs::canonicalize(s).ok() == std::fs::canonicalize(&d.state_dir).ok()
        });
        if same {
            let req = Request::Forget {
                names: args.profile.iter().cloned().collect(),
                all: args.all,
            };
            let Reply::Forgot { forgotten, missing } = ask_daemon(&socket, &req)? else {
                anyhow::bail!("the daemon answered something else than what was forgotten");
            };
            for n in &forgotten {
                println!("forgot {n}");
            }
            for n in &missing {
                eprintln!("warmstart: no profile named {n} (see `warmstart status`)");
            }
            return Ok(if missing.is_empty() { 0 } else { 1 });
        }
    }
    let store = store(&args.state_dir)?;
    let names: Vec<String> = if args.all {
        // Unreadable profiles too: `status` tells to remove those this way.
        store.names().context("cannot read the state directory")?
    } else {
        vec![args
            .profile
            .clone()
            .expect("clap requires a profile without --all")]
    };
    let mut missing = false;
    for n in names {
        if store.forget(&n)? {
            println!("forgot {n}");
        } else {
            eprintln!("warmstart: no profile named {n} (see `warmstart status`)");
            missing = true;
        }
    }
    Ok(if missing { 1 } else { 0 })
}

/// Where PROGRAM is: as given if it has a slash (relative to `cwd`), else
/// the first match in PATH, like a shell. Not canonicalized: the profile
/// name keeps the name the user knows.
fn find_program(prog: &str, cwd: &std::path::Path) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |p: &std::path::Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if prog.contains('/') {
        let p = cwd.join(prog);
        return runnable(&p).then_some(p);
    }
    std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|d| cwd.join(d).join(prog))
        .find(|p| runnable(p))
}

pub fn learn(args: LearnArgs) -> Result<i32> {
    let cwd = std::env::current_dir().context("the current directory")?;
    let prog = &args.command[0];
    let found = match find_program(prog, &cwd) {
        Some(f) => f,
        // An entry for a program since uninstalled can still be removed,
        // by the path it was learned as.
        None if args.remove && prog.contains('/') => cwd.join(prog),
        None => {
            anyhow::bail!("{prog}: no such program (not an executable file, nor found in PATH)")
        }
    };
    // The executable the kernel reports at exec: symlinks resolved.
    let exe = match std::fs::canonicalize(&found) {
        Ok(p) => p.display().to_string(),
        Err(_) if args.remove => found.display().to_string(),
        Err(e) => return Err(e).with_context(|| format!("resolving {}", found.display())),
    };
    let mut argv = args.command.clone();
    argv[0] = found.display().to_string();
    if args.remove {
        let req = Request::Unlearn { exe, argv, cwd };
        let Reply::Unlearned {
            key,
            was_listed,
            policy_allows,
        } = ask_daemon(&socket_of(&args.socket), &req)?
        else {
            anyhow::bail!("the daemon answered something else than the learn list");
        };
        match (was_listed, policy_allows) {
            (false, _) => println!("{key} was not on the learn list"),
            (true, true) => {
                println!("{key} is off the learn list; the config's policy still learns it")
            }
            (true, false) => println!(
                "{key} is off the learn list: the daemon no longer learns it (its profiles stay; \
                 `warmstart forget` drops them)"
            ),
        }
        return Ok(if was_listed { 0 } else { 1 });
    }
    if let Some(script) = warmstart_launch::daemon::missing_script(&exe, &argv, &cwd) {
        anyhow::bail!("{script}: no such script for {}", argv[0]);
    }
    let req = Request::Learn { exe, argv, cwd };
    let Reply::Learned {
        key,
        reset,
        nrawseq,
    } = ask_daemon(&socket_of(&args.socket), &req)?
    else {
        anyhow::bail!("the daemon answered something else than what it learns");
    };
    println!("the daemon learns {key}: its next {nrawseq} launches are recorded, then a plan is compiled");
    for n in &reset {
        println!("  profile {n}: back to learning (its traces and plan dropped)");
    }
    Ok(0)
}
