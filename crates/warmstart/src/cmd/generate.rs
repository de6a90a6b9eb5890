//! `warmstart generate man|completions DIR`: the manual and shell
//! completions, generated from the same clap definitions as `--help`, so
//! they never drift from it (the Debian package builds them this way).

use anyhow::{Context, Result};
use clap::CommandFactory;
use clap_complete::Shell;

use crate::cli::{Cli, GenerateArgs, Generated};

pub fn run(args: GenerateArgs) -> Result<i32> {
    let dir = &args.dir;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let cmd = Cli::command();
    match args.what {
        Generated::Man => clap_mangen::generate_to(cmd, dir)
            .with_context(|| format!("writing man pages to {}", dir.display()))?,
        Generated::Completions => {
            for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
                clap_complete::generate_to(shell, &mut Cli::command(), "warmstart", dir)
                    .with_context(|| format!("writing {shell} completions to {}", dir.display()))?;
            }
        }
    }
    Ok(0)
}
