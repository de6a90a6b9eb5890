//! Issuing prefetches: opening the file a stream is read from, and the
//! thread that sends its WILLNEED requests.

use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use warmstart_record::resolve::kdev_to_user;

use super::PAGE;

/// One WILLNEED request, cut into `chunk`-page pieces when issued.
pub(super) struct Job {
    pub(super) file: Arc<File>,
    pub(super) first: u64,
    pub(super) count: u64,
    pub(super) chunk: u64,
}

/// The thread that issues prefetches, so a full block-layer queue never
/// stalls the event loop.
pub(super) struct Worker {
    tx: Option<mpsc::Sender<Job>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    pub(super) fn start() -> Self {
        let (tx, rx) = mpsc::channel::<Job>();
        let stop = Arc::new(AtomicBool::new(false));
        let halt = stop.clone();
        let thread = std::thread::spawn(move || {
            for job in rx {
                let mut at = job.first;
                let end = job.first + job.count;
                while at < end && !halt.load(Ordering::Relaxed) {
                    let n = job.chunk.max(1).min(end - at);
                    // A failure leaves the pages to the application's reads.
                    let _ = warmstart_sys::fadvise::willneed(&*job.file, at * PAGE, n * PAGE);
                    at += n;
                }
            }
        });
        Worker {
            tx: Some(tx),
            stop,
            thread: Some(thread),
        }
    }

    pub(super) fn send(&self, job: Job) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(job);
        }
    }

    /// Drops what is queued and waits for the request in flight.
    pub(super) fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Opens a file the application reads, named from /proc: the path may
/// name another file by now (the application renamed or replaced it, or
/// an unprivileged user swapped in a FIFO or a device), so only the inode
/// `key` (kernel dev, ino) the events are about is opened, and nothing
/// but a regular file.
pub(super) fn open(path: &str, key: (u32, u64)) -> Option<File> {
    let seen = warmstart_sys::FileIdentity {
        dev: kdev_to_user(key.0 as u64),
        ino: key.1,
        ..Default::default()
    };
    let f = warmstart_sys::OpenOptions::file()
        .expect(seen, warmstart_sys::identity::Match::Inode)
        .noatime(true)
        .open(path)
        .ok()?
        .file;
    // No readahead beyond what we ask; a failure only reads a little more.
    let _ = warmstart_sys::fadvise::random(&f);
    Some(f)
}

#[cfg(test)]
mod tests {
    use super::super::device::{measure_throughput, user_to_kdev};
    use super::*;

    #[test]
    fn only_the_inode_seen_is_opened() {
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("data");
        std::fs::write(&p, vec![0u8; 8192]).unwrap();
        let m = std::fs::metadata(&p).unwrap();
        let key = (user_to_kdev(m.dev()), m.ino());
        let path = p.to_str().unwrap();
        assert!(open(path, key).is_some());
        assert!(open(path, (key.0, key.1 + 1)).is_none());
        // Swapped for a FIFO under the same name: not opened, no hang.
        std::fs::remove_file(&p).unwrap();
        let c = std::ffi::CString::new(path).unwrap();
        // SAFETY: a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let fifo = std::fs::metadata(&p).unwrap();
        assert!(open(path, (user_to_kdev(fifo.dev()), fifo.ino())).is_none());
        assert_eq!(measure_throughput(&p), 200 << 20);
    }
}
