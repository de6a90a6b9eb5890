//! The `warmstart` command: one module per subcommand under `cmd/`.

mod cli;
mod cmd;

use clap::Parser;

fn main() {
    let cli = cli::Cli::parse();
    match cmd::dispatch(cli) {
        Ok(code) => std::process::exit(code),
        Err(err) => {
            eprintln!("warmstart: {err:#}");
            std::process::exit(2);
        }
    }
}
