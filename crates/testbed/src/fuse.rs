//! A FUSE filesystem holding one file, `image`, that serves the testbed's
//! image through a [`DeviceModel`]: each read or write waits for a queue
//! slot, then completes when the model's clock says, however fast the real
//! image answered. The loop device sits on this file with direct I/O, so
//! every block request of the testbed's filesystem reaches the model (the
//! open reply sets FOPEN_DIRECT_IO as well, so the kernel never caches the
//! file even if the loop falls back to buffered I/O).
//!
//! The fuser session thread only dispatches; `queue_depth` worker threads
//! serve requests, so requests beyond the queue depth wait their turn as
//! they would at a device: in the order they came, or for a disk with a
//! head, in the order the host's I/O scheduler would send them, and where
//! the host's scheduler would merge the waiting requests that touch, as
//! one (the loop device has no scheduler of its own to keep a queue).
//! The kernel is asked for asynchronous direct I/O (FUSE_ASYNC_DIO) and a
//! background limit above every profile's queue depth, so it really keeps
//! that many requests in flight.

use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    consts, BackgroundSession, FileAttr, FileType, Filesystem, KernelConfig, MountOption,
    ReplyAttr, ReplyData, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, Request,
};

use crate::profile::{DeviceClock, DeviceModel};
use crate::Error;

/// Name of the served file inside the FUSE mount.
pub const IMAGE_NAME: &str = "image";
/// Filesystem name shown in /proc/mounts (`fuse.<name>` as its type).
pub const FS_NAME: &str = "warmstart-testbed";

const ROOT_INO: u64 = 1;
const IMAGE_INO: u64 = 2;
const TTL: Duration = Duration::from_secs(3600);

enum Job {
    Read {
        offset: u64,
        size: u32,
        reply: ReplyData,
    },
    Write {
        offset: u64,
        data: Vec<u8>,
        reply: ReplyWrite,
    },
}

struct ModelFs {
    size: u64,
    jobs: Sender<Job>,
    uid: u32,
    gid: u32,
}

impl ModelFs {
    fn attr(&self, ino: u64) -> FileAttr {
        let now = SystemTime::now();
        let (kind, perm, size, nlink) = if ino == ROOT_INO {
            (FileType::Directory, 0o755, 0, 2)
        } else {
            (FileType::RegularFile, 0o600, self.size, 1)
        };
        FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }
}

impl Filesystem for ModelFs {
    fn init(&mut self, _req: &Request<'_>, config: &mut KernelConfig) -> Result<(), libc::c_int> {
        // Without ASYNC_DIO the kernel sends a direct read's pieces one after
        // another, and a queue depth above 1 could never be reached.
        let _ = config.add_capabilities(consts::FUSE_ASYNC_DIO);
        let _ = config.set_max_background(128);
        let _ = config.set_congestion_threshold(96);
        let _ = config.set_max_write(1024 * 1024);
        Ok(())
    }

    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        if parent == ROOT_INO && name == IMAGE_NAME {
            reply.entry(&TTL, &self.attr(IMAGE_INO), 0);
        } else {
            reply.error(libc::ENOENT);
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        match ino {
            ROOT_INO | IMAGE_INO => reply.attr(&TTL, &self.attr(ino)),
            _ => reply.error(libc::ENOENT),
        }
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, _flags: i32, reply: ReplyOpen) {
        if ino == IMAGE_INO {
            reply.opened(0, consts::FOPEN_DIRECT_IO);
        } else {
            reply.error(libc::EISDIR);
        }
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        _fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        let job = Job::Read {
            offset: offset.max(0) as u64,
            size,
            reply,
        };
        if let Err(mpsc::SendError(Job::Read { reply, .. })) = self.jobs.send(job) {
            reply.error(libc::EIO);
        }
    }

    fn write(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        _fh: u64,
        offset: i64,
        data: &[u8],
        _write_flags: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyWrite,
    ) {
        let job = Job::Write {
            offset: offset.max(0) as u64,
            data: data.to_vec(),
            reply,
        };
        if let Err(mpsc::SendError(Job::Write { reply, .. })) = self.jobs.send(job) {
            reply.error(libc::EIO);
        }
    }

    fn fsync(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _ds: bool, reply: ReplyEmpty) {
        // Writes are written through to the real image before they are
        // acknowledged; its durability is not what the testbed models.
        reply.ok();
    }
}

/// Serves requests the scheduler merged into one (one request if none
/// was): the model decides when they complete, as one request, the real
/// image provides the bytes.
fn serve(image: &File, clock: &DeviceClock, jobs: Vec<Job>) {
    let Some(first) = jobs.first() else {
        return;
    };
    let bytes = jobs.iter().map(Job::len).sum();
    let done = clock.schedule(Instant::now(), first.offset(), bytes);
    let mut results = Vec::with_capacity(jobs.len());
    for job in jobs {
        let result = match &job {
            Job::Read { offset, size, .. } => read_full(image, *offset, *size),
            Job::Write { offset, data, .. } => {
                image.write_all_at(data, *offset).map(|()| Vec::new())
            }
        };
        results.push((job, result));
    }
    sleep_until(done);
    for (job, result) in results {
        let errno = |e: std::io::Error| e.raw_os_error().unwrap_or(libc::EIO);
        match (job, result) {
            (Job::Read { reply, .. }, Ok(buf)) => reply.data(&buf),
            (Job::Read { reply, .. }, Err(e)) => reply.error(errno(e)),
            (Job::Write { data, reply, .. }, Ok(_)) => reply.written(data.len() as u32),
            (Job::Write { reply, .. }, Err(e)) => reply.error(errno(e)),
        }
    }
}

/// Reads up to `size` bytes at `offset`, fewer only at the image's end.
fn read_full(image: &File, offset: u64, size: u32) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; size as usize];
    let mut filled = 0;
    while filled < buf.len() {
        match image.read_at(&mut buf[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(filled);
    Ok(buf)
}

/// Requests received and not yet served, with when each came.
struct Queue {
    rx: Receiver<Job>,
    waiting: Vec<(Instant, Job)>,
}

/// How long a read may wait behind requests nearer the head: mq-deadline's
/// `read_expire`.
const READ_EXPIRE: Duration = Duration::from_millis(500);

impl Job {
    fn offset(&self) -> u64 {
        match self {
            Job::Read { offset, .. } | Job::Write { offset, .. } => *offset,
        }
    }

    fn len(&self) -> u64 {
        match self {
            Job::Read { size, .. } => u64::from(*size),
            Job::Write { data, .. } => data.len() as u64,
        }
    }

    /// Where it starts and ends on the device, and whether it reads.
    fn extent(&self) -> Extent {
        Extent {
            start: self.offset(),
            end: self.offset() + self.len(),
            read: matches!(self, Job::Read { .. }),
        }
    }
}

impl Queue {
    /// The next requests to serve, as one; `None` once the filesystem is
    /// gone. The host's I/O scheduler would keep this queue (the loop
    /// device in front of this server has none: it passes every request
    /// on at once). A device without a head serves requests as they come;
    /// for a disk they are served as mq-deadline would: the nearest ahead
    /// of the head, sweeping up and starting again from the lowest, unless
    /// the oldest has waited `READ_EXPIRE`. Where the model merges, the
    /// waiting requests that touch the one picked go with it.
    fn next(&mut self, clock: &DeviceClock) -> Option<Vec<Job>> {
        if self.waiting.is_empty() {
            let job = self.rx.recv().ok()?;
            self.waiting.push((Instant::now(), job));
        }
        while let Ok(job) = self.rx.try_recv() {
            self.waiting.push((Instant::now(), job));
        }
        let pick = match clock.head() {
            Some(head) if self.waiting[0].0.elapsed() < READ_EXPIRE => {
                elevator(head, self.waiting.iter().map(|(_, j)| j.offset()))
            }
            _ => 0,
        };
        let extents: Vec<Extent> = self.waiting.iter().map(|(_, j)| j.extent()).collect();
        let mut run = merged_run(pick, &extents, clock.model().merge);
        // Take them out from the back so the indices stay valid, then put
        // them in device order.
        run.sort_unstable_by(|a, b| b.cmp(a));
        let mut jobs: Vec<Job> = run.into_iter().map(|i| self.waiting.remove(i).1).collect();
        jobs.sort_by_key(Job::offset);
        Some(jobs)
    }
}

/// A waiting request's place on the device.
#[derive(Clone, Copy, Debug)]
struct Extent {
    start: u64,
    end: u64,
    read: bool,
}

/// Which waiting requests are served with the one at `pick`: those of the
/// same direction that extend it at either end, one after another, while
/// the whole stays within `limit` bytes (0: none).
fn merged_run(pick: usize, waiting: &[Extent], limit: u64) -> Vec<usize> {
    let mut run = vec![pick];
    let Extent {
        mut start,
        mut end,
        read,
    } = waiting[pick];
    loop {
        let next = waiting.iter().enumerate().find(|&(i, e)| {
            e.read == read
                && !run.contains(&i)
                && (e.start == end || e.end == start)
                && e.end.max(end) - e.start.min(start) <= limit
        });
        let Some((i, e)) = next else {
            return run;
        };
        run.push(i);
        start = start.min(e.start);
        end = end.max(e.end);
    }
}

/// Which of the waiting requests (their offsets, oldest first) a disk's
/// scheduler serves next with its head at `head`: the nearest at or ahead
/// of it, else the lowest (a one-way sweep).
fn elevator(head: u64, offsets: impl Iterator<Item = u64> + Clone) -> usize {
    let ahead = offsets.clone().enumerate().filter(|&(_, o)| o >= head);
    ahead
        .min_by_key(|&(_, o)| o)
        .or_else(|| offsets.enumerate().min_by_key(|&(_, o)| o))
        .map_or(0, |(i, _)| i)
}

fn worker(file: &File, clock: &DeviceClock, queue: &Mutex<Queue>) {
    loop {
        let jobs = match queue.lock().unwrap_or_else(|e| e.into_inner()).next(clock) {
            Some(jobs) => jobs,
            None => return,
        };
        serve(file, clock, jobs);
    }
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        thread::sleep(t - now);
    }
}

/// A mounted model filesystem; unmounted and its workers stopped on drop.
pub struct ModelMount {
    session: Option<BackgroundSession>,
    workers: Vec<JoinHandle<()>>,
    mountpoint: PathBuf,
}

impl ModelMount {
    /// Mounts the model filesystem serving `image` at `mountpoint`.
    pub fn mount(image: &Path, mountpoint: &Path, model: DeviceModel) -> Result<ModelMount, Error> {
        let file = File::options()
            .read(true)
            .write(true)
            .open(image)
            .map_err(crate::sys::io_err(image))?;
        let size = file.metadata().map_err(crate::sys::io_err(image))?.len();
        let file = Arc::new(file);
        let clock = Arc::new(DeviceClock::new(model, size, Instant::now()));
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(Queue {
            rx,
            waiting: Vec::new(),
        }));
        let workers = (0..model.queue_depth.max(1))
            .map(|i| {
                let (file, clock, rx) = (file.clone(), clock.clone(), rx.clone());
                thread::Builder::new()
                    .name(format!("testbed-dev{i}"))
                    .spawn(move || {
                        // Wake up when the model says, not up to 50 us later
                        // (the default timer slack).
                        // SAFETY: PR_SET_TIMERSLACK takes an integer and
                        // affects only the calling thread.
                        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1, 0, 0, 0) };
                        worker(&file, &clock, &rx)
                    })
                    .map_err(|source| Error::Spawn {
                        program: "FUSE worker thread".into(),
                        source,
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let fs = ModelFs {
            size,
            jobs: tx,
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
        };
        let options = [
            MountOption::FSName(FS_NAME.into()),
            MountOption::Subtype(FS_NAME.into()),
            MountOption::RW,
            MountOption::NoAtime,
        ];
        let session =
            fuser::spawn_mount2(fs, mountpoint, &options).map_err(|source| Error::Mount {
                source_path: image.to_path_buf(),
                target: mountpoint.to_path_buf(),
                source,
            })?;
        Ok(ModelMount {
            session: Some(session),
            workers,
            mountpoint: mountpoint.to_path_buf(),
        })
    }

    /// Path of the served image file.
    pub fn image_path(&self) -> PathBuf {
        self.mountpoint.join(IMAGE_NAME)
    }

    /// Unmounts and stops the workers (also done on drop). When the image
    /// is still in use (a loop device whose detach the kernel deferred) the
    /// mount is detached lazily and the server threads keep answering until
    /// the kernel releases the file, then end on their own.
    pub fn unmount(&mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        match nix::mount::umount2(&self.mountpoint, nix::mount::MntFlags::empty()) {
            Ok(()) => {
                // The connection is gone: the session thread ends, dropping
                // the filesystem and with it the job sender, so the workers'
                // receive fails and they return.
                session.join();
                for w in self.workers.drain(..) {
                    let _ = w.join();
                }
            }
            Err(_) => {
                let _ = nix::mount::umount2(&self.mountpoint, nix::mount::MntFlags::MNT_DETACH);
                drop(session);
                self.workers.clear();
            }
        }
    }
}

impl Drop for ModelMount {
    fn drop(&mut self) {
        self.unmount();
    }
}

#[cfg(test)]
mod tests {
    use super::{elevator, merged_run, Extent};

    fn read(start: u64, end: u64) -> Extent {
        Extent {
            start,
            end,
            read: true,
        }
    }

    #[test]
    fn requests_that_touch_the_one_picked_go_with_it() {
        let w = [
            read(100, 200),
            read(0, 100),
            read(300, 400),
            read(200, 300),
            read(500, 600),
        ];
        // Front and back merges, one after another: 0..400 in one request.
        let mut run = merged_run(0, &w, 1 << 20);
        run.sort();
        assert_eq!(run, vec![0, 1, 2, 3]);
        // Not past the limit: two pieces fit in 200 bytes, a third would not.
        let mut run = merged_run(0, &w, 200);
        run.sort();
        assert_eq!(run.len(), 2, "{run:?}");
        // No scheduler queue: alone.
        assert_eq!(merged_run(0, &w, 0), vec![0]);
        // A write next to a read stays apart.
        let mixed = [
            read(0, 100),
            Extent {
                start: 100,
                end: 200,
                read: false,
            },
        ];
        assert_eq!(merged_run(0, &mixed, 1 << 20), vec![0]);
    }

    #[test]
    fn a_disk_serves_the_nearest_request_ahead_then_sweeps_again() {
        let q = [900u64, 100, 500, 300];
        // Head at 200: 300 is the nearest ahead, then 500, then 900.
        assert_eq!(elevator(200, q.iter().copied()), 3);
        assert_eq!(elevator(301, q.iter().copied()), 2);
        assert_eq!(elevator(501, q.iter().copied()), 0);
        // Past every request: back to the lowest.
        assert_eq!(elevator(901, q.iter().copied()), 1);
        // A request exactly at the head goes first.
        assert_eq!(elevator(500, q.iter().copied()), 2);
    }
}
