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
    /// An exec that failed (a PATH search's misses).
    Exec,
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
        /// The binary the kernel runs: for a script, its interpreter.
        file: FileInfo,
        /// The new program's arguments as the kernel laid them out (a
        /// script's: interpreter, its argument if any, the script as given
        /// to execve, the original arguments), empty ones left out as
        /// `/proc/PID/cmdline` readers do. `None` when they did not fit the
        /// event or could not be read: `/proc` has them, unless the
        /// process has exec'd again since.
        argv: Option<Vec<String>>,
        /// The real uid the program runs as.
        uid: u32,
    },
    /// An execve entered, before the kernel looked anything up (watching
    /// execs only). It may fail; [`Event::Exec`] follows if it does not.
    ExecStart {
        tgid: u32,
        ts_ns: u64,
        /// The path as given to execve.
        filename: String,
        /// The arguments as given, `None` if they did not fit or could not
        /// be read.
        argv: Option<Vec<String>>,
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

/// Reads a `T` from `data`, zero past its end (for records that end early).
fn read_prefix<T: Copy>(data: &[u8]) -> T {
    let mut v = std::mem::MaybeUninit::<T>::zeroed();
    let n = data.len().min(std::mem::size_of::<T>());
    // SAFETY: at most size_of::<T>() bytes are copied into `v`, which is
    // zeroed first; every T used here is a plain C struct of integers and
    // byte arrays, valid for any bit pattern, zeroes included.
    unsafe {
        std::ptr::copy_nonoverlapping(data.as_ptr(), v.as_mut_ptr().cast::<u8>(), n);
        v.assume_init()
    }
}

/// The exec's arguments; `data_len` is the record's length, which the
/// arguments must lie within.
fn exec_args(e: &types::ev_exec, data_len: usize) -> Option<Vec<String>> {
    let room = data_len.saturating_sub(std::mem::offset_of!(types::ev_exec, args));
    split_args(&e.args, e.args_len, e.args_truncated, room)
}

/// NUL-separated arguments: the first `len` bytes of `args`, which must
/// lie within the `room` bytes the record carried.
fn split_args(args: &[i8], len: u32, truncated: u32, room: usize) -> Option<Vec<String>> {
    let len = len as usize;
    if truncated != 0 || len == 0 || len > args.len() || len > room {
        return None;
    }
    // SAFETY: i8 and u8 have the same size and alignment; this only reinterprets.
    let b: &[u8] = unsafe { std::slice::from_raw_parts(args.as_ptr().cast(), len) };
    split_cmdline(b)
}

/// NUL-separated arguments, as in `/proc/PID/cmdline`, empty ones left out;
/// `None` if there are none.
pub fn split_cmdline(b: &[u8]) -> Option<Vec<String>> {
    let argv: Vec<String> = b
        .split(|c| *c == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    (!argv.is_empty()).then_some(argv)
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
            6 => {
                // The record ends after the arguments it carries.
                if data.len() < std::mem::offset_of!(types::ev_exec, args) {
                    return None;
                }
                let e: Box<types::ev_exec> = Box::new(read_prefix(data));
                Some(Event::Exec {
                    tgid,
                    ts_ns,
                    file: file_info(&e.file),
                    argv: exec_args(&e, data.len()),
                    uid: e.uid,
                })
            }
            8 | 10 => {
                let e: Box<types::ev_file> = Box::new(read(data)?);
                let file = file_info(&e);
                Some(match hdr.kind {
                    8 => Event::Open { tgid, ts_ns, file },
                    _ => Event::DirRead { tgid, ts_ns, file },
                })
            }
            7 => Some(Event::Exit { tgid, ts_ns }),
            11 => {
                if data.len() < std::mem::offset_of!(types::ev_exec_start, args) {
                    return None;
                }
                let e: Box<types::ev_exec_start> = Box::new(read_prefix(data));
                let room = data
                    .len()
                    .saturating_sub(std::mem::offset_of!(types::ev_exec_start, args));
                Some(Event::ExecStart {
                    tgid,
                    ts_ns,
                    filename: cstr(&e.filename),
                    argv: split_args(&e.args, e.args_len, e.args_truncated, room),
                })
            }
            9 => {
                let e: types::ev_pathop = read(data)?;
                let op = match e.op {
                    1 => PathOpKind::Open,
                    2 => PathOpKind::Stat,
                    3 => PathOpKind::Access,
                    4 => PathOpKind::Readlink,
                    5 => PathOpKind::Exec,
                    _ => return None,
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
            | Event::ExecStart { tgid, .. }
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
            | Event::ExecStart { ts_ns, .. }
            | Event::Exit { ts_ns, .. }
            | Event::Open { ts_ns, .. }
            | Event::DirRead { ts_ns, .. }
            | Event::PathOp { ts_ns, .. } => *ts_ns,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exec_with(args: &[u8], truncated: u32) -> types::ev_exec {
        // SAFETY: a C struct of integers and byte arrays; all zeroes is valid.
        let mut e: types::ev_exec = unsafe { std::mem::zeroed() };
        for (d, s) in e.args.iter_mut().zip(args) {
            *d = *s as _;
        }
        e.args_len = args.len() as u32;
        e.args_truncated = truncated;
        e
    }

    #[test]
    fn exec_arguments_as_the_kernel_laid_them_out() {
        // A script run by dash: interpreter, the script as given, its arguments.
        let e = exec_with(b"/bin/sh\0./launch.sh\0\0--x\0", 0);
        let full = std::mem::size_of::<types::ev_exec>();
        assert_eq!(
            exec_args(&e, full),
            Some(vec!["/bin/sh".into(), "./launch.sh".into(), "--x".into()])
        );
        // Cut short or unreadable: /proc has them instead.
        assert_eq!(exec_args(&exec_with(b"/bin/sh\0./la", 1), full), None);
        assert_eq!(exec_args(&exec_with(b"", 0), full), None);
        let mut bad = exec_with(b"a\0", 0);
        bad.args_len = u32::MAX;
        assert_eq!(exec_args(&bad, full), None);
        // A record that ends before the arguments it claims.
        let at = std::mem::offset_of!(types::ev_exec, args);
        assert_eq!(exec_args(&exec_with(b"/bin/true\0", 0), at + 4), None);
        assert!(exec_args(&exec_with(b"/bin/true\0", 0), at + 10).is_some());
    }
}
