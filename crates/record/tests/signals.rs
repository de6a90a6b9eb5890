//! Once the recorded command has exited, SIGTERM and SIGINT stop the
//! recorder: there is no command left to forward them to, and naming the
//! recorded files may take long (a cold disk, or a path swapped for
//! something slow), so a recorder that kept catching them could not be
//! stopped.
//!
//! Each case runs in a child copy of this test binary, since the signal
//! must be allowed to kill the process it is sent to.

use std::process::Command;
use std::time::Duration;

use warmstart_record::{BackendChoice, Options};

const CHILD: &str = "WS_RECORD_SIGNAL_CHILD";

/// Records `true` (no privilege needed: the mincore source), then sends
/// itself the signal named in the environment. Runs only as that child.
#[test]
#[ignore = "run by the tests below, in a child process"]
fn child_records_then_signals_itself() {
    let Ok(sig) = std::env::var(CHILD) else {
        return;
    };
    let sig: i32 = sig.parse().unwrap();
    // Default, as a terminal's SIGINT is: started from the background of
    // a shell without job control, this process inherits it ignored, and
    // the recorder rightly keeps what it inherited.
    // SAFETY: setting a standard disposition, before any thread exists
    // that could depend on the old one.
    unsafe { libc::signal(sig, libc::SIG_DFL) };
    let opts = Options {
        backend: BackendChoice::Mincore,
        idle: Duration::from_millis(200),
        timeout: Duration::from_secs(20),
        ..Default::default()
    };
    let recorded = warmstart_record::record(&["true"], &opts, |_| {}).unwrap();
    assert!(recorded.exit.is_some(), "true has exited");
    // SAFETY: raise has no memory-safety preconditions.
    unsafe { libc::raise(sig) };
    // Delivered at once to this thread if it terminates the process.
    std::thread::sleep(Duration::from_secs(2));
    println!("survived signal {sig}");
}

fn killed_by(sig: i32) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_records_then_signals_itself",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD, sig.to_string())
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(sig),
        "the recorder stopped on signal {sig}: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn sigterm_stops_the_recorder_once_the_command_exited() {
    killed_by(libc::SIGTERM);
}

#[test]
fn sigint_stops_the_recorder_once_the_command_exited() {
    killed_by(libc::SIGINT);
}
