//! `warmstart bench` hands over to the `warmstart-bench` binary: found
//! beside `warmstart` or on PATH, given every argument unchanged, its exit
//! status passed on, and a clear error when it is nowhere.

mod util;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use util::*;

/// The tests write scripts and then execute them: a child another test
/// forks meanwhile would hold the script open for writing, and the exec
/// would fail with ETXTBSY. They run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The real `warmstart-bench`, built by cargo now: it is a binary of
/// another package, which `cargo test -p warmstart` alone does not build
/// (cargo does not hold its build lock while tests run).
fn real_bench() -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args([
        "build",
        "-p",
        "warmstart-bench",
        "--bin",
        "warmstart-bench",
        "--message-format=json-render-diagnostics",
    ]);
    if warmstart().parent().is_some_and(|d| d.ends_with("release")) {
        cmd.arg("--release");
    }
    let out = run_ok(&mut cmd);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["reason"] == "compiler-artifact" && v["target"]["name"] == "warmstart-bench")
        .find_map(|v| v["executable"].as_str().map(PathBuf::from))
        .expect("cargo names the warmstart-bench executable")
}

/// A directory holding `warmstart` (a hard link to the binary under test,
/// so that its own directory is this one) and, when `bench` is given, a
/// `warmstart-bench` script.
fn install(bench: Option<&str>) -> (tempfile::TempDir, PathBuf) {
    // Under the target directory: same filesystem, so the link works.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let ws = dir.path().join("warmstart");
    std::fs::hard_link(warmstart(), &ws)
        .or_else(|_| std::fs::copy(warmstart(), &ws).map(drop))
        .unwrap();
    if let Some(script) = bench {
        let b = dir.path().join("warmstart-bench");
        std::fs::write(&b, script).unwrap();
        std::fs::set_permissions(&b, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    (dir, ws)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn bench_help_is_the_harness_help() {
    let _g = serial();
    let bench = real_bench();
    let path = std::env::join_paths([
        bench.parent().unwrap(),
        Path::new("/usr/bin"),
        Path::new("/bin"),
    ])
    .unwrap();
    for args in [&["bench", "--help"][..], &["help", "bench"]] {
        let out = run_ok(Command::new(warmstart()).args(args).env("PATH", &path));
        let help = text(&out.stdout);
        assert!(help.contains("Usage: warmstart bench"), "{args:?}:\n{help}");
        assert!(help.contains("--export-markdown"), "{help}");
        assert!(help.contains("EXAMPLES"), "{help}");
    }
    // A bad option is the harness's to refuse, with its usage.
    let out = run(Command::new(warmstart())
        .args(["bench", "--runs", "x", "--", "true"])
        .env("PATH", &path));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--runs"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn arguments_and_exit_status_are_handed_over() {
    let _g = serial();
    let (dir, ws) = install(Some(
        "#!/bin/sh\nfor a in \"$@\"; do echo \"$a\"; done\necho \"bin=$WARMSTART_BENCH_BIN\"\nexit 7\n",
    ));
    let out = run(Command::new(&ws)
        .args([
            "-q", "bench", "--runs", "3", "--help", "--", "ls", "-q", "a b",
        ])
        .env("PATH", "/usr/bin:/bin")
        .env_remove("WARMSTART_BENCH_BIN"));
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    let mut want: Vec<String> = ["--quiet", "--runs", "3", "--help", "--", "ls", "-q", "a b"]
        .map(String::from)
        .to_vec();
    // The run and daemon scenarios are to launch this very warmstart.
    want.push(format!("bin={}", ws.display()));
    assert_eq!(text(&out.stdout).lines().collect::<Vec<_>>(), want);
    // A WARMSTART_BENCH_BIN the user set is kept.
    let out = run(Command::new(&ws)
        .args(["bench"])
        .env("WARMSTART_BENCH_BIN", "/opt/ws"));
    assert_eq!(text(&out.stdout), "bin=/opt/ws\n");
    drop(dir);
}

#[test]
fn found_on_path_when_not_beside() {
    let _g = serial();
    let (_dir, ws) = install(None);
    let on_path = tempfile::tempdir().unwrap();
    let b = on_path.path().join("warmstart-bench");
    std::fs::write(&b, "#!/bin/sh\necho on-path \"$@\"\n").unwrap();
    std::fs::set_permissions(&b, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path =
        std::env::join_paths([on_path.path(), Path::new("/usr/bin"), Path::new("/bin")]).unwrap();
    let out = run_ok(
        Command::new(&ws)
            .args(["bench", "-r", "1"])
            .env("PATH", &path),
    );
    assert_eq!(text(&out.stdout), "on-path -r 1\n");
}

#[test]
fn missing_harness_names_both_places() {
    let _g = serial();
    let (dir, ws) = install(None);
    let empty = tempfile::tempdir().unwrap();
    let out = run(Command::new(&ws)
        .args(["bench", "--help"])
        .env("PATH", empty.path()));
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("warmstart-bench"), "{err}");
    assert!(err.contains(&dir.path().display().to_string()), "{err}");
    assert!(err.contains(&empty.path().display().to_string()), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn the_product_binary_does_not_depend_on_the_harness() {
    let _g = serial();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = run_ok(Command::new(cargo).args([
        "tree",
        "-p",
        "warmstart",
        "--edges",
        "normal",
        "--prefix",
        "none",
        "--format",
        "{p}",
    ]));
    let tree = text(&out.stdout);
    assert!(tree.contains("warmstart-launch"), "{tree}");
    for harness in ["warmstart-bench", "plotters", "indicatif", "regex-lite"] {
        assert!(
            !tree.lines().any(|l| l.starts_with(&format!("{harness} "))),
            "warmstart depends on {harness}:\n{tree}"
        );
    }
}
