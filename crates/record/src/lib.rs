//! Recording a launch: start the command held, attach an event source to
//! its process tree, release it, and turn the events into a
//! [`warmstart_plan::Trace`] when the tree exits, goes idle, or times out.

pub mod breakdown;
pub mod evict;
pub mod kallsyms;
pub mod procscan;
pub mod resolve;
pub mod source;
pub mod spawn;
pub mod waits;

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use warmstart_bpf::{Event, PathOpKind};
use warmstart_plan::trace::{
    Access, CacheState, EndReason, NamespaceOp, NsOpKind, Trace, TraceBuilder, TraceMeta,
    TraceStats,
};

pub use source::BackendChoice;
pub use spawn::{argv_text, exec_in_place, exit_like, Exit, HeldChild, Running, SignalForwarder};

use resolve::{Class, Classifier, Resolver};

/// Why a recording failed. Each message names what is missing or wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Bpf(#[from] warmstart_bpf::Error),
    #[error("tracefs backend unavailable: {0}")]
    Tracefs(String),
    #[error("cannot start {cmd:?}: {source}")]
    Spawn {
        cmd: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// For a command that could not be started, the status a shell
    /// reports: 127 when it was not found, 126 when it was found but could
    /// not be run. `None` for the other errors.
    pub fn shell_code(&self) -> Option<i32> {
        match self {
            Error::Spawn { source, .. } => Some(spawn::shell_code(source)),
            _ => None,
        }
    }
}

/// How to record.
#[derive(Debug, Clone)]
pub struct Options {
    pub backend: BackendChoice,
    /// Stop after this long without I/O from the tree (FAST's T_idle).
    pub idle: Duration,
    /// Stop after this long in any case (FAST's T_timeout).
    pub timeout: Duration,
    /// The cache state the caller prepared (recorded in the trace).
    pub cache: CacheState,
    /// Keep pages used more than this many ns apart in separate extents
    /// ([`TraceBuilder::split_extents_after`]): for measuring when the
    /// launch uses its data, not for compiling plans.
    pub split_extents_ns: Option<u64>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            backend: BackendChoice::Auto,
            idle: Duration::from_secs(2),
            timeout: Duration::from_secs(30),
            cache: CacheState::AsFound,
            split_extents_ns: None,
        }
    }
}

/// A finished recording. The command may still be running (recording
/// stopped on idle or timeout): [`Recorded::wait`] waits for it.
pub struct Recorded {
    pub trace: Trace,
    /// Why the better backends were not used (Auto only).
    pub fallbacks: Vec<String>,
    running: Running,
    /// Forwards signals to the command while it runs; dropped once it has
    /// exited, so that a signal then stops warmstart itself.
    signals: Option<SignalForwarder>,
    /// The command's exit, if it already happened.
    pub exit: Option<Exit>,
    /// The source failed while the command ran: recording stopped there,
    /// and the trace is incomplete (not to be learned from).
    pub failed: Option<String>,
}

impl Recorded {
    /// Waits for the command (forwarding signals) and returns how it ended.
    pub fn wait(mut self) -> std::io::Result<Exit> {
        if let Some(e) = self.exit {
            return Ok(e);
        }
        loop {
            if let Some(signals) = &mut self.signals {
                signals.forward(&self.running);
            }
            if let Some(e) = self.running.try_wait()? {
                return Ok(e);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Records one launch of `argv`. `on_ready` runs after the source tracks
/// the held child and before it is released to exec (`run` starts the
/// replay there, so the prefetcher is ahead of the application).
///
/// An error other than [`Error::Spawn`] means the command has not run:
/// the recorder could not start, and the caller may run it unrecorded.
/// Once the command runs, a failing source ends the recording early
/// ([`Recorded::failed`]) and the command goes on.
pub fn record<S: AsRef<std::ffi::OsStr>>(
    argv: &[S],
    opts: &Options,
    on_ready: impl FnOnce(u32),
) -> Result<Recorded, Error> {
    let started_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let text = spawn::argv_text(argv);
    // The source first: a recorder that cannot start costs the caller
    // nothing launched, and it can still run the command unrecorded.
    let (mut src, fallbacks) = source::open(opts.backend, warmstart_bpf::Options::default())?;
    let held = HeldChild::spawn(argv).map_err(|source| Error::Spawn {
        cmd: text.join(" "),
        source,
    })?;
    // The held child has run none of the command yet: dropped, it dies.
    src.track(held.pid())?;
    on_ready(held.pid());
    let signals = SignalForwarder::install()?;
    let mut running = held.release().map_err(|source| Error::Spawn {
        cmd: text.join(" "),
        source,
    })?;
    let mut signals = signals;

    let mut agg = Aggregator::new(Path::new("/"), running.pid());
    if let Some(g) = opts.split_extents_ns {
        agg.builder = std::mem::take(&mut agg.builder).split_extents_after(g);
    }
    if src.backend() == warmstart_plan::trace::Backend::Mincore {
        // A snapshot has no exec event to wait for.
        agg.root = None;
    }
    let start = Instant::now();
    let mut last_io = Instant::now();
    let mut buf = Vec::new();
    let mut exit = None;
    let mut interrupted = false;
    let mut failed = None;
    let end = loop {
        if let Err(e) = src.poll(Duration::from_millis(10), &mut buf) {
            failed = Some(e.to_string());
            break EndReason::Interrupted;
        }
        if agg.take(&mut buf) {
            last_io = Instant::now();
        }
        interrupted |= signals.forward(&running);
        if exit.is_none() {
            match running.try_wait() {
                Ok(e) => exit = e,
                Err(e) => {
                    failed = Some(format!("waiting for the command: {e}"));
                    break EndReason::Interrupted;
                }
            }
        }
        if exit.is_some() && agg.tree_done() {
            break EndReason::Exited;
        }
        // The mincore source sees no exits: the direct child's is enough.
        if exit.is_some() && src.backend() == warmstart_plan::trace::Backend::Mincore {
            break EndReason::Exited;
        }
        if interrupted && exit.is_some() {
            break EndReason::Interrupted;
        }
        if last_io.elapsed() >= opts.idle
            && src.backend() != warmstart_plan::trace::Backend::Mincore
        {
            break EndReason::Idle;
        }
        if start.elapsed() >= opts.timeout {
            break EndReason::Timeout;
        }
    };
    // Once the command has exited there is nobody to forward to: drop the
    // forwarder, so SIGINT/SIGTERM while the trace is finished and its
    // files named stop `record` instead of being caught and held.
    let signals = if exit.is_some() {
        drop(signals);
        None
    } else {
        Some(signals)
    };
    if let Err(e) = src.finish(&mut buf) {
        failed.get_or_insert(e.to_string());
    }
    agg.take(&mut buf);
    let stats = TraceStats {
        drops: src.drops(),
        duration_ns: start.elapsed().as_nanos() as u64,
        ..Default::default()
    };
    let meta = TraceMeta {
        command: text,
        cwd: std::env::current_dir()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        backend: src.backend(),
        cache: opts.cache,
        end,
        exit_code: exit.map(Exit::shell_code),
        started_unix_ms,
        hostname: nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_default(),
    };
    drop(src);
    let trace = agg.finish(meta, stats);
    Ok(Recorded {
        trace,
        fallbacks,
        running,
        signals,
        exit,
        failed,
    })
}

/// Turns events into accesses and names as they arrive.
pub struct Aggregator {
    classifier: Classifier,
    resolver: Resolver,
    builder: TraceBuilder,
    cwd: String,
    forked: HashSet<u32>,
    exited: HashSet<u32>,
    events: u64,
    /// The held child runs warmstart's own code until it execs the command;
    /// what it touches before then is not the launch's.
    root: Option<u32>,
    /// The held child's page records until its exec: those of the program
    /// it execs are the launch's (see [`Aggregator::add`]).
    pre_exec: Vec<Event>,
}

/// At most this many page records are held back until the exec.
const PRE_EXEC_MAX: usize = 4096;

impl Aggregator {
    /// `root` is the filesystem root for /sys and /proc (a fixture in tests).
    pub fn new(root: &Path, root_tgid: u32) -> Self {
        Self {
            classifier: Classifier::new(root),
            resolver: Resolver::new(),
            builder: TraceBuilder::new(),
            cwd: std::env::current_dir()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|_| "/".into()),
            forked: HashSet::from([root_tgid]),
            exited: HashSet::new(),
            events: 0,
            root: Some(root_tgid),
            pre_exec: Vec::new(),
        }
    }

    /// For a process found already exec'd (the daemon sees launches at their
    /// exec): nothing before it to drop.
    pub fn already_execed(mut self) -> Self {
        self.root = None;
        self
    }

    /// Every process of the tree has exited.
    pub fn tree_done(&self) -> bool {
        self.forked.iter().all(|p| self.exited.contains(p))
    }

    /// Consumes `buf`; returns whether any of it was I/O.
    pub fn take(&mut self, buf: &mut Vec<Event>) -> bool {
        let mut io = false;
        for ev in buf.drain(..) {
            self.events += 1;
            io |= self.add(ev);
        }
        io
    }

    fn ns(&mut self, t_ns: u64, kind: NsOpKind, path: String, result: i32) {
        self.builder.push_ns(NamespaceOp {
            t_ns,
            kind,
            path: warmstart_plan::path::lexically_clean(&path),
            result,
        });
    }

    fn add(&mut self, ev: Event) -> bool {
        if let Some(root) = self.root {
            match &ev {
                Event::Exec { tgid, file, .. } if *tgid == root => {
                    self.root = None;
                    // The kernel reads the new program while exec'ing it,
                    // before the exec event: its headers, and the page where
                    // its bss starts (zeroed at load). That page is the
                    // launch's first wait: missing from plans, its fault read
                    // 4 MiB of python3.11 around it (read_ahead_kb 8192)
                    // while Python's exec stood still for 12.7 ms.
                    let pre = std::mem::take(&mut self.pre_exec);
                    for e in pre {
                        if matches!(e, Event::Page { dev, ino, .. } if dev == file.dev && ino == file.ino)
                        {
                            self.add(e);
                        }
                    }
                }
                Event::Page { tgid, .. } if *tgid == root => {
                    if self.pre_exec.len() < PRE_EXEC_MAX {
                        self.pre_exec.push(ev);
                    }
                    return false;
                }
                e if e.tgid() == root => return false,
                _ => {}
            }
        }
        match ev {
            Event::Page {
                kind,
                ts_ns,
                dev,
                ino,
                index,
                count,
                ..
            } => {
                let access = match self.classifier.classify(dev as u64, ino) {
                    Class::Data { dev } => Access::Data {
                        t_ns: ts_ns,
                        dev,
                        ino,
                        index,
                        count,
                        from_storage: kind == warmstart_bpf::PageKind::Added,
                    },
                    Class::Meta { device } => Access::Meta {
                        t_ns: ts_ns,
                        device,
                        index,
                        count,
                    },
                };
                self.builder.push(access);
                return true;
            }
            Event::Fork { child_tgid, .. } => {
                self.forked.insert(child_tgid);
            }
            Event::Exit { tgid, .. } => {
                self.exited.insert(tgid);
            }
            // Its exec, if it succeeds, follows as `Exec`.
            Event::ExecStart { .. } => {}
            Event::Exec { ts_ns, file, .. } => {
                if let Some(p) = file.path.absolute() {
                    self.resolver
                        .note(resolve::kdev_to_user(file.dev as u64), file.ino, p.clone());
                    self.resolver.note_exec(p.clone());
                    self.ns(ts_ns, NsOpKind::Exec, p, 0);
                }
            }
            Event::Open { ts_ns, file, .. } => {
                if let Some(p) = file.path.absolute() {
                    self.resolver
                        .note(resolve::kdev_to_user(file.dev as u64), file.ino, p.clone());
                    self.ns(ts_ns, NsOpKind::Open, p, 0);
                }
            }
            Event::DirRead { ts_ns, file, .. } => {
                if let Some(p) = file.path.absolute() {
                    self.ns(ts_ns, NsOpKind::DirRead, p, 0);
                }
            }
            Event::PathOp {
                ts_ns,
                op,
                ret,
                path,
                ..
            } => {
                let kind = match op {
                    PathOpKind::Open => NsOpKind::Open,
                    PathOpKind::Stat => NsOpKind::Stat,
                    PathOpKind::Access => NsOpKind::Access,
                    PathOpKind::Readlink => NsOpKind::Readlink,
                    PathOpKind::Exec => NsOpKind::Exec,
                };
                // Relative lookups are taken against the launch's working
                // directory: the event does not carry the dirfd's path.
                let path = if path.starts_with('/') {
                    path
                } else {
                    format!("{}/{}", self.cwd.trim_end_matches('/'), path)
                };
                self.ns(ts_ns, kind, path, ret.min(0));
            }
        }
        false
    }

    /// Names the files and builds the trace.
    pub fn finish(mut self, meta: TraceMeta, mut stats: TraceStats) -> Trace {
        stats.events = self.events;
        stats.processes = self.forked.len() as u64;
        let wanted = self.builder.files_seen();
        let names = self.resolver.resolve_all(&wanted);
        if std::env::var_os("WARMSTART_DEBUG").is_some() {
            for key in wanted.iter().filter(|k| !names.contains_key(k)) {
                eprintln!(
                    "warmstart: debug: unnamed file dev {:#x} ino {}",
                    key.0, key.1
                );
            }
        }
        self.builder
            .finish(meta, stats, |dev, ino| names.get(&(dev, ino)).cloned())
    }
}
