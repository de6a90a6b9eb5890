//! The small `warmstart` binary and `warmstart-core` (without root): where
//! the front finds the core, and what it does when the installation is
//! broken.

mod util;

use std::path::{Path, PathBuf};
use std::process::Command;

use util::*;

/// `src` placed at `dst` (a hard link where the file system allows it:
/// debug binaries are large).
fn place(src: &Path, dst: &Path) -> PathBuf {
    std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
    if std::fs::hard_link(src, dst).is_err() {
        std::fs::copy(src, dst).unwrap();
    }
    dst.to_path_buf()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn the_core_is_found_in_lib_beside_bin() {
    let d = tempfile::tempdir().unwrap();
    let front = place(&warmstart(), &d.path().join("usr/bin/warmstart"));
    place(
        &warmstart_core(),
        &d.path().join("usr/lib/warmstart/warmstart-core"),
    );
    let out = run_ok(Command::new(&front).arg("--version"));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("warmstart "));
    // Usage names the command as typed, not the core's file.
    let out = run(Command::new(&front).arg("status").arg("--bogus"));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("Usage: warmstart status"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn without_its_core_the_front_says_so_and_still_launches() {
    let d = tempfile::tempdir().unwrap();
    let front = place(&warmstart(), &d.path().join("bin/warmstart"));
    let out = run(Command::new(&front).arg("status"));
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("needs warmstart-core") && err.contains("reinstall warmstart"),
        "{err}"
    );
    // The front answers `run --help` itself.
    let out = run_ok(Command::new(&front).args(["run", "--help"]));
    assert!(String::from_utf8_lossy(&out.stdout).contains("Usage: warmstart run"));
    // A launch to learn needs the core: the command runs all the same,
    // with its own status and output.
    let state = d.path().join("state");
    let out = run(Command::new(&front)
        .arg("run")
        .arg("--state-dir")
        .arg(&state)
        .args(["--", "sh", "-c", "echo launched; exit 7"]));
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "launched\n");
    assert!(
        stderr(&out).contains("launching without learning or prefetching"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_front_installed_as_the_core_stops_instead_of_looping() {
    let d = tempfile::tempdir().unwrap();
    let front = place(&warmstart(), &d.path().join("bin/warmstart"));
    place(&warmstart(), &d.path().join("bin/warmstart-core"));
    let out = run(Command::new(&front).arg("status"));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("is the front binary"),
        "{}",
        stderr(&out)
    );
}
