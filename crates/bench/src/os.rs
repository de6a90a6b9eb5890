//! The OS boundary of the bench: page-cache residency (mincore, through
//! `warmstart_sys`) to check that a cold start is cold, process-tree
//! cleanup, and keeping a recorded launch's output off the terminal.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// Of the byte ranges given per file, how many bytes are in the page cache
/// and how many there are, by mincore (up-to-date pages only: a cold start
/// is cold only if nothing is readable without I/O). Opening the files
/// warms their inodes and dentries, which is why the bench only checks
/// when asked. The paths come from recordings and are opened through
/// [`warmstart_sys::open`]: anything but a regular file is skipped.
pub fn residency(files: &[(String, Vec<(u64, u64)>)]) -> (u64, u64) {
    let page = warmstart_sys::residency::page_size();
    let (mut resident, mut total) = (0u64, 0u64);
    for (path, ranges) in files {
        let Ok(o) = warmstart_sys::open(path) else {
            continue;
        };
        for &(off, len) in ranges {
            if let Ok(c) = warmstart_sys::residency::resident(&o.file, off, len) {
                resident += c.resident * page;
                total += c.pages * page;
            }
        }
    }
    (resident, total)
}

/// Every descendant of `pid` (not `pid` itself), from `/proc`.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut parent: Vec<(u32, u32)> = Vec::new();
    if let Ok(d) = std::fs::read_dir("/proc") {
        for e in d.flatten() {
            let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
                continue;
            };
            // The command name may contain spaces and parentheses: the
            // fields after the last ')' are fixed.
            if let Some(rest) = stat.rsplit_once(')').map(|x| x.1) {
                if let Some(pp) = rest.split_whitespace().nth(1).and_then(|x| x.parse().ok()) {
                    parent.push((p, pp));
                }
            }
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        for &(c, pp) in &parent {
            if pp == p && !out.contains(&c) {
                out.push(c);
                frontier.push(c);
            }
        }
    }
    out
}

/// Sends `sig` to `pid` and all its descendants.
pub fn signal_tree(pid: u32, sig: i32) {
    for p in descendants(pid).into_iter().chain([pid]) {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(p as i32, sig) };
    }
}

/// Sends `sig` to a process group.
pub fn signal_group(pgid: u32, sig: i32) {
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(-(pgid as i32), sig) };
}

/// A pidfd for `pid` (Linux 5.3, commit 32fcb426ec00 "pid: add
/// pidfd_open()"): readable once the process exits, even before it is
/// reaped, so the exit can be timed by a thread that does not own the
/// child.
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: a plain syscall with integer arguments.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this new descriptor to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Waits until `fd` is readable or `until` passes; returns whether it is.
pub fn wait_readable(fd: &OwnedFd, until: Instant) -> bool {
    wait_any_readable(&[fd.as_fd()], until)
}

/// Waits until one of `fds` is readable or `until` passes; returns
/// whether one is.
pub fn wait_any_readable(fds: &[BorrowedFd<'_>], until: Instant) -> bool {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let ms = left.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `p` holds `p.len()` valid pollfd structs.
        let rc = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms) };
        if rc > 0 {
            return true;
        }
        if rc == 0 || left == Duration::ZERO {
            return false;
        }
        // EINTR: poll again.
    }
}

/// A pipe (read end, write end), both close-on-exec.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned here.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Points stdout and stderr at /dev/null (or a pipe) until dropped. A recorded launch
/// (the recorder forks the command with our descriptors) must not print
/// into the results table; the bench prints nothing while it runs.
pub struct Silence {
    saved: Vec<(RawFd, OwnedFd)>,
}

impl Silence {
    /// Sends stdout and stderr to `to`, or to /dev/null.
    pub fn new(to: Option<&OwnedFd>) -> io::Result<Silence> {
        let null = File::options().write(true).open("/dev/null")?;
        let target = to.map_or(null.as_raw_fd(), |f| f.as_raw_fd());
        let mut saved = Vec::new();
        for fd in [1, 2] {
            // SAFETY: dup of a standard descriptor; the copy is owned below.
            let copy = unsafe { libc::dup(fd) };
            if copy < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: `copy` is a fresh descriptor we own.
            saved.push((fd, unsafe { OwnedFd::from_raw_fd(copy) }));
            // SAFETY: dup2 onto a standard descriptor; both are open.
            if unsafe { libc::dup2(target, fd) } < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(Silence { saved })
    }
}

impl Drop for Silence {
    fn drop(&mut self) {
        for (fd, copy) in &self.saved {
            // SAFETY: restoring a standard descriptor from our saved copy.
            unsafe { libc::dup2(copy.as_raw_fd(), *fd) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn residency_of_a_written_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, vec![1u8; 64 * 1024]).unwrap();
        let path = p.display().to_string();
        // Just written: every page is cached.
        let (res, total) = residency(&[(path.clone(), vec![(0, 64 * 1024)])]);
        assert_eq!(total, 64 * 1024);
        assert_eq!(res, total);
        // Ranges are clipped to the file.
        let (_, total) = residency(&[(path.clone(), vec![(60 * 1024, 1 << 20)])]);
        assert_eq!(total, 4096);
        // A path swapped for a symlink to a device counts nothing.
        let link = dir.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        let link = link.display().to_string();
        assert_eq!(residency(&[(link, vec![(0, 4096)])]), (0, 0));
    }

    #[test]
    fn descendants_of_a_shell() {
        let mut c = std::process::Command::new("sh")
            .args(["-c", "sleep 5 & wait"])
            .spawn()
            .unwrap();
        let pid = c.id();
        let deadline = Instant::now() + Duration::from_secs(5);
        while descendants(pid).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(descendants(pid).len(), 1);
        signal_tree(pid, libc::SIGKILL);
        c.wait().unwrap();
    }

    #[test]
    fn pidfd_turns_readable_on_exit() {
        let mut c = std::process::Command::new("sleep")
            .arg("0.05")
            .spawn()
            .unwrap();
        let fd = pidfd_open(c.id()).unwrap();
        assert!(wait_readable(&fd, Instant::now() + Duration::from_secs(5)));
        c.wait().unwrap();
    }
}
