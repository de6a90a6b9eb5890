//! Helpers for tests that drive the real binary: root checks, loop-mounted
//! filesystem images, the fixture program, and running commands.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Root tests need to load BPF, mount images and drop caches. CI runs as
/// root; elsewhere they are skipped with the reason printed, or fail when
/// `WARMSTART_REQUIRE_ROOT=1`.
#[allow(unused_imports)]
pub use warmstart_testing::require_root;

pub fn warmstart() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_warmstart"))
}

/// The full binary the front hands over to (found beside it).
pub fn warmstart_core() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_warmstart-core"))
}

/// The fixture program, built as a workspace member next to this test.
pub fn fixture() -> PathBuf {
    let exe = std::env::current_exe().expect("test exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let p = dir.join("ws-launch-fixture");
    assert!(
        p.exists(),
        "{} is missing: build it with `cargo build -p ws-launch-fixture` (make test does)",
        p.display()
    );
    p
}

pub fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    out
}

pub fn run_ok(cmd: &mut Command) -> Output {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A filesystem image on a loop device (direct I/O, so reads really reach
/// the backing file), mounted in a temp dir; torn down on drop.
pub struct LoopFs {
    pub mnt: PathBuf,
    pub dev: String,
    _dir: tempfile::TempDir,
}

impl LoopFs {
    pub fn new(fstype: &str, size_mb: u64) -> LoopFs {
        // /var/tmp: a real disk, not tmpfs.
        let dir = tempfile::Builder::new()
            .prefix("ws-test")
            .tempdir_in("/var/tmp")
            .expect("tempdir");
        let img = dir.path().join("fs.img");
        let f = std::fs::File::create(&img).expect("image");
        f.set_len(size_mb << 20).expect("size image");
        let mkfs = format!("mkfs.{fstype}");
        let mut c = Command::new(&mkfs);
        if fstype == "ext4" {
            c.arg("-q").arg("-F");
        } else {
            c.arg("-q").arg("-f");
        }
        run_ok(c.arg(&img));
        let out = run_ok(
            Command::new("losetup")
                .args(["--direct-io=on", "-f", "--show"])
                .arg(&img),
        );
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).expect("mountpoint");
        run_ok(Command::new("mount").arg(&dev).arg(&mnt));
        LoopFs {
            mnt,
            dev,
            _dir: dir,
        }
    }

    /// Makes everything on this filesystem cold — file pages, cached
    /// inodes and dentries, the device's metadata pages — without touching
    /// the rest of the system: unmount, flush the device, mount again.
    pub fn evict(&self) {
        run_ok(Command::new("umount").arg(&self.mnt));
        run_ok(Command::new("blockdev").arg("--flushbufs").arg(&self.dev));
        run_ok(Command::new("mount").arg(&self.dev).arg(&self.mnt));
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mnt).status();
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
    }
}

/// Every regular file under `dir`.
pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("readdir").flatten() {
            let ft = e.file_type().expect("type");
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file() {
                out.push(e.path());
            }
        }
    }
    out
}

/// `warmstart show FILE --format json`, parsed.
pub fn show_json(file: &Path) -> serde_json::Value {
    let out = run_ok(
        Command::new(warmstart())
            .arg("show")
            .arg(file)
            .args(["--format", "json"]),
    );
    serde_json::from_slice(&out.stdout).expect("show emits JSON")
}

/// The fixture's touches, from its stdout: (path, first page, count).
pub fn touches(stdout: &[u8]) -> Vec<(String, u64, u64)> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| {
            let mut it = l.strip_prefix("touch ")?.split(' ');
            Some((
                it.next()?.to_string(),
                it.next()?.parse().ok()?,
                it.next()?.parse().ok()?,
            ))
        })
        .collect()
}

/// A process that runs for the length of a test and is killed on drop,
/// also when the test fails.
pub struct Background(std::process::Child);

impl Background {
    pub fn spawn(cmd: &mut Command) -> Background {
        Background(
            cmd.spawn()
                .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}")),
        )
    }

    pub fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits, polling every 50 ms, until `ok` holds; fails the test naming
/// `what` after `timeout`.
pub fn wait_for(what: &str, timeout: std::time::Duration, ok: impl FnMut() -> bool) {
    wait_for_explained(what, timeout, ok, String::new)
}

/// [`wait_for`], whose failure adds what `explain` says (read only then).
pub fn wait_for_explained(
    what: &str,
    timeout: std::time::Duration,
    mut ok: impl FnMut() -> bool,
    explain: impl FnOnce() -> String,
) {
    let t = std::time::Instant::now();
    while !ok() {
        if t.elapsed() >= timeout {
            panic!("timed out waiting for {what}{}", explain());
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// `warmstart daemon` with its own configuration, state directory and
/// socket, its stderr to `log`; returns once its socket exists.
pub fn spawn_daemon(config: &Path, state: &Path, socket: &Path, log: std::fs::File) -> Background {
    let d = Background::spawn(
        Command::new(warmstart())
            .arg("daemon")
            .arg("--config")
            .arg(config)
            .arg("--state-dir")
            .arg(state)
            .arg("--socket")
            .arg(socket)
            .stdout(std::process::Stdio::null())
            .stderr(log),
    );
    wait_for(
        "the daemon's socket",
        std::time::Duration::from_secs(20),
        || socket.exists(),
    );
    d
}
