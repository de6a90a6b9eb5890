//! Usage logs: launches with the time between them, across boots.
//!
//! A usage log is what the launch-prediction benchmark replays: earlier
//! boots train the daemon, later ones are measured. [`generate`] makes a
//! reproducible one from routines (the same programs in the same order,
//! as a user's working habits) plus noise (a routine's step skipped or
//! replaced by any other program), so a predictor is rewarded for habits
//! and not for memorising one sequence.

use serde::{Deserialize, Serialize};

use crate::history::{Event, Launch, Startup, StartupKind};

/// One step of a usage log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum Step {
    /// Sync, drop caches, restart the daemon.
    Boot,
    /// Wait, then launch `program` (a name the benchmark's suite knows).
    Launch { after_ms: u64, program: String },
}

/// A routine: programs a user tends to start in this order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Routine {
    pub programs: Vec<String>,
    /// Relative weight of this routine among the others.
    pub weight: u32,
}

/// How [`generate`] shapes a log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageSpec {
    pub routines: Vec<Routine>,
    pub boots: usize,
    /// Routines run per boot, at most (at least one).
    pub routines_per_boot: usize,
    /// Chance that a step is replaced by a random program.
    pub noise: f64,
    /// Chance that a step is skipped.
    pub skip: f64,
    /// Gaps between launches are drawn uniformly from this range.
    pub gap_ms: (u64, u64),
    pub seed: u64,
}

/// The programs of the benchmark suite (`bench/suite.toml`).
pub const SUITE: [&str; 7] = [
    "python-scipy",
    "libreoffice",
    "javac",
    "npm",
    "clang",
    "gedit",
    "gimp",
];

impl Default for UsageSpec {
    /// Three working habits over the suite's programs: a Java/Node
    /// developer's build-and-test loop, an office session, and a data
    /// analysis session.
    fn default() -> Self {
        let r = |p: &[&str], weight| Routine {
            programs: p.iter().map(|s| s.to_string()).collect(),
            weight,
        };
        UsageSpec {
            routines: vec![
                r(&["gedit", "npm", "javac", "clang"], 3),
                r(&["libreoffice", "gimp"], 2),
                r(&["python-scipy", "gedit", "python-scipy"], 2),
            ],
            boots: 8,
            routines_per_boot: 2,
            noise: 0.15,
            skip: 0.1,
            gap_ms: (2_000, 8_000),
            seed: 1,
        }
    }
}

/// A reproducible usage log for `spec`: the same spec gives the same log.
pub fn generate(spec: &UsageSpec) -> Vec<Step> {
    let mut rng = fastrand::Rng::with_seed(spec.seed);
    let all: Vec<&String> = spec.routines.iter().flat_map(|r| &r.programs).collect();
    let total_weight: u32 = spec.routines.iter().map(|r| r.weight).sum();
    let mut steps = Vec::new();
    if all.is_empty() || total_weight == 0 {
        return steps;
    }
    let (lo, hi) = (
        spec.gap_ms.0.min(spec.gap_ms.1),
        spec.gap_ms.0.max(spec.gap_ms.1),
    );
    for _ in 0..spec.boots {
        steps.push(Step::Boot);
        let n = rng.usize(1..=spec.routines_per_boot.max(1));
        for _ in 0..n {
            let mut pick = rng.u32(0..total_weight);
            let routine = spec
                .routines
                .iter()
                .find(|r| {
                    if pick < r.weight {
                        true
                    } else {
                        pick -= r.weight;
                        false
                    }
                })
                .expect("pick < total weight");
            for p in &routine.programs {
                if rng.f64() < spec.skip {
                    continue;
                }
                let program = if rng.f64() < spec.noise {
                    all[rng.usize(0..all.len())].clone()
                } else {
                    p.clone()
                };
                steps.push(Step::Launch {
                    after_ms: rng.u64(lo..=hi),
                    program,
                });
            }
        }
    }
    steps
}

/// The history a daemon would have recorded for `steps`, starting at
/// `start_ms`: a boot is a startup, each launch one event.
pub fn to_history_events(steps: &[Step], start_ms: u64) -> Vec<Event> {
    let mut now = start_ms;
    steps
        .iter()
        .map(|s| match s {
            Step::Boot => Event::Startup(Startup {
                kind: StartupKind::Boot,
                at_ms: now,
                session: 0,
            }),
            Step::Launch { after_ms, program } => {
                now += after_ms;
                Event::Launch(Launch {
                    profile: program.clone(),
                    at_ms: now,
                    session: 1,
                })
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_log() {
        let spec = UsageSpec::default();
        assert_eq!(generate(&spec), generate(&spec));
        let other = UsageSpec {
            seed: 2,
            ..UsageSpec::default()
        };
        assert_ne!(generate(&spec), generate(&other));
    }

    #[test]
    fn default_log_uses_suite_programs_and_boots() {
        let steps = generate(&UsageSpec::default());
        let boots = steps.iter().filter(|s| **s == Step::Boot).count();
        assert_eq!(boots, 8);
        assert_eq!(steps[0], Step::Boot);
        for s in &steps {
            if let Step::Launch { after_ms, program } = s {
                assert!(SUITE.contains(&program.as_str()), "{program}");
                assert!((2_000..=8_000).contains(after_ms));
            }
        }
    }

    #[test]
    fn no_routines_no_launches() {
        let spec = UsageSpec {
            routines: vec![],
            ..UsageSpec::default()
        };
        assert!(generate(&spec).is_empty());
    }

    #[test]
    fn history_times_accumulate() {
        let steps = vec![
            Step::Boot,
            Step::Launch {
                after_ms: 5,
                program: "a".into(),
            },
            Step::Launch {
                after_ms: 7,
                program: "b".into(),
            },
        ];
        let h = to_history_events(&steps, 100);
        let at: Vec<u64> = h.iter().map(Event::at_ms).collect();
        assert_eq!(at, vec![100, 105, 112]);
    }

    #[test]
    fn logs_round_trip_as_json() {
        let steps = generate(&UsageSpec::default());
        let text = serde_json::to_string(&steps).unwrap();
        let back: Vec<Step> = serde_json::from_str(&text).unwrap();
        assert_eq!(back, steps);
    }
}
