//! Nothing a profile learned is lost or left unreadable when `warmstart
//! run` is killed at any step of writing its state, or when the state
//! directory's disk is full (root: the launches are recorded with BPF).

mod util;

use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;
use std::process::Command;

use util::*;

/// The syscalls that are steps of writing state: each atomic write is
/// create, write, fsync, rename, fsync of the directory; plus removals and
/// new directories. A kill is injected before the N-th of them.
const WRITE_STEPS: &str = "fsync,fdatasync,rename,renameat,renameat2,unlink,unlinkat,mkdir,mkdirat";

fn copy_dir(from: &Path, to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    run_ok(Command::new("cp").arg("-a").arg(from).arg(to));
}

/// Everything in the state directory reads: each profile.json parses,
/// each plan and trace a profile lists decodes.
fn assert_readable(state: &Path, context: &str) {
    let profiles = state.join("profiles");
    let Ok(rd) = std::fs::read_dir(&profiles) else {
        return;
    };
    for e in rd.flatten() {
        let dir = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let Ok(bytes) = std::fs::read(dir.join("profile.json")) else {
            continue; // created, never saved: nothing was learned yet
        };
        let prof: serde_json::Value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("{context}: {name}/profile.json does not parse: {e}"));
        for t in prof["traces"].as_array().unwrap() {
            let p = dir.join(t.as_str().unwrap());
            let b = std::fs::read(&p)
                .unwrap_or_else(|e| panic!("{context}: listed trace {} lost: {e}", p.display()));
            warmstart_plan::Trace::from_bytes(&b)
                .unwrap_or_else(|e| panic!("{context}: {} does not decode: {e}", p.display()));
        }
        if let Ok(b) = std::fs::read(dir.join("plan")) {
            warmstart_plan::Plan::from_bytes(&b)
                .unwrap_or_else(|e| panic!("{context}: {name}/plan does not decode: {e}"));
        }
    }
    // And the CLI agrees.
    let out = run_ok(
        Command::new(warmstart())
            .args(["status", "--json", "--state-dir"])
            .arg(state),
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for p in doc["profiles"].as_array().unwrap() {
        assert!(p.get("error").is_none(), "{context}: {p}");
    }
}

fn launch(state: &Path, cmd: &[&str], kill_at: Option<usize>) -> std::process::ExitStatus {
    let mut c = match kill_at {
        Some(n) => {
            let mut c = Command::new("strace");
            c.args(["-f", "-qq", "-o", "/dev/null", "-e"])
                .arg(format!("inject={WRITE_STEPS}:signal=KILL:when={n}"))
                .arg(warmstart());
            c
        }
        None => Command::new(warmstart()),
    };
    c.args(["run", "--state-dir"])
        .arg(state)
        .args(["--profile", "fixture", "--"])
        .args(cmd);
    run(&mut c).status
}

#[test]
fn root_a_kill_at_every_write_step_loses_nothing() {
    if !require_root("root_a_kill_at_every_write_step_loses_nothing") {
        return;
    }
    if Command::new("strace").arg("-V").output().is_err() {
        panic!("strace is missing: `make test` installs it (Makefile DEB_PACKAGES)");
    }
    let fs = LoopFs::new("ext4", 48);
    run_ok(Command::new(fixture()).arg("gen").arg(&fs.mnt));
    let work = tempfile::tempdir().unwrap();
    let state = work.path().join("state");
    let base = work.path().join("base");
    std::fs::create_dir(&state).unwrap();
    let fx = fixture().display().to_string();
    let mnt = fs.mnt.display().to_string();
    let cmd = [fx.as_str(), "run", mnt.as_str()];
    let mut kills = 0;
    // Three launches: the first learns, the second learns and compiles
    // the plan, the third prefetches and judges.
    for phase in 0..3 {
        copy_dir(&state, &base);
        let mut n = 1;
        loop {
            copy_dir(&base, &state);
            let st = launch(&state, &cmd, Some(n));
            if st.signal() != Some(libc::SIGKILL) {
                assert!(st.success(), "launch {phase} with no kill left: {st:?}");
                break;
            }
            kills += 1;
            assert_readable(&state, &format!("launch {phase}, killed at write step {n}"));
            // What was learned before this launch is still there.
            if let Ok(b) = std::fs::read(base.join("profiles/fixture/profile.json")) {
                let before: serde_json::Value = serde_json::from_slice(&b).unwrap();
                let now: serde_json::Value = serde_json::from_slice(
                    &std::fs::read(state.join("profiles/fixture/profile.json")).unwrap(),
                )
                .unwrap();
                assert!(
                    now["launches"].as_u64() >= before["launches"].as_u64(),
                    "launch {phase}, step {n}: {before} -> {now}"
                );
            }
            n += 1;
            assert!(n < 200, "launch {phase} never finished under injection");
        }
        // The launch that ran to its end, from the state before it.
        copy_dir(&base, &state);
        fs.evict();
        assert!(launch(&state, &cmd, None).success());
        assert_readable(&state, &format!("launch {phase}"));
    }
    eprintln!("killed at {kills} write steps over three launches; nothing lost");
    assert!(kills >= 6, "only {kills} write steps seen");
    let prof: serde_json::Value = serde_json::from_slice(
        &std::fs::read(state.join("profiles/fixture/profile.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(prof["phase"], "prefetching", "{prof}");
}

#[test]
fn root_a_full_disk_loses_nothing_and_still_launches() {
    if !require_root("root_a_full_disk_loses_nothing_and_still_launches") {
        return;
    }
    let fs = LoopFs::new("ext4", 48);
    run_ok(Command::new(fixture()).arg("gen").arg(&fs.mnt));
    let work = tempfile::tempdir().unwrap();
    let state = work.path().join("state");
    std::fs::create_dir(&state).unwrap();
    run_ok(
        Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "ws-full"])
            .arg(&state),
    );
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
    let _unmount = Unmount(&state);
    let fx = fixture().display().to_string();
    let mnt = fs.mnt.display().to_string();
    let cmd = [fx.as_str(), "run", mnt.as_str()];
    // One learned launch, then the disk fills up.
    assert!(launch(&state, &cmd, None).success());
    assert_readable(&state, "before the disk filled");
    let filler = state.join("filler");
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=4k"])
        .arg(format!("of={}", filler.display()))
        .output();
    for i in 0..3 {
        fs.evict();
        let out = run(Command::new(warmstart())
            .args(["run", "--state-dir"])
            .arg(&state)
            .args(["--profile", "fixture", "--"])
            .args(cmd));
        assert!(out.status.success(), "launch {i} on a full disk");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("No space left"), "launch {i}: {err}");
        assert_readable(&state, &format!("full disk, launch {i}"));
    }
    let leftovers: Vec<_> = walk(&state)
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // Space again: learning goes on from what was kept.
    std::fs::remove_file(&filler).unwrap();
    for _ in 0..2 {
        fs.evict();
        assert!(launch(&state, &cmd, None).success());
    }
    let prof: serde_json::Value = serde_json::from_slice(
        &std::fs::read(state.join("profiles/fixture/profile.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(prof["phase"], "prefetching", "{prof}");
}
