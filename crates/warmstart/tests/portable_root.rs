//! Portable plans end to end (root): a plan learned here, exported, and
//! imported into a fresh state directory after the files were copied anew
//! (new inodes, same bytes) is prefetched from the first launch; a file
//! whose bytes differ is dropped at import, by name; `changed` sends a
//! profile whose files were replaced back to learning.

mod util;

use std::path::Path;
use std::process::Command;

use util::*;

fn run_cmd(state: &Path, report: &Path, cmd: &[&str]) -> std::process::Output {
    run(Command::new(warmstart())
        .args(["run", "--strategy", "concurrent", "--state-dir"])
        .arg(state)
        .args(["--profile", "fixture", "--report"])
        .arg(report)
        .arg("--")
        .args(cmd))
}

fn report(p: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(p).expect("launch report written"))
        .expect("report is JSON")
}

fn plan(state: &Path) -> warmstart_plan::Plan {
    let p = state.join("profiles/fixture/plan");
    warmstart_plan::Plan::from_bytes(&std::fs::read(p).unwrap()).unwrap()
}

/// Every file under `dir` replaced by a copy of itself: same bytes and
/// mtime, new inode (what a fresh machine built from the same image has).
fn copy_anew(dir: &Path) {
    for p in walk(dir) {
        let bytes = std::fs::read(&p).unwrap();
        let mtime = std::fs::metadata(&p).unwrap().modified().unwrap();
        let tmp = p.with_extension("new");
        std::fs::write(&tmp, &bytes).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&tmp)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        std::fs::rename(&tmp, &p).unwrap();
    }
}

#[test]
fn root_exported_plan_is_prefetched_from_the_first_launch_elsewhere() {
    if !require_root("root_exported_plan_is_prefetched_from_the_first_launch_elsewhere") {
        return;
    }
    let fs = LoopFs::new("ext4", 96);
    run_ok(Command::new(fixture()).arg("gen").arg(&fs.mnt));
    let here = tempfile::tempdir().unwrap();
    let rep = here.path().join("report.json");
    let fx = fixture().display().to_string();
    let mnt = fs.mnt.display().to_string();
    let cmd = [fx.as_str(), "run", mnt.as_str()];
    for _ in 0..2 {
        fs.evict();
        assert!(run_cmd(here.path(), &rep, &cmd).status.success());
    }
    assert_eq!(
        report(&rep)["phase_after"],
        "prefetching",
        "{}",
        report(&rep)
    );
    let learned = plan(here.path());

    let file = here.path().join("fixture.wsplan");
    let out = run_ok(
        Command::new(warmstart())
            .args(["export", "fixture", "--state-dir"])
            .arg(here.path())
            .arg("-o")
            .arg(&file),
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("exported fixture"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // "Another machine": the same files copied anew, a fresh state dir.
    let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
    let data = fs.mnt.join("data");
    let f0 = walk(&data).into_iter().min().unwrap();
    let before = inode(&f0);
    copy_anew(&fs.mnt);
    assert_ne!(inode(&f0), before, "copied anew");
    let there = tempfile::tempdir().unwrap();
    let out = run_ok(
        Command::new(warmstart())
            .args(["import", "--state-dir"])
            .arg(there.path())
            .arg(&file),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("imported fixture"), "{err}");
    assert!(!err.contains("dropped /"), "nothing differs: {err}");
    let imported = plan(there.path());
    // The imported plan reads what the learned one reads (>= 90%, the
    // goal; metadata reads are machine-specific and left out).
    assert!(
        imported.data_bytes() as f64 >= 0.9 * learned.data_bytes() as f64,
        "{} of {}",
        imported.data_bytes(),
        learned.data_bytes()
    );

    // Its first launch: prefetched, nothing learned, nothing stale, and
    // audited: the program itself reads (almost) nothing from storage.
    fs.evict();
    let out = run(Command::new(warmstart())
        .args(["run", "--audit", "--strategy", "concurrent", "--state-dir"])
        .arg(there.path())
        .args(["--profile", "fixture", "--report"])
        .arg(&rep)
        .arg("--")
        .args(cmd));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = report(&rep);
    assert_eq!(r["phase_before"], "prefetching", "{r}");
    assert_eq!(r["phase_after"], "prefetching", "{r}");
    assert!(r["compiled"].is_null(), "{r}");
    assert!(
        r["replay"]["data"]["bytes"].as_u64().unwrap() >= learned.data_bytes() * 9 / 10,
        "the replay prefetched the imported plan: {r}"
    );
    assert_eq!(
        r["replay"]["skipped_files"]
            .as_array()
            .map_or(0, |s| s.len()),
        0,
        "{r}"
    );
    assert!(
        !there.path().join("profiles/fixture/trace-0").exists(),
        "no learning launch"
    );
    let touched: u64 = touches(&out.stdout).iter().map(|t| t.2).sum();
    let self_read = r["audit_pages_from_storage"].as_u64().unwrap();
    assert!(
        (self_read as f64) <= 0.1 * touched as f64,
        "the program read {self_read} of its {touched} pages itself (> 10%): {r}"
    );
    eprintln!(
        "imported plan, first launch: {self_read} of {touched} pages read by the program itself"
    );

    // One file differs on a third machine: dropped at import, by name.
    let mut bytes = std::fs::read(&f0).unwrap();
    bytes[0] ^= 0xff;
    std::fs::write(&f0, &bytes).unwrap();
    let third = tempfile::tempdir().unwrap();
    let out = run_ok(
        Command::new(warmstart())
            .args(["import", "--state-dir"])
            .arg(third.path())
            .arg(&file),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    let f0s = f0.display().to_string();
    assert!(
        err.contains(&format!("dropped {f0s}: content differs")),
        "{err}"
    );
    let partial = plan(third.path());
    assert!(partial.files.iter().all(|f| f.path != f0s));
    assert_eq!(partial.files.len() + 1, imported.files.len());
    // Importing over an existing profile needs --force.
    let out = run(Command::new(warmstart())
        .args(["import", "--state-dir"])
        .arg(third.path())
        .arg(&file));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--force"));

    // `changed` (the package trigger): the second machine's profile has a
    // file that changed since import, and goes back to learning, keeping
    // its plan to prefetch the rest meanwhile.
    let out = run_ok(
        Command::new(warmstart())
            .args(["changed", "--dry-run", "--state-dir"])
            .arg(there.path()),
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("fixture: 1 of its") && said.contains(&f0s),
        "{said}"
    );
    let out = run_ok(
        Command::new(warmstart())
            .args(["changed", "--state-dir"])
            .arg(there.path()),
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("fixture: relearning"));
    let prof: serde_json::Value = serde_json::from_slice(
        &std::fs::read(there.path().join("profiles/fixture/profile.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(prof["phase"], "learning", "{prof}");
    assert!(there.path().join("profiles/fixture/plan.previous").exists());
    // The third machine's plan never had f0 (dropped at import): nothing
    // of it changed, and it is left alone.
    let out = run_ok(
        Command::new(warmstart())
            .args(["changed", "--state-dir"])
            .arg(third.path()),
    );
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn root_a_plan_imported_while_the_daemon_runs_prefetches_its_first_launch() {
    if !require_root("root_a_plan_imported_while_the_daemon_runs_prefetches_its_first_launch") {
        return;
    }
    use std::time::Duration;
    let fs = LoopFs::new("ext4", 96);
    run_ok(Command::new(fixture()).arg("gen").arg(&fs.mnt));
    let d = tempfile::tempdir().unwrap();
    // A name of its own, so that only this test's daemon follows it.
    let exe = d.path().join("ws-import-fixture");
    std::fs::copy(fixture(), &exe).unwrap();
    let cmd = [exe.to_str().unwrap(), "run", fs.mnt.to_str().unwrap()];

    // Learned here by `run` under the name the daemon gives the command.
    let here = d.path().join("here");
    for _ in 0..2 {
        fs.evict();
        run_ok(
            Command::new(warmstart())
                .args(["run", "-q", "--strategy", "concurrent", "--state-dir"])
                .arg(&here)
                .arg("--")
                .args(cmd),
        );
    }
    let name = std::fs::read_dir(here.join("profiles"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("ws-import-fixture-"))
        .expect("a profile");
    let file = d.path().join("p.wsplan");
    run_ok(
        Command::new(warmstart())
            .args(["export", &name, "--state-dir"])
            .arg(&here)
            .arg("-o")
            .arg(&file),
    );

    // The daemon runs on a fresh state directory; the import tells it.
    let (state, socket) = (d.path().join("there"), d.path().join("sock"));
    let config = d.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "learn = \"allow-list\"\nallow = [\"{}\"]\nskip_services = false\nmin_launch_kib = 64\n",
            exe.display()
        ),
    )
    .unwrap();
    let log = std::fs::File::create(d.path().join("daemon.log")).unwrap();
    let _daemon = Background::spawn(
        Command::new(warmstart())
            .arg("daemon")
            .arg("--config")
            .arg(&config)
            .arg("--state-dir")
            .arg(&state)
            .arg("--socket")
            .arg(&socket)
            .stdout(std::process::Stdio::null())
            .stderr(log),
    );
    wait_for("the daemon's socket", Duration::from_secs(20), || {
        socket.exists()
    });
    run_ok(
        Command::new(warmstart())
            .args(["import", "--state-dir"])
            .arg(&state)
            .arg("--socket")
            .arg(&socket)
            .arg(&file),
    );

    // Its first launch, wrapped by nobody: prefetched by the daemon.
    fs.evict();
    run_ok(Command::new(&exe).arg("run").arg(&fs.mnt));
    let last = state.join("profiles").join(&name).join("last-launch.json");
    wait_for(
        "the daemon to take the launch",
        Duration::from_secs(30),
        || last.exists(),
    );
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&last).unwrap()).unwrap();
    let log = std::fs::read_to_string(d.path().join("daemon.log")).unwrap();
    assert_eq!(r["phase_before"], "prefetching", "{r}\n{log}");
    assert!(
        r["replay"]["data"]["bytes"].as_u64().unwrap_or(0) > 2 << 20,
        "{r}\n{log}"
    );

    // A file of the plan replaced (a package upgrade): `changed` has the
    // daemon send the profile back to learning, keeping the plan.
    let f0 = walk(&fs.mnt.join("data")).into_iter().min().unwrap();
    let bytes = std::fs::read(&f0).unwrap();
    std::fs::remove_file(&f0).unwrap();
    std::fs::write(&f0, &bytes).unwrap();
    let out = run_ok(
        Command::new(warmstart())
            .args(["changed", "--state-dir"])
            .arg(&state)
            .arg("--socket")
            .arg(&socket),
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains(&format!("{name}: relearning")), "{said}");
    let prof: serde_json::Value = serde_json::from_slice(
        &std::fs::read(state.join("profiles").join(&name).join("profile.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(prof["phase"], "learning", "{prof}");
    let status = run_ok(
        Command::new(warmstart())
            .args(["status", "--json", "--socket"])
            .arg(&socket),
    );
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let p = status["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name.as_str())
        .cloned()
        .unwrap();
    assert_eq!(p["phase"], "learning", "{status}");
}
