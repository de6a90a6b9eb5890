//! Metadata from the block device, on real filesystems: an image file is
//! formatted, attached to a loop device with direct I/O (so the image's
//! own pages in the host's cache do not hide reads), mounted, and filled
//! with a small tree. A cold stat walk shows which device blocks the
//! lookups read; a plan of those blocks is replayed on a cold mount.
//!
//! ext4 keeps its metadata in the device's page cache, so after the replay
//! the blocks are resident and the same walk reads nothing from the disk.
//! xfs and btrfs keep theirs in caches of their own, so the replay leaves
//! their devices alone and says why.
//!
//! Needs root, `mkfs.*`, `losetup` and loop devices; each test says why it
//! skips (and fails instead when `WARMSTART_REQUIRE_ROOT=1`).

use std::fs::{self, File};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use warmstart_plan::plan::PlanMeta;
use warmstart_plan::{Entry, Plan};
use warmstart_replay::{replay, MetaPath, Options, RealBackend};

const PAGE: u64 = 4096;

fn run(cmd: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {cmd}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd} {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// An image of filesystem `fs` on a loop device, mounted; unmounted,
/// detached and deleted on drop, however the test ends.
struct Fixture {
    loop_dev: Option<PathBuf>,
    mnt: PathBuf,
    mounted: bool,
    _dir: tempfile::TempDir,
}

impl Fixture {
    fn new(fs: &str) -> Result<Fixture, String> {
        let dir = tempfile::Builder::new()
            .prefix("warmstart-meta-")
            .tempdir_in("/var/tmp")
            .map_err(|e| format!("no scratch directory: {e}"))?;
        let img = dir.path().join("img");
        let mnt = dir.path().join("mnt");
        fs::create_dir(&mnt).map_err(|e| e.to_string())?;
        File::create(&img)
            .and_then(|f| f.set_len(512 << 20))
            .map_err(|e| e.to_string())?;
        let img_s = img.to_str().unwrap();
        // ext4: no lazy inode-table initialisation, whose background
        // writes would show up while we count reads; 4 KiB blocks as on
        // any real-sized disk (mkfs picks 1 KiB for a small image, whose
        // blocks fill a page a quarter at a time, so `mincore`, which
        // counts only whole up-to-date pages, could not see what the walk
        // read).
        let mkfs_args: Vec<&str> = match fs {
            "ext4" => vec![
                "-q",
                "-F",
                "-b",
                "4096",
                "-E",
                "lazy_itable_init=0,lazy_journal_init=0",
                img_s,
            ],
            _ => vec!["-q", "-f", img_s],
        };
        run(&format!("mkfs.{fs}"), &mkfs_args)?;
        let mut f = Fixture {
            loop_dev: None,
            mnt,
            mounted: false,
            _dir: dir,
        };
        let dev = run("losetup", &["--direct-io=on", "--find", "--show", img_s])?;
        f.loop_dev = Some(PathBuf::from(dev));
        f.mount()?;
        Ok(f)
    }

    fn dev(&self) -> &Path {
        self.loop_dev.as_deref().unwrap()
    }

    fn mount(&mut self) -> Result<(), String> {
        run(
            "mount",
            &[self.dev().to_str().unwrap(), self.mnt.to_str().unwrap()],
        )?;
        self.mounted = true;
        Ok(())
    }

    /// Unmounts and mounts again: the filesystem's caches, and the
    /// device's page cache (dropped on its last close), start cold.
    fn remount(&mut self) {
        run("umount", &[self.mnt.to_str().unwrap()]).unwrap();
        self.mounted = false;
        self.mount().unwrap();
    }

    /// 40 directories of 100 files and a subdirectory of 25.
    fn fill(&self) {
        for d in 0..40 {
            let dir = self.mnt.join(format!("d{d}"));
            fs::create_dir_all(dir.join("sub")).unwrap();
            for i in 0..100 {
                fs::write(dir.join(format!("f{i}")), vec![b'x'; i * 37]).unwrap();
            }
            for i in 0..25 {
                fs::write(dir.join(format!("sub/g{i}")), b"y").unwrap();
            }
        }
        run("sync", &[]).unwrap();
    }

    /// Reads completed by the loop device (`/sys/block/loopN/stat`).
    fn reads(&self) -> u64 {
        let name = self.dev().file_name().unwrap().to_str().unwrap();
        let stat = fs::read_to_string(format!("/sys/block/{name}/stat")).unwrap();
        stat.split_whitespace().next().unwrap().parse().unwrap()
    }

    fn rdev(&self) -> u64 {
        fs::metadata(self.dev()).unwrap().rdev()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg(&self.mnt).status();
        }
        if let Some(dev) = &self.loop_dev {
            let _ = Command::new("losetup").arg("-d").arg(dev).status();
        }
    }
}

/// Builds a fixture or returns from the test saying why it cannot.
macro_rules! fixture {
    ($fs:expr, $test:ident) => {{
        if !warmstart_testing::require_root(stringify!($test)) {
            return;
        }
        match Fixture::new($fs) {
            Ok(f) => f,
            Err(why) => {
                warmstart_testing::skip(stringify!($test), &why);
                return;
            }
        }
    }};
}

/// Read requests to one block device, recorded from the
/// `block:block_rq_issue` tracepoint in a tracefs instance of our own,
/// removed on drop.
struct Trace {
    dir: PathBuf,
}

impl Trace {
    fn start(device: u64) -> Result<Trace, String> {
        let root = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.join("instances").is_dir())
            .ok_or("no tracefs")?;
        let dir = root
            .join("instances")
            .join(format!("warmstart-replay-test-{}", std::process::id()));
        fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let t = Trace { dir };
        let ev = t.dir.join("events/block/block_rq_issue");
        // The event's dev_t is the kernel's: major << 20 | minor.
        let kdev = (u64::from(libc::major(device)) << 20) | u64::from(libc::minor(device));
        fs::write(ev.join("filter"), format!("dev == {kdev}")).map_err(|e| e.to_string())?;
        fs::write(ev.join("enable"), "1").map_err(|e| e.to_string())?;
        Ok(t)
    }

    /// The reads recorded, as (byte offset, length).
    fn stop(&self) -> Vec<(u64, u64)> {
        let ev = self.dir.join("events/block/block_rq_issue");
        fs::write(ev.join("enable"), "0").unwrap();
        let text = fs::read_to_string(self.dir.join("trace")).unwrap();
        // "... block_rq_issue: 7,1 RM 4096 () 16080 + 8 ..."
        text.lines()
            .filter_map(|l| {
                let rest = l.split_once("block_rq_issue: ")?.1;
                let f: Vec<&str> = rest.split_whitespace().collect();
                let (rwbs, sector, n) = (f.get(1)?, f.get(4)?, f.get(6)?);
                let (sector, n): (u64, u64) = (sector.parse().ok()?, n.parse().ok()?);
                (rwbs.contains('R') && n > 0).then_some((sector * 512, n * 512))
            })
            .collect()
    }
}

impl Drop for Trace {
    fn drop(&mut self) {
        let _ = fs::write(self.dir.join("events/block/block_rq_issue/enable"), "0");
        let _ = fs::remove_dir(&self.dir);
    }
}

/// Stats every file under `root`, as a launch's lookups do.
fn walk(root: &Path) -> usize {
    let mut n = 0;
    for e in fs::read_dir(root).unwrap() {
        let e = e.unwrap();
        let m = fs::symlink_metadata(e.path()).unwrap();
        n += 1;
        if m.is_dir() {
            n += walk(&e.path());
        }
    }
    n
}

/// Which pages of the first `len` bytes of `f` are in the page cache.
fn resident(f: &File, len: u64) -> Vec<bool> {
    let pages = len.div_ceil(PAGE) as usize;
    // SAFETY: a fresh read-only shared mapping, unmapped below; mapping
    // does not fault pages in.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(addr, libc::MAP_FAILED, "mmap");
    let mut vec = vec![0u8; pages];
    // SAFETY: `vec` has one byte per page of the mapping made above.
    let r = unsafe { libc::mincore(addr, len as usize, vec.as_mut_ptr()) };
    // SAFETY: unmaps exactly the mapping made above.
    unsafe { libc::munmap(addr, len as usize) };
    assert_eq!(r, 0, "mincore");
    vec.iter().map(|b| b & 1 != 0).collect()
}

fn plan(entries: Vec<Entry>) -> Plan {
    Plan {
        meta: PlanMeta {
            command: vec!["walk".into()],
            created_unix_ms: 0,
            traces: 1,
            min_traces: 1,
            passes: vec![],
            sorted: false,
        },
        files: vec![],
        lookups: vec![],
        entries,
    }
}

fn options() -> Options {
    Options {
        wait: Some(Duration::from_secs(30)),
        memory_floor: Some(0),
        ..Options::default()
    }
}

#[test]
fn root_ext4_metadata_read_from_the_device_serves_the_lookups() {
    let mut fx = fixture!(
        "ext4",
        root_ext4_metadata_read_from_the_device_serves_the_lookups
    );
    fx.fill();
    fx.remount();
    let size = 512u64 << 20;

    // What the cold walk reads from the device, as `record` sees it: the
    // block layer's read requests (the page cache cannot tell: blocks read
    // through buffer heads leave their pages not up to date as a whole,
    // and `mincore` counts only up-to-date pages).
    let trace = match Trace::start(fx.rdev()) {
        Ok(t) => t,
        Err(why) => {
            warmstart_testing::skip(
                "root_ext4_metadata_read_from_the_device_serves_the_lookups",
                &why,
            );
            return;
        }
    };
    let cold_reads = fx.reads();
    let files = walk(&fx.mnt);
    let cold_reads = fx.reads() - cold_reads;
    let reads = trace.stop();
    assert!(
        cold_reads > 0 && !reads.is_empty(),
        "the cold walk read metadata"
    );
    let mut entries: Vec<Entry> = reads
        .iter()
        .map(|&(offset, len)| Entry::Meta {
            device: fx.rdev(),
            offset,
            len,
        })
        .collect();
    let pages: Vec<u64> = reads
        .iter()
        .flat_map(|&(o, l)| o / PAGE..(o + l).div_ceil(PAGE))
        .collect();
    entries.reverse();
    let n = entries.len() as u64;

    fx.remount();
    let dev = File::open(fx.dev()).unwrap();
    let cold = resident(&dev, size);
    let still = pages.iter().filter(|&&p| cold[p as usize]).count();
    assert!(
        still * 10 < pages.len(),
        "the remount left {still} of the walk's {} pages cached",
        pages.len()
    );
    let r = replay(&plan(entries.clone()), &options(), &RealBackend::new()).unwrap();
    assert_eq!(r.meta.entries, n, "{r:#?}");
    assert_eq!(r.skipped_meta.entries, 0, "{:?}", r.skipped_devices);
    let d = &r.meta_devices[0];
    assert_eq!(d.path, MetaPath::DeviceRead);
    assert_eq!(d.fs_type.as_deref(), Some("ext4"));
    assert!(d.requests > 0 && d.requests <= d.ranges * 64, "{d:?}");
    // Waited for, the replay has the CPUs to itself: the full pool.
    assert_eq!(r.workers, Options::default().workers);
    assert_eq!(r.spare, None);
    let w = r.wait.expect("waited");
    assert!(!w.timed_out && w.resident == w.pages, "{w:?}");
    let now = resident(&dev, size);
    let missing: Vec<u64> = pages
        .iter()
        .copied()
        .filter(|&p| !now[p as usize])
        .collect();
    assert_eq!(
        missing,
        Vec::<u64>::new(),
        "mincore: the walk's blocks are cached"
    );

    // And the lookups find them: the same walk reads nothing from the disk.
    let reads = fx.reads();
    assert_eq!(walk(&fx.mnt), files);
    assert_eq!(
        fx.reads() - reads,
        0,
        "a stat walk of {files} entries after the replay read from the device \
         (it read {cold_reads} times cold)"
    );

    // Beside a launch (not waited for), the schedule's opens and lookups
    // find their metadata cached: one worker, and the spare.
    let beside = Options {
        wait: None,
        ..options()
    };
    let r = replay(&plan(entries), &beside, &RealBackend::new()).unwrap();
    assert_eq!(r.meta.entries, n, "{r:#?}");
    assert_eq!(r.workers, Options::WORKERS_METADATA_READ);
    assert!(r.spare.is_some(), "{r:#?}");
}

/// xfs and btrfs: the device is not read, and the report says why. The
/// btrfs case also checks that its device is found through the mount
/// source (its files' `st_dev` is an anonymous device).
#[test]
fn root_xfs_and_btrfs_metadata_is_left_to_the_lookups() {
    for fs in ["xfs", "btrfs"] {
        let mut fx = fixture!(fs, root_xfs_and_btrfs_metadata_is_left_to_the_lookups);
        fx.fill();
        fx.remount();
        let entries = vec![Entry::Meta {
            device: fx.rdev(),
            offset: 64 << 10,
            len: 64 << 10,
        }];
        let r = replay(&plan(entries), &options(), &RealBackend::new()).unwrap();
        let d = &r.meta_devices[0];
        assert_eq!(
            d.path,
            MetaPath::FilesystemUnsupported { fs_type: fs.into() },
            "{fs}"
        );
        assert_eq!(
            (r.meta.entries, r.skipped_meta.entries, r.requests),
            (0, 1, 0)
        );
        // The lookups read the metadata, one at a time each: all workers.
        assert_eq!(r.workers, Options::default_workers(), "{fs}");
        assert!(
            r.skipped_devices[0].error.contains(fs),
            "{:?}",
            r.skipped_devices
        );
    }
}

/// A directory block the filesystem itself created (as a launch that
/// writes a log file or an output directory does): ext4 makes it through
/// buffer heads, so the device's page is cached but never marked up to
/// date, `WILLNEED` skips it and `mincore` calls it absent for as long as
/// ext4 holds it. The residency wait must still end, with the page
/// resident, without running to its timeout.
#[test]
fn root_ext4_wait_ends_for_a_directory_block_the_filesystem_created() {
    let fx = fixture!(
        "ext4",
        root_ext4_wait_ends_for_a_directory_block_the_filesystem_created
    );
    let dir = fx.mnt.join("logs");
    fs::create_dir(&dir).unwrap();
    fs::write(dir.join("run.log"), b"x").unwrap();
    run("sync", &[]).unwrap();
    let extents = warmstart_sys::fiemap::extents(&File::open(&dir).unwrap()).unwrap();
    let block = extents.first().expect("the directory has a block").physical;

    let dev = File::open(fx.dev()).unwrap();
    let size = dev.metadata().unwrap().len().max(512 << 20);
    let cached = warmstart_sys::residency::cached_in(&dev, size, block, PAGE).unwrap();
    let up_to_date = warmstart_sys::residency::resident_in(&dev, size, block, PAGE).unwrap();
    match cached {
        Some(c) if c.resident == 1 && up_to_date.resident == 0 => {}
        _ => {
            warmstart_testing::skip(
                "root_ext4_wait_ends_for_a_directory_block_the_filesystem_created",
                &format!(
                    "this kernel left the new directory block's page \
                     {cached:?} cached, {up_to_date:?} up to date: not the case under test"
                ),
            );
            return;
        }
    }

    let entries = vec![Entry::Meta {
        device: fx.rdev(),
        offset: block,
        len: PAGE,
    }];
    let o = Options {
        wait: Some(Duration::from_secs(10)),
        wait_stall: Duration::from_secs(5),
        ..options()
    };
    let r = replay(&plan(entries), &o, &RealBackend::new()).unwrap();
    let w = r.wait.expect("waited");
    assert!(!w.timed_out && !w.stalled, "{w:?} {:?}", r.errors);
    assert_eq!((w.pages, w.resident, w.ranges_read), (1, 1, 1), "{w:?}");
    let now = warmstart_sys::residency::resident_in(&dev, size, block, PAGE).unwrap();
    assert_eq!(now.resident, 1, "mincore: the block's page is up to date");
}
