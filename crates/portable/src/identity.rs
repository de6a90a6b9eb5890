//! A file's content identity: what holds across machines with the same
//! bytes. The digest covers only the ranges a plan reads, so that checking
//! a plan costs the I/O its replay would do anyway, not whole files.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use sha2::Digest;
use warmstart_plan::trace::FileId;

use crate::Error;

/// Byte ranges `(offset, len)` of one file, sorted, merged and clamped to
/// `size`: the same set gives the same digest whatever the plan's order.
pub fn normalize(ranges: &[(u64, u64)], size: u64) -> Vec<(u64, u64)> {
    let mut r: Vec<(u64, u64)> = ranges
        .iter()
        .filter(|&&(o, _)| o < size)
        .map(|&(o, l)| (o, o.saturating_add(l).min(size)))
        .filter(|&(o, e)| e > o)
        .collect();
    r.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(r.len());
    for (o, e) in r {
        match out.last_mut() {
            Some((_, end)) if o <= *end => *end = (*end).max(e),
            _ => out.push((o, e)),
        }
    }
    out.into_iter().map(|(o, e)| (o, e - o)).collect()
}

/// A local file opened for checking, with its identity as `stat` gives it.
pub struct Local {
    pub file: File,
    pub id: FileId,
}

/// Opens `path` without following a final symlink (a recorded path names
/// the file itself), without blocking (a FIFO planted at the path would
/// hang the open) and checks it is a regular file before reading anything.
pub fn open_local(path: &Path) -> Result<Local, Error> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    let m = file.metadata().map_err(|e| Error::io(path, e))?;
    if !m.file_type().is_file() {
        return Err(Error::NotRegular {
            path: path.to_path_buf(),
        });
    }
    let id = FileId {
        dev: m.dev(),
        ino: m.ino(),
        size: m.size(),
        mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
        ctime_ns: m.ctime() * 1_000_000_000 + m.ctime_nsec(),
    };
    Ok(Local { file, id })
}

/// SHA-256 over each range of `ranges` (already [`normalize`]d): its
/// offset and length, little-endian, then its bytes. A file shorter than a
/// range reads as different, not as an error.
pub fn digest_ranges(file: &mut File, path: &Path, ranges: &[(u64, u64)]) -> Result<String, Error> {
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    for &(off, len) in ranges {
        h.update(off.to_le_bytes());
        h.update(len.to_le_bytes());
        file.seek(SeekFrom::Start(off))
            .map_err(|e| Error::io(path, e))?;
        let mut left = len;
        while left > 0 {
            let want = left.min(buf.len() as u64) as usize;
            let n = file
                .read(&mut buf[..want])
                .map_err(|e| Error::io(path, e))?;
            if n == 0 {
                // Shrunk meanwhile: mark the digest as not the exporter's.
                h.update(b"short");
                break;
            }
            h.update(&buf[..n]);
            left -= n as u64;
        }
    }
    Ok(crate::hex(&h.finalize()))
}

/// The GNU build-id of an ELF file, in hex, if it has one. Only 64- and
/// 32-bit little-endian ELF with the note in a PT_NOTE segment (what
/// linkers write); anything else is simply "none".
pub fn build_id(file: &mut File) -> Option<String> {
    let mut eh = [0u8; 64];
    file.seek(SeekFrom::Start(0)).ok()?;
    file.read_exact(&mut eh).ok()?;
    if &eh[..4] != b"\x7fELF" || eh[5] != 1 {
        return None;
    }
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as u64;
    let u32_at = |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap()) as u64;
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let wide = match eh[4] {
        1 => false,
        2 => true,
        _ => return None,
    };
    let (phoff, phentsize, phnum) = if wide {
        (u64_at(&eh, 32), u16_at(&eh, 54), u16_at(&eh, 56))
    } else {
        (u32_at(&eh, 28), u16_at(&eh, 42), u16_at(&eh, 44))
    };
    if phnum > 256 || !(32..=64).contains(&phentsize) {
        return None;
    }
    let mut ph = vec![0u8; (phentsize * phnum) as usize];
    file.seek(SeekFrom::Start(phoff)).ok()?;
    file.read_exact(&mut ph).ok()?;
    for p in ph.chunks(phentsize as usize) {
        if u32_at(p, 0) != 4 {
            continue; // not PT_NOTE
        }
        let (off, size) = if wide {
            (u64_at(p, 8), u64_at(p, 32))
        } else {
            (u32_at(p, 4), u32_at(p, 16))
        };
        if size > 1 << 16 {
            continue;
        }
        let mut notes = vec![0u8; size as usize];
        file.seek(SeekFrom::Start(off)).ok()?;
        file.read_exact(&mut notes).ok()?;
        let mut i = 0usize;
        while i + 12 <= notes.len() {
            let namesz = u32_at(&notes, i) as usize;
            let descsz = u32_at(&notes, i + 4) as usize;
            let kind = u32_at(&notes, i + 8);
            let name_at = i + 12;
            let desc_at = name_at + namesz.div_ceil(4) * 4;
            let end = desc_at.checked_add(descsz.div_ceil(4) * 4)?;
            if desc_at + descsz > notes.len() {
                break;
            }
            // NT_GNU_BUILD_ID, owner "GNU\0".
            if kind == 3 && notes.get(name_at..name_at + namesz) == Some(b"GNU\0") {
                return Some(crate::hex(&notes[desc_at..desc_at + descsz]));
            }
            i = end;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_sorted_merged_and_clamped() {
        // (ranges, size, expected)
        type Ranges<'a> = &'a [(u64, u64)];
        let cases: [(Ranges, u64, Ranges); 5] = [
            (&[(0, 4096)], 10_000, &[(0, 4096)]),
            (
                &[(8192, 4096), (0, 4096)],
                10_000,
                &[(0, 4096), (8192, 1808)],
            ),
            (
                &[(0, 4096), (4096, 4096), (2048, 100)],
                1 << 20,
                &[(0, 8192)],
            ),
            (&[(20_000, 4096)], 10_000, &[]),
            (&[(0, u64::MAX)], 100, &[(0, 100)]),
        ];
        for (ranges, size, want) in cases {
            assert_eq!(normalize(ranges, size), want, "{ranges:?} of {size}");
        }
    }

    #[test]
    fn digest_sees_only_the_ranges_and_a_change_inside_them() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        let mut bytes = vec![7u8; 20_000];
        std::fs::write(&p, &bytes).unwrap();
        let r = normalize(&[(0, 4096)], 20_000);
        let dig = |p: &Path| digest_ranges(&mut open_local(p).unwrap().file, p, &r).unwrap();
        let a = dig(&p);
        bytes[10_000] = 1; // outside the range
        std::fs::write(&p, &bytes).unwrap();
        assert_eq!(dig(&p), a);
        bytes[100] = 1; // inside
        std::fs::write(&p, &bytes).unwrap();
        assert_ne!(dig(&p), a);
    }

    #[test]
    fn symlinks_and_fifos_are_not_opened_as_files() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("f");
        std::fs::write(&f, b"x").unwrap();
        let l = d.path().join("l");
        std::os::unix::fs::symlink(&f, &l).unwrap();
        assert!(open_local(&l).is_err());
        let fifo = d.path().join("p");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(matches!(open_local(&fifo), Err(Error::NotRegular { .. })));
        assert!(open_local(d.path()).is_err());
    }

    #[test]
    fn build_id_of_this_test_binary_or_none() {
        let exe = std::env::current_exe().unwrap();
        let mut f = File::open(&exe).unwrap();
        // Rust's linker is asked for a build-id on Debian; either way the
        // parser must not fail on a real ELF, and a non-ELF has none.
        if let Some(id) = build_id(&mut f) {
            assert!(id.len() >= 16 && id.chars().all(|c| c.is_ascii_hexdigit()));
        }
        let d = tempfile::tempdir().unwrap();
        let t = d.path().join("t");
        std::fs::write(&t, b"#!/bin/sh\n").unwrap();
        assert_eq!(build_id(&mut File::open(&t).unwrap()), None);
        let sh = Path::new("/bin/sh");
        if sh.exists() {
            let id = build_id(&mut File::open(sh).unwrap());
            assert!(id.is_some(), "Debian's /bin/sh has a build-id");
        }
    }
}
