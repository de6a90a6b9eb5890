//! One module per subcommand. Each returns the process exit code.

mod compile;
mod manage;
mod record;
mod replay;
mod show;
mod stream;

use anyhow::Result;

use crate::cli::{Cli, Command};

pub fn dispatch(cli: Cli) -> Result<i32> {
    match cli.command {
        Command::Record(args) => record::run(args, cli.quiet),
        Command::Show(args) => show::run(args),
        Command::Compile(args) => compile::run(args, cli.quiet),
        Command::Replay(args) => replay::run(args, cli.quiet),
        Command::Run(args) => manage::run(args, cli.quiet),
        Command::Status(args) => manage::status(args),
        Command::Daemon(args) => manage::daemon(args),
        Command::Stream(args) => stream::run(args, cli.quiet),
        Command::Bench(args) => warmstart_bench::run(*args, cli.quiet),
        Command::Forget(args) => manage::forget(args),
        Command::Learn(args) => manage::learn(args),
    }
}

/// Human-readable byte counts for summaries.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}
