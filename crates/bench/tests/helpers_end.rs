//! The X server the bench starts for GUI programs ends with the process
//! that started it, however that process dies: a harness killed inside a
//! testbed (its owner interrupted) must leave nothing behind that holds
//! the testbed's filesystem mounted over a device already torn down.
//!
//! The owner is this test binary itself, run again with `WS_XVFB_OWNER`
//! naming the file where it writes the server's process id.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use warmstart_bench::suite::Xvfb;

const OWNER: &str = "WS_XVFB_OWNER";

/// Run by `xvfb_ends_with_its_owner` as the server's owner: starts it,
/// says its pid, and waits to be killed.
#[test]
#[ignore = "the owner process of xvfb_ends_with_its_owner"]
fn xvfb_owner() {
    let Some(out) = std::env::var_os(OWNER) else {
        return;
    };
    let x = Xvfb::start().expect("starting Xvfb");
    let tmp = Path::new(&out).with_extension("tmp");
    std::fs::write(&tmp, format!("{} {}", x.pid(), x.display)).unwrap();
    std::fs::rename(&tmp, &out).unwrap();
    std::thread::sleep(Duration::from_secs(60));
}

/// Whether `pid` is gone (or a zombie nobody reaped yet).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

#[test]
fn xvfb_ends_with_its_owner() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("xvfb");
    let mut owner = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "xvfb_owner", "--nocapture"])
        .env(OWNER, &out)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while !out.exists() {
        if let Some(st) = owner.try_wait().unwrap() {
            panic!("the owner exited before starting Xvfb ({st})");
        }
        assert!(t.elapsed() < Duration::from_secs(20), "Xvfb did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let said = std::fs::read_to_string(&out).unwrap();
    let (pid, display) = said.split_once(' ').unwrap();
    let pid: u32 = pid.parse().unwrap();
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
    assert_eq!(comm.trim(), "Xvfb");

    // SIGKILL: the owner runs no destructor, as when the testbed's owner
    // is gone and the harness dies of its parent-death signal.
    owner.kill().unwrap();
    owner.wait().unwrap();
    let t = Instant::now();
    while !gone(pid) {
        if t.elapsed() > Duration::from_secs(5) {
            // SAFETY: kill has no memory preconditions.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            panic!("Xvfb {display} (pid {pid}) outlived the process that started it");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Ended by SIGTERM, which lets it remove its lock file (SIGKILL would
    // leave it, and the display number taken).
    let lock = format!("/tmp/.X{}-lock", display.trim_start_matches(':'));
    let t = Instant::now();
    while Path::new(&lock).exists() {
        assert!(t.elapsed() < Duration::from_secs(5), "{lock} left behind");
        std::thread::sleep(Duration::from_millis(20));
    }
}
