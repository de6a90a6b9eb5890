//! Where warmstart's binaries are, relative to each other. `warmstart`,
//! the small front users run, hands every command but a prefetched launch
//! to `warmstart-core`; the benchmark's testbed needs both inside.

use std::path::{Path, PathBuf};

/// The full binary's file name.
pub const CORE_BIN: &str = "warmstart-core";

/// `../lib/warmstart` from the binary's directory.
pub fn lib_dir(exe: &Path) -> PathBuf {
    let dir = exe.parent().unwrap_or(Path::new("/"));
    dir.parent().unwrap_or(dir).join("lib/warmstart")
}

/// The core for the front at `exe`: beside it, else in `../lib/warmstart/`.
pub fn core_binary(exe: &Path) -> Option<PathBuf> {
    let beside = exe.parent().map(|d| d.join(CORE_BIN));
    beside
        .into_iter()
        .chain(std::iter::once(lib_dir(exe).join(CORE_BIN)))
        .find(|p| is_executable(p))
}

/// The front's file name.
pub const FRONT_BIN: &str = "warmstart";

/// The front that hands over to the core at `core`: beside it (the build
/// tree), else in `../../bin/` (`/usr/lib/warmstart` → `/usr/bin`). `None`
/// when `core` is not named as the core (a binary that is not split).
pub fn front_binary(core: &Path) -> Option<PathBuf> {
    if core.file_name()? != CORE_BIN {
        return None;
    }
    let dir = core.parent()?;
    let up = dir.parent().and_then(Path::parent).map(|d| d.join("bin"));
    std::iter::once(dir.to_path_buf())
        .chain(up)
        .map(|d| d.join(FRONT_BIN))
        .find(|p| is_executable(p))
}

/// A regular file some user may execute.
pub fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn exe(p: &Path, mode: u32) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn the_core_beside_first_then_in_lib() {
        let d = tempfile::tempdir().unwrap();
        let front = d.path().join("usr/bin/warmstart");
        assert_eq!(core_binary(&front), None);
        let in_lib = d.path().join("usr/lib/warmstart").join(CORE_BIN);
        exe(&in_lib, 0o755);
        assert_eq!(core_binary(&front), Some(in_lib));
        let beside = d.path().join("usr/bin").join(CORE_BIN);
        exe(&beside, 0o755);
        assert_eq!(core_binary(&front), Some(beside));
    }

    #[test]
    fn the_front_of_a_core_beside_it_then_in_bin() {
        let d = tempfile::tempdir().unwrap();
        let core = d.path().join("usr/lib/warmstart").join(CORE_BIN);
        exe(&core, 0o755);
        assert_eq!(front_binary(&core), None);
        let in_bin = d.path().join("usr/bin").join(FRONT_BIN);
        exe(&in_bin, 0o755);
        assert_eq!(front_binary(&core), Some(in_bin.clone()));
        let beside = d.path().join("usr/lib/warmstart").join(FRONT_BIN);
        exe(&beside, 0o755);
        assert_eq!(front_binary(&core), Some(beside));
        // Only the core has a front.
        assert_eq!(front_binary(&in_bin), None);
    }

    #[test]
    fn a_core_that_cannot_run_is_not_found() {
        let d = tempfile::tempdir().unwrap();
        let front = d.path().join("bin/warmstart");
        exe(&d.path().join("bin").join(CORE_BIN), 0o644);
        std::fs::create_dir_all(d.path().join("lib/warmstart").join(CORE_BIN)).unwrap();
        assert_eq!(core_binary(&front), None);
    }
}
