//! Runs `warmstart bench` before it is wired into the `warmstart` binary:
//! `cargo run -p warmstart-bench --example bench -- [OPTIONS] -- CMD`.

use clap::Parser;

#[derive(Parser)]
#[command(name = "warmstart-bench")]
struct Cli {
    /// Print less (no progress on stderr).
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
