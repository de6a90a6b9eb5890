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
    /// Wait, then start a user's login session: the launches after it, to
    /// the next boot, run in that session.
    Login { after_ms: u64 },
    /// Wait, then empty the page cache without restarting anything: the
    /// cache was reclaimed while the machine idled.
    Evict { after_ms: u64 },
}

/// A login at the start of each boot and the programs its session starts
/// on its own (a desktop's autostart), as [`generate`] makes them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoginSpec {
    /// The login comes this long after the boot (drawn uniformly).
    pub after_ms: (u64, u64),
    /// Started in this order right after the login.
    pub autostart: Vec<String>,
    /// Gaps before each autostart launch (drawn uniformly).
    pub gap_ms: (u64, u64),
    /// Chance that an autostart program is left out.
    pub skip: f64,
}

/// Caches emptied while the machine idles, as [`generate`] makes them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvictSpec {
    /// Chance that a boot has one (after a launch that another follows).
    pub chance: f64,
    /// The eviction comes this long after the launch before it.
    pub after_ms: (u64, u64),
    /// The next launch comes this long after the eviction: the idle time
    /// in which a prefetcher can notice it and read again.
    pub idle_ms: (u64, u64),
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
    /// A login and its autostart programs at each boot (none: the
    /// routines begin right after the boot).
    #[serde(default)]
    pub login: Option<LoginSpec>,
    /// Evictions while idle (none: the cache is only emptied at boots).
    #[serde(default)]
    pub evict: Option<EvictSpec>,
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
            login: None,
            evict: None,
        }
    }
}

/// A uniform draw from `range` (its ends in either order).
fn draw(rng: &mut fastrand::Rng, range: (u64, u64)) -> u64 {
    rng.u64(range.0.min(range.1)..=range.0.max(range.1))
}

/// A reproducible usage log for `spec`: the same spec gives the same log.
/// Without `login` and `evict` it draws exactly what it drew before they
/// existed, so older specs keep their logs.
pub fn generate(spec: &UsageSpec) -> Vec<Step> {
    let mut rng = fastrand::Rng::with_seed(spec.seed);
    let all: Vec<&String> = spec.routines.iter().flat_map(|r| &r.programs).collect();
    let total_weight: u32 = spec.routines.iter().map(|r| r.weight).sum();
    let mut steps = Vec::new();
    if all.is_empty() || total_weight == 0 {
        return steps;
    }
    for _ in 0..spec.boots {
        steps.push(Step::Boot);
        if let Some(login) = &spec.login {
            steps.push(Step::Login {
                after_ms: draw(&mut rng, login.after_ms),
            });
            for p in &login.autostart {
                if rng.f64() < login.skip {
                    continue;
                }
                steps.push(Step::Launch {
                    after_ms: draw(&mut rng, login.gap_ms),
                    program: p.clone(),
                });
            }
        }
        let first_routine = steps.len();
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
                    after_ms: draw(&mut rng, spec.gap_ms),
                    program,
                });
            }
        }
        if let Some(evict) = &spec.evict {
            if rng.f64() < evict.chance {
                insert_eviction(&mut steps, first_routine, evict, &mut rng);
            }
        }
    }
    steps
}

/// Puts an eviction before one of the routine launches from
/// `first_routine` on that follows a launch (never inside the autostart
/// burst, which stays a startup), and makes that launch wait the idle
/// time after it. A boot with no such launch gets none.
fn insert_eviction(
    steps: &mut Vec<Step>,
    first_routine: usize,
    spec: &EvictSpec,
    rng: &mut fastrand::Rng,
) {
    let places: Vec<usize> = (first_routine.max(1)..steps.len())
        .filter(|&i| matches!(steps[i - 1], Step::Launch { .. }))
        .collect();
    if places.is_empty() {
        return;
    }
    let at = places[rng.usize(0..places.len())];
    steps.insert(
        at,
        Step::Evict {
            after_ms: draw(rng, spec.after_ms),
        },
    );
    if let Step::Launch { after_ms, .. } = &mut steps[at + 1] {
        *after_ms = draw(rng, spec.idle_ms);
    }
}

/// The history a daemon would have recorded for `steps`, starting at
/// `start_ms`: a boot is a startup, a login a startup of the next session
/// (2, 3, ...), each launch one event in the session of the boot's last
/// login (1 before any login: a console session that began earlier). An
/// eviction only passes time.
pub fn to_history_events(steps: &[Step], start_ms: u64) -> Vec<Event> {
    let mut now = start_ms;
    let (mut session, mut last_login) = (1, 1);
    steps
        .iter()
        .filter_map(|s| match s {
            Step::Boot => {
                session = 1;
                Some(Event::Startup(Startup {
                    kind: StartupKind::Boot,
                    at_ms: now,
                    session: 0,
                }))
            }
            Step::Login { after_ms } => {
                now += after_ms;
                last_login += 1;
                session = last_login;
                Some(Event::Startup(Startup {
                    kind: StartupKind::Login,
                    at_ms: now,
                    session,
                }))
            }
            Step::Evict { after_ms } => {
                now += after_ms;
                None
            }
            Step::Launch { after_ms, program } => {
                now += after_ms;
                Some(Event::Launch(Launch {
                    profile: program.clone(),
                    at_ms: now,
                    session,
                }))
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

    /// The log of seed 1 before logins and evictions existed: an old spec
    /// keeps its log.
    #[test]
    fn specs_without_login_or_evict_keep_their_log() {
        let steps = generate(&UsageSpec::default());
        assert!(steps
            .iter()
            .all(|s| matches!(s, Step::Boot | Step::Launch { .. })));
        let old = r#"{"routines":[{"programs":["a","b"],"weight":1}],"boots":2,
            "routines_per_boot":1,"noise":0.0,"skip":0.0,"gap_ms":[5,5],"seed":3}"#;
        let spec: UsageSpec = serde_json::from_str(old).unwrap();
        assert_eq!(spec.login, None);
        assert_eq!(spec.evict, None);
        let l = |p: &str| Step::Launch {
            after_ms: 5,
            program: p.into(),
        };
        assert_eq!(
            generate(&spec),
            vec![Step::Boot, l("a"), l("b"), Step::Boot, l("a"), l("b")]
        );
    }

    #[test]
    fn new_steps_as_json() {
        for (step, text) in [
            (
                Step::Login { after_ms: 3000 },
                r#"{"step":"login","after_ms":3000}"#,
            ),
            (
                Step::Evict { after_ms: 12 },
                r#"{"step":"evict","after_ms":12}"#,
            ),
        ] {
            assert_eq!(serde_json::to_string(&step).unwrap(), text);
            assert_eq!(serde_json::from_str::<Step>(text).unwrap(), step);
        }
        assert!(serde_json::from_str::<Step>(r#"{"step":"login"}"#).is_err());
    }

    fn session_spec(chance: f64) -> UsageSpec {
        UsageSpec {
            routines: vec![Routine {
                programs: vec!["r1".into(), "r2".into(), "r3".into()],
                weight: 1,
            }],
            boots: 20,
            routines_per_boot: 1,
            noise: 0.0,
            skip: 0.0,
            gap_ms: (2_000, 6_000),
            seed: 7,
            login: Some(LoginSpec {
                after_ms: (2_000, 4_000),
                autostart: vec!["a1".into(), "a2".into()],
                gap_ms: (300, 800),
                skip: 0.0,
            }),
            evict: Some(EvictSpec {
                chance,
                after_ms: (1_000, 3_000),
                idle_ms: (10_000, 15_000),
            }),
        }
    }

    #[test]
    fn each_boot_logs_in_then_autostarts_then_runs_its_routine() {
        let steps = generate(&session_spec(0.0));
        let boots: Vec<&[Step]> = steps.split(|s| *s == Step::Boot).skip(1).collect();
        assert_eq!(boots.len(), 20);
        for b in boots {
            let Step::Login { after_ms } = b[0] else {
                panic!("{b:?}")
            };
            assert!((2_000..=4_000).contains(&after_ms));
            let programs: Vec<(&str, u64)> = b[1..]
                .iter()
                .map(|s| match s {
                    Step::Launch { after_ms, program } => (program.as_str(), *after_ms),
                    other => panic!("{other:?}"),
                })
                .collect();
            let names: Vec<&str> = programs.iter().map(|p| p.0).collect();
            assert_eq!(names, ["a1", "a2", "r1", "r2", "r3"]);
            assert!(programs[..2].iter().all(|p| (300..=800).contains(&p.1)));
            assert!(programs[2..].iter().all(|p| (2_000..=6_000).contains(&p.1)));
        }
    }

    #[test]
    fn evictions_follow_a_routine_launch_and_precede_an_idle_one() {
        let steps = generate(&session_spec(1.0));
        let boots: Vec<&[Step]> = steps.split(|s| *s == Step::Boot).skip(1).collect();
        for b in &boots {
            let at: Vec<usize> = (0..b.len())
                .filter(|&i| matches!(b[i], Step::Evict { .. }))
                .collect();
            // Every boot has a routine launch after another launch.
            assert_eq!(at.len(), 1, "{b:?}");
            let i = at[0];
            // Not inside the autostart burst: after its last launch at
            // the earliest.
            assert!(i >= 3, "{b:?}");
            assert!(matches!(b[i - 1], Step::Launch { .. }));
            let Step::Evict { after_ms } = b[i] else {
                unreachable!()
            };
            assert!((1_000..=3_000).contains(&after_ms));
            let Step::Launch { after_ms, .. } = &b[i + 1] else {
                panic!("{b:?}")
            };
            assert!((10_000..=15_000).contains(after_ms));
        }
        // The places vary.
        let places: std::collections::BTreeSet<usize> = boots
            .iter()
            .map(|b| {
                b.iter()
                    .position(|s| matches!(s, Step::Evict { .. }))
                    .unwrap()
            })
            .collect();
        assert!(places.len() > 1, "{places:?}");
        // About a third of the boots at 1/3.
        let some = generate(&UsageSpec {
            boots: 300,
            ..session_spec(1.0 / 3.0)
        });
        let n = some
            .iter()
            .filter(|s| matches!(s, Step::Evict { .. }))
            .count();
        assert!((70..=130).contains(&n), "{n}");
    }

    #[test]
    fn logins_are_new_sessions_in_the_history() {
        let l = |after_ms, p: &str| Step::Launch {
            after_ms,
            program: p.into(),
        };
        let steps = vec![
            Step::Boot,
            l(5, "a"),
            Step::Login { after_ms: 10 },
            l(1, "b"),
            Step::Evict { after_ms: 100 },
            l(1, "c"),
            Step::Boot,
            l(2, "d"),
            Step::Login { after_ms: 3 },
            l(4, "e"),
        ];
        let h = to_history_events(&steps, 0);
        let got: Vec<(u64, u32, bool)> = h
            .iter()
            .map(|e| match e {
                Event::Startup(s) => (s.at_ms, s.session, s.kind == StartupKind::Login),
                Event::Launch(l) => (l.at_ms, l.session, false),
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (0, 0, false),
                (5, 1, false),
                (15, 2, true),
                (16, 2, false),
                // The eviction is no event, but its wait passes.
                (117, 2, false),
                (117, 0, false),
                (119, 1, false),
                (122, 3, true),
                (126, 3, false),
            ]
        );
    }
}
