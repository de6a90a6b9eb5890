//! Replays started before their program is loaded, driven through the
//! event loop's fake source: the execve hints, a `PATH` search taken as one
//! execve from its first candidate on, and their data paced until the
//! exec.

use super::*;

/// An execve's entry by `pid`, as the recorder reports it.
fn exec_start(pid: u32, filename: &str, argv: &[&str]) -> Event {
    Event::ExecStart {
        tgid: pid,
        ts_ns: monotonic_ns(),
        filename: filename.to_string(),
        argv: Some(argv.iter().map(|s| s.to_string()).collect()),
    }
}

/// Its exec event, for `exe`.
fn exec(pid: u32, exe: &Path, argv: &[&str]) -> Event {
    Event::Exec {
        uid: me_uid(),
        tgid: pid,
        ts_ns: monotonic_ns(),
        file: file_info(exe),
        argv: Some(argv.iter().map(|s| s.to_string()).collect()),
    }
}

/// Whether a replay paces its data: `None` without a replay or gate.
fn paced(m: &Mode) -> Option<bool> {
    match m {
        Mode::Prefetching {
            replay: Some(_),
            gate: Some(g),
            ..
        } => Some(!g.is_open()),
        _ => None,
    }
}

/// Makes the plan of [`learned_sleep`] cold: a plan already in the page
/// cache is not replayed (`Start::Cached`).
fn cold(h: &Harness) {
    h.evict(&h.dir.path().join("lib.so"));
}

/// `sleep 600` learned until its profile prefetches; its name.
fn learned_sleep(h: &mut Harness) -> String {
    let data = h.data_file("lib.so", 512);
    for _ in 0..h.lp.cfg.nrawseq {
        let pid = h.launch(Path::new(SLEEP), &["sleep", "600"], &data, 128, false);
        h.exit(pid);
    }
    let name = profile_name(&["sleep".into(), "600".into()]);
    assert_eq!(
        h.lp.shared.cache.get(&name).map(|k| k.phase),
        Some(Phase::Prefetching)
    );
    name
}

#[test]
fn a_path_search_starts_its_replay_at_the_first_candidate() {
    let mut h = harness(|d| d.replay_at_execve = true);
    let name = learned_sleep(&mut h);
    let exe = Path::new(SLEEP);
    let argv = ["sleep", "600"];
    // `execvp("sleep")` with a directory before /usr/bin in PATH: the
    // first candidate fails, the second is the program.
    let missing = h.dir.path().join("bin/sleep");
    let missing = missing.to_str().unwrap();
    let first_key = execs::key(me_uid(), None, missing, &argv.map(String::from));
    cold(&h);
    let pid = h.process();
    h.step(vec![exec_start(pid, missing, &argv)]);
    assert!(!h.lp.early.contains_key(&pid), "no hint, nothing cached");
    h.step(vec![exec_start(pid, SLEEP, &argv)]);
    assert!(h.lp.early.contains_key(&pid), "the program resolved");
    h.step(vec![exec(pid, exe, &argv)]);
    assert!(matches!(
        h.lp.sessions[&pid].mode,
        Mode::Prefetching {
            replay: Some(_),
            ..
        }
    ));
    h.exit(pid);
    // The launch is remembered under the search's first candidate.
    assert_eq!(h.lp.execs.get(&first_key), Some(name.as_str()));

    // The next such search starts the replay at its first candidate, and
    // that replay goes on through the next one to the exec.
    let before = h.lp.status.replays_at_execve;
    cold(&h);
    let pid = h.process();
    h.step(vec![exec_start(pid, missing, &argv)]);
    let hinted = |h: &Harness, pid| h.lp.early.get(&pid).and_then(|e| e.hinted.clone());
    assert_eq!(hinted(&h, pid), Some(first_key.clone()));
    let started = h.lp.early[&pid].at;
    h.step(vec![exec_start(pid, SLEEP, &argv)]);
    assert_eq!(hinted(&h, pid), Some(first_key.clone()), "kept");
    assert_eq!(h.lp.early[&pid].at, started, "the same replay");
    assert_eq!(paced(&h.lp.early[&pid].mode), Some(true), "data paced");
    h.step(vec![exec(pid, exe, &argv)]);
    assert!(h.lp.early.is_empty());
    assert_eq!(paced(&h.lp.sessions[&pid].mode), Some(false), "loaded");
    assert!(matches!(
        h.lp.sessions[&pid].mode,
        Mode::Prefetching {
            replay: Some(_),
            ..
        }
    ));
    assert_eq!(h.lp.status.replays_at_execve, before + 1);
    h.exit(pid);

    // Another execve after a failed one is no such search: other
    // arguments, or the same name nowhere else.
    for (next, next_argv) in [
        (SLEEP, ["sleep", "1"]),
        ("/usr/bin/sleep-not", ["sleep", "600"]),
    ] {
        cold(&h);
        let pid = h.process();
        h.step(vec![exec_start(pid, missing, &argv)]);
        assert_eq!(hinted(&h, pid), Some(first_key.clone()));
        h.step(vec![exec_start(pid, next, &next_argv)]);
        assert_eq!(hinted(&h, pid), None, "{next} {next_argv:?}");
    }
}
