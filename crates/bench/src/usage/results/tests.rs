//! Tests of [`super`].

use super::*;

fn launch(mode: &str, boot: usize, n: usize, ms: f64, measured: bool) -> LaunchResult {
    LaunchResult {
        mode: mode.into(),
        boot,
        launch: n,
        program: "p".into(),
        measured,
        start_s: 0.0,
        ms,
        cold_ms: None,
        warm_ms: None,
        gap: None,
        preload_state_before: None,
        predictions_before: None,
        startup_sequence: false,
        after_eviction: false,
    }
}

#[test]
fn gap_arithmetic() {
    assert_eq!(gap(1000.0, 200.0, 200.0), Some(1.0));
    assert_eq!(gap(1000.0, 200.0, 1000.0), Some(0.0));
    assert_eq!(gap(1000.0, 200.0, 600.0), Some(0.5));
    // Slower than cold: a negative share.
    assert_eq!(gap(1000.0, 200.0, 1080.0), Some(-0.1));
    // No gap to capture.
    assert_eq!(gap(200.0, 200.0, 100.0), None);
    assert_eq!(gap(100.0, 200.0, 100.0), None);
}

#[test]
fn baselines_are_the_same_launch_in_none_and_warm() {
    let mut ls = vec![
        launch("none", 2, 1, 1000.0, true),
        launch("none", 2, 2, 500.0, true),
        launch("warm", 2, 1, 200.0, true),
        launch("warm", 2, 2, 100.0, true),
        launch("predict", 2, 1, 280.0, true),
        launch("predict", 2, 2, 500.0, true),
        launch("predict", 1, 1, 900.0, false),
    ];
    fill_baselines(&mut ls);
    assert_eq!(ls[4].cold_ms, Some(1000.0));
    assert_eq!(ls[4].warm_ms, Some(200.0));
    assert!((ls[4].gap.unwrap() - 0.9).abs() < 1e-9);
    assert_eq!(ls[5].gap, Some(0.0));
    // No baseline for a boot the other modes did not run.
    assert_eq!(ls[6].cold_ms, None);
    assert_eq!(ls[6].gap, None);
    assert_eq!(ls[0].gap, Some(0.0));
    assert_eq!(ls[2].gap, Some(1.0));
}

#[test]
fn totals_over_measured_boots() {
    let mut ls = vec![
        launch("none", 1, 1, 5000.0, false),
        launch("none", 2, 1, 1000.0, true),
        launch("none", 2, 2, 500.0, true),
        launch("warm", 1, 1, 100.0, false),
        launch("warm", 2, 1, 200.0, true),
        launch("warm", 2, 2, 100.0, true),
        launch("predict", 1, 1, 5000.0, false),
        launch("predict", 2, 1, 280.0, true),
        launch("predict", 2, 2, 520.0, true),
    ];
    fill_baselines(&mut ls);
    let boot = |mode: &str, b, measured, read, daemon| BootResult {
        mode: mode.into(),
        boot: b,
        measured,
        read_bytes: read,
        daemon,
    };
    let d = |pre, used| {
        Some(DaemonBoot {
            bytes_preloaded: pre,
            bytes_used: used,
            ..DaemonBoot::default()
        })
    };
    let boots = vec![
        boot("none", 1, false, 999, None),
        boot("none", 2, true, 100, None),
        boot("warm", 2, true, 300, None),
        boot("predict", 1, false, 999, d(1000, 0)),
        boot("predict", 2, true, 150, d(400, 300)),
    ];
    let sample = |boot, held, budget| Sample {
        mode: "predict".into(),
        boot,
        t_s: 0.0,
        cached_bytes: 1,
        held_bytes: Some(held),
        budget_bytes: Some(budget),
        preload_state: None,
        preloads: None,
    };
    // The training boot's sample over the budget is not counted.
    let samples = vec![sample(1, 900, 100), sample(2, 40, 100), sample(2, 60, 90)];
    let modes: Vec<String> = ["none", "predict", "warm"].map(String::from).to_vec();
    let t = totals(&modes, &ls, &boots, &samples);
    let p = &t[1];
    assert_eq!(p.launches, 2);
    assert_eq!(p.total_ms, 800.0);
    // (1000-280 + 500-520) / (800 + 400) = 700 / 1200.
    assert!((p.gap_captured.unwrap() - 700.0 / 1200.0).abs() < 1e-9);
    assert_eq!(p.precision, Some(0.75));
    assert_eq!(p.max_held_bytes, Some(60));
    assert_eq!(p.budget_at_max_bytes, Some(90));
    assert_eq!(p.over_budget, Some(false));
    assert_eq!(p.extra_read_bytes, Some(50));
    assert_eq!(p.slower_than_cold, 1);
    assert!((p.max_ratio_to_cold.unwrap() - 1.04).abs() < 1e-9);
    let none = &t[0];
    assert_eq!(none.gap_captured, Some(0.0));
    assert_eq!(none.precision, None);
    assert_eq!(none.over_budget, None);
    assert_eq!(none.extra_read_bytes, Some(0));
    assert_eq!(t[2].gap_captured, Some(1.0));
    // Without the none mode, no gap and no extra reads.
    let modes: Vec<String> = ["predict", "warm"].map(String::from).to_vec();
    let ls2: Vec<LaunchResult> = ls.iter().filter(|l| l.mode != "none").cloned().collect();
    let mut ls2 = ls2;
    fill_baselines(&mut ls2);
    let t = totals(&modes, &ls2, &boots, &samples);
    assert_eq!(t[0].gap_captured, None);
    assert_eq!(t[0].extra_read_bytes, None);
}

#[test]
fn precision_needs_preloads() {
    assert_eq!(precision(&[]), None);
    let a = DaemonBoot {
        bytes_preloaded: 100,
        bytes_used: 25,
        ..DaemonBoot::default()
    };
    let b = DaemonBoot {
        bytes_preloaded: 300,
        bytes_used: 275,
        ..DaemonBoot::default()
    };
    assert_eq!(precision(&[&a, &b]), Some(0.75));
    assert_eq!(precision(&[&DaemonBoot::default()]), None);
}

#[test]
fn gaps_over_startup_sequences_and_evictions() {
    // Boot 2: launch 1 in a login's sequence, 2 after an eviction, 3
    // neither; boot 1 trains.
    let mut ls = Vec::new();
    for (mode, times) in [
        ("none", [1000.0, 800.0, 500.0]),
        ("warm", [200.0, 300.0, 100.0]),
        ("predict", [360.0, 550.0, 500.0]),
    ] {
        ls.push(launch(mode, 1, 1, 5000.0, false));
        for (n, ms) in times.into_iter().enumerate() {
            ls.push(launch(mode, 2, n + 1, ms, true));
        }
    }
    for l in &mut ls {
        l.startup_sequence = l.launch == 1;
        l.after_eviction = l.launch == 2;
    }
    fill_baselines(&mut ls);
    let modes: Vec<String> = ["none", "predict", "warm"].map(String::from).to_vec();
    let t = totals(&modes, &ls, &[], &[]);
    let p = &t[1];
    // The training boot's launch 1 is not counted.
    assert_eq!((p.startup_launches, p.eviction_launches), (1, 1));
    // (1000 - 360) / (1000 - 200).
    assert!((p.startup_gap_captured.unwrap() - 0.8).abs() < 1e-9);
    // (800 - 550) / (800 - 300).
    assert!((p.eviction_gap_captured.unwrap() - 0.5).abs() < 1e-9);
    // Over all: (640 + 250 + 0) / (800 + 500 + 400).
    assert!((p.gap_captured.unwrap() - 890.0 / 1700.0).abs() < 1e-9);
    assert_eq!(t[0].startup_gap_captured, Some(0.0));
    assert_eq!(t[2].eviction_gap_captured, Some(1.0));
    // None of them: no figure, not 0%.
    for l in &mut ls {
        l.after_eviction = false;
    }
    let t = totals(&modes, &ls, &[], &[]);
    assert_eq!(
        (t[1].eviction_launches, t[1].eviction_gap_captured),
        (0, None)
    );
    // A launch without its baseline leaves the figure unknown.
    assert_eq!(gap_over(&ls[..1]), None);
    assert_eq!(gap_over(std::iter::empty()), None);
}

pub(crate) fn results(log: Vec<Step>, launches: Vec<LaunchResult>) -> UsageResults {
    let modes: Vec<String> = ["none", "predict", "warm"].map(String::from).to_vec();
    let totals = totals(&modes, &launches, &[], &[]);
    UsageResults {
        machine: Machine::default(),
        testbed: None,
        settings: UsageSettings {
            suite: "s".into(),
            log_source: "l".into(),
            boots: 1,
            train_boots: 0,
            modes,
            learn: "allow-list".into(),
            disks: vec![],
            sequence_gap_s: Some(2.0),
        },
        log,
        launches,
        boots: vec![],
        samples: vec![],
        totals,
    }
}

#[test]
fn tables_show_sequences_and_evictions_when_the_log_has_them() {
    let mut ls: Vec<LaunchResult> = ["none", "predict", "warm"]
        .into_iter()
        .flat_map(|m| [launch(m, 1, 1, 900.0, true), launch(m, 1, 2, 700.0, true)])
        .collect();
    for l in &mut ls {
        l.startup_sequence = l.launch == 1;
        l.after_eviction = l.launch == 2;
        l.ms = match (l.mode.as_str(), l.launch) {
            ("warm", _) => 100.0,
            ("predict", 1) => 180.0,
            ("predict", _) => 400.0,
            (_, 1) => 900.0,
            _ => 700.0,
        };
    }
    fill_baselines(&mut ls);
    let plain = results(vec![Step::Boot], ls.clone());
    assert!(!render(&plain).contains("after an eviction"));
    assert!(!render_markdown(&plain).contains("after an eviction"));
    let log = vec![
        Step::Boot,
        Step::Login { after_ms: 1 },
        Step::Evict { after_ms: 1 },
    ];
    let r = results(log, ls);
    let text = render(&r);
    assert!(
        text.contains("p (login)") && text.contains("p (evicted)"),
        "{text}"
    );
    // predict: (900 - 180) / 800 = 90% of the sequence, (700 - 400) /
    // 600 = 50% after the eviction.
    let row = text
        .lines()
        .skip_while(|l| !l.starts_with("Login startup sequences"))
        .find(|l| l.starts_with("predict"))
        .unwrap();
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells, ["predict", "1", "90%", "1", "50%"], "{text}");
    let md = render_markdown(&r);
    assert!(md.contains("### Login startup sequences and launches after an eviction"));
    assert!(md.contains("| predict | 1 | 90% | 1 | 50% |"), "{md}");
    assert!(md.contains("A login step started"));
    // And the JSON has the flags and figures.
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["launches"][0]["startup_sequence"], true);
    assert_eq!(v["totals"][1]["eviction_launches"], 1);
    assert_eq!(v["totals"][1]["startup_gap_captured"], 0.9);
}
