//! Sampling /proc for what a process tree has open or mapped. The fallback
//! backends see no open() events, so this is how they name files; the
//! mincore backend also learns *which* files to snapshot from it.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Every descendant of `root` (inclusive) currently alive, from /proc's PPid.
pub fn descendants(proc_root: &Path, root: u32) -> Vec<u32> {
    let mut parent_of: Vec<(u32, u32)> = Vec::new();
    if let Ok(rd) = std::fs::read_dir(proc_root) {
        for e in rd.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
                continue;
            };
            if let Some(ppid) = status
                .lines()
                .find_map(|l| l.strip_prefix("PPid:"))
                .and_then(|v| v.trim().parse::<u32>().ok())
            {
                parent_of.push((pid, ppid));
            }
        }
    }
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(parent_of.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    tree
}

/// A file a process has open or mapped.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Seen {
    pub dev: u64,
    pub ino: u64,
    pub path: String,
}

/// Regular files that `pid` has open (fd/) or mapped (maps).
pub fn files_of(proc_root: &Path, pid: u32, out: &mut HashSet<Seen>) {
    let base = proc_root.join(pid.to_string());
    if let Ok(rd) = std::fs::read_dir(base.join("fd")) {
        for e in rd.flatten() {
            if let (Ok(target), Ok(m)) = (std::fs::read_link(e.path()), std::fs::metadata(e.path()))
            {
                if m.is_file() && target.is_absolute() {
                    out.insert(Seen {
                        dev: m.dev(),
                        ino: m.ino(),
                        path: target.display().to_string(),
                    });
                }
            }
        }
    }
    if let Ok(maps) = std::fs::read_to_string(base.join("maps")) {
        out.extend(parse_maps(&maps).into_iter().filter_map(|(path, ino)| {
            let m = std::fs::metadata(&path).ok()?;
            (m.ino() == ino && m.is_file()).then(|| Seen {
                dev: m.dev(),
                ino,
                path,
            })
        }));
    }
}

/// (path, inode) of every file mapping in a /proc/PID/maps text.
pub fn parse_maps(maps: &str) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = Vec::new();
    for line in maps.lines() {
        let mut it = line.split_whitespace();
        let (Some(_), Some(_), Some(_), Some(_), Some(ino), Some(path)) = (
            it.next(),
            it.next(),
            it.next(),
            it.next(),
            it.next(),
            it.next(),
        ) else {
            continue;
        };
        let Ok(ino) = ino.parse::<u64>() else {
            continue;
        };
        if ino == 0 || !path.starts_with('/') || line.ends_with("(deleted)") {
            continue;
        }
        if !out.iter().any(|(p, _)| p == path) {
            out.push((path.to_string(), ino));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_parsing() {
        let maps = "\
55d0c0a00000-55d0c0a28000 r--p 00000000 fe:00 1311 /usr/bin/python3.11
55d0c0a28000-55d0c0b00000 r-xp 00028000 fe:00 1311 /usr/bin/python3.11
7f00-7f10 rw-p 00000000 00:00 0 
7f10-7f20 r--p 00000000 fe:00 77 /tmp/x (deleted)
7ffd-7ffe rw-p 00000000 00:00 0 [stack]
7f20-7f30 r--p 00000000 fe:00 99 /usr/lib/libc.so.6
";
        assert_eq!(
            parse_maps(maps),
            vec![
                ("/usr/bin/python3.11".to_string(), 1311),
                ("/usr/lib/libc.so.6".to_string(), 99)
            ]
        );
    }

    #[test]
    fn own_process_tree_and_files() {
        let me = std::process::id();
        let tree = descendants(Path::new("/proc"), me);
        assert_eq!(tree[0], me);
        let mut seen = HashSet::new();
        files_of(Path::new("/proc"), me, &mut seen);
        assert!(
            !seen.is_empty(),
            "a running test maps at least its own binary"
        );
    }
}
