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
