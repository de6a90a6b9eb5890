//! Replay against the real kernel: files on a real disk are evicted, a plan
//! is built for them by hand, replayed with `wait`, and residency is then
//! checked independently with `mmap` + `mincore`.
//!
//! These need root (CI runs as root) and a disk-backed `/var/tmp`: tmpfs
//! has no backing store, so eviction and readahead mean nothing there. Each
//! test prints why it skips, and fails instead with
//! `WARMSTART_REQUIRE_ROOT=1`.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use warmstart_plan::plan::{PlanFile, PlanMeta};
use warmstart_plan::trace::FileId;
use warmstart_plan::{Entry, Plan};
use warmstart_replay::{read_ahead_bytes, replay, IdField, Options, RealBackend, SkipReason};

const MIB: u64 = 1 << 20;

/// Why this machine cannot run the root tests other than not being root,
/// if it cannot.
fn skip_reason() -> Option<String> {
    // SAFETY: zeroed statfs is a valid out-buffer; the path is a NUL-terminated literal.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above; statfs writes only into `st`.
    if unsafe { libc::statfs(c"/var/tmp".as_ptr(), &mut st) } != 0 {
        return Some("/var/tmp is not there".into());
    }
    if st.f_type == libc::TMPFS_MAGIC {
        return Some("/var/tmp is tmpfs, which has no storage to prefetch from".into());
    }
    None
}

/// Returns from the test, saying why, if the machine cannot run it; with
/// `WARMSTART_REQUIRE_ROOT=1` fails it instead.
macro_rules! require_root {
    ($test:ident) => {
        if !warmstart_testing::require_root(stringify!($test)) {
            return;
        }
        if let Some(why) = skip_reason() {
            warmstart_testing::skip(stringify!($test), &why);
            return;
        }
    };
}

/// A file of `len` pseudo-random bytes on disk, flushed and evicted.
fn evicted_file(len: u64) -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new()
        .prefix("warmstart-replay-test-")
        .tempfile_in("/var/tmp")
        .unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut buf = Vec::with_capacity(len as usize);
    while (buf.len() as u64) < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf.extend_from_slice(&x.to_le_bytes());
    }
    f.write_all(&buf).unwrap();
    f.as_file().sync_all().unwrap();
    evict(f.as_file());
    f
}

/// Drops a file's (or device's) clean pages from the page cache: only its
/// own, not the whole cache.
fn evict(f: &File) {
    // SAFETY: plain syscall on an open descriptor.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(r, 0, "fadvise(DONTNEED)");
}

/// Resident pages of the first `len` bytes of `f`, by mmap + mincore: an
/// independent check of what the replay's own residency query says.
fn resident_pages(f: &File, len: u64) -> u64 {
    let page = 4096u64;
    let pages = len.div_ceil(page);
    // SAFETY: a fresh read-only shared mapping of `len` bytes, unmapped
    // below; mapping does not fault pages in.
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
    assert_ne!(
        addr,
        libc::MAP_FAILED,
        "mmap: {}",
        std::io::Error::last_os_error()
    );
    let mut vec = vec![0u8; pages as usize];
    // SAFETY: `vec` has one byte per page of the mapping made above.
    let r = unsafe { libc::mincore(addr, len as usize, vec.as_mut_ptr()) };
    // SAFETY: unmaps exactly the mapping made above.
    unsafe { libc::munmap(addr, len as usize) };
    assert_eq!(r, 0, "mincore");
    vec.iter().filter(|&&b| b & 1 != 0).count() as u64
}

fn file_id(path: &Path) -> FileId {
    warmstart_replay::file_id(&warmstart_sys::FileIdentity::from_metadata(
        &fs::metadata(path).unwrap(),
    ))
}

fn plan(files: Vec<PlanFile>, entries: Vec<Entry>) -> Plan {
    Plan {
        meta: PlanMeta {
            command: vec!["test".into()],
            created_unix_ms: 0,
            traces: 1,
            min_traces: 1,
            passes: vec![],
            sorted: false,
        },
        files,
        lookups: vec![],
        entries,
    }
}

fn waiting() -> Options {
    Options {
        wait: Some(Duration::from_secs(60)),
        // The test machine may be small; the guard is tested with the mock.
        memory_floor: Some(0),
        ..Options::default()
    }
}

#[test]
fn root_replay_makes_an_evicted_file_resident() {
    require_root!(root_replay_makes_an_evicted_file_resident);
    let len = 8 * MIB;
    let f = evicted_file(len);
    let path = f.path().to_path_buf();
    let before = resident_pages(f.as_file(), len);
    assert!(before < 16, "eviction left {before} pages cached");

    let id = file_id(&path);
    let p = plan(
        vec![PlanFile {
            path: path.display().to_string(),
            id,
        }],
        // Out of offset order, as launch sequences are.
        vec![
            Entry::Data {
                file: 0,
                offset: 4 * MIB,
                len: 4 * MIB,
            },
            Entry::Data {
                file: 0,
                offset: 0,
                len: 4 * MIB,
            },
        ],
    );
    let r = replay(&p, &waiting(), &RealBackend::new()).unwrap();

    assert!(r.skipped_files.is_empty(), "{:?}", r.skipped_files);
    assert_eq!((r.data.entries, r.data.bytes), (2, len));
    let chunk = read_ahead_bytes(Path::new("/sys"), id.dev)
        .filter(|&b| b > 0)
        .unwrap_or(Options::DEFAULT_CHUNK)
        .min(Options::DEFAULT_MAX_REQUEST);
    assert_eq!(
        r.requests,
        2 * (4 * MIB).div_ceil(chunk),
        "one request per {chunk}-byte chunk"
    );
    let w = r.wait.expect("waited");
    assert!(!w.timed_out, "{w:?}");
    assert_eq!((w.pages, w.resident), (len / 4096, len / 4096));
    assert_eq!(
        resident_pages(f.as_file(), len),
        len / 4096,
        "mincore agrees"
    );
}

#[test]
fn root_file_modified_after_planning_is_skipped() {
    require_root!(root_file_modified_after_planning_is_skipped);
    let len = 2 * MIB;
    let f = evicted_file(len);
    let path = f.path().to_path_buf();
    let planned = file_id(&path);
    // A new mtime changes ctime too, as any write would; no data changes,
    // so only the identity check can notice.
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    f.as_file().set_modified(t).unwrap();
    let p = plan(
        vec![PlanFile {
            path: path.display().to_string(),
            id: planned,
        }],
        vec![Entry::Data {
            file: 0,
            offset: 0,
            len,
        }],
    );
    let r = replay(&p, &waiting(), &RealBackend::new()).unwrap();

    assert_eq!(r.data.bytes, 0);
    assert_eq!(r.skipped_files.len(), 1);
    let s = &r.skipped_files[0];
    assert_eq!((s.entries, s.bytes), (1, len));
    match &s.reason {
        SkipReason::Changed { fields, .. } => {
            assert_eq!(fields, &vec![IdField::Mtime, IdField::Ctime])
        }
        other => panic!("want changed, got {other:?}"),
    }
    assert!(
        resident_pages(f.as_file(), len) < 16,
        "a skipped file is not read"
    );
}

#[test]
fn root_missing_file_is_skipped() {
    require_root!(root_missing_file_is_skipped);
    let f = evicted_file(MIB);
    let path = f.path().to_path_buf();
    let id = file_id(&path);
    drop(f);
    let p = plan(
        vec![PlanFile {
            path: path.display().to_string(),
            id,
        }],
        vec![Entry::Data {
            file: 0,
            offset: 0,
            len: MIB,
        }],
    );
    let r = replay(&p, &waiting(), &RealBackend::new()).unwrap();
    assert_eq!(r.skipped_files.len(), 1);
    assert_eq!(r.skipped_files[0].reason, SkipReason::Missing);
}

/// A loop device attached to a scratch file, detached on drop.
struct Loop {
    dev: PathBuf,
    _backing: tempfile::NamedTempFile,
}

impl Loop {
    fn attach(len: u64) -> Result<Loop, String> {
        let backing = evicted_file(len);
        let out = Command::new("losetup")
            .args(["--direct-io=on", "--find", "--show"])
            .arg(backing.path())
            .output()
            .map_err(|e| format!("cannot run losetup: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "losetup failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let dev = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim().to_string());
        Ok(Loop {
            dev,
            _backing: backing,
        })
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
    }
}

#[test]
fn root_metadata_is_prefetched_into_the_block_devices_cache() {
    require_root!(root_metadata_is_prefetched_into_the_block_devices_cache);
    let lo = match Loop::attach(16 * MIB) {
        Ok(l) => l,
        Err(why) => {
            eprintln!("SKIPPED: root_metadata_is_prefetched_into_the_block_devices_cache ({why})");
            return;
        }
    };
    // Hold the device open for the whole test: the last close of an
    // unmounted block device drops its page cache, which would erase what
    // we want to observe (a mounted file system holds it open in real use).
    let held = OpenOptions::new().read(true).open(&lo.dev).unwrap();
    let meta = held.metadata().unwrap();
    assert!(meta.file_type().is_block_device());
    evict(&held);
    assert!(resident_pages(&held, 8 * MIB) < 16, "device cache evicted");

    let p = plan(
        vec![],
        vec![
            Entry::Meta {
                device: meta.rdev(),
                offset: 4 * MIB,
                len: 4 * MIB,
            },
            Entry::Meta {
                device: meta.rdev(),
                offset: 0,
                len: 4 * MIB,
            },
        ],
    );
    let r = replay(&p, &waiting(), &RealBackend::new()).unwrap();

    assert_eq!(r.skipped_devices, vec![], "loop devices can be opened");
    assert_eq!((r.meta.entries, r.meta.bytes), (2, 8 * MIB));
    let w = r.wait.expect("waited");
    assert!(!w.timed_out, "{w:?}");
    assert_eq!(w.resident, w.pages);
    assert_eq!(
        resident_pages(&held, 8 * MIB),
        8 * MIB / 4096,
        "mincore agrees"
    );
}
