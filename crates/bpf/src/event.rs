//! Decoding of ring-buffer records into owned Rust values. The layouts come
//! from the skeleton's generated `types` (which mirror `intf.h`).

use crate::skel::types;

/// WS_NAME_LEN in intf.h: bytes per path component.
const NAME_LEN: usize = 96;

/// How a page event saw the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PageKind {
    /// Inserted into the page cache: read from storage by this access.
    Added,
    /// Looked up by read()/splice (cached or about to be read).
    Read,
    /// Mapped by fault-around.
    Mapped,
    /// Faulted on through a file mapping.
    Fault,
}

/// Which path lookup a [`Event::PathOp`] was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PathOpKind {
    Open,
    Stat,
    Access,
    Readlink,
}

/// A path resolved in the kernel, basename first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WsPath {
    pub components: Vec<String>,
    /// The walk stopped before the root (too deep); the path is a suffix.
    pub truncated: bool,
}

impl WsPath {
    /// The absolute path, or `None` if the walk was truncated.
    pub fn absolute(&self) -> Option<String> {
        if self.truncated {
            return None;
        }
        let mut s = String::new();
        for c in self.components.iter().rev() {
            s.push('/');
            s.push_str(c);
        }
        if s.is_empty() {
            s.push('/');
        }
        Some(s)
    }
}

/// One record from the kernel. `ts_ns` is CLOCK_MONOTONIC; `dev` is the
/// kernel's encoding (major << 20 | minor).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Page {
        kind: PageKind,
        pid: u32,
        tgid: u32,
        ts_ns: u64,
        dev: u32,
        ino: u64,
        index: u64,
        count: u64,
    },
    Fork {
        parent_tgid: u32,
        child_tgid: u32,
        ts_ns: u64,
        comm: String,
    },
    Exec {
        tgid: u32,
        ts_ns: u64,
        file: FileInfo,
    },
    Exit {
        tgid: u32,
        ts_ns: u64,
    },
    Open {
        tgid: u32,
        ts_ns: u64,
        file: FileInfo,
    },
    DirRead {
        tgid: u32,
        ts_ns: u64,
        file: FileInfo,
    },
    PathOp {
        tgid: u32,
        ts_ns: u64,
        op: PathOpKind,
        ret: i32,
        path: String,
    },
}

/// What an open, exec or directory read resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileInfo {
    pub dev: u32,
    pub ino: u64,
    pub mode: u32,
    pub size: u64,
    pub path: WsPath,
}

fn cstr(bytes: &[i8]) -> String {
    // SAFETY: i8 and u8 have the same size and alignment; this only reinterprets.
    let b: &[u8] = unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast(), bytes.len()) };
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// Reads a `T` from the start of `data` if it is long enough.
fn read<T: Copy>(data: &[u8]) -> Option<T> {
    if data.len() < std::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: the length was checked above; every T used here is a plain C
    // struct of integers and byte arrays, valid for any bit pattern;
    // read_unaligned copes with the ring buffer's 8-byte alignment.
    Some(unsafe { std::ptr::read_unaligned(data.as_ptr().cast::<T>()) })
}

fn file_info(e: &types::ev_file) -> FileInfo {
    let depth = (e.path.depth as usize).min(e.path.comp.len() / NAME_LEN);
    FileInfo {
        dev: e.dev,
        ino: e.ino,
        mode: e.mode,
        size: e.size,
        path: WsPath {
            components: e.path.comp[..depth * NAME_LEN]
                .chunks(NAME_LEN)
                .map(cstr)
                .collect(),
            truncated: e.path.truncated != 0,
        },
    }
}

impl Event {
    /// Decodes one ring-buffer record; unknown or short records give `None`.
    pub fn decode(data: &[u8]) -> Option<Event> {
        let hdr: types::ev_hdr = read(data)?;
        let ts_ns = hdr.ts_ns;
        let tgid = hdr.tgid;
        let page = |kind| -> Option<Event> {
            let e: types::ev_page = read(data)?;
            Some(Event::Page {
                kind,
                pid: hdr.pid,
                tgid,
                ts_ns,
                dev: e.dev,
                ino: e.ino,
                index: e.index,
                count: e.count,
            })
        };
        match hdr.kind {
            1 => page(PageKind::Added),
            2 => page(PageKind::Read),
            3 => page(PageKind::Mapped),
            4 => page(PageKind::Fault),
            5 => {
                let e: types::ev_proc = read(data)?;
                Some(Event::Fork {
                    parent_tgid: tgid,
                    child_tgid: e.child_tgid,
                    ts_ns,
                    comm: cstr(&e.comm),
                })
            }
            6 | 8 | 10 => {
                let e: Box<types::ev_file> = Box::new(read(data)?);
                let file = file_info(&e);
                Some(match hdr.kind {
                    6 => Event::Exec { tgid, ts_ns, file },
                    8 => Event::Open { tgid, ts_ns, file },
                    _ => Event::DirRead { tgid, ts_ns, file },
                })
            }
            7 => Some(Event::Exit { tgid, ts_ns }),
            9 => {
                let e: types::ev_pathop = read(data)?;
                let op = match e.op {
                    1 => PathOpKind::Open,
                    2 => PathOpKind::Stat,
                    3 => PathOpKind::Access,
                    _ => PathOpKind::Readlink,
                };
                Some(Event::PathOp {
                    tgid,
                    ts_ns,
                    op,
                    ret: e.ret,
                    path: cstr(&e.path),
                })
            }
            _ => None,
        }
    }

    /// The process the event belongs to.
    pub fn tgid(&self) -> u32 {
        match self {
            Event::Page { tgid, .. }
            | Event::Exec { tgid, .. }
            | Event::Exit { tgid, .. }
            | Event::Open { tgid, .. }
            | Event::DirRead { tgid, .. }
            | Event::PathOp { tgid, .. } => *tgid,
            Event::Fork { parent_tgid, .. } => *parent_tgid,
        }
    }

    pub fn ts_ns(&self) -> u64 {
        match self {
            Event::Page { ts_ns, .. }
            | Event::Fork { ts_ns, .. }
            | Event::Exec { ts_ns, .. }
            | Event::Exit { ts_ns, .. }
            | Event::Open { ts_ns, .. }
            | Event::DirRead { ts_ns, .. }
            | Event::PathOp { ts_ns, .. } => *ts_ns,
        }
    }
}
