//! `warmstart stream`: adaptive runtime prefetching around one command, or
//! attached to a running process tree (`--pid`).

use std::time::Duration;

use anyhow::{Context, Result};
use warmstart_stream::{Options, Report};

use crate::cli::StreamArgs;

pub fn run(args: StreamArgs, quiet: bool) -> Result<i32> {
    anyhow::ensure!(args.interval > 0.0, "--interval must be positive");
    let opts = Options {
        interval: Duration::from_secs_f64(args.interval),
        threshold: args.threshold,
        max_throughput: args.max_throughput.map(|m| m << 20),
        static_scale: args.static_scale,
        ..Options::default()
    };
    let (exit, report) = match (args.pid, args.command.is_empty()) {
        (Some(pid), true) => {
            let report = warmstart_stream::attach(pid, &opts)
                .with_context(|| format!("attaching to process {pid}"))?;
            (None, report)
        }
        (None, false) => {
            let (exit, report) = warmstart_stream::run(&args.command, &opts)?;
            (Some(exit), report)
        }
        _ => anyhow::bail!("give exactly one of --pid PID or -- CMD…"),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    if !quiet {
        eprintln!("warmstart: {}", summary(&report));
    }
    match exit {
        Some(exit) => warmstart_record::exit_like(exit),
        None => Ok(0),
    }
}

fn summary(r: &Report) -> String {
    let mut s = format!(
        "{} pages used, {} prefetched ({} of them used), {} read by the program itself; accuracy {:.0}%, cost {:.2}, final scale {:.2}",
        r.used,
        r.prefetched,
        r.prefetched_used,
        r.app_read,
        r.accuracy * 100.0,
        r.cost,
        r.final_scale
    );
    if r.evicted_unused + r.refaulted > 0 || r.thrashing > 0 {
        s += &format!(
            "; {} prefetched pages evicted unused, {} refaulted, backed off in {} intervals",
            r.evicted_unused, r.refaulted, r.thrashing
        );
    }
    s
}
