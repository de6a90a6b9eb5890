//! The policy's pure parts: keys, `env`, scripts, trivial launches and
//! what `/proc` says of warmstart's own processes.

use super::*;

/// `#!/usr/bin/env node` makes the kernel run `env node SCRIPT ARGS`:
/// a launch of `node SCRIPT ARGS`, keyed by the script and named as
/// node's own exec will be, from `env`'s exec on.
#[test]
fn env_running_a_command_is_a_launch_of_that_command() {
    let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        through_env(
            "/usr/bin/env",
            &v(&["/usr/bin/env", "node", "/usr/bin/npm", "ls"])
        ),
        Some(v(&["node", "/usr/bin/npm", "ls"]))
    );
    assert_eq!(
        through_env("/usr/bin/env", &v(&["env", "LANG=C", "A=1", "app", "-x"])),
        Some(v(&["app", "-x"]))
    );
    // Options change what runs (`-i`, `-S`, `-u`): not told apart here.
    assert_eq!(through_env("/usr/bin/env", &v(&["env", "-i", "app"])), None);
    assert_eq!(
        through_env("/usr/bin/env", &v(&["env", "-S", "node x"])),
        None
    );
    // `env` alone, or with assignments only, prints the environment.
    assert_eq!(through_env("/usr/bin/env", &v(&["env"])), None);
    assert_eq!(through_env("/usr/bin/env", &v(&["env", "A=1"])), None);
    assert_eq!(through_env("/usr/bin/node", &v(&["node", "x.js"])), None);
    // Never quieted as a trivial program: its launches differ by what
    // it runs.
    assert!(QuietExe::of("/usr/bin/env", 1, 2, Some("/usr/bin/env")).is_none());
    assert!(QuietExe::of("/usr/bin/true", 1, 2, None).is_some());
}

#[test]
fn a_launch_started_by_warmstart_is_left_to_it() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    let bin = p.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    // The daemon is the core; `run` is the front, beside it here as in
    // the build tree, or the core itself (a launch handed over).
    for b in ["warmstart", "warmstart-core", "sh"] {
        std::fs::write(bin.join(b), "").unwrap();
        std::fs::set_permissions(
            bin.join(b),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
    }
    for (pid, ppid, exe, cmd) in [
        ("self", 0, "warmstart-core", "warmstart\0daemon\0"),
        ("7", 1, "warmstart", "warmstart\0-q\0run\0--\0app\0"),
        ("8", 1, "sh", "sh\0run\0"),
        ("9", 1, "warmstart", "warmstart\0bench\0run\0"),
        ("10", 1, "warmstart-core", "warmstart\0run\0--\0app\0"),
    ] {
        std::fs::create_dir_all(p.join(pid)).unwrap();
        std::fs::write(p.join(pid).join("cmdline"), cmd).unwrap();
        std::fs::write(
            p.join(pid).join("status"),
            format!("Name:\tx\nPPid:\t{ppid}\n"),
        )
        .unwrap();
        std::os::unix::fs::symlink(bin.join(exe), p.join(pid).join("exe")).unwrap();
    }
    for (pid, ppid) in [
        (42, 7),
        (43, 8),
        (44, 99),
        (50, 42),
        (51, 43),
        (52, 9),
        (53, 10),
    ] {
        std::fs::create_dir_all(p.join(pid.to_string())).unwrap();
        std::fs::write(p.join(format!("{pid}/status")), format!("PPid:\t{ppid}\n")).unwrap();
    }
    assert!(started_by_warmstart(p, 42), "a child of `warmstart run`");
    assert!(!started_by_warmstart(p, 43), "a child of a shell");
    assert!(!started_by_warmstart(p, 44), "a parent that is gone");
    assert!(!started_by_warmstart(p, 45), "a process that is gone");
    assert!(
        started_by_warmstart(p, 50),
        "a grandchild of `warmstart run`"
    );
    assert!(!started_by_warmstart(p, 51), "a grandchild of a shell");
    assert!(
        !started_by_warmstart(p, 52),
        "a launch of `warmstart bench`"
    );
    assert!(
        started_by_warmstart(p, 53),
        "a launch handed over to the core"
    );
    // The `run`s running: the front's and the core's, not `bench run`'s
    // or a shell's.
    let mut w = Wrappers::scan(p, 0);
    let mut known: Vec<u32> = w.pids.iter().copied().collect();
    known.sort_unstable();
    assert_eq!(known, [7, 10]);
    assert!(w.any(p, 0));
    // Ended, or another program now: forgotten.
    std::fs::remove_dir_all(p.join("7")).unwrap();
    std::fs::write(p.join("10/cmdline"), "app\0").unwrap();
    assert!(!w.any(p, 0), "none is left");
    // Seen exec'ing `run`: known again, as long as it runs it.
    std::fs::write(p.join("10/cmdline"), "warmstart\0run\0--\0app\0").unwrap();
    let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    w.exec_of_own(10, Some(&argv(&["warmstart", "status"])));
    assert!(!w.any(p, 0), "another command");
    w.exec_of_own(10, Some(&argv(&["warmstart", "run", "--", "app"])));
    assert!(w.any(p, 0));
    // One whose exec the recorder lost is found by scanning again.
    std::fs::write(p.join("10/cmdline"), "app\0").unwrap();
    assert!(!w.any(p, 0));
    std::fs::write(p.join("10/cmdline"), "warmstart\0run\0--\0app\0").unwrap();
    assert!(!w.any(p, 0), "no event: not known");
    assert!(w.any(p, 1), "events lost: scanned");
}

#[test]
fn a_launch_is_its_real_uid() {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(d.path().join("42")).unwrap();
    std::fs::write(
        d.path().join("42/status"),
        "Name:\tsh\nUid:\t1000\t0\t0\t0\nGid:\t1000\t1000\t1000\t1000\n",
    )
    .unwrap();
    assert_eq!(launch_uid(d.path(), 42), Some(1000));
    assert_eq!(launch_uid(d.path(), 43), None);
    // SAFETY: getuid has no preconditions.
    let me = unsafe { libc::getuid() };
    assert_eq!(launch_uid(Path::new("/proc"), std::process::id()), Some(me));
}

fn v(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

#[test]
fn scripts_are_told_from_their_exec() {
    // `./tool -v x` with `#!/usr/bin/python3 -u`.
    assert_eq!(
        script_prefix(
            "./tool",
            &v(&["tool", "-v", "x"]),
            &v(&["/usr/bin/python3", "-u", "./tool", "-v", "x"])
        ),
        Some(v(&["/usr/bin/python3", "-u"]))
    );
    // Without arguments, and without an interpreter option.
    assert_eq!(
        script_prefix("/opt/t", &v(&["t"]), &v(&["/bin/sh", "/opt/t"])),
        Some(v(&["/bin/sh"]))
    );
    // An ELF program: the exec's command line is the execve's.
    assert_eq!(
        script_prefix("/usr/bin/ls", &v(&["ls", "-l"]), &v(&["ls", "-l"])),
        None
    );
    // Arguments that differ, a script name not where it belongs.
    assert_eq!(
        script_prefix("./t", &v(&["t", "a"]), &v(&["/bin/sh", "./t", "b"])),
        None
    );
    assert_eq!(script_prefix("./t", &v(&["t"]), &v(&["./t"])), None);
    assert_eq!(script_prefix("./t", &[], &[]), None);
}

#[test]
fn policy_table() {
    let mut c = DaemonConfig::default();
    let cases = [
        ("/usr/bin/gimp", true),
        ("/usr/sbin/sshd", false),
        ("/usr/lib/systemd/systemd-journald", false),
        ("/usr/local/bin/warmstart", false),
    ];
    for (p, want) in cases {
        assert_eq!(c.allows(p), want, "{p}");
    }
    c.learn = LearnMode::AllowList;
    c.allow = vec!["/opt/app/*".into()];
    assert!(c.allows("/opt/app/bin"));
    assert!(!c.allows("/usr/bin/gimp"));
}

#[test]
fn permits_table() {
    let mut c = DaemonConfig {
        learn: LearnMode::AllowList,
        allow: v(&["/opt/app/*"]),
        ..Default::default()
    };
    c.deny.push("/opt/bad/*".into());
    let listed = BTreeSet::from(["/usr/bin/gimp".to_string(), "/opt/bad/x".to_string()]);
    let none = BTreeSet::new();
    // (key, continued, learn list, followed)
    let cases = [
        ("/opt/app/a", false, &none, true),
        ("/usr/bin/gimp", false, &none, false),
        ("/usr/bin/gimp", false, &listed, true),
        ("/usr/bin/gimp", true, &none, true),
        // A deny entry wins over the learn list and over a launch
        // continuing into it.
        ("/opt/bad/x", false, &listed, false),
        ("/opt/bad/x", true, &none, false),
        ("/usr/sbin/sshd", true, &listed, false),
    ];
    for (key, continued, learn, want) in cases {
        assert_eq!(c.permits(key, continued, learn), want, "{key} {continued}");
    }
}

#[test]
fn trivial_launches_are_not_worth_learning() {
    let c = DaemonConfig::default();
    let stats = |ms: u64, kib: u64, meta_kib: u64| TraceStats {
        duration_ns: ms * 1_000_000,
        bytes: kib * 1024,
        metadata_bytes: meta_kib * 1024,
        ..Default::default()
    };
    // (what, duration ms, data KiB, metadata KiB, worth a profile), the
    // figures measured with `warmstart record` (see DEFAULT_MIN_LEARN_MS).
    let cases = [
        ("true, cold", 2, 1229, 0, false),
        ("ls /usr, warm", 15, 2150, 0, false),
        ("grep, cold", 3, 2765, 0, false),
        ("git --version", 3, 5530, 0, true),
        ("python3 -c pass", 533, 16998, 0, true),
        ("small but slow", 40, 100, 0, true),
        ("fast, metadata heavy", 5, 2048, 2048, true),
    ];
    for (what, ms, kib, meta, want) in cases {
        assert_eq!(c.worth_learning(&stats(ms, kib, meta)), want, "{what}");
    }
    let all = DaemonConfig {
        min_learn_ms: 0,
        ..Default::default()
    };
    assert!(all.worth_learning(&stats(0, 0, 0)), "0 learns everything");
}

#[test]
fn trivial_launches_hold_back_their_program_or_their_inline_code() {
    // (exe, argv, policy key, held back)
    let cases = [
        (
            "/usr/bin/grep",
            v(&["grep", "x", "f"]),
            "/usr/bin/grep",
            "/usr/bin/grep",
        ),
        (
            "/usr/bin/dash",
            v(&["sh", "-c", "true"]),
            "/usr/bin/dash",
            "name",
        ),
        (
            "/usr/bin/python3.11",
            v(&["python3", "-c", "1"]),
            "/usr/bin/python3.11",
            "name",
        ),
        (
            "/usr/bin/python3.11",
            v(&["python3", "/opt/t.py"]),
            "/opt/t.py",
            "/opt/t.py",
        ),
    ];
    for (exe, argv, key, want) in cases {
        assert_eq!(trivial_key(exe, &argv, key, "name"), want, "{argv:?}");
    }
}

#[test]
fn trivial_programs_are_held_for_a_while_and_bounded() {
    let mut t = Trivial::default();
    let now = Instant::now();
    t.mark("/usr/bin/true", None, now);
    assert!(t.holds("/usr/bin/true", now));
    assert!(!t.holds("/usr/bin/ls", now));
    assert!(!t.holds("/usr/bin/true", now + Trivial::HOLD));
    for i in 0..Trivial::MAX + 10 {
        t.mark(&format!("/bin/p{i}"), None, now);
    }
    assert!(t.len() <= Trivial::MAX);
}

#[test]
fn only_programs_named_by_their_binary_are_quieted_in_the_kernel() {
    let q = QuietExe::of("/usr/bin/true", 7, 42, Some("/bin/true")).unwrap();
    assert_eq!(
        (q.dev, q.ino, q.name.as_deref()),
        (7, 42, Some("/bin/true"))
    );
    // A relative execve path names another file in another directory.
    assert_eq!(
        QuietExe::of("/usr/bin/true", 7, 42, Some("./true"))
            .unwrap()
            .name,
        None
    );
    // An interpreter's launches differ by what it runs.
    assert_eq!(QuietExe::of("/usr/bin/python3.13", 7, 43, None), None);
    assert_eq!(QuietExe::of("/usr/bin/dash", 7, 44, Some("/bin/sh")), None);
}

#[test]
fn letting_one_program_go_requiets_the_others() {
    let mut t = Trivial::default();
    let now = Instant::now();
    let q = |ino| QuietExe::of("/usr/bin/x", 1, ino, None);
    t.mark("/usr/bin/true", q(1), now);
    t.mark("/usr/bin/ls", q(2), now);
    t.mark("/usr/bin/python3 -c pass", None, now);
    let (new, released) = t.take_quiet();
    assert_eq!(new.len(), 2);
    assert!(!released);
    assert_eq!(t.take_quiet(), (vec![], false), "told once");
    // Unknown keys change nothing.
    t.remove("/usr/bin/cat");
    assert_eq!(t.take_quiet(), (vec![], false));
    t.remove("/usr/bin/true");
    let (again, released) = t.take_quiet();
    assert!(released, "the kernel side forgets them all");
    assert_eq!(again, vec![(q(2).unwrap(), now + Trivial::HOLD)]);
    assert!(!t.holds("/usr/bin/true", now));
}

#[test]
fn interpreters_are_keyed_by_script() {
    let d = tempfile::tempdir().unwrap();
    let script = d.path().join("app.py");
    std::fs::write(&script, "").unwrap();
    let argv = vec!["python3".into(), "-u".into(), script.display().to_string()];
    let canon = std::fs::canonicalize(&script)
        .unwrap()
        .display()
        .to_string();
    assert_eq!(
        policy_path("/usr/bin/python3.11", &argv, Path::new("/")),
        canon
    );
    assert_eq!(
        policy_path(
            "/usr/bin/gimp",
            &["gimp".into(), "x.png".into()],
            Path::new("/")
        ),
        "/usr/bin/gimp"
    );
    let inline = ["python3".into(), "-c".into(), "app.py".into()];
    assert_eq!(
        policy_path("/usr/bin/python3.11", &inline, d.path()),
        "/usr/bin/python3.11",
        "-c takes code, not a script"
    );
    assert_eq!(
        missing_script("/usr/bin/python3", &v(&["python3", "nope.py"]), d.path()),
        Some("nope.py".into())
    );
}
