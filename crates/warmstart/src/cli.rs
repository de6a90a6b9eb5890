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
    warmstart run -- libreoffice --writer        # learns on first launches, prefetches later\n  \
    warmstart status                             # what has been learned\n  \
    warmstart record -o py.trace -- python3 -c 'import json, email'\n  \
    warmstart compile py.trace -o py.plan && warmstart replay --wait py.plan\n  \
    warmstart show py.trace --format json | jq '.files[0]'"
)]
pub struct Cli {
    /// Print less (no progress or summaries on stderr).
    #[arg(short, long, global = true)]
    pub quiet: bool,
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// Parses the command line. `warmstart run` is on every launch's path,
    /// so it is parsed with its own definition alone: building all eleven
    /// subcommands took 0.4 ms, a fifth of a warm launch's 2 ms budget.
    pub fn parse_args() -> Cli {
        Cli::parse_front().unwrap_or_else(Cli::parse)
    }

    /// The two commands the front binary parses itself: `bench`, handed
    /// to `warmstart-bench`, and `run`. `None` for every other command.
    pub fn parse_front() -> Option<Cli> {
        if let Some(cli) = bench_handover(std::env::args_os().skip(1)) {
            return Some(cli);
        }
        let mut args = std::env::args_os();
        let argv0 = args.next().unwrap_or_default();
        let mut args = args.peekable();
        // `warmstart -q run …`: the global option before the command.
        let mut quiet = false;
        while args.peek().is_some_and(|a| a == "-q" || a == "--quiet") {
            quiet = true;
            args.next();
        }
        if args.next().is_some_and(|a| a == "run") {
            let one = RunOnly::parse_from(std::iter::once(argv0).chain(args));
            return Some(Cli {
                quiet: quiet || one.quiet,
                command: Command::Run(one.args),
            });
        }
        None
    }
}

/// `warmstart [-q] bench ARGS…` and `warmstart help bench`, taken before
/// clap sees them: every argument after `bench` belongs to
/// `warmstart-bench`, `--help` and `--version` included, whatever it looks
/// like.
fn bench_handover(args: impl Iterator<Item = std::ffi::OsString>) -> Option<Cli> {
    let mut args = args.peekable();
    let mut quiet = false;
    while args.peek().is_some_and(|a| a == "-q" || a == "--quiet") {
        quiet = true;
        args.next();
    }
    let sub = args.next()?;
    let args: Vec<_> = if sub == "bench" {
        args.collect()
    } else if sub == "help" && args.peek().is_some_and(|a| a == "bench") {
        vec!["--help".into()]
    } else {
        return None;
    };
    Some(Cli {
        quiet,
        command: Command::Bench(BenchArgs { args }),
    })
}

// `warmstart run` alone, for `Cli::parse_args`; its help is the same.
#[derive(Debug, Parser)]
#[command(
    name = "warmstart run",
    bin_name = "warmstart run",
    about = "Launch a command through the launch manager: learn, then prefetch"
)]
struct RunOnly {
    #[command(flatten)]
    args: RunArgs,
    /// Print less (no progress or summaries on stderr).
    #[arg(short, long)]
    quiet: bool,
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
    /// Compile one or more traces of a launch into a plan.
    #[command(after_help = "EXAMPLES:\n  \
        warmstart compile a.trace b.trace -o app.plan          # keep what both launches read\n  \
        warmstart compile *.trace --min-traces 2 -o app.plan   # ... at least two of them\n  \
        warmstart compile a.trace --sorted -o hdd.plan         # physical order, for rotational disks\n  \
        warmstart compile a.trace --merge-gap 0 --metadata-shift 0 --no-lookups -o fast.plan")]
    Compile(CompileArgs),
    /// Prefetch a plan now (alone, or beside a launch you start yourself).
    #[command(after_help = "EXAMPLES:\n  \
        warmstart replay app.plan & app           # prefetch alongside a launch\n  \
        warmstart replay --wait app.plan          # until resident: the papers' prefetch-only time\n  \
        warmstart replay --json --ioprio idle app.plan")]
    Replay(ReplayArgs),
    /// Launch a command through the launch manager: learn, then prefetch.
    #[command(after_help = "EXAMPLES:\n  \
        warmstart run -- python3 -c 'import email'      # learn, then prefetch\n  \
        warmstart run -v --breakdown -- python3 -c 'import email'   # where this launch waited\n  \
        warmstart run --breakdown --report launch.json -- javac Hello.java")]
    Run(RunArgs),
    /// Automatic mode: learn and prefetch every launch, no wrapper needed.
    #[command(after_help = "EXAMPLES:\n  \
        warmstart daemon                                   # as root; usually run by systemd\n  \
        warmstart daemon --config /etc/warmstart/config.toml\n  \
        systemctl enable --now warmstart                   # after `make install`\n\n\
        Policy lives in /etc/warmstart/config.toml (see docs/reference/config.md). Launches\n\
        with a plan are prefetched from their exec on; others are learned in the background.\n\
        SIGTERM or Ctrl-C stops the daemon; SIGHUP (`systemctl reload warmstart`) reads the\n\
        configuration again.")]
    Daemon(DaemonArgs),
    /// Measure launch times like the papers: cold, warm, peers and warmstart, side by side.
    ///
    /// Runs the `warmstart-bench` binary installed beside `warmstart` (or on
    /// PATH) with the same arguments; `warmstart bench --help` shows its options.
    #[command(disable_help_flag = true)]
    Bench(BenchArgs),
    /// Run a command with adaptive runtime prefetching of its data streams (prefetchd).
    #[command(after_help = "EXAMPLES:\n  \
        warmstart stream -- sqlite3 big.db 'select count(*) from t where x like \"%a%\"'\n  \
        warmstart stream --json -- sha256sum huge.iso\n  \
        warmstart stream --pid $(pgrep -o rsync)          # attach to a running program\n\n\
        Sequential, backward and strided reads are detected per process and file every\n\
        --interval; the prefetcher reads ahead at the program's measured rate times a scale\n\
        that feedback adjusts, under the device's measured throughput. Accuracy and cost are\n\
        reported at the end.")]
    Stream(StreamArgs),
    /// List the learned profiles.
    #[command(after_help = "EXAMPLES:\n  warmstart status\n  warmstart status --json")]
    Status(StatusArgs),
    /// Forget a profile: its traces, plan and statistics.
    #[command(after_help = "EXAMPLES:\n  \
        warmstart forget python3-u0-d8f5102e5b09440d089cd2149f7faf33\n  \
        warmstart forget --all\n\n\
        With the daemon running, forgetting goes through it, so a launch it is following\n\
        cannot bring the profile back. Policy is untouched: a program the daemon learns is\n\
        learned again at its next launch (deny it in the config to stop that).")]
    Forget(ForgetArgs),
    /// Ask the daemon to learn a program: learn it even if policy would not, and start over.
    #[command(after_help = "EXAMPLES:\n  \
        warmstart learn gimp                     # gimp is learned afresh from its next launches\n  \
        warmstart learn python3 ~/bin/tool.py    # an interpreter: the script is the program\n  \
        warmstart learn --remove gimp            # back to what the config says\n\n\
        The daemon (`warmstart daemon`, root) must be running; this does not start PROGRAM.\n\
        PROGRAM goes on the daemon's learn list (kept across restarts, shown by `warmstart\n\
        status`), which adds to the config's `allow`, so it is learned even with\n\
        learn = \"allow-list\"; the config's `deny` still wins. Every profile of PROGRAM goes\n\
        back to learning: its next launches (2) are recorded and a new plan is compiled.\n\
        For interpreters (python3, sh, perl, java, ...) the program is the script, as in the\n\
        daemon's policy. Options go before PROGRAM.")]
    Learn(LearnArgs),
    /// Export a profile's plan for other machines with the same files.
    #[command(after_help = "EXAMPLES:\n  \
        warmstart export gimp-u0-9d2c0e7a41b35f68c1e0a7d4b2f95e13 -o gimp.wsplan\n  \
        zcat gimp.wsplan | jq '.files[] | .path'    # what it makes machines read\n\n\
        Files are named by path, size and a SHA-256 of the bytes the plan reads (not by\n\
        inode), so the plan holds on every machine with the same files. Metadata block\n\
        reads are left out: they are where this machine's file system put them.")]
    Export(ExportArgs),
    /// Import an exported plan: used from the next launch, with no learning launches.
    #[command(after_help = "EXAMPLES:\n  \
        warmstart import gimp.wsplan\n  \
        warmstart import --name gimp-local gimp.wsplan\n\n\
        Every file is checked against this machine's: a file that is missing, of another\n\
        size, or whose bytes the plan reads differ is dropped with its entries and named.\n\
        The rest is bound to the local files, so `warmstart run` and the daemon prefetch\n\
        it from the first launch; misses are still audited and the profile relearned if\n\
        the plan does not fit. With the daemon running, it is told to read the profile.")]
    Import(ImportArgs),
    /// Push a profile's plan to an OCI registry.
    #[command(after_help = "EXAMPLES:\n  \
        warmstart push gimp-u0-9d2c0e7a41b35f68c1e0a7d4b2f95e13 registry.example/warmstart/gimp:2.10\n  \
        oras manifest fetch registry.example/warmstart/gimp:2.10\n\n\
        Stored as an OCI artifact (artifactType application/vnd.warmstart.plan.v1, one layer\n\
        application/vnd.warmstart.plan.v1+gzip). Prints the manifest digest to pin pulls with.\n\
        It is also tagged sha256-KEY, KEY from the executable's bytes and the arguments, so\n\
        that `warmstart pull REPOSITORY -- CMD` finds it on machines with the same program.\n\
        Credentials come from $REGISTRY_AUTH_FILE, $XDG_RUNTIME_DIR/containers/auth.json or\n\
        ~/.docker/config.json (`podman login`, `docker login`). Loopback registries are\n\
        spoken to over plain HTTP, others over HTTPS.")]
    Push(PushArgs),
    /// Pull a plan from an OCI registry and import it.
    #[command(after_help = "EXAMPLES:\n  \
        warmstart pull registry.example/warmstart/gimp:2.10\n  \
        warmstart pull registry.example/warmstart/gimp@sha256:3f1c...   # pinned\n  \
        warmstart pull registry.example/warmstart/plans -- gimp          # by the program's content\n\n\
        The plan is data: size-capped, validated, and used only for files that pass this\n\
        machine's identity check, as with `warmstart import`.")]
    Pull(PullArgs),
    /// Check every profile's files and send those whose files changed back to learning.
    #[command(after_help = "EXAMPLES:\n  \
        warmstart changed          # after upgrading packages (the Debian package runs it)\n  \
        warmstart changed --dry-run\n\n\
        A profile keeps prefetching the files that did not change while its next launches\n\
        are recorded. With the daemon running, it does the relearning.")]
    Changed(ChangedArgs),
    /// Write man pages or shell completions (for packaging).
    #[command(hide = true)]
    Generate(GenerateArgs),
}

#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// The profile to export (see `warmstart status`).
    pub profile: String,
    /// Where to write the portable plan.
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
    /// The state directory [default: the daemon's, else `state_dir` of the config for root, else the user's].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

/// Where an imported or pulled plan goes.
#[derive(Debug, clap::Args)]
pub struct ImportTarget {
    /// The profile to write [default: the one the plan was exported from].
    #[arg(long, value_name = "PROFILE")]
    pub name: Option<String>,
    /// Replace an existing profile of that name.
    #[arg(long)]
    pub force: bool,
    /// The state directory [default: the daemon's, else `state_dir` of the config for root, else the user's].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// The daemon's control socket [default: `socket` of /etc/warmstart/config.toml, else /run/warmstart/warmstart.sock].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct ImportArgs {
    /// A file written by `warmstart export`.
    pub file: PathBuf,
    #[command(flatten)]
    pub target: ImportTarget,
}

/// How to reach a registry.
#[derive(Debug, clap::Args)]
pub struct RegistryArgs {
    /// Give up on a registry request after this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    pub timeout: u64,
    /// Speak plain HTTP to a registry that is not on loopback.
    #[arg(long)]
    pub plain_http: bool,
}

#[derive(Debug, clap::Args)]
pub struct PushArgs {
    /// The profile to push.
    pub profile: String,
    /// `[REGISTRY/]REPOSITORY[:TAG]` (TAG defaults to `latest`).
    pub reference: String,
    /// The state directory [default: the daemon's, else `state_dir` of the config for root, else the user's].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

#[derive(Debug, clap::Args)]
pub struct PullArgs {
    /// `[REGISTRY/]REPOSITORY[:TAG][@sha256:DIGEST]`.
    pub reference: String,
    /// Save the plan to FILE instead of importing it.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub target: ImportTarget,
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// Find the plan for this command by content: REFERENCE is then a
    /// repository, and the tag is the one `push` adds from the
    /// executable's digest and the arguments.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct ChangedArgs {
    /// Only say which profiles' files changed.
    #[arg(long)]
    pub dry_run: bool,
    /// The state directory [default: the daemon's, else `state_dir` of the config for root, else the user's].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// The daemon's control socket [default: `socket` of /etc/warmstart/config.toml, else /run/warmstart/warmstart.sock].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Generated {
    /// Man pages, one per subcommand (`warmstart.1`, `warmstart-run.1`, ...).
    Man,
    /// bash, zsh and fish completions.
    Completions,
}

#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    pub what: Generated,
    /// The directory to write into (created).
    pub dir: PathBuf,
}

/// `warmstart bench`: everything is `warmstart-bench`'s to parse.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Options and command for warmstart-bench (see `warmstart bench --help`).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        num_args = 0..,
        value_name = "ARGS"
    )]
    pub args: Vec<std::ffi::OsString>,
}

#[derive(Debug, clap::Args)]
pub struct CompileArgs {
    /// Traces of the same launch, oldest first.
    #[arg(required = true)]
    pub traces: Vec<PathBuf>,
    /// Where to write the plan.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Keep what appears in at least K traces (default: all of them).
    #[arg(long, value_name = "K")]
    pub min_traces: Option<u32>,
    /// Range merge: read holes up to this many bytes to join ranges of a file.
    #[arg(long, value_name = "BYTES", default_value_t = warmstart_plan::compile::DEFAULT_MERGE_GAP)]
    pub merge_gap: u64,
    /// Range merge: only join ranges at most this many schedule positions apart.
    #[arg(long, value_name = "N", default_value_t = warmstart_plan::compile::DEFAULT_MERGE_DISTANCE)]
    pub merge_distance: u32,
    /// Metadata shift: move metadata ahead past up to this many bytes of data (0: off).
    #[arg(long, value_name = "BYTES", default_value_t = warmstart_plan::compile::DEFAULT_METADATA_SHIFT)]
    pub metadata_shift: u64,
    /// Physical (FIEMAP) order, for rotational disks.
    #[arg(long)]
    pub sorted: bool,
    /// Leave out path lookups.
    #[arg(long)]
    pub no_lookups: bool,
    /// Also read the pages the kernel read ahead that no launch used (left out by default: they compete with the launch).
    #[arg(long)]
    pub keep_unused: bool,
    /// Launches reading less than this get an empty plan.
    #[arg(long, value_name = "BYTES", default_value_t = warmstart_plan::compile::DEFAULT_MIN_LAUNCH_BYTES)]
    pub min_launch_bytes: u64,
    /// Never prefetch under this path prefix (repeatable).
    #[arg(long, value_name = "PATH")]
    pub exclude: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// The plan to replay (from `compile`, or a profile's `plan`).
    pub plan: PathBuf,
    /// Wait until the data is resident (the papers' prefetch-only time), at most 30 s;
    /// gives up sooner on pages that stay absent for 5 s without progress.
    #[arg(long)]
    pub wait: bool,
    /// Worker threads issuing requests, 1 to 64 [default: one, and a spare while an open waits on the disk, when the plan's metadata is read from its block devices and the replay is not waited for; else 8].
    #[arg(long)]
    pub workers: Option<usize>,
    /// I/O priority of the replay: idle, or be:0..7.
    #[arg(long, value_name = "PRIO")]
    pub ioprio: Option<String>,
    /// Stop when MemAvailable would fall below this many MiB; 0 turns the guard off [default: 5% of RAM, at least 256 MiB].
    #[arg(long, value_name = "MIB")]
    pub memory_floor: Option<u64>,
    /// CPUs the replay runs on: one (the last CPU, leaving the others to applications), all, idle (any CPU nothing else wants: idle scheduling priority), or a list such as 0,2-3.
    #[arg(long, value_name = "CPUS", default_value = "one")]
    pub cpus: warmstart_replay::ReplayCpus,
    /// Largest request in KiB (below the device's read-ahead size).
    #[arg(long, value_name = "KIB", default_value_t = warmstart_replay::Options::DEFAULT_MAX_REQUEST / 1024)]
    pub max_request: u64,
    /// Print the full report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Launch a command through the launch manager: learn, then prefetch.
#[derive(Debug, clap::Args)]
#[command(after_help = "EXAMPLES:\n  \
    warmstart run -- gimp\n  \
    warmstart run --profile writer -- libreoffice --writer\n  \
    warmstart run --audit -v -- python3 -c 'import numpy'   # exact miss ratio from the recorder\n\n\
    The first launches (--nrawseq, default 2) are recorded; then a plan is compiled and every\n\
    later launch is prefetched. A miss ratio above --rmiss or changed files send it back to\n\
    learning. The command's exit status, signals, terminal and environment are its own.")]
pub struct RunArgs {
    /// Profile name (default: from the resolved executable and arguments).
    #[arg(long)]
    pub profile: Option<String>,
    /// State directory (default: /var/lib/warmstart for root, else $XDG_STATE_HOME/warmstart).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Launches recorded before the first plan (FAST's N_rawseq).
    #[arg(long, default_value_t = 2)]
    pub nrawseq: u32,
    /// Relearn when the miss ratio is above this (FAST's R_miss).
    #[arg(long, default_value_t = 0.1, value_parser = non_negative)]
    pub rmiss: f64,
    /// concurrent (flash), sorted (rotational: app held until the prefetch completes), or auto (measured).
    #[arg(long, value_enum, default_value_t = StrategyArg::Auto)]
    pub strategy: StrategyArg,
    /// Audit prefetched launches with the recorder: exact miss ratio (costs a BPF load per launch).
    #[arg(long)]
    pub audit: bool,
    /// Replay worker threads, 1 to 64 [default: one, and a spare while an open waits on the disk, when the plan's metadata is read from its block devices; else 8].
    #[arg(long)]
    pub workers: Option<usize>,
    /// CPUs the replay runs on: one (the last CPU, leaving the others to the application), all, idle (any CPU nothing else wants: idle scheduling priority; for launches that keep every CPU busy, such as a JVM's), or a list such as 0,2-3.
    #[arg(long, value_name = "CPUS", default_value = "one")]
    pub replay_cpus: warmstart_replay::ReplayCpus,
    /// Print what the launch manager did, on stderr (--report writes it as JSON).
    #[arg(short, long)]
    pub verbose: bool,
    /// Write the launch report as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// Break a prefetched launch down: every page it touched by who read it (resident, prefetched, late, missed, not-in-plan) and how long it waited, and the pages it waited on longest with when the replay issued them. Implies --audit; adds a second BPF tracer. Printed with -v or without --report; in the report as `breakdown`.
    #[arg(long)]
    pub breakdown: bool,
    /// The command to launch and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<std::ffi::OsString>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StrategyArg {
    Auto,
    Concurrent,
    Sorted,
}

#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("target").required(true).args(["pid", "command"]))]
pub struct StreamArgs {
    /// Polling interval in seconds (prefetchd's default 0.5).
    #[arg(long, default_value_t = 0.5, value_name = "S", value_parser = seconds)]
    pub interval: f64,
    /// Share of a process's reads that must fit a pattern to prefetch.
    #[arg(long, default_value_t = 0.6, value_parser = ratio)]
    pub threshold: f64,
    /// Device read ceiling in MB/s (default: measured).
    #[arg(long, value_name = "MBPS")]
    pub max_throughput: Option<u64>,
    /// No feedback: always prefetch this many times the program's rate
    /// (the static aggressive prefetcher, for comparison).
    #[arg(long, value_name = "SCALE", value_parser = positive)]
    pub static_scale: Option<f64>,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Attach to this running process and its children instead of starting
    /// a command; stops when it exits or on Ctrl-C, then reports.
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,
    /// The command to run (or use --pid).
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<std::ffi::OsString>,
}

#[derive(Debug, clap::Args)]
pub struct DaemonArgs {
    /// Policy file (missing: defaults).
    #[arg(
        long,
        value_name = "FILE",
        default_value = "/etc/warmstart/config.toml"
    )]
    pub config: PathBuf,
    /// Overrides the config's state directory.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Overrides the config's control socket.
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// The state directory to list [default: the daemon's, else `state_dir` of the config for root, else the user's].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// The daemon's control socket [default: `socket` of /etc/warmstart/config.toml, else /run/warmstart/warmstart.sock].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Print one JSON document: `{"daemon": STATUS or null, "profiles": [...], "metadata": {"devices": [...], "unreadable_plans": [...]}}`.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct ForgetArgs {
    /// Profile to forget (see `warmstart status`).
    #[arg(required_unless_present = "all")]
    pub profile: Option<String>,
    /// Forget every profile.
    #[arg(long)]
    pub all: bool,
    /// The state directory [default: the daemon's, else `state_dir` of the config for root, else the user's].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// The daemon's control socket [default: `socket` of /etc/warmstart/config.toml, else /run/warmstart/warmstart.sock].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct LearnArgs {
    /// Take PROGRAM off the daemon's learn list instead (its profiles stay).
    #[arg(long)]
    pub remove: bool,
    /// The daemon's control socket [default: `socket` of /etc/warmstart/config.toml, else /run/warmstart/warmstart.sock].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// The program (looked up in PATH) and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM"
    )]
    pub command: Vec<String>,
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
    #[arg(long, default_value_t = 2.0, value_name = "S", value_parser = seconds)]
    pub idle: f64,
    /// Stop recording after this many seconds in any case (FAST's T_timeout).
    #[arg(long, default_value_t = 30.0, value_name = "S", value_parser = seconds)]
    pub timeout: f64,
    /// Event source.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<std::ffi::OsString>,
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

/// A number of seconds: finite, above 0, at most a million (11 days).
fn seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 1e6 => Ok(v),
        Ok(_) => Err("expected seconds above 0 and at most 1000000".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// A share between 0 and 1.
fn ratio(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        Ok(_) => Err("expected a share from 0 to 1".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// A finite number above 0.
fn positive(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        Ok(_) => Err("expected a finite number above 0".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// A finite number, 0 or more.
fn non_negative(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        Ok(_) => Err("expected a finite number, 0 or more".into()),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handover(args: &[&str]) -> Option<(bool, Vec<String>)> {
        bench_handover(args.iter().map(std::ffi::OsString::from)).map(|c| match c.command {
            Command::Bench(b) => (
                c.quiet,
                b.args
                    .iter()
                    .map(|a| a.to_string_lossy().into_owned())
                    .collect(),
            ),
            other => panic!("{other:?}"),
        })
    }

    #[test]
    fn bench_arguments_are_all_handed_over() {
        assert_eq!(
            handover(&["bench", "--help"]),
            Some((false, vec!["--help".into()]))
        );
        assert_eq!(
            handover(&["-q", "--quiet", "bench", "--runs", "3", "--", "ls", "-q"]),
            Some((
                true,
                ["--runs", "3", "--", "ls", "-q"].map(String::from).to_vec()
            ))
        );
        assert_eq!(handover(&["bench"]), Some((false, vec![])));
        assert_eq!(
            handover(&["help", "bench"]),
            Some((false, vec!["--help".into()]))
        );
        assert_eq!(handover(&["help"]), None);
        assert_eq!(handover(&["run", "--", "bench"]), None);
        assert_eq!(handover(&["-v", "bench"]), None);
        assert_eq!(handover(&[]), None);
    }

    #[test]
    fn clap_alone_also_keeps_bench_arguments_raw() {
        let c = Cli::try_parse_from(["warmstart", "bench", "--runs", "2", "--help"]).unwrap();
        let Command::Bench(b) = c.command else {
            panic!("{c:?}")
        };
        assert_eq!(b.args, ["--runs", "2", "--help"]);
    }
}
