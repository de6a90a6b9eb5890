//! The device probe on the testbed's device models: a disk with a head is
//! found seek-bound, an SD card and a network volume are not, whatever
//! their latency.

use std::fs;
use std::path::PathBuf;

use warmstart_launch::device;
use warmstart_testbed::{Fs, Profile, Testbed, TestbedSpec};

/// What the image needs besides the sample: next to nothing.
fn contents() -> Vec<PathBuf> {
    ["/etc/hostname"].iter().map(PathBuf::from).collect()
}

#[test]
fn probe_finds_only_the_disk_seek_bound_root() {
    if !warmstart_testing::require_root("probe_finds_only_the_disk_seek_bound_root") {
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let src = tempfile::tempdir_in("/var/tmp").unwrap();
    fs::write(src.path().join("sample"), vec![3u8; 16 << 20]).unwrap();
    for (profile, seeks) in [
        (Profile::Hdd, true),
        (Profile::Sd, false),
        (Profile::Cloud, false),
    ] {
        let mut spec = TestbedSpec::new(Fs::Ext4);
        spec.contents = contents();
        spec.contents.push(src.path().to_path_buf());
        spec.cache_dir = cache.path().to_path_buf();
        spec.storage = Some(profile);
        let tb = Testbed::prepare(spec).unwrap();
        tb.drop_caches().unwrap();
        let sample = tb
            .root()
            .join(src.path().strip_prefix("/").unwrap())
            .join("sample");
        let (_, v) = device::probe(&sample).expect("the sample is read with O_DIRECT");
        assert_eq!(v.rotational, seeks, "{profile}: {v:?}");
        // What the model charges, measured: a random 4 KiB read costs at
        // least the model's latency, a sequential MiB its transfer time.
        let m = profile.model();
        assert!(
            v.median_read_us >= m.latency.as_secs_f64() * 1e6,
            "{profile}: {v:?}"
        );
        let mib = m.transfer_time(1 << 20).as_secs_f64() * 1e6;
        assert!(v.seq_mib_us.unwrap() >= mib * 0.9, "{profile}: {v:?}");
    }
}
