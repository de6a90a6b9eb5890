//! CPU and I/O priority of the calling thread: the daemon waits for execs
//! at real-time priority and must drop it before per-launch work; a replay
//! may run at idle CPU or I/O priority so it never competes with the
//! program it prefetches for. Every call here affects the calling thread
//! only (Linux applies these per thread when given id 0).

use std::fmt;
use std::io;
use std::str::FromStr;

use crate::Error;

/// `IOPRIO_WHO_PROCESS`: with id 0, the calling thread.
const IOPRIO_WHO_PROCESS: libc::c_int = 1;
const IOPRIO_CLASS_SHIFT: u32 = 13;
const IOPRIO_CLASS_NONE: u16 = 0;
const IOPRIO_CLASS_RT: u16 = 1;
const IOPRIO_CLASS_BE: u16 = 2;
const IOPRIO_CLASS_IDLE: u16 = 3;

/// An I/O priority (see ioprio_set(2)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoPriority {
    /// No class set: derived from the nice value.
    None,
    /// Real-time at level 0 (highest) to 7; needs CAP_SYS_ADMIN.
    RealTime(u8),
    /// Best-effort at level 0 (highest) to 7 (lowest).
    BestEffort(u8),
    /// Served only when no one else needs the disk.
    Idle,
}

impl IoPriority {
    /// `IOPRIO_PRIO_VALUE(class, level)`.
    pub fn raw(self) -> u16 {
        let (class, level) = match self {
            IoPriority::None => (IOPRIO_CLASS_NONE, 0),
            IoPriority::RealTime(l) => (IOPRIO_CLASS_RT, l.min(7)),
            IoPriority::BestEffort(l) => (IOPRIO_CLASS_BE, l.min(7)),
            IoPriority::Idle => (IOPRIO_CLASS_IDLE, 0),
        };
        (class << IOPRIO_CLASS_SHIFT) | u16::from(level)
    }

    pub fn from_raw(raw: u16) -> IoPriority {
        let level = (raw & 0x7) as u8;
        match raw >> IOPRIO_CLASS_SHIFT {
            IOPRIO_CLASS_RT => IoPriority::RealTime(level),
            IOPRIO_CLASS_BE => IoPriority::BestEffort(level),
            IOPRIO_CLASS_IDLE => IoPriority::Idle,
            _ => IoPriority::None,
        }
    }
}

impl fmt::Display for IoPriority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IoPriority::None => f.write_str("none"),
            IoPriority::RealTime(l) => write!(f, "realtime:{l}"),
            IoPriority::BestEffort(l) => write!(f, "best-effort:{l}"),
            IoPriority::Idle => f.write_str("idle"),
        }
    }
}

impl FromStr for IoPriority {
    type Err = String;

    /// `idle`, `none`, `best-effort:N`/`be:N`, `realtime:N`/`rt:N` (N 0..=7).
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "idle" => return Ok(IoPriority::Idle),
            "none" => return Ok(IoPriority::None),
            _ => {}
        }
        let (make, level): (fn(u8) -> IoPriority, &str) = if let Some(l) = s
            .strip_prefix("best-effort:")
            .or_else(|| s.strip_prefix("be:"))
        {
            (IoPriority::BestEffort, l)
        } else if let Some(l) = s
            .strip_prefix("realtime:")
            .or_else(|| s.strip_prefix("rt:"))
        {
            (IoPriority::RealTime, l)
        } else {
            return Err(format!(
                "unknown I/O priority {s:?} (expected idle, none, be:N or rt:N)"
            ));
        };
        match level.parse::<u8>() {
            Ok(n) if n <= 7 => Ok(make(n)),
            _ => Err(format!("I/O priority level must be 0..=7, got {level:?}")),
        }
    }
}

/// Sets the calling thread's I/O priority.
pub fn set_io_priority(prio: IoPriority) -> Result<(), Error> {
    // SAFETY: a plain syscall with integer arguments, affecting only the
    // calling thread.
    let r = unsafe {
        libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            0 as libc::c_int,
            libc::c_int::from(prio.raw()),
        )
    };
    if r < 0 {
        return Err(Error::IoPriority {
            prio: prio.to_string(),
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// The calling thread's I/O priority.
pub fn io_priority() -> Result<IoPriority, Error> {
    // SAFETY: a plain syscall with integer arguments that only reads.
    let r = unsafe { libc::syscall(libc::SYS_ioprio_get, IOPRIO_WHO_PROCESS, 0 as libc::c_int) };
    if r < 0 {
        return Err(Error::IoPriority {
            prio: "(get)".into(),
            source: io::Error::last_os_error(),
        });
    }
    Ok(IoPriority::from_raw(r as u16))
}

/// A CPU scheduling policy (see sched(7)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// `SCHED_FIFO` at priority 1..=99; needs CAP_SYS_NICE.
    Fifo(u8),
    /// `SCHED_RR` at priority 1..=99; needs CAP_SYS_NICE.
    RoundRobin(u8),
    /// `SCHED_OTHER`.
    Normal,
    /// `SCHED_BATCH`: CPU-bound, wakes up later than Normal.
    Batch,
    /// `SCHED_IDLE`: runs only on a CPU nothing else wants.
    Idle,
}

impl Policy {
    pub fn is_realtime(self) -> bool {
        matches!(self, Policy::Fifo(_) | Policy::RoundRobin(_))
    }

    fn raw(self) -> (libc::c_int, libc::c_int) {
        match self {
            Policy::Fifo(p) => (libc::SCHED_FIFO, p.into()),
            Policy::RoundRobin(p) => (libc::SCHED_RR, p.into()),
            Policy::Normal => (libc::SCHED_OTHER, 0),
            Policy::Batch => (libc::SCHED_BATCH, 0),
            Policy::Idle => (libc::SCHED_IDLE, 0),
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Policy::Fifo(p) => write!(f, "SCHED_FIFO:{p}"),
            Policy::RoundRobin(p) => write!(f, "SCHED_RR:{p}"),
            Policy::Normal => f.write_str("SCHED_OTHER"),
            Policy::Batch => f.write_str("SCHED_BATCH"),
            Policy::Idle => f.write_str("SCHED_IDLE"),
        }
    }
}

/// Sets the calling thread's scheduling policy. Lowering it (to Normal,
/// Batch or Idle) needs no privilege.
pub fn set_policy(policy: Policy) -> Result<(), Error> {
    let (raw, priority) = policy.raw();
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param
    // that outlives the call.
    if unsafe { libc::sched_setscheduler(0, raw, &param) } != 0 {
        return Err(Error::Scheduler {
            policy: policy.to_string(),
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// The calling thread's scheduling policy.
pub fn policy() -> Result<Policy, Error> {
    let get_err = || Error::Scheduler {
        policy: "(get)".into(),
        source: io::Error::last_os_error(),
    };
    // SAFETY: pid 0 is the calling thread; no memory is passed.
    let raw = unsafe { libc::sched_getscheduler(0) };
    if raw < 0 {
        return Err(get_err());
    }
    let mut param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` is a live sched_param
    // the kernel writes.
    if unsafe { libc::sched_getparam(0, &mut param) } != 0 {
        return Err(get_err());
    }
    let prio = u8::try_from(param.sched_priority).unwrap_or(0);
    Ok(match raw & !libc::SCHED_RESET_ON_FORK {
        libc::SCHED_FIFO => Policy::Fifo(prio),
        libc::SCHED_RR => Policy::RoundRobin(prio),
        libc::SCHED_BATCH => Policy::Batch,
        libc::SCHED_IDLE => Policy::Idle,
        _ => Policy::Normal,
    })
}

/// Drops real-time priority (FIFO or RR) to Normal; returns whether the
/// thread was real-time. Other policies are left as they are.
pub fn leave_realtime() -> Result<bool, Error> {
    if !policy()?.is_realtime() {
        return Ok(false);
    }
    set_policy(Policy::Normal)?;
    Ok(true)
}

/// The CPUs the calling thread may run on, in ascending order.
pub fn thread_cpus() -> Result<Vec<usize>, Error> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the kernel writes
    // at most its size; pid 0 is the calling thread.
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(Error::Affinity {
                cpus: "(get)".into(),
                source: io::Error::last_os_error(),
            });
        }
        set
    };
    // SAFETY: CPU_ISSET reads the set; every index is below CPU_SETSIZE.
    Ok((0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// The CPU the calling thread runs on at the time of the call (it may
/// move right after), or `None` if the kernel does not say.
pub fn current_cpu() -> Option<usize> {
    // SAFETY: takes no arguments and only reads.
    usize::try_from(unsafe { libc::sched_getcpu() }).ok()
}

/// Confines the calling thread to `cpus`.
pub fn set_thread_cpus(cpus: &[usize]) -> Result<(), Error> {
    let fail = |source| {
        let names: Vec<String> = cpus.iter().map(ToString::to_string).collect();
        Error::Affinity {
            cpus: names.join(","),
            source,
        }
    };
    if cpus.iter().any(|&c| c >= libc::CPU_SETSIZE as usize) {
        return Err(fail(io::Error::from_raw_os_error(libc::EINVAL)));
    }
    // SAFETY: a zeroed cpu_set_t is a valid empty set and every index is
    // below CPU_SETSIZE; pid 0 is the calling thread.
    let r = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if r != 0 {
        return Err(fail(io::Error::last_os_error()));
    }
    Ok(())
}

/// Sets the calling thread's nice value (-20..=19; lowering it needs
/// CAP_SYS_NICE).
pub fn set_nice(nice: i32) -> Result<(), Error> {
    // SAFETY: a plain syscall with integer arguments; who 0 with
    // PRIO_PROCESS is the calling thread on Linux.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) } != 0 {
        return Err(Error::Nice {
            nice,
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// The calling thread's nice value.
pub fn nice() -> Result<i32, Error> {
    // getpriority may return -1 legitimately: clear errno to tell.
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = 0 };
    // SAFETY: a plain syscall with integer arguments that only reads.
    let n = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    let e = io::Error::last_os_error();
    if n == -1 && e.raw_os_error() != Some(0) {
        return Err(Error::Nice { nice: n, source: e });
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each test changes only a thread of its own.
    fn on_own_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(f).join().unwrap()
    }

    #[test]
    fn io_priority_values_round_trip() {
        for (p, raw, text) in [
            (IoPriority::Idle, 3 << 13, "idle"),
            (IoPriority::BestEffort(4), (2 << 13) | 4, "best-effort:4"),
            (IoPriority::RealTime(0), 1 << 13, "realtime:0"),
            (IoPriority::None, 0, "none"),
        ] {
            assert_eq!(p.raw(), raw);
            assert_eq!(IoPriority::from_raw(raw), p);
            assert_eq!(p.to_string(), text);
            assert_eq!(text.parse::<IoPriority>().unwrap(), p);
        }
        assert_eq!(
            "be:9".parse::<IoPriority>().unwrap_err(),
            "I/O priority level must be 0..=7, got \"9\""
        );
        assert!("fast".parse::<IoPriority>().is_err());
        assert_eq!(IoPriority::BestEffort(200).raw(), (2 << 13) | 7);
    }

    #[test]
    fn io_priority_is_set_on_the_calling_thread() {
        on_own_thread(|| {
            set_io_priority(IoPriority::Idle).unwrap();
            assert_eq!(io_priority().unwrap(), IoPriority::Idle);
            // Idle -> best-effort 7 is allowed without privilege.
            set_io_priority(IoPriority::BestEffort(7)).unwrap();
            assert_eq!(io_priority().unwrap(), IoPriority::BestEffort(7));
        });
    }

    #[test]
    fn lowering_the_policy_and_leaving_realtime() {
        on_own_thread(|| {
            assert!(!leave_realtime().unwrap());
            set_policy(Policy::Batch).unwrap();
            assert_eq!(policy().unwrap(), Policy::Batch);
            set_policy(Policy::Idle).unwrap();
            assert_eq!(policy().unwrap(), Policy::Idle);
            // Real-time needs CAP_SYS_NICE; where we have it, check the drop.
            if set_policy(Policy::Fifo(1)).is_ok() {
                assert_eq!(policy().unwrap(), Policy::Fifo(1));
                assert!(leave_realtime().unwrap());
                assert_eq!(policy().unwrap(), Policy::Normal);
            }
        });
    }

    #[test]
    fn affinity_is_per_thread() {
        let all = thread_cpus().unwrap();
        assert!(!all.is_empty());
        let last = *all.last().unwrap();
        on_own_thread(move || {
            set_thread_cpus(&[last]).unwrap();
            assert_eq!(thread_cpus().unwrap(), vec![last]);
            let e = set_thread_cpus(&[0, libc::CPU_SETSIZE as usize]).unwrap_err();
            assert!(
                matches!(&e, Error::Affinity { source, .. } if source.raw_os_error() == Some(libc::EINVAL)),
                "{e}"
            );
        });
        assert_eq!(thread_cpus().unwrap(), all);
    }

    #[test]
    fn the_current_cpu_is_one_the_thread_may_run_on() {
        let all = thread_cpus().unwrap();
        let last = *all.last().unwrap();
        assert!(all.contains(&current_cpu().unwrap()));
        on_own_thread(move || {
            set_thread_cpus(&[last]).unwrap();
            assert_eq!(current_cpu(), Some(last));
        });
    }

    #[test]
    fn nice_is_per_thread() {
        let before = nice().unwrap();
        on_own_thread(move || {
            set_nice(before + 1).unwrap();
            assert_eq!(nice().unwrap(), (before + 1).min(19));
        });
        assert_eq!(nice().unwrap(), before);
    }
}
