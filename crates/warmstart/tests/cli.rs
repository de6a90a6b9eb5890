//! The binary's user interface without root: help, and bad input.

mod util;

use std::path::Path;
use std::process::Command;

use util::*;

#[test]
fn every_subcommand_has_help_with_examples() {
    for sub in [
        "record", "show", "compile", "replay", "run", "status", "forget",
    ] {
        let out = run_ok(Command::new(warmstart()).args([sub, "--help"]));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("EXAMPLES"),
            "{sub} --help has examples:\n{text}"
        );
    }
}

#[test]
fn bad_files_get_one_clear_error() {
    let d = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty", vec![], "too short"),
        (
            "foreign",
            b"\x7fELF\x02\x01\x01\0 and then some more bytes here".to_vec(),
            "not a warmstart trace",
        ),
        ("garbage", vec![0x42; 100], "not a warmstart trace"),
    ];
    for (name, bytes, want) in cases {
        let p = d.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        for sub in [vec!["show"], vec!["compile", "-o", "/dev/null"]] {
            let out = run(Command::new(warmstart()).args(&sub).arg(&p));
            assert_eq!(out.status.code(), Some(2), "{name} {sub:?}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains(want), "{name} {sub:?}: {err}");
        }
    }
    let out = run(Command::new(warmstart()).args(["show", "/nonexistent/x.trace"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/x.trace"));
    // Not regular files: refused at once, not read (a FIFO would block,
    // /dev/zero would fill memory).
    let fifo = d.path().join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo on a NUL-terminated path we own.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    for p in [fifo.as_path(), Path::new("/dev/zero"), d.path()] {
        for sub in ["show", "replay"] {
            let out = run(Command::new(warmstart()).arg(sub).arg(p));
            assert_eq!(out.status.code(), Some(2), "{sub} {}", p.display());
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("not a regular file"), "{sub}: {err}");
        }
    }
}

#[test]
fn status_on_an_empty_state_dir() {
    let d = tempfile::tempdir().unwrap();
    let out = run_ok(
        Command::new(warmstart())
            .arg("status")
            .arg("--state-dir")
            .arg(d.path()),
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("no profiles"));
    let out = run(Command::new(warmstart())
        .args(["forget", "nope", "--state-dir"])
        .arg(d.path()));
    assert_eq!(out.status.code(), Some(1));
}
