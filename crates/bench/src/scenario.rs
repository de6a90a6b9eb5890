//! The launch scenarios of FAST §6.1.2 and Paralfetch §5, plus warmstart's
//! own: what state the cache starts in and what runs before or beside the
//! application.

use std::fmt;

use serde::{Deserialize, Serialize};

/// One way of launching the program. The order here is the order of the
/// table and the plots: baselines first, then the peers, then ours.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// The launch's files evicted first (the baseline everything is normalised to).
    Cold,
    /// Everything the launch reads already cached (by the previous launch).
    Warm,
    /// The prefetcher alone on a cold cache, until its reads are resident
    /// (FAST's t_SSD). No application runs.
    PrefetchOnly,
    /// max(warm, prefetch-only) of the same round: the best any prefetcher
    /// can do (FAST's t_bound). Computed, not run.
    Bound,
    /// FAST's bound with the launch's demand over time: the warm launch
    /// plus the longest it would wait for its data if a prefetcher that
    /// costs nothing else read it in the order it is used, at the
    /// prefetch-only rate of the same round (from a warm launch recorded
    /// at learning with each page at its own time). Computed, not run.
    Demand,
    /// A warm launch beside a replay of warmstart's plan made over private
    /// copies of its files (evicted first): the replay's whole cost, its
    /// CPU and its reads, borne by a launch that waits for no data. No
    /// replay of that plan beside the application can beat it.
    Contention,
    /// GSoC prefetcher / Windows prefetch: the application is held until a
    /// prefetch sorted by physical (FIEMAP) address completes.
    Sorted,
    /// FAST: file-level replay in recorded order, one thread, beside the
    /// application, no merging or shifting.
    Fast,
    /// Paralfetch's pre-scheduling: metadata shift and range merge of
    /// touching ranges, threaded, beside the application.
    Paralfetch,
    /// Whole files of the launch read before starting, as vmtouch-style
    /// preloaders do.
    PreloadAll,
    /// The real `vmtouch -t` on the launch's files, then the application.
    Vmtouch,
    /// warmstart's default plan, replayed beside the application.
    Warmstart,
    /// The real `warmstart run` wrapper (the warmstart binary itself, with
    /// a state directory it learned on its own launches), cold.
    Run,
    /// A cold launch with `warmstart daemon` running (it learned the
    /// program from its own first launches) and no wrapper.
    Daemon,
    /// A cold launch while recording it: the cost of learning.
    Learning,
}

impl Scenario {
    pub const ALL: [Scenario; 15] = [
        Scenario::Cold,
        Scenario::Warm,
        Scenario::PrefetchOnly,
        Scenario::Bound,
        Scenario::Demand,
        Scenario::Contention,
        Scenario::Sorted,
        Scenario::Fast,
        Scenario::Paralfetch,
        Scenario::PreloadAll,
        Scenario::Vmtouch,
        Scenario::Warmstart,
        Scenario::Run,
        Scenario::Daemon,
        Scenario::Learning,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::Cold => "cold",
            Scenario::Warm => "warm",
            Scenario::PrefetchOnly => "prefetch-only",
            Scenario::Bound => "bound",
            Scenario::Demand => "demand",
            Scenario::Contention => "contention",
            Scenario::Sorted => "sorted",
            Scenario::Fast => "fast",
            Scenario::Paralfetch => "paralfetch",
            Scenario::PreloadAll => "preload-all",
            Scenario::Vmtouch => "vmtouch",
            Scenario::Warmstart => "warmstart",
            Scenario::Run => "run",
            Scenario::Daemon => "daemon",
            Scenario::Learning => "learning",
        }
    }

    /// Whether the round needs this scenario launched (bound and demand
    /// are derived).
    pub fn is_run(self) -> bool {
        !matches!(self, Scenario::Bound | Scenario::Demand)
    }

    /// Whether the scenario starts from an evicted cache.
    pub fn starts_cold(self) -> bool {
        !matches!(
            self,
            Scenario::Warm | Scenario::Bound | Scenario::Demand | Scenario::Contention
        )
    }

    /// Whether it is a prefetching strategy whose share of the cold–warm gap
    /// is the figure of merit (as opposed to a baseline or a cost).
    pub fn is_strategy(self) -> bool {
        matches!(
            self,
            Scenario::Sorted
                | Scenario::Fast
                | Scenario::Paralfetch
                | Scenario::PreloadAll
                | Scenario::Vmtouch
                | Scenario::Warmstart
                | Scenario::Run
                | Scenario::Daemon
        )
    }

    /// Whether the scenario launches the warmstart binary (`run`, `daemon`)
    /// and so needs it found and its own learning launches.
    pub fn uses_binary(self) -> bool {
        matches!(self, Scenario::Run | Scenario::Daemon)
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The scenarios of one round, rotated by the round number so that no
/// scenario always follows the same one (each inherits whatever the previous
/// launch left behind: CPU frequency, dirty pages, a filled dentry cache).
pub fn round_order(scenarios: &[Scenario], round: usize) -> Vec<Scenario> {
    let mut run: Vec<Scenario> = scenarios.iter().copied().filter(|s| s.is_run()).collect();
    if !run.is_empty() {
        let k = round % run.len();
        run.rotate_left(k);
    }
    run
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_rotate_and_skip_bound() {
        let s = [
            Scenario::Cold,
            Scenario::Warm,
            Scenario::Bound,
            Scenario::Warmstart,
        ];
        assert_eq!(
            round_order(&s, 0),
            vec![Scenario::Cold, Scenario::Warm, Scenario::Warmstart]
        );
        assert_eq!(
            round_order(&s, 1),
            vec![Scenario::Warm, Scenario::Warmstart, Scenario::Cold]
        );
        assert_eq!(round_order(&s, 3), round_order(&s, 0));
        assert!(round_order(&[Scenario::Bound], 2).is_empty());
    }

    #[test]
    fn names_match_clap_values() {
        use clap::ValueEnum;
        for s in Scenario::ALL {
            let v = s.to_possible_value().unwrap();
            assert_eq!(v.get_name(), s.name());
        }
    }
}
