//! The state directory kept under `store_max_mib`: beyond it, the least
//! recently used profiles are forgotten.
//!
//! The size of each profile's directory is kept in memory, so that a
//! launch written costs the stat of its own directory, not a walk of the
//! whole store: reading every directory and every profile after each
//! launch took 16% of the daemon's CPU with 54 profiles.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use super::Shared;
use crate::store::Store;

/// The whole store is measured again at least this often, so that
/// profiles written by `warmstart run` (which never forgets on its own)
/// count within it.
const RESCAN: Duration = Duration::from_secs(300);

/// Each profile's size on disk, as last measured.
#[derive(Debug, Default)]
pub(super) struct StoreSizes {
    by_name: HashMap<String, u64>,
    /// When the whole store was last measured; `None`: never.
    scanned: Option<Instant>,
}

impl StoreSizes {
    fn total(&self) -> u64 {
        self.by_name.values().sum()
    }

    /// Measures every profile; `false` if the store cannot be listed.
    fn rescan(&mut self, store: &Store) -> bool {
        let Ok(names) = store.names() else {
            self.scanned = None;
            return false;
        };
        self.by_name = names
            .into_iter()
            .map(|n| {
                let size = dir_size(&store.dir(&n));
                (n, size)
            })
            .collect();
        self.scanned = Some(Instant::now());
        true
    }
}

/// Keeps the store under `max` bytes, after profile `written` was written
/// (or installed), by forgetting the least recently used profiles. The
/// sizes are read without the profile lock; each profile is forgotten with
/// it held, so that no launch is being written to it.
pub(super) fn evict_lru(shared: &Shared, store: &Store, max: u64, written: &str) {
    let mut sizes = shared.sizes.lock().unwrap_or_else(|e| e.into_inner());
    let fresh = sizes.scanned.is_some_and(|t| t.elapsed() < RESCAN);
    if fresh {
        let size = dir_size(&store.dir(written));
        sizes.by_name.insert(written.to_string(), size);
    } else if !sizes.rescan(store) {
        return;
    }
    if sizes.total() <= max {
        return;
    }
    // Over by the counts kept: measured again before anything is
    // forgotten, since a profile removed since is still counted in them.
    if fresh && (!sizes.rescan(store) || sizes.total() <= max) {
        return;
    }
    // By last use, oldest first; the name breaks ties so that profiles
    // used in the same millisecond are all counted.
    let by_age: BTreeMap<(u64, String), u64> = sizes
        .by_name
        .iter()
        .map(|(name, size)| ((last_used(store, name), name.clone()), *size))
        .collect();
    let mut total = sizes.total();
    for ((_, name), size) in by_age {
        if total <= max {
            break;
        }
        let _held = shared.profiles.lock().unwrap_or_else(|e| e.into_inner());
        shared.cache.remove(&name);
        let _ = store.forget(&name);
        sizes.by_name.remove(&name);
        total -= size;
    }
}

/// The bytes of a profile's files (0 if it is gone).
fn dir_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// When a profile was last used, in ms since the epoch. A profile that
/// does not load still takes room: it is aged by its directory, not left
/// out of the cap.
fn last_used(store: &Store, name: &str) -> u64 {
    match store.load(name) {
        Ok(Some(p)) => p.updated_unix_ms,
        _ => std::fs::metadata(store.dir(name))
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_millis() as u64),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::super::cache::tests::profile_on_disk;
    use super::super::cache::Cache;
    use super::super::DaemonStatus;
    use super::*;
    use crate::store::Phase;

    const KIB: u64 = 1024;

    /// A profile of about 100 KiB, used after the ones written before it.
    fn profile(store: &Store, name: &str) {
        profile_on_disk(store, name, Phase::Prefetching, Some(&[0u8; 100 << 10]));
        // `updated_unix_ms` has millisecond steps.
        std::thread::sleep(Duration::from_millis(3));
    }

    fn names(store: &Store) -> Vec<String> {
        store.names().unwrap()
    }

    #[test]
    fn the_least_recently_used_go_first() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(d.path()).unwrap();
        let shared = Shared::new(DaemonStatus::default(), BTreeSet::new(), Cache::default());
        for n in ["a-1", "b-1", "c-1"] {
            profile(&store, n);
        }
        evict_lru(&shared, &store, 1 << 20, "c-1");
        assert_eq!(names(&store), ["a-1", "b-1", "c-1"], "under the cap");
        evict_lru(&shared, &store, 250 * KIB, "c-1");
        assert_eq!(names(&store), ["b-1", "c-1"]);
        // A profile written later pushes the oldest out.
        profile(&store, "d-1");
        evict_lru(&shared, &store, 250 * KIB, "d-1");
        assert_eq!(names(&store), ["c-1", "d-1"]);
    }

    #[test]
    fn a_profile_changed_behind_its_back_is_measured_again() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(d.path()).unwrap();
        let shared = Shared::new(DaemonStatus::default(), BTreeSet::new(), Cache::default());
        for n in ["a-1", "b-1"] {
            profile(&store, n);
        }
        evict_lru(&shared, &store, 250 * KIB, "b-1");
        // Relearned by `warmstart run`, to a small plan: still counted at
        // 100 KiB in memory.
        std::fs::write(store.plan_path("b-1"), [0u8; 1024]).unwrap();
        profile(&store, "c-1");
        evict_lru(&shared, &store, 250 * KIB, "c-1");
        assert_eq!(names(&store), ["a-1", "b-1", "c-1"], "nothing is forgotten");
        // Removed by hand: gone from the counts too.
        store.forget("a-1").unwrap();
        profile(&store, "d-1");
        evict_lru(&shared, &store, 250 * KIB, "d-1");
        assert_eq!(names(&store), ["b-1", "c-1", "d-1"]);
    }
}
