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
    // Looking does not create: a mistyped directory stays absent.
    let typo = d.path().join("typo");
    run_ok(
        Command::new(warmstart())
            .args(["status", "--socket", "/nonexistent.sock", "--state-dir"])
            .arg(&typo),
    );
    assert!(!typo.exists());
    let out = run(Command::new(warmstart())
        .args(["forget", "nope", "--state-dir"])
        .arg(d.path()));
    assert_eq!(out.status.code(), Some(1));
    // Only profile names: a path would remove a directory outside the
    // store (it did, as root, with no daemon running).
    let victim = d.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    for name in [victim.to_str().unwrap(), "..", "../.."] {
        let out = run(Command::new(warmstart())
            .args([
                "forget",
                "--socket",
                "/nonexistent.sock",
                name,
                "--state-dir",
            ])
            .arg(d.path().join("state")));
        assert_eq!(out.status.code(), Some(2), "{name}");
        assert!(victim.is_dir(), "{name} removed it");
    }
    // --all removes unreadable profiles too, as `status` advises.
    let bad = d.path().join("state/profiles/bad-1");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(bad.join("profile.json"), "{bad").unwrap();
    run_ok(
        Command::new(warmstart())
            .args([
                "forget",
                "--all",
                "--socket",
                "/nonexistent.sock",
                "--state-dir",
            ])
            .arg(d.path().join("state")),
    );
    assert!(!bad.exists());
}

#[test]
fn bad_options_and_outputs_are_refused_before_anything_runs() {
    let d = tempfile::tempdir().unwrap();
    let ran = d.path().join("ran");
    let touch = format!("touch {}", ran.display());
    let cases: Vec<Vec<String>> = vec![
        // Seconds that are not a duration (they used to panic).
        vec!["record", "-o", "t.trace", "--timeout", "nan"],
        vec!["record", "-o", "t.trace", "--idle=-1"],
        vec!["record", "-o", "t.trace", "--timeout", "1e300"],
        // An output that cannot be written: found before the command runs.
        vec!["record", "-o", "."],
        vec!["record", "-o", "/proc/t.trace"],
    ]
    .into_iter()
    .map(|v| v.into_iter().map(String::from).collect())
    .collect();
    for mut args in cases {
        args.extend(["--".into(), "sh".into(), "-c".into(), touch.clone()]);
        let out = run(Command::new(warmstart()).args(&args).current_dir(d.path()));
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(!ran.exists(), "{args:?} ran the command");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // Sizes that overflow (they used to panic or wrap).
    for args in [
        ["--max-request", "18014398509481984"],
        ["--memory-floor", "17592186044416"],
    ] {
        let out = run(Command::new(warmstart())
            .arg("replay")
            .args(args)
            .arg("/nonexistent.plan"));
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("too large"), "{args:?}: {err}");
    }
}
