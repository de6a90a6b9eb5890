//! Collecting a launch's wait events ([`warmstart_bpf::WaitTracer`]) on a
//! thread of their own, while the caller launches and replays. The tracer's
//! ring buffer is not `Send`, so it is loaded, fed and drained on that
//! thread; the caller hands it the launch's root pid before releasing it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use warmstart_bpf::{WaitEvent, WaitKind, WaitTracer};

use crate::Error;

/// A running collection. [`WaitSession::finish`] stops it and returns the
/// events; dropping it stops it too.
pub struct WaitSession {
    pids: mpsc::Sender<u32>,
    acks: mpsc::Receiver<Result<(), Error>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Collected>>,
}

/// What a session collected.
#[derive(Debug, Default)]
pub struct Collected {
    pub events: Vec<WaitEvent>,
    /// Records the kernel dropped (ring buffer full): the breakdown is
    /// incomplete when this is not zero.
    pub drops: u64,
    /// Why polling stopped early, if it did.
    pub error: Option<String>,
    /// The kernel stacks of the sleeps, by id.
    pub stacks: HashMap<u32, Vec<u64>>,
}

impl WaitSession {
    /// Loads the tracer; insertions by this process's threads (the
    /// replay's) are told apart from the launch's.
    pub fn start() -> Result<WaitSession, Error> {
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), Error>>();
        let (pid_tx, pid_rx) = mpsc::channel::<u32>();
        let (ack_tx, ack_rx) = mpsc::channel::<Result<(), Error>>();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("ws-waits".into())
            .spawn(move || {
                let mut out = Collected::default();
                let tracer = match WaitTracer::start(std::process::id()) {
                    Ok(t) => {
                        let _ = ready_tx.send(Ok(()));
                        t
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(Error::Bpf(e)));
                        return out;
                    }
                };
                // Tracked before the launch is released: nothing of it is
                // missed, and the caller waits only for a map update.
                if let Ok(pid) = pid_rx.recv() {
                    let _ = ack_tx.send(tracer.track(pid).map_err(Error::Bpf));
                    // Stop as soon as the caller is done: polling with
                    // a short timeout keeps the last records' delay low.
                    while !stopping.load(Ordering::Relaxed) {
                        if let Err(e) = tracer.poll(Duration::from_millis(20), &mut out.events) {
                            out.error = Some(e.to_string());
                            break;
                        }
                    }
                }
                if let Err(e) = tracer.drain(&mut out.events) {
                    out.error.get_or_insert(e.to_string());
                }
                out.drops = tracer.drops();
                for e in &out.events {
                    if let WaitKind::Sleep {
                        stack: Some(id), ..
                    } = e.kind
                    {
                        if let std::collections::hash_map::Entry::Vacant(v) = out.stacks.entry(id) {
                            if let Some(s) = tracer.stack(id) {
                                v.insert(s);
                            }
                        }
                    }
                }
                out
            })?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(WaitSession {
                pids: pid_tx,
                acks: ack_rx,
                stop,
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(Error::Io(std::io::Error::other(
                    "the wait tracer's thread ended before loading it",
                )))
            }
        }
    }

    /// Follows the launch rooted at `tgid` (call once, before releasing it).
    pub fn track(&self, tgid: u32) -> Result<(), Error> {
        self.pids
            .send(tgid)
            .map_err(|_| Error::Io(std::io::Error::other("the wait tracer's thread ended")))?;
        self.acks
            .recv()
            .map_err(|_| Error::Io(std::io::Error::other("the wait tracer's thread ended")))?
    }

    /// Stops collecting and returns everything collected.
    pub fn finish(mut self) -> Collected {
        self.stop_thread()
    }

    fn stop_thread(&mut self) -> Collected {
        self.stop.store(true, Ordering::Relaxed);
        // Without a tracked pid the thread waits on the channel: closing it
        // ends that wait.
        let (closed, _) = mpsc::channel();
        drop(std::mem::replace(&mut self.pids, closed));
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(c)) => c,
            Some(Err(_)) => Collected {
                error: Some("the wait tracer's thread panicked".into()),
                ..Collected::default()
            },
            None => Collected::default(),
        }
    }
}

impl Drop for WaitSession {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.stop_thread();
        }
    }
}
