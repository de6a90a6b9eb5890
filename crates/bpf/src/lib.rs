//! The kernel side of warmstart's recorder: loads `record.bpf.c`, seeds and
//! reads its maps, and decodes its ring buffer into [`Event`]s.
//!
//! Everything kernel-specific about *which* hooks exist lives in [`probe`];
//! this module never compares kernel versions.

mod event;
pub mod kernel;
mod loadlog;
pub mod probe;
mod tracefs;
pub mod waits;

use std::collections::HashSet;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, RingBuffer, RingBufferBuilder};

pub use event::{split_cmdline, Event, FileInfo, PageKind, PathOpKind, WsPath};
pub use kernel::Kernel;
pub use tracefs::{ensure_tracefs, tracefs_root};
pub use waits::{WaitEvent, WaitKind, WaitTracer};

#[allow(
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    unsafe_op_in_unsafe_fn
)]
#[allow(
    dead_code,
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals
)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/record.skel.rs"));
}

use skel::{RecordSkel, RecordSkelBuilder};

/// Values of the `tracked` map, as record.bpf.c defines them.
const TRACK_ALL: u8 = 1;
const TRACK_TREE: u8 = 2;

/// `RECORDED_ONE` in record.bpf.c: one more process that may be recorded,
/// and one more insertion.
const RECORDED_ONE: u64 = (1 << 32) | 1;
/// The low half of `recorded_n`: how many processes may be recorded.
const RECORDED_COUNT: u64 = 0xffff_ffff;

/// Why the recorder could not start. Each variant says what is missing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("loading BPF needs CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN), which {}",
        if *as_root { "this root process lacks: its bounding set leaves them out (a container, a sandboxed service)" }
        else { "need root (run as root, or use --backend mincore)" })]
    Permission { as_root: bool },
    #[error("tracefs is not available at /sys/kernel/tracing and could not be mounted: {0}")]
    Tracefs(std::io::Error),
    #[error("this kernel lacks tracepoint {0} which the recorder needs")]
    MissingTracepoint(String),
    #[error("{kernel} has no BTF (/sys/kernel/btf/vmlinux): the recorder's programs need it (CONFIG_DEBUG_INFO_BTF)")]
    NoBtf { kernel: String },
    /// Loading failed although this process may load BPF: the kernel
    /// refused a program (its verifier, a missing hook or helper).
    #[error("BPF {stage} failed on {kernel}{}: {source}{}",
        program.as_ref().map(|p| format!(", program {p}")).unwrap_or_default(),
        detail.as_ref().map(|d| format!(" ({d})")).unwrap_or_default())]
    Load {
        stage: &'static str,
        kernel: String,
        program: Option<String>,
        detail: Option<String>,
        #[source]
        source: libbpf_rs::Error,
    },
    #[error("BPF {stage} failed: {source}")]
    Bpf {
        stage: &'static str,
        #[source]
        source: libbpf_rs::Error,
    },
}

impl Error {
    /// This process may not load BPF: says whether it is root all the same.
    pub fn permission() -> Error {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let euid = unsafe { libc::geteuid() };
        Error::Permission { as_root: euid == 0 }
    }
}

/// For failures after loading (map updates, polls).
fn bpf_err(stage: &'static str) -> impl FnOnce(libbpf_rs::Error) -> Error {
    move |source| Error::Bpf { stage, source }
}

/// For opening, loading and attaching: a process that may load BPF and is
/// refused anyway is told what the kernel refused, never to become root.
pub(crate) fn load_err<'a>(
    stage: &'static str,
    log: &'a loadlog::Capture,
) -> impl FnOnce(libbpf_rs::Error) -> Error + 'a {
    move |source| {
        if !probe::privileged() {
            return Error::permission();
        }
        let (program, detail) = log.culprit();
        Error::Load {
            stage,
            kernel: Kernel::running().describe(),
            program,
            detail,
            source,
        }
    }
}

/// What to record besides page-cache insertions and the process tree.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Page *uses* (reads, faults, fault-around), cached or not.
    pub uses: bool,
    /// Opens, stats, readlinks and directory reads.
    pub namespace: bool,
    /// Report every exec on the system and start tracing it (daemon mode);
    /// user space [`untrack`](Recorder::untrack)s what it does not want.
    /// Every execve is also reported as it starts ([`Event::ExecStart`]).
    pub watch_exec: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            uses: true,
            namespace: true,
            watch_exec: false,
        }
    }
}

/// How the recorder sees pages a launch uses from the cache (what lets it
/// learn a launch whose files are already cached).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageUses {
    /// The mm_filemap_get_pages/map_pages/fault tracepoints (6.12+).
    Tracepoints,
    /// fentry on the page cache's functions, where those are missing.
    Fentry,
    /// Not at all: only pages read from storage (a kernel that has
    /// neither).
    None,
    /// Not asked for ([`Options::uses`] off).
    Off,
}

impl std::fmt::Display for PageUses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PageUses::Tracepoints => "tracepoints",
            PageUses::Fentry => "fentry",
            PageUses::None => "none (storage reads only)",
            PageUses::Off => "off",
        })
    }
}

/// A loaded and attached recorder. Dropping it detaches every program.
pub struct Recorder {
    skel: RecordSkel<'static>,
    ring: RingBuffer<'static>,
    rx: mpsc::Receiver<Event>,
    /// The ring buffer's callback stopped consuming after an exec.
    stopped: Arc<AtomicBool>,
    /// What the probe switched off on this kernel (hooks it lacks).
    pub disabled: Vec<String>,
    /// How pages used from the cache are seen here.
    pub page_uses: PageUses,
    /// `recorded_n` in the program's mapped `.bss`.
    recorded_n: RecordedCount,
    /// A process may have stopped being recorded since the last count.
    recount_due: AtomicBool,
}

/// `recorded_n` in record.bpf.c, which the kernel side adds to atomically
/// and user space lowers by compare-and-swap.
struct RecordedCount(NonNull<u64>);

// SAFETY: the pointer is into the skeleton's `.bss` mapping, which lives
// as long as the `Recorder` that owns both, and is only accessed
// atomically (through `get`), as the BPF programs access it.
unsafe impl Send for RecordedCount {}
// SAFETY: as above; every access is an atomic operation.
unsafe impl Sync for RecordedCount {}

impl RecordedCount {
    fn get(&self) -> &AtomicU64 {
        // SAFETY: a u64 global of the BPF program (8-aligned in its
        // section), valid while the skeleton is, which outlives `&self`;
        // the kernel side only uses atomic adds and plain loads on it.
        unsafe { AtomicU64::from_ptr(self.0.as_ptr()) }
    }
}

impl Recorder {
    /// Loads and attaches the recorder. Nothing is recorded until a pid is
    /// [`track`](Self::track)ed.
    ///
    /// Each program comes in the variant the running kernel takes
    /// ([`Kernel::wants`]). Where no tracepoint reports pages used from
    /// the cache, fentry programs stand in; a kernel that refuses them
    /// (this one may allow tracepoints only) is loaded again without, and
    /// [`disabled`](Self::disabled) says what was left out and why.
    pub fn start(opts: Options) -> Result<Self, Error> {
        let kernel = Kernel::running();
        if !probe::privileged() {
            return Err(Error::permission());
        }
        if !kernel.btf {
            return Err(Error::NoBtf {
                kernel: kernel.release.clone(),
            });
        }
        let fentry = opts.uses && !kernel.has_use_tracepoints();
        if !fentry {
            return Self::load(opts, kernel, false);
        }
        match Self::load(opts, kernel, true) {
            Ok(r) => Ok(r),
            Err(e) => {
                let mut r = Self::load(opts, kernel, false)?;
                r.disabled.push(format!(
                    "page uses: neither tracepoints (6.12) nor fentry (refused: {e}); \
                     a launch is learned from what it reads from storage only"
                ));
                Ok(r)
            }
        }
    }

    fn load(opts: Options, kernel: &Kernel, fentry: bool) -> Result<Self, Error> {
        let log = loadlog::Capture::start();
        // The open object must outlive the skeleton, which borrows it; a
        // recorder lives for a whole recording (or the daemon's life), so
        // leaking this small allocation is the simple, sound choice.
        let obj: &'static mut MaybeUninit<libbpf_rs::OpenObject> =
            Box::leak(Box::new(MaybeUninit::uninit()));
        let mut open = RecordSkelBuilder::default()
            .open(obj)
            .map_err(load_err("open", &log))?;
        let rodata = open
            .maps
            .rodata_data
            .as_deref_mut()
            .expect("record.bpf.c has read-only data");
        rodata.trace_uses = opts.uses;
        rodata.trace_namespace = opts.namespace;
        rodata.watch_exec = opts.watch_exec;

        let mut disabled = Vec::new();
        for mut prog in open.open_object_mut().progs_mut() {
            let section = prog.section().to_string_lossy().into_owned();
            let name = prog.name().to_string_lossy().into_owned();
            if !kernel.wants(&name, fentry) {
                prog.set_autoload(false);
                continue;
            }
            let required = section.contains("mm_filemap_add_to_page_cache")
                || section.starts_with("tp_btf/sched_process");
            // A program that would return at once is not attached at all:
            // sys_enter/sys_exit run on every system call of the machine.
            let unwanted =
                (!opts.namespace && !opts.watch_exec && section.starts_with("tp_btf/sys_"))
                    || (!opts.uses
                        && !required
                        && (section.starts_with("tp_btf/mm_filemap_")
                            || section.starts_with("fentry/")));
            if unwanted {
                prog.set_autoload(false);
                continue;
            }
            if !probe::hook_available(&section) {
                if required {
                    return Err(Error::MissingTracepoint(section));
                }
                prog.set_autoload(false);
                // The page-use tracepoints fentry stands in for are not
                // missed: `page_uses` says how uses are seen.
                if !(fentry && section.starts_with("tp_btf/mm_filemap_")) {
                    disabled.push(section);
                }
            }
        }
        let mut skel = open.load().map_err(load_err("load", &log))?;
        let recorded_n = RecordedCount(NonNull::from(
            &mut skel
                .maps
                .bss_data
                .as_deref_mut()
                .expect("record.bpf.c has a mapped .bss")
                .recorded_n,
        ));
        skel.attach().map_err(load_err("attach", &log))?;
        drop(log);

        let (tx, rx) = mpsc::channel();
        let stopped = Arc::new(AtomicBool::new(false));
        let stop = Arc::clone(&stopped);
        let mut builder = RingBufferBuilder::new();
        builder
            .add(&skel.maps.events, move |data: &[u8]| {
                let Some(ev) = Event::decode(data) else {
                    return 0;
                };
                let exec = matches!(ev, Event::Exec { .. } | Event::ExecStart { .. });
                let _ = tx.send(ev);
                if exec {
                    // Hand the exec over now: a launch's exec is followed
                    // at once by hundreds of its page records, and
                    // draining them first held the daemon's replay back
                    // by ~2 ms. A negative return makes libbpf stop after
                    // this record; the next poll goes on from the next.
                    stop.store(true, Ordering::Relaxed);
                    return -libc::ECANCELED;
                }
                0
            })
            .map_err(bpf_err("ring buffer"))?;
        let ring = builder.build().map_err(bpf_err("ring buffer"))?;
        let page_uses = if !opts.uses {
            PageUses::Off
        } else if kernel.has_use_tracepoints() {
            PageUses::Tracepoints
        } else if fentry {
            PageUses::Fentry
        } else {
            PageUses::None
        };
        Ok(Self {
            skel,
            ring,
            rx,
            stopped,
            disabled,
            page_uses,
            recorded_n,
            recount_due: AtomicBool::new(false),
        })
    }

    /// Adds a process (tgid) to the traced tree; its future children follow.
    pub fn track(&self, tgid: u32) -> Result<(), Error> {
        self.set_tracked(tgid, TRACK_ALL)
    }

    /// Keeps following a process's tree (fork, exec, exit, and its
    /// future children the same way) but records none of its pages or
    /// path operations: a launch the daemon prefetches without auditing.
    pub fn track_tree_only(&self, tgid: u32) -> Result<(), Error> {
        self.set_tracked(tgid, TRACK_TREE)
    }

    /// `tracked[tgid] = level` (TRACK_ALL / TRACK_TREE in record.bpf.c).
    fn set_tracked(&self, tgid: u32, level: u8) -> Result<(), Error> {
        self.skel
            .maps
            .tracked
            .update(&tgid.to_ne_bytes(), &[level], MapFlags::ANY)
            .map_err(bpf_err("map update"))?;
        if level == TRACK_ALL {
            // After the update, as the kernel side does (see recorded_n).
            self.recorded_n
                .get()
                .fetch_add(RECORDED_ONE, Ordering::SeqCst);
        } else {
            self.recount_due.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Stops tracing a process (its future children are not followed).
    pub fn untrack(&self, tgid: u32) {
        let _ = self.skel.maps.tracked.delete(&tgid.to_ne_bytes());
        self.recount_due.store(true, Ordering::Relaxed);
    }

    /// How many processes the kernel side may be recording: never fewer
    /// than are tracked with their pages and path operations, and zero
    /// once none are and the recorder has counted them again (on the next
    /// [`poll`](Self::poll) after an untrack or an exit). While it is zero
    /// the hooks on every system call and page return at once.
    pub fn maybe_recorded(&self) -> u32 {
        (self.recorded_n.get().load(Ordering::SeqCst) & RECORDED_COUNT) as u32
    }

    /// Lowers `recorded_n` to the TRACK_ALL entries of `tracked`, unless
    /// the kernel side added one while they were counted (then the next
    /// call tries again; a count that stays too high only costs time).
    fn recount(&self) {
        let cell = self.recorded_n.get();
        let before = cell.load(Ordering::SeqCst);
        if before & RECORDED_COUNT == 0 {
            return;
        }
        let map = &self.skel.maps.tracked;
        let mut recorded = HashSet::new();
        // A key deleted under the walk sends it back to the first key:
        // bounded, and counted once each.
        for key in map.keys().take(4 * 65536) {
            if let Ok(Some(level)) = map.lookup(&key, MapFlags::ANY) {
                if level.first() == Some(&TRACK_ALL) {
                    recorded.insert(key);
                }
            }
        }
        let after = (before & !RECORDED_COUNT) | recorded.len() as u64;
        if cell
            .compare_exchange(before, after, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            self.recount_due.store(true, Ordering::Relaxed);
        }
    }

    /// Counts the recorded processes again if one may have stopped being
    /// recorded since the last count: untracked, followed as a tree only,
    /// or exited (in `events`). Called before a poll waits, so that the
    /// program a daemon has just let go runs without the hooks' lookups,
    /// and after, for the exits it brought.
    fn recount_after(&self, events: &[Event]) {
        let exited = events.iter().any(|e| matches!(e, Event::Exit { .. }));
        if self.recount_due.swap(false, Ordering::Relaxed) || exited {
            self.recount();
        }
    }

    /// Daemon mode: leaves the program `(dev, ino)` alone for `hold` when
    /// a process nobody follows execs it (no trace, no event), and the
    /// execve calls that name it by `name` (the path as the caller gave
    /// it, absolute) when one is given. See `quiet_exe` in record.bpf.c.
    pub fn quiet_program(
        &self,
        dev: u32,
        ino: u64,
        name: Option<&str>,
        hold: Duration,
    ) -> Result<(), Error> {
        let until = monotonic_ns().saturating_add(hold.as_nanos() as u64);
        let mut key = [0u8; 16];
        key[..8].copy_from_slice(&ino.to_ne_bytes());
        key[8..12].copy_from_slice(&dev.to_ne_bytes());
        self.skel
            .maps
            .quiet_exe
            .update(&key, &until.to_ne_bytes(), MapFlags::ANY)
            .map_err(bpf_err("map update"))?;
        // A name that does not fit (with its NUL) is not matched at all.
        if let Some(name) = name.filter(|n| n.len() < QUIET_NAME_LEN) {
            let mut key = [0u8; QUIET_NAME_LEN];
            key[..name.len()].copy_from_slice(name.as_bytes());
            self.skel
                .maps
                .quiet_name
                .update(&key, &until.to_ne_bytes(), MapFlags::ANY)
                .map_err(bpf_err("map update"))?;
        }
        Ok(())
    }

    /// Forgets every quiet program (the user asked for one to be learned).
    pub fn clear_quiet(&self) {
        for map in [&self.skel.maps.quiet_exe, &self.skel.maps.quiet_name] {
            let keys: Vec<Vec<u8>> = map.keys().collect();
            for k in keys {
                let _ = map.delete(&k);
            }
        }
    }

    /// Whether quiet programs are left alone (off while everything must
    /// be seen, as when a startup is recorded). Off when loaded.
    pub fn set_quiet(&self, on: bool) -> Result<(), Error> {
        self.skel
            .maps
            .quiet_on
            .update(
                &0u32.to_ne_bytes(),
                &u32::from(on).to_ne_bytes(),
                MapFlags::ANY,
            )
            .map_err(bpf_err("map update"))
    }

    /// Execs the kernel left alone because their program was quiet.
    pub fn quieted(&self) -> u64 {
        sum_percpu(&self.skel.maps.quieted)
    }

    /// Waits up to `timeout` for events and appends what arrived to `out`.
    ///
    /// Most records are written without waking the reader (see WAKE_LATER
    /// in record.bpf.c), so this returns early only for fork, exec and exit,
    /// and otherwise after `timeout` with everything written meanwhile.
    /// An exec ends the batch: it is returned with what came before it,
    /// and the records after it wait for the next call.
    pub fn poll(&self, timeout: Duration, out: &mut Vec<Event>) -> Result<(), Error> {
        self.recount_after(&[]);
        let polled = self.ring.poll(timeout);
        if !self.stopped_at_exec() {
            match polled {
                // A signal (the wrapper forwards them) is not a failure.
                Err(e) if matches!(e.kind(), libbpf_rs::ErrorKind::Interrupted) => {}
                r => r.map_err(bpf_err("poll"))?,
            }
            // epoll reports nothing for records written without a wake-up.
            let consumed = self.ring.consume();
            if !self.stopped_at_exec() {
                consumed.map_err(bpf_err("consume"))?;
            }
        }
        let from = out.len();
        out.extend(self.rx.try_iter());
        self.recount_after(&out[from..]);
        Ok(())
    }

    /// Drains everything still in the ring buffer.
    pub fn drain(&self, out: &mut Vec<Event>) -> Result<(), Error> {
        loop {
            let consumed = self.ring.consume();
            if !self.stopped_at_exec() {
                consumed.map_err(bpf_err("consume"))?;
                break;
            }
        }
        let from = out.len();
        out.extend(self.rx.try_iter());
        self.recount_after(&out[from..]);
        Ok(())
    }

    /// Whether the last consumption stopped early after an exec (and
    /// clears it).
    fn stopped_at_exec(&self) -> bool {
        self.stopped.swap(false, Ordering::Relaxed)
    }

    /// Records the kernel had to drop because the ring buffer was full.
    pub fn drops(&self) -> u64 {
        sum_percpu(&self.skel.maps.drops)
    }
}

/// The sum over CPUs of a one-entry per-CPU array of u64.
pub(crate) fn sum_percpu(map: &dyn MapCore) -> u64 {
    let key = 0u32.to_ne_bytes();
    match map.lookup_percpu(&key, MapFlags::ANY) {
        Ok(Some(per_cpu)) => per_cpu
            .iter()
            .map(|v| {
                let mut b = [0u8; 8];
                b.copy_from_slice(&v[..8]);
                u64::from_ne_bytes(b)
            })
            .sum(),
        _ => 0,
    }
}

/// Length of a `quiet_name` key in record.bpf.c (WS_ARG_LEN).
const QUIET_NAME_LEN: usize = 256;

/// CLOCK_MONOTONIC in nanoseconds: the clock of bpf_ktime_get_ns().
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
