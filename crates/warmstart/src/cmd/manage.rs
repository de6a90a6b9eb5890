//! `warmstart run`, `status` and `forget`: the launch manager's commands.

use anyhow::{Context, Result};
use warmstart_launch::{Config, Store, Strategy, StrategyChoice};

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use warmstart_launch::daemon::DaemonConfig;

use crate::cli::{DaemonArgs, ForgetArgs, RunArgs, StatusArgs, StrategyArg};
use crate::cmd::human_bytes;

pub fn run(args: RunArgs, quiet: bool) -> Result<i32> {
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
        ..Config::default()
    };
    if let Some(w) = args.workers {
        cfg.replay.workers = w.clamp(1, 64);
        cfg.replay.queue_depth = 2 * cfg.replay.workers;
    }
    let (exit, report) = warmstart_launch::run(&args.command, args.profile.as_deref(), &cfg)?;
    if let Some(p) = &args.report {
        std::fs::write(p, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", p.display()))?;
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
    }
    warmstart_record::exit_like(exit)
}

fn store(dir: &Option<std::path::PathBuf>) -> Result<Store> {
    let d = dir
        .clone()
        .unwrap_or_else(warmstart_launch::default_state_dir);
    Ok(Store::open(&d)?)
}

pub fn daemon(args: DaemonArgs) -> Result<i32> {
    let mut cfg = DaemonConfig::load(&args.config)
        .map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
    if let Some(d) = args.state_dir {
        cfg.state_dir = d;
    }
    if let Some(s) = args.socket {
        cfg.socket = s;
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        signal_hook::flag::register(sig, Arc::clone(&stop))?;
    }
    warmstart_launch::daemon::run(&cfg, stop, &mut std::io::stderr())?;
    Ok(0)
}

pub fn status(args: StatusArgs) -> Result<i32> {
    let store = store(&args.state_dir)?;
    let profiles = store.list();
    if let Some(d) = warmstart_launch::daemon::query(&args.socket) {
        if args.json {
            println!("{}", serde_json::to_string(&d)?);
        } else {
            println!(
                "daemon: pid {}, up {:.0} s, {} execs seen, {} learned, {} prefetched, {} ignored; exec->replay p50 {:.0} us, p90 {:.0} us, max {:.0} us; {} events, {} dropped",
                d.pid, d.uptime_s, d.execs_seen, d.launches_learned, d.launches_prefetched, d.ignored,
                d.exec_to_replay_us[0], d.exec_to_replay_us[1], d.exec_to_replay_us[2], d.events, d.drops
            );
        }
    }
    if args.json {
        let v: Vec<_> = profiles
            .iter()
            .map(|p| match p {
                Ok(p) => serde_json::to_value(p).expect("serializes"),
                Err(e) => serde_json::json!({ "error": e.to_string() }),
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(0);
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
            Err(e) => println!("! {e}"),
        }
    }
    Ok(0)
}

pub fn forget(args: ForgetArgs) -> Result<i32> {
    let store = store(&args.state_dir)?;
    let names: Vec<String> = if args.all {
        store
            .list()
            .into_iter()
            .filter_map(|p| p.ok().map(|p| p.name))
            .collect()
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
