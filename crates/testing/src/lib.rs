//! What the test suites of every crate share.
//!
//! Root tests load BPF programs, attach loop devices and drop caches. Run
//! without root they are skipped with the reason printed; with
//! `WARMSTART_REQUIRE_ROOT=1` (set by `.ci/run`) a skip is a failure, so a
//! CI that lost its root would not pass without testing.

/// The variable that turns a skipped root test into a failed one.
pub const REQUIRE_ROOT: &str = "WARMSTART_REQUIRE_ROOT";

/// Whether `test` may run: true as root. Otherwise prints that it is
/// skipped and returns false, or panics when [`REQUIRE_ROOT`] is `1`.
pub fn require_root(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    decide(test, euid, std::env::var(REQUIRE_ROOT).ok().as_deref())
}

/// Skips a test that cannot run here for a reason other than root (a
/// kernel feature, a missing program): prints why, or panics when skips
/// are forbidden.
pub fn skip(test: &str, why: &str) {
    if std::env::var(REQUIRE_ROOT).ok().as_deref() == Some("1") {
        panic!("{test} cannot run here ({why}) and {REQUIRE_ROOT}=1 forbids skipping it");
    }
    eprintln!("SKIPPED {test}: {why}");
}

fn decide(test: &str, euid: u32, require: Option<&str>) -> bool {
    if euid == 0 {
        return true;
    }
    if require == Some("1") {
        panic!("{test} needs root, and {REQUIRE_ROOT}=1 forbids skipping it");
    }
    eprintln!("SKIPPED {test}: needs root (BPF, loop devices, drop_caches)");
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_runs() {
        assert!(decide("t", 0, Some("1")));
        assert!(decide("t", 0, None));
    }

    #[test]
    fn others_skip_unless_required() {
        assert!(!decide("t", 1000, None));
        assert!(!decide("t", 1000, Some("0")));
    }

    #[test]
    #[should_panic(expected = "forbids skipping")]
    fn others_fail_when_required() {
        decide("t", 1000, Some("1"));
    }
}
