//! Attacks on a running `warmstart daemon` (root, real binary, real
//! daemon): its control socket from an unprivileged uid and from clients
//! that send too much, nothing, or a byte at a time; and two `warmstart
//! run`s and the daemon writing one profile at once.

mod util;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use util::*;

/// One daemon at a time: each traces every exec on the machine.
static SERIAL: Mutex<()> = Mutex::new(());

/// The uid and gid the unprivileged peer runs as (`nobody`).
const NOBODY: u32 = 65534;

/// A daemon for one test, with its own policy, state directory and socket.
struct Daemon {
    _proc: Background,
    state: PathBuf,
    socket: PathBuf,
}

impl Daemon {
    /// Learns launches of programs matching `allow` (a TOML array of
    /// globs). The socket's directory is made by the caller.
    fn start(dir: &Path, socket: PathBuf, allow: &str) -> Daemon {
        let config = dir.join("config.toml");
        std::fs::write(
            &config,
            format!(
                "learn = \"allow-list\"\nallow = {allow}\ndeny = []\nskip_services = false\nmin_launch_kib = 64\nidle_s = 5.0\ntimeout_s = 60.0\n[preload]\nenabled = false\n"
            ),
        )
        .unwrap();
        let state = dir.join("state");
        let log = std::fs::File::create(dir.join("daemon.log")).unwrap();
        let proc = spawn_daemon(&config, &state, &socket, log);
        Daemon {
            _proc: proc,
            state,
            socket,
        }
    }

    /// `warmstart status --json` as root, which must finish within
    /// `limit`: the whole document.
    fn status_within(&self, limit: Duration) -> serde_json::Value {
        let out = finish_within(
            Command::new(warmstart())
                .arg("status")
                .arg("--json")
                .arg("--socket")
                .arg(&self.socket),
            limit,
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("status --json is JSON")
    }

    /// The daemon's part of the status, which must be there.
    fn daemon_status(&self) -> serde_json::Value {
        let doc = self.status_within(Duration::from_secs(10));
        assert!(doc["daemon"].is_object(), "the daemon answers: {doc}");
        doc["daemon"].clone()
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs `cmd` with its output collected, killed (and the test failed) if
/// it has not finished within `limit`.
fn finish_within(cmd: &mut Command, limit: Duration) -> std::process::Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
    // Drained while it runs, so that a full pipe cannot stall it.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let o = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let e = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    std::process::Output {
        status,
        stdout: o.join().unwrap(),
        stderr: e.join().unwrap(),
    }
}

/// What a raw client got from the control socket.
#[derive(Debug)]
enum Raw {
    /// `connect` failed with this errno.
    Refused(i32),
    /// The daemon's answer, as sent.
    Reply(Vec<u8>),
}

/// Sends `req` on `socket` from a child process running as `nobody` with
/// no supplementary groups: a small Rust client, not the CLI.
fn raw_as_nobody(socket: &Path, req: &[u8]) -> Raw {
    let mut fds = [0i32; 2];
    // SAFETY: pipe writes two descriptors into the array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the child only makes system calls on memory set up before
    // the fork (no allocation: other test threads may hold malloc's lock)
    // and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        // SAFETY: see above; every call here is a plain system call.
        unsafe {
            libc::close(fds[0]);
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(NOBODY) != 0
                || libc::setuid(NOBODY) != 0
            {
                libc::_exit(3);
            }
        }
        let out = fds[1];
        let put = |b: &[u8]| {
            // SAFETY: writing our own stack bytes to our pipe.
            unsafe { libc::write(out, b.as_ptr().cast(), b.len()) };
        };
        match UnixStream::connect(socket) {
            Err(e) => {
                put(b"E");
                put(&e.raw_os_error().unwrap_or(0).to_ne_bytes());
            }
            Ok(mut s) => {
                let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
                let _ = s.write_all(req);
                let _ = s.shutdown(std::net::Shutdown::Write);
                put(b"R");
                let mut buf = [0u8; 4096];
                while let Ok(n @ 1..) = s.read(&mut buf) {
                    put(&buf[..n]);
                }
            }
        }
        // SAFETY: leaving the forked child without running the parent's
        // destructors or atexit handlers.
        unsafe { libc::_exit(0) };
    }
    // SAFETY: closing the child's end in the parent.
    unsafe { libc::close(fds[1]) };
    // SAFETY: fds[0] is ours and is owned by the File from here on.
    let mut r = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fds[0]) };
    let mut got = Vec::new();
    r.read_to_end(&mut got).unwrap();
    let mut st = 0;
    // SAFETY: reaping our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
    assert!(
        libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
        "the client as nobody: wait status {st}"
    );
    match got.split_first() {
        Some((b'E', e)) => Raw::Refused(i32::from_ne_bytes(e.try_into().expect("errno"))),
        Some((b'R', reply)) => Raw::Reply(reply.to_vec()),
        _ => panic!("the client as nobody said nothing"),
    }
}

/// `warmstart status --json --socket S` as `nobody`.
fn status_as_nobody(socket: &Path) -> std::process::Output {
    finish_within(
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(warmstart())
            .args(["status", "--json", "--socket"])
            .arg(socket)
            // Its own (missing) state directory: only the daemon is asked.
            .arg("--state-dir")
            .arg("/nonexistent/warmstart-attack"),
        Duration::from_secs(30),
    )
}

const STATUS_REQ: &[u8] = br#"{"request":"status"}"#;

#[test]
fn root_control_socket_refuses_other_users_and_outlasts_bad_clients() {
    if !require_root("root_control_socket_refuses_other_users_and_outlasts_bad_clients") {
        return;
    }
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let work = tempfile::tempdir().unwrap();
    // The test's directory can be searched by nobody: only the daemon's
    // own checks stand between nobody and the socket (the socket opened
    // to everyone below proves that it is reached).
    std::fs::set_permissions(work.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let run_dir = work.path().join("run");
    std::fs::create_dir(&run_dir).unwrap();
    std::fs::set_permissions(&run_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = run_dir.join("sock");
    let d = Daemon::start(work.path(), socket.clone(), "[\"/nonexistent/*\"]");

    // An existing directory is left as it is, and the socket is root's, 0600.
    {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::symlink_metadata(&socket).unwrap();
        assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o600), "{m:?}");
        let m = std::fs::metadata(&run_dir).unwrap();
        assert_eq!(m.mode() & 0o777, 0o755);
    }
    // Root is answered, by the CLI and by a raw client.
    let st = d.daemon_status();
    assert!(st["pid"].as_u64().is_some_and(|p| p > 0), "{st}");
    let mut c = UnixStream::connect(&socket).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(STATUS_REQ).unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    let mut reply = Vec::new();
    c.read_to_end(&mut reply).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&reply).unwrap();
    assert_eq!(v["reply"], "status", "{v}");

    // Nobody cannot connect at all: the socket's mode refuses it.
    match raw_as_nobody(&socket, STATUS_REQ) {
        Raw::Refused(e) => assert_eq!(e, libc::EACCES, "connect as nobody"),
        Raw::Reply(r) => panic!("nobody was answered: {}", text(&r)),
    }
    let out = status_as_nobody(&socket);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(
        stderr.contains("permission denied") && stderr.contains("root-only"),
        "{stderr}"
    );
    assert!(
        !stdout.contains(r#""pid""#),
        "nobody saw the daemon: {stdout}"
    );

    // With the socket opened to everyone (a careless chmod), the daemon's
    // own check of the peer's uid still refuses nobody, and says why.
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    match raw_as_nobody(&socket, STATUS_REQ) {
        Raw::Reply(r) => {
            let v: serde_json::Value = serde_json::from_slice(&r).expect("a JSON reply");
            assert_eq!(v["reply"], "error", "{v}");
            assert!(
                v["message"].as_str().unwrap_or("").contains("root-only"),
                "{v}"
            );
            assert!(v.get("pid").is_none(), "{v}");
        }
        Raw::Refused(e) => panic!("the daemon's peer check was not reached: errno {e}"),
    }
    // Nor does a request that asks for a change get anywhere.
    let forget = br#"{"request":"forget","names":[],"all":true}"#;
    match raw_as_nobody(&socket, forget) {
        Raw::Reply(r) => assert!(text(&r).contains("root-only"), "{}", text(&r)),
        Raw::Refused(e) => panic!("errno {e}"),
    }
    let out = status_as_nobody(&socket);
    assert!(
        text(&out.stderr).contains("root-only"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        !text(&out.stdout).contains(r#""pid""#),
        "{}",
        text(&out.stdout)
    );
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600)).unwrap();
    d.daemon_status();

    // A request far over the size limit is refused, not read to its end.
    let mut c = UnixStream::connect(&socket).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut huge = br#"{"request":"forget","all":false,"names":[""#.to_vec();
    huge.resize(4 << 20, b'a');
    // The daemon stops reading: the write ends with a broken pipe.
    let _ = c.write_all(&huge);
    let _ = c.shutdown(std::net::Shutdown::Write);
    let mut reply = Vec::new();
    let _ = c.read_to_end(&mut reply);
    if !reply.is_empty() {
        let v: serde_json::Value = serde_json::from_slice(&reply).expect("a JSON reply");
        assert_eq!(v["reply"], "error", "{v}");
    }
    drop(c);
    let doc = d.status_within(Duration::from_secs(5));
    assert!(doc["daemon"].is_object(), "{doc}");

    // A client that connects and sends nothing, kept open meanwhile.
    let silent = UnixStream::connect(&socket).unwrap();
    let doc = d.status_within(Duration::from_secs(5));
    assert!(doc["daemon"].is_object(), "{doc}");
    drop(silent);

    // A client that sends a byte at a time, never finishing its request:
    // the daemon gives up on it, not one byte's wait after another.
    let trickle = UnixStream::connect(&socket).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let dripper = {
        let stop = std::sync::Arc::clone(&stop);
        let mut t = trickle.try_clone().unwrap();
        std::thread::spawn(move || {
            let start = Instant::now();
            for b in br#"{"request":"status"          "#.iter().cycle() {
                if stop.load(std::sync::atomic::Ordering::Relaxed)
                    || start.elapsed() > Duration::from_secs(30)
                    || t.write_all(&[*b]).is_err()
                {
                    break;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    let doc = d.status_within(Duration::from_secs(5));
    assert!(doc["daemon"].is_object(), "{doc}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    dripper.join().unwrap();
    drop(trickle);
    d.daemon_status();
}

/// Every profile in `state` reads back whole: its `profile.json` parses,
/// each trace it lists exists and decodes, a prefetching profile's plan
/// decodes; no temporary file is left; `status --json` reports no
/// profile it could not read. Returns the fixture's profile.
fn assert_consistent(d: &Daemon, prefix: &str) -> serde_json::Value {
    let state = &d.state;
    let leftovers: Vec<_> = walk(state)
        .into_iter()
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().ends_with(".tmp"))
        })
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
    let mut ours = Vec::new();
    for e in std::fs::read_dir(state.join("profiles")).unwrap().flatten() {
        let dir = e.path();
        let pj = dir.join("profile.json");
        let prof: serde_json::Value = serde_json::from_slice(
            &std::fs::read(&pj).unwrap_or_else(|e| panic!("{}: {e}", pj.display())),
        )
        .unwrap_or_else(|e| panic!("{} does not parse: {e}", pj.display()));
        for t in prof["traces"].as_array().expect("traces") {
            let t = dir.join(t.as_str().expect("a trace's file name"));
            assert!(
                t.is_file(),
                "{} lists {}, missing",
                pj.display(),
                t.display()
            );
            let v = show_json(&t);
            assert!(v["files"].is_array(), "{}: {v}", t.display());
        }
        if prof["phase"] == "prefetching" {
            let v = show_json(&dir.join("plan"));
            assert!(v["files"].is_array(), "{}: {v}", dir.display());
        }
        if e.file_name().to_string_lossy().starts_with(prefix) {
            ours.push(prof);
        }
    }
    let doc = finish_within(
        Command::new(warmstart())
            .args(["status", "--json", "--state-dir"])
            .arg(state)
            .arg("--socket")
            .arg(&d.socket),
        Duration::from_secs(10),
    );
    let doc: serde_json::Value = serde_json::from_slice(&doc.stdout).expect("status JSON");
    let profiles = doc["profiles"].as_array().expect("profiles");
    assert!(
        profiles.iter().all(|p| p.get("error").is_none()),
        "unreadable profiles: {doc}"
    );
    assert!(doc["daemon"].is_object(), "{doc}");
    assert_eq!(ours.len(), 1, "one profile for the command: {ours:?}");
    ours.pop().unwrap()
}

#[test]
fn root_two_runs_and_the_daemon_on_one_profile() {
    if !require_root("root_two_runs_and_the_daemon_on_one_profile") {
        return;
    }
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let fs = LoopFs::new("ext4", 96);
    run_ok(Command::new(fixture()).arg("gen").arg(&fs.mnt));
    let work = tempfile::tempdir().unwrap();
    let allowed = work.path().join("allowed");
    std::fs::create_dir(&allowed).unwrap();
    let fx = allowed.join("ws-launch-fixture");
    std::fs::copy(fixture(), &fx).unwrap();
    let d = Daemon::start(
        work.path(),
        work.path().join("sock"),
        &format!("[\"{}/*\"]", allowed.display()),
    );
    let handled = |st: &serde_json::Value| {
        st["launches_learned"].as_u64().unwrap_or(0)
            + st["launches_prefetched"].as_u64().unwrap_or(0)
    };
    let mut launches_before = 0;
    for round in 0..3 {
        fs.evict();
        let before = handled(&d.daemon_status());
        let log = |name: &str| {
            std::fs::File::create(work.path().join(format!("{name}-{round}.log"))).unwrap()
        };
        let wrapped = |i: usize| {
            Command::new(warmstart())
                .arg("run")
                .arg("--state-dir")
                .arg(&d.state)
                .arg("--")
                .arg(&fx)
                .arg("run")
                .arg(&fs.mnt)
                .stdout(log(&format!("run{i}-out")))
                .stderr(log(&format!("run{i}-err")))
                .spawn()
                .unwrap()
        };
        let mut kids = [
            wrapped(0),
            wrapped(1),
            Command::new(&fx)
                .arg("run")
                .arg(&fs.mnt)
                .stdout(log("plain-out"))
                .stderr(log("plain-err"))
                .spawn()
                .unwrap(),
        ];
        let mut codes = [None; 3];
        wait_for("the three launches", Duration::from_secs(120), || {
            for (k, c) in kids.iter_mut().zip(codes.iter_mut()) {
                if c.is_none() {
                    *c = k.try_wait().unwrap();
                }
            }
            codes.iter().all(Option::is_some)
        });
        let read = |name: &str| {
            std::fs::read_to_string(work.path().join(format!("{name}-{round}.log"))).unwrap()
        };
        for (i, c) in codes.iter().enumerate() {
            assert!(
                c.unwrap().success(),
                "launch {i} of round {round}: {:?}\n{}",
                c,
                read(&format!("run{i}-err"))
            );
        }
        let in_use = (0..2)
            .filter(|i| read(&format!("run{i}-err")).contains("is in use by another warmstart"))
            .count();
        assert!(in_use <= 1, "both runs found the profile in use");
        // The daemon has taken every launch it followed, and written what
        // it keeps.
        wait_for("the daemon to settle", Duration::from_secs(60), || {
            let st = d.daemon_status();
            handled(&st) > before
                && st["sessions"].as_array().is_some_and(Vec::is_empty)
                && st["learn_queue"] == 0
        });
        let prof = assert_consistent(&d, "ws-launch-fixture");
        let launches = prof["launches"].as_u64().unwrap();
        // At least one of the round's launches is counted, none twice: a
        // `run` that finds its plan resident execs the program in its own
        // place and tallies it, and the daemon leaves that launch to it.
        assert!(
            launches > launches_before && launches <= launches_before + 3,
            "round {round}: {launches_before} -> {launches} launches: {prof}"
        );
        eprintln!(
            "round {round}: {} run(s) found the profile in use; profile {} -> {launches} launches, phase {}",
            in_use, launches_before, prof["phase"]
        );
        launches_before = launches;
    }
}
