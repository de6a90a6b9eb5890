//! The `warmstart` command: one module per subcommand under `cmd/`.

mod cli;
mod cmd;

fn main() {
    let cli = cli::Cli::parse_args();
    match cmd::dispatch(cli) {
        Ok(code) => std::process::exit(code),
        Err(err) => {
            eprintln!("warmstart: {err:#}");
            std::process::exit(2);
        }
    }
}
