//! Metadata from the block device, against the scripted backend: read
//! first, merged in device order, skipped for filesystems whose metadata
//! cache device reads do not fill, and reported per device.

mod common;

use warmstart_plan::plan::{PlanFile, PlanMeta};
use warmstart_plan::trace::FileId;
use warmstart_plan::{Entry, Plan};
use warmstart_replay::mock::{Call, MockBackend};
use warmstart_replay::{metadata_paths, replay, Count, IoPriority, MetaPath, Options};

const K: u64 = 1024;
const M: u64 = 1024 * K;

fn id() -> FileId {
    FileId {
        dev: libc::makedev(8, 1),
        ino: 1,
        size: 64 * M,
        mtime_ns: 1,
        ctime_ns: 2,
    }
}

fn plan(entries: Vec<Entry>) -> Plan {
    Plan {
        meta: PlanMeta {
            command: vec!["app".into()],
            created_unix_ms: 0,
            traces: 1,
            min_traces: 1,
            passes: vec![],
            sorted: false,
        },
        files: vec![PlanFile {
            path: "/a".into(),
            id: id(),
        }],
        lookups: vec![],
        entries,
    }
}

fn meta(device: u64, offset: u64, len: u64) -> Entry {
    Entry::Meta {
        device,
        offset,
        len,
    }
}

fn data(offset: u64, len: u64) -> Entry {
    Entry::Data {
        file: 0,
        offset,
        len,
    }
}

fn prefetch(target: &str, offset: u64, len: u64) -> Call {
    Call::Prefetch {
        target: target.into(),
        offset,
        len,
    }
}

/// One worker and an I/O priority, so the dispatcher hands everything to
/// the worker and the order of calls is the order of dispatch.
fn in_order() -> Options {
    Options {
        workers: 1,
        queue_depth: 2,
        io_priority: Some(IoPriority::BestEffort(4)),
        ..Options::default()
    }
}

fn io_calls(b: &MockBackend) -> Vec<Call> {
    b.calls()
        .into_iter()
        .filter(|c| {
            matches!(
                c,
                Call::OpenFile(_) | Call::OpenDevice(_) | Call::Prefetch { .. }
            )
        })
        .collect()
}

#[test]
fn metadata_is_read_first_merged_in_device_order() {
    let dev = libc::makedev(8, 1);
    let b = MockBackend::new()
        .with_file("/a", id())
        .with_device(dev)
        .with_device_fs(dev, "ext4");
    let p = plan(vec![
        data(0, 4 * K),
        meta(dev, M, 4 * K),
        data(4 * K, 4 * K),
        meta(dev, 0, 4 * K),
        meta(dev, 8 * K, 4 * K),
        meta(dev, M + 4 * K, 4 * K),
    ]);
    let r = replay(&p, &in_order(), &b).unwrap();
    assert_eq!(
        io_calls(&b),
        vec![
            Call::OpenDevice(dev),
            prefetch("dev:8:1", 0, 12 * K),
            prefetch("dev:8:1", M, 8 * K),
            Call::OpenFile("/a".into()),
            prefetch("/a", 0, 4 * K),
            prefetch("/a", 4 * K, 4 * K),
        ]
    );
    assert_eq!(
        r.meta,
        Count {
            entries: 4,
            bytes: 16 * K
        }
    );
    assert_eq!(r.entries_issued, 6);
    assert_eq!(r.meta_devices.len(), 1);
    let d = &r.meta_devices[0];
    assert_eq!(d.path, MetaPath::DeviceRead);
    assert_eq!(d.fs_type.as_deref(), Some("ext4"));
    assert_eq!((d.ranges, d.requests, d.requested_bytes), (2, 2, 20 * K));
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["meta_devices"][0]["path"], "device-read");
}

#[test]
fn a_merged_range_is_cut_at_the_devices_read_ahead_not_at_max_request() {
    let dev = libc::makedev(8, 1);
    let b = MockBackend::new()
        .with_device(dev)
        .with_read_ahead(dev, 8 * M);
    let p = plan(vec![meta(dev, 0, 3 * M), meta(dev, 3 * M, M)]);
    let r = replay(&p, &in_order(), &b).unwrap();
    // Data requests stop at 512 KiB; metadata read up front goes in the
    // largest pieces forced readahead reads in one pass (2 MiB).
    assert_eq!(
        io_calls(&b),
        vec![
            Call::OpenDevice(dev),
            prefetch("dev:8:1", 0, 2 * M),
            prefetch("dev:8:1", 2 * M, 2 * M),
        ]
    );
    assert_eq!(r.meta.entries, 2);
}

#[test]
fn metadata_of_xfs_and_btrfs_is_not_read_from_the_device() {
    let (ext4, xfs, btrfs) = (
        libc::makedev(7, 0),
        libc::makedev(7, 1),
        libc::makedev(7, 2),
    );
    let b = MockBackend::new()
        .with_device(ext4)
        .with_device(xfs)
        .with_device(btrfs)
        .with_device_fs(ext4, "ext4")
        .with_device_fs(xfs, "xfs")
        .with_device_fs(btrfs, "btrfs");
    let p = plan(vec![
        meta(xfs, 0, 4 * K),
        meta(btrfs, 0, 16 * K),
        meta(ext4, 0, 4 * K),
        meta(btrfs, M, 16 * K),
    ]);
    let r = replay(&p, &in_order(), &b).unwrap();
    assert_eq!(
        io_calls(&b),
        vec![Call::OpenDevice(ext4), prefetch("dev:7:0", 0, 4 * K)]
    );
    assert_eq!(
        r.skipped_meta,
        Count {
            entries: 3,
            bytes: 36 * K
        }
    );
    let paths: Vec<(String, MetaPath)> = r
        .meta_devices
        .iter()
        .map(|d| (d.name.clone(), d.path.clone()))
        .collect();
    let unsupported = |fs: &str| MetaPath::FilesystemUnsupported { fs_type: fs.into() };
    assert_eq!(
        paths,
        vec![
            ("7:0".into(), MetaPath::DeviceRead),
            ("7:1".into(), unsupported("xfs")),
            ("7:2".into(), unsupported("btrfs")),
        ]
    );
    let skipped: Vec<&str> = r.skipped_devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(skipped, vec!["7:1", "7:2"]);
    assert!(
        r.skipped_devices[1].error.contains("btrfs"),
        "{:?}",
        r.skipped_devices
    );
    assert_eq!(
        r.meta_devices[2].path.to_string(),
        "filesystem-unsupported (btrfs)"
    );
}

#[test]
fn metadata_paths_are_known_without_reading() {
    let (ext4, vda, btrfs) = (
        libc::makedev(7, 0),
        libc::makedev(254, 0),
        libc::makedev(7, 2),
    );
    let b = MockBackend::new()
        .with_device(ext4)
        .with_device_fs(ext4, "ext4")
        .with_device_fs(vda, "ext4")
        .with_device(btrfs)
        .with_device_fs(btrfs, "btrfs");
    let p = plan(vec![
        meta(ext4, 0, 4 * K),
        meta(vda, 0, 4 * K),
        meta(btrfs, 0, 4 * K),
    ]);
    let paths = metadata_paths(&p, &b);
    let got: Vec<String> = paths.iter().map(|d| d.path.to_string()).collect();
    // In device order: 7:0, 7:2, 254:0.
    assert_eq!(got[0], "device-read");
    assert_eq!(got[1], "filesystem-unsupported (btrfs)");
    assert!(got[2].starts_with("not-openable ("), "{got:?}");
    assert!(got[2].contains("Operation not permitted"), "{got:?}");
    assert!(paths.iter().all(|d| d.requests == 0));
    assert_eq!(
        io_calls(&b),
        vec![Call::OpenDevice(ext4), Call::OpenDevice(vda)],
        "opened to find out, never read; btrfs not even opened"
    );
    assert_eq!(b.open_handles(), 0, "and closed again");
}

/// A cancel while the metadata is being handed out stops the replay there:
/// the schedule is not started, and what was not read is not reached.
#[test]
fn cancel_during_the_metadata_sweep_stops_the_replay() {
    use std::sync::atomic::Ordering;
    use warmstart_replay::Engine;

    let dev = libc::makedev(8, 1);
    let b = MockBackend::new()
        .with_file("/a", id())
        .with_device(dev)
        .with_read_ahead(dev, 4 * K);
    // Ten ranges far apart, so none merge, then a data entry.
    let mut entries: Vec<Entry> = (0..10).map(|i| meta(dev, i * M, 4 * K)).collect();
    entries.push(data(0, 4 * K));
    let p = plan(entries);
    let e = Engine::new(
        &b,
        Options {
            queue_depth: 1,
            ..in_order()
        },
    )
    .unwrap();
    b.hold();
    let r = std::thread::scope(|s| {
        let run = s.spawn(|| e.run(&p));
        common::wait_until(|| b.in_flight() >= 1);
        e.cancel_flag().store(true, Ordering::Relaxed);
        b.release();
        run.join().unwrap()
    })
    .unwrap();
    assert!(r.cancelled);
    assert!(r.meta.entries <= 3, "{:?}", r.meta);
    assert_eq!(r.data, Count::default());
    assert_eq!(
        r.entries_not_reached,
        11 - r.meta.entries,
        "the data entry and the metadata not handed out"
    );
}

/// With its metadata read from the device up front, a replay starts
/// `workers_metadata_read` workers and a spare thread; where the lookups
/// must read it (a device that cannot be opened, a filesystem device reads
/// do not reach, a device holding more than a tenth of the metadata that
/// is not read, a replay that is waited for), `workers`; a count the user
/// fixed, always.
#[test]
fn fewer_workers_when_the_metadata_is_read_from_its_devices() {
    let (readable, refused, xfs) = (
        libc::makedev(8, 1),
        libc::makedev(254, 0),
        libc::makedev(7, 1),
    );
    let backend = || {
        MockBackend::new()
            .with_file("/a", id())
            .with_device(readable)
            .with_device_fs(readable, "ext4")
            .with_device(xfs)
            .with_device_fs(xfs, "xfs")
    };
    // With an I/O priority, every worker (and the spare) sets it once as
    // it starts: the calls count the threads started.
    let d = Options {
        io_priority: Some(IoPriority::Idle),
        ..Options::default()
    };
    let few = Options::WORKERS_METADATA_READ;
    assert!(few < d.workers, "{few} against {}", d.workers);
    assert!(d.spare_after.is_some(), "a spare by default");
    let mut fixed = d.clone();
    fixed.fixed_workers(d.workers);
    // Waited for, nothing runs beside the replay to take the CPU from.
    let waited = Options {
        wait: Some(std::time::Duration::from_secs(5)),
        ..d.clone()
    };
    let all = (d.workers, d.queue_depth, false);
    // (case, the plan's metadata devices with their entry counts, options,
    // workers, queue depth and whether a spare ran)
    type Case<'a> = (&'a str, Vec<(u64, u64)>, &'a Options, (usize, usize, bool));
    let cases: Vec<Case> = vec![
        (
            "read from the device",
            vec![(readable, 1)],
            &d,
            (few, 2 * few, true),
        ),
        ("no metadata", vec![], &d, all),
        ("not openable", vec![(refused, 1)], &d, all),
        ("xfs", vec![(xfs, 1)], &d, all),
        (
            "one of two not openable",
            vec![(readable, 1), (refused, 1)],
            &d,
            all,
        ),
        (
            "a tenth on a device not openable",
            vec![(readable, 9), (refused, 1)],
            &d,
            (few, 2 * few, true),
        ),
        (
            "more than a tenth on a device not openable",
            vec![(readable, 8), (refused, 1)],
            &d,
            all,
        ),
        ("fixed by the user", vec![(readable, 1)], &fixed, all),
        ("waited for", vec![(readable, 1)], &waited, all),
    ];
    for (case, devices, opts, want) in cases {
        let b = backend();
        let mut entries: Vec<Entry> = devices
            .iter()
            .flat_map(|&(dev, n)| (0..n).map(move |i| meta(dev, i * M, 4 * K)))
            .collect();
        // More requests than the most workers, so that all are started.
        entries.extend((0..20).map(|i| data(i * M, 4 * K)));
        let r = replay(&plan(entries), opts, &b).unwrap();
        let got = (r.workers, r.queue_depth, r.spare.is_some());
        assert_eq!(got, want, "{case}: {r:#?}");
        let started = b
            .calls()
            .iter()
            .filter(|c| **c == Call::IoPriority(IoPriority::Idle))
            .count();
        assert_eq!(
            started,
            want.0 + usize::from(want.2),
            "{case}: threads started"
        );
        assert_eq!(r.data.entries, 20, "{case}: the data was read all the same");
        let opened = b
            .calls()
            .iter()
            .filter(|c| matches!(c, Call::OpenDevice(_)))
            .count();
        assert!(
            opened <= devices.len(),
            "{case}: each device opened at most once"
        );
    }
}

/// With the smaller pool, a spare thread takes requests only while the
/// first worker waits on the disk in an open (or a lookup): held there,
/// the first worker's open lets the spare start the next request, and no
/// third thread ever runs; nothing held, the spare never steps in.
#[test]
fn a_spare_thread_works_only_while_the_first_worker_waits_for_metadata() {
    use std::time::Duration;
    use warmstart_replay::Engine;

    let dev = libc::makedev(8, 1);
    let backend = |fs: &str| {
        let b_id = FileId { ino: 2, ..id() };
        MockBackend::new()
            .with_file("/a", id())
            .with_file("/b", b_id)
            .with_device(dev)
            .with_device_fs(dev, fs)
    };
    let mut p = plan(vec![meta(dev, 0, 4 * K), data(0, 4 * K)]);
    p.files.push(PlanFile {
        path: "/b".into(),
        id: FileId { ino: 2, ..id() },
    });
    p.entries.extend((0..20).map(|i| Entry::Data {
        file: 1,
        offset: i * M,
        len: 4 * K,
    }));
    let opts = Options {
        workers_metadata_read: Some(1),
        spare_after: Some(Duration::from_millis(2)),
        // So that the first request is a worker's, not the dispatcher's.
        io_priority: Some(IoPriority::Idle),
        ..Options::default()
    };
    let b = backend("ext4");
    let e = Engine::new(&b, opts.clone()).unwrap();
    b.hold_opens();
    let (r, both) = std::thread::scope(|s| {
        let run = s.spawn(|| e.run(&p));
        common::wait_until(|| b.opening().0 >= 2);
        let both = b.opening().0;
        b.release();
        (run.join().unwrap().unwrap(), both)
    });
    assert_eq!(both, 2, "the spare opened /b while /a's open was held");
    assert_eq!(b.opening().1, 2, "one worker and one spare, no more");
    assert_eq!((r.workers, r.queue_depth), (1, 2));
    let spare = r.spare.expect("the report says the spare ran");
    assert!(spare.turns >= 1 && spare.requests >= 1, "{spare:?}");
    assert_eq!(spare.after_ns, 2_000_000);
    assert_eq!((r.data.entries, r.meta.entries), (21, 1));

    // Prefetches held instead (the device's queue full): the spare does
    // not step in, as it would only queue behind them.
    let b = backend("ext4");
    let e = Engine::new(&b, opts.clone()).unwrap();
    b.hold();
    let r = std::thread::scope(|s| {
        let run = s.spawn(|| e.run(&p));
        common::wait_until(|| b.in_flight() >= 1);
        std::thread::sleep(Duration::from_millis(20));
        b.release();
        run.join().unwrap().unwrap()
    });
    assert_eq!(b.max_in_flight(), 1, "{:?}", r.spare);
    assert_eq!(r.spare.map(|s| s.requests), Some(0));
    assert_eq!(r.data.entries, 21);

    // Where lookups read the metadata, the full pool runs and no spare.
    let r = replay(&p, &opts, &backend("xfs")).unwrap();
    assert_eq!(r.workers, opts.workers);
    assert_eq!(r.spare, None);
}
