//! The predictor: decayed frequencies, a Markov chain over successive
//! launches, and launch positions after a startup, blended.
//!
//! Counts decay per launch observed, not per second: a machine left off
//! for a week should not forget its habits, and a burst of launches
//! should not outweigh a year of them only because it is recent. Decay is
//! applied lazily through a growing scale (each observation weighs
//! `scale`, which grows by `1/decay` per launch), so observing a launch
//! costs O(1) and not O(profiles).
//!
//! Each conditional probability is smoothed towards the frequency
//! distribution (a Dirichlet prior of weight `smoothing`), so a launch
//! never seen after the current one still ranks by how common it is.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::history::{Event, History, StartupKind};
use crate::horizon::{BootLengths, Chain};

/// Which evidence the ranking uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelKind {
    /// How often each profile starts (decayed), nothing else.
    Frequency,
    /// What followed the last launch, smoothed by frequency.
    Markov,
    /// Markov, frequency and position after a startup, weighted.
    Blend,
}

/// The predictor's parameters. Defaults are what [`crate::eval`] found best
/// on the generated usage log (see its tests).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PredictorConfig {
    pub model: ModelKind,
    /// Weight kept by earlier observations at each new launch (0 < d <= 1).
    pub decay: f64,
    pub markov_weight: f64,
    pub frequency_weight: f64,
    pub startup_weight: f64,
    /// How many launches after a startup are counted by their position.
    pub startup_positions: usize,
    /// Strength of the frequency prior in conditional probabilities.
    pub smoothing: f64,
    /// Profiles tracked at most; the least frequent go first.
    pub max_profiles: usize,
    /// Launches ahead over which [`Candidate::soon`] is reckoned (a
    /// preload read now serves any of them, until the next boot empties
    /// the cache); 0 leaves it out.
    pub horizon: usize,
}

impl Default for PredictorConfig {
    fn default() -> Self {
        PredictorConfig {
            model: ModelKind::Blend,
            decay: 0.99,
            markov_weight: 0.5,
            frequency_weight: 0.2,
            startup_weight: 0.3,
            startup_positions: 6,
            smoothing: 1.0,
            max_profiles: 1024,
            horizon: 8,
        }
    }
}

/// The parts a candidate's score is made of, for `warmstart status`.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Scores {
    /// P(profile) from decayed launch counts.
    pub frequency: f64,
    /// P(profile | last launch); equal to `frequency` without a last launch.
    pub markov: f64,
    /// P(profile | position after the startup), when within the first
    /// `startup_positions` launches of one.
    pub startup: Option<f64>,
    /// Factor from the precision of this profile's earlier preloads (1 when
    /// none went unused).
    pub feedback: f64,
}

/// A profile and how likely it is to start next.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    pub profile: String,
    /// The chance that it is the next launch, times its preloads'
    /// feedback: what the ranking is ordered by.
    pub score: f64,
    pub scores: Scores,
    /// The chance that it starts within the next `horizon` launches
    /// before the next boot (see [`crate::horizon`]), times the same
    /// feedback: how likely a preload of it read now is used. Reckoned
    /// for the first [`SOON_RECKONED`] candidates only.
    #[serde(default)]
    pub soon: Option<f64>,
}

/// Candidates of a ranking whose [`Candidate::soon`] is reckoned: a
/// preloader looks at the first few only, and each costs a walk of the
/// chain.
pub const SOON_RECKONED: usize = 8;

#[derive(Debug, Clone, Default)]
struct Counts {
    by_profile: HashMap<String, f64>,
    total: f64,
}

impl Counts {
    fn add(&mut self, profile: &str, w: f64) {
        *self.by_profile.entry(profile.to_string()).or_default() += w;
        self.total += w;
    }

    fn get(&self, profile: &str) -> f64 {
        self.by_profile.get(profile).copied().unwrap_or(0.0)
    }

    fn rescale(&mut self, f: f64) {
        self.by_profile.values_mut().for_each(|v| *v *= f);
        self.total *= f;
    }

    fn remove(&mut self, profile: &str) {
        if let Some(v) = self.by_profile.remove(profile) {
            self.total = (self.total - v).max(0.0);
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Outcomes {
    used: f64,
    unused: f64,
}

/// Ranks profiles by how likely they are to start soon.
#[derive(Debug, Clone)]
pub struct Predictor {
    config: PredictorConfig,
    scale: f64,
    frequency: Counts,
    transitions: HashMap<String, Counts>,
    by_position: Vec<Counts>,
    last: Option<String>,
    /// Launches seen since the last startup; `None` before any startup.
    since_startup: Option<usize>,
    outcomes: HashMap<String, Outcomes>,
    boots: BootLengths,
}

/// Past this scale every count is divided back down, long before f64
/// loses precision.
const RESCALE_AT: f64 = 1e100;

impl Predictor {
    pub fn new(config: PredictorConfig) -> Self {
        let mut config = config;
        if !(config.decay > 0.0 && config.decay <= 1.0) {
            config.decay = PredictorConfig::default().decay;
        }
        config.max_profiles = config.max_profiles.max(1);
        Predictor {
            by_position: vec![Counts::default(); config.startup_positions],
            config,
            scale: 1.0,
            frequency: Counts::default(),
            transitions: HashMap::new(),
            last: None,
            since_startup: None,
            outcomes: HashMap::new(),
            boots: BootLengths::default(),
        }
    }

    /// A predictor trained on every event of `history`, oldest first.
    pub fn from_history(config: PredictorConfig, history: &History) -> Self {
        let mut p = Predictor::new(config);
        for e in history.events() {
            p.observe(e);
        }
        p
    }

    pub fn config(&self) -> &PredictorConfig {
        &self.config
    }

    /// Profiles known to the predictor.
    pub fn len(&self) -> usize {
        self.frequency.by_profile.len()
    }

    pub fn is_empty(&self) -> bool {
        self.frequency.by_profile.is_empty()
    }

    pub fn observe(&mut self, event: &Event) {
        match event {
            Event::Startup(s) => {
                if s.kind == StartupKind::Boot {
                    self.boots.boot();
                }
                self.since_startup = Some(0);
                // A boot or login breaks the chain: what ran before it
                // says little about what follows it.
                self.last = None;
            }
            Event::Launch(l) => self.observe_launch(&l.profile),
        }
    }

    fn observe_launch(&mut self, profile: &str) {
        self.boots.launch();
        self.scale /= self.config.decay;
        let w = self.scale;
        self.frequency.add(profile, w);
        if let Some(last) = &self.last {
            self.transitions
                .entry(last.clone())
                .or_default()
                .add(profile, w);
        }
        if let Some(k) = self.since_startup {
            if let Some(c) = self.by_position.get_mut(k) {
                c.add(profile, w);
            }
            self.since_startup = Some(k + 1);
        }
        self.last = Some(profile.to_string());
        if self.scale > RESCALE_AT {
            self.rescale();
        }
        if self.frequency.by_profile.len() > self.config.max_profiles {
            self.prune();
        }
    }

    fn rescale(&mut self) {
        let f = 1.0 / self.scale;
        self.frequency.rescale(f);
        self.transitions.values_mut().for_each(|c| c.rescale(f));
        self.by_position.iter_mut().for_each(|c| c.rescale(f));
        self.scale = 1.0;
    }

    /// Forgets the least frequent profiles down to 90% of the cap, so
    /// pruning runs once per many launches, not at every one.
    fn prune(&mut self) {
        let keep = (self.config.max_profiles * 9 / 10).max(1);
        let mut by_weight: Vec<(String, f64)> = self
            .frequency
            .by_profile
            .iter()
            .map(|(p, w)| (p.clone(), *w))
            .collect();
        by_weight.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        for (p, _) in by_weight.into_iter().skip(keep) {
            if self.last.as_deref() == Some(p.as_str()) {
                continue;
            }
            self.forget(&p);
        }
    }

    /// Drops everything known about `profile` (it was forgotten by the
    /// user, or pruned).
    pub fn forget(&mut self, profile: &str) {
        self.frequency.remove(profile);
        self.transitions.remove(profile);
        self.transitions
            .values_mut()
            .for_each(|c| c.remove(profile));
        self.by_position.iter_mut().for_each(|c| c.remove(profile));
        self.outcomes.remove(profile);
        if self.last.as_deref() == Some(profile) {
            self.last = None;
        }
    }

    /// Tells whether a preload of `profile` was used by a launch (its pages
    /// still resident when it came). Unused preloads lower its rank.
    pub fn preload_outcome(&mut self, profile: &str, used: bool) {
        let o = self.outcomes.entry(profile.to_string()).or_default();
        // Recent outcomes matter more: a program whose preloads started
        // to be used again recovers its rank.
        o.used *= 0.9;
        o.unused *= 0.9;
        if used {
            o.used += 1.0;
        } else {
            o.unused += 1.0;
        }
    }

    /// Precision of this profile's preloads with a uniform prior, as a
    /// factor: 1 until preloads go unused more often than used, down to
    /// near 0 when none is ever used.
    fn feedback(&self, profile: &str) -> f64 {
        let o = self.outcomes.get(profile).copied().unwrap_or_default();
        (2.0 * (o.used + 1.0) / (o.used + o.unused + 2.0)).min(1.0)
    }

    fn smoothed(&self, counts: Option<&Counts>, profile: &str, p_freq: f64) -> f64 {
        let a = self.config.smoothing;
        match counts {
            Some(c) if c.total > 0.0 => {
                (c.get(profile) / self.scale + a * p_freq) / (c.total / self.scale + a)
            }
            _ => p_freq,
        }
    }

    /// Every known profile, most likely first. Ties are broken by name so
    /// a ranking is reproducible.
    pub fn rank(&self) -> Vec<Candidate> {
        if self.frequency.total <= 0.0 {
            return Vec::new();
        }
        let row = self.last.as_ref().and_then(|l| self.transitions.get(l));
        let position = self
            .since_startup
            .filter(|k| *k < self.config.startup_positions)
            .map(|k| &self.by_position[k]);
        let c = &self.config;
        let mut next: HashMap<String, f64> = HashMap::new();
        let mut out: Vec<Candidate> = self
            .frequency
            .by_profile
            .iter()
            .map(|(profile, w)| {
                let frequency = w / self.frequency.total;
                let markov = self.smoothed(row, profile, frequency);
                let startup = position.map(|pc| self.smoothed(Some(pc), profile, frequency));
                let feedback = self.feedback(profile);
                let blended = match c.model {
                    ModelKind::Frequency => frequency,
                    ModelKind::Markov => markov,
                    ModelKind::Blend => {
                        let (mut sum, mut weight) =
                            (c.frequency_weight * frequency, c.frequency_weight);
                        // Without a last launch (just after a startup) the
                        // chain knows nothing the frequency does not.
                        if row.is_some() {
                            sum += c.markov_weight * markov;
                            weight += c.markov_weight;
                        }
                        if let Some(s) = startup {
                            sum += c.startup_weight * s;
                            weight += c.startup_weight;
                        }
                        if weight > 0.0 {
                            sum / weight
                        } else {
                            frequency
                        }
                    }
                };
                next.insert(profile.clone(), blended);
                Candidate {
                    profile: profile.clone(),
                    score: blended * feedback,
                    scores: Scores {
                        frequency,
                        markov,
                        startup,
                        feedback,
                    },
                    soon: None,
                }
            })
            .collect();
        out.sort_by(|a, b| {
            b.score
                .total_cmp(&a.score)
                .then_with(|| a.profile.cmp(&b.profile))
        });
        if c.horizon > 0 {
            let survival = self.boots.survival(c.horizon);
            let frequency: HashMap<String, f64> = self
                .frequency
                .by_profile
                .iter()
                .map(|(p, w)| (p.clone(), w / self.frequency.total))
                .collect();
            let row = |x: &str| self.transitions.get(x).map(|r| (&r.by_profile, r.total));
            let chain = Chain {
                frequency: &frequency,
                row: &row,
                scale: self.scale,
                smoothing: c.smoothing,
            };
            for cand in out.iter_mut().take(SOON_RECKONED) {
                let p = chain.soon(&cand.profile, &next, &survival);
                cand.soon = Some(p * cand.scores.feedback);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Launch, Startup, StartupKind};

    fn l(p: &str) -> Event {
        Event::Launch(Launch {
            profile: p.into(),
            at_ms: 0,
            session: 1,
        })
    }

    fn boot() -> Event {
        Event::Startup(Startup {
            kind: StartupKind::Boot,
            at_ms: 0,
            session: 0,
        })
    }

    fn top(p: &Predictor) -> String {
        p.rank()[0].profile.clone()
    }

    fn with(model: ModelKind) -> Predictor {
        Predictor::new(PredictorConfig {
            model,
            ..Default::default()
        })
    }

    #[test]
    fn empty_predictor_ranks_nothing() {
        assert!(with(ModelKind::Blend).rank().is_empty());
    }

    #[test]
    fn frequency_ranks_the_most_common() {
        let mut p = with(ModelKind::Frequency);
        for e in ["a", "b", "b", "c", "b", "a"] {
            p.observe(&l(e));
        }
        let r: Vec<String> = p.rank().into_iter().map(|c| c.profile).collect();
        assert_eq!(r, vec!["b", "a", "c"]);
    }

    #[test]
    fn markov_follows_the_last_launch() {
        let mut p = with(ModelKind::Markov);
        // "editor" is the most frequent, but after "build" always comes "test".
        for _ in 0..5 {
            for e in ["editor", "editor", "build", "test"] {
                p.observe(&l(e));
            }
        }
        p.observe(&l("build"));
        assert_eq!(top(&p), "test");
        p.observe(&l("test"));
        assert_eq!(top(&p), "editor");
    }

    #[test]
    fn scores_are_probabilities() {
        let mut p = with(ModelKind::Blend);
        for e in ["a", "b", "c", "a", "b"] {
            p.observe(&l(e));
        }
        let r = p.rank();
        let sum_f: f64 = r.iter().map(|c| c.scores.frequency).sum();
        let sum_m: f64 = r.iter().map(|c| c.scores.markov).sum();
        assert!((sum_f - 1.0).abs() < 1e-9, "{sum_f}");
        assert!((sum_m - 1.0).abs() < 1e-9, "{sum_m}");
    }

    #[test]
    fn startup_position_predicts_first_launches() {
        let mut p = with(ModelKind::Blend);
        // Every boot starts with "mail" then "browser"; during the day
        // "editor" dominates.
        for _ in 0..4 {
            p.observe(&boot());
            p.observe(&l("mail"));
            p.observe(&l("browser"));
            for _ in 0..6 {
                p.observe(&l("editor"));
            }
        }
        p.observe(&boot());
        let r = p.rank();
        assert_eq!(r[0].profile, "mail");
        assert!(r[0].scores.startup.is_some());
        p.observe(&l("mail"));
        assert_eq!(top(&p), "browser");
        // Past the counted positions the startup term is gone.
        for _ in 0..10 {
            p.observe(&l("editor"));
        }
        assert!(p.rank()[0].scores.startup.is_none());
    }

    #[test]
    fn the_chance_before_the_next_boot_ends_with_the_boot() {
        let mut p = with(ModelKind::Blend);
        // Every boot: "mail" then "browser", and nothing more.
        for _ in 0..5 {
            p.observe(&boot());
            p.observe(&l("mail"));
            p.observe(&l("browser"));
        }
        p.observe(&boot());
        let soon = |p: &Predictor, x: &str| {
            p.rank()
                .into_iter()
                .find(|c| c.profile == x)
                .and_then(|c| c.soon)
                .unwrap()
        };
        // Both come in this boot, though only one of them next.
        assert!(soon(&p, "browser") > 0.8, "{}", soon(&p, "browser"));
        assert!(soon(&p, "mail") > 0.8);
        p.observe(&l("mail"));
        assert!(soon(&p, "browser") > 0.8);
        p.observe(&l("browser"));
        // Boots have ended here: a preload now would wait for the next.
        assert!(soon(&p, "mail") < 0.2, "{}", soon(&p, "mail"));
        assert!(soon(&p, "browser") < 0.2);
    }

    #[test]
    fn decay_lets_new_habits_win() {
        let mut p = Predictor::new(PredictorConfig {
            model: ModelKind::Frequency,
            decay: 0.9,
            ..Default::default()
        });
        for _ in 0..30 {
            p.observe(&l("old"));
        }
        for _ in 0..15 {
            p.observe(&l("new"));
        }
        assert_eq!(top(&p), "new");
    }

    #[test]
    fn rescaling_keeps_the_ranking() {
        let mut p = Predictor::new(PredictorConfig {
            model: ModelKind::Markov,
            decay: 0.5, // the scale doubles per launch: rescales every ~330
            ..Default::default()
        });
        for _ in 0..1000 {
            p.observe(&l("a"));
            p.observe(&l("b"));
        }
        assert!(p.scale <= RESCALE_AT);
        p.observe(&l("a"));
        let r = p.rank();
        assert_eq!(r[0].profile, "b");
        assert!(r.iter().all(|c| c.score.is_finite()));
    }

    #[test]
    fn unused_preloads_lower_the_rank() {
        let mut p = with(ModelKind::Frequency);
        for e in ["a", "a", "a", "b", "b"] {
            p.observe(&l(e));
        }
        assert_eq!(top(&p), "a");
        p.preload_outcome("a", true);
        assert_eq!(p.rank()[0].scores.feedback, 1.0);
        for _ in 0..4 {
            p.preload_outcome("a", false);
        }
        assert_eq!(top(&p), "b");
        let a = p.rank().into_iter().find(|c| c.profile == "a").unwrap();
        assert!(a.scores.feedback < 0.6, "{}", a.scores.feedback);
        // Used again, it recovers.
        for _ in 0..10 {
            p.preload_outcome("a", true);
        }
        assert_eq!(top(&p), "a");
    }

    #[test]
    fn profiles_are_bounded_and_the_rare_go_first() {
        let mut p = Predictor::new(PredictorConfig {
            max_profiles: 10,
            ..Default::default()
        });
        for _ in 0..20 {
            p.observe(&l("common"));
        }
        for i in 0..100 {
            p.observe(&l(&format!("once-{i}")));
        }
        assert!(p.len() <= 10, "{}", p.len());
        assert!(p.rank().iter().any(|c| c.profile == "common"));
        // The transition rows of pruned profiles are gone too.
        assert!(p.transitions.len() <= 10);
    }

    #[test]
    fn forget_removes_a_profile_everywhere() {
        let mut p = with(ModelKind::Blend);
        for e in ["a", "b", "a", "b"] {
            p.observe(&l(e));
        }
        p.forget("b");
        let r = p.rank();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].profile, "a");
        assert!((r[0].scores.markov - 1.0).abs() < 1e-9);
    }

    #[test]
    fn a_bad_decay_falls_back_to_the_default() {
        for d in [0.0, -1.0, 1.5, f64::NAN] {
            let p = Predictor::new(PredictorConfig {
                decay: d,
                ..Default::default()
            });
            assert_eq!(p.config().decay, PredictorConfig::default().decay);
        }
    }
}
