//! Event sources behind one small trait: eBPF (the real recorder), tracefs
//! text events (when BPF cannot load), and a mincore snapshot (no
//! privileges). `Auto` probes them in that order.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{BufRead, BufReader};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use warmstart_bpf::{Event, FileInfo as KFile, PageKind, WsPath};
use warmstart_plan::trace::Backend;

use crate::procscan::{self, Seen};
use crate::Error;

/// Which backend to record with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// The best one that works here: bpf, then tracefs, then mincore.
    #[default]
    Auto,
    Bpf,
    Tracefs,
    Mincore,
}

/// Where events come from.
pub trait Source {
    fn backend(&self) -> Backend;
    /// Adds the (held) root process of the tree to trace.
    fn track(&mut self, tgid: u32) -> Result<(), Error>;
    /// Waits up to `timeout` and appends new events.
    fn poll(&mut self, timeout: Duration, out: &mut Vec<Event>) -> Result<(), Error>;
    /// Appends whatever is left once recording ends.
    fn finish(&mut self, out: &mut Vec<Event>) -> Result<(), Error>;
    /// Events lost by the kernel.
    fn drops(&self) -> u64;
}

/// Opens the chosen backend, falling back when `Auto`. Returns the source
/// and, for Auto, why the better backends were not used.
pub fn open(
    choice: BackendChoice,
    opts: warmstart_bpf::Options,
) -> Result<(Box<dyn Source>, Vec<String>), Error> {
    let mut why = Vec::new();
    if matches!(choice, BackendChoice::Auto | BackendChoice::Bpf) {
        match warmstart_bpf::Recorder::start(opts) {
            Ok(r) => return Ok((Box::new(BpfSource { rec: r }), why)),
            Err(e) if choice == BackendChoice::Bpf => return Err(Error::Bpf(e)),
            Err(e) => why.push(format!("bpf: {e}")),
        }
    }
    if matches!(choice, BackendChoice::Auto | BackendChoice::Tracefs) {
        match TracefsSource::new() {
            Ok(s) => return Ok((Box::new(s), why)),
            Err(e) if choice == BackendChoice::Tracefs => return Err(e),
            Err(e) => why.push(format!("tracefs: {e}")),
        }
    }
    Ok((Box::new(MincoreSource::new(Path::new("/proc"))), why))
}

struct BpfSource {
    rec: warmstart_bpf::Recorder,
}

impl Source for BpfSource {
    fn backend(&self) -> Backend {
        Backend::Bpf
    }
    fn track(&mut self, tgid: u32) -> Result<(), Error> {
        self.rec.track(tgid).map_err(Error::Bpf)
    }
    fn poll(&mut self, timeout: Duration, out: &mut Vec<Event>) -> Result<(), Error> {
        self.rec.poll(timeout, out).map_err(Error::Bpf)
    }
    fn finish(&mut self, out: &mut Vec<Event>) -> Result<(), Error> {
        self.rec.drain(out).map_err(Error::Bpf)
    }
    fn drops(&self) -> u64 {
        self.rec.drops()
    }
}

/// Files seen open or mapped by the tree, reported as Open events so the
/// resolver can name what the page events number.
fn sample_files(
    proc_root: &Path,
    root: u32,
    known: &mut HashSet<Seen>,
    out: &mut Vec<Event>,
    ts_ns: u64,
) {
    let mut now = HashSet::new();
    for pid in procscan::descendants(proc_root, root) {
        procscan::files_of(proc_root, pid, &mut now);
    }
    for s in now {
        if known.insert(s.clone()) {
            let size = fs::metadata(&s.path).map(|m| m.size()).unwrap_or(0);
            out.push(Event::Open {
                tgid: root,
                ts_ns,
                file: KFile {
                    // Page events carry the kernel's dev encoding.
                    dev: ((libc::major(s.dev) as u32) << 20) | libc::minor(s.dev),
                    ino: s.ino,
                    mode: 0o100644,
                    size,
                    path: WsPath {
                        components: s
                            .path
                            .trim_start_matches('/')
                            .rsplit('/')
                            .map(str::to_string)
                            .collect(),
                        truncated: false,
                    },
                },
            });
        }
    }
}

fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

/// Tracefs text events in a private instance, filtered to the tree by
/// `set_event_pid` with the `event-fork` option. Ordered page events and
/// the process tree; names come from sampling /proc.
struct TracefsSource {
    dir: PathBuf,
    rx: mpsc::Receiver<String>,
    root: Option<u32>,
    known: HashSet<Seen>,
    reader: Option<std::thread::JoinHandle<()>>,
}

/// Removes the tracefs instances (`warmstart-PID`) of recorders whose
/// process is gone. Returns how many were removed.
fn sweep_stale_instances(instances: &Path, proc: &Path) -> usize {
    let Ok(rd) = fs::read_dir(instances) else {
        return 0;
    };
    rd.flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("warmstart-"))
                .and_then(|pid| pid.parse::<u32>().ok())
                .is_some_and(|pid| !proc.join(pid.to_string()).exists())
        })
        // rmdir is how tracefs removes an instance.
        .filter(|e| fs::remove_dir(e.path()).is_ok())
        .count()
}

const TRACEFS_EVENTS: &[&str] = &[
    "filemap/mm_filemap_add_to_page_cache",
    "filemap/mm_filemap_get_pages",
    "filemap/mm_filemap_map_pages",
    "filemap/mm_filemap_fault",
    "sched/sched_process_fork",
    "sched/sched_process_exit",
    "sched/sched_process_exec",
];

impl TracefsSource {
    fn new() -> Result<Self, Error> {
        warmstart_bpf::ensure_tracefs()
            .map_err(|e| Error::Tracefs(format!("cannot mount tracefs: {e}")))?;
        let root = warmstart_bpf::tracefs_root();
        // Instances of recorders that were killed stay, each with its
        // 16 MiB of buffers per CPU, until someone removes them.
        sweep_stale_instances(&root.join("instances"), Path::new("/proc"));
        let dir = root
            .join("instances")
            .join(format!("warmstart-{}", std::process::id()));
        fs::create_dir(&dir)
            .map_err(|e| Error::Tracefs(format!("cannot create {}: {e}", dir.display())))?;
        let w = |rel: &str, v: &str| {
            fs::write(dir.join(rel), v).map_err(|e| Error::Tracefs(format!("writing {rel}: {e}")))
        };
        let setup = (|| {
            w("buffer_size_kb", "16384")?;
            let _ = w("trace_clock", "mono");
            w("options/event-fork", "1")?;
            Ok::<(), Error>(())
        })();
        if let Err(e) = setup {
            let _ = fs::remove_dir(&dir);
            return Err(e);
        }
        let pipe = File::open(dir.join("trace_pipe"))
            .map_err(|e| Error::Tracefs(format!("opening trace_pipe: {e}")))?;
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Self {
            dir,
            rx,
            root: None,
            known: HashSet::new(),
            reader: Some(reader),
        })
    }

    fn drain_lines(&mut self, out: &mut Vec<Event>) {
        for line in self.rx.try_iter() {
            if let Some(ev) = parse_tracefs_line(&line) {
                out.push(ev);
            }
        }
    }
}

impl Source for TracefsSource {
    fn backend(&self) -> Backend {
        Backend::Tracefs
    }
    fn track(&mut self, tgid: u32) -> Result<(), Error> {
        let w = |rel: &str, v: &str| {
            fs::write(self.dir.join(rel), v)
                .map_err(|e| Error::Tracefs(format!("writing {rel}: {e}")))
        };
        w("set_event_pid", &tgid.to_string())?;
        for ev in TRACEFS_EVENTS {
            let enable = format!("events/{ev}/enable");
            // The page-use events are 6.12 and later: without them the
            // trace has the pages read from storage, not those found cached.
            if !self.dir.join(&enable).exists()
                && ev.starts_with("filemap/mm_filemap_")
                && *ev != "filemap/mm_filemap_add_to_page_cache"
            {
                continue;
            }
            w(&enable, "1")?;
        }
        w("tracing_on", "1")?;
        self.root = Some(tgid);
        Ok(())
    }
    fn poll(&mut self, timeout: Duration, out: &mut Vec<Event>) -> Result<(), Error> {
        std::thread::sleep(timeout);
        self.drain_lines(out);
        if let Some(root) = self.root {
            sample_files(
                Path::new("/proc"),
                root,
                &mut self.known,
                out,
                monotonic_ns(),
            );
        }
        Ok(())
    }
    fn finish(&mut self, out: &mut Vec<Event>) -> Result<(), Error> {
        let _ = fs::write(self.dir.join("tracing_on"), "0");
        std::thread::sleep(Duration::from_millis(50));
        self.drain_lines(out);
        Ok(())
    }
    fn drops(&self) -> u64 {
        let mut n = 0;
        if let Ok(rd) = fs::read_dir(self.dir.join("per_cpu")) {
            for cpu in rd.flatten() {
                if let Ok(s) = fs::read_to_string(cpu.path().join("stats")) {
                    n += s
                        .lines()
                        .filter_map(|l| l.strip_prefix("overrun:"))
                        .filter_map(|v| v.trim().parse::<u64>().ok())
                        .sum::<u64>();
                }
            }
        }
        n
    }
}

impl Drop for TracefsSource {
    fn drop(&mut self) {
        let _ = fs::write(self.dir.join("tracing_on"), "0");
        for ev in TRACEFS_EVENTS {
            let _ = fs::write(self.dir.join(format!("events/{ev}/enable")), "0");
        }
        // Removing the instance wakes the blocked trace_pipe reader with EOF.
        let _ = fs::remove_dir(&self.dir);
        if let Some(r) = self.reader.take() {
            drop(r); // detached: it ends when the pipe is gone
        }
    }
}

/// Parses one trace_pipe line, e.g.
/// `cat-42 [001] ..... 12.5: mm_filemap_get_pages: dev=254:0 ino=1a ofs=0-8191`.
pub fn parse_tracefs_line(line: &str) -> Option<Event> {
    let (head, rest) = line.split_once(": ")?;
    let (name, args) = rest.split_once(": ")?;
    let ts_ns = head
        .split_whitespace()
        .last()
        .and_then(|t| t.parse::<f64>().ok())
        .map(|s| (s * 1e9) as u64)?;
    let task = head.split_whitespace().next()?;
    let tgid = task.rsplit_once('-')?.1.parse::<u32>().ok()?;
    let field =
        |k: &str| -> Option<&str> { args.split_whitespace().find_map(|kv| kv.strip_prefix(k)) };
    let devpair = |s: &str| -> Option<u32> {
        let (a, b) = s.split_once(':')?;
        Some((a.parse::<u32>().ok()? << 20) | b.parse::<u32>().ok()?)
    };
    match name {
        "mm_filemap_add_to_page_cache" => {
            // "dev 254:0 ino 1a pfn=0x.. ofs=4096 order=0"
            let mut it = args.split_whitespace();
            let dev = devpair(it.nth(1)?)?;
            let ino = u64::from_str_radix(it.nth(1)?, 16).ok()?;
            let ofs: u64 = field("ofs=")?.parse().ok()?;
            let order: u32 = field("order=").and_then(|o| o.parse().ok()).unwrap_or(0);
            Some(Event::Page {
                kind: PageKind::Added,
                pid: tgid,
                tgid,
                ts_ns,
                dev,
                ino,
                index: ofs / 4096,
                count: 1 << order.min(31),
            })
        }
        "mm_filemap_get_pages" | "mm_filemap_map_pages" | "mm_filemap_fault" => {
            let dev = devpair(field("dev=")?)?;
            let ino = u64::from_str_radix(field("ino=")?, 16).ok()?;
            let ofs = field("ofs=")?;
            let (a, b) = ofs.split_once('-').unwrap_or((ofs, ofs));
            let a: u64 = a.parse().ok()?;
            let b: u64 = b.parse().ok()?;
            let kind = match name {
                "mm_filemap_get_pages" => PageKind::Read,
                "mm_filemap_map_pages" => PageKind::Mapped,
                _ => PageKind::Fault,
            };
            Some(Event::Page {
                kind,
                pid: tgid,
                tgid,
                ts_ns,
                dev,
                ino,
                index: a / 4096,
                count: b / 4096 - a / 4096 + 1,
            })
        }
        "sched_process_fork" => {
            let parent = field("pid=")?.parse().ok()?;
            let child = field("child_pid=")?.parse().ok()?;
            Some(Event::Fork {
                parent_tgid: parent,
                child_tgid: child,
                ts_ns,
                comm: field("child_comm=").unwrap_or("").to_string(),
            })
        }
        "sched_process_exit" => Some(Event::Exit {
            tgid: field("pid=")?.parse().ok()?,
            ts_ns,
        }),
        "sched_process_exec" => {
            let path = field("filename=")?.to_string();
            Some(Event::Exec {
                tgid,
                ts_ns,
                file: exec_file(&path),
                argv: None,
                // tracefs's exec event has no uid; only the daemon, which
                // records with eBPF, names profiles by user.
                uid: u32::MAX,
            })
        }
        _ => None,
    }
}

/// The file tracefs says was exec'd. Its `filename=` is the path as given
/// to execve (`/bin/sh`, often a symlink); the BPF source reports the
/// resolved one. Resolved here too (realpath: lstat and readlink, no
/// open), because recorded paths are later identified and opened without
/// following a final symlink.
fn exec_file(path: &str) -> KFile {
    let resolved = fs::canonicalize(path)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| path.to_string());
    let path = resolved.as_str();
    let m = fs::symlink_metadata(path).ok();
    KFile {
        dev: m
            .as_ref()
            .map(|m| ((libc::major(m.dev()) as u32) << 20) | libc::minor(m.dev()))
            .unwrap_or(0),
        ino: m.as_ref().map(|m| m.ino()).unwrap_or(0),
        mode: m.as_ref().map(|m| m.mode()).unwrap_or(0),
        size: m.as_ref().map(|m| m.size()).unwrap_or(0),
        path: WsPath {
            components: path
                .trim_start_matches('/')
                .rsplit('/')
                .map(str::to_string)
                .collect(),
            truncated: false,
        },
    }
}

/// No privileges: sample what the tree opens and maps, and at the end
/// report the pages of those files that are resident. Unordered and
/// approximate — pages cached before the launch count as used.
struct MincoreSource {
    proc_root: PathBuf,
    root: Option<u32>,
    known: HashSet<Seen>,
}

impl MincoreSource {
    fn new(proc_root: &Path) -> Self {
        Self {
            proc_root: proc_root.to_path_buf(),
            root: None,
            known: HashSet::new(),
        }
    }
}

impl Source for MincoreSource {
    fn backend(&self) -> Backend {
        Backend::Mincore
    }
    fn track(&mut self, tgid: u32) -> Result<(), Error> {
        self.root = Some(tgid);
        Ok(())
    }
    fn poll(&mut self, timeout: Duration, out: &mut Vec<Event>) -> Result<(), Error> {
        std::thread::sleep(timeout);
        if let Some(root) = self.root {
            sample_files(&self.proc_root, root, &mut self.known, out, monotonic_ns());
        }
        Ok(())
    }
    fn finish(&mut self, out: &mut Vec<Event>) -> Result<(), Error> {
        let ts = monotonic_ns();
        for s in &self.known {
            // A path from /proc that may since name something else: only
            // the inode seen, and never a FIFO or a device.
            let seen = warmstart_sys::FileIdentity {
                dev: s.dev,
                ino: s.ino,
                ..Default::default()
            };
            let Ok(o) = warmstart_sys::OpenOptions::file()
                .expect(seen, warmstart_sys::identity::Match::Inode)
                .open(&s.path)
            else {
                continue;
            };
            let f = o.file;
            let kdev = ((libc::major(s.dev) as u32) << 20) | libc::minor(s.dev);
            for (index, count) in warmstart_sys::residency::resident_runs(&f).unwrap_or_default() {
                out.push(Event::Page {
                    kind: PageKind::Read,
                    pid: 0,
                    tgid: self.root.unwrap_or(0),
                    ts_ns: ts,
                    dev: kdev,
                    ino: s.ino,
                    index,
                    count,
                });
            }
        }
        Ok(())
    }
    fn drops(&self) -> u64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_tracefs_instances_are_swept() {
        let d = tempfile::tempdir().unwrap();
        let (inst, proc) = (d.path().join("instances"), d.path().join("proc"));
        for n in ["warmstart-10", "warmstart-11", "warmstart-x", "other-12"] {
            std::fs::create_dir_all(inst.join(n)).unwrap();
        }
        std::fs::create_dir_all(proc.join("11")).unwrap(); // still running
        assert_eq!(sweep_stale_instances(&inst, &proc), 1);
        let mut left: Vec<_> = std::fs::read_dir(&inst)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["other-12", "warmstart-11", "warmstart-x"]);
    }

    #[test]
    fn a_tracefs_exec_names_the_resolved_program() {
        let d = tempfile::tempdir().unwrap();
        let prog = d.path().join("prog");
        std::fs::write(&prog, b"#!/bin/sh\n").unwrap();
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&prog, &link).unwrap();
        let f = exec_file(link.to_str().unwrap());
        let named: Vec<&str> = f.path.components.iter().rev().map(String::as_str).collect();
        let want = std::fs::canonicalize(&prog).unwrap();
        assert_eq!(format!("/{}", named.join("/")), want.display().to_string());
        assert_eq!(f.ino, std::fs::metadata(&prog).unwrap().ino());
    }

    #[test]
    fn tracefs_lines() {
        let cases = [
            (
                "  python3-4242  [001] ..... 12.500000: mm_filemap_add_to_page_cache: dev 254:0 ino 1a pfn=0x1234 ofs=8192 order=2",
                Some(Event::Page { kind: PageKind::Added, pid: 4242, tgid: 4242, ts_ns: 12_500_000_000, dev: 254 << 20, ino: 0x1a, index: 2, count: 4 }),
            ),
            (
                "cat-7 [000] ...1. 1.000000: mm_filemap_get_pages: dev=254:0 ino=ff ofs=0-8191",
                Some(Event::Page { kind: PageKind::Read, pid: 7, tgid: 7, ts_ns: 1_000_000_000, dev: 254 << 20, ino: 0xff, index: 0, count: 2 }),
            ),
            (
                "a-b-9 [000] ..... 2.000000: mm_filemap_fault: dev=7:0 ino=3 ofs=4096",
                Some(Event::Page { kind: PageKind::Fault, pid: 9, tgid: 9, ts_ns: 2_000_000_000, dev: 7 << 20, ino: 3, index: 1, count: 1 }),
            ),
            (
                "sh-1 [000] ..... 3.000000: sched_process_fork: comm=sh pid=1 child_comm=sh child_pid=2",
                Some(Event::Fork { parent_tgid: 1, child_tgid: 2, ts_ns: 3_000_000_000, comm: "sh".into() }),
            ),
            ("sh-2 [000] ..... 4.000000: sched_process_exit: comm=sh pid=2 prio=120", Some(Event::Exit { tgid: 2, ts_ns: 4_000_000_000 })),
            ("garbage", None),
        ];
        for (line, want) in cases {
            assert_eq!(parse_tracefs_line(line), want, "{line}");
        }
    }
}
