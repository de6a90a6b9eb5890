//! `show` on a plan with metadata on loop devices root can open: ext4's is
//! read from the device, xfs's and btrfs's are left to the path lookups
//! (their metadata caches are not the device's page cache). Needs root
//! (losetup, mount) and mkfs for each filesystem.

mod util;

use std::os::unix::fs::MetadataExt;

use util::*;
use warmstart_plan::plan::PlanMeta;
use warmstart_plan::{Entry, Plan};
use warmstart_testing::{require_root, skip};

fn plan_on(device: u64) -> Plan {
    Plan {
        meta: PlanMeta {
            command: vec!["demo".into()],
            created_unix_ms: 0,
            traces: 1,
            min_traces: 1,
            passes: vec![],
            sorted: false,
        },
        files: vec![],
        lookups: vec![],
        entries: vec![Entry::Meta {
            device,
            offset: 0,
            len: 4096,
        }],
    }
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
        std::fs::write(&p, plan_on(rdev).to_bytes()).unwrap();
        let v = show_json(&p);
        let m = &v["metadata"][0];
        assert_eq!(m["path"], want, "{fs}: {v}");
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
