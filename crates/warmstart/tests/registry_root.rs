//! `push` and `pull` against a real registry (Debian's `docker-registry`,
//! the CNCF distribution registry), started by the test on a loopback
//! port with a temporary storage directory and stopped when it ends.

mod registry_util;
mod util;

use std::path::{Path, PathBuf};
use std::process::Command;

use registry_util::*;
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
    serde_json::from_slice(&std::fs::read(p).expect("launch report written")).unwrap()
}

fn ws(args: &[&str], state: &Path) -> std::process::Output {
    run(Command::new(warmstart())
        .args(args)
        .arg("--state-dir")
        .arg(state)
        // No credential files of the machine's user.
        .env("HOME", state)
        .env_remove("REGISTRY_AUTH_FILE")
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("DOCKER_CONFIG"))
}

#[test]
fn root_push_then_pull_into_a_fresh_state_dir_prefetches_the_first_launch() {
    if !require_root("root_push_then_pull_into_a_fresh_state_dir_prefetches_the_first_launch") {
        return;
    }
    if !Path::new(REGISTRY).exists() {
        panic!("{REGISTRY} is missing: apt-get install docker-registry (make deps does)");
    }
    let reg = Registry::start(None);
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
    assert_eq!(report(&rep)["phase_after"], "prefetching");

    let reference = format!("{}/warmstart/fixture:v1", reg.addr);
    let out = ws(&["push", "fixture", &reference], here.path());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("tagged sha256-"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pinned = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let prefix = format!("{}/warmstart/fixture@sha256:", reg.addr);
    assert!(pinned.starts_with(&prefix), "{pinned}");

    // The artifact as the distribution API shows it: our artifact type and
    // one layer of our media type (what `oras` lists).
    let manifest = http_get(
        &reg.addr,
        "/v2/warmstart/fixture/manifests/v1",
        "application/vnd.oci.image.manifest.v1+json",
    );
    let m: serde_json::Value = serde_json::from_str(&manifest).unwrap();
    assert_eq!(
        m["artifactType"], "application/vnd.warmstart.plan.v1",
        "{m}"
    );
    assert_eq!(
        m["layers"][0]["mediaType"], "application/vnd.warmstart.plan.v1+gzip",
        "{m}"
    );

    // Pulled by digest into a fresh state directory: the first launch is
    // prefetched, with no learning launch.
    let there = tempfile::tempdir().unwrap();
    let out = ws(&["pull", &pinned], there.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("imported fixture"), "{err}");
    fs.evict();
    let out = run_cmd(there.path(), &rep, &cmd);
    assert!(out.status.success());
    let r = report(&rep);
    assert_eq!(r["phase_before"], "prefetching", "{r}");
    assert!(
        r["replay"]["data"]["bytes"].as_u64().unwrap() > 2 << 20,
        "{r}"
    );
    assert!(!there.path().join("profiles/fixture/trace-0").exists());

    // Found by content: the repository and the command, on a machine
    // that has the same executable bytes.
    let by_program = tempfile::tempdir().unwrap();
    let repo = format!("{}/warmstart/fixture", reg.addr);
    let mut args = vec!["pull", repo.as_str(), "--"];
    args.extend(cmd);
    let out = run(Command::new(warmstart())
        .args(&args[..2])
        .arg("--state-dir")
        .arg(by_program.path())
        .args(&args[2..])
        .env("HOME", by_program.path()));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("imported fixture"), "{err}");
    // Another command line has another key: nothing there.
    let out = run(Command::new(warmstart())
        .args(["pull", repo.as_str(), "--state-dir"])
        .arg(by_program.path())
        .args(["--", fx.as_str(), "gen"])
        .env("HOME", by_program.path()));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("MANIFEST_UNKNOWN"));

    // A digest that is not the manifest's: refused, nothing imported.
    let wrong = format!(
        "{}/warmstart/fixture:v1@sha256:{}",
        reg.addr,
        "0".repeat(64)
    );
    let fresh = tempfile::tempdir().unwrap();
    let out = ws(&["pull", &wrong], fresh.path());
    assert!(!out.status.success());
    assert!(!fresh.path().join("profiles/fixture").exists());
    // A tag that does not exist: the registry's own words.
    let out = ws(
        &["pull", &format!("{}/warmstart/fixture:nope", reg.addr)],
        fresh.path(),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("404") && err.contains("MANIFEST_UNKNOWN"),
        "{err}"
    );
    // Pulled to a file: the same plan `import` takes.
    let file: PathBuf = fresh.path().join("p.wsplan");
    let out = ws(
        &["pull", &reference, "-o", file.to_str().unwrap()],
        fresh.path(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(file.exists());

    // A registry that wants credentials: refused without them, with a
    // hint; taken from $REGISTRY_AUTH_FILE (podman's auth.json format).
    let locked = Registry::start(Some(("ci", "s3cret")));
    let private = format!("{}/warmstart/fixture:v1", locked.addr);
    let out = ws(&["push", "fixture", &private], here.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("no credentials"), "{err}");
    let auth = here.path().join("auth.json");
    std::fs::write(
        &auth,
        format!(
            r#"{{"auths":{{"{}":{{"auth":"Y2k6czNjcmV0"}}}}}}"#,
            locked.addr
        ),
    )
    .unwrap();
    let with_auth = |args: &[&str], state: &Path| {
        run(Command::new(warmstart())
            .args(args)
            .arg("--state-dir")
            .arg(state)
            .env("HOME", state)
            .env("REGISTRY_AUTH_FILE", &auth))
    };
    let out = with_auth(&["push", "fixture", &private], here.path());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let other = tempfile::tempdir().unwrap();
    let out = with_auth(&["pull", &private], other.path());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(other.path().join("profiles/fixture/plan").exists());
    drop(locked);

    // The registry down: a clear error naming it, not a hang.
    let addr = reg.addr.clone();
    drop(reg);
    let out = ws(&["pull", "--timeout", "3", &reference], fresh.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains(&format!("registry {addr}")), "{err}");
}

/// A GET with an Accept header, over a plain socket (the test needs no
/// HTTP client of its own for one request).
fn http_get(addr: &str, path: &str, accept: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: {accept}\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    body.to_string()
}
