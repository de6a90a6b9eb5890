//! Naming what the kernel reports by number: (dev, ino) -> path and file
//! identity, and telling filesystem metadata (pages of a block device's own
//! mapping) from file data.
//!
//! Paths come first from the kernel (opens and execs resolved at the time);
//! the files the kernel opens by itself (the ELF interpreter) are found from
//! the exec'd binaries' PT_INTERP, and anything left by looking for the
//! inode next to files already named on the same device. Every name is
//! confirmed with stat(): the identity stored is what is on disk now.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use warmstart_plan::trace::{FileId, FileInfo, FileType};

/// The kernel's dev_t (major << 20 | minor) as user space's st_dev.
pub fn kdev_to_user(kdev: u64) -> u64 {
    let major = (kdev >> 20) as u32;
    let minor = (kdev & 0xfffff) as u32;
    libc::makedev(major, minor)
}

/// What a page event belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A file's data; `dev` in st_dev numbering.
    Data { dev: u64 },
    /// A block device's own page cache: filesystem metadata.
    Meta { device: u64 },
}

/// Classifies page events. Block-device mappings live on the kernel's
/// internal "bdev" filesystem (an anonymous device, major 0, never mounted),
/// and their inode number is the device number of the disk.
#[derive(Debug, Clone)]
pub struct Classifier {
    block_devices: HashSet<(u32, u32)>,
    mounted: HashSet<u64>,
}

impl Classifier {
    /// Reads `/sys/dev/block` and `/proc/self/mountinfo` under `root`.
    pub fn new(root: &Path) -> Classifier {
        let mut block_devices = HashSet::new();
        if let Ok(rd) = std::fs::read_dir(root.join("sys/dev/block")) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some((a, b)) = name.split_once(':') {
                    if let (Ok(a), Ok(b)) = (a.parse(), b.parse()) {
                        block_devices.insert((a, b));
                    }
                }
            }
        }
        let mounted = std::fs::read_to_string(root.join("proc/self/mountinfo"))
            .map(|s| parse_mountinfo_devs(&s))
            .unwrap_or_default();
        Classifier {
            block_devices,
            mounted,
        }
    }

    /// `kdev` and `ino` as the page tracepoints report them.
    pub fn classify(&self, kdev: u64, ino: u64) -> Class {
        let dev = kdev_to_user(kdev);
        if kdev >> 20 == 0 && !self.mounted.contains(&dev) {
            let (maj, min) = ((ino >> 20) as u32, (ino & 0xfffff) as u32);
            if self.block_devices.contains(&(maj, min)) {
                return Class::Meta {
                    device: libc::makedev(maj, min),
                };
            }
        }
        Class::Data { dev }
    }
}

/// The st_dev of every mounted filesystem, from mountinfo's "MAJ:MIN" field.
pub fn parse_mountinfo_devs(mountinfo: &str) -> HashSet<u64> {
    mountinfo
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .filter_map(|mm| {
            let (a, b) = mm.split_once(':')?;
            Some(libc::makedev(a.parse().ok()?, b.parse().ok()?))
        })
        .collect()
}

/// Collects names seen during a recording and resolves (dev, ino) at the end.
#[derive(Debug, Default)]
pub struct Resolver {
    names: HashMap<(u64, u64), String>,
    execs: Vec<String>,
}

impl Resolver {
    pub fn new() -> Self {
        Self::default()
    }

    /// A path the kernel resolved for (dev, ino) (st_dev numbering).
    pub fn note(&mut self, dev: u64, ino: u64, path: String) {
        self.names.entry((dev, ino)).or_insert(path);
    }

    /// A binary that was exec'd; its ELF interpreter is looked up later.
    pub fn note_exec(&mut self, path: String) {
        if !self.execs.contains(&path) {
            self.execs.push(path);
        }
    }

    /// Names every requested (dev, ino). Call once, after recording.
    pub fn resolve_all(&mut self, wanted: &[(u64, u64)]) -> HashMap<(u64, u64), FileInfo> {
        let mut out = HashMap::new();
        let mut missing: Vec<(u64, u64)> = Vec::new();
        for &key in wanted {
            match self.names.get(&key).and_then(|p| identify(p, key)) {
                Some(info) => {
                    out.insert(key, info);
                }
                None => missing.push(key),
            }
        }
        if missing.is_empty() {
            return out;
        }
        // The ELF interpreters of the exec'd binaries.
        for exe in self.execs.clone() {
            if let Some(interp) = elf_interpreter(Path::new(&exe)) {
                if let Ok(canon) = std::fs::canonicalize(&interp) {
                    let canon = canon.display().to_string();
                    if let Ok((id, _)) = warmstart_sys::open::inspect(&canon, false) {
                        self.note(id.dev, id.ino, canon);
                    }
                }
            }
        }
        missing.retain(
            |key| match self.names.get(key).and_then(|p| identify(p, *key)) {
                Some(info) => {
                    out.insert(*key, info);
                    false
                }
                None => true,
            },
        );
        // Last resort: the inode next to files already named on that device.
        if !missing.is_empty() {
            let mut dirs: Vec<(u64, PathBuf)> = Vec::new();
            for ((dev, _), p) in &self.names {
                if let Some(d) = Path::new(p).parent() {
                    if !dirs.iter().any(|(dv, x)| dv == dev && x == d) {
                        dirs.push((*dev, d.to_path_buf()));
                    }
                }
            }
            for (dev, dir) in dirs {
                if missing.iter().all(|(d, _)| *d != dev) {
                    continue;
                }
                let Ok(rd) = std::fs::read_dir(&dir) else {
                    continue;
                };
                for e in rd.flatten() {
                    let Ok(m) = e.metadata() else { continue };
                    let key = (m.dev(), m.ino());
                    if let Some(i) = missing.iter().position(|k| *k == key) {
                        let p = e.path().display().to_string();
                        if let Some(info) = identify(&p, key) {
                            out.insert(key, info);
                            missing.swap_remove(i);
                        }
                    }
                }
                if missing.is_empty() {
                    break;
                }
            }
        }
        out
    }
}

/// What `path` names now, if it is still the inode (dev, ino) the kernel
/// reported. The path is not followed if it became a symlink (recorded
/// paths have none) and nothing is opened for reading, so a swapped-in
/// FIFO or device costs one `O_PATH` open and an `fstat`.
pub fn identify(path: &str, key: (u64, u64)) -> Option<FileInfo> {
    let (id, kind) = warmstart_sys::open::inspect(path, false).ok()?;
    if (id.dev, id.ino) != key && !(id.ino == key.1 && btrfs_subvolume_dev(path, id.dev, key.0)) {
        return None;
    }
    Some(FileInfo {
        path: Some(path.to_string()),
        id: file_id_of(id),
        file_type: file_type_of(kind),
    })
}

/// Whether `stat_dev` and `kernel_dev` name the same btrfs filesystem.
/// The page tracepoints report a btrfs inode by its superblock's device,
/// but `stat` gives the device of its subvolume (another anonymous
/// device), so the two never match and no btrfs file would be named.
/// The file's identity is then taken from `stat`, which is what a replay
/// checks. Inode numbers are per subvolume, so with several subvolumes
/// mounted one kernel (dev, ino) may be two files; the first name seen
/// wins, as for any name.
fn btrfs_subvolume_dev(path: &str, stat_dev: u64, kernel_dev: u64) -> bool {
    /// `BTRFS_SUPER_MAGIC` from `<linux/magic.h>`.
    const BTRFS_SUPER_MAGIC: i64 = 0x9123_683e;
    if libc::major(stat_dev) != 0 || libc::major(kernel_dev) != 0 {
        return false;
    }
    let Ok(c) = std::ffi::CString::new(path) else {
        return false;
    };
    // SAFETY: statfs writes into the zeroed struct it is given; `c` is a
    // valid NUL-terminated path.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return false;
    }
    st.f_type as i64 == BTRFS_SUPER_MAGIC
}

/// A file's identity from its metadata.
pub fn file_id(m: &std::fs::Metadata) -> FileId {
    file_id_of(warmstart_sys::FileIdentity::from_metadata(m))
}

/// The trace's form of an identity from [`warmstart_sys`].
pub fn file_id_of(id: warmstart_sys::FileIdentity) -> FileId {
    FileId {
        dev: id.dev,
        ino: id.ino,
        size: id.size,
        mtime_ns: id.mtime_ns,
        ctime_ns: id.ctime_ns,
    }
}

/// The [`warmstart_sys`] form of a trace's identity.
pub fn identity_of(id: &FileId) -> warmstart_sys::FileIdentity {
    warmstart_sys::FileIdentity {
        dev: id.dev,
        ino: id.ino,
        size: id.size,
        mtime_ns: id.mtime_ns,
        ctime_ns: id.ctime_ns,
    }
}

fn file_type_of(kind: warmstart_sys::FileKind) -> FileType {
    use warmstart_sys::FileKind as K;
    match kind {
        K::Regular => FileType::Regular,
        K::Directory => FileType::Directory,
        K::Symlink => FileType::Symlink,
        _ => FileType::Other,
    }
}

/// The PT_INTERP of an ELF binary, if it has one. Reads only the start of
/// the file: the header, program headers and interpreter path sit in its
/// first page in practice, and a whole binary would be a cold read of
/// megabytes at the end of every recording.
///
/// `path` is an executed path the kernel reported, which an unprivileged
/// program may since have replaced: it is opened through
/// [`warmstart_sys::open`] (no final symlink, a regular file only, checked
/// before any read), so a FIFO or a device there is never opened.
pub fn elf_interpreter(path: &Path) -> Option<String> {
    use goblin::elf::program_header;
    use std::io::Read;
    let mut head = vec![0u8; 16 * 1024];
    let mut f = warmstart_sys::open(path).ok()?.file;
    let n = f.read(&mut head).ok()?;
    head.truncate(n);
    let h = goblin::elf::Elf::parse_header(&head).ok()?;
    let ctx = goblin::container::Ctx::new(
        if h.e_ident[goblin::elf::header::EI_CLASS] == goblin::elf::header::ELFCLASS64 {
            goblin::container::Container::Big
        } else {
            goblin::container::Container::Little
        },
        goblin::container::Endian::Little,
    );
    let phdrs =
        program_header::ProgramHeader::parse(&head, h.e_phoff as usize, h.e_phnum as usize, ctx)
            .ok()?;
    let interp = phdrs
        .iter()
        .find(|p| p.p_type == program_header::PT_INTERP)?;
    let (start, len) = (interp.p_offset as usize, interp.p_filesz as usize);
    let raw = head.get(start..start.checked_add(len)?)?;
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    std::str::from_utf8(&raw[..end]).ok().map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_dev_encoding() {
        assert_eq!(kdev_to_user((254 << 20) | 1), libc::makedev(254, 1));
        assert_eq!(kdev_to_user(3), libc::makedev(0, 3));
    }

    #[test]
    fn metadata_is_told_from_data() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("sys/dev/block/254:0")).unwrap();
        std::fs::create_dir_all(root.path().join("sys/dev/block/7:0")).unwrap();
        std::fs::create_dir_all(root.path().join("proc/self")).unwrap();
        std::fs::write(
            root.path().join("proc/self/mountinfo"),
            "22 1 254:0 / / rw - ext4 /dev/vda rw\n40 22 0:35 / /mnt/b rw - btrfs /dev/loop1 rw\n",
        )
        .unwrap();
        let c = Classifier::new(root.path());
        let cases = [
            (
                "bdev page of vda",
                3,
                (254 << 20),
                Class::Meta {
                    device: libc::makedev(254, 0),
                },
            ),
            (
                "bdev page of loop0",
                3,
                (7 << 20),
                Class::Meta {
                    device: libc::makedev(7, 0),
                },
            ),
            (
                "ext4 file",
                254 << 20,
                12,
                Class::Data {
                    dev: libc::makedev(254, 0),
                },
            ),
            (
                "btrfs (anon dev) inode that looks like a devno",
                35,
                (7 << 20),
                Class::Data {
                    dev: libc::makedev(0, 35),
                },
            ),
            (
                "bdev ino of an unknown device",
                3,
                (9 << 20) | 9,
                Class::Data {
                    dev: libc::makedev(0, 3),
                },
            ),
        ];
        for (name, kdev, ino, want) in cases {
            assert_eq!(c.classify(kdev, ino), want, "{name}");
        }
    }

    #[test]
    fn resolves_by_kernel_name_then_sibling() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        std::fs::write(&a, b"a").unwrap();
        std::fs::write(&b, b"b").unwrap();
        let ma = std::fs::metadata(&a).unwrap();
        let mb = std::fs::metadata(&b).unwrap();
        let mut r = Resolver::new();
        r.note(ma.dev(), ma.ino(), a.display().to_string());
        let got = r.resolve_all(&[
            (ma.dev(), ma.ino()),
            (mb.dev(), mb.ino()),
            (ma.dev(), 1 << 40),
        ]);
        assert_eq!(
            got[&(ma.dev(), ma.ino())].path.as_deref(),
            Some(a.to_str().unwrap())
        );
        assert_eq!(
            got[&(mb.dev(), mb.ino())].path.as_deref(),
            Some(b.to_str().unwrap())
        );
        assert!(!got.contains_key(&(ma.dev(), 1 << 40)));
    }

    #[test]
    fn interpreter_of_a_real_binary() {
        // /bin/sh is often a symlink; recorded paths never are.
        let sh = std::fs::canonicalize("/bin/sh").unwrap();
        let interp = elf_interpreter(&sh).expect("/bin/sh is dynamic");
        assert!(interp.contains("ld-linux"), "{interp}");
    }

    #[test]
    fn a_swapped_executable_is_not_opened() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("prog");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        let (f, dir) = (fifo.clone(), d.path().to_path_buf());
        std::thread::spawn(move || {
            let link = dir.join("link");
            std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
            let _ = tx.send((
                elf_interpreter(&f),
                elf_interpreter(&link),
                elf_interpreter(&dir),
            ));
        });
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("elf_interpreter blocked on a FIFO");
        assert_eq!(got, (None, None, None));
        // Its identity is read without opening it, and is not the one a
        // recorded (dev, ino) of another file would have.
        let m = std::fs::symlink_metadata(&fifo).unwrap();
        assert!(identify(fifo.to_str().unwrap(), (m.dev(), m.ino())).is_some());
        assert!(identify(fifo.to_str().unwrap(), (m.dev(), m.ino() + 1)).is_none());
    }
}
