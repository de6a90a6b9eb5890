//! Plans forged to cost the replay as much as possible: past the plan
//! format's limits (a file claiming to be 2^64 bytes long with an entry of
//! 2^62 bytes) they are refused; at those limits (a 2^63-byte file, a
//! 1 TiB entry), ranges past the end of their file, a cancel before any
//! work. Each must be rejected or finish
//! at once, with what happened in the report. Run on a thread with a
//! generous deadline, only so that a regression fails instead of hanging.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use warmstart_plan::plan::{PlanFile, PlanMeta};
use warmstart_plan::trace::FileId;
use warmstart_plan::{Entry, Plan};
use warmstart_replay::mock::{Call, MockBackend};
use warmstart_replay::{
    replay, Backend, Count, Engine, IoPriority, MemInfo, Options, RealBackend, Report, SkipReason,
};

/// Near the most a plan may hold in all (`warmstart_plan::limits`): 2^23
/// requests of 128 KiB, were they counted one by one.
const HUGE: u64 = (1 << 40) - (1 << 20);
/// The largest file size a plan may claim.
const BIG_FILE: u64 = i64::MAX as u64;
const HANG_GUARD: Duration = Duration::from_secs(5);

fn id(size: u64) -> FileId {
    FileId {
        dev: libc::makedev(8, 0),
        ino: 7,
        size,
        mtime_ns: 1,
        ctime_ns: 2,
    }
}

fn plan(files: Vec<(String, FileId)>, entries: Vec<Entry>) -> Plan {
    Plan {
        meta: PlanMeta {
            command: vec!["forged".into()],
            created_unix_ms: 0,
            traces: 1,
            min_traces: 1,
            passes: vec![],
            sorted: false,
        },
        files: files
            .into_iter()
            .map(|(path, id)| PlanFile { path, id })
            .collect(),
        lookups: vec![],
        entries,
    }
}

fn data(file: u32, offset: u64, len: u64) -> Entry {
    Entry::Data { file, offset, len }
}

/// Runs `f` on a thread; fails the test if it has not returned in
/// [`HANG_GUARD`].
fn finishes<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(HANG_GUARD)
        .expect("the replay of a forged plan did not finish")
}

fn guard_off() -> Options {
    Options {
        memory_floor: Some(0),
        ..Options::default()
    }
}

fn prefetches(b: &MockBackend) -> usize {
    b.calls()
        .iter()
        .filter(|c| matches!(c, Call::Prefetch { .. }))
        .count()
}

#[test]
fn an_exabyte_entry_is_stopped_before_any_request() {
    for opts in [Options::default(), guard_off()] {
        let r = finishes(move || {
            let b = MockBackend::new()
                .with_file("/small", FileId { ino: 1, ..id(8192) })
                .with_file("/huge", id(BIG_FILE));
            let p = plan(
                vec![
                    ("/small".into(), FileId { ino: 1, ..id(8192) }),
                    ("/huge".into(), id(BIG_FILE)),
                ],
                vec![data(0, 0, 8192), data(1, 0, HUGE)],
            );
            let r = replay(&p, &opts, &b).unwrap();
            (r, prefetches(&b))
        });
        let (r, n) = r;
        // Guard on or off, the schedule does not fit in this machine's
        // memory (16 GiB), so nothing of it is read.
        assert!(r.stopped_by_memory, "{r:?}");
        assert_eq!(r.entries_not_reached, 2);
        assert_eq!((r.data, n), (Count::default(), 0));
    }
}

/// The memory cap is out of the way (a mock machine with exabytes of
/// RAM): the file is found changed on its first request, and the rest of
/// its 2^62 bytes, 2^43 requests, is counted as skipped in one step.
#[test]
fn an_exabyte_entry_of_a_changed_file_is_skipped_in_one_step() {
    for io_priority in [None, Some(IoPriority::BestEffort(4))] {
        let (r, n) = finishes(move || {
            let b = MockBackend::new()
                .with_memory([MemInfo {
                    total: u64::MAX / 2,
                    available: u64::MAX / 2,
                }])
                .with_file("/huge", id(8192));
            let p = plan(vec![("/huge".into(), id(BIG_FILE))], vec![data(0, 0, HUGE)]);
            let opts = Options {
                io_priority,
                ..guard_off()
            };
            let r = replay(&p, &opts, &b).unwrap();
            (r, prefetches(&b))
        });
        assert_eq!(n, 0, "nothing read from a changed file");
        assert_eq!(r.skipped_files.len(), 1);
        let s = &r.skipped_files[0];
        assert!(matches!(s.reason, SkipReason::Changed { .. }), "{s:?}");
        assert_eq!((s.entries, s.bytes), (1, HUGE), "{io_priority:?}");
        assert!(!r.stopped_by_memory);
    }
}

#[test]
fn data_past_the_end_of_its_file_is_not_requested() {
    let b = MockBackend::new()
        .with_file("/f", id(10_000))
        .with_file("/empty", FileId { ino: 8, ..id(0) });
    let p = plan(
        vec![
            ("/f".into(), id(10_000)),
            ("/empty".into(), FileId { ino: 8, ..id(0) }),
        ],
        vec![
            // Within the plan's slack past the end, so `check` lets them be.
            data(0, 0, 2 << 20),
            data(0, 1 << 20, 1 << 20),
            // Size 0: the plan allows 64 GiB, the file has no pages.
            data(1, 0, 64 << 30),
        ],
    );
    let r = finishes(move || replay(&p, &guard_off(), &b).map(|r| (r, b.calls())));
    let (r, calls) = r.unwrap();
    let reads: Vec<&Call> = calls
        .iter()
        .filter(|c| matches!(c, Call::Prefetch { .. }))
        .collect();
    assert_eq!(
        reads,
        vec![&Call::Prefetch {
            target: "/f".into(),
            offset: 0,
            len: 12_288
        }],
        "only the file's own pages"
    );
    assert_eq!(
        r.data,
        Count {
            entries: 1,
            bytes: 12_288
        }
    );
    assert_eq!(
        r.beyond_eof,
        Count {
            entries: 2,
            bytes: (2 << 20) - 12_288 + (1 << 20) + (64 << 30)
        }
    );
    assert!(
        !r.stopped_by_memory,
        "clamped bytes are what the guard counts"
    );
}

#[test]
fn a_cancel_before_the_replay_stops_it_during_setup() {
    let b = MockBackend::new().with_file("/f", id(1 << 30));
    let entries = (0..200_000u64).map(|i| data(0, i * 4096, 4096)).collect();
    let p = plan(vec![("/f".into(), id(1 << 30))], entries);
    let engine = Engine::new(&b, Options::default()).unwrap();
    engine.cancel_flag().store(true, Ordering::Relaxed);
    let r: Report = engine.run(&p).unwrap();
    assert!(r.cancelled);
    assert_eq!(r.entries_not_reached, 200_000);
    assert_eq!(b.calls(), vec![], "no memory read, no open, no request");
}

/// The same forged plans against the kernel, on a regular file (no root
/// needed): a claimed size of u64::MAX makes the identity check fail, and
/// a plan whose identity matches reads only the file's real pages.
#[test]
fn forged_plans_on_a_real_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("small");
    std::fs::write(&path, vec![1u8; 8192]).unwrap();
    let b = RealBackend::new();
    let (_, real) = b.open_file(&path).unwrap();
    let name = path.display().to_string();
    let claims_huge = FileId {
        size: BIG_FILE,
        ..real
    };
    let cases: Vec<(&str, FileId, u64)> = vec![
        ("exabyte entry", claims_huge, HUGE),
        ("256 MiB entry of a changed file", claims_huge, 256 << 20),
        ("matching file, entry past its end", real, 2 << 20),
    ];
    for (what, planned, len) in cases {
        let p = plan(vec![(name.clone(), planned)], vec![data(0, 0, len)]);
        let r = finishes(move || replay(&p, &guard_off(), &RealBackend::new()).unwrap());
        match what {
            "exabyte entry" => {
                assert!(r.stopped_by_memory, "{what}: {r:?}");
                assert_eq!((r.entries_not_reached, r.files_opened), (1, 0), "{what}");
            }
            "256 MiB entry of a changed file" => {
                assert_eq!(r.skipped_files.len(), 1, "{what}");
                assert_eq!(r.skipped_files[0].bytes, 256 << 20, "{what}");
                assert_eq!(r.requests, 0, "{what}");
            }
            _ => {
                assert_eq!(r.data.bytes, 8192, "{what}");
                assert_eq!(r.beyond_eof.bytes, (2 << 20) - 8192, "{what}");
                assert_eq!(r.requests, 1, "{what}");
            }
        }
    }
    assert!(Path::new(&name).exists());
}

/// Past the format's limits, a forged plan is refused before any work.
#[test]
fn a_plan_past_the_limits_is_refused() {
    let b = MockBackend::new().with_file("/huge", id(8192));
    let p = plan(
        vec![("/huge".into(), id(u64::MAX))],
        vec![data(0, 0, 1 << 62)],
    );
    let err = finishes(move || replay(&p, &guard_off(), &b).unwrap_err().to_string());
    assert!(err.contains("too large"), "{err}");
}
