//! `warmstart run --breakdown` on the real kernel (root): a learned launch
//! over files on a real (loop-mounted ext4) filesystem, caches dropped,
//! broken down page by page; and a launch reading a file its plan lacks.

mod util;

use std::path::Path;
use std::process::Command;

use util::*;

const CLASSES: [&str; 5] = ["resident", "prefetched", "late", "missed", "not_in_plan"];

fn launch(state: &Path, profile: &str, extra: &[&str], report: &Path, cmd: &[&str]) {
    run_ok(
        Command::new(warmstart())
            .args([
                "run",
                "--strategy",
                "concurrent",
                "--nrawseq",
                "1",
                "--state-dir",
            ])
            .arg(state)
            .args(["--profile", profile, "--report"])
            .arg(report)
            .args(extra)
            .arg("--")
            .args(cmd),
    );
}

fn report(p: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(p).expect("launch report written"))
        .expect("report is JSON")
}

fn drop_caches(fs: &LoopFs) {
    fs.evict();
    run_ok(&mut Command::new("sync"));
    std::fs::write("/proc/sys/vm/drop_caches", "3").expect("drop caches");
}

/// The breakdown, checked for consistency: the classes add up to the
/// pages touched, bytes are pages of 4 KiB, and nothing was lost.
fn breakdown(r: &serde_json::Value) -> &serde_json::Value {
    let b = &r["breakdown"];
    assert!(b.is_object(), "no breakdown in {r:#}");
    let pages: Vec<u64> = CLASSES
        .iter()
        .map(|c| b[c]["pages"].as_u64().unwrap())
        .collect();
    assert_eq!(
        pages.iter().sum::<u64>(),
        b["touched_pages"].as_u64().unwrap(),
        "{b:#}"
    );
    for c in CLASSES {
        assert_eq!(
            b[c]["bytes"].as_u64().unwrap(),
            4096 * b[c]["pages"].as_u64().unwrap()
        );
    }
    assert_eq!(b["drops"], 0, "the tracer lost records: {b:#}");
    b
}

#[test]
fn root_breakdown_of_a_prefetched_launch_classes_every_page() {
    if !require_root("root_breakdown_of_a_prefetched_launch_classes_every_page") {
        return;
    }
    let fs = LoopFs::new("ext4", 96);
    run_ok(Command::new(fixture()).arg("gen").arg(&fs.mnt));
    let state = tempfile::tempdir().unwrap();
    let rep = state.path().join("report.json");
    let fx = fixture().display().to_string();
    let mnt = fs.mnt.display().to_string();
    let cmd = [fx.as_str(), "run", mnt.as_str()];

    // Learned from one launch; breakdown off: the report says nothing of it.
    drop_caches(&fs);
    launch(state.path(), "fixture", &[], &rep, &cmd);
    assert_eq!(report(&rep)["phase_after"], "prefetching");
    drop_caches(&fs);
    launch(state.path(), "fixture", &[], &rep, &cmd);
    let r = report(&rep);
    assert!(r.get("breakdown").is_none(), "off by default: {r:#}");
    assert!(
        r["replay"].get("issued").is_none(),
        "no request log by default"
    );

    drop_caches(&fs);
    launch(state.path(), "fixture", &["--breakdown"], &rep, &cmd);
    let r = report(&rep);
    let b = breakdown(&r);
    assert!(b["touched_pages"].as_u64().unwrap() > 0, "{b:#}");
    // The replay ran ahead of a cold launch: pages it inserted were used.
    let by_replay =
        b["prefetched"]["pages"].as_u64().unwrap() + b["late"]["pages"].as_u64().unwrap();
    assert!(by_replay > 0, "{b:#}");
    let t = &b["timeline"];
    assert!(t["requests"].as_u64().unwrap() > 0, "{t:#}");
    assert!(
        t["first_request_ms"].is_number() && t["launch_end_ms"].is_number(),
        "{t:#}"
    );
    // The request log served the breakdown and is not in the report.
    assert!(r["replay"].get("issued").is_none());
}

#[test]
fn root_breakdown_shows_a_file_the_plan_lacks_as_not_in_plan() {
    if !require_root("root_breakdown_shows_a_file_the_plan_lacks_as_not_in_plan") {
        return;
    }
    let fs = LoopFs::new("ext4", 64);
    // 2 MiB each, distinct content.
    for (i, name) in ["a", "b", "extra"].iter().enumerate() {
        let body: Vec<u8> = (0..2 << 20)
            .map(|j: usize| (j / 4096 + i * 7) as u8)
            .collect();
        std::fs::write(fs.mnt.join(name), body).unwrap();
    }
    let state = tempfile::tempdir().unwrap();
    let rep = state.path().join("report.json");
    let m = fs.mnt.display();
    let learned = format!("cat {m}/a {m}/b > /dev/null");
    let more = format!("cat {m}/a {m}/b {m}/extra > /dev/null");

    drop_caches(&fs);
    launch(state.path(), "cat", &[], &rep, &["sh", "-c", &learned]);
    assert_eq!(report(&rep)["phase_after"], "prefetching");

    // The same profile, now also reading `extra`, which its plan lacks.
    drop_caches(&fs);
    launch(
        state.path(),
        "cat",
        &["--breakdown"],
        &rep,
        &["sh", "-c", &more],
    );
    let r = report(&rep);
    let b = breakdown(&r);
    // cat read all 512 pages of `extra`, and only the launch inserted them.
    assert!(b["not_in_plan"]["pages"].as_u64().unwrap() >= 512, "{b:#}");
    // The planned files were the replay's to read: none of theirs is
    // among the files the launch waited on as not in the plan.
    for f in b["top_files"].as_array().unwrap() {
        let p = f["path"].as_str().unwrap();
        if p.ends_with("/a") || p.ends_with("/b") {
            assert_eq!(f["not_in_plan"], 0, "{f:#}");
        }
    }
    // The pages waited on longest: at most ten, longest first, each with
    // a wait, none longer than the launch's whole wait. Pages of `extra`
    // were the launch's own reads, never issued nor read by the replay;
    // those of `a` and `b` are the plan's.
    let waits = b["longest_waits"].as_array().unwrap();
    assert!(b["not_in_plan"]["wait_ms"].as_f64().unwrap() > 0.0, "{b:#}");
    assert!(!waits.is_empty() && waits.len() <= 10, "{b:#}");
    let ms: Vec<f64> = waits
        .iter()
        .map(|w| w["wait_ms"].as_f64().unwrap())
        .collect();
    assert!(ms.windows(2).all(|p| p[0] >= p[1]), "{ms:?}");
    assert!(ms.iter().all(|&m| m > 0.0), "{ms:?}");
    assert!(
        ms.iter().sum::<f64>() <= b["wait_ms"].as_f64().unwrap() + 1e-6,
        "{b:#}"
    );
    for w in waits {
        let p = w["path"].as_str().unwrap();
        if p.ends_with("/extra") {
            assert_eq!(w["class"], "not-in-plan", "{w:#}");
            assert!(
                w["issued_ms"].is_null() && w["replay_read_ms"].is_null(),
                "{w:#}"
            );
        }
        if p.ends_with("/a") || p.ends_with("/b") {
            assert_ne!(w["class"], "not-in-plan", "{w:#}");
        }
        if w["class"] == "late" {
            assert!(w["replay_read_ms"].is_number(), "{w:#}");
        }
    }
}
