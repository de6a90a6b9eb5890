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

use std::path::{Path, PathBuf};
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

/// Installs the handler (once per process; later calls do nothing).
pub fn install() {
    INSTALL.call_once(|| {
        let Ok(mut signals) = Signals::new([SIGINT, SIGTERM, SIGHUP]) else {
            return;
        };
        let _ = std::thread::Builder::new()
            .name("testbed-signals".into())
            .spawn(move || {
                if let Some(sig) = signals.forever().next() {
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
