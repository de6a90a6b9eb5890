//! Whether a program is likely to start before the page cache is emptied
//! again: the question a preload must answer, since a preload pays off
//! only if its launch comes while its pages are still cached.
//!
//! The ranking says which program is likely to start *next*. A preload
//! read now is still useful several launches later, but not after the
//! next boot, which empties the cache. So the chance that a preload is
//! used is the chance that its program starts within the launches left
//! before the next boot, up to a horizon:
//!
//! `P(X soon) = sum over k of P(at least k more launches) * P(X first
//! starts at the k-th next launch)`
//!
//! The first factor comes from [`BootLengths`], how many launches earlier
//! boots held (a boot with three launches behind it whose predecessors
//! all ended after three has nothing more to come). The second is exact
//! for the predictor's chain: the first next launch is distributed as the
//! ranking says, each later one as the chain's transitions (smoothed by
//! frequency) say, and the probability mass that already reached X is
//! taken out at each step (a first-passage, "taboo" walk).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// Boot lengths counted at most; longer boots count as this long.
const MAX_LENGTH: usize = 64;

/// How many launches the boots seen held, decayed per boot so that a
/// change of habits shows.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BootLengths {
    /// `weights[n]`: weight of the boots that held `n` launches.
    weights: Vec<f64>,
    /// Launches since the last boot; `None` before the first boot seen.
    current: Option<usize>,
}

/// Weight kept by earlier boots at each new one.
const BOOT_DECAY: f64 = 0.9;

impl BootLengths {
    /// A boot began: the one before it ended with the launches counted.
    pub fn boot(&mut self) {
        if let Some(n) = self.current {
            let n = n.min(MAX_LENGTH);
            self.weights.iter_mut().for_each(|w| *w *= BOOT_DECAY);
            if self.weights.len() <= n {
                self.weights.resize(n + 1, 0.0);
            }
            self.weights[n] += 1.0;
        }
        self.current = Some(0);
    }

    pub fn launch(&mut self) {
        if let Some(n) = &mut self.current {
            *n += 1;
        }
    }

    /// Launches since the last boot, if a boot was seen.
    pub fn since_boot(&self) -> Option<usize> {
        self.current
    }

    /// Weight of the finished boots that held at least `n` launches.
    fn at_least(&self, n: usize) -> f64 {
        self.weights.iter().skip(n.min(MAX_LENGTH)).sum()
    }

    /// The chance that at least `k` more launches come before the next
    /// boot, for k = 1..=`horizon`: of the boots that got as far as this
    /// one, the share that went k launches further. A pseudo-count of
    /// [`PRIOR`] boots that go on keeps a few short boots from making the
    /// end certain, and lets a boot longer than any seen go on. Without a
    /// boot seen at all, every chance is 1.
    pub fn survival(&self, horizon: usize) -> Vec<f64> {
        let Some(n) = self.current else {
            return vec![1.0; horizon];
        };
        if n >= MAX_LENGTH {
            return vec![1.0; horizon];
        }
        let base = self.at_least(n) + PRIOR;
        (1..=horizon)
            .map(|k| ((self.at_least(n + k) + PRIOR) / base).clamp(0.0, 1.0))
            .collect()
    }
}

/// Boots that go on, added to those seen (see [`BootLengths::survival`]).
const PRIOR: f64 = 0.5;

/// The counts of the launches that followed one profile, and their total,
/// both in units of `scale` (see [`Chain`]).
pub type Row<'a> = (&'a HashMap<String, f64>, f64);

/// A chain's transitions as the horizon walk needs them: for each profile
/// with a row, its smoothed transition probabilities are
/// `(count(y) + smoothing * frequency(y)) / (total + smoothing)`, and
/// `frequency(y)` for a profile without one.
pub struct Chain<'a> {
    /// Decayed launch frequency of each profile (sums to 1).
    pub frequency: &'a HashMap<String, f64>,
    /// A profile's row, if it has one.
    pub row: &'a dyn Fn(&str) -> Option<Row<'a>>,
    /// What the rows' counts are divided by to be launch counts (the
    /// predictor's lazy decay).
    pub scale: f64,
    pub smoothing: f64,
}

impl Chain<'_> {
    /// One step of the chain from the distribution `p` (over profiles).
    fn step(&self, p: &HashMap<String, f64>) -> HashMap<String, f64> {
        // The part of the mass that moves as the frequency prior does.
        let mut to_prior = 0.0;
        let mut out: HashMap<String, f64> = HashMap::new();
        for (x, px) in p {
            if *px <= 0.0 {
                continue;
            }
            match (self.row)(x) {
                Some((counts, total)) if total > 0.0 => {
                    let d = total / self.scale + self.smoothing;
                    to_prior += px * self.smoothing / d;
                    for (y, c) in counts {
                        *out.entry(y.clone()).or_default() += px * c / self.scale / d;
                    }
                }
                _ => to_prior += px,
            }
        }
        if to_prior > 0.0 {
            for (y, f) in self.frequency {
                *out.entry(y.clone()).or_default() += to_prior * f;
            }
        }
        out
    }

    /// The chance that `target` starts within the launches left: `first`
    /// is the distribution of the next launch, `survival[k-1]` the chance
    /// that a k-th next launch comes at all.
    pub fn soon(&self, target: &str, first: &HashMap<String, f64>, survival: &[f64]) -> f64 {
        let mut p = first.clone();
        let mut hit = 0.0;
        for (k, s) in survival.iter().enumerate() {
            if k > 0 {
                p = self.step(&p);
            }
            // Mass reaching the target now reaches it for the first time:
            // what reached it before was taken out.
            let here = p.remove(target).unwrap_or(0.0);
            hit += s * here;
            if p.values().sum::<f64>() <= 1e-12 {
                break;
            }
        }
        hit.clamp(0.0, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dist(pairs: &[(&str, f64)]) -> HashMap<String, f64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn survival_follows_earlier_boot_lengths() {
        let mut b = BootLengths::default();
        assert_eq!(b.survival(3), vec![1.0; 3], "no boot seen: unbounded");
        let close = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9);
        // Two boots of 2 launches (weights 0.9 and 1), then a third.
        for _ in 0..2 {
            b.boot();
            b.launch();
            b.launch();
        }
        b.boot();
        let s = b.survival(3);
        assert!(close(&s, &[1.0, 1.0, 0.5 / 2.4]), "{s:?}");
        // It goes on to 3 launches: then a boot of 2 (1.71) and one of 3 (1).
        for _ in 0..3 {
            b.launch();
        }
        // Longer than any boot seen: only the prior says it goes on, and
        // it does, fully.
        assert_eq!(b.survival(2), vec![1.0, 1.0]);
        b.boot();
        b.launch();
        let s = b.survival(3);
        assert!(close(&s, &[1.0, 1.5 / 3.21, 0.5 / 3.21]), "{s:?}");
    }

    #[test]
    fn a_certain_chain_is_followed_to_its_end() {
        // a -> b -> c always; the next launch is surely a.
        let freq = dist(&[("a", 1.0 / 3.0), ("b", 1.0 / 3.0), ("c", 1.0 / 3.0)]);
        let (to_b, to_c) = (dist(&[("b", 20.0)]), dist(&[("c", 20.0)]));
        let row = |x: &str| match x {
            "a" => Some((&to_b, 20.0)),
            "b" => Some((&to_c, 20.0)),
            _ => None,
        };
        let chain = Chain {
            frequency: &freq,
            row: &row,
            scale: 2.0,
            smoothing: 0.0,
        };
        let first = dist(&[("a", 1.0)]);
        assert!((chain.soon("c", &first, &[1.0, 1.0, 1.0]) - 1.0).abs() < 1e-9);
        // ... but not when the boot surely ends after two launches.
        assert_eq!(chain.soon("c", &first, &[1.0, 1.0, 0.0]), 0.0);
        assert!((chain.soon("b", &first, &[1.0, 1.0, 0.0]) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn first_passage_counts_a_program_once() {
        // Without rows the chain draws from the frequency at every step:
        // P(a within 3) = 1 - (1 - 0.5)^3, not 3 * 0.5.
        let freq = dist(&[("a", 0.5), ("b", 0.5)]);
        let chain = Chain {
            frequency: &freq,
            row: &|_| None,
            scale: 1.0,
            smoothing: 1.0,
        };
        let p = chain.soon("a", &freq, &[1.0, 1.0, 1.0]);
        assert!((p - 0.875).abs() < 1e-9, "{p}");
    }
}
