//! Starting the launched command *held*: forked, but stopped before exec
//! until the caller has started tracking its pid (so nothing it does is
//! missed) and, for `run`, started the replay. Then the wrapper stays
//! transparent: same process group, terminal, environment and working
//! directory; signals sent to the wrapper alone are forwarded; the exit
//! status is reported exactly.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, pipe2, ForkResult, Pid};
use signal_hook::iterator::exfiltrator::WithOrigin;
use signal_hook::iterator::SignalsInfo;
use signal_hook::low_level::siginfo::{Cause, Origin};

/// A command line as text, for messages and profiles: bytes that are not
/// UTF-8 (arguments may be any bytes) shown as U+FFFD.
pub fn argv_text<S: AsRef<OsStr>>(argv: &[S]) -> Vec<String> {
    argv.iter()
        .map(|a| a.as_ref().to_string_lossy().into_owned())
        .collect()
}

/// The status a shell reports for a command it could not start: 127 when
/// it was not found, 126 when it was found but could not be run.
pub fn shell_code(exec_error: &io::Error) -> i32 {
    if exec_error.kind() == io::ErrorKind::NotFound {
        127
    } else {
        126
    }
}

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

/// The signals whose disposition the wrapper takes over while the command
/// runs. One the caller left ignored (`nohup`, `trap '' INT` in a script)
/// stays ignored, in the command and in the wrapper, as it would have
/// been had the command been run directly.
const TAKEN_OVER: [i32; 4] = [libc::SIGINT, libc::SIGQUIT, libc::SIGTERM, libc::SIGHUP];

/// Which of [`TAKEN_OVER`] this process inherited ignored, as a mask of
/// `1 << signal`. Read once, by the first caller: the wrapper calls it
/// before it installs handlers of its own.
pub fn inherited_ignored() -> u64 {
    static MASK: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *MASK.get_or_init(|| {
        let mut mask = 0;
        for sig in TAKEN_OVER {
            // SAFETY: sigaction with a null new action only reads the
            // current one into `old`.
            let ignored = unsafe {
                let mut old: libc::sigaction = std::mem::zeroed();
                libc::sigaction(sig, std::ptr::null(), &mut old) == 0
                    && old.sa_sigaction == libc::SIG_IGN
            };
            if ignored {
                mask |= 1 << sig;
            }
        }
        mask
    })
}

/// Gives the command the signal state a shell would: an empty mask, and
/// the default action for the signals the wrapper handles or ignores,
/// except those the caller had ignored (`ignored`, from
/// [`inherited_ignored`]). SIGPIPE matters most: Rust's runtime ignores it
/// before `main`, an ignored disposition survives exec, and `warmstart run
/// -- yes | head -1` then printed "Broken pipe" and exited 1 instead of
/// dying quietly (141); what the caller had for it cannot be known.
/// Only async-signal-safe calls: it runs between fork and exec.
pub fn reset_signals_for_exec(ignored: u64) {
    // SAFETY: sigemptyset/sigprocmask/signal on a local set; all are
    // async-signal-safe.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
        for sig in TAKEN_OVER {
            let action = if ignored & (1 << sig) != 0 {
                libc::SIG_IGN
            } else {
                libc::SIG_DFL
            };
            libc::signal(sig, action);
        }
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Replaces this process with the command: it keeps this process's pid,
/// process group, terminal and open descriptors, and its exit status goes
/// straight to our parent. Nothing of the caller runs afterwards, so it
/// must have finished its work. `program` is the file to run when the
/// caller has already searched PATH for `argv[0]` (a failed `execve` per
/// PATH entry before the right one costs tens of microseconds each);
/// otherwise `execvp` searches. Returns only if the exec failed.
pub fn exec_in_place<S: AsRef<OsStr>>(program: Option<&std::path::Path>, argv: &[S]) -> io::Error {
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
    reset_signals_for_exec(inherited_ignored());
    // SAFETY: `ptrs` is a NULL-terminated array of pointers into `cargs`,
    // and `path` a C string; both outlive the calls, which return only on
    // failure.
    let err = unsafe {
        match &path {
            Some(p) => libc::execv(p.as_ptr(), ptrs.as_ptr()),
            None => libc::execvp(ptrs[0], ptrs.as_ptr()),
        };
        io::Error::last_os_error()
    };
    // A file without a `#!` line is a shell script to `execvp` and to a
    // shell: run it with /bin/sh, the file as its script. (No fork here,
    // so building the arguments only now is safe.)
    if let (Some(p), Some(libc::ENOEXEC)) = (&path, err.raw_os_error()) {
        let sh: Vec<CString> = [c"/bin/sh".to_owned(), p.clone()]
            .into_iter()
            .chain(cargs.iter().skip(1).cloned())
            .collect();
        let sh_ptrs = c_pointers(&sh);
        // SAFETY: as above, for `sh` and `sh_ptrs`.
        unsafe { libc::execv(sh[0].as_ptr(), sh_ptrs.as_ptr()) };
    }
    err
}

/// `argv` as C strings for exec; it must not be empty.
fn c_argv<S: AsRef<OsStr>>(argv: &[S]) -> io::Result<Vec<CString>> {
    if argv.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "no command given",
        ));
    }
    argv.iter()
        .map(|a| CString::new(a.as_ref().as_bytes()))
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
    pub fn spawn<S: AsRef<OsStr>>(argv: &[S]) -> io::Result<HeldChild> {
        // Everything the child needs is prepared before fork: after fork in
        // a threaded process only async-signal-safe calls are allowed.
        let cargs = c_argv(argv)?;
        let ptrs = c_pointers(&cargs);
        let ignored = inherited_ignored();
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
                    reset_signals_for_exec(ignored);
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
            match waitpid(
                self.pid,
                Some(WaitPidFlag::WNOHANG | WaitPidFlag::WUNTRACED),
            ) {
                Ok(WaitStatus::Exited(_, code)) => self.exit = Some(Exit::Code(code)),
                Ok(WaitStatus::Signaled(_, sig, _)) => self.exit = Some(Exit::Signal(sig as i32)),
                Ok(WaitStatus::Stopped(_, sig)) => stop_like_child(sig as i32),
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
            match waitpid(self.pid, Some(WaitPidFlag::WUNTRACED)) {
                Ok(WaitStatus::Exited(_, code)) => self.exit = Some(Exit::Code(code)),
                Ok(WaitStatus::Signaled(_, sig, _)) => self.exit = Some(Exit::Signal(sig as i32)),
                Ok(WaitStatus::Stopped(_, sig)) => stop_like_child(sig as i32),
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Sends a signal to the child, unless it has been reaped: its pid may
    /// then be another process's.
    pub fn signal(&self, sig: i32) {
        if self.exit.is_some() {
            return;
        }
        if let Ok(s) = Signal::try_from(sig) {
            let _ = kill(self.pid, s);
        }
    }
}

/// The command stopped for job control (it stopped itself with SIGTSTP,
/// or a background read or write of the terminal stopped it): with a
/// terminal, a shell is waiting for the job, so the wrapper stops too and
/// the shell gets its terminal back; `fg` or `bg` continues the whole
/// process group. Any other stop (SIGSTOP from `top`, a debugger), or
/// none of that without a terminal, is left alone: nobody would continue
/// the wrapper, and it would never report the command's exit.
///
/// The wrapper stops by the command's own signal at its default action,
/// so the shell reports the same stop (Ctrl-Z: status 148, not SIGSTOP's
/// 147), and the kernel discards it in an orphaned process group, as it
/// did for the command. The handler `signal-hook` had there is put back
/// once the wrapper is continued.
fn stop_like_child(sig: i32) {
    if !matches!(sig, libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU) {
        return;
    }
    // SAFETY: open/close of /dev/tty, sigaction with valid structs, a
    // signal mask of this thread's own, and raise on this thread.
    unsafe {
        let tty = libc::open(
            c"/dev/tty".as_ptr(),
            libc::O_RDONLY | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        if tty < 0 {
            return;
        }
        libc::close(tty);
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigemptyset(&mut dfl.sa_mask);
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, &dfl, &mut old) != 0 {
            libc::kill(libc::getpid(), libc::SIGSTOP);
            return;
        }
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        let mut mask: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, &mut mask);
        // Stopped here until continued.
        libc::raise(sig);
        libc::pthread_sigmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut());
        libc::sigaction(sig, &old, std::ptr::null_mut());
    }
}

/// Signals the wrapper watches while the command runs. The command shares
/// the wrapper's process group, so what the terminal or the kernel sends
/// to the group (Ctrl-C, Ctrl-\\, a window resize, a hang-up) reaches it
/// already, and the wrapper only survives it; what a process sends to the
/// wrapper alone (`kill PID`, `timeout`) is forwarded. The kernel marks
/// the first kind (`SI_KERNEL`): that, not whether standard input is the
/// terminal, tells them apart. Signals the caller left ignored are not
/// watched, so the wrapper keeps ignoring them (`nohup`).
pub struct SignalForwarder {
    signals: SignalsInfo<WithOrigin>,
}

/// The signals forwarded, and whether each asks the wrapper to stop.
const FORWARDED: [(i32, bool); 10] = [
    (libc::SIGINT, true),
    (libc::SIGQUIT, true),
    (libc::SIGTERM, true),
    (libc::SIGHUP, true),
    (libc::SIGUSR1, false),
    (libc::SIGUSR2, false),
    (libc::SIGALRM, false),
    (libc::SIGWINCH, false),
    (libc::SIGCONT, false),
    // Forwarded, the command stops, and the wrapper with it (see
    // `stop_like_child`); Ctrl-Z stops both the same way.
    (libc::SIGTSTP, false),
];

/// Signals whose default action the wrapper takes again once nothing is
/// forwarded any more: Ctrl-C during the work after the command ended
/// (judging the launch, compiling a plan) must not be swallowed. SIGTSTP
/// is not among them: `signal-hook` would stop the wrapper with SIGSTOP,
/// which, unlike SIGTSTP, also stops an orphaned process group, where
/// nobody would continue it.
const DEFAULT_WHEN_DONE: [i32; 4] = TAKEN_OVER;

/// Set while nothing is forwarded: the signals of [`DEFAULT_WHEN_DONE`]
/// then act as if never caught (they terminate). Registered once per
/// process; `signal-hook` never uninstalls its handler, so without this a
/// dropped forwarder would leave those signals ignored.
fn forwarding_over() -> io::Result<&'static std::sync::Arc<std::sync::atomic::AtomicBool>> {
    use std::sync::atomic::AtomicBool;
    use std::sync::{Arc, OnceLock};
    static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();
    if let Some(f) = FLAG.get() {
        return Ok(f);
    }
    let flag = Arc::new(AtomicBool::new(false));
    let ignored = inherited_ignored();
    for sig in DEFAULT_WHEN_DONE
        .into_iter()
        .filter(|&sig| ignored & (1 << sig) == 0)
    {
        signal_hook::flag::register_conditional_default(sig, Arc::clone(&flag))?;
    }
    Ok(FLAG.get_or_init(|| flag))
}

impl SignalForwarder {
    pub fn install() -> io::Result<SignalForwarder> {
        let ignored = inherited_ignored();
        forwarding_over()?.store(false, std::sync::atomic::Ordering::SeqCst);
        let signals = SignalsInfo::<WithOrigin>::new(
            FORWARDED
                .iter()
                .map(|&(sig, _)| sig)
                .filter(|&sig| ignored & (1 << sig) == 0),
        )?;
        Ok(SignalForwarder { signals })
    }

    /// Forwards what arrived since the last call; returns whether the user
    /// asked to stop (any terminating signal).
    pub fn forward(&mut self, child: &Running) -> bool {
        let mut stop = false;
        for origin in self.signals.pending() {
            stop |= FORWARDED.contains(&(origin.signal, true));
            if forwarded(&origin) {
                child.signal(origin.signal);
            }
        }
        stop
    }

    /// Forwards on a thread of its own, so the caller can block in
    /// [`Running::wait`] and notice the exit at once. Stops when the guard
    /// is dropped.
    pub fn forward_in_background(mut self, pid: u32) -> ForwardGuard {
        let handle = self.signals.handle();
        let thread = std::thread::spawn(move || {
            for origin in self.signals.forever() {
                if forwarded(&origin) {
                    // SAFETY: kill has no memory-safety preconditions.
                    unsafe { libc::kill(pid as i32, origin.signal) };
                }
            }
        });
        ForwardGuard {
            handle,
            thread: Some(thread),
        }
    }
}

/// Sent by a process (to the wrapper alone, presumably), not by the kernel
/// to the whole process group.
fn forwarded(origin: &Origin) -> bool {
    if matches!(origin.cause, Cause::Kernel) {
        return false;
    }
    // A process of our own group other than our parent (the command,
    // suspending itself the way vim does with kill(0, SIGTSTP)) has
    // signalled the group already. Our parent is asked for: a script's
    // `kill $!` is meant for the command.
    // SAFETY: getpgid, getpgrp and getppid have no memory-safety
    // preconditions.
    let from_the_group = origin.process.as_ref().is_some_and(|p| unsafe {
        p.pid != libc::getppid() && libc::getpgid(p.pid) == libc::getpgrp()
    });
    !from_the_group
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

impl Drop for SignalForwarder {
    fn drop(&mut self) {
        // The command is gone: the wrapper's own default actions again.
        if let Ok(f) = forwarding_over() {
            f.store(true, std::sync::atomic::Ordering::SeqCst);
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

    /// Run in a process of its own (below): forwards while a command
    /// runs, then takes a signal the way a wrapper still at work would.
    fn signal_after_forwarding(sig: i32) -> ! {
        // The forwarder restores what it found; start from the default, as
        // a terminal's shell does (a run under `nohup` inherits SIGHUP
        // ignored, and then ignoring it afterwards is right).
        // SAFETY: resetting a signal's disposition in this single-purpose
        // child process.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
        let argv = vec!["true".to_string()];
        let held = HeldChild::spawn(&argv).unwrap();
        let signals = SignalForwarder::install().unwrap();
        let mut running = held.release().unwrap();
        let guard = signals.forward_in_background(running.pid());
        running.wait().unwrap();
        drop(guard);
        // SAFETY: raising a signal on ourselves.
        unsafe { libc::raise(sig) };
        std::thread::sleep(std::time::Duration::from_millis(200));
        std::process::exit(0)
    }

    #[test]
    fn signals_act_again_once_the_command_is_gone() {
        if let Ok(sig) = std::env::var("WS_TEST_SIGNAL_AFTER") {
            signal_after_forwarding(sig.parse().unwrap());
        }
        use std::os::unix::process::ExitStatusExt;
        for sig in DEFAULT_WHEN_DONE {
            let st = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "spawn::tests::signals_act_again_once_the_command_is_gone",
                ])
                .env("WS_TEST_SIGNAL_AFTER", sig.to_string())
                .stdout(std::process::Stdio::null())
                .status()
                .unwrap();
            assert_eq!(st.signal(), Some(sig), "signal {sig}: {st:?}");
        }
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
