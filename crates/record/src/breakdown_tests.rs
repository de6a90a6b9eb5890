//! The classification on synthetic event streams: each test is one story
//! of a page (who inserted it, when the launch touched it, whether a
//! launch thread slept for it).

use super::*;

const ROOT: u32 = 100;
const REPLAY: u32 = 7;
const MS: u64 = 1_000_000;
/// Files: their kernel dev is 1, and the key is (1, ino).
const BIN: u64 = 10;
const LIB: u64 = 11;
const DATA: u64 = 12;
/// warmstart's own executable.
const OWN_EXE: u64 = 13;
/// Stack ids: a sleep for the mmap lock, and one on a folio.
const LOCK_STACK: u32 = 1;
const PAGE_STACK: u32 = 2;

fn ev(
    kind: WaitKind,
    pid: u32,
    tgid: u32,
    t_ms: u64,
    ino: u64,
    index: u64,
    count: u64,
) -> WaitEvent {
    WaitEvent {
        kind,
        pid,
        tgid,
        ts_ns: t_ms * MS,
        dev: 1,
        ino,
        index,
        count,
    }
}
fn exec(t: u64) -> WaitEvent {
    ev(WaitKind::Exec, ROOT, ROOT, t, BIN, 0, 0)
}
fn add_launch(pid: u32, t: u64, ino: u64, index: u64, count: u64) -> WaitEvent {
    ev(WaitKind::AddLaunch, pid, ROOT, t, ino, index, count)
}
fn add_replay(t: u64, ino: u64, index: u64, count: u64) -> WaitEvent {
    ev(
        WaitKind::AddReplay,
        REPLAY + 1,
        REPLAY,
        t,
        ino,
        index,
        count,
    )
}
fn get(pid: u32, t: u64, ino: u64, index: u64, count: u64) -> WaitEvent {
    ev(WaitKind::Get, pid, ROOT, t, ino, index, count)
}
fn map(pid: u32, t: u64, ino: u64, index: u64, count: u64) -> WaitEvent {
    ev(WaitKind::Map, pid, ROOT, t, ino, index, count)
}
fn fault(pid: u32, t: u64, ino: u64, index: u64) -> WaitEvent {
    ev(WaitKind::Fault, pid, ROOT, t, ino, index, 1)
}
fn sleep(pid: u32, from: u64, to: u64) -> WaitEvent {
    let mut e = ev(
        WaitKind::Sleep {
            end_ns: to * MS,
            stack: None,
        },
        pid,
        ROOT,
        from,
        0,
        0,
        0,
    );
    e.dev = 0;
    e
}

fn sleep_in(pid: u32, from: u64, to: u64, stack: u32) -> WaitEvent {
    let mut e = sleep(pid, from, to);
    e.kind = WaitKind::Sleep {
        end_ns: to * MS,
        stack: Some(stack),
    };
    e
}

fn key(ino: u64) -> Key {
    (1, ino)
}

/// The plan has BIN, LIB and DATA pages 0..16 each.
fn plan() -> PlanPages {
    let mut p = PlanPages::default();
    p.add(key(BIN), Some("/usr/bin/prog"), 0, 16 * PAGE);
    p.add(key(LIB), Some("/usr/lib/libx.so"), 0, 16 * PAGE);
    p.add(key(DATA), Some("/srv/data"), 0, 16 * PAGE);
    p
}

fn run(events: &[WaitEvent], requests: &[Request]) -> Breakdown {
    let plan = plan();
    let names = HashMap::from([(key(99), "/etc/not-planned".to_string())]);
    let key_of = |dev: u32, ino: u64| (dev as u64, ino);
    let sleeps = HashMap::from([
        (
            LOCK_STACK,
            SleepWhy {
                for_page: false,
                function: "rwsem_down_read_slowpath".into(),
            },
        ),
        (
            PAGE_STACK,
            SleepWhy {
                for_page: true,
                function: "folio_wait_bit_common".into(),
            },
        ),
    ]);
    // DATA is 20 pages long.
    let sizes = HashMap::from([(key(DATA), 20 * PAGE - 100)]);
    let b = classify(&Inputs {
        own_exe: Some(key(OWN_EXE)),
        sleeps: &sleeps,
        sizes: &sizes,
        events,
        plan: &plan,
        requests,
        names: &names,
        key_of: &key_of,
        drops: 0,
    });
    let sum: u64 = [
        PageClass::Resident,
        PageClass::Prefetched,
        PageClass::Late,
        PageClass::Missed,
        PageClass::NotInPlan,
    ]
    .iter()
    .map(|&c| b.class(c).pages)
    .sum();
    assert_eq!(
        sum, b.touched_pages,
        "the classes add up to what was touched"
    );
    b
}

#[test]
fn a_page_nobody_inserted_is_resident() {
    let b = run(&[exec(0), get(ROOT, 1, DATA, 0, 2)], &[]);
    assert_eq!(b.resident.pages, 2);
    assert_eq!(b.resident.bytes, 2 * PAGE);
    assert_eq!(b.touched_pages, 2);
}

#[test]
fn a_page_the_replay_inserted_first_is_prefetched_and_late_if_waited_for() {
    let b = run(
        &[
            add_replay(0, LIB, 0, 4),
            exec(1),
            // page 0 read long after: ready
            get(ROOT, 50, LIB, 0, 1),
            // page 3 faulted on while still being read: a 5 ms sleep
            fault(ROOT, 2, LIB, 3),
            sleep(ROOT, 2, 7),
        ],
        &[],
    );
    assert_eq!(b.prefetched.pages, 1);
    assert_eq!(b.late.pages, 1);
    assert_eq!(b.late.waits, 1);
    assert!((b.late.wait_ms - 5.0).abs() < 1e-9);
    assert_eq!(b.unattributed_waits, 0);
    assert_eq!(b.top_files.len(), 1);
    assert_eq!(b.top_files[0].path, "/usr/lib/libx.so");
    assert_eq!(b.top_files[0].late, 1);
}

#[test]
fn a_planned_page_the_launch_read_itself_is_missed_with_the_replays_lag() {
    let reqs = [
        // page 0 asked for 30 ms after the launch inserted it
        Request::of_bytes(key(DATA), 0, PAGE, 40 * MS),
        // page 1 asked for before the launch needed it
        Request::of_bytes(key(DATA), PAGE, PAGE, 5 * MS),
    ];
    let b = run(
        &[
            exec(0),
            // a read: the launch inserts the page, sleeps, then the get fires
            add_launch(ROOT, 10, DATA, 0, 1),
            sleep(ROOT, 11, 19),
            get(ROOT, 20, DATA, 0, 1),
            add_launch(ROOT, 21, DATA, 1, 2),
            get(ROOT, 22, DATA, 1, 2),
        ],
        &reqs,
    );
    assert_eq!(b.missed.pages, 3);
    assert_eq!(b.missed.waits, 1);
    assert!((b.missed.wait_ms - 8.0).abs() < 1e-9);
    assert_eq!(b.missed_lag.issued_later, 1);
    assert_eq!(b.missed_lag.median_ms, Some(30.0));
    assert_eq!(b.missed_lag.issued_before_needed, 1);
    assert_eq!(b.missed_lag.never_issued, 1);
    assert_eq!(b.timeline.first_request_ms, Some(5.0));
    assert_eq!(b.timeline.last_request_ms, Some(40.0));
    assert_eq!(b.timeline.requests, 2);
}

#[test]
fn the_longest_waits_tell_a_late_page_from_a_missed_one() {
    let reqs = [
        // LIB page 3 issued 2 ms before the exec, read from 1 ms before
        Request::of_bytes(key(LIB), 0, 4 * PAGE, 8 * MS),
        // DATA page 0 issued 30 ms after the launch read it itself
        Request::of_bytes(key(DATA), 0, PAGE, 40 * MS),
    ];
    let b = run(
        &[
            add_replay(9, LIB, 0, 4),
            exec(10),
            // late: faulted on 2 ms after the exec, waited 5 ms
            fault(ROOT, 12, LIB, 3),
            sleep(ROOT, 12, 17),
            // missed: inserted by the launch at 20 ms, waited 8 ms
            add_launch(ROOT, 20, DATA, 0, 1),
            sleep(ROOT, 21, 29),
            get(ROOT, 30, DATA, 0, 1),
            // prefetched and not waited for: not listed
            get(ROOT, 31, LIB, 0, 1),
        ],
        &reqs,
    );
    let w = &b.longest_waits;
    assert_eq!(w.len(), 2, "only pages waited on: {w:?}");
    assert_eq!(
        (w[0].path.as_str(), w[0].page, w[0].class),
        ("/srv/data", 0, PageClass::Missed)
    );
    assert!((w[0].wait_ms - 8.0).abs() < 1e-9);
    assert_eq!(w[0].needed_ms, 10.0);
    assert_eq!(w[0].issued_ms, Some(30.0));
    assert_eq!(w[0].replay_read_ms, None);
    assert_eq!(
        (w[1].path.as_str(), w[1].page, w[1].class),
        ("/usr/lib/libx.so", 3, PageClass::Late)
    );
    assert!((w[1].wait_ms - 5.0).abs() < 1e-9);
    assert_eq!(w[1].needed_ms, 2.0);
    assert_eq!(w[1].issued_ms, Some(-2.0));
    assert_eq!(w[1].replay_read_ms, Some(-1.0));
}

#[test]
fn a_page_outside_the_plan_is_not_in_plan_and_named_from_the_trace() {
    let b = run(
        &[
            exec(0),
            fault(ROOT + 1, 3, 99, 0),
            add_launch(ROOT + 1, 3, 99, 0, 4),
            sleep(ROOT + 1, 4, 6),
            // beyond the plan's 16 pages of DATA
            add_launch(ROOT, 8, DATA, 20, 1),
            get(ROOT, 9, DATA, 20, 1),
        ],
        &[],
    );
    assert_eq!(
        b.not_in_plan.pages, 2,
        "the faulted page and DATA's page 20"
    );
    assert_eq!(b.not_in_plan.waits, 1);
    assert_eq!(b.top_files[0].path, "/etc/not-planned");
    assert_eq!(b.top_files[0].not_in_plan, 1);
}

#[test]
fn a_sleep_followed_by_a_read_goes_to_the_read_page_the_replay_inserted() {
    // The replay inserted 0..8; the launch reads 0..8 and sleeps for page
    // 0 (still being read) before its get fires.
    let b = run(
        &[
            exec(0),
            add_replay(1, DATA, 0, 8),
            sleep(ROOT, 2, 5),
            get(ROOT, 5, DATA, 0, 8),
        ],
        &[],
    );
    assert_eq!(b.late.pages, 1);
    assert_eq!(b.prefetched.pages, 7);
    assert!((b.late.wait_ms - 3.0).abs() < 1e-9);
}

#[test]
fn sleeps_with_no_page_to_name_are_unattributed() {
    let b = run(
        &[
            exec(0),
            sleep(ROOT, 1, 3),
            map(ROOT, 4, LIB, 0, 16),
            sleep(ROOT + 2, 5, 9),
        ],
        &[],
    );
    assert_eq!(b.unattributed_waits, 2);
    assert!((b.unattributed_wait_ms - 6.0).abs() < 1e-9);
    assert!((b.wait_ms - 6.0).abs() < 1e-9);
    assert_eq!(
        b.touched_pages, 0,
        "fault-around of pages nobody inserted counts nothing"
    );
}

#[test]
fn fault_around_counts_pages_inserted_before_it() {
    let b = run(
        &[exec(0), add_replay(1, LIB, 4, 2), map(ROOT, 2, LIB, 0, 16)],
        &[],
    );
    assert_eq!(b.prefetched.pages, 2);
    assert_eq!(b.touched_pages, 2);
}

#[test]
fn the_held_child_before_exec_touches_only_warmstart_itself() {
    let b = run(
        &[
            // warmstart's own code in the held child
            fault(ROOT, 0, OWN_EXE, 3),
            get(ROOT, 0, OWN_EXE, 0, 4),
            // the kernel reading the new binary and its ELF interpreter
            // during the execve, before the exec event
            add_launch(ROOT, 1, BIN, 0, 1),
            get(ROOT, 1, BIN, 0, 1),
            add_launch(ROOT, 1, LIB, 0, 1),
            get(ROOT, 1, LIB, 0, 1),
            exec(2),
        ],
        &[],
    );
    assert_eq!(b.touched_pages, 2);
    assert_eq!(b.missed.pages, 2);
    assert_eq!(b.missed_lag.never_issued, 2);
}

#[test]
fn the_timeline_is_relative_to_the_exec() {
    let mut end = ev(WaitKind::Exit, ROOT, ROOT, 90, 0, 0, 0);
    end.dev = 0;
    let b = run(
        &[
            add_replay(3, DATA, 0, 1),
            exec(5),
            add_replay(25, DATA, 1, 1),
            end,
        ],
        &[Request::of_bytes(key(DATA), 0, PAGE, 2 * MS)],
    );
    assert_eq!(b.timeline.first_request_ms, Some(-3.0));
    assert_eq!(b.timeline.first_replay_insert_ms, Some(-2.0));
    assert_eq!(b.timeline.last_replay_insert_ms, Some(20.0));
    assert_eq!(b.timeline.launch_end_ms, Some(85.0));
}

#[test]
fn plan_pages_merge_overlapping_and_adjacent_ranges() {
    let mut p = PlanPages::default();
    p.add(key(1), None, 0, PAGE);
    p.add(key(1), None, 3 * PAGE, 2 * PAGE);
    p.add(key(1), None, PAGE, 2 * PAGE + 1); // 1..4, joins both
    p.add(key(1), None, 10 * PAGE + 5, 1); // page 10 only
    for (page, want) in [
        (0, true),
        (2, true),
        (4, true),
        (5, false),
        (9, false),
        (10, true),
        (11, false),
    ] {
        assert_eq!(p.contains(key(1), page), want, "page {page}");
    }
    assert!(!p.contains(key(2), 0));
}

#[test]
fn a_sleep_goes_to_the_data_read_after_an_opens_metadata_read() {
    // An open reads an inode block (metadata, not in the plan) and sleeps
    // for it; the read that follows inserts the file's page and sleeps
    // again: that sleep is the file's, not the metadata's.
    const META: u64 = 500;
    let b = run(
        &[
            exec(0),
            add_launch(ROOT, 1, META, 3, 1),
            sleep(ROOT, 1, 2),
            add_launch(ROOT, 3, DATA, 0, 1),
            add_launch(ROOT, 3, DATA, 1, 1),
            sleep(ROOT, 3, 7),
            get(ROOT, 7, DATA, 0, 2),
        ],
        &[],
    );
    let data = b.top_files.iter().find(|f| f.path == "/srv/data").unwrap();
    assert!((data.wait_ms - 4.0).abs() < 1e-9, "{:?}", b.top_files);
    assert!((b.not_in_plan.wait_ms - 1.0).abs() < 1e-9);
    assert!((b.missed.wait_ms - 4.0).abs() < 1e-9);
}

#[test]
fn preemptions_are_counted_apart_and_do_not_move_the_page_waited_for() {
    let mut pre = ev(
        WaitKind::Runnable {
            end_ns: 4 * MS,
            by_replay: true,
        },
        ROOT,
        ROOT,
        2,
        0,
        0,
        0,
    );
    pre.dev = 0;
    let b = run(
        &[
            exec(0),
            fault(ROOT, 1, LIB, 0),
            pre,
            sleep(ROOT, 5, 8),
            add_launch(ROOT, 5, LIB, 0, 1),
        ],
        &[],
    );
    assert_eq!(b.preemptions, 1);
    assert!((b.runnable_wait_ms - 2.0).abs() < 1e-9);
    assert!((b.runnable_wait_replay_ms - 2.0).abs() < 1e-9);
    assert!(
        (b.wait_ms - 3.0).abs() < 1e-9,
        "a preemption is not a sleep"
    );
    assert_eq!(b.missed.waits, 1);
}

#[test]
fn a_sleep_for_a_lock_goes_to_no_page_and_is_named() {
    // A fault on a cached page, then a sleep for the mmap lock, then one
    // on the folio of a page the thread inserted.
    let b = run(
        &[
            exec(0),
            fault(ROOT, 1, LIB, 0),
            sleep_in(ROOT, 2, 6, LOCK_STACK),
            sleep_in(ROOT + 1, 2, 3, LOCK_STACK),
            add_launch(ROOT, 7, DATA, 0, 1),
            sleep_in(ROOT, 7, 8, PAGE_STACK),
            get(ROOT, 8, DATA, 0, 1),
        ],
        &[],
    );
    assert_eq!(
        b.resident.waits, 0,
        "the lock sleep is not the cached page's"
    );
    assert_eq!(b.missed.waits, 1);
    assert_eq!(b.unattributed_waits, 2);
    assert_eq!(
        b.unattributed_by,
        vec![SleepReason {
            function: "rwsem_down_read_slowpath".into(),
            wait_ms: 5.0,
            waits: 2
        }]
    );
}

#[test]
fn a_read_past_the_end_of_the_file_touches_only_its_pages() {
    // read(fd, buf, 1 MiB) at page 16 of a 20-page file
    let b = run(
        &[
            exec(0),
            get(ROOT, 1, DATA, 16, 256),
            get(ROOT, 2, LIB, 0, 3),
        ],
        &[],
    );
    assert_eq!(
        b.resident.pages,
        4 + 3,
        "DATA's pages 16..20, LIB's (size unknown) 0..3"
    );
}
