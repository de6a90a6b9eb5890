//! Startup traces and plans on disk (`STATE_DIR/startup/<kind>/`), and the
//! background replay that startup plans and idle preloads share.
//!
//! Each kind keeps its last n traces and one plan compiled from them with
//! the k-of-n intersection of [`warmstart_plan::compile`]: a page is
//! replayed if at least k of the last n startups read it. Anything damaged
//! (a trace or a plan that does not decode) is removed with a warning and
//! the plan compiled again from what is left: a startup plan is a cache of
//! the traces, never something worth stopping the daemon for.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use warmstart_plan::compile::{CompileError, CompileOptions};
use warmstart_plan::{Plan, Trace};
use warmstart_replay::{
    Engine, IoPriority, MemInfo, Options, RealBackend, ReplayCpus, ReplayError, Report,
};

use super::{StartupConfig, StartupKind};
use crate::store;

/// What went wrong storing, compiling or replaying a startup plan.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] crate::Error),
    #[error("cannot compile the {kind} startup plan: {source}")]
    Compile {
        kind: &'static str,
        #[source]
        source: CompileError,
    },
    #[error("/proc/meminfo: {0}")]
    MemInfo(String),
    #[error("MemAvailable {available} bytes is not above the memory floor of {floor} bytes")]
    LowMemory { available: u64, floor: u64 },
    #[error("bad io_priority {0:?}")]
    Priority(String),
    #[error("cannot start a replay thread: {0}")]
    Spawn(#[source] std::io::Error),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> StartupError + '_ {
    move |source| StartupError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn kind_name(kind: StartupKind) -> &'static str {
    match kind {
        StartupKind::Boot => "boot",
        StartupKind::Login => "login",
    }
}

/// What storing a trace or compiling did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddOutcome {
    /// Traces kept for this kind now.
    pub traces: usize,
    /// The plan written, as (entries, data and metadata bytes); `None` when
    /// there is none (too few startups yet, or nothing in common).
    pub plan: Option<(usize, u64)>,
    /// Why there is no plan, for the log.
    pub no_plan: Option<String>,
    /// Damaged files removed, and the compiler's warnings.
    pub warnings: Vec<String>,
}

/// A plan read back, and what had to be repaired on the way.
#[derive(Debug, Default)]
pub struct LoadedPlan {
    pub plan: Option<Plan>,
    pub warnings: Vec<String>,
}

/// The startup traces and plans of one state directory.
#[derive(Debug, Clone)]
pub struct StartupStore {
    root: PathBuf,
    keep: usize,
    min_traces: usize,
}

impl StartupStore {
    pub fn new(state_dir: &Path, cfg: &StartupConfig) -> Self {
        StartupStore {
            root: state_dir.join("startup"),
            keep: cfg.keep.max(1),
            min_traces: cfg.min_traces.clamp(1, cfg.keep.max(1)),
        }
    }

    pub fn dir(&self, kind: StartupKind) -> PathBuf {
        self.root.join(kind_name(kind))
    }

    pub fn plan_path(&self, kind: StartupKind) -> PathBuf {
        self.dir(kind).join("plan")
    }

    /// The kind's trace files, oldest first (names start with the
    /// startup's time, zero-padded).
    fn trace_files(&self, kind: StartupKind) -> Vec<PathBuf> {
        let Ok(rd) = std::fs::read_dir(self.dir(kind)) else {
            return Vec::new();
        };
        let mut v: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.extension().is_some_and(|x| x == "trace")
                    && !p
                        .file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with('.'))
            })
            .collect();
        v.sort();
        v
    }

    /// Keeps `trace` as the newest startup of its kind, forgets the oldest
    /// beyond n, and compiles the plan again. A trace that read nothing (no
    /// named file, no metadata) is not kept: it would only push a real one
    /// out.
    pub fn add(
        &self,
        kind: StartupKind,
        trace: &Trace,
        opts: &CompileOptions,
    ) -> Result<AddOutcome, StartupError> {
        let dir = self.dir(kind);
        if trace.files.iter().all(|f| f.path.is_none()) && trace.metadata.is_empty() {
            let mut out = self.compile(kind, opts)?;
            out.warnings
                .push("the startup read no named file: trace not kept".into());
            return Ok(out);
        }
        std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        let existing = self.trace_files(kind);
        let mut name;
        let mut seq = 0;
        loop {
            name = dir.join(format!("{:016}-{seq}.trace", trace.meta.started_unix_ms));
            if !existing.contains(&name) {
                break;
            }
            seq += 1;
        }
        store::write_atomic(&name, &trace.to_bytes())?;
        let mut files = self.trace_files(kind);
        while files.len() > self.keep {
            let old = files.remove(0);
            std::fs::remove_file(&old).map_err(io_err(&old))?;
        }
        self.compile(kind, opts)
    }

    /// Compiles the kind's plan from its traces (k of the last n) and saves
    /// it; with fewer than k traces the plan, if any, stays as it is.
    pub fn compile(
        &self,
        kind: StartupKind,
        opts: &CompileOptions,
    ) -> Result<AddOutcome, StartupError> {
        let mut out = AddOutcome::default();
        let mut traces = Vec::new();
        for path in self.trace_files(kind) {
            let decoded = std::fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| Trace::from_bytes(&b).map_err(|e| e.to_string()));
            match decoded {
                Ok(t) => traces.push(t),
                Err(e) => {
                    let _ = std::fs::remove_file(&path);
                    out.warnings
                        .push(format!("{}: damaged ({e}), removed", path.display()));
                }
            }
        }
        out.traces = traces.len();
        if traces.len() < self.min_traces {
            out.no_plan = Some(format!(
                "{} of the {} startups a plan needs recorded",
                traces.len(),
                self.min_traces
            ));
            return Ok(out);
        }
        let opts = CompileOptions {
            min_traces: Some(self.min_traces as u32),
            ..opts.clone()
        };
        let compiled =
            crate::compile_traces(&traces, &opts).map_err(|source| StartupError::Compile {
                kind: kind_name(kind),
                source,
            })?;
        out.warnings
            .extend(compiled.report.warnings.iter().map(ToString::to_string));
        let path = self.plan_path(kind);
        if let Some(why) = &compiled.report.empty {
            // An old plan no longer backed by k startups goes.
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(&path)(e)),
            }
            out.no_plan = Some(why.to_string());
            return Ok(out);
        }
        let plan = &compiled.plan;
        store::write_atomic(&path, &plan.to_bytes())?;
        out.plan = Some((plan.entries.len(), plan.data_bytes() + plan.meta_bytes()));
        Ok(out)
    }

    /// The kind's plan. A damaged one is removed and compiled again from the
    /// traces, with a warning; a missing one is `None`.
    pub fn plan(&self, kind: StartupKind, opts: &CompileOptions) -> LoadedPlan {
        let path = self.plan_path(kind);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return LoadedPlan::default(),
            Err(e) => {
                return LoadedPlan {
                    plan: None,
                    warnings: vec![format!("{}: unreadable ({e})", path.display())],
                }
            }
        };
        let decoded = Plan::from_bytes(&bytes).and_then(|p| p.check().map(|()| p));
        match decoded {
            Ok(plan) => LoadedPlan {
                plan: Some(plan),
                warnings: Vec::new(),
            },
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                let mut warnings = vec![format!(
                    "{}: damaged ({e}), compiled again from the traces",
                    path.display()
                )];
                match self.compile(kind, opts) {
                    Ok(out) => warnings.extend(out.warnings),
                    Err(e) => warnings.push(e.to_string()),
                }
                let plan = std::fs::read(&path)
                    .ok()
                    .and_then(|b| Plan::from_bytes(&b).ok());
                LoadedPlan { plan, warnings }
            }
        }
    }
}

/// `MemTotal` and `MemAvailable` from `PROC/meminfo`.
pub fn mem_available(proc_root: &Path) -> Result<MemInfo, StartupError> {
    let path = proc_root.join("meminfo");
    let text = std::fs::read_to_string(&path).map_err(io_err(&path))?;
    warmstart_replay::parse_meminfo(&text).map_err(StartupError::MemInfo)
}

/// A replay running in the background. Dropping it cancels the replay
/// (the thread finishes its requests in flight and exits on its own).
#[derive(Debug)]
pub struct ReplayHandle {
    cancel: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<Report, ReplayError>>>,
    /// Bytes the plan reads (data and metadata).
    pub bytes: u64,
}

impl ReplayHandle {
    /// Stops issuing requests; those issued still complete in the kernel.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }

    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Waits for the replay and returns its report (`None` if its thread
    /// panicked).
    pub fn join(mut self) -> Option<Result<Report, ReplayError>> {
        self.thread.take()?.join().ok()
    }
}

impl Drop for ReplayHandle {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.cancel();
        }
    }
}

/// How a background replay runs.
#[derive(Debug, Clone)]
pub struct BackgroundReplay {
    pub workers: usize,
    pub io_priority: IoPriority,
    /// `None`: the replay engine's default floor for this machine.
    pub memory_floor: Option<u64>,
}

/// Starts `plan` on a thread of its own, in the plan's order (first use:
/// startup plans are compiled unsorted), at `how.io_priority`, its threads
/// at idle CPU priority once started so they never take a CPU from the
/// programs starting, and only if `meminfo()` shows more available memory
/// than the floor (the engine then stops before crossing it).
pub fn spawn_replay(
    plan: Arc<Plan>,
    how: &BackgroundReplay,
    meminfo: impl FnOnce() -> Result<MemInfo, StartupError>,
) -> Result<ReplayHandle, StartupError> {
    let mem = meminfo()?;
    let floor = how
        .memory_floor
        .unwrap_or_else(|| Options::default_memory_floor(mem.total));
    if mem.available <= floor {
        return Err(StartupError::LowMemory {
            available: mem.available,
            floor,
        });
    }
    let workers = how.workers.clamp(1, 64);
    let opts = Options {
        workers,
        queue_depth: 2 * workers,
        io_priority: Some(how.io_priority),
        cpus: ReplayCpus::Idle,
        memory_floor: Some(floor),
        wait: None,
        ..Options::default()
    };
    let cancel = Arc::new(AtomicBool::new(false));
    let bytes = plan.data_bytes() + plan.meta_bytes();
    let thread = {
        let cancel = Arc::clone(&cancel);
        std::thread::Builder::new()
            .name("ws-background".into())
            .spawn(move || {
                let backend = RealBackend::new();
                Engine::new(&backend, opts)?.share_cancel(cancel).run(&plan)
            })
            .map_err(StartupError::Spawn)?
    };
    Ok(ReplayHandle {
        cancel,
        thread: Some(thread),
        bytes,
    })
}

/// Replays a startup plan as [`StartupConfig`] says (see [`spawn_replay`]).
pub fn replay_startup(
    plan: Arc<Plan>,
    cfg: &StartupConfig,
    meminfo: impl FnOnce() -> Result<MemInfo, StartupError>,
) -> Result<ReplayHandle, StartupError> {
    let io_priority = cfg
        .io_priority
        .parse()
        .map_err(|_| StartupError::Priority(cfg.io_priority.clone()))?;
    let how = BackgroundReplay {
        workers: cfg.workers,
        io_priority,
        memory_floor: cfg.memory_floor_mib.map(|m| m << 20),
    };
    spawn_replay(plan, &how, meminfo)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;
    use warmstart_plan::trace::{
        Backend, CacheState, EndReason, Extent, FileId, FileTrace, TraceMeta, TraceStats,
    };

    /// A startup that read `pages` (first page, count) of each named file.
    fn trace(at_ms: u64, files: &[(&str, &[(u64, u64)])]) -> Trace {
        Trace {
            meta: TraceMeta {
                command: vec!["startup:boot".into()],
                cwd: "/".into(),
                backend: Backend::Bpf,
                cache: CacheState::AsFound,
                end: EndReason::Idle,
                exit_code: None,
                started_unix_ms: at_ms,
                hostname: String::new(),
            },
            files: files
                .iter()
                .map(|(path, ranges)| FileTrace {
                    path: Some(path.to_string()),
                    id: FileId {
                        dev: 1,
                        // One inode per path, whichever startups read it.
                        ino: path.bytes().map(u64::from).sum(),
                        size: 1 << 30,
                        mtime_ns: 0,
                        ctime_ns: 0,
                    },
                    extents: ranges
                        .iter()
                        .map(|(first, n)| Extent {
                            offset: first * 4096,
                            len: n * 4096,
                            t_ns: first * 1000,
                            from_storage: true,
                        })
                        .collect(),
                })
                .collect(),
            metadata: Vec::new(),
            namespace_ops: Vec::new(),
            stats: TraceStats::default(),
        }
    }

    fn opts() -> CompileOptions {
        CompileOptions {
            min_launch_bytes: 0,
            merge_gap: 0,
            lookups: false,
            ..CompileOptions::default()
        }
    }

    /// The (path, offset, len) the plan reads, sorted.
    fn reads(plan: &Plan) -> Vec<(String, u64, u64)> {
        let mut v: Vec<_> = plan
            .entries
            .iter()
            .filter_map(|e| match e {
                warmstart_plan::plan::Entry::Data { file, offset, len } => {
                    Some((plan.files[*file as usize].path.clone(), *offset, *len))
                }
                _ => None,
            })
            .collect();
        v.sort();
        v
    }

    #[test]
    fn k_of_n_keeps_what_most_startups_read() {
        let d = tempfile::tempdir().unwrap();
        let cfg = StartupConfig::default(); // n = 4, k = 2
        let s = StartupStore::new(d.path(), &cfg);
        let first = s.add(StartupKind::Boot, &trace(1, &[("/a", &[(0, 4)])]), &opts());
        let first = first.unwrap();
        assert_eq!(first.traces, 1);
        assert!(first.plan.is_none(), "one startup is not enough");
        assert!(first.no_plan.unwrap().contains("1 of the 2"));
        // /a pages 0-1 in all, /b in one startup only, /c in two.
        s.add(
            StartupKind::Boot,
            &trace(2, &[("/a", &[(0, 2)]), ("/b", &[(0, 1)])]),
            &opts(),
        )
        .unwrap();
        let out = s
            .add(
                StartupKind::Boot,
                &trace(3, &[("/a", &[(0, 2)]), ("/c", &[(5, 1)])]),
                &opts(),
            )
            .unwrap();
        assert_eq!(out.traces, 3);
        assert!(out.plan.is_some());
        s.add(StartupKind::Boot, &trace(4, &[("/c", &[(5, 1)])]), &opts())
            .unwrap();
        let plan = s.plan(StartupKind::Boot, &opts()).plan.unwrap();
        assert_eq!(plan.meta.min_traces, 2);
        assert_eq!(
            reads(&plan),
            vec![("/a".into(), 0, 2 * 4096), ("/c".into(), 5 * 4096, 4096)]
        );
        // A fifth startup pushes the first out: n stays 4.
        let out = s
            .add(StartupKind::Boot, &trace(5, &[("/d", &[(0, 1)])]), &opts())
            .unwrap();
        assert_eq!(out.traces, 4);
        assert_eq!(s.trace_files(StartupKind::Boot).len(), 4);
        // Logins are kept apart.
        assert!(s.trace_files(StartupKind::Login).is_empty());
        assert!(s.plan(StartupKind::Login, &opts()).plan.is_none());
    }

    #[test]
    fn nothing_in_common_removes_the_old_plan() {
        let d = tempfile::tempdir().unwrap();
        let cfg = StartupConfig {
            keep: 2,
            min_traces: 2,
            ..Default::default()
        };
        let s = StartupStore::new(d.path(), &cfg);
        for (t, f) in [(1, "/a"), (2, "/a")] {
            s.add(StartupKind::Login, &trace(t, &[(f, &[(0, 1)])]), &opts())
                .unwrap();
        }
        assert!(s.plan_path(StartupKind::Login).exists());
        for (t, f) in [(3, "/x"), (4, "/y")] {
            s.add(StartupKind::Login, &trace(t, &[(f, &[(0, 1)])]), &opts())
                .unwrap();
        }
        assert!(!s.plan_path(StartupKind::Login).exists());
    }

    #[test]
    fn an_empty_startup_is_not_kept() {
        let d = tempfile::tempdir().unwrap();
        let s = StartupStore::new(d.path(), &StartupConfig::default());
        let out = s.add(StartupKind::Boot, &trace(1, &[]), &opts()).unwrap();
        assert_eq!(out.traces, 0);
        assert!(!out.warnings.is_empty());
    }

    #[test]
    fn damaged_traces_and_plans_are_rebuilt_with_a_warning() {
        let d = tempfile::tempdir().unwrap();
        let s = StartupStore::new(d.path(), &StartupConfig::default());
        for t in 1..=3 {
            s.add(StartupKind::Boot, &trace(t, &[("/a", &[(0, 1)])]), &opts())
                .unwrap();
        }
        let files = s.trace_files(StartupKind::Boot);
        std::fs::write(&files[0], b"not a trace").unwrap();
        std::fs::write(s.plan_path(StartupKind::Boot), b"\0garbage").unwrap();
        let loaded = s.plan(StartupKind::Boot, &opts());
        let plan = loaded.plan.expect("compiled again from the 2 good traces");
        assert_eq!(plan.meta.traces, 2);
        assert_eq!(loaded.warnings.len(), 2, "{:?}", loaded.warnings);
        assert!(loaded.warnings.iter().all(|w| w.contains("damaged")));
        assert_eq!(s.trace_files(StartupKind::Boot).len(), 2);
        // Clean from then on.
        assert!(s.plan(StartupKind::Boot, &opts()).warnings.is_empty());
    }

    #[test]
    fn no_replay_without_memory_above_the_floor() {
        let plan = Arc::new(
            warmstart_plan::compile::compile(
                &[trace(1, &[("/a", &[(0, 1)])])],
                &opts(),
                &|_, _| None,
            )
            .unwrap()
            .plan,
        );
        let cfg = StartupConfig {
            memory_floor_mib: Some(512),
            ..Default::default()
        };
        let low = || {
            Ok(MemInfo {
                total: 8 << 30,
                available: 300 << 20,
            })
        };
        match replay_startup(plan, &cfg, low) {
            Err(StartupError::LowMemory { available, floor }) => {
                assert_eq!((available, floor), (300 << 20, 512 << 20));
            }
            other => panic!("expected LowMemory, got {other:?}"),
        }
    }

    #[test]
    fn a_startup_plan_is_replayed_in_the_background() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("f");
        std::fs::write(&path, vec![7u8; 64 * 1024]).unwrap();
        let m = std::fs::metadata(&path).unwrap();
        // Started after the file was written, or the compiler takes the
        // file for one the startup wrote, and leaves it out.
        let mut t = trace(store::now_ms(), &[(path.to_str().unwrap(), &[(0, 16)])]);
        t.files[0].id = FileId {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
            ctime_ns: m.ctime() * 1_000_000_000 + m.ctime_nsec(),
        };
        let plan = warmstart_plan::compile::compile(&[t], &opts(), &|_, _| None)
            .unwrap()
            .plan;
        let cfg = StartupConfig {
            memory_floor_mib: Some(0),
            ..Default::default()
        };
        let h = replay_startup(Arc::new(plan), &cfg, || mem_available(Path::new("/proc"))).unwrap();
        assert_eq!(h.bytes, 64 * 1024);
        let report = h.join().unwrap().unwrap();
        assert_eq!(report.bytes_issued(), 64 * 1024);
        assert!(report.skipped_files.is_empty());
    }
}
