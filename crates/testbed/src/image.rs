//! Filesystem images: built once from host paths, kept in the cache
//! directory with a manifest, reused while the manifest still matches.
//!
//! The manifest records the image's spec (filesystem, contents, size) and a
//! fingerprint of every source tree (entries, bytes, newest mtime and a sum
//! of per-entry checksums over path, size, mtime and mode), and the image
//! file's size. A later `prepare` recomputes the fingerprints (a metadata
//! walk, no file contents read) and rebuilds when anything differs. The
//! image is built under a temporary name and renamed into place, so an
//! interrupted build never leaves an image that looks valid.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::sys::{self, io_err};
use crate::{Error, Fs};

/// Bump when the image layout changes, so old images are rebuilt.
const MANIFEST_VERSION: u32 = 1;

/// Directories every image has for the chroot's mounts and scratch space.
pub(crate) const SKELETON: [&str; 8] = [
    "proc", "sys", "dev", "tmp", "run", "root", "home", "var/tmp",
];

/// What an image is built from; its identity in the manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageSpec {
    /// Filesystem type.
    pub fs: Fs,
    /// Absolute host paths copied in, at the same paths.
    pub contents: Vec<PathBuf>,
    /// Image size in bytes.
    pub size: u64,
}

/// A source tree's fingerprint.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    /// The tree's root.
    pub path: PathBuf,
    /// Entries (files, directories, links) in it.
    pub entries: u64,
    /// Sum of regular files' sizes.
    pub bytes: u64,
    /// Sum of allocated bytes (st_blocks * 512), each inode once.
    pub allocated: u64,
    /// Newest modification time, ns since the epoch.
    pub newest_mtime_ns: i128,
    /// Order-independent sum of each entry's CRC-32 over path, size,
    /// mtime and mode.
    pub checksum: u64,
}

/// The record kept next to an image.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Layout version ([`MANIFEST_VERSION`]).
    pub version: u32,
    /// What the image was built from.
    pub spec: ImageSpec,
    /// The source trees as they were when the image was built.
    pub sources: Vec<Fingerprint>,
    /// The image file's size.
    pub image_size: u64,
}

/// Fingerprints a tree without following symlinks or leaving its
/// filesystem. Unreadable directories count as entries without children.
pub fn fingerprint(root: &Path) -> Result<Fingerprint, Error> {
    let meta = fs::symlink_metadata(root).map_err(io_err(root))?;
    let mut fp = Fingerprint {
        path: root.to_path_buf(),
        ..Fingerprint::default()
    };
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![(root.to_path_buf(), meta)];
    let root_dev = stack[0].1.dev();
    while let Some((path, meta)) = stack.pop() {
        fp.entries += 1;
        let mtime = i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec());
        fp.newest_mtime_ns = fp.newest_mtime_ns.max(mtime);
        let mut h = crc32fast::Hasher::new();
        h.update(path.as_os_str().as_encoded_bytes());
        h.update(&meta.size().to_le_bytes());
        h.update(&mtime.to_le_bytes());
        h.update(&meta.mode().to_le_bytes());
        fp.checksum = fp.checksum.wrapping_add(u64::from(h.finalize()));
        if meta.is_file() {
            fp.bytes += meta.size();
        }
        if meta.nlink() == 1 || seen.insert((meta.dev(), meta.ino())) {
            fp.allocated += meta.blocks() * 512;
        }
        if meta.is_dir() && meta.dev() == root_dev {
            let Ok(dir) = fs::read_dir(&path) else {
                continue;
            };
            for e in dir.flatten() {
                if let Ok(m) = e.metadata() {
                    stack.push((e.path(), m));
                }
            }
        }
    }
    Ok(fp)
}

/// Default image size for the given sources: their allocated bytes plus
/// room for the filesystem's own metadata and what runs inside writes.
pub(crate) fn default_size(fs: Fs, sources: &[Fingerprint]) -> u64 {
    let data: u64 = sources.iter().map(|f| f.allocated).sum();
    // btrfs keeps metadata twice (DUP) and packs small files inline in it;
    // xfs refuses to make a filesystem under 300 MiB.
    let (num, den, min) = match fs {
        Fs::Ext4 => (5, 4, 64 << 20),
        Fs::Xfs => (5, 4, 320 << 20),
        Fs::Btrfs => (3, 2, 256 << 20),
    };
    let size = (data * num / den + (256 << 20)).max(min);
    size.div_ceil(1 << 20) << 20
}

/// Paths of an image and its manifest in the cache directory.
pub(crate) fn paths(cache_dir: &Path, fs: Fs) -> (PathBuf, PathBuf) {
    (
        cache_dir.join(format!("testbed-{}.img", fs.name())),
        cache_dir.join(format!("testbed-{}.json", fs.name())),
    )
}

/// Takes the image's lock (`testbed-<fs>.lock` in the cache directory),
/// without waiting.
pub(crate) fn lock(cache_dir: &Path, fs_type: Fs) -> Result<nix::fcntl::Flock<fs::File>, Error> {
    fs::create_dir_all(cache_dir).map_err(io_err(cache_dir))?;
    let path = cache_dir.join(format!("testbed-{}.lock", fs_type.name()));
    let file = fs::File::create(&path).map_err(io_err(&path))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(
        |(_, errno)| match errno {
            nix::errno::Errno::EWOULDBLOCK => Error::InUse(paths(cache_dir, fs_type).0),
            e => Error::Io {
                path,
                source: e.into(),
            },
        },
    )
}

/// The manifest if the image it describes is still valid for `spec` and
/// `sources`, else why it is not.
pub(crate) fn valid_manifest(
    image: &Path,
    manifest: &Path,
    spec: &ImageSpec,
    sources: &[Fingerprint],
) -> Result<Manifest, String> {
    let text = fs::read_to_string(manifest).map_err(|_| "no manifest".to_string())?;
    let m: Manifest = serde_json::from_str(&text).map_err(|e| format!("bad manifest: {e}"))?;
    let size = fs::metadata(image)
        .map_err(|_| "no image".to_string())?
        .len();
    if m.version != MANIFEST_VERSION {
        return Err(format!("manifest version {}", m.version));
    }
    if m.spec != *spec {
        return Err("the spec changed".to_string());
    }
    if m.image_size != size {
        return Err(format!("image size {size}, manifest says {}", m.image_size));
    }
    if m.sources.len() != sources.len() {
        return Err("the sources changed".to_string());
    }
    for (old, new) in m.sources.iter().zip(sources) {
        if old != new {
            return Err(format!("{} changed", new.path.display()));
        }
    }
    Ok(m)
}

/// Builds the image: mkfs, mount (in `work_dir`), copy, unmount; then the
/// manifest. On error nothing but the temporary file remains, and it is
/// removed too.
pub(crate) fn build(
    image: &Path,
    manifest_path: &Path,
    spec: &ImageSpec,
    sources: Vec<Fingerprint>,
    work_dir: &Path,
) -> Result<Manifest, Error> {
    let dir = image.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let tmp = dir.join(format!(
        ".{}.building-{}",
        image.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    let _ = fs::remove_file(manifest_path);
    let result = build_into(&tmp, spec, work_dir);
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    fs::rename(&tmp, image).map_err(io_err(image))?;
    let manifest = Manifest {
        version: MANIFEST_VERSION,
        spec: spec.clone(),
        sources,
        image_size: spec.size,
    };
    let json = serde_json::to_string_pretty(&manifest).expect("manifest serialises");
    fs::write(manifest_path, json).map_err(io_err(manifest_path))?;
    Ok(manifest)
}

fn build_into(tmp: &Path, spec: &ImageSpec, work_dir: &Path) -> Result<(), Error> {
    let file = fs::File::create(tmp).map_err(io_err(tmp))?;
    file.set_len(spec.size).map_err(io_err(tmp))?;
    drop(file);
    let mut mkfs = Command::new(format!("mkfs.{}", spec.fs.name()));
    match spec.fs {
        Fs::Ext4 => mkfs.args(["-F", "-q", "-L", "warmstart"]),
        Fs::Xfs => mkfs.args(["-f", "-q", "-L", "warmstart"]),
        Fs::Btrfs => mkfs.args(["-f", "-q", "-L", "warmstart"]),
    };
    sys::run(mkfs.arg(tmp))?;

    let mnt = work_dir.join("build");
    fs::create_dir_all(&mnt).map_err(io_err(&mnt))?;
    let dev = sys::loop_attach(tmp, false)?;
    crate::cleanup::record_loop(work_dir, &dev, tmp);
    let mounted = sys::mount_fs(&dev, &mnt, spec.fs.name());
    let copied = mounted.and_then(|()| {
        let copy = copy_contents(&spec.contents, &mnt);
        let unmounted = sys::unmount(&mnt);
        copy.and(unmounted)
    });
    let detached = sys::loop_detach(&dev);
    let _ = fs::remove_dir(&mnt);
    copied.and(detached)
}

/// Copies the sources into `dest` at their own paths with `cp -a` (modes,
/// owners, times, symlinks, hard links, extended attributes), one run per
/// parent directory so hard links among siblings (all of `/usr`, `/etc`,
/// ... share `/`) are kept; parents that do not exist yet are created with
/// the host's mode and owner. (`cp --parents -a` would do it in one run,
/// but coreutils 9.1, Debian 12's, fails on it.)
fn copy_contents(contents: &[PathBuf], dest: &Path) -> Result<(), Error> {
    let mut groups: Vec<(PathBuf, Vec<&PathBuf>)> = Vec::new();
    let mut sorted: Vec<&PathBuf> = contents.iter().collect();
    sorted.sort_by_key(|p| p.components().count());
    for p in sorted {
        let parent = p.parent().unwrap_or(Path::new("/")).to_path_buf();
        match groups.iter_mut().find(|(g, _)| *g == parent) {
            Some((_, v)) => v.push(p),
            None => groups.push((parent, vec![p])),
        }
    }
    for (parent, paths) in groups {
        let target = dest.join(parent.strip_prefix("/").unwrap_or(&parent));
        make_parents(&parent, dest)?;
        let mut cp = Command::new("cp");
        cp.arg("-a").args(paths).arg(&target);
        sys::run(&mut cp)?;
    }
    for d in SKELETON {
        let p = dest.join(d);
        if fs::symlink_metadata(&p).is_err() {
            fs::create_dir_all(&p).map_err(io_err(&p))?;
        }
    }
    for d in ["tmp", "var/tmp"] {
        let p = dest.join(d);
        if let Ok(m) = fs::metadata(&p) {
            if m.is_dir() {
                use std::os::unix::fs::PermissionsExt;
                fs::set_permissions(&p, fs::Permissions::from_mode(0o1777)).map_err(io_err(&p))?;
            }
        }
    }
    Ok(())
}

/// Creates `dest/dir` and its missing ancestors like the host's.
fn make_parents(dir: &Path, dest: &Path) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    let mut cur = dest.to_path_buf();
    let mut host = PathBuf::from("/");
    for c in dir.strip_prefix("/").unwrap_or(dir).components() {
        cur.push(c);
        host.push(c);
        if cur.exists() {
            continue;
        }
        fs::create_dir(&cur).map_err(io_err(&cur))?;
        if let Ok(m) = fs::metadata(&host) {
            fs::set_permissions(&cur, fs::Permissions::from_mode(m.mode() & 0o7777))
                .map_err(io_err(&cur))?;
            std::os::unix::fs::chown(&cur, Some(m.uid()), Some(m.gid())).map_err(io_err(&cur))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_changes_when_a_file_changes() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("a"), "one").unwrap();
        fs::create_dir(dir.path().join("sub")).unwrap();
        fs::write(dir.path().join("sub/b"), "two").unwrap();
        let before = fingerprint(dir.path()).unwrap();
        assert_eq!(before.entries, 4);
        assert_eq!(before.bytes, 6);
        assert_eq!(fingerprint(dir.path()).unwrap(), before);
        fs::write(dir.path().join("sub/b"), "three").unwrap();
        let after = fingerprint(dir.path()).unwrap();
        assert_ne!(after, before);
        assert_eq!(after.bytes, 8);
    }

    #[test]
    fn default_size_leaves_room_and_respects_minimums() {
        let fp = |allocated| Fingerprint {
            allocated,
            ..Fingerprint::default()
        };
        assert_eq!(default_size(Fs::Ext4, &[fp(0)]), 256 << 20);
        assert_eq!(default_size(Fs::Xfs, &[fp(0)]), 320 << 20);
        let big = default_size(Fs::Btrfs, &[fp(4 << 30)]);
        assert!(big >= (6u64 << 30) + (256 << 20));
        assert_eq!(big % (1 << 20), 0);
    }

    #[test]
    fn manifest_must_match_spec_sources_and_image() {
        let dir = tempfile::tempdir().unwrap();
        let (img, man) = paths(dir.path(), Fs::Ext4);
        let spec = ImageSpec {
            fs: Fs::Ext4,
            contents: vec![PathBuf::from("/etc")],
            size: 4096,
        };
        let sources = vec![Fingerprint::default()];
        fs::write(&img, vec![0u8; 4096]).unwrap();
        let m = Manifest {
            version: MANIFEST_VERSION,
            spec: spec.clone(),
            sources: sources.clone(),
            image_size: 4096,
        };
        fs::write(&man, serde_json::to_string(&m).unwrap()).unwrap();
        assert!(valid_manifest(&img, &man, &spec, &sources).is_ok());
        let other = ImageSpec {
            size: 8192,
            ..spec.clone()
        };
        assert!(valid_manifest(&img, &man, &other, &sources).is_err());
        let changed = vec![Fingerprint {
            entries: 1,
            ..Fingerprint::default()
        }];
        assert!(valid_manifest(&img, &man, &spec, &changed).is_err());
        fs::write(&img, vec![0u8; 100]).unwrap();
        assert!(valid_manifest(&img, &man, &spec, &sources).is_err());
    }
}
