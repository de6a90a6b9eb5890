//! A startup recorded for real: the recorder in the daemon's mode (every
//! exec), a window opened as at a boot, a few programs started one after
//! another, the window closed by the clock, the trace kept and compiled.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use warmstart_bpf::{Event, Options, Recorder};
use warmstart_launch::startup::{
    uptime_ms, Input, StartupConfig, StartupKind, StartupRecording, StartupStore, StartupWindow,
    Transition,
};
use warmstart_plan::compile::CompileOptions;

#[test]
fn root_a_startup_is_recorded_and_compiled() {
    if !warmstart_testing::require_root("root_a_startup_is_recorded_and_compiled") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<_> = ["service.conf", "session.data"]
        .iter()
        .map(|n| {
            let p = dir.path().join(n);
            std::fs::write(&p, vec![b'x'; 64 * 1024]).unwrap();
            p
        })
        .collect();

    let rec = Recorder::start(Options {
        watch_exec: true,
        ..Options::default()
    })
    .unwrap();
    // Short windows: other programs on the machine exec too, and would
    // keep a long window open until its cap.
    let cfg = StartupConfig {
        quiet_s: 1.0,
        max_s: 10.0,
        boot_uptime_max_s: 1e9, // the test's "boot" is now
        ..StartupConfig::default()
    };
    let mut window = StartupWindow::new(cfg.clone());
    let t0 = Instant::now();
    let now = || t0.elapsed().as_millis() as u64;
    let uptime = uptime_ms(Path::new("/proc")).unwrap();
    let opened = window.feed(now(), Input::DaemonStarted { uptime_ms: uptime });
    assert!(matches!(
        opened[..],
        [Transition::Opened {
            kind: StartupKind::Boot,
            ..
        }]
    ));
    let mut recording = StartupRecording::new(StartupKind::Boot, 0);

    let startup = {
        let files = files.clone();
        std::thread::spawn(move || {
            for f in files {
                let ok = Command::new("cat")
                    .arg(&f)
                    .stdout(Stdio::null())
                    .status()
                    .unwrap();
                assert!(ok.success());
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    let mut buf = Vec::new();
    let closed = loop {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the window never closed"
        );
        rec.poll(Duration::from_millis(50), &mut buf).unwrap();
        for ev in &buf {
            if let Event::Exec { .. } = ev {
                window.feed(now(), Input::Exec { session: None });
            }
        }
        recording.take(&buf);
        buf.clear();
        if let Some(t) = window.tick(now()) {
            break t;
        }
    };
    startup.join().unwrap();
    let Transition::Closed { execs, .. } = closed else {
        panic!("{closed:?}");
    };
    assert!(execs >= 2, "both programs exec'd in the window: {execs}");
    assert!(!recording.processes().is_empty());
    let trace = recording.finish(rec.drops());
    drop(rec);
    let read: Vec<&str> = trace
        .files
        .iter()
        .filter_map(|f| f.path.as_deref())
        .collect();
    for f in &files {
        let f = f.to_str().unwrap();
        assert!(read.contains(&f), "{f} not in the startup's trace");
    }

    // Two startups alike: the plan holds what both read.
    let state = tempfile::tempdir().unwrap();
    let store = StartupStore::new(state.path(), &cfg);
    let opts = CompileOptions {
        min_launch_bytes: 0,
        ..CompileOptions::default()
    };
    let first = store.add(StartupKind::Boot, &trace, &opts).unwrap();
    assert!(first.plan.is_none(), "k = 2 startups are needed");
    let mut again = trace.clone();
    again.meta.started_unix_ms += 1;
    let out = store.add(StartupKind::Boot, &again, &opts).unwrap();
    assert_eq!(out.traces, 2);
    let plan = store.plan(StartupKind::Boot, &opts).plan.expect("a plan");
    let planned: Vec<&str> = plan.files.iter().map(|f| f.path.as_str()).collect();
    for f in &files {
        assert!(planned.contains(&f.to_str().unwrap()), "{f:?} not planned");
    }
}
