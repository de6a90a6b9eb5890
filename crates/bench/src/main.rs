//! `warmstart-bench`: the benchmark harness as a binary of its own, so that
//! the product binary (`warmstart`, itself read from a cold disk before every
//! launch it wraps) carries neither the harness nor its plotting, progress,
//! CSV and regex code. `warmstart bench ARGS…` executes `warmstart-bench
//! ARGS…`; both spellings take the same options.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "warmstart-bench",
    version,
    about = "Measure launch times like the papers: cold, warm, peers and warmstart, side by side."
)]
struct Cli {
    /// Print less (no progress or summaries on stderr).
    #[arg(short, long)]
    quiet: bool,
    #[command(flatten)]
    args: warmstart_bench::BenchArgs,
}

fn main() {
    let cli = Cli::parse();
    match warmstart_bench::run(cli.args, cli.quiet) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("warmstart bench: {e:#}");
            std::process::exit(2);
        }
    }
}
