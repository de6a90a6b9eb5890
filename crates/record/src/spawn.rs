//! Starting the launched command *held*: forked, but stopped before exec
//! until the caller has started tracking its pid (so nothing it does is
//! missed) and, for `run`, started the replay. Then the wrapper stays
//! transparent: same process group, terminal, environment and working
//! directory; signals sent to the wrapper alone are forwarded; the exit
//! status is reported exactly.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, pipe2, ForkResult, Pid};

/// How the launched command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

impl Exit {
    /// The status a shell would report ($?).
    pub fn shell_code(self) -> i32 {
        match self {
            Exit::Code(c) => c,
            Exit::Signal(s) => 128 + s,
        }
    }
}

/// Gives the command the signal state a shell would: an empty mask, and
/// the default action for the signals the wrapper handles or ignores.
/// SIGPIPE matters most: Rust's runtime ignores it before `main`, an ignored
/// disposition survives exec, and `warmstart run -- yes | head -1` then
/// printed "Broken pipe" and exited 1 instead of dying quietly (141).
/// Only async-signal-safe calls: it runs between fork and exec.
pub fn reset_signals_for_exec() {
    // SAFETY: sigemptyset/sigprocmask/signal on a local set; all are
    // async-signal-safe.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
        for sig in [
            libc::SIGINT,
            libc::SIGQUIT,
            libc::SIGTERM,
            libc::SIGHUP,
            libc::SIGPIPE,
        ] {
            libc::signal(sig, libc::SIG_DFL);
        }
    }
}

/// Replaces this process with the command: it keeps this process's pid,
/// process group, terminal and open descriptors, and its exit status goes
/// straight to our parent. Nothing of the caller runs afterwards, so it
/// must have finished its work. `program` is the file to run when the
/// caller has already searched PATH for `argv[0]` (a failed `execve` per
/// PATH entry before the right one costs tens of microseconds each);
/// otherwise `execvp` searches. Returns only if the exec failed.
pub fn exec_in_place(program: Option<&std::path::Path>, argv: &[String]) -> io::Error {
    use std::os::unix::ffi::OsStrExt;
    let cargs = match c_argv(argv) {
        Ok(c) => c,
        Err(e) => return e,
    };
    let Ok(path) = program
        .map(|p| CString::new(p.as_os_str().as_bytes()))
        .transpose()
    else {
        return nul_error();
    };
    let ptrs = c_pointers(&cargs);
    reset_signals_for_exec();
    // SAFETY: `ptrs` is a NULL-terminated array of pointers into `cargs`,
    // and `path` a C string; both outlive the call, which returns only on
    // failure.
    unsafe {
        match &path {
            Some(p) => libc::execv(p.as_ptr(), ptrs.as_ptr()),
            None => libc::execvp(ptrs[0], ptrs.as_ptr()),
        }
    };
    io::Error::last_os_error()
}

/// `argv` as C strings for exec; it must not be empty.
fn c_argv(argv: &[String]) -> io::Result<Vec<CString>> {
    if argv.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "no command given",
        ));
    }
    argv.iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()
        .map_err(|_| nul_error())
}

fn nul_error() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, "argument contains NUL")
}

/// The NULL-terminated pointer array exec takes; valid while `cargs` lives.
fn c_pointers(cargs: &[CString]) -> Vec<*const libc::c_char> {
    let mut ptrs: Vec<*const libc::c_char> = cargs.iter().map(|c| c.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    ptrs
}

/// A forked child waiting, before exec, for [`HeldChild::release`].
#[derive(Debug)]
pub struct HeldChild {
    pid: Pid,
    go: Option<OwnedFd>,
    exec_err: OwnedFd,
}

impl HeldChild {
    /// Forks a child that will exec `argv` (searched in PATH) once released.
    pub fn spawn(argv: &[String]) -> io::Result<HeldChild> {
        // Everything the child needs is prepared before fork: after fork in
        // a threaded process only async-signal-safe calls are allowed.
        let cargs = c_argv(argv)?;
        let ptrs = c_pointers(&cargs);
        let (go_r, go_w) = pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let (err_r, err_w) = pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;

        // SAFETY: the child only calls async-signal-safe functions (read,
        // write, execvp, _exit, sigprocmask) on memory prepared above.
        match unsafe { fork() }? {
            ForkResult::Child => {
                let mut b = [0u8; 1];
                // SAFETY: raw syscalls on fds we own; buffers are valid.
                unsafe {
                    let n = libc::read(go_r.as_raw_fd(), b.as_mut_ptr().cast(), 1);
                    if n != 1 || b[0] != b'g' {
                        libc::_exit(127);
                    }
                    reset_signals_for_exec();
                    libc::execvp(ptrs[0], ptrs.as_ptr());
                    let errno = *libc::__errno_location();
                    let bytes = errno.to_ne_bytes();
                    libc::write(err_w.as_raw_fd(), bytes.as_ptr().cast(), bytes.len());
                    libc::_exit(127);
                }
            }
            ForkResult::Parent { child } => {
                drop(go_r);
                drop(err_w);
                Ok(HeldChild {
                    pid: child,
                    go: Some(go_w),
                    exec_err: err_r,
                })
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.pid.as_raw() as u32
    }

    /// Lets the child exec. Returns an error if exec failed (command not
    /// found, not executable), after reaping the child.
    pub fn release(mut self) -> io::Result<Running> {
        let go = self.go.take().expect("released once");
        nix::unistd::write(&go, b"g")?;
        drop(go);
        let mut buf = [0u8; 4];
        let n = nix::unistd::read(self.exec_err.as_raw_fd(), &mut buf)?;
        if n == 4 {
            let errno = i32::from_ne_bytes(buf);
            let _ = waitpid(self.pid, None);
            return Err(io::Error::from_raw_os_error(errno));
        }
        Ok(Running {
            pid: self.pid,
            exit: None,
        })
    }
}

impl Drop for HeldChild {
    fn drop(&mut self) {
        if self.go.is_some() {
            // Never released (the caller failed before): let it die quietly.
            let _ = kill(self.pid, Signal::SIGKILL);
            let _ = waitpid(self.pid, None);
        }
    }
}

/// The command, running.
#[derive(Debug)]
pub struct Running {
    pid: Pid,
    exit: Option<Exit>,
}

impl Running {
    pub fn pid(&self) -> u32 {
        self.pid.as_raw() as u32
    }

    /// Non-blocking: the exit status once the child has exited.
    pub fn try_wait(&mut self) -> io::Result<Option<Exit>> {
        if self.exit.is_some() {
            return Ok(self.exit);
        }
        loop {
            match waitpid(self.pid, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(_, code)) => self.exit = Some(Exit::Code(code)),
                Ok(WaitStatus::Signaled(_, sig, _)) => self.exit = Some(Exit::Signal(sig as i32)),
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
            return Ok(self.exit);
        }
    }

    /// Blocks until the child exits.
    pub fn wait(&mut self) -> io::Result<Exit> {
        loop {
            if let Some(e) = self.exit {
                return Ok(e);
            }
            match waitpid(self.pid, None) {
                Ok(WaitStatus::Exited(_, code)) => self.exit = Some(Exit::Code(code)),
                Ok(WaitStatus::Signaled(_, sig, _)) => self.exit = Some(Exit::Signal(sig as i32)),
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Sends a signal to the child.
    pub fn signal(&self, sig: i32) {
        if let Ok(s) = Signal::try_from(sig) {
            let _ = kill(self.pid, s);
        }
    }
}

/// Signals the wrapper watches while the command runs. Terminal-generated
/// SIGINT/SIGQUIT already reach the whole foreground process group, so the
/// wrapper only survives them; sent to the wrapper alone (no terminal), they
/// are forwarded like SIGTERM and SIGHUP.
pub struct SignalForwarder {
    signals: signal_hook::iterator::Signals,
    has_tty_group: bool,
}

impl SignalForwarder {
    pub fn install() -> io::Result<SignalForwarder> {
        let signals = signal_hook::iterator::Signals::new([
            libc::SIGINT,
            libc::SIGQUIT,
            libc::SIGTERM,
            libc::SIGHUP,
            libc::SIGUSR1,
            libc::SIGUSR2,
        ])?;
        // SAFETY: getpgrp and tcgetpgrp have no memory-safety preconditions.
        let has_tty_group = unsafe { libc::tcgetpgrp(0) == libc::getpgrp() };
        Ok(SignalForwarder {
            signals,
            has_tty_group,
        })
    }

    /// Forwards what arrived since the last call; returns whether the user
    /// asked to stop (any terminating signal).
    pub fn forward(&mut self, child: &Running) -> bool {
        let mut stop = false;
        for sig in self.signals.pending() {
            stop |= matches!(
                sig,
                libc::SIGINT | libc::SIGQUIT | libc::SIGTERM | libc::SIGHUP
            );
            let from_tty = matches!(sig, libc::SIGINT | libc::SIGQUIT) && self.has_tty_group;
            if !from_tty {
                child.signal(sig);
            }
        }
        stop
    }
}

impl SignalForwarder {
    /// Forwards on a thread of its own, so the caller can block in
    /// [`Running::wait`] and notice the exit at once. Stops when the guard
    /// is dropped.
    pub fn forward_in_background(mut self, pid: u32) -> ForwardGuard {
        let handle = self.signals.handle();
        let thread = std::thread::spawn(move || {
            for sig in self.signals.forever() {
                let from_tty = matches!(sig, libc::SIGINT | libc::SIGQUIT) && self.has_tty_group;
                if !from_tty {
                    // SAFETY: kill has no memory-safety preconditions.
                    unsafe { libc::kill(pid as i32, sig) };
                }
            }
        });
        ForwardGuard {
            handle,
            thread: Some(thread),
        }
    }
}

/// Stops background signal forwarding when dropped.
pub struct ForwardGuard {
    handle: signal_hook::iterator::Handle,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for ForwardGuard {
    fn drop(&mut self) {
        self.handle.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Ends the wrapper the way the child ended, so the caller's shell sees
/// the same status: re-raise a fatal signal, or exit with the code.
pub fn exit_like(exit: Exit) -> ! {
    if let Exit::Signal(sig) = exit {
        // SAFETY: resetting a disposition and raising a signal on ourselves.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::raise(sig);
        }
    }
    std::process::exit(exit.shell_code())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(argv: &[&str]) -> io::Result<Exit> {
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        let mut r = HeldChild::spawn(&argv)?.release()?;
        loop {
            if let Some(e) = r.try_wait()? {
                return Ok(e);
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    #[test]
    fn exit_codes_and_signals() {
        assert_eq!(run(&["true"]).unwrap(), Exit::Code(0));
        assert_eq!(run(&["sh", "-c", "exit 42"]).unwrap(), Exit::Code(42));
        assert_eq!(
            run(&["sh", "-c", "kill -TERM $$"]).unwrap(),
            Exit::Signal(15)
        );
        let err = run(&["/nonexistent/warmstart-cmd"]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn command_starts_with_default_signal_dispositions() {
        // The test binary, like warmstart, ignores SIGPIPE (Rust's runtime
        // does); the command must not inherit that. SigIgn is a hex mask.
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("status");
        let script = format!("grep SigIgn /proc/self/status > {}", out.display());
        assert_eq!(run(&["sh", "-c", &script]).unwrap(), Exit::Code(0));
        let line = std::fs::read_to_string(&out).unwrap();
        let mask = u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap();
        assert_eq!(mask & (1 << (libc::SIGPIPE - 1)), 0, "{line}");
    }

    #[test]
    fn held_child_does_not_run_until_released() {
        let dir = tempfile::tempdir().unwrap();
        let mark = dir.path().join("ran");
        let argv = vec!["touch".to_string(), mark.display().to_string()];
        let held = HeldChild::spawn(&argv).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!mark.exists());
        let mut r = held.release().unwrap();
        while r.try_wait().unwrap().is_none() {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(mark.exists());
    }
}
