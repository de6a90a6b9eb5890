//! The measurement loop, independent of how a launch is made: learn once,
//! warm up, then run every scenario once per round, rounds interleaved
//! (FAST and Paralfetch compare scenarios on the same launches; running
//! them round-robin spreads slow drift of the machine over all of them
//! instead of penalising whichever ran last). The [`Executor`] does the
//! launching; tests use a mock one, as hyperfine does.

use std::time::Duration;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::scenario::{round_order, Scenario};
use crate::stats;

/// What one measured launch gave.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    /// Launch time: exec (or the start of a prefetch that holds the
    /// application) to completion.
    pub time: Duration,
    /// Exit status, if the program exited (it is stopped once ready
    /// otherwise).
    pub exit_code: Option<i32>,
    /// Share of the learned launch bytes resident just before the launch
    /// (with `--check-residency`).
    pub resident_before: Option<f64>,
    /// Bytes the prefetcher issued, for scenarios that prefetch.
    pub prefetched_bytes: Option<u64>,
    /// Bytes read from the testbed's loop device while the scenario ran
    /// (its prefetch and launch), with `--fs`.
    pub device_read_bytes: Option<u64>,
    /// For `run`: the wrapper's own costs, from its report.
    pub wrapper: Option<WrapperTimes>,
}

/// What `warmstart run` reported of its own costs for one launch (its
/// `--report`), to tell them from the replay's: the in-process replay
/// pays none of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct WrapperTimes {
    /// From the wrapper beginning to decide the launch (naming it, reading
    /// its profile and plan) to the replay's start.
    pub before_replay_ms: Option<f64>,
    /// How long the program was held for the replay's head start.
    pub held_ms: Option<f64>,
    /// How long the wrapper kept its caller after the program exited.
    pub after_exit_ms: Option<f64>,
}

/// One row of the results: a scenario in one round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Run {
    pub program: String,
    /// 0-based round.
    pub round: usize,
    pub scenario: Scenario,
    /// Position within the round (0 = first launched). Bound has none.
    pub position: Option<usize>,
    pub time_s: f64,
    pub exit_code: Option<i32>,
    pub resident_before: Option<f64>,
    pub prefetched_bytes: Option<u64>,
    /// Bytes read from the testbed's loop device (`--fs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_read_bytes: Option<u64>,
    /// `run` only: the wrapper's own costs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wrapper: Option<WrapperTimes>,
}

/// What the learning phase produced, for the report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Learned {
    /// Traces recorded (one cold, one as found).
    pub traces: usize,
    /// Files and data bytes the launch read, over the traces.
    pub files: usize,
    pub data_bytes: u64,
    pub metadata_bytes: u64,
    /// Event source the recorder used.
    pub backend: String,
    /// Bytes (data + metadata) in each compiled plan, by scenario.
    pub plan_bytes: Vec<(Scenario, u64)>,
    /// Entries of each plan: (scenario, data ranges, metadata ranges,
    /// path lookups). What the replay has to issue, for explaining times.
    #[serde(default)]
    pub plan_entries: Vec<(Scenario, usize, usize, usize)>,
    /// Things the user should know (fallbacks, empty plans).
    pub notes: Vec<String>,
    /// When the launch uses its data, from a warm recording (for the
    /// demand bound).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub demand: Option<crate::demand::Demand>,
}

/// Makes launches. `learn` runs once before anything is measured.
pub trait Executor {
    fn learn(&mut self) -> Result<Learned>;
    /// One untimed launch (hyperfine's --warmup), from whatever state.
    fn warmup(&mut self) -> Result<()>;
    /// Prepares the scenario's cache state and measures one launch.
    fn measure(&mut self, scenario: Scenario) -> Result<Measurement>;
    /// Runs once after the last round (the user's --cleanup).
    fn cleanup(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Progress callbacks, so the loop stays free of terminal code.
pub trait Progress {
    fn phase(&mut self, _what: &str) {}
    fn launched(&mut self, _round: usize, _scenario: Scenario, _time: Duration) {}
}

/// Does nothing (tests, --quiet).
pub struct NoProgress;
impl Progress for NoProgress {}

/// How many launches [`run_program`] makes per round.
pub fn launches_per_round(scenarios: &[Scenario]) -> usize {
    scenarios.iter().filter(|s| s.is_run()).count()
}

/// Measures one program: learn, `warmup` untimed launches, then `rounds`
/// rounds of `scenarios`. Bound and demand rows are derived per round from
/// that round's warm and prefetch-only (demand also from the learned
/// demand, without which it has no rows).
pub fn run_program(
    program: &str,
    exec: &mut dyn Executor,
    scenarios: &[Scenario],
    rounds: usize,
    warmup: usize,
    progress: &mut dyn Progress,
) -> Result<(Learned, Vec<Run>)> {
    progress.phase("learning");
    let learned = exec.learn()?;
    for _ in 0..warmup {
        progress.phase("warm-up");
        exec.warmup()?;
    }
    let mut runs = Vec::new();
    let result = (|| -> Result<()> {
        for round in 0..rounds {
            let mut warm = None;
            let mut pf = None;
            for (pos, s) in round_order(scenarios, round).into_iter().enumerate() {
                let m = exec.measure(s)?;
                progress.launched(round, s, m.time);
                match s {
                    Scenario::Warm => warm = Some(m.time),
                    Scenario::PrefetchOnly => pf = Some(m.time),
                    _ => {}
                }
                runs.push(Run {
                    program: program.to_string(),
                    round,
                    scenario: s,
                    position: Some(pos),
                    time_s: m.time.as_secs_f64(),
                    exit_code: m.exit_code,
                    resident_before: m.resident_before,
                    prefetched_bytes: m.prefetched_bytes,
                    device_read_bytes: m.device_read_bytes,
                    wrapper: m.wrapper,
                });
            }
            let (Some(w), Some(p)) = (warm, pf) else {
                continue;
            };
            let mut derived = |scenario: Scenario, t: Duration| {
                runs.push(Run {
                    program: program.to_string(),
                    round,
                    scenario,
                    position: None,
                    time_s: t.as_secs_f64(),
                    exit_code: None,
                    resident_before: None,
                    prefetched_bytes: None,
                    device_read_bytes: None,
                    wrapper: None,
                })
            };
            if scenarios.contains(&Scenario::Bound) {
                derived(Scenario::Bound, w.max(p));
            }
            if let (true, Some(d)) = (scenarios.contains(&Scenario::Demand), &learned.demand) {
                derived(Scenario::Demand, d.bound(w, p));
            }
        }
        Ok(())
    })();
    // Cleanup runs even when a round failed, as hyperfine's does.
    let cleaned = exec.cleanup();
    result?;
    cleaned?;
    Ok((learned, runs))
}

/// The statistics of one scenario of one program.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub program: String,
    pub scenario: Scenario,
    pub runs: usize,
    pub median_s: f64,
    pub min_s: f64,
    pub max_s: f64,
    pub mean_s: f64,
    pub stddev_s: Option<f64>,
    /// median / median of cold.
    pub vs_cold: Option<f64>,
    /// (cold − t) / (cold − warm), on medians.
    pub gap_captured: Option<f64>,
    /// The same from differences within each round: median(cold − t) /
    /// median(cold − warm) (see [`stats::paired_gap_captured`]).
    #[serde(default)]
    pub paired_gap: Option<f64>,
    /// Rounds whose time is a statistical outlier.
    pub outlier_rounds: Vec<usize>,
}

/// Summaries of every scenario present in `runs` (one program), in
/// scenario order.
pub fn summarize(runs: &[Run]) -> Vec<Summary> {
    let times = |s: Scenario| -> Vec<(usize, f64)> {
        runs.iter()
            .filter(|r| r.scenario == s)
            .map(|r| (r.round, r.time_s))
            .collect()
    };
    let med = |s: Scenario| {
        let t: Vec<f64> = times(s).iter().map(|x| x.1).collect();
        stats::median(&t)
    };
    let cold = med(Scenario::Cold);
    let warm = med(Scenario::Warm);
    let by_round =
        |s: Scenario| -> std::collections::HashMap<usize, f64> { times(s).into_iter().collect() };
    let (cold_r, warm_r) = (by_round(Scenario::Cold), by_round(Scenario::Warm));
    let mut out = Vec::new();
    for s in Scenario::ALL {
        let rt = times(s);
        if rt.is_empty() {
            continue;
        }
        let t: Vec<f64> = rt.iter().map(|x| x.1).collect();
        let median = stats::median(&t).unwrap_or(f64::NAN);
        out.push(Summary {
            program: runs[0].program.clone(),
            scenario: s,
            runs: t.len(),
            median_s: median,
            min_s: t.iter().copied().fold(f64::INFINITY, f64::min),
            max_s: t.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            mean_s: stats::mean(&t).unwrap_or(f64::NAN),
            stddev_s: stats::stddev(&t),
            vs_cold: cold.filter(|c| *c > 0.0).map(|c| median / c),
            gap_captured: match (cold, warm) {
                (Some(c), Some(w)) => stats::gap_captured(median, c, w),
                _ => None,
            },
            paired_gap: stats::paired_gap_captured(
                &rt.iter()
                    .filter_map(|&(r, t)| Some((*cold_r.get(&r)?, *warm_r.get(&r)?, t)))
                    .collect::<Vec<_>>(),
            ),
            outlier_rounds: stats::outliers(&t).into_iter().map(|i| rt[i].0).collect(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Returns fixed times per scenario, varied by round, and logs calls.
    struct Mock {
        times: HashMap<Scenario, Vec<f64>>,
        calls: Vec<String>,
        count: HashMap<Scenario, usize>,
        fail_at: Option<usize>,
        demand: Option<crate::demand::Demand>,
    }

    impl Mock {
        fn new(times: &[(Scenario, &[f64])]) -> Self {
            Mock {
                times: times.iter().map(|(s, t)| (*s, t.to_vec())).collect(),
                calls: Vec::new(),
                count: HashMap::new(),
                fail_at: None,
                demand: None,
            }
        }
    }

    impl Executor for Mock {
        fn learn(&mut self) -> Result<Learned> {
            self.calls.push("learn".into());
            Ok(Learned {
                traces: 2,
                demand: self.demand.clone(),
                ..Default::default()
            })
        }
        fn warmup(&mut self) -> Result<()> {
            self.calls.push("warmup".into());
            Ok(())
        }
        fn measure(&mut self, s: Scenario) -> Result<Measurement> {
            if self.fail_at == Some(self.calls.len()) {
                anyhow::bail!("launch failed");
            }
            self.calls.push(s.name().into());
            let i = self.count.entry(s).or_default();
            let t = self.times[&s][*i % self.times[&s].len()];
            *i += 1;
            Ok(Measurement {
                time: Duration::from_secs_f64(t),
                exit_code: Some(0),
                ..Default::default()
            })
        }
        fn cleanup(&mut self) -> Result<()> {
            self.calls.push("cleanup".into());
            Ok(())
        }
    }

    #[test]
    fn learn_warmup_then_interleaved_rounds_then_cleanup() {
        let mut m = Mock::new(&[
            (Scenario::Cold, &[1.0]),
            (Scenario::Warm, &[0.5]),
            (Scenario::Warmstart, &[0.6]),
        ]);
        let sc = [Scenario::Cold, Scenario::Warm, Scenario::Warmstart];
        let (_, runs) = run_program("p", &mut m, &sc, 3, 2, &mut NoProgress).unwrap();
        assert_eq!(
            m.calls,
            [
                "learn",
                "warmup",
                "warmup",
                "cold",
                "warm",
                "warmstart",
                "warm",
                "warmstart",
                "cold",
                "warmstart",
                "cold",
                "warm",
                "cleanup"
            ]
        );
        assert_eq!(runs.len(), 9);
        assert_eq!(runs[3].round, 1);
        assert_eq!(runs[3].position, Some(0));
    }

    #[test]
    fn bound_is_max_of_warm_and_prefetch_only_per_round() {
        let mut m = Mock::new(&[
            (Scenario::Cold, &[1.0]),
            (Scenario::Warm, &[0.5, 0.4]),
            (Scenario::PrefetchOnly, &[0.3, 0.7]),
        ]);
        let sc = [
            Scenario::Cold,
            Scenario::Warm,
            Scenario::PrefetchOnly,
            Scenario::Bound,
        ];
        let (_, runs) = run_program("p", &mut m, &sc, 2, 0, &mut NoProgress).unwrap();
        let bound: Vec<f64> = runs
            .iter()
            .filter(|r| r.scenario == Scenario::Bound)
            .map(|r| r.time_s)
            .collect();
        assert_eq!(bound, [0.5, 0.7]);
    }

    #[test]
    fn demand_is_derived_per_round_only_with_a_learned_demand() {
        let times: [(Scenario, &[f64]); 3] = [
            (Scenario::Cold, &[1.0]),
            (Scenario::Warm, &[0.5, 0.4]),
            (Scenario::PrefetchOnly, &[0.3, 0.2]),
        ];
        let sc = [
            Scenario::Cold,
            Scenario::Warm,
            Scenario::PrefetchOnly,
            Scenario::Demand,
        ];
        // Nothing learned: no rows rather than a made-up figure.
        let mut m = Mock::new(&times);
        let (_, runs) = run_program("p", &mut m, &sc, 2, 0, &mut NoProgress).unwrap();
        assert!(runs.iter().all(|r| r.scenario != Scenario::Demand));
        assert!(!m.calls.iter().any(|c| c == "demand"), "never launched");
        // Everything needed at the start: warm + prefetch-only.
        let mut m = Mock::new(&times);
        m.demand = Some(crate::demand::Demand {
            points: vec![(0.0, 1.0)],
        });
        let (_, runs) = run_program("p", &mut m, &sc, 2, 0, &mut NoProgress).unwrap();
        let demand: Vec<f64> = runs
            .iter()
            .filter(|r| r.scenario == Scenario::Demand)
            .map(|r| (r.time_s * 1e6).round() / 1e6)
            .collect();
        assert_eq!(demand, [0.8, 0.6]);
    }

    #[test]
    fn cleanup_runs_after_a_failed_launch() {
        let mut m = Mock::new(&[(Scenario::Cold, &[1.0])]);
        m.fail_at = Some(3);
        let err = run_program("p", &mut m, &[Scenario::Cold], 5, 0, &mut NoProgress);
        assert!(err.is_err());
        assert_eq!(m.calls.last().unwrap(), "cleanup");
    }

    #[test]
    fn summary_ratios_gap_and_outliers() {
        let mut m = Mock::new(&[
            (Scenario::Cold, &[2.0, 2.1, 1.9, 2.0, 2.0]),
            (Scenario::Warm, &[1.0, 1.0, 1.0, 1.0, 1.0]),
            (Scenario::Fast, &[1.5, 1.5, 1.5, 1.5, 1.5]),
            (Scenario::Warmstart, &[1.2, 1.21, 1.19, 9.0, 1.2]),
        ]);
        let sc = [
            Scenario::Cold,
            Scenario::Warm,
            Scenario::Fast,
            Scenario::Warmstart,
        ];
        let (_, runs) = run_program("p", &mut m, &sc, 5, 0, &mut NoProgress).unwrap();
        let s = summarize(&runs);
        let get = |sc: Scenario| s.iter().find(|x| x.scenario == sc).unwrap();
        assert_eq!(get(Scenario::Cold).median_s, 2.0);
        assert_eq!(get(Scenario::Cold).min_s, 1.9);
        assert_eq!(get(Scenario::Cold).max_s, 2.1);
        assert_eq!(get(Scenario::Cold).vs_cold, Some(1.0));
        assert_eq!(get(Scenario::Warm).gap_captured, Some(1.0));
        assert_eq!(get(Scenario::Fast).gap_captured, Some(0.5));
        assert_eq!(get(Scenario::Fast).vs_cold, Some(0.75));
        let ws = get(Scenario::Warmstart);
        assert!((ws.gap_captured.unwrap() - 0.8).abs() < 1e-9);
        // Round by round: cold − t 0.8, 0.89, 0.71, −7.0, 0.8 over gaps
        // 1.0, 1.1, 0.9, 1.0, 1.0.
        assert!((ws.paired_gap.unwrap() - 0.8).abs() < 1e-9);
        assert_eq!(get(Scenario::Cold).paired_gap, Some(0.0));
        assert_eq!(ws.outlier_rounds, vec![3]);
        assert_eq!(get(Scenario::Fast).outlier_rounds, Vec::<usize>::new());
        // Order of the table is scenario order, not launch order.
        let order: Vec<Scenario> = s.iter().map(|x| x.scenario).collect();
        assert_eq!(order, sc);
    }

    #[test]
    fn no_gap_without_warm() {
        let mut m = Mock::new(&[(Scenario::Cold, &[1.0])]);
        let (_, runs) = run_program("p", &mut m, &[Scenario::Cold], 2, 0, &mut NoProgress).unwrap();
        let s = summarize(&runs);
        assert_eq!(s[0].gap_captured, None);
        assert_eq!(s[0].runs, 2);
    }
}
