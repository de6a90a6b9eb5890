//! A file's identity as `fstat` reports it, and the kind of file a path
//! names. Two identities with the same (dev, ino) are the same inode; the
//! same inode with the same size, mtime and ctime is, as far as the kernel
//! can tell us cheaply, the same content.

use std::fmt;
use std::fs::Metadata;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};

/// What `fstat` says a file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    Regular,
    Directory,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

impl FileKind {
    pub fn of(m: &Metadata) -> FileKind {
        let t = m.file_type();
        if t.is_file() {
            FileKind::Regular
        } else if t.is_dir() {
            FileKind::Directory
        } else if t.is_symlink() {
            FileKind::Symlink
        } else if t.is_fifo() {
            FileKind::Fifo
        } else if t.is_socket() {
            FileKind::Socket
        } else if t.is_block_device() {
            FileKind::BlockDevice
        } else {
            FileKind::CharDevice
        }
    }
}

impl fmt::Display for FileKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FileKind::Regular => "regular file",
            FileKind::Directory => "directory",
            FileKind::Symlink => "symlink",
            FileKind::Fifo => "FIFO",
            FileKind::Socket => "socket",
            FileKind::CharDevice => "character device",
            FileKind::BlockDevice => "block device",
        })
    }
}

/// (dev, ino, size, mtime, ctime) of a file, from `fstat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FileIdentity {
    /// `st_dev`.
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

impl FileIdentity {
    pub fn from_metadata(m: &Metadata) -> FileIdentity {
        FileIdentity {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
            ctime_ns: m.ctime() * 1_000_000_000 + m.ctime_nsec(),
        }
    }

    /// `fstat` of an open descriptor (an `O_PATH` one is enough): the
    /// identity and kind of exactly the inode held, whatever its path now
    /// names.
    pub fn of_fd(fd: impl AsFd) -> std::io::Result<(FileIdentity, FileKind, Metadata)> {
        use std::os::fd::{AsRawFd, FromRawFd};
        // SAFETY: the descriptor is open for as long as `fd` is borrowed,
        // which outlives this call; ManuallyDrop keeps the temporary File
        // from closing what it does not own. No dup: this is on the
        // replay's path to its first request.
        let f = std::mem::ManuallyDrop::new(unsafe {
            std::fs::File::from_raw_fd(fd.as_fd().as_raw_fd())
        });
        let m = f.metadata()?;
        Ok((FileIdentity::from_metadata(&m), FileKind::of(&m), m))
    }

    /// Same inode: (dev, ino) are equal.
    pub fn same_inode(&self, other: &FileIdentity) -> bool {
        (self.dev, self.ino) == (other.dev, other.ino)
    }

    /// Same inode, not modified since: size, mtime and ctime equal too.
    pub fn unchanged(&self, other: &FileIdentity) -> bool {
        self == other
    }
}

impl fmt::Display for FileIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "dev {:#x} ino {} size {} mtime {} ctime {}",
            self.dev, self.ino, self.size, self.mtime_ns, self.ctime_ns
        )
    }
}

/// How strictly [`crate::OpenOptions::expect`] compares identities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Match {
    /// The same (dev, ino).
    Inode,
    /// The same (dev, ino), size, mtime and ctime.
    Unchanged,
}

impl Match {
    pub fn holds(self, expected: &FileIdentity, found: &FileIdentity) -> bool {
        match self {
            Match::Inode => expected.same_inode(found),
            Match::Unchanged => expected.unchanged(found),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_follows_the_inode_and_its_changes() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, b"one").unwrap();
        let f = std::fs::File::open(&p).unwrap();
        let (a, kind, _) = FileIdentity::of_fd(&f).unwrap();
        assert_eq!(kind, FileKind::Regular);
        assert_eq!(a.size, 3);
        assert_eq!(
            a,
            FileIdentity::from_metadata(&std::fs::metadata(&p).unwrap())
        );
        // Rewritten in place: same inode, changed content.
        std::fs::write(&p, b"three").unwrap();
        let (b, _, _) = FileIdentity::of_fd(&f).unwrap();
        assert!(a.same_inode(&b));
        assert!(!a.unchanged(&b));
        assert!(Match::Inode.holds(&a, &b));
        assert!(!Match::Unchanged.holds(&a, &b));
        // Replaced by another file: another inode.
        let q = d.path().join("g");
        std::fs::write(&q, b"three").unwrap();
        std::fs::rename(&q, &p).unwrap();
        let c = FileIdentity::from_metadata(&std::fs::metadata(&p).unwrap());
        assert!(!b.same_inode(&c));
    }
}
