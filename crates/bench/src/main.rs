//! `warmstart-bench`: the benchmark harness as a binary of its own, so that
//! the product binary (`warmstart`, itself read from a cold disk before every
//! launch it wraps) carries neither the harness nor its plotting, progress,
//! CSV and regex code. `warmstart bench ARGS…` executes `warmstart-bench
//! ARGS…`; both spellings take the same options.
//!
//! `warmstart-bench [OPTIONS] -- CMD` (or `--suite FILE`) measures launches;
//! `warmstart-bench usage …` replays a usage log across simulated boots.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "warmstart-bench",
    version,
    about = "Measure launch times like the papers: cold, warm, peers and warmstart, side by side.",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Cli {
    /// Print less (no progress or summaries on stderr).
    #[arg(short, long, global = true)]
    quiet: bool,
    #[command(subcommand)]
    sub: Option<Sub>,
    #[command(flatten)]
    args: warmstart_bench::BenchArgs,
}

#[derive(Subcommand)]
enum Sub {
    /// Replay a usage log across simulated boots: no prefetcher, the
    /// daemon with and without startup plans, prediction and preloads,
    /// Debian's preload, and warm, side by side.
    Usage(warmstart_bench::usage::UsageArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.sub {
        Some(Sub::Usage(a)) => warmstart_bench::usage::run(a, cli.quiet),
        None => warmstart_bench::run(cli.args, cli.quiet),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("warmstart bench: {e:#}");
            std::process::exit(2);
        }
    }
}
