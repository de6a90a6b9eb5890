//! `warmstart bench`: hands over to the `warmstart-bench` binary. The
//! harness (plots, progress bars, CSV, suites) lives there so that this
//! binary, which `warmstart run` reads from a cold disk before every launch
//! it wraps, does not carry it.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use warmstart_launch::install::is_executable;

use crate::cli::BenchArgs;

/// The harness binary's file name.
pub const BENCH_BIN: &str = "warmstart-bench";

/// Replaces this process with `warmstart-bench [-q] ARGS…`; returns only
/// when that fails.
pub fn run(args: BenchArgs, quiet: bool) -> Result<i32> {
    let exe = std::env::current_exe().context("finding the warmstart binary")?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let path = std::env::var_os("PATH");
    let Some(bench) = find(dir, path.as_deref()) else {
        bail!(
            "bench needs the {BENCH_BIN} binary, which is in neither {} nor any \
             directory on PATH ({}); install it beside warmstart (make install does)",
            dir.display(),
            path.as_deref()
                .map_or("PATH is not set".into(), |p| p.to_string_lossy())
        );
    };
    let mut cmd = Command::new(&bench);
    // Its usage lines then read `warmstart bench …`, the command typed.
    cmd.arg0("warmstart bench");
    if quiet {
        cmd.arg("--quiet");
    }
    cmd.args(&args.args);
    // The run and daemon scenarios launch this very binary, not whichever
    // `warmstart` is beside the harness or first on PATH.
    if std::env::var_os("WARMSTART_BENCH_BIN").is_none() {
        cmd.env("WARMSTART_BENCH_BIN", &exe);
    }
    let err = cmd.exec();
    Err(err).with_context(|| format!("running {}", bench.display()))
}

/// `warmstart-bench` beside this binary, else the first on `path`.
fn find(dir: &Path, path: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    let beside = dir.join(BENCH_BIN);
    if is_executable(&beside) {
        return Some(beside);
    }
    std::env::split_paths(&path.map(OsString::from).unwrap_or_default())
        .filter(|d| !d.as_os_str().is_empty())
        .map(|d| d.join(BENCH_BIN))
        .find(|p| is_executable(p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn exe(dir: &Path, mode: u32) -> PathBuf {
        let p = dir.join(BENCH_BIN);
        std::fs::write(&p, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn beside_first_then_path_then_nothing() {
        let beside = tempfile::tempdir().unwrap();
        let on_path = tempfile::tempdir().unwrap();
        let empty = tempfile::tempdir().unwrap();
        let path = std::env::join_paths([empty.path(), on_path.path()]).unwrap();
        assert_eq!(find(beside.path(), Some(&path)), None);
        let p = exe(on_path.path(), 0o755);
        assert_eq!(find(beside.path(), Some(&path)), Some(p));
        let b = exe(beside.path(), 0o755);
        assert_eq!(find(beside.path(), Some(&path)), Some(b));
        assert_eq!(find(empty.path(), None), None);
    }

    #[test]
    fn a_file_that_cannot_run_is_not_found() {
        let d = tempfile::tempdir().unwrap();
        exe(d.path(), 0o644);
        assert_eq!(find(d.path(), None), None);
        // A directory of that name neither.
        let e = tempfile::tempdir().unwrap();
        std::fs::create_dir(e.path().join(BENCH_BIN)).unwrap();
        assert_eq!(find(e.path(), None), None);
    }
}
