//! The Debian package and the systemd unit: contents, lintian, the unit's
//! verification and sandboxing score, and install -> trigger -> upgrade ->
//! purge with dpkg on this machine, leaving nothing behind.

mod util;

use std::path::{Path, PathBuf};
use std::process::Command;

use util::*;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// dist/warmstart.service with ExecStart pointing at the binary under
/// test (systemd-analyze verify checks that the command exists).
fn unit_for_test(dir: &Path) -> PathBuf {
    let unit = std::fs::read_to_string(repo().join("dist/warmstart.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/bin/warmstart daemon"));
    let p = dir.join("warmstart.service");
    std::fs::write(
        &p,
        unit.replace("/usr/bin/warmstart", &warmstart().display().to_string()),
    )
    .unwrap();
    p
}

#[test]
fn unit_verifies_and_its_exposure_is_ok() {
    if !Path::new("/usr/bin/systemd-analyze").exists() {
        panic!("systemd-analyze is missing: apt-get install systemd (make deps does)");
    }
    let d = tempfile::tempdir().unwrap();
    let unit = unit_for_test(d.path());
    let out = run(Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&unit));
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        !text(&out).contains("warmstart.service:"),
        "warnings: {}",
        text(&out)
    );
    // Below 5.0 ("OK" and better); --threshold makes it fail above 4.9.
    let out = run(Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--threshold=49", "--no-pager"])
        .arg(&unit));
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let score: f64 = t
        .lines()
        .find_map(|l| l.split("exposure level for warmstart.service: ").nth(1))
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no score in {t}"));
    assert!(score < 5.0, "exposure {score}: {t}");
    // What the daemon needs stays granted, what it does not stays out.
    let text = std::fs::read_to_string(&unit).unwrap();
    let caps = text
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .unwrap();
    for c in [
        "CAP_BPF",
        "CAP_PERFMON",
        "CAP_SYS_NICE",
        "CAP_DAC_READ_SEARCH",
    ] {
        assert!(caps.contains(c), "{c} missing from {caps}");
    }
    assert!(!caps.contains("CAP_SYS_ADMIN"));
    assert!(!text.contains("RestrictRealtime=yes"), "SCHED_FIFO is used");
}

/// Builds a package from `bin` (a directory with `warmstart`).
fn build(bin: &Path, version: &str, out: &Path) -> PathBuf {
    let o = run_ok(
        Command::new(repo().join("dist/debian/build.sh"))
            .arg(bin)
            .arg(version)
            .arg(out),
    );
    PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())
}

/// A package of one file, `/usr/lib/ws-deb-test/data`, with `content`:
/// what an upgrade of a program's package does to a plan's files.
fn dummy(dir: &Path, version: &str, content: &[u8]) -> PathBuf {
    let root = dir.join(format!("dummy-{version}"));
    std::fs::create_dir_all(root.join("DEBIAN")).unwrap();
    std::fs::create_dir_all(root.join("usr/lib/ws-deb-test")).unwrap();
    std::fs::write(root.join("usr/lib/ws-deb-test/data"), content).unwrap();
    std::fs::write(
        root.join("DEBIAN/control"),
        format!(
            "Package: ws-deb-test\nVersion: {version}\nArchitecture: all\n\
             Maintainer: t <t@example.org>\nDescription: warmstart test package\n"
        ),
    )
    .unwrap();
    let deb = dir.join(format!("ws-deb-test_{version}_all.deb"));
    run_ok(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "--build"])
            .arg(&root)
            .arg(&deb),
    );
    deb
}

/// dpkg, retried while another dpkg or apt holds its lock.
fn dpkg(args: &[&str]) -> std::process::Output {
    for _ in 0..60 {
        let o = run(Command::new("dpkg").args(args));
        if o.status.success() || !text(&o).contains("lock") {
            return o;
        }
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
    panic!("dpkg {args:?}: its lock stayed held");
}

/// Purges what the test installed, also when it fails half-way.
struct Purge;

impl Drop for Purge {
    fn drop(&mut self) {
        let _ = dpkg(&["--purge", "warmstart", "ws-deb-test"]);
    }
}

#[test]
fn root_deb_installs_triggers_upgrades_and_purges_cleanly() {
    if !require_root("root_deb_installs_triggers_upgrades_and_purges_cleanly") {
        return;
    }
    // Never on a machine where warmstart is installed or in use.
    let installed = run(Command::new("dpkg-query").args(["-W", "warmstart"]));
    for p in [
        "/var/lib/warmstart",
        "/etc/warmstart",
        "/usr/lib/ws-deb-test",
    ] {
        if Path::new(p).exists() || installed.status.success() {
            eprintln!("SKIPPED: {p} exists or warmstart is installed; not touching them");
            return;
        }
    }
    let d = tempfile::tempdir().unwrap();
    // The binaries under test, stripped as a release build is.
    let bin = d.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::copy(warmstart(), bin.join("warmstart")).unwrap();
    std::fs::copy(warmstart_core(), bin.join("warmstart-core")).unwrap();
    run_ok(Command::new("strip").arg(bin.join("warmstart")));
    run_ok(Command::new("strip").arg(bin.join("warmstart-core")));
    let v1 = build(&bin, "0.1.0~test1", &d.path().join("out"));
    let v2 = build(&bin, "0.1.0~test2", &d.path().join("out"));
    assert!(v1.ends_with("warmstart_0.1.0~test1_amd64.deb"), "{v1:?}");

    // Contents.
    let list = text(&run_ok(Command::new("dpkg-deb").arg("-c").arg(&v1)));
    for f in [
        "./usr/bin/warmstart",
        "./usr/lib/warmstart/warmstart-core",
        "./etc/warmstart/config.toml",
        "./lib/systemd/system/warmstart.service",
        "./usr/share/man/man1/warmstart.1.gz",
        "./usr/share/man/man1/warmstart-run.1.gz",
        "./usr/share/man/man1/warmstart-import.1.gz",
        "./usr/share/bash-completion/completions/warmstart",
        "./usr/share/zsh/vendor-completions/_warmstart",
        "./usr/share/fish/vendor_completions.d/warmstart.fish",
        "./usr/share/doc/warmstart/copyright",
        "./usr/share/doc/warmstart/changelog.gz",
        "./usr/share/doc/warmstart/guide/daemon.md",
    ] {
        assert!(list.contains(&format!(" {f}\n")), "{f} missing:\n{list}");
    }
    let ctrl = d.path().join("ctrl");
    run_ok(Command::new("dpkg-deb").arg("-e").arg(&v1).arg(&ctrl));
    assert_eq!(
        std::fs::read_to_string(ctrl.join("conffiles")).unwrap(),
        "/etc/warmstart/config.toml\n"
    );
    let triggers = std::fs::read_to_string(ctrl.join("triggers")).unwrap();
    assert!(
        triggers.contains("interest-noawait /usr/lib\n"),
        "{triggers}"
    );

    // lintian: clean but for what only a debug build has (the release
    // build `make deb` packages is static, so the overrides of
    // dist/debian/lintian-overrides apply to it instead).
    if Path::new("/usr/bin/lintian").exists() {
        let out = run(Command::new("lintian")
            .args([
                "--tag-display-limit",
                "0",
                "--suppress-tags",
                "missing-dependency-on-libc,unused-override,mismatched-override",
            ])
            .arg(&v1));
        let bad: Vec<&str> = std::str::from_utf8(&out.stdout)
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("E:") || l.starts_with("W:"))
            .filter(|l| !l.contains("embedded-library zlib"))
            .collect();
        assert!(bad.is_empty(), "lintian: {bad:#?}");
    } else {
        panic!("lintian is missing: apt-get install lintian (make deps does)");
    }

    let _purge = Purge;
    let out = dpkg(&["-i", v1.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    // Answered by the core, which the front finds in /usr/lib/warmstart.
    let out = run_ok(Command::new("/usr/bin/warmstart").arg("--version"));
    assert!(text(&out).starts_with("warmstart "));
    // Enabled, though not started (systemd is not running here).
    let wants = Path::new("/etc/systemd/system/multi-user.target.wants/warmstart.service");
    assert!(wants.exists(), "enabled on installation");
    let out = run(Command::new("systemd-analyze").args([
        "verify",
        "--man=no",
        "/lib/systemd/system/warmstart.service",
    ]));
    assert!(out.status.success(), "{}", text(&out));

    // A prefetching profile whose plan reads a file of another package.
    let prog = dummy(d.path(), "1", &[1u8; 8192]);
    let out = dpkg(&["-i", prog.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let data = "/usr/lib/ws-deb-test/data";
    let store = warmstart_launch::Store::open(Path::new("/var/lib/warmstart")).unwrap();
    let m = std::fs::metadata(data).unwrap();
    use std::os::unix::fs::MetadataExt;
    let plan = warmstart_plan::Plan {
        meta: warmstart_plan::plan::PlanMeta {
            command: vec!["/usr/bin/ws-deb-test".into()],
            created_unix_ms: 0,
            traces: 2,
            min_traces: 2,
            passes: vec![],
            sorted: false,
        },
        files: vec![warmstart_plan::plan::PlanFile {
            path: data.into(),
            id: warmstart_plan::trace::FileId {
                dev: m.dev(),
                ino: m.ino(),
                size: m.size(),
                mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
                ctime_ns: m.ctime() * 1_000_000_000 + m.ctime_nsec(),
            },
        }],
        lookups: vec![],
        entries: vec![warmstart_plan::Entry::Data {
            file: 0,
            offset: 0,
            len: 8192,
        }],
    };
    std::fs::create_dir_all(store.dir("ws-deb-test")).unwrap();
    std::fs::write(store.plan_path("ws-deb-test"), plan.to_bytes()).unwrap();
    let mut prof = warmstart_launch::Profile::new("ws-deb-test", &plan.meta.command);
    prof.phase = warmstart_launch::Phase::Prefetching;
    store.save(&mut prof).unwrap();

    // Upgrading that package fires warmstart's file trigger: the profile
    // goes back to learning before its next launch.
    let prog2 = dummy(d.path(), "2", &[2u8; 8192]);
    let out = dpkg(&["-i", prog2.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("Processing triggers for warmstart"),
        "{}",
        text(&out)
    );
    let p = store.load("ws-deb-test").unwrap().unwrap();
    assert_eq!(p.phase, warmstart_launch::Phase::Learning, "{p:?}");
    assert!(p.note.unwrap().contains(data));

    // Upgrade: the administrator's configuration and the state are kept.
    let conf = "/etc/warmstart/config.toml";
    let mut c = std::fs::read_to_string(conf).unwrap();
    c.push_str("# local change\n");
    std::fs::write(conf, &c).unwrap();
    let out = dpkg(&["-i", v2.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let v = run_ok(Command::new("dpkg-query").args(["-W", "-f=${Version}", "warmstart"]));
    assert_eq!(text(&v), "0.1.0~test2");
    assert_eq!(std::fs::read_to_string(conf).unwrap(), c);
    assert!(store.dir("ws-deb-test").exists());

    // Purge: nothing left.
    let out = dpkg(&["--purge", "warmstart", "ws-deb-test"]);
    assert!(out.status.success(), "{}", text(&out));
    let l = run(Command::new("dpkg").args(["-L", "warmstart"]));
    assert!(!l.status.success() || l.stdout.is_empty(), "{}", text(&l));
    for p in [
        "/var/lib/warmstart",
        "/etc/warmstart",
        "/usr/bin/warmstart",
        "/usr/lib/warmstart",
        "/lib/systemd/system/warmstart.service",
        "/etc/systemd/system/multi-user.target.wants/warmstart.service",
        "/var/lib/systemd/deb-systemd-helper-enabled/warmstart.service.dsh-also",
        "/var/lib/systemd/deb-systemd-helper-masked/warmstart.service",
        "/usr/share/doc/warmstart",
    ] {
        assert!(!Path::new(p).exists(), "{p} left behind");
    }
}
/// The daemon with only the unit's capabilities (its bounding set, with
/// no_new_privs, as setpriv applies them): it still learns a launch and
/// prefetches the next one. The rest of the sandbox needs systemd as PID 1.
#[test]
fn root_daemon_learns_and_prefetches_with_only_the_units_capabilities() {
    if !require_root("root_daemon_learns_and_prefetches_with_only_the_units_capabilities") {
        return;
    }
    use std::time::{Duration, Instant};
    let unit = std::fs::read_to_string(repo().join("dist/warmstart.service")).unwrap();
    let caps: Vec<String> = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .unwrap()
        .split_whitespace()
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
        .collect();
    let bounding = format!("-all,{}", caps.join(","));

    let fs = LoopFs::new("ext4", 96);
    run_ok(Command::new(fixture()).arg("gen").arg(&fs.mnt));
    let d = tempfile::tempdir().unwrap();
    let exe = d.path().join("ws-unit-fixture");
    std::fs::copy(fixture(), &exe).unwrap();
    let (state, socket) = (d.path().join("state"), d.path().join("sock"));
    let config = d.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "learn = \"allow-list\"\nallow = [\"{}\"]\nskip_services = false\nmin_launch_kib = 64\n",
            exe.display()
        ),
    )
    .unwrap();
    let log_path = d.path().join("daemon.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let _daemon = Background::spawn(
        Command::new("setpriv")
            .args([
                "--bounding-set",
                &bounding,
                "--inh-caps=-all",
                "--no-new-privs",
                "--",
            ])
            .arg(warmstart())
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
    let wait = |what: &str, ok: &dyn Fn() -> bool| {
        let t = Instant::now();
        while !ok() {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "waiting for {what}:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait("the daemon's socket", &|| socket.exists());
    let profile = || {
        std::fs::read_dir(state.join("profiles"))
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("ws-unit-fixture-")
            })
    };
    let field = |f: &str| -> serde_json::Value {
        profile()
            .and_then(|p| std::fs::read(p.join("profile.json")).ok())
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .map_or(serde_json::Value::Null, |v| v[f].clone())
    };
    for i in 1..=3u64 {
        fs.evict();
        run_ok(Command::new(&exe).arg("run").arg(&fs.mnt));
        wait("the daemon to take the launch", &|| field("launches") == i);
        if field("phase") == "prefetching" {
            break;
        }
    }
    assert_eq!(
        field("phase"),
        "prefetching",
        "learned with the unit's capabilities"
    );
    let last = profile().unwrap().join("last-launch.json");
    let _ = std::fs::remove_file(&last);
    fs.evict();
    run_ok(Command::new(&exe).arg("run").arg(&fs.mnt));
    wait("the prefetched launch", &|| last.exists());
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&last).unwrap()).unwrap();
    assert_eq!(r["phase_before"], "prefetching", "{r}");
    assert!(
        r["replay"]["data"]["bytes"].as_u64().unwrap_or(0) > 2 << 20,
        "prefetched with the unit's capabilities: {r}"
    );
}
