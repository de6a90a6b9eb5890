//! Scheduling of the replay's threads: CPU affinity, I/O priority,
//! leaving real-time and running at idle priority. Each call affects only
//! the calling thread.

use std::io;

use crate::backend::IoPriority;
use crate::ReplayError;

/// `IOPRIO_WHO_PROCESS`: with id 0, the calling thread.
const IOPRIO_WHO_PROCESS: libc::c_int = 1;

pub(super) fn thread_cpus() -> Result<Vec<usize>, ReplayError> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the kernel writes
    // at most its size; pid 0 is the calling thread.
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(ReplayError::Affinity {
                cpus: "(reading the current ones)".into(),
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

pub(super) fn set_thread_cpus(cpus: &[usize]) -> Result<(), ReplayError> {
    let fail = |source| ReplayError::Affinity {
        cpus: crate::ReplayCpus::List(cpus.to_vec()).to_string(),
        source,
    };
    if cpus.iter().any(|&c| c >= libc::CPU_SETSIZE as usize) {
        return Err(fail(io::Error::from_raw_os_error(libc::EINVAL)));
    }
    // SAFETY: a zeroed cpu_set_t is a valid empty set and every index
    // is below CPU_SETSIZE; pid 0 is the calling thread.
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

pub(super) fn leave_realtime() {
    // SAFETY: pid 0 is the calling thread; param is a valid
    // sched_param. A failure leaves the thread as it was.
    unsafe {
        let policy = libc::sched_getscheduler(0);
        if policy == libc::SCHED_FIFO || policy == libc::SCHED_RR {
            let param = libc::sched_param { sched_priority: 0 };
            libc::sched_setscheduler(0, libc::SCHED_OTHER, &param);
        }
    }
}

pub(super) fn run_when_idle() -> Result<(), ReplayError> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; param is a valid
    // sched_param. Lowering one's own priority needs no privilege.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
        return Err(ReplayError::IdlePriority {
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

pub(super) fn set_io_priority(prio: IoPriority) -> Result<(), ReplayError> {
    // SAFETY: plain syscall with integer arguments; it affects only the
    // calling thread (who = IOPRIO_WHO_PROCESS, id = 0).
    let r = unsafe {
        libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            0 as libc::c_int,
            libc::c_int::from(prio.raw()),
        )
    };
    if r < 0 {
        return Err(ReplayError::IoPriority {
            prio,
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_when_idle_moves_the_thread_to_sched_idle() {
        std::thread::spawn(|| {
            run_when_idle().unwrap();
            // SAFETY: pid 0 is the calling thread.
            assert_eq!(unsafe { libc::sched_getscheduler(0) }, libc::SCHED_IDLE);
        })
        .join()
        .unwrap();
    }

    /// A thread started by a real-time thread inherits its priority; the
    /// replay's threads give it up after their first piece of work. Needs
    /// CAP_SYS_NICE to become real-time at all (the root tests have it).

    #[test]
    fn leave_realtime_returns_to_normal_scheduling() {
        std::thread::spawn(|| {
            let p = libc::sched_param { sched_priority: 1 };
            // SAFETY: pid 0 is this test thread; p is a valid sched_param.
            if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) } != 0 {
                eprintln!("skipped: cannot become real-time here");
                return;
            }
            leave_realtime();
            // SAFETY: reads the calling thread's policy.
            assert_eq!(unsafe { libc::sched_getscheduler(0) }, libc::SCHED_OTHER);
            leave_realtime();
            // SAFETY: as above.
            assert_eq!(unsafe { libc::sched_getscheduler(0) }, libc::SCHED_OTHER);
        })
        .join()
        .unwrap();
    }
}
