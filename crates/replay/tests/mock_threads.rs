//! The engine's threads against the scripted backend: I/O priority, CPU
//! confinement, cancellation, descriptors, and the report's JSON. No
//! privileges needed.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use warmstart_plan::trace::{FileId, NsOpKind};
use warmstart_replay::mock::{Call, MockBackend};
use warmstart_replay::{
    replay, Backend, Engine, IoPriority, LookupOutcome, MemInfo, Options, RealBackend, ReplayCpus,
    ReplayError, Residency,
};

mod common;
use common::*;

#[test]
fn io_priority_is_set_on_every_worker() {
    // Workers start as requests are dispatched: six requests start all 3.
    let b = MockBackend::new().with_file("/a", id(1));
    let o = Options {
        io_priority: Some(IoPriority::Idle),
        ..opts(3)
    };
    let entries = (0..6u64).map(|i| data(0, i * 4 * K, 4 * K)).collect();
    replay(&plan(&[("/a", id(1))], &[], entries), &o, &b).unwrap();
    let n = b
        .calls()
        .iter()
        .filter(|c| **c == Call::IoPriority(IoPriority::Idle))
        .count();
    assert_eq!(n, 3);
    // With a priority, even a one-request plan goes to a worker: the
    // dispatcher (the caller's thread) does not issue it at its own.
    let b = MockBackend::new().with_file("/a", id(1));
    replay(
        &plan(&[("/a", id(1))], &[], vec![data(0, 0, 4 * K)]),
        &o,
        &b,
    )
    .unwrap();
    assert!(b.calls().contains(&Call::IoPriority(IoPriority::Idle)));
}

#[test]
fn replay_is_confined_to_one_cpu_and_gives_the_callers_back() {
    let b = MockBackend::new()
        .with_file("/a", id(1))
        .with_cpus(&[0, 1, 2]);
    let p = plan(
        &[("/a", id(1))],
        &[],
        vec![data(0, 0, 4 * K), data(0, 4 * K, 4 * K)],
    );
    let r = replay(&p, &opts(2), &b).unwrap();
    assert_eq!(r.cpus, Some(vec![2]));
    // The dispatcher (which issues the first request itself) and the
    // worker each move after their first piece of work; the dispatcher
    // moves back at the end.
    let cpus: Vec<Call> = b
        .calls()
        .into_iter()
        .filter(|c| matches!(c, Call::Cpus(_)))
        .collect();
    assert_eq!(
        cpus,
        [
            Call::Cpus(vec![2]),
            Call::Cpus(vec![2]),
            Call::Cpus(vec![0, 1, 2])
        ]
    );

    // CPUs that may not be used: one note, the replay runs anyway, and the
    // report does not claim it was confined.
    let b = MockBackend::new().with_file("/a", id(1));
    let o = Options {
        cpus: ReplayCpus::List(vec![7]),
        ..opts(2)
    };
    let r = replay(&p, &o, &b).unwrap();
    assert_eq!((r.cpus, r.data.entries), (None, 2));
    assert_eq!(r.error_count, 1);
    assert!(r.errors[0].contains("none may be used"), "{:?}", r.errors);
    let b = MockBackend::new()
        .with_file("/a", id(1))
        .refusing_cpu_moves();
    let entries = (0..6u64).map(|i| data(0, i * 4 * K, 4 * K)).collect();
    let r = replay(&plan(&[("/a", id(1))], &[], entries), &opts(3), &b).unwrap();
    assert_eq!((r.cpus, r.data.entries), (None, 6));
    assert_eq!(r.error_count, 1, "one note for all threads: {:?}", r.errors);
    assert_eq!(b.calls().last(), Some(&Call::Cpus(vec![0, 1])), "restored");

    // A process on one CPU, or `all`, is left alone; a list is used as is.
    let cases = [
        (ReplayCpus::One, vec![3], None),
        (ReplayCpus::All, vec![0, 1], None),
        (ReplayCpus::List(vec![0]), vec![0, 1], Some(vec![0])),
    ];
    for (choice, allowed, want) in cases {
        let b = MockBackend::new()
            .with_file("/a", id(1))
            .with_cpus(&allowed);
        let o = Options {
            cpus: choice.clone(),
            ..opts(1)
        };
        assert_eq!(replay(&p, &o, &b).unwrap().cpus, want, "{choice}");
    }

    // `idle`: no CPU is pinned; each thread that worked drops to idle
    // priority after its first piece of work.
    let b = MockBackend::new().with_file("/a", id(1));
    let o = Options {
        cpus: ReplayCpus::Idle,
        ..opts(2)
    };
    let r = replay(&p, &o, &b).unwrap();
    assert_eq!((r.cpus, r.data.entries, r.error_count), (None, 2, 0));
    let calls = b.calls();
    assert!(
        !calls.iter().any(|c| matches!(c, Call::Cpus(_))),
        "{calls:?}"
    );
    let idle = calls.iter().filter(|c| **c == Call::Idle).count();
    assert!((1..=2).contains(&idle), "{calls:?}");
}

/// The mock's files with the real thread affinity calls; every prefetch
/// records the CPUs its thread may run on.
struct RealAffinity {
    mock: MockBackend,
    real: RealBackend,
    /// (thread, its CPUs) at each prefetch.
    seen: std::sync::Mutex<Vec<(std::thread::ThreadId, Vec<usize>)>>,
}

impl Backend for RealAffinity {
    type Handle = <MockBackend as Backend>::Handle;
    fn open_file(&self, path: &std::path::Path) -> Result<(Self::Handle, FileId), ReplayError> {
        self.mock.open_file(path)
    }
    fn open_device(&self, device: u64) -> Result<Self::Handle, ReplayError> {
        self.mock.open_device(device)
    }
    fn prefetch(&self, h: &Self::Handle, offset: u64, len: u64) -> Result<(), ReplayError> {
        let cpus = self.real.thread_cpus()?;
        self.seen
            .lock()
            .unwrap()
            .push((std::thread::current().id(), cpus));
        self.mock.prefetch(h, offset, len)
    }
    fn lookup(&self, kind: NsOpKind, path: &std::path::Path) -> Result<LookupOutcome, ReplayError> {
        self.mock.lookup(kind, path)
    }
    fn memory(&self) -> Result<MemInfo, ReplayError> {
        self.mock.memory()
    }
    fn read_ahead(&self, device: u64) -> Option<u64> {
        self.mock.read_ahead(device)
    }
    fn residency(&self, h: &Self::Handle, o: u64, l: u64) -> Result<Residency, ReplayError> {
        self.mock.residency(h, o, l)
    }
    fn set_io_priority(&self, prio: IoPriority) -> Result<(), ReplayError> {
        self.mock.set_io_priority(prio)
    }
    fn thread_cpus(&self) -> Result<Vec<usize>, ReplayError> {
        self.real.thread_cpus()
    }
    fn set_thread_cpus(&self, cpus: &[usize]) -> Result<(), ReplayError> {
        self.real.set_thread_cpus(cpus)
    }
}

#[test]
fn workers_really_run_on_the_replays_cpu() {
    // In a thread of its own: the test harness's threads keep theirs.
    std::thread::spawn(|| {
        let b = RealAffinity {
            mock: MockBackend::new().with_file("/a", id(1)),
            real: RealBackend::new(),
            seen: Default::default(),
        };
        let before = b.real.thread_cpus().unwrap();
        let entries = (0..12u64).map(|i| data(0, i * 4 * K, 4 * K)).collect();
        let r = replay(&plan(&[("/a", id(1))], &[], entries), &opts(4), &b).unwrap();
        assert_eq!(r.error_count, 0, "{:?}", r.errors);
        let want = if before.len() > 1 {
            vec![*before.last().unwrap()]
        } else {
            before.clone()
        };
        assert_eq!(r.cpus, (before.len() > 1).then(|| want.clone()));
        // A worker may do its first request where it started, and every
        // later one on the replay's CPU.
        let seen = b.seen.lock().unwrap();
        assert_eq!(seen.len(), 12);
        let mut threads = std::collections::HashSet::new();
        for (thread, cpus) in seen.iter() {
            if !threads.insert(*thread) {
                assert_eq!(*cpus, want, "{seen:?}");
            }
        }
        assert_eq!(b.real.thread_cpus().unwrap(), before, "caller's CPUs back");
    })
    .join()
    .unwrap();
}

#[test]
fn cancel_stops_before_the_next_entry() {
    let b = MockBackend::new().with_file("/a", id(1));
    let p = plan(
        &[("/a", id(1))],
        &[],
        vec![data(0, 0, 4 * K), data(0, 4 * K, 4 * K)],
    );
    let e = Engine::new(&b, opts(1)).unwrap();
    e.cancel_flag().store(true, Ordering::Relaxed);
    let r = e.run(&p).unwrap();
    assert!(r.cancelled);
    assert_eq!((r.entries_issued, r.entries_not_reached), (0, 2));
}

#[test]
fn invalid_plans_and_options_are_refused() {
    let b = MockBackend::new();
    let bad = plan(&[], &[], vec![data(3, 0, 4 * K)]);
    assert!(matches!(
        replay(&bad, &opts(1), &b),
        Err(ReplayError::Plan(_))
    ));
    assert!(matches!(
        Engine::new(&b, opts(0)),
        Err(ReplayError::Options(_))
    ));
}

#[test]
fn report_serializes_to_json() {
    let mut changed = id(1);
    changed.ino = 77;
    let b = MockBackend::new().with_file("/a", changed);
    let p = plan(
        &[("/a", id(1)), ("/gone", id(2))],
        &[],
        vec![data(0, 0, 4 * K), data(1, 0, 4 * K)],
    );
    let r = replay(&p, &opts(1), &b).unwrap();
    let v = serde_json::to_value(&r).unwrap();
    let skipped = &v["skipped_files"];
    assert_eq!(skipped[0]["path"], "/a");
    assert_eq!(skipped[0]["reason"], "changed");
    assert_eq!(skipped[0]["fields"], serde_json::json!(["ino"]));
    assert_eq!(skipped[0]["found"]["ino"], 77);
    assert_eq!(skipped[1]["reason"], "missing");
    assert_eq!(v["stopped_by_memory"], false);
    assert!(v["timings"]["issue_ns"].is_u64());
    let back: warmstart_replay::Report = serde_json::from_value(v).unwrap();
    assert_eq!(back, r);
}

#[test]
fn cancel_during_replay_stops_between_requests() {
    let b = MockBackend::new()
        .with_file("/a", id(1))
        .with_read_ahead(sda(), 4 * K);
    let p = plan(
        &[("/a", id(1))],
        &[],
        vec![data(0, 0, 400 * K), data(0, 400 * K, 4 * K)],
    );
    let o = Options {
        workers: 1,
        queue_depth: 1,
        ..opts(1)
    };
    let e = Engine::new(&b, o).unwrap();
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
    // In flight, queued, and the one being handed over when cancelled.
    assert!(r.requests <= 3, "{} requests after cancel", r.requests);
    assert_eq!(r.entries_not_reached, 2, "the cut entry and the next");
}

/// A file's descriptor is closed once its last request is issued, so a
/// plan with thousands of files does not hold thousands of descriptors.
#[test]
fn descriptors_close_after_their_last_request() {
    let b = MockBackend::new()
        .with_file("/a", id(1))
        .with_file("/b", id(2));
    let p = plan(
        &[("/a", id(1)), ("/b", id(2))],
        &[],
        vec![data(0, 0, 4 * K), data(1, 0, 4 * K), data(1, 4 * K, 4 * K)],
    );
    let o = Options {
        workers: 1,
        queue_depth: 1,
        ..opts(1)
    };
    b.hold();
    let r = std::thread::scope(|s| {
        let run = s.spawn(|| replay(&p, &o, &b));
        let wait_for = |what: &str, cond: &dyn Fn() -> bool| {
            let t = Instant::now();
            while !cond() {
                assert!(
                    t.elapsed() < Duration::from_secs(10),
                    "waiting for {what}: {:?}",
                    b.calls()
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        wait_for("/a's request", &|| b.in_flight() == 1);
        // Let /a's only request finish; the worker moves on to /b.
        b.allow(1);
        wait_for("/b's first request", &|| {
            b.in_flight() == 1
                && b.calls()
                    .iter()
                    .any(|c| matches!(c, Call::Prefetch { target, .. } if target == "/b"))
        });
        assert_eq!(
            b.open_handles(),
            1,
            "/a is closed while /b is still being read"
        );
        b.release();
        run.join().unwrap()
    })
    .unwrap();
    assert_eq!(r.data.entries, 3);
    assert_eq!(b.open_handles(), 0);
}
