//! Finding and removing what testbeds leave behind: mounts and loop
//! devices of processes that died without tearing down (SIGKILL, a crash,
//! a power cut of the bench host's session), and the cached images.
//!
//! Each testbed owns `/run/warmstart-testbed/<pid>-<n>/`: its mountpoints,
//! a `loops` file (one `device<TAB>backing file` line per loop it attached)
//! and an `image` file naming the cached image it uses. A directory whose
//! process is gone is a leftover; so is a loop device on a cached image
//! that nothing mounts.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::{fuse, image, sys, Error, Fs, RUN_DIR};

/// What [`cleanup`] removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CleanupReport {
    /// Mountpoints unmounted.
    pub unmounted: Vec<PathBuf>,
    /// Loop devices detached.
    pub detached: Vec<PathBuf>,
    /// Files and directories removed (run directories, images, manifests).
    pub removed: Vec<PathBuf>,
}

impl CleanupReport {
    /// Whether nothing was found.
    pub fn is_empty(&self) -> bool {
        self.unmounted.is_empty() && self.detached.is_empty() && self.removed.is_empty()
    }
}

pub(crate) fn record_loop(run_dir: &Path, dev: &Path, backing: &Path) {
    let path = run_dir.join("loops");
    if let Ok(mut f) = fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = writeln!(f, "{}\t{}", dev.display(), backing.display());
    }
}

pub(crate) fn record_image(run_dir: &Path, image: &Path) {
    let _ = fs::write(run_dir.join("image"), image.as_os_str().as_encoded_bytes());
}

/// The process id a run directory belongs to.
fn owner(dir_name: &str) -> Option<i32> {
    dir_name.split('-').next()?.parse().ok()
}

fn alive(pid: i32) -> bool {
    pid == std::process::id() as i32
        || nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
            != Err(nix::errno::Errno::ESRCH)
}

/// Unmounts everything under a run directory (the image's filesystem
/// first, the device model last), detaches the loops it recorded and
/// removes the directory. Never deletes files inside a mount: only empty
/// directories and the run directory's own records are removed.
pub(crate) fn remove_run_dir(run_dir: &Path) -> CleanupReport {
    let mut report = CleanupReport::default();
    let mut under: Vec<sys::MountEntry> = sys::mounts()
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.target.starts_with(run_dir))
        .collect();
    // Deepest first; the FUSE device model after everything that may sit
    // on it.
    under.sort_by_key(|m| {
        (
            m.fstype.starts_with("fuse"),
            std::cmp::Reverse(m.target.as_os_str().len()),
        )
    });
    let attached = sys::loops();
    let recorded = fs::read_to_string(run_dir.join("loops")).unwrap_or_default();
    let mut loops_done = false;
    for m in &under {
        if m.fstype.starts_with("fuse") && !loops_done {
            detach_recorded(&recorded, &attached, &mut report);
            loops_done = true;
        }
        if sys::unmount(&m.target).is_ok() {
            report.unmounted.push(m.target.clone());
        }
    }
    if !loops_done {
        detach_recorded(&recorded, &attached, &mut report);
    }
    for sub in ["root", "fuse", "build"] {
        let _ = fs::remove_dir(run_dir.join(sub));
    }
    for f in ["loops", "image"] {
        let _ = fs::remove_file(run_dir.join(f));
    }
    if fs::remove_dir(run_dir).is_ok() {
        report.removed.push(run_dir.to_path_buf());
    }
    report
}

fn detach_recorded(recorded: &str, attached: &[(PathBuf, PathBuf)], report: &mut CleanupReport) {
    for line in recorded.lines() {
        let Some((dev, backing)) = line.split_once('\t') else {
            continue;
        };
        let (dev, backing) = (Path::new(dev), Path::new(backing));
        // Only if the device still serves our file: the number may have been
        // reused by someone else since.
        if attached.iter().any(|(d, b)| d == dev && b == backing) && sys::loop_detach(dev).is_ok() {
            report.detached.push(dev.to_path_buf());
        }
    }
}

/// Removes the leftovers of testbeds whose process is gone: their mounts,
/// loop devices and run directories, and loop devices on images in
/// `cache_dir` that nothing mounts and no live testbed holds (its lock).
/// Safe to call while other testbeds run; [`crate::Testbed::prepare`] calls
/// it first, so a killed run's filesystem is never mounted twice.
pub fn cleanup_leftovers(cache_dir: &Path) -> Result<CleanupReport, Error> {
    let mut report = CleanupReport::default();
    if let Ok(dir) = fs::read_dir(RUN_DIR) {
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if owner(&name).is_some_and(|pid| !alive(pid)) {
                merge(&mut report, remove_run_dir(&e.path()));
            }
        }
    }

    // Loops on cached images that nothing mounts: attached by a process
    // that died between losetup and mount, or a build interrupted there.
    // A live `prepare` holds the image's lock from before it attaches
    // until its testbed is torn down, so its loops are never taken.
    let mounted: Vec<String> = sys::mounts()?.into_iter().map(|m| m.source).collect();
    for (dev, backing) in sys::loops() {
        if !backing.starts_with(cache_dir) || mounted.iter().any(|s| Path::new(s) == dev) {
            continue;
        }
        if building_pid(&backing).is_some_and(alive) {
            continue;
        }
        if Fs::ALL
            .into_iter()
            .any(|f| image::paths(cache_dir, f).0 == backing && locked(cache_dir, f))
        {
            continue;
        }
        if sys::loop_detach(&dev).is_ok() {
            report.detached.push(dev);
        }
    }
    Ok(report)
}

/// Whether a live testbed holds the image's lock.
fn locked(cache_dir: &Path, fs_type: Fs) -> bool {
    let lock_file = cache_dir.join(format!("testbed-{}.lock", fs_type.name()));
    lock_file.exists() && image::lock(cache_dir, fs_type).is_err()
}

/// [`cleanup_leftovers`], then removes the cached images, manifests and
/// lock files in `cache_dir` that no running testbed uses.
pub fn cleanup(cache_dir: &Path) -> Result<CleanupReport, Error> {
    let mut report = cleanup_leftovers(cache_dir)?;
    let mut in_use: Vec<PathBuf> = Vec::new();
    if let Ok(dir) = fs::read_dir(RUN_DIR) {
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if owner(&name).is_some_and(alive) {
                if let Ok(img) = fs::read_to_string(e.path().join("image")) {
                    in_use.push(PathBuf::from(img));
                }
            }
        }
    }
    let still_attached: Vec<PathBuf> = sys::loops().into_iter().map(|(_, b)| b).collect();

    for fs_type in Fs::ALL {
        let (img, manifest) = image::paths(cache_dir, fs_type);
        if in_use.contains(&img) || still_attached.contains(&img) {
            continue;
        }
        // Not while another process holds the image (it may be between
        // taking the lock and attaching).
        let lock_file = cache_dir.join(format!("testbed-{}.lock", fs_type.name()));
        let _lock = match lock_file.exists() {
            true => match image::lock(cache_dir, fs_type) {
                Ok(l) => Some(l),
                Err(_) => continue,
            },
            false => None,
        };
        for p in [img, manifest, lock_file] {
            if fs::remove_file(&p).is_ok() {
                report.removed.push(p);
            }
        }
    }
    if let Ok(dir) = fs::read_dir(cache_dir) {
        for e in dir.flatten() {
            let p = e.path();
            if building_pid(&p).is_some_and(|pid| !alive(pid))
                && !still_attached.contains(&p)
                && fs::remove_file(&p).is_ok()
            {
                report.removed.push(p);
            }
        }
    }
    Ok(report)
}

/// The builder's pid of a temporary image (`.NAME.building-PID`).
fn building_pid(path: &Path) -> Option<i32> {
    let name = path.file_name()?.to_string_lossy().into_owned();
    name.rsplit_once(".building-")?.1.parse().ok()
}

fn merge(into: &mut CleanupReport, from: CleanupReport) {
    into.unmounted.extend(from.unmounted);
    into.detached.extend(from.detached);
    into.removed.extend(from.removed);
}

/// Mounts and loop devices of testbeds that exist now, whoever owns them;
/// for tests and for `cleanup --dry-run`-style listings.
pub fn testbed_resources() -> (Vec<sys::MountEntry>, Vec<(PathBuf, PathBuf)>) {
    let mounts: Vec<sys::MountEntry> = sys::mounts()
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.target.starts_with(RUN_DIR) || m.fstype == format!("fuse.{}", fuse::FS_NAME))
        .collect();
    let loops = sys::loops()
        .into_iter()
        .filter(|(_, b)| b.starts_with(RUN_DIR) || b.to_string_lossy().contains("testbed-"))
        .collect();
    (mounts, loops)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_owners_and_builders() {
        assert_eq!(owner("1234-0"), Some(1234));
        assert_eq!(owner("junk"), None);
        assert_eq!(
            building_pid(Path::new("/c/.testbed-ext4.img.building-77")),
            Some(77)
        );
        assert_eq!(building_pid(Path::new("/c/testbed-ext4.img")), None);
    }

    #[test]
    fn own_process_is_alive() {
        assert!(alive(std::process::id() as i32));
    }
}
