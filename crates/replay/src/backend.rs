//! The OS boundary of replay, as a small trait: everything the engine does
//! to the system goes through [`Backend`], so the scheduling, validation,
//! chunking and memory-guard logic is tested against [`crate::MockBackend`]
//! without root, and [`crate::RealBackend`] stays a thin layer of syscalls.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use warmstart_plan::trace::{FileId, NsOpKind};

use crate::ReplayError;

/// System memory, in bytes, as `/proc/meminfo` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemInfo {
    /// `MemTotal`.
    pub total: u64,
    /// `MemAvailable`: what can be allocated without swapping, counting
    /// reclaimable page cache.
    pub available: u64,
}

/// How much of a byte range is in the page cache, in pages. Ranges are
/// clipped at the end of the file or device, since pages past it cannot be
/// cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Residency {
    pub resident: u64,
    pub pages: u64,
}

impl Residency {
    pub fn complete(&self) -> bool {
        self.resident >= self.pages
    }
}

/// The outcome of a path lookup that did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LookupOutcome {
    /// The path resolved (and, for directory reads, was listed).
    Found,
    /// The path does not exist (`ENOENT`/`ENOTDIR`). Still useful: the
    /// kernel caches the negative dentry the application will hit too.
    NotFound,
    /// A directory was looked up but not listed, because listing it without
    /// `O_NOATIME` would update its access time and we may not use
    /// `O_NOATIME` on it (not its owner, no `CAP_FOWNER`).
    StatOnly,
}

/// I/O priority for the replay threads (`ioprio_set(2)`): the classes of
/// [`warmstart_sys::sched::IoPriority`] a replay may use. Real-time is left
/// out on purpose: prefetching must never be served ahead of the
/// application's own reads.
///
/// The priority is attached to the requests a thread submits, so it orders
/// prefetch I/O against the application's own reads where the scheduler
/// honours classes (BFQ; mq-deadline partially); `none` ignores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum IoPriority {
    /// Served only when no one else needs the disk.
    Idle,
    /// Best-effort at level 0 (highest) to 7 (lowest).
    BestEffort(u8),
}

impl IoPriority {
    /// The value `ioprio_set` takes (`IOPRIO_PRIO_VALUE(class, level)`).
    pub fn raw(self) -> u16 {
        warmstart_sys::sched::IoPriority::from(self).raw()
    }
}

impl From<IoPriority> for warmstart_sys::sched::IoPriority {
    fn from(p: IoPriority) -> Self {
        match p {
            IoPriority::Idle => warmstart_sys::sched::IoPriority::Idle,
            IoPriority::BestEffort(level) => warmstart_sys::sched::IoPriority::BestEffort(level),
        }
    }
}

impl fmt::Display for IoPriority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        warmstart_sys::sched::IoPriority::from(*self).fmt(f)
    }
}

impl FromStr for IoPriority {
    type Err = String;

    /// Parses `idle`, `best-effort:N` or `be:N` (N in 0..=7).
    fn from_str(s: &str) -> Result<Self, String> {
        use warmstart_sys::sched::IoPriority as Any;
        let wrong = || format!("unknown I/O priority {s:?} (expected idle, be:N or best-effort:N)");
        match s.parse::<Any>() {
            Ok(Any::Idle) => Ok(IoPriority::Idle),
            Ok(Any::BestEffort(n)) => Ok(IoPriority::BestEffort(n)),
            Ok(Any::None | Any::RealTime(_)) => Err(wrong()),
            Err(e) if s.starts_with("be:") || s.starts_with("best-effort:") => Err(e),
            Err(_) => Err(wrong()),
        }
    }
}

/// Which CPUs the replay's threads run on.
///
/// Measured on the project's 2-core VM (Python plan, 30 interleaved cold
/// launches through `warmstart run`, 2026-11-23): with its threads free to
/// run anywhere, the replay (about 50 ms of system time for 20 MB and 257
/// path lookups, mostly per-I/O cost) preempted the application on both
/// CPUs; confined to one CPU it captured 69% of the cold-warm gap instead
/// of 57%, faster in 21 of 30 pairs (median 9.8 ms). Which CPU did not
/// matter: the one taking the disk's interrupts and the other were even
/// (14 of 30).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ReplayCpus {
    /// One CPU, the last one the process may run on, leaving the others to
    /// the application. Nothing is pinned when the process may run on only
    /// one CPU.
    #[default]
    One,
    /// Wherever the scheduler puts them.
    All,
    /// These CPUs.
    List(Vec<usize>),
    /// Anywhere, but at idle scheduling priority (`SCHED_IDLE`) once each
    /// thread has done its first piece of work: the replay then runs only
    /// on a CPU nothing else wants, so it never takes CPU time from the
    /// program it prefetches for (the head start before the program runs
    /// is unaffected). For launches that keep both CPUs busy themselves,
    /// such as a JVM's (see docs/guide/run.md).
    Idle,
}

impl ReplayCpus {
    /// The CPUs to confine the replay's threads to, given the ones the
    /// process may run on; `None`: leave them where they are. A list keeps
    /// only the CPUs allowed, and may come out empty.
    pub fn choose(&self, allowed: &[usize]) -> Option<Vec<usize>> {
        match self {
            ReplayCpus::One if allowed.len() > 1 => allowed.iter().max().map(|&c| vec![c]),
            ReplayCpus::One | ReplayCpus::All | ReplayCpus::Idle => None,
            ReplayCpus::List(l) => {
                Some(l.iter().filter(|c| allowed.contains(c)).copied().collect())
            }
        }
    }
}

impl ReplayCpus {
    /// A warning when a list names CPUs this process may not use, given
    /// the ones it may.
    pub fn check(&self, allowed: &[usize]) -> Option<String> {
        let ReplayCpus::List(l) = self else {
            return None;
        };
        let bad: Vec<usize> = l.iter().filter(|c| !allowed.contains(c)).copied().collect();
        if bad.is_empty() {
            return None;
        }
        let allowed = ReplayCpus::List(allowed.to_vec());
        Some(if bad.len() == l.len() {
            format!("replay CPUs {self}: none may be used here (allowed: {allowed}); replays will run anywhere")
        } else {
            format!(
                "replay CPUs {self}: {} may not be used here (allowed: {allowed}); replays will use the others",
                ReplayCpus::List(bad)
            )
        })
    }
}

impl fmt::Display for ReplayCpus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplayCpus::One => f.write_str("one"),
            ReplayCpus::All => f.write_str("all"),
            ReplayCpus::Idle => f.write_str("idle"),
            ReplayCpus::List(l) => {
                let l: Vec<String> = l.iter().map(ToString::to_string).collect();
                f.write_str(&l.join(","))
            }
        }
    }
}

impl FromStr for ReplayCpus {
    type Err = String;

    /// Parses `one`, `all`, `idle`, or a CPU list such as `1` or `0,2-3`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "one" => return Ok(ReplayCpus::One),
            "all" => return Ok(ReplayCpus::All),
            "idle" => return Ok(ReplayCpus::Idle),
            _ => {}
        }
        let bad = || format!("{s:?} is not one, all, idle or a CPU list such as 1 or 0,2-3");
        let mut cpus = Vec::new();
        for part in s.split(',') {
            let part = part.trim();
            let (a, b) = match part.split_once('-') {
                Some((a, b)) => (a, b),
                None => (part, part),
            };
            let (a, b): (usize, usize) = (
                a.trim().parse().map_err(|_| bad())?,
                b.trim().parse().map_err(|_| bad())?,
            );
            if a > b || b >= libc::CPU_SETSIZE as usize {
                return Err(bad());
            }
            cpus.extend(a..=b);
        }
        cpus.sort_unstable();
        cpus.dedup();
        Ok(ReplayCpus::List(cpus))
    }
}

/// Everything replay does to the operating system.
///
/// Implementations must be usable from several worker threads at once.
pub trait Backend: Sync {
    /// An open regular file or block device. Dropping it closes it.
    type Handle: Send + Sync;

    /// Opens a regular file read-only for prefetching, without ever updating
    /// its access time where that is allowed, and returns its identity as it
    /// is now. Implementations should tell the kernel not to add readahead
    /// of its own on this descriptor.
    fn open_file(&self, path: &Path) -> Result<(Self::Handle, FileId), ReplayError>;

    /// Opens block device `device` (`st_rdev` numbering) read-only.
    fn open_device(&self, device: u64) -> Result<Self::Handle, ReplayError>;

    /// Why `device` cannot be opened, if this backend already knows (it
    /// was refused for lack of privilege in an earlier replay): the engine
    /// then skips the device's metadata without trying.
    fn refused_device(&self, _device: u64) -> Option<ReplayError> {
        None
    }

    /// The type of the filesystem mounted from block device `device`, as
    /// `/proc/self/mountinfo` names it (`ext4`, `xfs`, `btrfs`), if it is
    /// mounted and known. It decides whether reading the device fills the
    /// filesystem's metadata cache (see [`crate::device_reads_reach`]).
    fn device_filesystem(&self, _device: u64) -> Option<String> {
        None
    }

    /// Asks the kernel to read `offset..offset+len` into the page cache
    /// without waiting for it. The engine never passes more than
    /// [`Backend::read_ahead`] bytes.
    fn prefetch(&self, handle: &Self::Handle, offset: u64, len: u64) -> Result<(), ReplayError>;

    /// Repeats a path lookup to warm the dentry, inode and directory caches.
    fn lookup(&self, kind: NsOpKind, path: &Path) -> Result<LookupOutcome, ReplayError>;

    /// Current memory state.
    fn memory(&self) -> Result<MemInfo, ReplayError>;

    /// The most bytes one prefetch request reads on files of `st_dev ==
    /// device` or on block device `device`, if known.
    fn read_ahead(&self, device: u64) -> Option<u64>;

    /// How much of `offset..offset+len` is in the page cache.
    fn residency(
        &self,
        handle: &Self::Handle,
        offset: u64,
        len: u64,
    ) -> Result<Residency, ReplayError>;

    /// Reads `offset..offset+len` through the page cache and returns once
    /// it is there (I/O only for what is not). The residency wait uses it
    /// for a block device's ranges that stay absent: a filesystem reading
    /// or creating its metadata through buffer heads leaves the page
    /// cached but not marked up to date, so `WILLNEED` passes it by and
    /// `mincore` reports it absent for as long as the filesystem holds it
    /// (across `drop_caches`), while a read marks it up to date. The
    /// default does nothing.
    fn read_through(
        &self,
        _handle: &Self::Handle,
        _offset: u64,
        _len: u64,
    ) -> Result<(), ReplayError> {
        Ok(())
    }

    /// Sets the I/O priority of the calling thread.
    fn set_io_priority(&self, prio: IoPriority) -> Result<(), ReplayError>;

    /// The CPUs the calling thread may run on, in ascending order.
    fn thread_cpus(&self) -> Result<Vec<usize>, ReplayError>;

    /// Confines the calling thread to `cpus`.
    fn set_thread_cpus(&self, cpus: &[usize]) -> Result<(), ReplayError>;

    /// Returns the calling thread to normal scheduling if it runs at a
    /// real-time priority (inherited from the thread that started it).
    fn leave_realtime(&self) {}

    /// Moves the calling thread to idle scheduling priority
    /// ([`ReplayCpus::Idle`]).
    fn run_when_idle(&self) -> Result<(), ReplayError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_cpus_parse_and_choose() {
        let list = |v: &[usize]| Ok(ReplayCpus::List(v.to_vec()));
        let cases: [(&str, Result<ReplayCpus, ()>); 10] = [
            ("one", Ok(ReplayCpus::One)),
            ("all", Ok(ReplayCpus::All)),
            ("idle", Ok(ReplayCpus::Idle)),
            ("1", list(&[1])),
            ("3,0-1", list(&[0, 1, 3])),
            (" 2 - 3 , 2", list(&[2, 3])),
            ("", Err(())),
            ("3-1", Err(())),
            ("x", Err(())),
            ("4096", Err(())),
        ];
        for (text, want) in cases {
            assert_eq!(text.parse::<ReplayCpus>().map_err(|_| ()), want, "{text:?}");
        }
        assert_eq!(ReplayCpus::One.choose(&[0, 1, 2]), Some(vec![2]));
        assert_eq!(ReplayCpus::One.choose(&[5]), None);
        assert_eq!(ReplayCpus::All.choose(&[0, 1]), None);
        assert_eq!(ReplayCpus::Idle.choose(&[0, 1]), None);
        assert_eq!(ReplayCpus::Idle.to_string(), "idle");
        assert_eq!(ReplayCpus::List(vec![0]).choose(&[0, 1]), Some(vec![0]));
        assert_eq!(ReplayCpus::List(vec![1, 7]).choose(&[0, 1]), Some(vec![1]));
        assert_eq!(ReplayCpus::List(vec![7]).choose(&[0, 1]), Some(vec![]));
        assert_eq!(ReplayCpus::List(vec![1]).check(&[0, 1]), None);
        assert_eq!(ReplayCpus::One.check(&[0]), None);
        let partly = ReplayCpus::List(vec![1, 7]).check(&[0, 1]).unwrap();
        assert!(partly.contains("7 may not be used"), "{partly}");
        let none = ReplayCpus::List(vec![7]).check(&[0, 1]).unwrap();
        assert!(
            none.contains("none may be used here (allowed: 0,1)"),
            "{none}"
        );
        assert_eq!(ReplayCpus::List(vec![0, 2]).to_string(), "0,2");
    }

    #[test]
    fn io_priority_parse_and_raw() {
        let cases = [
            ("idle", Ok(IoPriority::Idle), Some(3 << 13)),
            ("be:0", Ok(IoPriority::BestEffort(0)), Some(2 << 13)),
            (
                "best-effort:7",
                Ok(IoPriority::BestEffort(7)),
                Some((2 << 13) | 7),
            ),
            ("be:8", Err(()), None),
            ("rt:1", Err(()), None),
            ("none", Err(()), None),
        ];
        for (text, want, raw) in cases {
            let got = text.parse::<IoPriority>();
            assert_eq!(got.clone().map_err(|_| ()), want, "{text}");
            if let (Ok(p), Some(raw)) = (got, raw) {
                assert_eq!(p.raw(), raw, "{text}");
                assert_eq!(
                    p.to_string().parse::<IoPriority>(),
                    Ok(p),
                    "{text} round trip"
                );
            }
        }
    }
}
