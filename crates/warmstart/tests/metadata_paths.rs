//! `show` and `status` say which path a plan's metadata takes on this
//! machine. Most need no root: the plan's metadata is on a device that
//! does not exist, so it cannot be opened whoever asks. The root test
//! makes filesystems on loop devices root can open.

mod util;

use std::os::unix::fs::MetadataExt;
use std::process::Command;

use util::*;
use warmstart_plan::plan::{PlanFile, PlanMeta};
use warmstart_plan::trace::FileId;
use warmstart_plan::{Entry, Plan};
use warmstart_testing::{require_root, skip};

/// A device number nothing uses: major 511 is not assigned.
fn absent_device() -> u64 {
    libc::makedev(511, 77)
}

fn plan() -> Plan {
    let dev = absent_device();
    let meta = |offset, len| Entry::Meta {
        device: dev,
        offset,
        len,
    };
    plan_of(
        vec![PlanFile {
            path: "/nonexistent/demo".into(),
            id: FileId {
                dev: 1,
                ino: 2,
                size: 4096,
                mtime_ns: 3,
                ctime_ns: 4,
            },
        }],
        vec![
            meta(1 << 20, 4096),
            Entry::Data {
                file: 0,
                offset: 0,
                len: 4096,
            },
            meta(8 << 20, 8192),
        ],
    )
}

fn plan_of(files: Vec<PlanFile>, entries: Vec<Entry>) -> Plan {
    Plan {
        meta: PlanMeta {
            command: vec!["demo".into()],
            created_unix_ms: 0,
            traces: 1,
            min_traces: 1,
            passes: vec![],
            sorted: false,
        },
        files,
        lookups: vec![],
        entries,
    }
}

const LINE: &str = "metadata on 511:77 (no filesystem mounted): not openable (ENOENT): \
                    warmed by path lookups instead";

#[test]
fn show_says_where_metadata_goes_for_a_device_that_does_not_exist() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("demo.plan");
    std::fs::write(&p, plan().to_bytes()).unwrap();
    for format in ["summary", "table"] {
        let out = run_ok(
            Command::new(warmstart())
                .args(["show", "--format", format])
                .arg(&p),
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let want = format!("{LINE} [2 entries, 12.0 KiB]");
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with("metadata on "))
                .collect::<Vec<_>>(),
            vec![want.as_str()],
            "{format}:\n{text}"
        );
        assert!(
            text.lines()
                .any(|l| l
                    == "replay workers: 8 (path lookups read the metadata, one at a time each)"),
            "{format}:\n{text}"
        );
    }
    let v = show_json(&p);
    assert_eq!(v["replay_workers"], 8, "{v}");
    let m = &v["metadata"];
    assert_eq!(m.as_array().map(Vec::len), Some(1), "{v}");
    let m = &m[0];
    assert_eq!(m["name"], "511:77");
    assert_eq!(m["device"], absent_device());
    assert_eq!(m["path"], "not-openable");
    assert!(m["fs_type"].is_null() && m["node"].is_null(), "{m}");
    assert!(
        m["error"]
            .as_str()
            .unwrap()
            .contains("No such file or directory"),
        "{m}"
    );
    assert_eq!(m["planned"]["entries"], 2);
    assert_eq!(m["planned"]["bytes"], 12288);
    assert_eq!(m["summary"], LINE);
    // The plan itself is unchanged in the JSON.
    assert_eq!(v["entries"].as_array().map(Vec::len), Some(3));
    // CSV rows are entries only.
    let out = run_ok(
        Command::new(warmstart())
            .args(["show", "--format", "csv"])
            .arg(&p),
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("metadata on"));
}

#[test]
fn a_plan_without_metadata_has_no_metadata_section() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("data.plan");
    let mut plan = plan();
    plan.entries.retain(|e| !matches!(e, Entry::Meta { .. }));
    std::fs::write(&p, plan.to_bytes()).unwrap();
    let out = run_ok(Command::new(warmstart()).arg("show").arg(&p));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("metadata on"));
    assert!(show_json(&p)["metadata"].is_null());
}

#[test]
fn status_says_where_each_devices_metadata_goes() {
    let d = tempfile::tempdir().unwrap();
    let store = warmstart_launch::Store::open(d.path()).unwrap();
    for name in ["demo-1", "other-2"] {
        let mut prof = warmstart_launch::Profile::new(name, &["demo".into()]);
        let bytes = plan().to_bytes();
        prof.plan_bytes = Some(bytes.len() as u64);
        store.save(&mut prof).unwrap();
        std::fs::write(store.plan_path(name), bytes).unwrap();
    }
    let status = |json: bool| {
        let mut c = Command::new(warmstart());
        c.args(["status", "--socket", "/nonexistent.sock", "--state-dir"])
            .arg(d.path());
        if json {
            c.arg("--json");
        }
        run_ok(&mut c).stdout
    };
    let text = String::from_utf8(status(false)).unwrap();
    let want = format!("{LINE} [plans of 2 profiles: 4 entries, 24.0 KiB]");
    assert!(text.lines().any(|l| l == want), "{text}");
    let v: serde_json::Value = serde_json::from_slice(&status(true)).unwrap();
    let devices = v["metadata"]["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 1, "{v}");
    assert_eq!(devices[0]["path"], "not-openable");
    assert_eq!(devices[0]["summary"], LINE);
    assert_eq!(
        devices[0]["profiles"],
        serde_json::json!(["demo-1", "other-2"])
    );
    assert_eq!(devices[0]["planned"]["entries"], 4);
    assert_eq!(v["metadata"]["unreadable_plans"], serde_json::json!([]));
}

#[test]
fn root_show_says_which_filesystems_metadata_is_read_from_the_device() {
    let test = "root_show_says_which_filesystems_metadata_is_read_from_the_device";
    if !require_root(test) {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    for (fs, want) in [
        ("ext4", "device-read"),
        ("xfs", "filesystem-unsupported"),
        ("btrfs", "filesystem-unsupported"),
    ] {
        let mkfs = format!("/usr/sbin/mkfs.{fs}");
        if !std::path::Path::new(&mkfs).exists() {
            skip(test, &format!("no {mkfs}"));
            continue;
        }
        let lfs = LoopFs::new(fs, 320);
        let rdev = std::fs::metadata(&lfs.dev).unwrap().rdev();
        let p = d.path().join(format!("{fs}.plan"));
        let on_it = Entry::Meta {
            device: rdev,
            offset: 0,
            len: 4096,
        };
        std::fs::write(&p, plan_of(vec![], vec![on_it]).to_bytes()).unwrap();
        let v = show_json(&p);
        let m = &v["metadata"][0];
        assert_eq!(m["path"], want, "{fs}: {v}");
        // Read from the device first, the replay needs fewer threads.
        let workers = if want == "device-read" {
            warmstart_replay::Options::WORKERS_METADATA_READ
        } else {
            8
        };
        assert_eq!(v["replay_workers"], workers, "{fs}: {v}");
        assert_eq!(m["fs_type"], fs, "{fs}: {m}");
        assert_eq!(m["node"], lfs.dev.as_str(), "{fs}: {m}");
        let summary = m["summary"].as_str().unwrap();
        let expected = if want == "device-read" {
            format!(
                "metadata on {} ({fs}): read from the device at the start of the replay",
                lfs.dev
            )
        } else {
            format!(
                "metadata on {} ({fs}): not read from the device ({fs} keeps its metadata \
                 in a cache of its own): warmed by path lookups instead",
                lfs.dev
            )
        };
        assert_eq!(summary, expected);
    }
}
