//! Command-line interface. The doc comments are the `--help` text.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "warmstart",
    version,
    about = "Make cold application launches as fast as warm ones.",
    long_about = "warmstart learns which file pages and filesystem metadata a program reads while it \
starts, stores that as a compact plan, and replays the plan alongside later launches so storage I/O \
overlaps the program's CPU work.",
    after_help = "EXAMPLES:\n  \
    warmstart record -o py.trace -- python3 -c 'import json, email'\n  \
    warmstart show py.trace\n  \
    warmstart show py.trace --format json | jq '.files[0]'"
)]
pub struct Cli {
    /// Print less (no progress or summaries on stderr).
    #[arg(short, long, global = true)]
    pub quiet: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Record one launch of a command: the pages, metadata and lookups it reads.
    #[command(after_help = "EXAMPLES:\n  \
        warmstart record -o app.trace -- libreoffice --headless --convert-to pdf a.odt\n  \
        warmstart record --cold --from app.trace -o cold.trace -- gimp   # evict its files first\n  \
        warmstart record --backend tracefs -o t.trace -- python3 -c 'import numpy'\n\n\
        The command runs transparently: its output, exit status and signals are its own.\n\
        Recording stops when its process tree exits, after --idle seconds without I/O, or at --timeout.")]
    Record(RecordArgs),
    /// Show a trace or plan: a summary, or the contents as table, JSON or CSV.
    #[command(after_help = "EXAMPLES:\n  \
        warmstart show app.trace\n  \
        warmstart show app.trace --format table\n  \
        warmstart show app.trace --format json > app.json\n  \
        warmstart show app.trace --format csv | sort -t, -k4 -n")]
    Show(ShowArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    /// Best available: bpf, then tracefs, then mincore.
    Auto,
    /// eBPF on tracepoints (root or CAP_BPF+CAP_PERFMON).
    Bpf,
    /// Tracefs text events (root), when BPF cannot load.
    Tracefs,
    /// Residency snapshot of the files the command opened (no privileges; unordered).
    Mincore,
}

#[derive(Debug, clap::Args)]
pub struct RecordArgs {
    /// Where to write the trace.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Evict the command's files before recording (known from --from, or all
    /// caches with --drop-caches), so the trace shows what a cold launch reads.
    #[arg(long, conflicts_with = "warm")]
    pub cold: bool,
    /// Record with whatever is cached now (the default).
    #[arg(long)]
    pub warm: bool,
    /// A previous trace of this command: its files are the ones --cold evicts.
    #[arg(long, requires = "cold")]
    pub from: Option<PathBuf>,
    /// With --cold: drop the whole system's page cache (slows everything else).
    #[arg(long, requires = "cold")]
    pub drop_caches: bool,
    /// Stop recording after this many seconds without I/O (FAST's T_idle).
    #[arg(long, default_value_t = 2.0, value_name = "S")]
    pub idle: f64,
    /// Stop recording after this many seconds in any case (FAST's T_timeout).
    #[arg(long, default_value_t = 30.0, value_name = "S")]
    pub timeout: f64,
    /// Event source.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// A short summary.
    Summary,
    /// Every file and range, aligned.
    Table,
    /// The full contents (a stable, public interface).
    Json,
    /// One row per range.
    Csv,
}

#[derive(Debug, clap::Args)]
pub struct ShowArgs {
    /// A trace (from `record`) or a plan (from `compile`).
    pub file: PathBuf,
    #[arg(short, long, value_enum, default_value_t = Format::Summary)]
    pub format: Format,
}
