//! `warmstart stream`: adaptive runtime prefetching around one command.

use std::time::Duration;

use anyhow::Result;
use warmstart_stream::Options;

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
    let (exit, report) = warmstart_stream::run(&args.command, &opts)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    if !quiet {
        eprintln!(
            "warmstart: {} pages used, {} prefetched ({} of them used), {} read by the program itself; accuracy {:.0}%, cost {:.2}, final scale {:.2}",
            report.used,
            report.prefetched,
            report.prefetched_used,
            report.app_read,
            report.accuracy * 100.0,
            report.cost,
            report.final_scale
        );
    }
    warmstart_record::exit_like(exit)
}
