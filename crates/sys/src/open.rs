//! Opening a path that root did not create.
//!
//! warmstart runs as root and opens paths that unprivileged programs chose
//! (files a launch read, binaries it executed). Between recording and
//! opening, the path may have become a FIFO (a plain `open` for reading
//! blocks until a writer appears, forever), a device node (opening a tape
//! rewinds it, opening a watchdog arms it), a symlink to either, or a
//! directory. So a path is opened in two steps:
//!
//! 1. `open(O_PATH)`, with `O_NOFOLLOW` unless the caller allows a symlink
//!    in the final component. `O_PATH` walks the path and pins the inode
//!    but opens nothing: no driver's `open` runs, no FIFO waits.
//! 2. `fstat` of that descriptor: the kind of file (and, when asked, its
//!    identity and device number) is checked *before* anything is opened
//!    for reading. Only then is the same inode reopened through
//!    `/proc/self/fd/N`, which cannot be swapped in between, with
//!    `O_NONBLOCK | O_NOCTTY | O_CLOEXEC`, and checked again.
//!
//! Recorded paths name what the kernel resolved (`d_path`), which has no
//! symlinks, so a symlink there is a swap and is refused; paths a user
//! typed (an executable on `$PATH`, a udev `/dev/block` link) may follow
//! one.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::identity::{FileIdentity, FileKind, Match};
use crate::Error;

/// How to open a path; see the module documentation.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    kinds: Vec<FileKind>,
    follow: bool,
    expect: Option<(FileIdentity, Match)>,
    device: Option<u64>,
    flags: libc::c_int,
    noatime: bool,
    proc_fd: PathBuf,
}

/// An open file, with what `fstat` said about it before it was opened.
#[derive(Debug)]
pub struct Opened {
    pub file: File,
    pub identity: FileIdentity,
    pub kind: FileKind,
    pub metadata: std::fs::Metadata,
    /// Whether the file was opened with `O_NOATIME`: asked for with
    /// [`OpenOptions::noatime`] and allowed. Reading a directory opened
    /// without it updates its access time.
    pub noatime: bool,
}

impl OpenOptions {
    /// Accepts regular files only, does not follow a final symlink.
    pub fn file() -> OpenOptions {
        OpenOptions {
            kinds: vec![FileKind::Regular],
            follow: false,
            expect: None,
            device: None,
            flags: 0,
            noatime: false,
            proc_fd: PathBuf::from("/proc/self/fd"),
        }
    }

    /// Accepts directories only, does not follow a final symlink.
    pub fn directory() -> OpenOptions {
        OpenOptions::file().kinds(&[FileKind::Directory])
    }

    /// Accepts the block device `rdev` only (following a final symlink, as
    /// udev's `/dev/block/MAJ:MIN` links are). Opening a block device for
    /// reading has no side effect the page cache does not already have.
    pub fn block_device(rdev: u64) -> OpenOptions {
        let mut o = OpenOptions::file()
            .kinds(&[FileKind::BlockDevice])
            .follow_symlinks(true);
        o.device = Some(rdev);
        o
    }

    /// The kinds of file accepted.
    pub fn kinds(mut self, kinds: &[FileKind]) -> OpenOptions {
        self.kinds = kinds.to_vec();
        self
    }

    /// Whether a symlink in the final component is followed. Leave off for
    /// recorded paths.
    pub fn follow_symlinks(mut self, follow: bool) -> OpenOptions {
        self.follow = follow;
        self
    }

    /// Refuses the file unless its identity matches `id` as `how` says.
    pub fn expect(mut self, id: FileIdentity, how: Match) -> OpenOptions {
        self.expect = Some((id, how));
        self
    }

    /// Extra `open(2)` flags for the reading descriptor (`O_DIRECT`).
    pub fn custom_flags(mut self, flags: libc::c_int) -> OpenOptions {
        self.flags = flags;
        self
    }

    /// Opens with `O_NOATIME` where allowed (the owner, or `CAP_FOWNER`),
    /// so reading for a prefetch never writes an access time.
    pub fn noatime(mut self, on: bool) -> OpenOptions {
        self.noatime = on;
        self
    }

    /// Where `/proc/self/fd` is (tests point it elsewhere to see the
    /// reopen fail safely).
    pub fn proc_fd(mut self, dir: impl Into<PathBuf>) -> OpenOptions {
        self.proc_fd = dir.into();
        self
    }

    /// Opens `path` read-only if it passes every check.
    pub fn open(&self, path: impl AsRef<Path>) -> Result<Opened, Error> {
        let path = path.as_ref();
        let open_err = |source| Error::Open {
            path: path.to_path_buf(),
            source,
        };
        let stat_err = |source| Error::Stat {
            path: path.to_path_buf(),
            source,
        };
        let mut flags = libc::O_PATH;
        if !self.follow {
            flags |= libc::O_NOFOLLOW;
        }
        // std adds O_CLOEXEC; with O_PATH the kernel ignores the access mode.
        let pinned = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(flags)
            .open(path)
            .map_err(open_err)?;
        let (identity, kind, _) = FileIdentity::of_fd(&pinned).map_err(stat_err)?;
        if !self.kinds.contains(&kind) {
            return Err(Error::WrongKind {
                path: path.to_path_buf(),
                found: kind,
                wanted: self.wanted(),
            });
        }
        if let Some(wanted) = self.device {
            let found = {
                use std::os::unix::fs::MetadataExt;
                pinned.metadata().map_err(stat_err)?.rdev()
            };
            if found != wanted {
                return Err(Error::WrongDevice {
                    path: path.to_path_buf(),
                    found,
                    wanted,
                });
            }
        }
        if let Some((expected, how)) = self.expect {
            if !how.holds(&expected, &identity) {
                return Err(Error::Changed {
                    path: path.to_path_buf(),
                    expected,
                    found: identity,
                });
            }
        }
        let via = self.proc_fd.join(pinned.as_raw_fd().to_string());
        let mut flags = self.flags | libc::O_NONBLOCK | libc::O_NOCTTY;
        if kind == FileKind::Directory {
            flags |= libc::O_DIRECTORY;
        }
        let reopen = |flags| {
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(flags)
                .open(&via)
        };
        let (file, noatime) = if self.noatime {
            match reopen(flags | libc::O_NOATIME) {
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => (reopen(flags), false),
                r => (r, true),
            }
        } else {
            (reopen(flags), false)
        };
        let file = file.map_err(open_err)?;
        // The reopen went through procfs: make sure it reached the inode
        // checked above and not whatever a different procfs put there.
        let (found, _, metadata) = FileIdentity::of_fd(&file).map_err(stat_err)?;
        if !identity.same_inode(&found) {
            return Err(Error::Changed {
                path: path.to_path_buf(),
                expected: identity,
                found,
            });
        }
        Ok(Opened {
            file,
            identity: found,
            kind,
            metadata,
            noatime,
        })
    }

    fn wanted(&self) -> String {
        let names: Vec<String> = self.kinds.iter().map(|k| format!("a {k}")).collect();
        names.join(" or ")
    }
}

/// Opens a recorded path: a regular file, no final symlink, read-only.
pub fn open(path: impl AsRef<Path>) -> Result<Opened, Error> {
    OpenOptions::file().open(path)
}

/// The identity and kind of what `path` names, without opening it for
/// reading (`O_PATH`), following a final symlink only if `follow`.
pub fn inspect(path: impl AsRef<Path>, follow: bool) -> Result<(FileIdentity, FileKind), Error> {
    let path = path.as_ref();
    let mut flags = libc::O_PATH;
    if !follow {
        flags |= libc::O_NOFOLLOW;
    }
    let pinned = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
        .map_err(|source| Error::Open {
            path: path.to_path_buf(),
            source,
        })?;
    let (id, kind, _) = FileIdentity::of_fd(&pinned).map_err(|source| Error::Stat {
        path: path.to_path_buf(),
        source,
    })?;
    Ok((id, kind))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::time::Duration;

    /// Runs `f` on a thread and fails the test if it does not return in
    /// time: what these tests guard against is a hang.
    fn bounded<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(10))
            .expect("open did not return within 10 s: it blocked")
    }

    fn mkfifo(p: &Path) {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    }

    #[test]
    fn a_regular_file_opens_and_reads() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, b"hello").unwrap();
        let mut o = open(&p).unwrap();
        assert_eq!(o.kind, FileKind::Regular);
        assert!(!o.noatime, "not asked for");
        assert_eq!(o.identity.size, 5);
        let mut s = String::new();
        o.file.read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello");
        // With the identity it had: still opens.
        let id = o.identity;
        let o = OpenOptions::file()
            .expect(id, Match::Unchanged)
            .noatime(true)
            .open(&p)
            .unwrap();
        // The owner may always use O_NOATIME.
        assert!(o.noatime);
    }

    #[test]
    fn a_symlink_is_refused_unless_followed() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, b"x").unwrap();
        let l = d.path().join("l");
        std::os::unix::fs::symlink(&p, &l).unwrap();
        match open(&l) {
            Err(Error::WrongKind { found, path, .. }) => {
                assert_eq!(found, FileKind::Symlink);
                assert_eq!(path, l);
            }
            other => panic!("{other:?}"),
        }
        let o = OpenOptions::file().follow_symlinks(true).open(&l).unwrap();
        assert_eq!(o.kind, FileKind::Regular);
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("prog");
        mkfifo(&p);
        let q = p.clone();
        let r = bounded(move || open(&q).map(|_| ()));
        assert!(
            matches!(
                r,
                Err(Error::WrongKind {
                    found: FileKind::Fifo,
                    ..
                })
            ),
            "{r:?}"
        );
        // A symlink to it, followed: still refused, still not blocking.
        let l = d.path().join("l");
        std::os::unix::fs::symlink(&p, &l).unwrap();
        let r = bounded(move || {
            OpenOptions::file()
                .follow_symlinks(true)
                .open(&l)
                .map(|_| ())
        });
        assert!(
            matches!(
                r,
                Err(Error::WrongKind {
                    found: FileKind::Fifo,
                    ..
                })
            ),
            "{r:?}"
        );
        let (_, kind) = inspect(&p, false).unwrap();
        assert_eq!(kind, FileKind::Fifo);
    }

    #[test]
    fn a_symlink_to_dev_null_opens_no_device() {
        let d = tempfile::tempdir().unwrap();
        let l = d.path().join("l");
        std::os::unix::fs::symlink("/dev/null", &l).unwrap();
        let r = OpenOptions::file().follow_symlinks(true).open(&l);
        match r {
            Err(
                e @ Error::WrongKind {
                    found: FileKind::CharDevice,
                    ..
                },
            ) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("is a character device, not a regular file"),
                    "{msg}"
                );
                assert!(msg.contains(&l.display().to_string()), "{msg}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            open(&l),
            Err(Error::WrongKind {
                found: FileKind::Symlink,
                ..
            })
        ));
    }

    #[test]
    fn directories_only_when_asked() {
        let d = tempfile::tempdir().unwrap();
        assert!(matches!(
            open(d.path()),
            Err(Error::WrongKind {
                found: FileKind::Directory,
                ..
            })
        ));
        let o = OpenOptions::directory().open(d.path()).unwrap();
        assert_eq!(o.kind, FileKind::Directory);
        let p = d.path().join("f");
        std::fs::write(&p, b"x").unwrap();
        assert!(matches!(
            OpenOptions::directory().open(&p),
            Err(Error::WrongKind {
                found: FileKind::Regular,
                ..
            })
        ));
        let both = OpenOptions::file().kinds(&[FileKind::Regular, FileKind::Directory]);
        both.open(&p).unwrap();
        both.open(d.path()).unwrap();
    }

    #[test]
    fn a_changed_identity_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, b"one").unwrap();
        let before = open(&p).unwrap().identity;
        // Rewritten in place: same inode, so only Unchanged refuses it.
        std::fs::write(&p, b"two!").unwrap();
        OpenOptions::file()
            .expect(before, Match::Inode)
            .open(&p)
            .unwrap();
        match OpenOptions::file()
            .expect(before, Match::Unchanged)
            .open(&p)
        {
            Err(Error::Changed {
                expected, found, ..
            }) => {
                assert_eq!(expected, before);
                assert_eq!(found.size, 4);
            }
            other => panic!("{other:?}"),
        }
        // Replaced by another file: another inode.
        let q = d.path().join("g");
        std::fs::write(&q, b"one").unwrap();
        std::fs::rename(&q, &p).unwrap();
        assert!(matches!(
            OpenOptions::file().expect(before, Match::Inode).open(&p),
            Err(Error::Changed { .. })
        ));
    }

    #[test]
    fn a_missing_file_names_its_path() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("nothing");
        let e = open(&p).unwrap_err();
        assert!(
            matches!(&e, Error::Open { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
        );
        assert!(e.to_string().contains(&p.display().to_string()));
    }

    #[test]
    fn no_procfs_means_no_open() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, b"x").unwrap();
        let r = OpenOptions::file().proc_fd(d.path().join("none")).open(&p);
        assert!(matches!(r, Err(Error::Open { .. })), "{r:?}");
    }

    #[test]
    fn a_block_device_must_be_the_one_asked_for() {
        // /dev/null is a character device: refused as a block device.
        let r = OpenOptions::block_device(0).open("/dev/null");
        assert!(
            matches!(
                r,
                Err(Error::WrongKind {
                    found: FileKind::CharDevice,
                    ..
                })
            ),
            "{r:?}"
        );
    }
}
