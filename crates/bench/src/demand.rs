//! The `demand` bound: FAST's t_bound = max(warm, prefetch-only) assumes
//! the launch needs its data evenly over its run. Most need much of it at
//! once, at the start (a program's binary and libraries before `main`),
//! and a prefetcher started with the launch cannot have read that yet.
//!
//! From a warm recording of the launch (one of its own at learning, every
//! page found cached and kept at the time the launch first used it) the
//! bound asks how long the launch would wait if a prefetcher that costs
//! nothing else read its data in exactly the order it is used, at the
//! rate the prefetch-only scenario measured. A page used at warm time `w` after
//! `c` of all the data is ready at `prefetch-only × c`, so the launch ends
//! at `warm + max(0, max over pages of (prefetch-only × c − warm × w))`.
//! No prefetcher that starts with the launch and reads those bytes at that
//! rate does better.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use warmstart_plan::trace::NEVER_USED;
use warmstart_plan::Trace;

/// When a launch uses its data: points (share of the launch's time, share
/// of its data used by then), in time order. Only points within the
/// launch; the data share counts everything the recording saw used.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Demand {
    pub points: Vec<(f64, f64)>,
}

/// A trace counts as warm if at most this share of its bytes came from
/// storage.
const WARM_READ_SHARE: f64 = 0.05;

impl Demand {
    /// Why `trace` cannot give a demand, if it cannot.
    fn not_usable(trace: &Trace, launch: Duration) -> Option<String> {
        use warmstart_plan::trace::Backend;
        let read = trace.stats.bytes_from_storage;
        if !matches!(trace.meta.backend, Backend::Bpf | Backend::Tracefs) {
            // A residency snapshot has no times of use.
            Some(format!(
                "the {} recorder gives no times of use",
                trace.meta.backend.name()
            ))
        } else if read as f64 > WARM_READ_SHARE * trace.stats.bytes as f64 {
            Some(format!(
                "not warm: it read {read} of its {} bytes from storage",
                trace.stats.bytes
            ))
        } else if launch.is_zero() || trace.stats.bytes == 0 {
            Some("it used no data".into())
        } else {
            None
        }
    }

    /// The demand of a warm recording that took `launch` from exec to
    /// readiness, ideally recorded with each page at its own time
    /// (`split_extents_after`): an extent counts whole at its time. Or why
    /// not: a recorder without times, a trace that is not warm (more than
    /// 5% of its data read from storage: its times would include waiting
    /// for it), or no data used.
    pub fn of_warm_trace(trace: &Trace, launch: Duration) -> Result<Demand, String> {
        if let Some(why) = Demand::not_usable(trace, launch) {
            return Err(why);
        }
        let mut used: Vec<(u64, u64)> = trace
            .files
            .iter()
            .flat_map(|f| f.extents.iter())
            .filter(|e| e.t_ns < NEVER_USED)
            .map(|e| (e.t_ns, e.len))
            .collect();
        used.sort_unstable();
        let total: u64 = used.iter().map(|u| u.1).sum();
        if total == 0 {
            return Err("it used no data".into());
        }
        let span = launch.as_nanos() as f64;
        let mut so_far = 0u64;
        let mut points = Vec::new();
        for (t, len) in used {
            so_far += len;
            let w = t as f64 / span;
            if w > 1.0 {
                break;
            }
            let c = so_far as f64 / total as f64;
            // Of several points at one time only the last can be the latest.
            match points.last_mut() {
                Some((pw, pc)) if *pw == w => *pc = c,
                _ => points.push((w, c)),
            }
        }
        Ok(Demand {
            points: upper_hull(points),
        })
    }

    /// The launch time of a round whose warm launch took `warm` and whose
    /// prefetch alone took `prefetch`.
    pub fn bound(&self, warm: Duration, prefetch: Duration) -> Duration {
        let (w, p) = (warm.as_secs_f64(), prefetch.as_secs_f64());
        let late = self
            .points
            .iter()
            .map(|&(tw, c)| p * c - w * tw)
            .fold(0.0f64, f64::max);
        Duration::from_secs_f64(w + late)
    }
}

/// The points that can be the latest for some warm and prefetch times:
/// `p × c − w × t` with `p, w > 0` is largest on the upper convex hull of
/// the (t, c) points, so the rest can go (thousands of points become tens).
/// `points` must be sorted by t.
fn upper_hull(points: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    let mut hull: Vec<(f64, f64)> = Vec::new();
    for p in points {
        while hull.len() >= 2 {
            let (a, b) = (hull[hull.len() - 2], hull[hull.len() - 1]);
            // b is under the segment from a to p (or on it): not needed.
            let cross = (b.0 - a.0) * (p.1 - a.1) - (b.1 - a.1) * (p.0 - a.0);
            if cross >= 0.0 {
                hull.pop();
            } else {
                break;
            }
        }
        hull.push(p);
    }
    hull
}

#[cfg(test)]
mod tests {
    use super::*;
    use warmstart_plan::trace::{
        Backend, CacheState, EndReason, Extent, FileId, FileTrace, TraceMeta, TraceStats,
    };

    fn trace(extents: &[(u64, u64, u64)], from_storage: u64) -> Trace {
        let bytes = extents.iter().map(|e| e.1).sum();
        Trace {
            meta: TraceMeta {
                command: vec!["x".into()],
                cwd: "/".into(),
                backend: Backend::Bpf,
                cache: CacheState::AsFound,
                end: EndReason::Exited,
                exit_code: Some(0),
                started_unix_ms: 0,
                hostname: "h".into(),
            },
            files: vec![FileTrace {
                path: Some("/f".into()),
                id: FileId {
                    dev: 1,
                    ino: 2,
                    size: 1 << 30,
                    mtime_ns: 0,
                    ctime_ns: 0,
                },
                extents: extents
                    .iter()
                    .map(|&(offset, len, t_ns)| Extent {
                        offset,
                        len,
                        t_ns,
                        from_storage: false,
                    })
                    .collect(),
            }],
            metadata: Vec::new(),
            namespace_ops: Vec::new(),
            stats: TraceStats {
                bytes,
                bytes_from_storage: from_storage,
                ..TraceStats::default()
            },
        }
    }

    const MS: u64 = 1_000_000;

    #[test]
    fn data_needed_at_once_waits_for_the_prefetch() {
        // All 100 bytes at the start of a 100 ms launch: the launch waits
        // for the whole prefetch.
        let t = trace(&[(0, 100, 0)], 0);
        let d = Demand::of_warm_trace(&t, Duration::from_millis(100)).unwrap();
        let ms = |x| Duration::from_millis(x);
        assert_eq!(d.bound(ms(100), ms(30)), ms(130));
        // FAST's bound would say 100 ms.
    }

    #[test]
    fn data_needed_evenly_costs_nothing_when_the_disk_keeps_up() {
        // A quarter of the data at 0, 25, 50 and 75% of the launch.
        let t = trace(
            &[
                (0, 25, 0),
                (25, 25, 25 * MS),
                (50, 25, 50 * MS),
                (75, 25, 75 * MS),
            ],
            0,
        );
        let d = Demand::of_warm_trace(&t, Duration::from_millis(100)).unwrap();
        let ms = |x| Duration::from_millis(x);
        // Read in 40 ms: only the first quarter is waited for (10 ms).
        assert_eq!(d.bound(ms(100), ms(40)), ms(110));
        // Read in 100 ms: each quarter is 25 ms late at most.
        assert_eq!(d.bound(ms(100), ms(100)), ms(125));
        // The warm launch of the round sets the scale: at 200 ms the first
        // quarter (10 ms) is still the only wait.
        assert_eq!(d.bound(ms(200), ms(40)), ms(210));
    }

    #[test]
    fn pages_used_after_readiness_are_read_but_not_waited_for() {
        // Half the data after the launch is complete (used at 150 ms of a
        // 100 ms launch): the prefetch still reads it, in use order.
        let t = trace(&[(0, 50, 10 * MS), (50, 50, 150 * MS)], 0);
        let d = Demand::of_warm_trace(&t, Duration::from_millis(100)).unwrap();
        assert_eq!(d.points, vec![(0.1, 0.5)]);
        let ms = |x| Duration::from_millis(x);
        // The first half is ready after 50 of the 100 ms, used at 10 ms.
        assert_eq!(d.bound(ms(100), ms(100)), ms(140));
    }

    #[test]
    fn the_hull_gives_the_bound_all_points_give() {
        // A launch using its data in bursts, 500 ranges.
        let mut ext = Vec::new();
        let (mut t, mut off) = (0u64, 0u64);
        for i in 0..500u64 {
            let len = 4096 * (1 + (i * 7919) % 13);
            t += if i % 50 < 10 { 10_000 } else { 400_000 };
            ext.push((off, len, t));
            off += len;
        }
        let tr = trace(&ext, 0);
        let launch = Duration::from_nanos(t + 1);
        let d = Demand::of_warm_trace(&tr, launch).unwrap();
        assert!(d.points.len() < 100, "{} points kept", d.points.len());
        // Every point, for comparison.
        let total: u64 = ext.iter().map(|e| e.1).sum();
        let mut c = 0u64;
        let all: Vec<(f64, f64)> = ext
            .iter()
            .map(|e| {
                c += e.1;
                (
                    e.2 as f64 / launch.as_nanos() as f64,
                    c as f64 / total as f64,
                )
            })
            .collect();
        let full = Demand { points: all };
        for (w, p) in [(100, 10), (100, 50), (100, 100), (100, 300), (40, 200)] {
            let (w, p) = (Duration::from_millis(w), Duration::from_millis(p));
            let (a, b) = (d.bound(w, p).as_secs_f64(), full.bound(w, p).as_secs_f64());
            assert!((a - b).abs() < 1e-9, "{a} vs {b}");
        }
    }

    #[test]
    fn never_used_pages_and_cold_traces_are_left_out() {
        let t = trace(&[(0, 50, 0), (50, 50, NEVER_USED + 5)], 0);
        let d = Demand::of_warm_trace(&t, Duration::from_millis(100)).unwrap();
        assert_eq!(d.points, vec![(0.0, 1.0)]);
        // A trace that read 10% of its bytes from storage is not warm.
        let cold = trace(&[(0, 100, 0)], 10);
        let why = Demand::of_warm_trace(&cold, Duration::from_millis(100)).unwrap_err();
        assert!(why.contains("not warm"), "{why}");
        // A residency snapshot has every page at one time: no demand.
        let mut snap = trace(&[(0, 100, 0)], 0);
        snap.meta.backend = Backend::Mincore;
        assert!(Demand::of_warm_trace(&snap, Duration::from_millis(100)).is_err());
        let empty = trace(&[], 0);
        assert!(Demand::of_warm_trace(&empty, Duration::from_millis(100)).is_err());
    }
}
