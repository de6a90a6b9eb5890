//! One module per subcommand. Each returns the process exit code.

pub(crate) mod bench;
mod compile;
mod generate;
pub(crate) mod manage;
mod portable;
mod record;
mod registry_lookup;
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
        Command::Bench(args) => bench::run(args, cli.quiet),
        Command::Forget(args) => manage::forget(args),
        Command::Learn(args) => manage::learn(args),
        Command::Export(args) => portable::export(args, cli.quiet),
        Command::Import(args) => portable::import(args, cli.quiet),
        Command::Push(args) => portable::push(args, cli.quiet),
        Command::Pull(args) => portable::pull(args, cli.quiet),
        Command::Changed(args) => portable::changed(args, cli.quiet),
        Command::Generate(args) => generate::run(args),
    }
}

/// Opens a trace or plan file for reading, refusing anything but a
/// regular file. Non-blocking, so that opening a FIFO does not wait for a
/// writer; that changes nothing for a regular file.
pub fn open_container(path: &std::path::Path) -> Result<(std::fs::File, std::fs::Metadata)> {
    use anyhow::Context;
    use std::os::unix::fs::OpenOptionsExt;
    let what = || format!("reading {}", path.display());
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .with_context(what)?;
    let md = f.metadata().with_context(what)?;
    anyhow::ensure!(
        md.is_file(),
        "{} is not a regular file (a trace or plan is one)",
        path.display()
    );
    Ok((f, md))
}

/// Reads a trace or plan. Only a regular file, and only once its first
/// bytes are a warmstart magic: a FIFO would block, and `/dev/zero` or a
/// large unrelated file would be read whole into memory before the decoder
/// could say what it is not. Decoding reports everything else.
pub fn read_container(path: &std::path::Path) -> Result<Vec<u8>> {
    use anyhow::Context;
    use std::io::Read;
    /// Far beyond any real trace or plan.
    const MAX: u64 = 1 << 30;
    let what = || format!("reading {}", path.display());
    let (mut f, md) = open_container(path)?;
    let mut bytes = Vec::new();
    (&mut f)
        .take(8)
        .read_to_end(&mut bytes)
        .with_context(what)?;
    if !warmstart_plan::container::is_magic(&bytes) {
        // Let the decoder say what it is not.
        return Ok(bytes);
    }
    anyhow::ensure!(
        md.len() <= MAX,
        "{} is {} bytes, larger than any trace or plan",
        path.display(),
        md.len()
    );
    f.read_to_end(&mut bytes).with_context(what)?;
    Ok(bytes)
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
