//! The processes running inside a testbed: ended before it is torn down.
//!
//! A program run with [`crate::Testbed::command`] lives in a mount
//! namespace of its own, which keeps the image's filesystem mounted as
//! long as any process in it runs, whatever the host unmounts. Torn down
//! around such a process, the device model under the image stops and the
//! loop device is detached under a mounted filesystem: an interrupted
//! bench left its X server running this way, and ext4 on the image logged
//! write errors and aborted its journal. So the processes whose root is on
//! the image's filesystem are asked to end (SIGTERM), then made to
//! (SIGKILL), before anything is unmounted.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// How long processes inside get to end after SIGTERM (a daemon saving
/// its state), and after SIGKILL.
const GRACE: Duration = Duration::from_secs(5);
const KILL_WAIT: Duration = Duration::from_secs(2);

/// The processes under `proc` whose root directory is on device `dev`,
/// other than this one.
pub(crate) fn processes_on(proc: &Path, dev: u64) -> Vec<i32> {
    let me = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir(proc) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::metadata(proc.join(pid.to_string()).join("root")).is_ok_and(|m| m.dev() == dev)
        })
        .collect()
}

/// Ends every process whose root is on device `dev`: SIGTERM, up to
/// [`GRACE`] to exit, then SIGKILL. Returns those still running after
/// that (none, unless a process cannot be killed).
pub(crate) fn end_processes_on(dev: u64) -> Vec<i32> {
    let proc = Path::new("/proc");
    for sig in [Signal::SIGTERM, Signal::SIGKILL] {
        let found = processes_on(proc, dev);
        if found.is_empty() {
            return found;
        }
        for &pid in &found {
            let _ = kill(Pid::from_raw(pid), sig);
        }
        let wait = if sig == Signal::SIGTERM {
            GRACE
        } else {
            KILL_WAIT
        };
        let t = Instant::now();
        while t.elapsed() < wait && !processes_on(proc, dev).is_empty() {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    processes_on(proc, dev)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processes_are_found_by_the_device_of_their_root() {
        // Every process here has its root on the device of `/`; none of
        // them is on a device that no file system has.
        let root = std::fs::metadata("/").unwrap().dev();
        let mine = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let found = processes_on(Path::new("/proc"), root);
        assert!(found.contains(&(mine.id() as i32)), "{found:?}");
        assert!(!found.contains(&(std::process::id() as i32)));
        assert!(processes_on(Path::new("/proc"), u64::MAX).is_empty());
        let mut mine = mine;
        let _ = mine.kill();
        let _ = mine.wait();
    }
}
