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
    /// The plan's bytes read in one sequential stream from the testbed's
    /// loop device with direct I/O, 1 MiB requests, eight in flight: what
    /// `prefetch-only` is set against in the same round. No application
    /// runs; `--fs` only.
    Sequential,
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
    pub const ALL: [Scenario; 16] = [
        Scenario::Cold,
        Scenario::Warm,
        Scenario::PrefetchOnly,
        Scenario::Sequential,
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
            Scenario::Sequential => "sequential",
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

    /// Whether its share of the cold–warm gap means anything: cold is 0 by
    /// definition, prefetch-only and sequential run no application (they
    /// are read as times), and learning is a cost.
    pub fn has_gap(self) -> bool {
        !matches!(
            self,
            Scenario::Cold | Scenario::PrefetchOnly | Scenario::Sequential | Scenario::Learning
        )
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

/// The scenarios of one round, in row `round` of a Williams design: over
/// `n` rounds (`2n` when `n` is odd) every scenario takes every place in
/// the round equally often and follows every other scenario equally often.
/// Each launch inherits whatever the previous one left behind (CPU
/// frequency, dirty pages, a filled dentry cache, the host's state under
/// a VM), so no scenario may always follow the same one. A plain rotation
/// does not do that: it moves every scenario's place, but keeps its
/// predecessor. On the project's VM a `run` launch right after a warm
/// launch took 59 ms less than the same `run` launch right after it (the
/// Python demo's scipy import, median of 12 rounds, faster in 10 of 12).
pub fn round_order(scenarios: &[Scenario], round: usize) -> Vec<Scenario> {
    let run: Vec<Scenario> = scenarios.iter().copied().filter(|s| s.is_run()).collect();
    williams_row(run.len(), round)
        .into_iter()
        .map(|i| run[i])
        .collect()
}

/// Row `round` of a Williams design over `0..n`: the first row is
/// 0, 1, n−1, 2, n−2, …, each next one adds 1 (mod n), and for odd `n`
/// the rows from `n` on are the first `n` reversed.
fn williams_row(n: usize, round: usize) -> Vec<usize> {
    if n == 0 {
        return Vec::new();
    }
    let rows = if n.is_multiple_of(2) { n } else { 2 * n };
    let r = round % rows;
    let first = (0..n).map(|j| match j {
        0 => 0,
        j if j % 2 == 1 => j.div_ceil(2),
        j => n - j / 2,
    });
    let mut row: Vec<usize> = first.map(|b| (b + r % n) % n).collect();
    if r >= n {
        row.reverse();
    }
    row
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scenario_follows_every_other_equally_often() {
        for n in 1..=12usize {
            let rows = if n.is_multiple_of(2) { n } else { 2 * n };
            let mut follows = vec![vec![0usize; n]; n];
            let mut places = vec![vec![0usize; n]; n];
            for r in 0..rows {
                let row = williams_row(n, r);
                let mut sorted = row.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "n={n} row {r}: {row:?}");
                for (place, &i) in row.iter().enumerate() {
                    places[i][place] += 1;
                }
                for w in row.windows(2) {
                    follows[w[0]][w[1]] += 1;
                }
            }
            let each = rows / n;
            for i in 0..n {
                assert!(places[i].iter().all(|&c| c == each), "n={n}: {places:?}");
                for j in 0..n {
                    let want = if i == j { 0 } else { each };
                    assert_eq!(follows[i][j], want, "n={n}: {i} then {j}: {follows:?}");
                }
            }
            // The design repeats.
            assert_eq!(williams_row(n, rows), williams_row(n, 0));
        }
    }

    #[test]
    fn rounds_follow_the_design_and_skip_bound() {
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
        // Three scenarios: the rows from the third on are the first three
        // reversed, and the design repeats after six.
        assert_eq!(
            round_order(&s, 3),
            vec![Scenario::Warmstart, Scenario::Warm, Scenario::Cold]
        );
        assert_eq!(round_order(&s, 6), round_order(&s, 0));
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
