//! `warmstart stream` on the real kernel (root): cold files read forward,
//! backward and strided with CPU work between reads are prefetched ahead of
//! the reader, whether the reader is started by `stream` or attached to
//! with `--pid` — asserted from the recorder's events, not from time.

mod util;

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use util::*;

/// A 64 MiB file of distinct pages, evicted from the cache.
fn cold_file(dir: &Path) -> PathBuf {
    let big = dir.join("big");
    run_ok(Command::new(fixture()).arg("mkfile").arg(&big).arg("64"));
    let f = std::fs::File::open(&big).unwrap();
    // SAFETY: fadvise on a descriptor we own.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    big
}

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("ws-stream")
        .tempdir_in("/var/tmp")
        .unwrap()
}

/// The report's entry for `path`.
fn file_report(r: &serde_json::Value, path: &Path) -> serde_json::Value {
    r["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"].as_str() == path.to_str())
        .unwrap_or_else(|| panic!("{} is in the report: {r}", path.display()))
        .clone()
}

/// Scans `big` in `chunk_kb` chunks with 40 ms of work after each, the
/// reader's own readahead off, under `warmstart stream`; returns the report
/// and the file's entry.
fn stream_scan(big: &Path, chunk_kb: &str, order: &str) -> (serde_json::Value, serde_json::Value) {
    let out = run_ok(
        Command::new(warmstart())
            .args(["stream", "--interval", "0.25", "--json", "--"])
            .arg(fixture())
            .arg("scan")
            .arg(big)
            .args([chunk_kb, "40", order, "random"]),
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let file = file_report(&r, big);
    (r, file)
}

/// Most of what the reader used was brought in by the prefetcher before it
/// got there: it read less than half of its pages from storage itself.
fn assert_ahead(r: &serde_json::Value, file: &serde_json::Value, used: u64, pattern: &str) {
    let self_read = file["app_read"].as_u64().unwrap();
    // The reader starts at once; what it read before the recorder was
    // attached is not seen: tens of ms (a chunk or two) as a rule, but
    // up to 0.6 s was seen with a debug build evicted from the cache by
    // another program's cache drops. The reader runs for 2.6 s.
    let seen = file["used"].as_u64().unwrap();
    assert!(
        seen <= used && seen * 2 >= used,
        "the pages read after the recorder attached were seen: {file}"
    );
    let used = seen;
    assert_eq!(file["pattern"], pattern, "{file}");
    assert!(
        self_read * 2 < used,
        "most pages were cached before the reader reached them: {file}"
    );
    assert!(
        file["prefetched_used"].as_u64().unwrap() * 2 > used,
        "most pages the reader used were the prefetcher's: {file}"
    );
    assert!(r["accuracy"].as_f64().unwrap() >= 0.5, "{r}");
    assert_eq!(r["drops"], 0);
}

#[test]
fn root_stream_prefetches_ahead_of_a_sequential_reader() {
    if !require_root("root_stream_prefetches_ahead_of_a_sequential_reader") {
        return;
    }
    let dir = tempdir();
    let big = cold_file(dir.path());
    let (r, file) = stream_scan(&big, "1024", "forward");
    assert_ahead(&r, &file, 16384, "Forward");
}

#[test]
fn root_stream_prefetches_ahead_of_a_backward_reader() {
    if !require_root("root_stream_prefetches_ahead_of_a_backward_reader") {
        return;
    }
    let dir = tempdir();
    let big = cold_file(dir.path());
    let (r, file) = stream_scan(&big, "1024", "backward");
    assert_ahead(&r, &file, 16384, "Backward");
}

#[test]
fn root_stream_prefetches_ahead_of_a_strided_reader() {
    if !require_root("root_stream_prefetches_ahead_of_a_strided_reader") {
        return;
    }
    let dir = tempdir();
    let big = cold_file(dir.path());
    // 256 KiB read, 768 KiB skipped: 64 pages of every 256.
    let (r, file) = stream_scan(&big, "256", "stride:768");
    assert_ahead(&r, &file, 4096, "Strided { stride: 256, len: 64 }");
    assert!(
        file["prefetched"].as_u64().unwrap() < 8192,
        "the skipped pages were not prefetched: {file}"
    );
}

#[test]
fn root_stream_attaches_to_a_running_reader_with_pid() {
    if !require_root("root_stream_attaches_to_a_running_reader_with_pid") {
        return;
    }
    let dir = tempdir();
    let big = cold_file(dir.path());
    let mut reader = Command::new(fixture())
        .arg("scan")
        .arg(&big)
        .args(["1024", "40", "forward", "random"])
        .spawn()
        .unwrap();
    let out = run_ok(
        Command::new(warmstart())
            .args(["stream", "--interval", "0.25", "--json", "--pid"])
            .arg(reader.id().to_string()),
    );
    assert!(reader.wait().unwrap().success());
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    // The file was opened before warmstart came: named from /proc.
    let file = file_report(&r, &big);
    let used = file["used"].as_u64().unwrap();
    assert!(
        used > 8192,
        "warmstart saw the reader's pages from attach to exit: {file}"
    );
    assert_eq!(file["pattern"], "Forward", "{file}");
    assert!(
        file["app_read"].as_u64().unwrap() * 2 < used,
        "most pages were cached before the reader reached them: {file}"
    );
    assert_eq!(r["drops"], 0);
}

#[test]
fn root_stream_pid_stops_on_sigint_and_reports() {
    if !require_root("root_stream_pid_stops_on_sigint_and_reports") {
        return;
    }
    let mut sleeper = Command::new("sleep").arg("60").spawn().unwrap();
    let ws = Command::new(warmstart())
        .args(["stream", "--json", "--pid"])
        .arg(sleeper.id().to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Let it load the recorder and attach.
    std::thread::sleep(Duration::from_secs(2));
    // SAFETY: kill has no memory-safety preconditions; the pid is our child.
    unsafe { libc::kill(ws.id() as i32, libc::SIGINT) };
    let t = Instant::now();
    let out = ws.wait_with_output().unwrap();
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert!(out.status.success(), "{:?}", out.status);
    assert!(t.elapsed() < Duration::from_secs(10), "stopped on SIGINT");
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    assert_eq!(r["used"], 0, "sleep reads nothing: {r}");
}

#[test]
fn root_stream_pid_of_no_process_fails_clearly() {
    if !require_root("root_stream_pid_of_no_process_fails_clearly") {
        return;
    }
    let out = run(Command::new(warmstart()).args(["stream", "--pid", "4000000000"]));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no running process 4000000000"), "{err}");
}

#[test]
fn stream_needs_exactly_one_of_pid_and_command() {
    for args in [&["stream"][..], &["stream", "--pid", "1", "--", "true"]] {
        let out = run(Command::new(warmstart()).args(args));
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--pid <PID>") && err.contains("CMD"),
            "{args:?}: {err}"
        );
    }
}
