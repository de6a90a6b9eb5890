//! `warmstart stream` on the real kernel (root): a cold file read
//! sequentially with CPU work between reads is prefetched ahead of the
//! reader — asserted from the recorder's events, not from time.

mod util;

use std::os::fd::AsRawFd;
use std::process::Command;

use util::*;

#[test]
fn root_stream_prefetches_ahead_of_a_sequential_reader() {
    if !require_root("root_stream_prefetches_ahead_of_a_sequential_reader") {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("ws-stream")
        .tempdir_in("/var/tmp")
        .unwrap();
    let big = dir.path().join("big");
    run_ok(Command::new(fixture()).arg("mkfile").arg(&big).arg("64"));
    let f = std::fs::File::open(&big).unwrap();
    // SAFETY: fadvise on a descriptor we own.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let out = run_ok(
        Command::new(warmstart())
            .args(["stream", "--interval", "0.25", "--json", "--"])
            .arg(fixture())
            .arg("scan")
            .arg(&big)
            .args(["1024", "40", "forward", "random"]),
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let file = r["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"].as_str() == big.to_str())
        .unwrap_or_else(|| panic!("the scanned file is in the report: {r}"));
    let used = file["used"].as_u64().unwrap();
    let self_read = file["app_read"].as_u64().unwrap();
    assert_eq!(used, 16384, "every page was read: {file}");
    assert_eq!(file["pattern"], "Forward", "{file}");
    assert!(
        self_read * 2 < used,
        "most pages were cached before the reader reached them: {file}"
    );
    assert!(r["accuracy"].as_f64().unwrap() >= 0.5, "{r}");
    assert_eq!(r["drops"], 0);
}
