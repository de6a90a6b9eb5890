//! A gate that paces the replay's data while the launch's exec is still
//! under way.
//!
//! The daemon starts a launch's replay at its first `execve`, before the
//! kernel has loaded anything. The launch's first reads are then the
//! exec's own (a `PATH` search's directories, a script's `#!` line, the
//! interpreter's headers), one synchronous read at a time. The plan's data
//! issued with `WILLNEED` beside them fills the device's queue, and on a
//! slow device each of those reads waits behind it: on the `cloud` model a
//! cold `npm` run by name took 350 ms from its first `execve` to its exec
//! instead of 65. Held back until the exec, the data loses that time
//! instead. So while the gate is closed each data request is read
//! through, synchronously: the device still streams the plan, and a read
//! of the exec's waits behind at most one request per replay worker. Once
//! the gate opens (the daemon opens it at the exec event), or its limit
//! has passed, requests are queued as usual.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// See the module documentation. Shared between the replay and whoever
/// opens it; opening is idempotent.
#[derive(Debug)]
pub struct DataGate {
    open: AtomicBool,
    /// The gate counts as open this long after it was made.
    limit: Duration,
    made: Instant,
}

impl DataGate {
    /// A closed gate that counts as open after `limit`.
    pub fn closed(limit: Duration) -> Self {
        DataGate {
            open: AtomicBool::new(false),
            limit,
            made: Instant::now(),
        }
    }

    pub fn open(&self) {
        self.open.store(true, Ordering::Relaxed);
    }

    /// Opened, or its limit has passed.
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Relaxed) || self.made.elapsed() >= self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gate_is_open_once_opened_or_past_its_limit() {
        let g = DataGate::closed(Duration::from_secs(60));
        assert!(!g.is_open());
        g.open();
        assert!(g.is_open());
        g.open();
        assert!(g.is_open());
        let g = DataGate::closed(Duration::from_millis(20));
        assert!(!g.is_open());
        std::thread::sleep(Duration::from_millis(25));
        assert!(g.is_open());
    }
}
