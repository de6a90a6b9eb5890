//! Tearing testbeds down when the process is interrupted.
//!
//! The first [`crate::Testbed::prepare`] installs a handler thread for
//! SIGINT, SIGTERM and SIGHUP (signal-hook: the signal only wakes the
//! thread, the work happens in ordinary code). On a signal it tears down
//! every testbed of the process, removes its half-built images, then lets
//! the signal's default action end the process, so the exit status still
//! says which signal it was. A host program that handles these signals
//! itself should drop its testbeds before exiting; this handler would
//! otherwise end the process first.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once};

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::{cleanup, Active};

struct Registry {
    active: Vec<Arc<Active>>,
    cache_dirs: Vec<PathBuf>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    active: Vec::new(),
    cache_dirs: Vec::new(),
});
static INSTALL: Once = Once::new();
/// Set when a signal arrived: the handler is tearing down and will end
/// the process.
static ENDING: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Whether this thread is the handler's.
    static HANDLER: Cell<bool> = const { Cell::new(false) };
}

/// Called after a teardown by any thread: while the handler is ending the
/// process, a thread other than the handler's waits for that end instead
/// of returning. The program's own teardown, racing the handler's, would
/// otherwise let the process exit with the program's status, or exit
/// while the handler is still unmounting through a device model this
/// process serves.
pub(crate) fn wait_while_ending() {
    if ENDING.load(Ordering::SeqCst) && !HANDLER.with(Cell::get) {
        loop {
            std::thread::park();
        }
    }
}

/// Installs the handler (once per process; later calls do nothing).
pub fn install() {
    INSTALL.call_once(|| {
        let Ok(mut signals) = Signals::new([SIGINT, SIGTERM, SIGHUP]) else {
            return;
        };
        let _ = std::thread::Builder::new()
            .name("testbed-signals".into())
            .spawn(move || {
                HANDLER.with(|h| h.set(true));
                if let Some(sig) = signals.forever().next() {
                    ENDING.store(true, Ordering::SeqCst);
                    teardown_all();
                    let _ = signal_hook::low_level::emulate_default_handler(sig);
                    std::process::exit(128 + sig);
                }
            });
    });
}

fn lock() -> std::sync::MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn register(active: &Arc<Active>, cache_dir: &Path) {
    let mut r = lock();
    r.active.push(active.clone());
    if !r.cache_dirs.iter().any(|d| d == cache_dir) {
        r.cache_dirs.push(cache_dir.to_path_buf());
    }
}

pub(crate) fn unregister(active: &Arc<Active>) {
    lock().active.retain(|a| !Arc::ptr_eq(a, active));
}

/// Tears down every testbed of this process and removes its temporary
/// images; what the signal handler does before the process dies.
pub fn teardown_all() {
    let (active, cache_dirs) = {
        let r = lock();
        (r.active.clone(), r.cache_dirs.clone())
    };
    for a in &active {
        let _ = a.teardown();
        // A testbed still being prepared has mounts but nothing attached.
        cleanup::remove_run_dir(&a.run_dir);
    }
    let suffix = format!(".building-{}", std::process::id());
    for dir in cache_dirs {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().ends_with(&suffix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}
