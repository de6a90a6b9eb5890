//! The recorder against the real kernel. Needs root (CI runs as root);
//! skipped, saying why, otherwise.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::{Duration, Instant};

use warmstart_bpf::{Event, Options, Recorder};

/// An exec event names the program the kernel runs and carries the new
/// program's command line as the kernel laid it out. For a script that is
/// the interpreter, the script as given to execve and its arguments: what
/// the daemon's policy keys a launcher script by, even when the script has
/// exec'd its program before anyone read /proc.
#[test]
fn root_exec_events_carry_the_command_line() {
    if !warmstart_testing::require_root("root_exec_events_carry_the_command_line") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("ws-bpf-exec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("launch.sh");
    std::fs::write(&script, "#!/bin/sh\nexec /bin/true \"$@\"\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();

    let rec = Recorder::start(Options {
        watch_exec: true,
        ..Options::default()
    })
    .unwrap();
    let status = Command::new(&script)
        .args(["one", "two words"])
        .status()
        .unwrap();
    assert!(status.success());
    let script = script.display().to_string();
    let mut execs: Vec<(u32, String, Option<Vec<String>>)> = Vec::new();
    let mut starts = Vec::new();
    let mut buf = Vec::new();
    let t = Instant::now();
    while execs.len() < 2 && t.elapsed() < Duration::from_secs(10) {
        rec.poll(Duration::from_millis(50), &mut buf).unwrap();
        for ev in buf.drain(..) {
            if let Event::ExecStart {
                tgid,
                filename,
                argv,
                ..
            } = &ev
            {
                if *filename == script || execs.first().is_some_and(|e| e.0 == *tgid) {
                    starts.push((filename.clone(), argv.clone()));
                }
            }
            if let Event::Exec {
                tgid,
                file,
                argv,
                uid,
                ..
            } = ev
            {
                // The script's exec, then the same process's next one.
                let ours = match execs.first() {
                    None => argv.as_ref().is_some_and(|a| a.contains(&script)),
                    Some((first, _, _)) => *first == tgid,
                };
                if ours {
                    // The test runs as root: so does what it execs.
                    assert_eq!(uid, 0, "the exec event carries the real uid");
                    execs.push((tgid, file.path.absolute().unwrap_or_default(), argv));
                }
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(execs.len(), 2, "{execs:?}");
    let words = |v: &[&str]| Some(v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    // The script: run by /bin/sh (dash on Debian), named as given.
    assert!(execs[0].1.ends_with("sh"), "{execs:?}");
    assert_eq!(execs[0].2, words(&["/bin/sh", &script, "one", "two words"]));
    // The program it execs, with the script's arguments.
    assert!(execs[1].1.ends_with("/true"), "{execs:?}");
    assert_eq!(execs[1].2, words(&["/bin/true", "one", "two words"]));
    // Each execve as called, before the kernel loaded anything: the path
    // and arguments as given.
    assert!(
        starts.contains(&(script.clone(), words(&[&script, "one", "two words"]))),
        "{starts:?}"
    );
    assert!(
        starts.contains(&(
            "/bin/true".to_string(),
            words(&["/bin/true", "one", "two words"])
        )),
        "{starts:?}"
    );
}

/// A program chrooted into a directory opens a file: the open event names
/// it as the program sees it (`/data/probe.txt`), as d_path would, not by
/// where its root lies in the mount namespace. A recorder running beside
/// it in the same root (the bench's storage testbed chroots both) can only
/// confirm names of that form.
#[test]
fn root_open_in_a_chroot_is_named_from_the_chroot() {
    if !warmstart_testing::require_root("root_open_in_a_chroot_is_named_from_the_chroot") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("ws-bpf-chroot-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("data")).unwrap();
    std::fs::write(dir.join("data/probe.txt"), b"x").unwrap();
    let root = std::ffi::CString::new(dir.to_str().unwrap()).unwrap();

    let rec = Recorder::start(Options::default()).unwrap();
    let mut fds = [0; 2];
    // SAFETY: a two-int array for pipe(2).
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the child makes only async-signal-safe calls (read, chroot,
    // chdir, open, _exit) on buffers made before the fork.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        // SAFETY: see above; the child never returns into the test.
        unsafe {
            let mut b = 0u8;
            libc::read(fds[0], (&mut b as *mut u8).cast(), 1);
            let ok = libc::chroot(root.as_ptr()) == 0
                && libc::chdir(c"/".as_ptr()) == 0
                && libc::open(c"/data/probe.txt".as_ptr(), libc::O_RDONLY) >= 0;
            libc::_exit(if ok { 0 } else { 1 });
        }
    }
    rec.track(pid as u32).unwrap();
    // SAFETY: writes one byte from a local to the pipe made above, then
    // reaps the child into a local.
    let status = unsafe {
        libc::write(fds[1], [1u8].as_ptr().cast(), 1);
        let mut st = 0;
        libc::waitpid(pid, &mut st, 0);
        libc::close(fds[0]);
        libc::close(fds[1]);
        st
    };
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child chrooted and opened the file"
    );

    let mut opened = Vec::new();
    let mut buf = Vec::new();
    let t = Instant::now();
    while opened.is_empty() && t.elapsed() < Duration::from_secs(10) {
        rec.poll(Duration::from_millis(50), &mut buf).unwrap();
        for ev in buf.drain(..) {
            if let Event::Open { tgid, file, .. } = ev {
                if tgid == pid as u32 {
                    opened.push(file.path);
                }
            }
        }
    }
    assert_eq!(
        opened.first().and_then(|p| p.absolute()).as_deref(),
        Some("/data/probe.txt"),
        "{opened:?}"
    );
}

/// The hooks on every system call and page of the machine return at once
/// while no process is recorded (`Recorder::maybe_recorded` is zero), and
/// a process still recorded keeps being recorded when another is let go:
/// the count falls to what `tracked` holds, never under it.
#[test]
fn root_hooks_idle_while_nothing_is_recorded() {
    if !warmstart_testing::require_root("root_hooks_idle_while_nothing_is_recorded") {
        return;
    }
    use std::io::Write;
    use std::process::Stdio;
    let dir = std::env::temp_dir().join(format!("ws-bpf-idle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let probe = dir.join("probe.txt");
    std::fs::write(&probe, b"x").unwrap();
    let probe = probe.display().to_string();

    let rec = Recorder::start(Options::default()).unwrap();
    assert_eq!(rec.maybe_recorded(), 0, "nothing tracked yet");
    let held = |script: &str| {
        Command::new("/bin/sh")
            .args(["-c", script])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut kept = held(&format!("read x; cat {probe} >/dev/null"));
    let mut let_go = held("read x");
    rec.track(kept.id()).unwrap();
    rec.track(let_go.id()).unwrap();
    assert!(rec.maybe_recorded() >= 2, "{}", rec.maybe_recorded());

    rec.untrack(let_go.id());
    let mut buf = Vec::new();
    rec.poll(Duration::from_millis(1), &mut buf).unwrap();
    assert_eq!(rec.maybe_recorded(), 1, "counted again after the untrack");
    writeln!(let_go.stdin.take().unwrap()).unwrap();
    assert!(let_go.wait().unwrap().success());

    // The one still recorded: its child's open of the probe is seen.
    writeln!(kept.stdin.take().unwrap()).unwrap();
    assert!(kept.wait().unwrap().success());
    let mut opened = false;
    let t = Instant::now();
    while !(opened && rec.maybe_recorded() == 0) && t.elapsed() < Duration::from_secs(10) {
        rec.poll(Duration::from_millis(50), &mut buf).unwrap();
        opened |= buf.drain(..).any(|ev| {
            matches!(ev, Event::Open { file, .. } if file.path.absolute().as_deref() == Some(probe.as_str()))
        });
    }
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(opened, "the recorded process's child opened {probe}");
    assert_eq!(rec.maybe_recorded(), 0, "none left once the tree exited");
}
