//! A storage testbed for warmstart's bench: programs run chrooted in a
//! filesystem image (ext4, xfs or btrfs) on a loop device with direct I/O,
//! optionally on a simulated slow device.
//!
//! ```no_run
//! use warmstart_testbed::{Fs, Profile, Testbed, TestbedSpec};
//! let mut spec = TestbedSpec::new(Fs::Xfs);
//! spec.storage = Some(Profile::Sd);
//! let tb = Testbed::prepare(spec)?; // built once, reused while valid
//! tb.drop_caches()?; // cold: page cache and the loop's own cache
//! let status = tb.command(["python3", "-c", "import json"]).status();
//! println!("{}", tb.validate(&Default::default())?); // fio figures
//! drop(tb); // unmount, detach, stop the device model
//! # Ok::<(), warmstart_testbed::Error>(())
//! ```
//!
//! Layout: the image and its manifest live in the cache directory
//! (`/var/cache/warmstart-bench` by default); a testbed's mountpoints live
//! in `/run/warmstart-testbed/<pid>-<n>/` (`root` the image's filesystem,
//! `fuse` the device model serving the image), with a `loops` file naming
//! its loop devices, so [`cleanup`] can find what an interrupted process
//! left. SIGINT, SIGTERM and SIGHUP tear every testbed of the process down
//! before the process dies of the signal (see [`interrupt`]).

use std::ffi::{CString, OsStr};
use std::fmt;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

mod chroot;
pub mod cleanup;
pub mod fio;
pub mod fuse;
pub mod image;
mod inside;
pub mod interrupt;
pub mod profile;
pub mod sys;

pub use cleanup::{cleanup, cleanup_leftovers, CleanupReport};
pub use fio::{DeviceFigures, FioOptions};
pub use image::{Fingerprint, ImageSpec, Manifest};
pub use profile::{DeviceModel, Profile};
pub use sys::BlockStat;

/// Where images are cached unless the spec says otherwise.
pub const DEFAULT_CACHE_DIR: &str = "/var/cache/warmstart-bench";
/// Where testbeds are mounted, one directory per testbed.
pub const RUN_DIR: &str = "/run/warmstart-testbed";

/// What can go wrong building, attaching or using a testbed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or directory could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A tool (losetup, mkfs, cp, fio) could not be started.
    #[error("cannot run {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A tool exited with an error.
    #[error("{program} {args:?} failed ({status}): {stderr}")]
    Command {
        /// The program.
        program: String,
        /// Its arguments.
        args: Vec<String>,
        /// Its exit status.
        status: String,
        /// What it wrote on stderr.
        stderr: String,
    },
    /// A mount failed.
    #[error("cannot mount {source_path} on {target}: {source}")]
    Mount {
        /// What was mounted.
        source_path: PathBuf,
        /// Where.
        target: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// An unmount failed even lazily.
    #[error("cannot unmount {target}: {source}")]
    Unmount {
        /// The mountpoint.
        target: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A kernel or tool output could not be parsed.
    #[error("{path}: cannot parse {what}")]
    Parse {
        /// The file or tool.
        path: PathBuf,
        /// What was expected.
        what: &'static str,
    },
    /// Another testbed (in this or another process) has the image attached;
    /// attaching it twice would mount one filesystem on two devices.
    #[error("{0} is in use by another testbed")]
    InUse(PathBuf),
    /// A content path is not absolute or does not exist.
    #[error("testbed content {0} must be an existing absolute path")]
    BadContent(PathBuf),
    /// A filesystem name that is not ext4, xfs or btrfs.
    #[error("unknown filesystem {0:?} (ext4, xfs or btrfs)")]
    UnknownFs(String),
    /// A storage profile name that does not exist.
    #[error("unknown storage profile {0:?} (sd, cloud, sata-ssd or hdd)")]
    UnknownProfile(String),
}

/// Filesystem of a testbed image.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fs {
    /// ext4.
    Ext4,
    /// XFS.
    Xfs,
    /// Btrfs.
    Btrfs,
}

impl Fs {
    /// Every filesystem, in the order the bench runs them.
    pub const ALL: [Fs; 3] = [Fs::Ext4, Fs::Xfs, Fs::Btrfs];

    /// The kernel's name for it (also `mkfs.<name>`).
    pub fn name(self) -> &'static str {
        match self {
            Fs::Ext4 => "ext4",
            Fs::Xfs => "xfs",
            Fs::Btrfs => "btrfs",
        }
    }
}

impl fmt::Display for Fs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Fs {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        Fs::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| Error::UnknownFs(s.to_string()))
    }
}

/// What testbed to prepare.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestbedSpec {
    /// Filesystem of the image.
    pub fs: Fs,
    /// Slow-storage profile under the image, or the host's disk.
    pub storage: Option<Profile>,
    /// Absolute host paths copied into the image at the same paths.
    pub contents: Vec<PathBuf>,
    /// Image size in bytes; by default the contents' allocated size plus
    /// room for metadata and writes.
    pub size: Option<u64>,
    /// Where the image and its manifest are kept.
    pub cache_dir: PathBuf,
    /// Host paths (files or directories) bind-mounted at the same path in
    /// every [`Testbed::command`], e.g. the warmstart binary and the
    /// bench's plan directory; not under `/tmp` or `/run`, which get a
    /// fresh tmpfs. Not part of the image.
    pub binds: Vec<PathBuf>,
}

impl TestbedSpec {
    /// A spec with the default contents and cache directory.
    pub fn new(fs: Fs) -> Self {
        TestbedSpec {
            fs,
            storage: None,
            contents: default_contents(),
            size: None,
            cache_dir: PathBuf::from(DEFAULT_CACHE_DIR),
            binds: Vec::new(),
        }
    }
}

/// What a chroot needs to run the system's programs: `/usr` and `/etc`,
/// the top-level `/bin`, `/sbin`, `/lib*` (symlinks into `/usr` on a
/// merged-/usr system, copied as symlinks), and the system's font cache
/// (without it every GUI launch would rebuild it); those that exist.
pub fn default_contents() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = ["/usr", "/etc", "/bin", "/sbin", "/var/cache/fontconfig"]
        .iter()
        .map(PathBuf::from)
        .collect();
    if let Ok(dir) = fs::read_dir("/") {
        let mut libs: Vec<PathBuf> = dir
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("lib"))
            .map(|e| e.path())
            .collect();
        libs.sort();
        out.extend(libs);
    }
    out.retain(|p| fs::symlink_metadata(p).is_ok());
    out
}

/// A prepared testbed: the image's filesystem mounted at [`Testbed::root`]
/// on a loop device with direct I/O, over the device model if a profile was
/// asked for. Dropping it tears everything down.
pub struct Testbed {
    active: Arc<Active>,
    spec: TestbedSpec,
    image: PathBuf,
    manifest: Manifest,
    built: Option<String>,
    root: PathBuf,
    loop_dev: PathBuf,
    direct_io: bool,
    // Held while the image is attached; released after teardown (fields
    // drop after `Drop::drop`).
    _lock: nix::fcntl::Flock<fs::File>,
}

/// The parts of a testbed that must be undone, shared with the interrupt
/// handler.
pub(crate) struct Active {
    pub(crate) run_dir: PathBuf,
    pub(crate) attached: Mutex<Option<Attached>>,
}

pub(crate) struct Attached {
    root: PathBuf,
    /// The device number of the image's filesystem, mounted at `root`.
    fs_dev: Option<u64>,
    loop_dev: PathBuf,
    fuse: Option<fuse::ModelMount>,
}

static NEXT_ID: AtomicU32 = AtomicU32::new(0);

impl Active {
    /// Ends the processes inside (see [`inside`]), then unmounts,
    /// detaches and stops the device model; idempotent.
    ///
    /// Held locked throughout: a second caller (the program's own
    /// teardown, racing the interrupt handler's) waits for the first to
    /// finish, and then for the handler to end the process
    /// ([`interrupt::wait_while_ending`]). The last unmount writes the
    /// filesystem back through the device model, served by this process's
    /// threads: a process that exited meanwhile left that write waiting on
    /// them forever.
    pub(crate) fn teardown(&self) -> Result<(), Error> {
        let r = self.teardown_locked();
        interrupt::wait_while_ending();
        r
    }

    fn teardown_locked(&self) -> Result<(), Error> {
        let mut attached = self.attached.lock().unwrap_or_else(|e| e.into_inner());
        let Some(a) = attached.as_mut() else {
            return Ok(());
        };
        if let Some(dev) = a.fs_dev {
            inside::end_processes_on(dev);
        }
        let unmounted = sys::unmount(&a.root);
        let detached = sys::loop_detach(&a.loop_dev);
        if let Some(f) = a.fuse.as_mut() {
            f.unmount();
        }
        *attached = None;
        cleanup::remove_run_dir(&self.run_dir);
        unmounted.and(detached)
    }
}

impl Testbed {
    /// Builds the image if there is no valid one in the cache, attaches it
    /// (through the device model if `spec.storage` is set) and mounts it.
    pub fn prepare(spec: TestbedSpec) -> Result<Testbed, Error> {
        interrupt::install();
        for c in &spec.contents {
            if !c.is_absolute() || fs::symlink_metadata(c).is_err() {
                return Err(Error::BadContent(c.clone()));
            }
        }
        let sources = spec
            .contents
            .iter()
            .map(|p| image::fingerprint(p))
            .collect::<Result<Vec<_>, _>>()?;
        let image_spec = ImageSpec {
            fs: spec.fs,
            contents: spec.contents.clone(),
            size: spec
                .size
                .unwrap_or_else(|| image::default_size(spec.fs, &sources)),
        };
        let (image_path, manifest_path) = image::paths(&spec.cache_dir, spec.fs);
        let lock = image::lock(&spec.cache_dir, spec.fs)?;
        // Best effort: a leftover that cannot be removed now is reported by
        // the mount or attach that trips over it.
        let _ = cleanup::cleanup_leftovers(&spec.cache_dir);

        let run_dir = Path::new(RUN_DIR).join(format!(
            "{}-{}",
            std::process::id(),
            NEXT_ID.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&run_dir).map_err(sys::io_err(&run_dir))?;
        let active = Arc::new(Active {
            run_dir: run_dir.clone(),
            attached: Mutex::new(None),
        });
        interrupt::register(&active, &spec.cache_dir);
        cleanup::record_image(&run_dir, &image_path);
        // From here on, an error or a signal leaves only what the guard and
        // the interrupt handler remove.
        let mut guard = Registered(Some(active.clone()));

        let mut built = None;
        let manifest =
            match image::valid_manifest(&image_path, &manifest_path, &image_spec, &sources) {
                Ok(m) => m,
                Err(why) => {
                    built = Some(why);
                    image::build(&image_path, &manifest_path, &image_spec, sources, &run_dir)?
                }
            };

        let (fuse, backing) = match spec.storage {
            Some(profile) => {
                let mnt = run_dir.join("fuse");
                fs::create_dir_all(&mnt).map_err(sys::io_err(&mnt))?;
                let m = fuse::ModelMount::mount(&image_path, &mnt, profile.model())?;
                let backing = m.image_path();
                (Some(m), backing)
            }
            None => (None, image_path.clone()),
        };
        let mut guard_fuse = FuseGuard(fuse);
        let loop_dev = sys::loop_attach(&backing, true)?;
        cleanup::record_loop(&run_dir, &loop_dev, &backing);
        let root = run_dir.join("root");
        let mounted = fs::create_dir_all(&root)
            .map_err(sys::io_err(&root))
            .and_then(|()| sys::mount_fs(&loop_dev, &root, spec.fs.name()));
        if let Err(e) = mounted {
            let _ = sys::loop_detach(&loop_dev);
            return Err(e);
        }
        *active.attached.lock().unwrap_or_else(|e| e.into_inner()) = Some(Attached {
            root: root.clone(),
            fs_dev: fs::metadata(&root).ok().map(|m| {
                use std::os::unix::fs::MetadataExt;
                m.dev()
            }),
            loop_dev: loop_dev.clone(),
            fuse: guard_fuse.0.take(),
        });
        guard.0 = None;
        let direct_io = sys::loop_direct_io(&loop_dev);
        Ok(Testbed {
            active,
            spec,
            image: image_path,
            manifest,
            built,
            root,
            loop_dev,
            direct_io,
            _lock: lock,
        })
    }

    /// Where the image's filesystem is mounted on the host.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The loop device the filesystem is on.
    pub fn loop_device(&self) -> &Path {
        &self.loop_dev
    }

    /// The cached image file.
    pub fn image(&self) -> &Path {
        &self.image
    }

    /// The spec this testbed was prepared from.
    pub fn spec(&self) -> &TestbedSpec {
        &self.spec
    }

    /// The image's manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Whether `prepare` built the image (false: a valid cached one was used).
    pub fn built(&self) -> bool {
        self.built.is_some()
    }

    /// Why `prepare` built the image ("no image", "the spec changed",
    /// "/usr changed", ...), or `None` if it reused a valid one.
    pub fn build_reason(&self) -> Option<&str> {
        self.built.as_deref()
    }

    /// Whether the loop device does direct I/O to its backing file, so the
    /// backing file is never in the page cache. The kernel falls back to
    /// buffered I/O when the backing file cannot do O_DIRECT; then
    /// [`Testbed::drop_caches`] drops the backing file's pages as well.
    pub fn direct_io(&self) -> bool {
        self.direct_io
    }

    /// The device model under the image, if any.
    pub fn model(&self) -> Option<DeviceModel> {
        self.spec.storage.map(Profile::model)
    }

    /// One line saying what the testbed is, for printing with results:
    /// `xfs image on sd (600 us latency, 40.0 MB/s, queue depth 1)`.
    pub fn describe(&self) -> String {
        match self.spec.storage {
            Some(p) => format!("{} image on {p} ({})", self.spec.fs, p.model()),
            None => format!(
                "{} image on the host disk (loop, direct I/O {})",
                self.spec.fs,
                if self.direct_io { "on" } else { "off" }
            ),
        }
    }

    /// I/O counters of the loop device.
    pub fn loop_stat(&self) -> Result<BlockStat, Error> {
        sys::block_stat(&self.loop_dev)
    }

    /// Makes the next launch cold: writes back and drops the page cache,
    /// dentries and inodes (`drop_caches=3`), and flushes the loop device's
    /// own buffer cache (BLKFLSBUF), where the filesystem's metadata read
    /// through the block device lives. With direct I/O the backing file has
    /// no pages to drop; without it they are dropped too.
    pub fn drop_caches(&self) -> Result<(), Error> {
        sys::drop_page_cache()?;
        sys::flush_block_device(&self.loop_dev)?;
        if !self.direct_io {
            sys::fadvise_dontneed(&self.image)?;
        }
        Ok(())
    }

    /// A command that runs `argv` chrooted into the testbed, in a private
    /// mount namespace with the host's `/proc`, `/sys` and `/dev`, a fresh
    /// tmpfs on `/tmp` and `/run`, and the spec's `binds`; its working
    /// directory is `/`. The program is looked up in `PATH` inside the
    /// chroot. Its mounts vanish with its namespace when it and its
    /// children exit; whatever still runs inside when the testbed is torn
    /// down is ended first (SIGTERM, then SIGKILL after 5 s).
    pub fn command<I, S>(&self, argv: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut argv = argv.into_iter();
        let program = argv.next();
        let mut cmd = Command::new(
            program
                .as_ref()
                .map_or(OsStr::new("/bin/sh"), |p| p.as_ref()),
        );
        cmd.args(argv);
        let root = CString::new(self.root.as_os_str().as_bytes()).expect("no NUL in a path");
        let mut setup = chroot::Setup::new(root);
        for host in &self.spec.binds {
            // The mountpoint must exist in the image; a failure here shows
            // up as the child's mount error.
            let _ = chroot::make_mountpoint(host, &self.root);
            setup.bind(host);
        }
        // SAFETY: the closure runs in the forked child before exec; it only
        // makes raw syscalls on buffers prepared before the fork (no
        // allocation, no locks), which is async-signal-safe.
        unsafe {
            cmd.pre_exec(move || setup.enter());
        }
        cmd
    }

    /// Measures the device under the testbed with fio (read-only, direct
    /// I/O on the loop device): 4 KiB random reads at queue depth 1 and 32,
    /// and 1 MiB sequential reads.
    pub fn validate(&self, opts: &FioOptions) -> Result<DeviceFigures, Error> {
        fio::measure(&self.loop_dev, opts)
    }

    /// Tears the testbed down now, reporting errors that `Drop` would
    /// swallow.
    pub fn teardown(self) -> Result<(), Error> {
        let r = self.active.teardown();
        interrupt::unregister(&self.active);
        r
    }
}

// The bench keeps testbeds in its scenario state and may tear them down
// from another thread.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Testbed>();
};

impl Drop for Testbed {
    fn drop(&mut self) {
        let _ = self.active.teardown();
        interrupt::unregister(&self.active);
    }
}

/// Undoes a half-prepared testbed when `prepare` fails.
struct Registered(Option<Arc<Active>>);

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(active) = self.0.take() {
            cleanup::remove_run_dir(&active.run_dir);
            interrupt::unregister(&active);
        }
    }
}

/// Unmounts the device model when `prepare` fails after mounting it.
struct FuseGuard(Option<fuse::ModelMount>);

impl Drop for FuseGuard {
    fn drop(&mut self) {
        if let Some(f) = self.0.as_mut() {
            f.unmount();
        }
    }
}
