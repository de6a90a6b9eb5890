//! Where a launch's wait went: every page the launch touched, classed by
//! who brought it into the page cache and when, and the launch's sleeps
//! for pages attributed to them. Pure: it works on the wait tracer's
//! events ([`warmstart_bpf::WaitEvent`]), the plan's pages and the
//! replay's request log, so it is tested on synthetic event streams.
//!
//! Classes, for each page the launch touched (read, faulted on, or mapped
//! by fault-around after someone inserted it during the launch):
//! - `resident`: nobody inserted it during the launch: it was cached;
//! - `prefetched`: the replay inserted it before the launch first touched it;
//! - `late`: prefetched, but a launch thread slept for it (it was still
//!   being read when the launch got there);
//! - `missed`: in the plan, but the launch inserted it itself (the replay
//!   had not got to it), with how far behind the replay was;
//! - `not-in-plan`: the launch inserted it and the plan does not have it.
//!
//! Attributing a sleep. A launch thread sleeps in D state for a page in
//! one of two shapes: a fault (mm_filemap_fault fires first, then the
//! thread may insert pages, then sleeps on the faulted page) or a read
//! (the thread may insert pages, sleeps, and mm_filemap_get_pages fires
//! last, after the wait). So a sleep goes to the first page the thread
//! faulted on or inserted since its last read or fault-around; failing
//! that, to the page of the thread's next read; failing that, it stays
//! unattributed. A sleep whose kernel stack shows it was not waiting for
//! storage (a lock: see [`crate::kallsyms::sleep_why`]) goes to no page
//! and is named by the function it slept in.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use warmstart_bpf::{WaitEvent, WaitKind};

pub use crate::kallsyms::SleepWhy;

const PAGE: u64 = 4096;
/// A read's event names the pages asked for, of which one call returns
/// at most a batch of folios; the read loop's next call names the rest.
/// At most this many pages (a PMD-sized folio) count as touched per call.
const GET_PAGES_MAX: u64 = 512;

/// A file (st_dev, ino), or a block device's metadata as (st_rdev, 0).
pub type Key = (u64, u64);

/// Which pages the plan has, per file, and the files' paths.
#[derive(Debug, Default)]
pub struct PlanPages {
    ranges: HashMap<Key, BTreeMap<u64, u64>>,
    names: HashMap<Key, String>,
}

impl PlanPages {
    /// Adds bytes `offset .. offset+len` of `key`.
    pub fn add(&mut self, key: Key, path: Option<&str>, offset: u64, len: u64) {
        if let Some(p) = path {
            self.names.entry(key).or_insert_with(|| p.to_string());
        }
        if len == 0 {
            return;
        }
        let (mut first, mut end) = (offset / PAGE, (offset + len).div_ceil(PAGE));
        let m = self.ranges.entry(key).or_default();
        // Merge with every range it overlaps or touches.
        let overlapping: Vec<(u64, u64)> = m
            .range(..=end)
            .rev()
            .take_while(|(_, &e)| e >= first)
            .map(|(&f, &e)| (f, e))
            .collect();
        for (f, e) in overlapping {
            m.remove(&f);
            first = first.min(f);
            end = end.max(e);
        }
        m.insert(first, end);
    }

    pub fn contains(&self, key: Key, page: u64) -> bool {
        self.ranges
            .get(&key)
            .and_then(|m| m.range(..=page).next_back())
            .is_some_and(|(_, &end)| page < end)
    }
}

/// A data request of the replay: pages `first .. end` of `key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub key: Key,
    pub first: u64,
    pub end: u64,
    pub t_ns: u64,
}

impl Request {
    pub fn of_bytes(key: Key, offset: u64, len: u64, t_ns: u64) -> Request {
        Request {
            key,
            first: offset / PAGE,
            end: (offset + len).div_ceil(PAGE),
            t_ns,
        }
    }
}

/// What [`classify`] works on.
pub struct Inputs<'a> {
    pub events: &'a [WaitEvent],
    /// The plan's pages and paths.
    pub plan: &'a PlanPages,
    pub requests: &'a [Request],
    /// Paths of files the plan does not name (from the audit trace).
    pub names: &'a HashMap<Key, String>,
    /// The key of an event's (kernel dev, ino).
    pub key_of: &'a dyn Fn(u32, u64) -> Key,
    /// Files' sizes in bytes, where known: a read's event names the pages
    /// asked for, which may run past the end of the file.
    pub sizes: &'a HashMap<Key, u64>,
    /// warmstart's own executable: what the held child touches before it
    /// execs the program is warmstart's, not the launch's.
    pub own_exe: Option<Key>,
    /// What each sleep stack was for (by the tracer's stack id). A sleep
    /// whose stack is unknown is taken as one for a page.
    pub sleeps: &'a HashMap<u32, SleepWhy>,
    pub drops: u64,
}

/// A page's class (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PageClass {
    Resident,
    Prefetched,
    Late,
    Missed,
    NotInPlan,
}

/// Pages of one class and the launch's sleeps for them.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ClassTotals {
    pub pages: u64,
    pub bytes: u64,
    /// Off-CPU time in D state attributed to these pages.
    pub wait_ms: f64,
    /// Sleeps attributed to these pages.
    pub waits: u64,
}

/// How far behind the replay was on the `missed` pages.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Lag {
    /// Missed pages the replay issued after the launch needed them.
    pub issued_later: u64,
    /// Of those: the replay's issue time minus the time the launch needed
    /// the page, median and largest.
    pub median_ms: Option<f64>,
    pub max_ms: Option<f64>,
    /// Missed pages the replay had issued before the launch needed them,
    /// yet the launch inserted them (the request was still being split
    /// into pages, or the kernel skipped part of it).
    pub issued_before_needed: u64,
    /// Missed pages the replay never issued (cancelled when the launch
    /// ended, a skipped file, or metadata the replay could not read).
    pub never_issued: u64,
}

/// One file's share of the wait.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FileWait {
    pub path: String,
    pub wait_ms: f64,
    pub pages: u64,
    pub late: u64,
    pub missed: u64,
    pub not_in_plan: u64,
}

/// Sleeps that went to no page, by where in the kernel they slept.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SleepReason {
    /// A kernel function (`rwsem_down_read_slowpath`: the mmap lock), or
    /// `page wait, no page named` for a storage wait the thread's page
    /// events did not name.
    pub function: String,
    pub wait_ms: f64,
    pub waits: u64,
}

/// One page the launch waited on, and where the replay was with it: the
/// story of one wait, to tell a page the replay issued too late from one
/// it issued in time that the device was slow to deliver.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PageWait {
    pub path: String,
    /// The page's index in its file (or on its device, for metadata).
    pub page: u64,
    pub class: PageClass,
    /// The launch's sleeps for it.
    pub wait_ms: f64,
    /// When the launch first needed it, in ms since the exec.
    pub needed_ms: f64,
    /// When the replay issued the request holding it, if it did.
    pub issued_ms: Option<f64>,
    /// When the replay's read of it began (its insertion into the page
    /// cache), if the replay read it.
    pub replay_read_ms: Option<f64>,
}

/// How many pages [`Breakdown::longest_waits`] keeps.
const TOP_WAITS: usize = 10;

/// How many reasons [`Breakdown::unattributed_by`] keeps.
const TOP_REASONS: usize = 8;
const NO_PAGE_NAMED: &str = "page wait, no page named";

/// The replay against the launch, in ms since the launch's exec
/// (negative: before it).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Timeline {
    pub first_request_ms: Option<f64>,
    pub last_request_ms: Option<f64>,
    pub requests: u64,
    /// First and last page the replay inserted (a request for cached
    /// pages inserts none).
    pub first_replay_insert_ms: Option<f64>,
    pub last_replay_insert_ms: Option<f64>,
    /// The last exit of the launch's processes.
    pub launch_end_ms: Option<f64>,
}

/// The breakdown of one launch.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Breakdown {
    /// Pages the launch touched: the sum of the five classes.
    pub touched_pages: u64,
    pub resident: ClassTotals,
    pub prefetched: ClassTotals,
    pub late: ClassTotals,
    pub missed: ClassTotals,
    pub not_in_plan: ClassTotals,
    /// All of the launch's D-state sleeps, attributed or not.
    pub wait_ms: f64,
    pub unattributed_wait_ms: f64,
    pub unattributed_waits: u64,
    /// The unattributed sleeps by what they were in (the innermost kernel
    /// function below the scheduler), longest first.
    pub unattributed_by: Vec<SleepReason>,
    /// Time the launch's threads were runnable but off the CPU after
    /// being preempted (by the replay's threads or anything else): the
    /// CPU the launch waited for, apart from its sleeps.
    pub runnable_wait_ms: f64,
    pub preemptions: u64,
    /// The part of `runnable_wait_ms` that began with a replay thread
    /// taking the launch thread's CPU.
    pub runnable_wait_replay_ms: f64,
    pub missed_lag: Lag,
    /// The files the launch waited on longest, longest first.
    pub top_files: Vec<FileWait>,
    /// The pages the launch waited on longest, longest first.
    pub longest_waits: Vec<PageWait>,
    pub timeline: Timeline,
    /// Records the tracer lost: when not zero the figures are incomplete.
    pub drops: u64,
}

impl Breakdown {
    pub fn class(&self, c: PageClass) -> &ClassTotals {
        match c {
            PageClass::Resident => &self.resident,
            PageClass::Prefetched => &self.prefetched,
            PageClass::Late => &self.late,
            PageClass::Missed => &self.missed,
            PageClass::NotInPlan => &self.not_in_plan,
        }
    }

    fn class_mut(&mut self, c: PageClass) -> &mut ClassTotals {
        match c {
            PageClass::Resident => &mut self.resident,
            PageClass::Prefetched => &mut self.prefetched,
            PageClass::Late => &mut self.late,
            PageClass::Missed => &mut self.missed,
            PageClass::NotInPlan => &mut self.not_in_plan,
        }
    }
}

/// How many files [`Breakdown::top_files`] keeps.
const TOP_FILES: usize = 10;

#[derive(Debug, Default, Clone, Copy)]
struct PageState {
    /// First use by the launch.
    touch: Option<u64>,
    launch_add: Option<u64>,
    replay_add: Option<u64>,
    wait_ns: u64,
    waits: u64,
}

impl PageState {
    /// When the launch needed it: its first use, or its own insertion if
    /// earlier (a read's use event fires after the wait).
    fn needed(&self) -> Option<u64> {
        match (self.touch, self.launch_add) {
            (Some(t), Some(a)) => Some(t.min(a)),
            (t, a) => t.or(a),
        }
    }

    /// The class before sleeps are known (`late` is not told yet).
    fn base(&self, in_plan: bool) -> PageClass {
        match (self.launch_add, self.replay_add) {
            (Some(l), r) if r.is_none_or(|r| l < r) => {
                if in_plan {
                    PageClass::Missed
                } else {
                    PageClass::NotInPlan
                }
            }
            (_, Some(r)) if self.needed().is_some_and(|t| r <= t) => PageClass::Prefetched,
            _ => PageClass::Resident,
        }
    }
}

#[derive(Default)]
struct Thread {
    /// The page its next sleep is for, if it faulted or inserted one.
    pending: Option<(Key, u64)>,
    /// A sleep went to `pending`: the thread has its page, and a page it
    /// inserts next is a new need.
    slept: bool,
    /// Sleeps waiting for the thread's next read to name their page.
    awaiting: Vec<(u64, u64)>,
}

/// Classes every page the launch touched and attributes its sleeps.
pub fn classify(inp: &Inputs<'_>) -> Breakdown {
    let mut evs: Vec<&WaitEvent> = inp.events.iter().collect();
    evs.sort_by_key(|e| e.ts_ns);
    let exec = evs.iter().find(|e| e.kind == WaitKind::Exec).copied();
    let exec_ts = exec.map_or_else(|| evs.first().map_or(0, |e| e.ts_ns), |e| e.ts_ns);
    let root = exec.map(|e| e.tgid);
    // Before its exec the root is warmstart's own held child, running
    // warmstart's code; then its execve reads the program and its ELF
    // interpreter, before the exec event. Only warmstart's own pages are
    // left out: the held child touches little else, and what it does
    // (the C library) the program uses too.
    let relevant = |e: &WaitEvent| {
        !(Some(e.tgid) == root && e.ts_ns < exec_ts)
            || Some((inp.key_of)(e.dev, e.ino)) != inp.own_exe
    };

    // The end of the pages a use event touched: at most GET_PAGES_MAX,
    // and none past the end of the file.
    let use_end = |e: &WaitEvent, key: Key| {
        let end = e.index + e.count.clamp(1, GET_PAGES_MAX);
        match inp.sizes.get(&key) {
            Some(&size) => end.min(size.div_ceil(PAGE)).max(e.index + 1),
            None => end,
        }
    };
    let mut pages: HashMap<(Key, u64), PageState> = HashMap::new();
    let mut replay_inserts: (Option<u64>, Option<u64>) = (None, None);
    let mut launch_end = None;
    for e in &evs {
        let key = (inp.key_of)(e.dev, e.ino);
        match e.kind {
            WaitKind::AddReplay => {
                replay_inserts.0.get_or_insert(e.ts_ns);
                replay_inserts.1 = Some(e.ts_ns);
                for p in e.index..e.index + e.count {
                    pages
                        .entry((key, p))
                        .or_default()
                        .replay_add
                        .get_or_insert(e.ts_ns);
                }
            }
            WaitKind::AddLaunch if relevant(e) => {
                for p in e.index..e.index + e.count {
                    pages
                        .entry((key, p))
                        .or_default()
                        .launch_add
                        .get_or_insert(e.ts_ns);
                }
            }
            WaitKind::Get | WaitKind::Fault if relevant(e) => {
                for p in e.index..use_end(e, key) {
                    let st = pages.entry((key, p)).or_default();
                    st.touch = Some(st.touch.map_or(e.ts_ns, |t| t.min(e.ts_ns)));
                }
            }
            // Fault-around maps whatever of its window is cached, used or
            // not: only pages inserted during the launch count from it.
            WaitKind::Map if relevant(e) => {
                for p in e.index..use_end(e, key) {
                    if let Some(st) = pages.get_mut(&(key, p)) {
                        if st
                            .launch_add
                            .or(st.replay_add)
                            .is_some_and(|a| a <= e.ts_ns)
                        {
                            st.touch = Some(st.touch.map_or(e.ts_ns, |t| t.min(e.ts_ns)));
                        }
                    }
                }
            }
            WaitKind::Exit => launch_end = Some(e.ts_ns),
            _ => {}
        }
    }

    let mut out = Breakdown {
        drops: inp.drops,
        ..Breakdown::default()
    };
    let mut unattributed: Vec<(u64, String)> = Vec::new();
    let mut threads: HashMap<u32, Thread> = HashMap::new();
    let attribute =
        |pages: &mut HashMap<(Key, u64), PageState>, at: (Key, u64), start: u64, dur: u64| {
            let st = pages.entry(at).or_default();
            st.touch.get_or_insert(start);
            st.wait_ns += dur;
            st.waits += 1;
        };
    for e in &evs {
        if matches!(
            e.kind,
            WaitKind::AddReplay | WaitKind::Exec | WaitKind::Fork { .. } | WaitKind::Exit
        ) {
            continue;
        }
        let t = threads.entry(e.pid).or_default();
        let key = (inp.key_of)(e.dev, e.ino);
        match e.kind {
            WaitKind::Runnable { end_ns, by_replay } => {
                let d = ms(end_ns.saturating_sub(e.ts_ns));
                out.runnable_wait_ms += d;
                if by_replay {
                    out.runnable_wait_replay_ms += d;
                }
                out.preemptions += 1;
            }
            WaitKind::Sleep { end_ns, stack } => {
                let dur = end_ns.saturating_sub(e.ts_ns);
                out.wait_ms += ms(dur);
                // A sleep for a lock leaves the page waited for as it is.
                if let Some(w) = stack.and_then(|id| inp.sleeps.get(&id)) {
                    if !w.for_page {
                        unattributed.push((dur, w.function.clone()));
                        continue;
                    }
                }
                match t.pending {
                    Some(at) => {
                        attribute(&mut pages, at, e.ts_ns, dur);
                        t.slept = true;
                    }
                    None => t.awaiting.push((e.ts_ns, dur)),
                }
            }
            _ if !relevant(e) => {}
            WaitKind::Fault => {
                unattributed.extend(t.awaiting.drain(..).map(|(_, d)| (d, NO_PAGE_NAMED.into())));
                t.pending = Some((key, e.index));
                t.slept = false;
            }
            WaitKind::AddLaunch => {
                unattributed.extend(t.awaiting.drain(..).map(|(_, d)| (d, NO_PAGE_NAMED.into())));
                // The rest of one readahead (same file) does not move the
                // page waited for; another file's (an open's metadata
                // read, then the file's data), or any after a sleep, does.
                if t.slept || t.pending.is_none_or(|(k, _)| k != key) {
                    t.pending = Some((key, e.index));
                    t.slept = false;
                }
            }
            WaitKind::Get => {
                // The page waited for: the first of the read that some read
                // brought in during the launch, else its first.
                let end = use_end(e, key);
                let page = (e.index..end)
                    .find(|&p| {
                        pages.get(&(key, p)).is_some_and(|s| {
                            s.base(inp.plan.contains(key, p)) != PageClass::Resident
                        })
                    })
                    .unwrap_or(e.index);
                for (start, dur) in t.awaiting.drain(..) {
                    attribute(&mut pages, (key, page), start, dur);
                }
                t.pending = None;
                t.slept = false;
            }
            WaitKind::Map => {
                unattributed.extend(t.awaiting.drain(..).map(|(_, d)| (d, NO_PAGE_NAMED.into())));
                t.pending = None;
                t.slept = false;
            }
            _ => {}
        }
    }
    for t in threads.into_values() {
        unattributed.extend(
            t.awaiting
                .into_iter()
                .map(|(_, d)| (d, NO_PAGE_NAMED.into())),
        );
    }
    out.unattributed_waits = unattributed.len() as u64;
    out.unattributed_wait_ms = ms(unattributed.iter().map(|(d, _)| d).sum());
    let mut reasons: HashMap<String, (u64, u64)> = HashMap::new();
    for (d, f) in unattributed {
        let r = reasons.entry(f).or_default();
        r.0 += d;
        r.1 += 1;
    }
    let mut reasons: Vec<SleepReason> = reasons
        .into_iter()
        .map(|(function, (d, n))| SleepReason {
            function,
            wait_ms: ms(d),
            waits: n,
        })
        .collect();
    reasons.sort_by(|a, b| {
        b.wait_ms
            .total_cmp(&a.wait_ms)
            .then_with(|| a.function.cmp(&b.function))
    });
    reasons.truncate(TOP_REASONS);
    out.unattributed_by = reasons;

    // Requests per file, for the missed pages' lag.
    let mut requests: HashMap<Key, Vec<&Request>> = HashMap::new();
    for r in inp.requests {
        requests.entry(r.key).or_default().push(r);
    }
    let issued_at = |key: Key, page: u64| {
        requests
            .get(&key)
            .into_iter()
            .flatten()
            .filter(|r| r.first <= page && page < r.end)
            .map(|r| r.t_ns)
            .min()
    };
    let since = |t: u64| (t as f64 - exec_ts as f64) / 1e6;
    let mut lags: Vec<u64> = Vec::new();
    let mut waits: Vec<PageWait> = Vec::new();
    let mut files: HashMap<Key, FileWait> = HashMap::new();
    for (&(key, page), st) in &pages {
        if st.touch.is_none() {
            continue;
        }
        let mut class = st.base(inp.plan.contains(key, page));
        if class == PageClass::Prefetched && st.waits > 0 {
            class = PageClass::Late;
        }
        out.touched_pages += 1;
        let c = out.class_mut(class);
        c.pages += 1;
        c.bytes += PAGE;
        c.waits += st.waits;
        c.wait_ms += ms(st.wait_ns);
        if st.wait_ns > 0 {
            waits.push(PageWait {
                path: name_of(inp, key),
                page,
                class,
                wait_ms: ms(st.wait_ns),
                needed_ms: st.needed().map_or(0.0, since),
                issued_ms: issued_at(key, page).map(since),
                replay_read_ms: st.replay_add.map(since),
            });
        }
        if class == PageClass::Missed {
            let needed = st.needed().unwrap_or(0);
            match issued_at(key, page) {
                Some(t) if t >= needed => lags.push(t - needed),
                Some(_) => out.missed_lag.issued_before_needed += 1,
                None => out.missed_lag.never_issued += 1,
            }
        }
        let f = files.entry(key).or_insert_with(|| FileWait {
            path: name_of(inp, key),
            wait_ms: 0.0,
            pages: 0,
            late: 0,
            missed: 0,
            not_in_plan: 0,
        });
        f.pages += 1;
        f.wait_ms += ms(st.wait_ns);
        match class {
            PageClass::Late => f.late += 1,
            PageClass::Missed => f.missed += 1,
            PageClass::NotInPlan => f.not_in_plan += 1,
            _ => {}
        }
    }
    lags.sort_unstable();
    out.missed_lag.issued_later = lags.len() as u64;
    out.missed_lag.median_ms = lags.get(lags.len() / 2).map(|&l| ms(l));
    out.missed_lag.max_ms = lags.last().map(|&l| ms(l));

    let mut top: Vec<FileWait> = files.into_values().filter(|f| f.wait_ms > 0.0).collect();
    top.sort_by(|a, b| {
        b.wait_ms
            .total_cmp(&a.wait_ms)
            .then_with(|| a.path.cmp(&b.path))
    });
    top.truncate(TOP_FILES);
    out.top_files = top;
    waits.sort_by(|a, b| {
        b.wait_ms
            .total_cmp(&a.wait_ms)
            .then_with(|| a.path.cmp(&b.path))
            .then_with(|| a.page.cmp(&b.page))
    });
    waits.truncate(TOP_WAITS);
    out.longest_waits = waits;

    out.timeline = Timeline {
        first_request_ms: inp.requests.iter().map(|r| r.t_ns).min().map(since),
        last_request_ms: inp.requests.iter().map(|r| r.t_ns).max().map(since),
        requests: inp.requests.len() as u64,
        first_replay_insert_ms: replay_inserts.0.map(since),
        last_replay_insert_ms: replay_inserts.1.map(since),
        launch_end_ms: launch_end.map(since),
    };
    out
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn name_of(inp: &Inputs<'_>, key: Key) -> String {
    if let Some(n) = inp.plan.names.get(&key).or_else(|| inp.names.get(&key)) {
        return n.clone();
    }
    let (maj, min) = (libc::major(key.0), libc::minor(key.0));
    if key.1 == 0 {
        format!("metadata of {maj}:{min}")
    } else {
        format!("inode {} on {maj}:{min}", key.1)
    }
}

#[cfg(test)]
#[path = "breakdown_tests.rs"]
mod tests;
