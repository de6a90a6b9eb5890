//! The mark a hand-over leaves: the front execs `warmstart-core` with it
//! in the environment (see `front`), and the core takes it out first
//! thing.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set in the core's environment by a hand-over. A binary that finds it
/// set on arrival is the front exec'd as if it were the core (a broken
/// installation): it stops instead of handing over again, forever. The
/// core removes it, so the programs it launches do not inherit it.
pub const HANDED_OVER: &str = "WARMSTART_HANDED_OVER";

static ARRIVED_HANDED_OVER: AtomicBool = AtomicBool::new(false);

/// Whether this process is the core, exec'd by the front (which has
/// already printed the launch's warnings).
pub(crate) fn handed_over() -> bool {
    ARRIVED_HANDED_OVER.load(Ordering::Relaxed)
}

/// Takes the hand-over mark out of the environment; called first thing
/// by the core, before any thread exists. A core the front handed over to
/// keeps the command's name, `warmstart`, as its process name (`ps`,
/// `pgrep -x warmstart`), as its arguments keep it as `argv[0]`.
pub(crate) fn take_mark() {
    if std::env::var_os(HANDED_OVER).is_some() {
        ARRIVED_HANDED_OVER.store(true, Ordering::Relaxed);
        std::env::remove_var(HANDED_OVER);
        // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16
        // bytes, which this literal is.
        unsafe { libc::prctl(libc::PR_SET_NAME, c"warmstart".as_ptr()) };
    }
}
