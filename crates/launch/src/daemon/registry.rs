//! Plans from a registry: when a program with no profile starts, a plan
//! for it is looked up by the program's content (`registry` in the
//! config file), checked against this machine's files, and installed as a
//! prefetching profile, so its next launch is prefetched without learning
//! launches here.
//!
//! The lookup itself (the OCI client, the content key, the identity
//! check) lives behind [`PlanLookup`], implemented by the binary: the
//! launch crate stays free of HTTP. Everything here runs on one thread of
//! its own with a bounded queue. The event loop only queues a request
//! (a map lookup and a `try_send`): a registry that is down, slow or
//! hostile never delays a launch, and launches beyond the queue go
//! without a lookup.

use std::collections::HashMap;
use std::io::Write;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use warmstart_plan::Plan;

use super::cache::{refresh, Cache};
use super::evict::evict_lru;
use super::follow::Mode;
use super::Shared;
use crate::store::{self, Phase, Profile, Store};
use crate::Error;

/// A plan found for a program, already checked against this machine's
/// files: the entries of files that differ here were dropped, the rest are
/// bound to the local inodes.
pub struct FoundPlan {
    pub plan: Plan,
    /// Where it came from and how much of it was kept: the profile's note.
    pub note: String,
    /// Files dropped by the check, each `path: why`, for the log.
    pub dropped: Vec<String>,
}

/// Finds a plan for a program by its content.
pub trait PlanLookup: Send + Sync {
    /// `argv` is the launch's command line as the daemon names profiles
    /// by (its program made absolute). `Ok(None)`: there is no plan for it,
    /// or none of its files are the same here. `Err`: the registry could not
    /// be asked (down, slow, refusing); said in the daemon's log.
    fn lookup(&self, argv: &[String]) -> Result<Option<FoundPlan>, String>;
}

/// Lookups waiting beyond the one running; more are not made.
const QUEUE: usize = 16;
/// A program the registry had no plan for is not asked about again for
/// this long.
const NOT_FOUND_FOR: Duration = Duration::from_secs(3600);
/// After a failed lookup, no lookup at all for this long: one log line a
/// minute at most while the registry is down, and no queue of doomed
/// requests each waiting out its timeout.
const DOWN_FOR: Duration = Duration::from_secs(60);
/// Answers remembered at most; the expired ones are dropped first.
const REMEMBERED: usize = 4096;
/// How long an import waits for the profile's lock (held by a `warmstart
/// run` of the same command, or a learner saving it).
const LOCK_WAIT: Duration = Duration::from_millis(500);

/// What was asked, and until when not to ask again.
#[derive(Default)]
struct Asked {
    /// Profile name -> not asked again before. In flight: far ahead.
    until: HashMap<String, Instant>,
    /// No lookups before this (the registry failed).
    down_until: Option<Instant>,
    /// Lookups made, and plans installed (for tests and the log).
    made: u64,
    installed: u64,
}

/// The daemon's side: queues lookups for programs without a profile and
/// installs what they find.
pub(super) struct Registry {
    tx: SyncSender<(String, Vec<String>)>,
    asked: Arc<Mutex<Asked>>,
}

impl Registry {
    /// Starts the lookup thread. `source` names the registry in the log;
    /// installed plans count against `store_max` bytes like learned ones.
    pub(super) fn start(
        lookup: Arc<dyn PlanLookup>,
        source: String,
        shared: Arc<Shared>,
        store: Store,
        store_max: u64,
    ) -> std::io::Result<Registry> {
        let (tx, rx) = sync_channel(QUEUE);
        let asked = Arc::new(Mutex::new(Asked::default()));
        let a = Arc::clone(&asked);
        std::thread::Builder::new()
            .name("ws-registry".into())
            .spawn(move || work(rx, &*lookup, &source, &a, &shared, (&store, store_max)))?;
        Ok(Registry { tx, asked })
    }

    /// Called by the event loop for each launch it follows: a learning
    /// launch of a program with no profile gets a lookup, unless one was
    /// made lately. Never blocks.
    pub(super) fn launch(&self, cache: &Cache, name: &str, argv: &[String], mode: &Mode) {
        if !matches!(mode, Mode::Learning) || cache.lock().get(name).is_some() {
            return;
        }
        let now = Instant::now();
        let mut a = lock(&self.asked);
        if a.down_until.is_some_and(|t| now < t) || a.until.get(name).is_some_and(|t| now < *t) {
            return;
        }
        if a.until.len() >= REMEMBERED {
            a.until.retain(|_, t| now < *t);
        }
        if a.until.len() >= REMEMBERED {
            return;
        }
        // Full: this launch goes without; its next one may ask.
        if self.tx.try_send((name.to_string(), argv.to_vec())).is_ok() {
            a.until
                .insert(name.to_string(), now + Duration::from_secs(86400));
        }
    }

    /// Lookups made and plans installed so far.
    #[cfg(test)]
    pub(super) fn counts(&self) -> (u64, u64) {
        let a = lock(&self.asked);
        (a.made, a.installed)
    }
}

fn lock(m: &Mutex<Asked>) -> MutexGuard<'_, Asked> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn work(
    rx: Receiver<(String, Vec<String>)>,
    lookup: &dyn PlanLookup,
    source: &str,
    asked: &Mutex<Asked>,
    shared: &Shared,
    (store, store_max): (&Store, u64),
) {
    let mut log = std::io::stderr();
    for (name, argv) in rx {
        // Queued before the registry failed: not asked now.
        if lock(asked).down_until.is_some_and(|t| Instant::now() < t) {
            lock(asked).until.remove(&name);
            continue;
        }
        let got = lookup.lookup(&argv);
        let now = Instant::now();
        let again = match got {
            Ok(Some(found)) => {
                match install(shared, store, &name, &argv, found, &mut log) {
                    Ok(true) => {
                        evict_lru(shared, store, store_max, &name);
                        lock(asked).installed += 1;
                    }
                    Ok(false) => {}
                    Err(e) => {
                        let _ = writeln!(
                            log,
                            "warmstart daemon: {name}: plan from {source} not installed: {e}"
                        );
                    }
                }
                now + NOT_FOUND_FOR
            }
            Ok(None) => now + NOT_FOUND_FOR,
            Err(e) => {
                let _ = writeln!(
                    log,
                    "warmstart daemon: no plans from {source} for {} s (launches go on without them): {e}{}",
                    DOWN_FOR.as_secs(),
                    if network_refused(&e.to_string()) { UNIT_HINT } else { "" }
                );
                lock(asked).down_until = Some(now + DOWN_FOR);
                now + DOWN_FOR
            }
        };
        let mut a = lock(asked);
        a.made += 1;
        a.until.insert(name, again);
    }
}

/// Said after a lookup the network refused: the shipped unit gives the
/// daemon no network, and the registry needs a drop-in.
const UNIT_HINT: &str = "; under the shipped systemd unit the daemon has no network: \
     install /usr/share/doc/warmstart/examples/registry.conf into \
     /etc/systemd/system/warmstart.service.d/";

/// Whether a lookup failed because this process may not reach the network
/// (a private network namespace or a socket family refused), not because
/// the registry is down.
fn network_refused(error: &str) -> bool {
    [
        "Network is unreachable",
        "Address family not supported",
        "Operation not permitted",
        "Permission denied",
        "os error 101",
        "os error 97",
        "os error 1)",
        "failed to lookup address",
    ]
    .iter()
    .any(|m| error.contains(m))
}

/// Writes `found` as profile `name`, prefetching, and puts it in the
/// cache; `false` if the profile has a plan of its own meanwhile (or is
/// being written). A profile this daemon is still learning from scratch
/// (no plan, now or before) is replaced: its learning launches are what
/// the plan saves.
fn install(
    shared: &Shared,
    store: &Store,
    name: &str,
    argv: &[String],
    found: FoundPlan,
    log: &mut dyn Write,
) -> Result<bool, Error> {
    // Validated like any plan read from disk, before a byte is written.
    if let Err(e) = found.plan.check() {
        let _ = writeln!(log, "warmstart daemon: {name}: pulled plan refused: {e}");
        return Ok(false);
    }
    if found.plan.files.is_empty() {
        return Ok(false);
    }
    let Some(_lock) = store.lock_within(name, LOCK_WAIT)? else {
        return Ok(false);
    };
    let _held = shared.profiles.lock().unwrap_or_else(|e| e.into_inner());
    match store.load(name) {
        Ok(None) => {}
        Ok(Some(old))
            if old.phase == Phase::Learning
                && !store.plan_path(name).exists()
                && !store.previous_plan_path(name).exists() =>
        {
            for t in &old.traces {
                let _ = std::fs::remove_file(store.trace_path(name, t));
            }
        }
        // A plan of its own, ignored, or unreadable: left alone.
        _ => return Ok(false),
    }
    let bytes = found.plan.to_bytes();
    store::write_atomic(&store.plan_path(name), &bytes)?;
    let mut prof = Profile::new(name, argv);
    prof.phase = Phase::Prefetching;
    prof.plan_bytes = Some(bytes.len() as u64);
    prof.note = Some(found.note.clone());
    // Its first launch here is recorded and judged: a plan from elsewhere
    // that misses is relearned like any other.
    prof.audit_next = true;
    store.save(&mut prof)?;
    refresh(&shared.cache, store, name, log);
    for d in found.dropped.iter().take(8) {
        let _ = writeln!(log, "warmstart daemon: {name}: dropped {d}");
    }
    let _ = writeln!(
        log,
        "warmstart daemon: {name}: {}; prefetched from its next launch",
        found.note
    );
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::network_refused;

    #[test]
    fn a_lookup_the_sandbox_refused_is_told_from_a_registry_that_is_down() {
        // What the registry client says under PrivateNetwork=yes and
        // RestrictAddressFamilies=AF_UNIX, and for a registry that is down.
        assert!(network_refused(
            "connecting to 127.0.0.1:5000: Network is unreachable (os error 101)"
        ));
        assert!(network_refused(
            "socket: Address family not supported by protocol (os error 97)"
        ));
        assert!(!network_refused(
            "connecting to 127.0.0.1:5000: Connection refused (os error 111)"
        ));
        assert!(!network_refused(
            "registry answered 500 Internal Server Error"
        ));
    }
}
