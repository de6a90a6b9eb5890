//! Root tests of the testbed: real images, loop devices, mounts, FUSE.
//! Each test uses its own cache directory and a small image (a shell, cat,
//! libc and /etc), so the suite stays fast. Without root they are skipped
//! with a message, or fail with `WARMSTART_REQUIRE_ROOT=1`.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use warmstart_testbed::{cleanup, cleanup::testbed_resources, Fs, Profile, Testbed, TestbedSpec};

/// What `/bin/sh -c 'cat ...'` needs on a merged-/usr Debian system.
fn small_contents() -> Vec<PathBuf> {
    [
        "/bin",
        "/lib",
        "/lib64",
        "/etc",
        "/usr/bin/sh",
        "/usr/bin/dash",
        "/usr/bin/cat",
        "/usr/lib64",
    ]
    .iter()
    .map(PathBuf::from)
    .chain(libs_of("/usr/bin/cat"))
    .filter(|p| fs::symlink_metadata(p).is_ok())
    .collect()
}

/// The shared libraries a program loads (from `ldd`), canonical paths.
fn libs_of(program: &str) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(program).output().expect("ldd runs");
    let mut libs = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        for word in line.split_whitespace() {
            if word.starts_with('/') {
                let p = fs::canonicalize(word).unwrap_or_else(|_| PathBuf::from(word));
                if !libs.contains(&p) {
                    libs.push(p);
                }
            }
        }
    }
    libs
}

fn spec(fs: Fs, cache: &Path) -> TestbedSpec {
    let mut spec = TestbedSpec::new(fs);
    spec.contents = small_contents();
    spec.cache_dir = cache.to_path_buf();
    spec
}

fn run_in(tb: &Testbed, script: &str) -> String {
    let out = tb
        .command(["/bin/sh", "-c", script])
        .output()
        .expect("command starts");
    assert!(
        out.status.success(),
        "{script}: {:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Mounts and loop devices that belong to the run directory `run_dir` or
/// whose backing file is under `cache`.
fn remains(run_dir: &Path, cache: &Path) -> Vec<String> {
    let (mounts, loops) = testbed_resources();
    let mut out: Vec<String> = mounts
        .iter()
        .filter(|m| m.target.starts_with(run_dir))
        .map(|m| format!("mount {}", m.target.display()))
        .collect();
    out.extend(
        loops
            .iter()
            .chain(warmstart_loops().iter())
            .filter(|(_, b)| b.starts_with(run_dir) || b.starts_with(cache))
            .map(|(d, b)| format!("loop {} on {}", d.display(), b.display())),
    );
    if run_dir.exists() {
        out.push(format!("dir {}", run_dir.display()));
    }
    out
}

/// Every attached loop device and its backing file.
fn warmstart_loops() -> Vec<(PathBuf, PathBuf)> {
    let mut out = Vec::new();
    for e in fs::read_dir("/sys/block").unwrap().flatten() {
        if let Ok(b) = fs::read_to_string(e.path().join("loop/backing_file")) {
            out.push((
                Path::new("/dev").join(e.file_name()),
                PathBuf::from(b.trim().trim_end_matches(" (deleted)")),
            ));
        }
    }
    out
}

/// [`remains`] once the kernel has finished what was asked of it: a loop
/// device someone else still held open (udev probing it) is detached when
/// they close it. Waits up to five seconds.
fn remains_settled(run_dir: &Path, cache: &Path) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = remains(run_dir, cache);
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn run_dir_of(tb: &Testbed) -> PathBuf {
    tb.root().parent().unwrap().to_path_buf()
}

#[test]
fn ext4_runs_commands_cold_reuses_and_rebuilds_root() {
    if !warmstart_testing::require_root("ext4_runs_commands_cold_reuses_and_rebuilds_root") {
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let tb = Testbed::prepare(spec(Fs::Ext4, cache.path())).unwrap();
    assert!(tb.built());
    assert!(
        tb.direct_io(),
        "the loop device does direct I/O to the image"
    );
    let hostname = fs::read_to_string("/etc/hostname").unwrap();
    assert_eq!(run_in(&tb, "cat /etc/hostname"), hostname);
    // The chroot sees its own root, with the host's /proc and a tmpfs /tmp.
    assert_eq!(
        run_in(&tb, "echo x > /tmp/f && cat /tmp/f /proc/self/comm"),
        "x\ncat\n"
    );

    // Cold: the next read of the file goes to the loop device.
    tb.drop_caches().unwrap();
    let before = tb.loop_stat().unwrap();
    assert_eq!(run_in(&tb, "cat /etc/hostname"), hostname);
    let after = tb.loop_stat().unwrap();
    assert!(
        after.read_ios > before.read_ios,
        "no reads reached the loop device after drop_caches: {before:?} -> {after:?}"
    );
    // Warm: the same read is served from the page cache.
    let warm_before = tb.loop_stat().unwrap();
    run_in(&tb, "cat /etc/hostname");
    assert_eq!(tb.loop_stat().unwrap().read_ios, warm_before.read_ios);

    let run_dir = run_dir_of(&tb);
    tb.teardown().unwrap();
    assert_eq!(
        remains_settled(&run_dir, cache.path()),
        Vec::<String>::new()
    );

    // Same spec, same sources: the image is reused.
    let image = cache.path().join("testbed-ext4.img");
    let mtime = fs::metadata(&image).unwrap().modified().unwrap();
    let tb = Testbed::prepare(spec(Fs::Ext4, cache.path())).unwrap();
    assert!(!tb.built(), "a valid image was rebuilt");
    assert_eq!(run_in(&tb, "cat /etc/hostname"), hostname);
    let size = tb.manifest().spec.size;
    // One image, one testbed at a time.
    assert!(matches!(
        Testbed::prepare(spec(Fs::Ext4, cache.path())),
        Err(warmstart_testbed::Error::InUse(_))
    ));
    drop(tb);

    // A different size is a different spec: rebuilt.
    let mut bigger = spec(Fs::Ext4, cache.path());
    bigger.size = Some(size + (16 << 20));
    let tb = Testbed::prepare(bigger).unwrap();
    assert!(tb.built(), "a changed spec did not rebuild");
    assert_eq!(fs::metadata(&image).unwrap().len(), size + (16 << 20));
    assert_ne!(fs::metadata(&image).unwrap().modified().unwrap(), mtime);
    let run_dir = run_dir_of(&tb);
    drop(tb);
    assert_eq!(
        remains_settled(&run_dir, cache.path()),
        Vec::<String>::new()
    );
}

#[test]
fn changed_source_tree_rebuilds_root() {
    if !warmstart_testing::require_root("changed_source_tree_rebuilds_root") {
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let src = tempfile::tempdir_in("/var/tmp").unwrap();
    fs::write(src.path().join("data"), "one").unwrap();
    let mut s = spec(Fs::Ext4, cache.path());
    s.contents.push(src.path().to_path_buf());
    let tb = Testbed::prepare(s.clone()).unwrap();
    assert!(tb.built());
    let inside = src.path().join("data");
    assert_eq!(run_in(&tb, &format!("cat {}", inside.display())), "one");
    drop(tb);
    assert!(!Testbed::prepare(s.clone()).unwrap().built());
    fs::write(src.path().join("data"), "two!").unwrap();
    let tb = Testbed::prepare(s).unwrap();
    assert!(tb.built(), "a changed source tree did not rebuild");
    assert_eq!(run_in(&tb, &format!("cat {}", inside.display())), "two!");
}

#[test]
fn binds_show_host_paths_inside_root() {
    if !warmstart_testing::require_root("binds_show_host_paths_inside_root") {
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let host = tempfile::tempdir_in("/var/tmp").unwrap();
    fs::write(host.path().join("plan"), "from the host").unwrap();
    let mut s = spec(Fs::Ext4, cache.path());
    s.binds.push(host.path().to_path_buf());
    let tb = Testbed::prepare(s).unwrap();
    let inside = host.path().join("plan");
    assert_eq!(
        run_in(&tb, &format!("cat {}", inside.display())),
        "from the host"
    );
    // The bind lives in the command's namespace only.
    assert!(!tb.root().join(inside.strip_prefix("/").unwrap()).exists());
}

fn runs_on(fs_type: Fs) {
    let cache = tempfile::tempdir().unwrap();
    let tb = Testbed::prepare(spec(fs_type, cache.path())).unwrap();
    let mounted = fs::read_to_string("/proc/mounts").unwrap();
    let line = mounted
        .lines()
        .find(|l| l.contains(&*tb.root().to_string_lossy()))
        .expect("the testbed is mounted");
    assert_eq!(line.split(' ').nth(2), Some(fs_type.name()), "{line}");
    tb.drop_caches().unwrap();
    let before = tb.loop_stat().unwrap();
    assert_eq!(
        run_in(&tb, "cat /etc/hostname"),
        fs::read_to_string("/etc/hostname").unwrap()
    );
    assert!(tb.loop_stat().unwrap().read_ios > before.read_ios);
    let run_dir = run_dir_of(&tb);
    drop(tb);
    assert_eq!(
        remains_settled(&run_dir, cache.path()),
        Vec::<String>::new()
    );
}

#[test]
fn xfs_testbed_runs_commands_root() {
    if warmstart_testing::require_root("xfs_testbed_runs_commands_root") {
        runs_on(Fs::Xfs);
    }
}

#[test]
fn btrfs_testbed_runs_commands_root() {
    if warmstart_testing::require_root("btrfs_testbed_runs_commands_root") {
        runs_on(Fs::Btrfs);
    }
}

/// An ext4 testbed on `profile` whose image holds, besides the small
/// contents, a directory of `/var/tmp` with a `mib` MiB file `blob`:
/// (cache dir, that directory, the blob's bytes, the testbed).
fn blob_testbed(
    profile: Profile,
    mib: usize,
) -> (tempfile::TempDir, tempfile::TempDir, Vec<u8>, Testbed) {
    let cache = tempfile::tempdir().unwrap();
    let src = tempfile::tempdir_in("/var/tmp").unwrap();
    let blob: Vec<u8> = (0..mib << 20).map(|i| (i * 7 % 251) as u8).collect();
    fs::write(src.path().join("blob"), &blob).unwrap();
    let mut s = spec(Fs::Ext4, cache.path());
    s.contents.push(src.path().to_path_buf());
    s.storage = Some(profile);
    let tb = Testbed::prepare(s).unwrap();
    (cache, src, blob, tb)
}

/// Reads the first `n` 4 KiB blocks of `device` with O_DIRECT, each from
/// its own thread, all released at once; returns how long they took.
fn concurrent_direct_reads(device: &Path, n: u64) -> Duration {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    use std::sync::{Arc, Barrier};
    let dev = Arc::new(
        fs::File::options()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(device)
            .unwrap(),
    );
    let start = Arc::new(Barrier::new(n as usize + 1));
    let readers: Vec<_> = (0..n)
        .map(|i| {
            let (dev, start) = (dev.clone(), start.clone());
            std::thread::spawn(move || {
                // Direct I/O wants an aligned buffer.
                let mut raw = vec![0u8; 2 * 4096];
                let at = raw.as_ptr().align_offset(4096);
                start.wait();
                let read = dev.read_at(&mut raw[at..at + 4096], i * 4096);
                assert_eq!(read.unwrap(), 4096);
            })
        })
        .collect();
    start.wait();
    let t0 = Instant::now();
    for r in readers {
        r.join().unwrap();
    }
    t0.elapsed()
}

#[test]
fn sd_profile_throttles_reads_root() {
    if !warmstart_testing::require_root("sd_profile_throttles_reads_root") {
        return;
    }
    const MIB: usize = 4;
    let (cache, src, blob, tb) = blob_testbed(Profile::Sd, MIB);
    assert!(tb.direct_io(), "the loop does direct I/O to the FUSE file");
    let served = warmstart_loops()
        .into_iter()
        .find(|(d, _)| d == tb.loop_device())
        .map(|(_, b)| b)
        .unwrap();
    assert!(
        served.ends_with("fuse/image"),
        "loop on {}",
        served.display()
    );

    tb.drop_caches().unwrap();
    let inside = tb
        .root()
        .join(src.path().strip_prefix("/").unwrap())
        .join("blob");
    let t0 = Instant::now();
    let read = fs::read(&inside).unwrap();
    let took = t0.elapsed();
    assert!(read == blob, "the data read through the model differs");
    let model = Profile::Sd.model();
    let floor = model.transfer_time((MIB << 20) as u64);
    assert!(
        took >= floor,
        "{MIB} MiB read in {took:?}, faster than the model's bandwidth allows ({floor:?})"
    );
    // Requests that wait for the card and touch one another are served as
    // one, as the host's scheduler merges them: 64 neighbouring 4 KiB
    // reads at once take far less than 64 times the card's latency.
    const READS: u64 = 64;
    let took = concurrent_direct_reads(tb.loop_device(), READS);
    let unmerged = model.latency * READS as u32;
    assert!(
        took < unmerged / 2,
        "{READS} neighbouring reads took {took:?}, as if each paid the latency ({unmerged:?})"
    );
    let run_dir = run_dir_of(&tb);
    drop(tb);
    assert_eq!(
        remains_settled(&run_dir, cache.path()),
        Vec::<String>::new()
    );
}

#[test]
fn validate_measures_within_the_cloud_model_root() {
    if !warmstart_testing::require_root("validate_measures_within_the_cloud_model_root") {
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let mut s = spec(Fs::Ext4, cache.path());
    s.storage = Some(Profile::Cloud);
    let tb = Testbed::prepare(s).unwrap();
    let f = tb
        .validate(&warmstart_testbed::FioOptions {
            runtime: Duration::from_millis(700),
        })
        .unwrap();
    let m = Profile::Cloud.model();
    // The throttle only ever slows requests down: no figure may beat the
    // model (10% margin for fio's own rounding of short runs).
    let lat_floor = (m.latency + m.transfer_time(4096)).as_secs_f64() * 1e6;
    assert!(f.rand4k_qd1_p50_us >= lat_floor * 0.9, "{f}");
    assert!(
        f.rand4k_qd32_iops <= f64::from(m.iops.unwrap()) * 1.1,
        "{f}"
    );
    assert!(f.seq1m_mb_s <= m.bandwidth as f64 / 1e6 * 1.1, "{f}");
    assert!(f.seq1m_mb_s > 0.0 && f.rand4k_qd1_iops > 0.0, "{f}");
}

/// Starts the binary holding a testbed and waits until it is mounted.
fn hold(cache: &Path, storage: Option<&str>) -> (Child, PathBuf) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_warmstart-testbed"));
    cmd.args(["prepare", "--hold", "--fs", "ext4", "--cache-dir"])
        .arg(cache);
    for c in small_contents() {
        cmd.arg("--content").arg(c);
    }
    if let Some(s) = storage {
        cmd.args(["--storage", s]);
    }
    let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let root = PathBuf::from(line.trim().rsplit(" at ").next().unwrap());
    assert!(root.is_dir(), "child did not report its testbed: {line:?}");
    (child, root.parent().unwrap().to_path_buf())
}

fn signal(child: &Child, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig).unwrap();
}

#[test]
fn sigint_leaves_nothing_behind_root() {
    if !warmstart_testing::require_root("sigint_leaves_nothing_behind_root") {
        return;
    }
    for storage in [None, Some("sd")] {
        let cache = tempfile::tempdir().unwrap();
        let (mut child, run_dir) = hold(cache.path(), storage);
        assert!(!remains(&run_dir, cache.path()).is_empty());
        signal(&child, nix::sys::signal::Signal::SIGINT);
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGINT), "{status:?}");
        assert_eq!(
            remains_settled(&run_dir, cache.path()),
            Vec::<String>::new(),
            "left behind after SIGINT (storage {storage:?})"
        );
    }
}

#[test]
fn cleanup_removes_leftovers_of_a_killed_run_root() {
    if !warmstart_testing::require_root("cleanup_removes_leftovers_of_a_killed_run_root") {
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let (mut child, run_dir) = hold(cache.path(), Some("cloud"));
    signal(&child, nix::sys::signal::Signal::SIGKILL);
    child.wait().unwrap();
    let left = remains(&run_dir, cache.path());
    assert!(
        left.iter().any(|r| r.starts_with("mount")),
        "SIGKILL should leave mounts for cleanup: {left:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let report = cleanup(cache.path()).unwrap();
    assert!(Instant::now() < deadline);
    assert!(!report.is_empty());
    assert_eq!(
        remains_settled(&run_dir, cache.path()),
        Vec::<String>::new()
    );
    assert!(
        !cache.path().join("testbed-ext4.img").exists(),
        "cached image not removed: {report:?}"
    );
    // Nothing left: a second run finds nothing of ours.
    let again = cleanup(cache.path()).unwrap();
    assert!(
        again.detached.is_empty() && again.removed.iter().all(|p| !p.starts_with(cache.path())),
        "{again:?}"
    );
}

#[test]
fn prepare_after_a_killed_run_removes_its_mount_first_root() {
    if !warmstart_testing::require_root("prepare_after_a_killed_run_removes_its_mount_first_root") {
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let (mut child, dead_run_dir) = hold(cache.path(), None);
    signal(&child, nix::sys::signal::Signal::SIGKILL);
    child.wait().unwrap();
    assert!(remains(&dead_run_dir, cache.path())
        .iter()
        .any(|r| r.starts_with("mount")));
    // The killed run's filesystem is unmounted before the image is
    // attached again, never mounted twice.
    let tb = Testbed::prepare(spec(Fs::Ext4, cache.path())).unwrap();
    assert!(!tb.built());
    assert!(!dead_run_dir.exists(), "the killed run's directory remains");
    let image = cache.path().join("testbed-ext4.img");
    let on_image: Vec<_> = warmstart_loops()
        .into_iter()
        .filter(|(_, b)| *b == image)
        .collect();
    assert_eq!(on_image.len(), 1, "{on_image:?}");
    assert_eq!(on_image[0].0, tb.loop_device());
    assert_eq!(
        run_in(&tb, "cat /etc/hostname"),
        fs::read_to_string("/etc/hostname").unwrap()
    );
}

/// Ctrl-C during a bench, with a program inside that outlives the process
/// that started it (the X server a harness started): it is ended before
/// the device model under the image stops, and nothing is left.
#[test]
fn sigint_ends_the_programs_inside_and_leaves_nothing_root() {
    if !warmstart_testing::require_root("sigint_ends_the_programs_inside_and_leaves_nothing_root") {
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_warmstart-testbed"));
    cmd.args([
        "run",
        "--warm",
        "--storage",
        "sd",
        "--fs",
        "ext4",
        "--cache-dir",
    ])
    .arg(cache.path());
    for c in small_contents() {
        cmd.arg("--content").arg(c);
    }
    // `cat` inside reads the pipe until the test closes it.
    let mut child = cmd
        .arg("--")
        .arg("/usr/bin/cat")
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let prefix = format!("{}-", child.id());
    let deadline = Instant::now() + Duration::from_secs(30);
    let run_dir = loop {
        let found = fs::read_dir(warmstart_testbed::RUN_DIR).ok().and_then(|d| {
            d.flatten().map(|e| e.path()).find(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(&prefix)
            })
        });
        if let Some(dir) = found {
            let mounted = fs::read_to_string("/proc/mounts").unwrap();
            if mounted.contains(&*dir.join("root").to_string_lossy()) {
                break dir;
            }
        }
        assert!(Instant::now() < deadline, "the testbed never came up");
        std::thread::sleep(Duration::from_millis(50));
    };
    // `cat` started inside the testbed.
    let cat = loop {
        let found = fs::read_dir("/proc").unwrap().flatten().find_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = fs::read_to_string(e.path().join("stat")).ok()?;
            let ppid: u32 = stat
                .rsplit(')')
                .next()?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            (ppid == child.id() && stat.contains("(cat)")).then_some(pid)
        });
        if let Some(pid) = found {
            break pid;
        }
        assert!(Instant::now() < deadline, "cat never started");
        std::thread::sleep(Duration::from_millis(20));
    };
    signal(&child, nix::sys::signal::Signal::SIGINT);
    let stdin = child.stdin.take();
    let status = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGINT), "{status:?}");
    // `cat` still had its input open: it was ended, and the loop device
    // and the device model went with its namespace.
    let cat_runs =
        || fs::read_to_string(format!("/proc/{cat}/stat")).is_ok_and(|s| s.contains("(cat)"));
    assert!(!cat_runs(), "cat still runs");
    let left = remains_settled(&run_dir, cache.path());
    assert!(left.is_empty(), "left behind: {left:?}");
    drop(stdin);
}

#[test]
fn hdd_profile_charges_for_seeks_root() {
    if !warmstart_testing::require_root("hdd_profile_charges_for_seeks_root") {
        return;
    }
    const MIB: usize = 4;
    let (cache, src, blob, tb) = blob_testbed(Profile::Hdd, MIB);
    let inside = tb
        .root()
        .join(src.path().strip_prefix("/").unwrap())
        .join("blob");

    // The whole file in order: one positioning, then the transfer.
    tb.drop_caches().unwrap();
    let t0 = Instant::now();
    assert!(fs::read(&inside).unwrap() == blob);
    let in_order = t0.elapsed();

    // 64 of its pages, each behind the one before: every read moves the
    // head back, so each pays at least the model's fixed positioning.
    tb.drop_caches().unwrap();
    let f = fs::File::open(&inside).unwrap();
    // SAFETY: a valid descriptor; FADV_RANDOM only turns read-ahead off.
    unsafe {
        libc::posix_fadvise(
            std::os::fd::AsRawFd::as_raw_fd(&f),
            0,
            0,
            libc::POSIX_FADV_RANDOM,
        )
    };
    let mut page = [0u8; 4096];
    let t0 = Instant::now();
    for i in (0..64u64).rev() {
        let off = i * 16 * 4096;
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut page, off).unwrap();
        assert_eq!(page[..], blob[off as usize..off as usize + 4096]);
    }
    let backwards = t0.elapsed();
    let seek = Profile::Hdd.model().seek.unwrap();
    assert!(
        backwards >= seek.min * 64,
        "64 reads against the head's way took {backwards:?}, under 64 positionings"
    );
    assert!(
        in_order * 2 < backwards,
        "{MIB} MiB in order took {in_order:?}, 256 KiB backwards {backwards:?}"
    );
    drop(f);
    let run_dir = run_dir_of(&tb);
    drop(tb);
    assert_eq!(
        remains_settled(&run_dir, cache.path()),
        Vec::<String>::new()
    );
}
