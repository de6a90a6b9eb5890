//! The launch-wait tracer against the real kernel (root): a launch that
//! reads a cold file itself, and this process (in the replay's place)
//! prefetching another. Skipped, saying why, without root.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::process::{Command, Stdio};
use std::time::Duration;

use warmstart_bpf::{WaitEvent, WaitKind, WaitTracer};

/// A 1 MiB file on a real disk, evicted from the page cache.
fn cold_file(dir: &std::path::Path, name: &str) -> (std::path::PathBuf, u64) {
    let p = dir.join(name);
    let mut f = std::fs::File::create(&p).unwrap();
    for i in 0..256u32 {
        f.write_all(&[(i % 251) as u8; 4096]).unwrap();
    }
    f.sync_all().unwrap();
    // SAFETY: fadvise on a descriptor we own; it only drops clean pages.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let ino = f.metadata().unwrap().ino();
    (p, ino)
}

#[test]
fn root_wait_tracer_tells_the_launchs_reads_from_the_replays() {
    if !warmstart_testing::require_root("root_wait_tracer_tells_the_launchs_reads_from_the_replays")
    {
        return;
    }
    let dir = TempDir::new();
    let (read_by_launch, launch_ino) = cold_file(&dir.0, "launch");
    let (read_by_replay, replay_ino) = cold_file(&dir.0, "replay");

    let tracer = WaitTracer::start(std::process::id()).unwrap();
    // Held on its stdin until tracked, as the launch manager holds a launch.
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "read x; cat {} > /dev/null",
            read_by_launch.display()
        ))
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let root = child.id();
    tracer.track(root).unwrap();
    // The replay's part: this process prefetches the other file.
    let f = std::fs::File::open(&read_by_replay).unwrap();
    // SAFETY: fadvise on a descriptor we own.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_WILLNEED) };
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert!(child.wait().unwrap().success());

    let mut evs: Vec<WaitEvent> = Vec::new();
    for _ in 0..5 {
        tracer.poll(Duration::from_millis(50), &mut evs).unwrap();
    }
    assert_eq!(tracer.drops(), 0);

    let launch_tgids: std::collections::HashSet<u32> = std::iter::once(root)
        .chain(evs.iter().filter_map(|e| match e.kind {
            WaitKind::Fork { child } => Some(child),
            _ => None,
        }))
        .collect();
    let pages = |kind: WaitKind, ino: u64| -> u64 {
        evs.iter()
            .filter(|e| e.kind == kind && e.ino == ino)
            .map(|e| e.count)
            .sum()
    };
    // cat inserted every page of its file; nobody of the launch read the
    // replay's, and the replay inserted all of its own.
    assert!(pages(WaitKind::AddLaunch, launch_ino) >= 256, "{evs:?}");
    assert_eq!(pages(WaitKind::AddLaunch, replay_ino), 0);
    assert!(pages(WaitKind::AddReplay, replay_ino) >= 256);
    assert_eq!(pages(WaitKind::AddReplay, launch_ino), 0);
    assert!(evs
        .iter()
        .filter(|e| matches!(e.kind, WaitKind::AddLaunch | WaitKind::Get))
        .all(|e| launch_tgids.contains(&e.tgid)));
    assert!(evs
        .iter()
        .any(|e| e.kind == WaitKind::Get && e.ino == launch_ino));
    // cat was exec'd by the forked shell, and the tree ended.
    assert!(evs
        .iter()
        .any(|e| e.kind == WaitKind::Exec && e.tgid != root));
    assert!(evs
        .iter()
        .any(|e| e.kind == WaitKind::Exit && e.tgid == root));
    // A cold read from the disk puts cat to sleep in D state, with a
    // kernel stack to tell why.
    let sleeps: Vec<(u64, Option<u32>)> = evs
        .iter()
        .filter_map(|e| match e.kind {
            WaitKind::Sleep { end_ns, stack } if launch_tgids.contains(&e.tgid) => {
                assert!(end_ns >= e.ts_ns);
                Some((end_ns - e.ts_ns, stack))
            }
            _ => None,
        })
        .collect();
    assert!(!sleeps.is_empty(), "no D sleep of the launch: {evs:?}");
    let id = sleeps
        .iter()
        .find_map(|s| s.1)
        .expect("a sleep with its stack");
    assert!(!tracer.stack(id).unwrap_or_default().is_empty());
}

/// A directory on a real disk (/var/tmp, not tmpfs), removed on drop.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new() -> TempDir {
        let d = std::path::PathBuf::from(format!("/var/tmp/ws-bpf-waits-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
