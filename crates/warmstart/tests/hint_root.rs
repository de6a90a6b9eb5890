//! A launch named by its command line's hint (root): the replay starts
//! before the program's path is walked, on a cold cache; a hint that the
//! file system made wrong (a program of that name installed earlier in
//! PATH) never launches the old program or charges the old profile.

mod util;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use util::*;

/// `warmstart run -- tool` with PATH `bin-a:bin-b:/usr/bin:/bin` on `mnt`.
fn launch(state: &Path, report: &Path, mnt: &Path) -> (String, serde_json::Value) {
    let path = format!(
        "{}:{}:/usr/bin:/bin",
        mnt.join("bin-a").display(),
        mnt.join("bin-b").display()
    );
    let out = run_ok(
        Command::new(warmstart())
            .args(["run", "--strategy", "concurrent", "--state-dir"])
            .arg(state)
            .arg("--report")
            .arg(report)
            .args(["--", "tool"])
            .env("PATH", path),
    );
    let r = serde_json::from_slice(&std::fs::read(report).unwrap()).unwrap();
    (String::from_utf8_lossy(&out.stdout).into_owned(), r)
}

fn script(path: &Path, body: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The hints kept in `state`: (name, program).
fn hints(state: &Path) -> Vec<(String, String)> {
    let Ok(rd) = std::fs::read_dir(state.join("names")) else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| {
            let v: serde_json::Value =
                serde_json::from_slice(&std::fs::read(e.path()).unwrap()).unwrap();
            (
                v["name"].as_str().unwrap().to_string(),
                v["program"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn root_a_hint_starts_the_replay_and_a_wrong_one_is_caught() {
    if !require_root("root_a_hint_starts_the_replay_and_a_wrong_one_is_caught") {
        return;
    }
    let fs = LoopFs::new("ext4", 96);
    run_ok(Command::new(fixture()).arg("gen").arg(&fs.mnt));
    let tool_b = fs.mnt.join("bin-b").join("tool");
    script(
        &tool_b,
        &format!(
            "echo B; exec {} run {}",
            fixture().display(),
            fs.mnt.display()
        ),
    );
    std::fs::create_dir_all(fs.mnt.join("bin-a")).unwrap();
    let state = tempfile::tempdir().unwrap();
    let rep = state.path().join("report.json");

    // Learned: the hint names the profile and bin-b's tool.
    for i in 0..2 {
        fs.evict();
        let (out, r) = launch(state.path(), &rep, &fs.mnt);
        assert_eq!(out.lines().next(), Some("B"), "launch {i}");
        assert_eq!(r["phase_before"], "learning", "launch {i}: {r}");
        assert_eq!(r["named_by_hint"], i == 1, "launch {i}: {r}");
    }
    let profile_b = report_profile(&rep);
    assert!(profile_b.starts_with("tool-"), "{profile_b}");
    assert_eq!(
        hints(state.path()),
        vec![(profile_b.clone(), tool_b.display().to_string())]
    );

    // Cold: named by the hint, the program's path not walked yet, the
    // replay started and the launch prefetched under the same profile.
    fs.evict();
    let (out, r) = launch(state.path(), &rep, &fs.mnt);
    assert_eq!(out.lines().next(), Some("B"));
    assert_eq!(r["phase_before"], "prefetching", "{r}");
    assert_eq!(r["named_by_hint"], true, "{r}");
    assert_eq!(r["profile"], profile_b.as_str(), "{r}");
    assert!(
        r["replay"]["data"]["bytes"].as_u64().unwrap() > 1 << 20,
        "the replay ran: {r}"
    );
    assert!(r["warm_skip"] == false, "{r}");

    // A tool installed earlier in PATH: the hint still names bin-b's, but
    // the launch runs bin-a's, under a profile of its own, and the hint
    // is rewritten.
    let tool_a = fs.mnt.join("bin-a").join("tool");
    script(&tool_a, "echo A");
    fs.evict();
    let (out, r) = launch(state.path(), &rep, &fs.mnt);
    assert_eq!(out.trim(), "A");
    let profile_a = report_profile(&rep);
    assert_ne!(profile_a, profile_b, "{r}");
    assert_eq!(r["named_by_hint"], false, "{r}");
    assert_eq!(r["phase_before"], "learning", "{r}");
    assert_eq!(
        hints(state.path()),
        vec![(profile_a.clone(), tool_a.display().to_string())]
    );
    // bin-b's profile was not charged with the launch.
    let b: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            state
                .path()
                .join("profiles")
                .join(&profile_b)
                .join("profile.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(b["launches"], 3, "{b}");
}

fn report_profile(rep: &Path) -> String {
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(rep).unwrap()).unwrap();
    r["profile"].as_str().unwrap().to_string()
}
