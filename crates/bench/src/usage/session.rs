//! Login sessions for the log's `login` step, as the kernel's audit
//! subsystem numbers them.
//!
//! A login manager (pam_loginuid) writes the user's uid to
//! `/proc/self/loginuid`; the kernel then gives the task a new audit
//! session id (`/proc/PID/sessionid`), which every process it forks
//! inherits. The daemon opens a login startup window at the first exec of
//! a session it has not seen (`warmstart_launch::startup::login_session`).
//! The bench does what a login manager does, but for one thread only
//! (`/proc/thread-self/loginuid`): the thread that forks the launches, so
//! that its other threads and the prefetcher it starts stay outside the
//! session. Writing the invalid uid (`4294967295`) takes the thread out of
//! any session again (the kernel unsets the session id with it), which a
//! boot does before the prefetcher starts. Once a task has a login uid,
//! changing it needs CAP_AUDIT_CONTROL, and is refused for good when the
//! audit rules make login uids immutable (`auditctl --loginuid-immutable`).

use std::io::Write;
use std::process::{Child, Command, Stdio};

use anyhow::{bail, Context, Result};

const LOGINUID: &str = "/proc/thread-self/loginuid";
const SESSIONID: &str = "/proc/thread-self/sessionid";

/// `AUDIT_SID_UNSET` and `AUDIT_UID_UNSET`: no session, no login uid.
const UNSET: u32 = u32::MAX;

/// The calling thread's audit session id, `None` when it has none.
pub fn current() -> Result<Option<u32>> {
    let text = std::fs::read_to_string(SESSIONID).with_context(|| {
        format!("reading {SESSIONID} (a kernel without CONFIG_AUDITSYSCALL has none)")
    })?;
    let id: u32 = text
        .trim()
        .parse()
        .with_context(|| format!("{SESSIONID}: {text:?} is not a session id"))?;
    Ok((id != UNSET).then_some(id))
}

fn write_loginuid(uid: u32) -> Result<()> {
    // One write of the whole number: the kernel parses what one write
    // gives it.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(LOGINUID)
        .with_context(|| format!("opening {LOGINUID}"))?;
    f.write_all(uid.to_string().as_bytes()).with_context(|| {
        format!(
            "writing {uid} to {LOGINUID} (needs CAP_AUDIT_CONTROL, and login uids that the \
             audit rules have not made immutable)"
        )
    })
}

/// Starts a new login session of the calling thread's user, as a login
/// manager does: every process the thread forks from now on is in it.
/// Returns its audit session id.
pub fn begin() -> Result<u32> {
    let before = current()?;
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    write_loginuid(uid)?;
    match current()? {
        Some(id) if Some(id) != before => Ok(id),
        other => bail!(
            "{LOGINUID}: the session id is {other:?} after the write (before: {before:?}); \
             the kernel gave no new session"
        ),
    }
}

/// Takes the calling thread out of any login session.
pub fn leave() -> Result<()> {
    write_loginuid(UNSET)?;
    if let Some(id) = current()? {
        bail!("{LOGINUID}: still in session {id} after unsetting the login uid");
    }
    Ok(())
}

/// Whether logins can be simulated here: begins a session and leaves it.
pub fn check() -> Result<()> {
    begin()
        .and_then(|_| leave())
        .context("the log has login steps, which need a new audit session per login")
}

/// The first process of a login session, as a session manager is: it
/// execs right after the login, so that the daemon sees the session begin
/// before the first launch, and lives until dropped (the daemon reads a
/// process's session from /proc after the exec, which a process that
/// already exited no longer has). It is `cat` reading a pipe: it ends
/// when the pipe closes, so it cannot outlive the bench.
pub struct Leader {
    child: Child,
}

impl Leader {
    /// Starts the leader in the calling thread's session.
    pub fn start() -> Result<Leader> {
        let child = Command::new("cat")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .context("starting the login session's leader (cat)")?;
        Ok(Leader { child })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Leader {
    fn drop(&mut self) {
        // Closing its input ends it; kill it should it not.
        drop(self.child.stdin.take());
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// The session a child forked from this thread sees.
    fn child_session() -> String {
        let out = Command::new("cat")
            .arg("/proc/self/sessionid")
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    }

    #[test]
    fn root_logins_give_children_a_new_session_and_boots_none() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: writing loginuid needs root (CAP_AUDIT_CONTROL)");
            return;
        }
        if !Path::new(LOGINUID).exists() {
            eprintln!("skipped: this kernel has no {LOGINUID} (CONFIG_AUDITSYSCALL)");
            return;
        }
        // A thread that exists before the login (a thread copies the
        // session of the one that creates it): it asks its children's
        // session when told.
        let (ask, asked) = std::sync::mpsc::channel::<()>();
        let (tell, told) = std::sync::mpsc::channel();
        let other = std::thread::spawn(move || {
            while asked.recv().is_ok() {
                tell.send(child_session()).unwrap();
            }
        });
        let other_session = || {
            ask.send(()).unwrap();
            told.recv().unwrap()
        };
        let other_before = other_session();
        // This runs on a thread of its own, whose session it changes.
        leave().unwrap();
        assert_eq!(child_session(), UNSET.to_string());

        let first = begin().unwrap();
        assert_eq!(child_session(), first.to_string());
        let leader = Leader::start().unwrap();
        let pid = leader.pid();
        let leader_session = std::fs::read_to_string(format!("/proc/{pid}/sessionid")).unwrap();
        assert_eq!(leader_session, first.to_string());
        // What the daemon reads at the leader's exec: without logind
        // (systemd not running) every audit session is a login; with it,
        // the bench's sessions are not logind's and do not count.
        if !Path::new("/run/systemd/system").is_dir() {
            assert_eq!(
                warmstart_launch::startup::login_session(
                    Path::new("/proc"),
                    Path::new("/run"),
                    pid
                ),
                Some(first)
            );
        }
        // The other thread stays where it was.
        assert_eq!(other_session(), other_before);

        // A second login: a new session, and the first leader ends.
        let second = begin().unwrap();
        assert_ne!(second, first);
        assert_eq!(child_session(), second.to_string());
        drop(leader);
        // Gone (or its pid reused by a process outside that session).
        let after = std::fs::read_to_string(format!("/proc/{pid}/sessionid")).unwrap_or_default();
        assert_ne!(after, first.to_string());

        // A boot: no session again.
        leave().unwrap();
        assert_eq!(current().unwrap(), None);
        assert_eq!(child_session(), UNSET.to_string());
        check().unwrap();
        assert_eq!(current().unwrap(), None);
        assert_eq!(other_session(), other_before);
        drop(ask);
        other.join().unwrap();
    }
}
