//! Host tuning for the daemon's own process: its code locked in memory,
//! the event loop's real-time wait, and where the replay threads it starts
//! run. None of it changes what the daemon decides, only how soon.

use std::io::Write;
use std::path::Path;

use warmstart_replay::{Backend as _, RealBackend};
use warmstart_sys::sched::{self, Policy};

/// Locks the daemon's own executable in memory. Code the daemon has not
/// run yet (deciding a launch, a replay) is otherwise read from storage
/// when the first launch needs it, behind that launch's own reads: a
/// freshly started daemon's first request came 7-23 ms after the exec
/// instead of 0.5-1.5 ms (cold `npm` launches, 23 November 2026), and a
/// long-running one loses the same way when memory pressure evicts code
/// it rarely runs. The binary is a few MiB; without the privilege
/// (`CAP_IPC_LOCK` or a large enough `RLIMIT_MEMLOCK`) it says so once.
pub(super) fn lock_own_code(log: &mut dyn Write) {
    let Ok(exe) = std::fs::read_link("/proc/self/exe") else {
        return;
    };
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return;
    };
    let mut locked = 0usize;
    let mut failed = None;
    for line in maps.lines() {
        // start-end perms offset dev inode path
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 6 || Path::new(fields[5]) != exe {
            continue;
        }
        let Some((start, end)) = fields[0].split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (
            usize::from_str_radix(start, 16),
            usize::from_str_radix(end, 16),
        ) else {
            continue;
        };
        // SAFETY: the range is one of this process's own mappings; mlock
        // reads nothing through the pointer, it pins the pages.
        if unsafe { libc::mlock(start as *const libc::c_void, end - start) } == 0 {
            locked += end - start;
        } else {
            failed = Some(std::io::Error::last_os_error());
        }
    }
    match failed {
        Some(e) => {
            let _ = writeln!(
                log,
                "warmstart daemon: cannot lock its code in memory ({e}); the first launches after a start or under memory pressure wait for it"
            );
        }
        None if locked > 0 => {
            let _ = writeln!(
                log,
                "warmstart daemon: its code ({:.1} MiB) is locked in memory",
                locked as f64 / (1 << 20) as f64
            );
        }
        None => {}
    }
}

/// Switches the calling thread between SCHED_FIFO (lowest priority) and
/// normal scheduling. Without CAP_SYS_NICE (a container) it says so once
/// and stays normal.
pub(super) struct Realtime {
    on: bool,
    failed: bool,
}

impl Realtime {
    pub(super) fn new(log: &mut dyn Write) -> Self {
        let mut rt = Realtime {
            on: false,
            failed: false,
        };
        if let Err(e) = rt.switch(true) {
            let _ = writeln!(
                log,
                "warmstart daemon: cannot wait for execs at real-time priority ({e}); replays start after the launching program's time slice"
            );
        }
        rt
    }

    /// One that never switches (tests: the test thread stays normal).
    #[cfg(test)]
    pub(super) fn disabled() -> Self {
        Realtime {
            on: false,
            failed: true,
        }
    }

    pub(super) fn set(&mut self, on: bool) {
        let _ = self.switch(on);
    }

    /// Once refused, it never tries again: the loop switches twice per
    /// launch and the answer would not change.
    fn switch(&mut self, on: bool) -> Result<(), warmstart_sys::Error> {
        if self.failed || self.on == on {
            return Ok(());
        }
        let policy = if on { Policy::Fifo(1) } else { Policy::Normal };
        match sched::set_policy(policy) {
            Ok(()) => {
                self.on = on;
                Ok(())
            }
            Err(e) => {
                self.failed = true;
                Err(e)
            }
        }
    }
}

/// Normal scheduling again when `run` returns: after a reload (SIGHUP)
/// the next `run` starts its threads from this one, and they would
/// inherit real-time priority for good.
impl Drop for Realtime {
    fn drop(&mut self) {
        self.set(false);
    }
}

/// Puts the calling thread back to normal scheduling if it runs at
/// real-time priority. A replay thread starts with the event loop's
/// SCHED_FIFO (so that it is placed and run at once); decoding, checking
/// and setting up its plan is per-plan work whose cost a plan decides,
/// and must never run ahead of every normal thread on the machine.
pub(super) fn leave_realtime() {
    // Lowering the policy needs no privilege; should it fail all the
    // same, the replay still runs, only ahead of normal threads.
    let _ = sched::leave_realtime();
}

/// Starts `f` on a new thread on the calling thread's CPU when the caller
/// is a real-time thread, passing it the CPUs it may move back to (`None`
/// if it was not pinned).
///
/// The daemon waits for execs at real-time priority, so the replay thread
/// it starts inherits SCHED_FIFO. Left to the kernel, a new real-time
/// thread goes to the CPU whose current task has the lowest priority,
/// which is usually the CPU running the program just exec'd; this kernel
/// does not preempt that program while it is in the kernel (loading the
/// binary, faulting in ld.so) and an idle CPU does not pull a lone waiting
/// real-time thread, so the replay sat there for 1-2 ms of a cold `npm`
/// launch (traced on the project's VM, 23 November 2026) while the other
/// CPU idled. Here it starts behind the daemon's thread, which lowers its
/// priority as soon as the launch is recorded.
pub(super) fn spawn_here<T: Send + 'static>(
    backend: &RealBackend,
    f: impl FnOnce(Option<Vec<usize>>) -> T + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<T>> {
    // A normal thread goes to an idle CPU by itself.
    let realtime = sched::policy().is_ok_and(Policy::is_realtime);
    let allowed = backend.thread_cpus().ok();
    let pinned = match (&allowed, sched::current_cpu()) {
        (Some(all), Some(cpu)) if realtime && all.len() > 1 && all.contains(&cpu) => {
            backend.set_thread_cpus(&[cpu]).is_ok()
        }
        _ => false,
    };
    let back = allowed.clone().filter(|_| pinned);
    let spawned = std::thread::Builder::new().spawn(move || f(back));
    if pinned {
        if let Some(all) = &allowed {
            let _ = backend.set_thread_cpus(all);
        }
    }
    spawned
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        sched::policy().unwrap()
    }

    /// Needs CAP_SYS_NICE (root) to become a real-time thread at all.
    #[test]
    fn root_replay_threads_leave_realtime_before_their_plan() {
        if !warmstart_testing::require_root("root_replay_threads_leave_realtime_before_their_plan")
        {
            return;
        }
        let backend = RealBackend::default();
        std::thread::spawn(move || {
            let mut rt = Realtime::new(&mut std::io::sink());
            rt.set(true);
            assert_eq!(policy(), Policy::Fifo(1));
            // What the daemon runs on each replay thread before its plan.
            let seen = spawn_here(&backend, |_| {
                let inherited = policy();
                leave_realtime();
                (inherited, policy())
            })
            .unwrap()
            .join()
            .unwrap();
            assert_eq!(seen, (Policy::Fifo(1), Policy::Normal));
            drop(rt);
            assert_eq!(policy(), Policy::Normal, "normal again after run");
        })
        .join()
        .unwrap();
    }
}
