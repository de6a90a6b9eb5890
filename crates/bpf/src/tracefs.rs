//! Finding (and if need be mounting) tracefs, which classic tracepoints and
//! the tracefs-text fallback need.

use std::io;
use std::path::{Path, PathBuf};

const TRACEFS: &str = "/sys/kernel/tracing";
const DEBUGFS_TRACING: &str = "/sys/kernel/debug/tracing";

/// The tracefs mount in use.
pub fn tracefs_root() -> PathBuf {
    if Path::new(TRACEFS).join("events").exists() {
        PathBuf::from(TRACEFS)
    } else if Path::new(DEBUGFS_TRACING).join("events").exists() {
        PathBuf::from(DEBUGFS_TRACING)
    } else {
        PathBuf::from(TRACEFS)
    }
}

/// Mounts tracefs at /sys/kernel/tracing if no tracefs is reachable.
pub fn ensure_tracefs() -> io::Result<()> {
    if tracefs_root().join("events").exists() {
        return Ok(());
    }
    let src = c"nodev";
    let target = c"/sys/kernel/tracing";
    let fstype = c"tracefs";
    // SAFETY: all pointers are valid NUL-terminated strings; data may be NULL.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
