//! Entering a testbed: a private mount namespace with the host's `/proc`,
//! `/sys` and `/dev`, fresh tmpfs on `/tmp` and `/run`, then chroot.
//!
//! Runs in the forked child before exec, so everything it needs is built
//! before the fork and [`Setup::enter`] makes raw syscalls only.

use std::ffi::{CStr, CString};
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr;

pub(crate) struct Setup {
    root: CString,
    binds: Vec<(CString, CString)>,
    tmpfs: Vec<CString>,
}

fn join(root: &CStr, sub: &str) -> CString {
    let mut v = root.to_bytes().to_vec();
    v.push(b'/');
    v.extend_from_slice(sub.as_bytes());
    CString::new(v).expect("no NUL in a path")
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl Setup {
    pub(crate) fn new(root: CString) -> Setup {
        let binds = ["proc", "sys", "dev"]
            .iter()
            .map(|d| {
                (
                    CString::new(format!("/{d}")).expect("no NUL"),
                    join(&root, d),
                )
            })
            .collect();
        let tmpfs = ["tmp", "run"].iter().map(|d| join(&root, d)).collect();
        Setup { root, binds, tmpfs }
    }

    /// Adds a bind mount of host path `host` at the same path inside.
    pub(crate) fn bind(&mut self, host: &Path) {
        let src = CString::new(host.as_os_str().as_bytes()).expect("no NUL in a path");
        let rel = host.strip_prefix("/").unwrap_or(host);
        let dst = join(&self.root, &rel.to_string_lossy());
        self.binds.push((src, dst));
    }

    /// Enters the testbed. Only for the child between fork and exec.
    pub(crate) fn enter(&self) -> io::Result<()> {
        // SAFETY: plain syscalls on NUL-terminated strings owned by `self`,
        // which outlives the calls; null pointers where the kernel takes
        // "none".
        unsafe {
            check(libc::unshare(libc::CLONE_NEWNS))?;
            // Without this, mounts below would propagate back to the host
            // when / is a shared mount (systemd makes it one).
            check(libc::mount(
                ptr::null(),
                c"/".as_ptr(),
                ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                ptr::null(),
            ))?;
            for dst in &self.tmpfs {
                check(libc::mount(
                    c"tmpfs".as_ptr(),
                    dst.as_ptr(),
                    c"tmpfs".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV,
                    c"mode=1777".as_ptr().cast(),
                ))?;
            }
            for (src, dst) in &self.binds {
                check(libc::mount(
                    src.as_ptr(),
                    dst.as_ptr(),
                    ptr::null(),
                    libc::MS_BIND | libc::MS_REC,
                    ptr::null(),
                ))?;
            }
            check(libc::chroot(self.root.as_ptr()))?;
            check(libc::chdir(c"/".as_ptr()))?;
        }
        Ok(())
    }
}

/// Creates, inside `root`, an empty directory or file at host path `host`'s
/// place, for a bind mount of `host`.
pub(crate) fn make_mountpoint(host: &Path, root: &Path) -> io::Result<()> {
    let inside = root.join(host.strip_prefix("/").unwrap_or(host));
    if fs::symlink_metadata(&inside).is_ok() {
        return Ok(());
    }
    if fs::metadata(host)?.is_dir() {
        fs::create_dir_all(&inside)
    } else {
        if let Some(parent) = inside.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::File::create(&inside).map(drop)
    }
}
