//! The plan cache: every profile's phase and plan, in memory, so that an
//! exec is decided and its replay started without reading the state
//! directory (after a cache drop it would be read from a disk busy with
//! the launch's own first reads). Plans are held up to a budget counted
//! by their decoded size; the rest are read from the state directory at
//! their launch.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use warmstart_plan::Plan;
use warmstart_replay::RealBackend;
use warmstart_sys::FileIdentity;

use super::Shared;
use crate::manager::{load_plan, load_previous_plan, relearn, LaunchReport};
use crate::store::{Phase, Profile, Store};
use crate::Error;

/// A file's identity and version, `None` if there is no file. A file
/// renamed over it (every write of the store) or rewritten in place
/// changes it.
pub(super) type FileStamp = Option<FileIdentity>;

pub(super) fn file_stamp(p: &Path) -> FileStamp {
    std::fs::metadata(p)
        .ok()
        .map(|m| FileIdentity::from_metadata(&m))
}

/// A profile's plan read from the store, with the stamp of the file it was
/// read from (taken before reading, so a later change is never missed).
pub(super) fn load_plan_stamped(
    store: &Store,
    name: &str,
) -> Result<(Arc<Plan>, FileStamp), String> {
    let st = file_stamp(&store.plan_path(name));
    load_plan(store, name).map(|p| (Arc::new(p), st))
}

/// The same for a relearning profile's previous plan, if it has one.
pub(super) fn load_previous_stamped(store: &Store, name: &str) -> Option<(Arc<Plan>, FileStamp)> {
    let st = file_stamp(&store.previous_plan_path(name));
    load_previous_plan(store, name).map(|p| (Arc::new(p), st))
}

/// The file a profile's plan in memory comes from, by phase.
fn plan_file(store: &Store, name: &str, phase: Phase) -> PathBuf {
    match phase {
        Phase::Learning => store.previous_plan_path(name),
        _ => store.plan_path(name),
    }
}

/// What the daemon knows of a profile on disk.
#[derive(Clone)]
pub(super) struct Known {
    pub(super) phase: Phase,
    /// `profile.json` as last read or written; `None`: read it again at
    /// the next check.
    pub(super) profile: Option<FileStamp>,
    /// A prefetching profile's plan, or a relearning profile's previous
    /// plan, and the stamp of its file. `None` with `Prefetching`: not in
    /// memory, read it from the store; with `Learning`: there is none.
    pub(super) plan: Option<(Arc<Plan>, FileStamp)>,
    /// The plan was left on disk, over the memory budget: the stamp of
    /// the file that was checked (it decoded).
    pub(super) spilled: Option<FileStamp>,
    /// The profile's audit schedule: whether the next launch is audited.
    pub(super) audit_next: bool,
    pub(super) launches_since_audit: u64,
}

impl Known {
    pub(super) fn new(prof: &Profile, plan: Option<(Arc<Plan>, FileStamp)>) -> Known {
        Known {
            phase: prof.phase,
            profile: None,
            plan: plan.filter(|_| prof.phase != Phase::Ignored),
            spilled: None,
            audit_next: prof.audit_next,
            launches_since_audit: prof.launches_since_audit,
        }
    }

    /// Whether the next prefetched launch is recorded in full and judged
    /// on its exact miss ratio: when the profile asks for it (its first
    /// prefetched launch, or after a miss) and every `nchk`-th launch.
    /// The others are followed as a process tree only, so the daemon
    /// spends no CPU on their pages.
    pub(super) fn audit_due(&self, nchk: u64) -> bool {
        self.audit_next || self.launches_since_audit + 1 >= nchk
    }
}

/// The entries and what their plans take in memory.
#[derive(Default)]
pub(super) struct Entries {
    map: HashMap<String, (Known, u64)>,
    plan_bytes: u64,
}

impl Entries {
    pub(super) fn get(&self, name: &str) -> Option<&Known> {
        self.map.get(name).map(|(k, _)| k)
    }

    pub(super) fn get_mut(&mut self, name: &str) -> Option<&mut Known> {
        self.map.get_mut(name).map(|(k, _)| k)
    }
}

/// Profiles' phases and plans, so that deciding a launch and starting its
/// replay need no file I/O.
///
/// The daemon updates an entry whenever it writes a profile (with
/// `Shared::profiles` held, before `profile.json` is replaced, so no launch
/// decided after the write sees the old state), and checks each entry
/// against the files after every exec of its program, once that launch's
/// replay has started: a change made behind the daemon's back (`warmstart
/// run` on the same state directory, a user deleting files) is seen by
/// the next launch at the latest.
#[derive(Default)]
pub(super) struct Cache {
    /// Every profile of the store, loaded before the daemon serves (a name
    /// without an entry has no profile).
    map: Mutex<Entries>,
    /// Decoded bytes of plans held at most (0: no limit).
    budget: AtomicU64,
    /// The backend every replay uses: it remembers devices' read-ahead
    /// sizes and a metadata device it may not open, so a launch's replay
    /// starts without asking sysfs and `/dev` again.
    pub(super) backend: Arc<RealBackend>,
}

impl Cache {
    pub(super) fn with_budget(bytes: u64) -> Cache {
        let c = Cache::default();
        c.budget.store(bytes, Ordering::Relaxed);
        c
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Entries> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn get(&self, name: &str) -> Option<Known> {
        self.lock().get(name).cloned()
    }

    /// Sets `name`'s entry, keeping its plan in memory only if the plans'
    /// decoded size stays within the budget; otherwise the plan is left
    /// on disk (it decoded, so a launch can read it).
    pub(super) fn insert(&self, name: &str, mut k: Known) {
        let budget = self.budget.load(Ordering::Relaxed);
        let mut m = self.lock();
        if let Some((_, old)) = m.map.remove(name) {
            m.plan_bytes -= old;
        }
        let mut size = k.plan.as_ref().map_or(0, |(p, _)| p.decoded_size());
        if budget > 0 && m.plan_bytes + size > budget {
            if let Some((_, st)) = k.plan.take() {
                k.spilled = Some(st);
            }
            size = 0;
        }
        m.plan_bytes += size;
        m.map.insert(name.to_string(), (k, size));
    }

    /// What the daemon is about to write for `prof`, with its plan if it
    /// is prefetching (its previous plan if it is relearning). Call with
    /// `profiles` held, before `profile.json` is replaced, then
    /// [`Cache::written`].
    pub(super) fn put(&self, prof: &Profile, plan: Option<(Arc<Plan>, FileStamp)>) {
        self.insert(&prof.name, Known::new(prof, plan));
    }

    /// The daemon wrote `name`'s `profile.json`: the next check need not
    /// read it again.
    pub(super) fn written(&self, store: &Store, name: &str) {
        let st = file_stamp(&store.dir(name).join("profile.json"));
        if let Some(k) = self.lock().get_mut(name) {
            k.profile = Some(st);
        }
    }

    /// The profile is gone (forgotten, evicted).
    pub(super) fn remove(&self, name: &str) {
        let mut m = self.lock();
        if let Some((_, size)) = m.map.remove(name) {
            m.plan_bytes -= size;
        }
    }

    /// Profiles, plans in memory, their decoded bytes, and plans left on
    /// disk.
    pub(super) fn counts(&self) -> CacheCounts {
        let m = self.lock();
        CacheCounts {
            profiles: m.map.len(),
            plans: m.map.values().filter(|(k, _)| k.plan.is_some()).count(),
            plan_bytes: m.plan_bytes,
            spilled: m
                .map
                .values()
                .filter(|(k, _)| k.plan.is_none() && k.spilled.is_some())
                .count(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CacheCounts {
    pub(super) profiles: usize,
    pub(super) plans: usize,
    pub(super) plan_bytes: u64,
    pub(super) spilled: usize,
}

/// Work for the thread that checks the cache against the store.
pub(super) enum Check {
    /// A launch of this profile was just decided from the cache; once its
    /// replay has issued a first request (or a little while has passed),
    /// compare the entry with the files.
    Profile {
        name: String,
        first_request_ns: Option<Arc<AtomicU64>>,
    },
}

/// Loads every profile of the store and its plan into the cache (at
/// startup, before the control socket exists). A state directory that
/// cannot be read is said: the daemon then prefetches nothing.
pub(super) fn load_cache(shared: &Shared, store: &Store, log: &mut dyn Write) {
    let t = Instant::now();
    let names = store.names().unwrap_or_else(|e| {
        let _ = writeln!(
            log,
            "warmstart daemon: cannot read the profiles: {e}; none is prefetched"
        );
        Vec::new()
    });
    for n in &names {
        let _held = shared.profiles.lock().unwrap_or_else(|e| e.into_inner());
        refresh(&shared.cache, store, n, log);
    }
    let c = shared.cache.counts();
    let _ = writeln!(
        log,
        "warmstart daemon: {} profiles and {} plans in memory ({:.1} MiB decoded{}) ({:.0} ms)",
        c.profiles,
        c.plans,
        c.plan_bytes as f64 / (1 << 20) as f64,
        if c.spilled > 0 {
            format!(", {} more left on disk over plan_memory_mib", c.spilled)
        } else {
            String::new()
        },
        t.elapsed().as_secs_f64() * 1e3
    );
}

/// The checking thread: one job at a time, each with `profiles` held, so
/// that it never overwrites what the daemon has just written.
pub(super) fn check_cache(jobs: std::sync::mpsc::Receiver<Check>, shared: &Shared, store: &Store) {
    let mut log = std::io::stderr();
    for job in jobs {
        match job {
            Check::Profile {
                name,
                first_request_ns,
            } => {
                // Off the launch's critical path: its replay's first
                // request, not this check, gets the disk first.
                if let Some(first) = first_request_ns {
                    let until = Instant::now() + Duration::from_millis(20);
                    while first.load(Ordering::Relaxed) == 0 && Instant::now() < until {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                let _held = shared.profiles.lock().unwrap_or_else(|e| e.into_inner());
                refresh(&shared.cache, store, &name, &mut log);
            }
        }
    }
}

/// Brings `name`'s cache entry in line with the store (with `profiles`
/// held). A corrupt profile is rebuilt and a plan that does not load is
/// reported and relearned, as when a launch finds them.
pub(super) fn refresh(cache: &Cache, store: &Store, name: &str, log: &mut dyn Write) {
    let mut prof_st = file_stamp(&store.dir(name).join("profile.json"));
    if prof_st.is_none() {
        cache.remove(name);
        return;
    }
    let old = cache.get(name);
    let plan_st = old
        .as_ref()
        .map(|k| file_stamp(&plan_file(store, name, k.phase)));
    // The plan in memory is still the file's (a launch counted in
    // `profile.json` by `warmstart run` leaves it alone); or the plan left
    // on disk is still the one that was checked.
    let old_plan = old.as_ref().and_then(|k| {
        k.plan
            .clone()
            .filter(|(_, st)| plan_st.as_ref() == Some(st))
    });
    let spilled = old
        .as_ref()
        .and_then(|k| k.spilled)
        .filter(|st| plan_st.as_ref() == Some(st));
    if let Some(k) = &old {
        let plan_ok = k.phase != Phase::Prefetching || old_plan.is_some() || spilled.is_some();
        if k.profile == Some(prof_st) && plan_ok {
            return;
        }
    }
    let mut prof = match store.load(name) {
        Ok(Some(p)) => p,
        Ok(None) => {
            cache.remove(name);
            return;
        }
        // Rebuilt from its traces and plan, so that nothing it learned is
        // lost (as when a launch through `warmstart run` finds it).
        Err(Error::CorruptProfile { path, why }) => {
            cache.remove(name);
            match store.rebuild(name, &[], &why) {
                Ok(p) => {
                    let _ = writeln!(
                        log,
                        "warmstart daemon: {} did not parse ({why}); rebuilt {name} from its {} trace(s){}",
                        path.display(),
                        p.traces.len(),
                        if p.phase == Phase::Prefetching { " and its plan" } else { "" }
                    );
                    prof_st = file_stamp(&store.dir(name).join("profile.json"));
                    p
                }
                Err(e) => {
                    let _ = writeln!(
                        log,
                        "warmstart daemon: {} did not parse ({why}), and rebuilding it failed: {e}; {name} is not prefetched",
                        path.display()
                    );
                    return;
                }
            }
        }
        // Unreadable (permissions, I/O): left as it is, not prefetched.
        Err(e) => {
            let _ = writeln!(log, "warmstart daemon: {e}; {name} is not prefetched");
            cache.remove(name);
            return;
        }
    };
    let same_phase = old.as_ref().is_some_and(|k| k.phase == prof.phase);
    let mut known = Known::new(&prof, None);
    known.profile = Some(prof_st);
    match prof.phase {
        Phase::Prefetching if same_phase && old_plan.is_some() => known.plan = old_plan,
        Phase::Prefetching if same_phase && spilled.is_some() => known.spilled = spilled,
        Phase::Prefetching => match load_plan_stamped(store, name) {
            Ok(plan) => known.plan = Some(plan),
            Err(why) => {
                let _ = writeln!(
                    log,
                    "warmstart daemon: {why}; ignoring it and relearning {name}"
                );
                let mut report = LaunchReport::new(name, prof.phase);
                prof.phase = Phase::Learning;
                cache.put(&prof, None);
                relearn(&mut prof, store, why, false, &mut report);
                let _ = store.save(&mut prof);
                cache.written(store, name);
                return;
            }
        },
        Phase::Learning => {
            known.plan = old_plan
                .filter(|_| same_phase)
                .or_else(|| load_previous_stamped(store, name));
        }
        Phase::Ignored => {}
    }
    cache.insert(name, known);
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use warmstart_plan::plan::{Entry, PlanMeta};

    /// A plan of `n` metadata entries: a few hundred bytes deflated,
    /// `n * size_of::<Entry>()` decoded.
    pub(crate) fn plan_of(n: u64) -> Plan {
        Plan {
            meta: PlanMeta {
                command: vec!["/usr/bin/app".into()],
                created_unix_ms: 0,
                traces: 1,
                min_traces: 1,
                passes: Vec::new(),
                sorted: false,
            },
            files: Vec::new(),
            lookups: Vec::new(),
            entries: (0..n)
                .map(|i| Entry::Meta {
                    device: 0x800,
                    offset: i * 4096,
                    len: 4096,
                })
                .collect(),
        }
    }

    /// Writes a profile in `phase`, with `plan` as its plan file.
    pub(crate) fn profile_on_disk(store: &Store, name: &str, phase: Phase, plan: Option<&[u8]>) {
        let mut p = Profile::new(name, &["/usr/bin/app".to_string()]);
        p.phase = phase;
        std::fs::create_dir_all(store.dir(name)).unwrap();
        if let Some(bytes) = plan {
            std::fs::write(store.plan_path(name), bytes).unwrap();
        }
        store.save(&mut p).unwrap();
    }

    #[test]
    fn memory_is_counted_by_decoded_size() {
        let big = plan_of(100_000);
        let compressed = big.to_bytes().len() as u64;
        let decoded = big.decoded_size();
        assert!(
            decoded > 20 * compressed,
            "{decoded} decoded from {compressed}"
        );
        // Room for one such plan, not two.
        let cache = Cache::with_budget(decoded + decoded / 2);
        let prof = |name: &str| {
            let mut p = Profile::new(name, &[]);
            p.phase = Phase::Prefetching;
            p
        };
        cache.put(&prof("a"), Some((Arc::new(big.clone()), None)));
        cache.put(&prof("b"), Some((Arc::new(big.clone()), None)));
        let c = cache.counts();
        assert_eq!((c.profiles, c.plans, c.spilled), (2, 1, 1));
        assert_eq!(c.plan_bytes, decoded);
        assert!(
            cache.get("b").unwrap().plan.is_none(),
            "b is read at launch"
        );
        // Replacing and removing entries gives their memory back.
        cache.put(&prof("a"), Some((Arc::new(plan_of(10)), None)));
        assert_eq!(cache.counts().plan_bytes, plan_of(10).decoded_size());
        cache.remove("a");
        assert_eq!(cache.counts().plan_bytes, 0);
        cache.put(&prof("b"), Some((Arc::new(big), None)));
        assert_eq!(cache.counts().plans, 1, "b fits now");
    }

    /// (case, phase on disk, plan file, budget, then: cached phase, plan
    /// in memory, plan left on disk)
    type RefreshCase<'a> = (
        &'a str,
        Phase,
        Option<&'a [u8]>,
        u64,
        Option<Phase>,
        bool,
        bool,
    );

    #[test]
    fn refresh_follows_the_store() {
        let good = plan_of(4).to_bytes();
        let big = plan_of(50_000).to_bytes();
        let cases: [RefreshCase; 5] = [
            (
                "prefetching",
                Phase::Prefetching,
                Some(&good),
                0,
                Some(Phase::Prefetching),
                true,
                false,
            ),
            (
                "learning, no plan",
                Phase::Learning,
                None,
                0,
                Some(Phase::Learning),
                false,
                false,
            ),
            (
                "corrupt plan: relearned",
                Phase::Prefetching,
                Some(b"junk"),
                0,
                Some(Phase::Learning),
                false,
                false,
            ),
            (
                "over the budget",
                Phase::Prefetching,
                Some(&big),
                4096,
                Some(Phase::Prefetching),
                false,
                true,
            ),
            (
                "ignored",
                Phase::Ignored,
                None,
                0,
                Some(Phase::Ignored),
                false,
                false,
            ),
        ];
        for (case, phase, plan, budget, want_phase, in_memory, spilled) in cases {
            let d = tempfile::tempdir().unwrap();
            let store = Store::open(d.path()).unwrap();
            profile_on_disk(&store, "app-1", phase, plan);
            let cache = Cache::with_budget(budget);
            refresh(&cache, &store, "app-1", &mut std::io::sink());
            let k = cache.get("app-1");
            assert_eq!(k.as_ref().map(|k| k.phase), want_phase, "{case}");
            let k = k.unwrap();
            assert_eq!(k.plan.is_some(), in_memory, "{case}: in memory");
            assert_eq!(k.spilled.is_some(), spilled, "{case}: left on disk");
            if case.starts_with("corrupt") {
                assert!(!store.plan_path("app-1").exists(), "{case}");
                assert_eq!(store.load("app-1").unwrap().unwrap().phase, Phase::Learning);
            }
        }
    }

    #[test]
    fn refresh_sees_changes_behind_the_daemons_back() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(d.path()).unwrap();
        let cache = Cache::default();
        let mut log = std::io::sink();
        profile_on_disk(
            &store,
            "app-1",
            Phase::Prefetching,
            Some(&plan_of(4).to_bytes()),
        );
        refresh(&cache, &store, "app-1", &mut log);
        let first = cache.get("app-1").unwrap().plan.unwrap().0;
        // Unchanged: the same plan stays (no reread).
        refresh(&cache, &store, "app-1", &mut log);
        assert!(Arc::ptr_eq(
            &first,
            &cache.get("app-1").unwrap().plan.unwrap().0
        ));
        // A new plan file (written by `warmstart run`) is read again.
        let tmp = d.path().join("new.plan");
        std::fs::write(&tmp, plan_of(5).to_bytes()).unwrap();
        std::fs::rename(&tmp, store.plan_path("app-1")).unwrap();
        refresh(&cache, &store, "app-1", &mut log);
        let now = cache.get("app-1").unwrap().plan.unwrap().0;
        assert_eq!(now.entries.len(), 5);
        // Forgotten by hand: gone from memory.
        std::fs::remove_dir_all(store.dir("app-1")).unwrap();
        refresh(&cache, &store, "app-1", &mut log);
        assert!(cache.get("app-1").is_none());
        assert_eq!(cache.counts().plan_bytes, 0);
    }
}
