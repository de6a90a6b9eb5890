//! Plans from a registry through the event loop: a fake [`PlanLookup`]
//! stands for the registry, and holds each lookup until the test lets it
//! answer, so that the loop is seen going on while a lookup waits.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Mutex;

use warmstart_plan::Plan;

use super::*;
use crate::daemon::registry::{FoundPlan, PlanLookup, Registry};
use crate::manager::load_plan;

/// Answers by the command's first argument: `600` finds `plan`, anything
/// else fails as a registry that is down. Each call says it started on
/// `entered`, then waits for `release`.
struct FakeRegistry {
    plan: Plan,
    entered: Mutex<Sender<Vec<String>>>,
    release: Mutex<Receiver<()>>,
}

impl PlanLookup for FakeRegistry {
    fn lookup(&self, argv: &[String]) -> Result<Option<FoundPlan>, String> {
        let _ = self.entered.lock().unwrap().send(argv.to_vec());
        let _ = self.release.lock().unwrap().recv();
        if argv.get(1).map(String::as_str) != Some("600") {
            return Err("connection refused".into());
        }
        Ok(Some(FoundPlan {
            plan: self.plan.clone(),
            note: "pulled from test".into(),
            dropped: Vec::new(),
        }))
    }
}

/// Waits (bounded) until `ok`.
fn until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_program_without_a_profile_gets_its_plan_from_the_registry_off_the_loop() {
    // A plan learned elsewhere: another daemon's state directory.
    let mut other = harness(|_| {});
    let data = other.data_file("lib.so", 512);
    let exe = Path::new(SLEEP);
    for _ in 0..other.lp.cfg.nrawseq {
        other.launch(exe, &["sleep", "600"], &data, 128, true);
    }
    let name = profile_name(&["sleep".into(), "600".into()]);
    let plan = load_plan(&other.lp.store, &name).unwrap();

    let mut h = harness(|_| {});
    let (entered_tx, entered) = channel();
    let (release, release_rx) = channel();
    let fake = Arc::new(FakeRegistry {
        plan,
        entered: Mutex::new(entered_tx),
        release: Mutex::new(release_rx),
    });
    h.lp.registry = Some(
        Registry::start(
            fake,
            "test".into(),
            Arc::clone(&h.lp.shared),
            h.lp.store.clone(),
            h.lp.dcfg.store_max_mib << 20,
        )
        .unwrap(),
    );

    // The first launch is learned, and its lookup runs on its own thread:
    // the loop decided the launch and goes on while the lookup is held.
    let first = h.launch(exe, &["sleep", "600"], &data, 128, false);
    assert!(matches!(h.lp.sessions[&first].mode, Mode::Learning));
    let asked = entered.recv_timeout(Duration::from_secs(60)).unwrap();
    assert_eq!(asked, ["sleep", "600"]);
    // Another launch of it while the lookup runs: not asked twice, and
    // the loop passes over it with the lookup still held.
    let second = h.launch(exe, &["sleep", "600"], &data, 4, false);
    h.step(Vec::new());
    assert!(h.lp.sessions.contains_key(&second));
    assert!(entered.try_recv().is_err(), "one lookup per program");

    release.send(()).unwrap();
    until("the plan to be installed", || {
        h.lp.registry.as_ref().unwrap().counts().1 == 1
    });
    let prof = h.lp.store.load(&name).unwrap().unwrap();
    assert_eq!(prof.phase, Phase::Prefetching);
    assert!(prof.note.as_deref().unwrap().contains("pulled from test"));
    assert!(h.lp.shared.cache.get(&name).unwrap().plan.is_some());

    // The learning launches in flight end after the plan arrived: they
    // are not written over it.
    h.exit(first);
    h.exit(second);
    let prof = h.lp.store.load(&name).unwrap().unwrap();
    assert_eq!(prof.phase, Phase::Prefetching);
    assert!(prof.traces.is_empty(), "nothing learned here: {prof:?}");

    // The next launch is prefetched with the pulled plan, and audited.
    let pid = h.launch(exe, &["sleep", "600"], &data, 128, false);
    match &h.lp.sessions[&pid].mode {
        Mode::Prefetching {
            replay, audited, ..
        } => {
            assert!(replay.is_some(), "replay started");
            assert!(*audited, "a pulled plan's first launch is audited");
        }
        Mode::Learning => panic!("not prefetched"),
    }
    assert!(
        entered.try_recv().is_err(),
        "a known program is not looked up"
    );
    h.exit(pid);

    // The registry fails: the launch is learned as without one, and no
    // other lookup is made for a while.
    let down = h.launch(exe, &["sleep", "700"], &data, 128, false);
    assert_eq!(
        entered.recv_timeout(Duration::from_secs(60)).unwrap(),
        ["sleep", "700"]
    );
    release.send(()).unwrap();
    until("the failed lookup", || {
        h.lp.registry.as_ref().unwrap().counts().0 == 2
    });
    h.exit(down);
    let name_700 = profile_name(&["sleep".into(), "700".into()]);
    assert_eq!(
        h.lp.store.load(&name_700).unwrap().unwrap().traces.len(),
        1,
        "learned as usual"
    );
    let pid = h.launch(exe, &["sleep", "800"], &data, 128, true);
    assert!(!h.lp.sessions.contains_key(&pid));
    assert!(entered.try_recv().is_err(), "no lookups while it is down");
}
