//! `--runs N`: the log replayed N times, the modes in turn, and each
//! mode's figures over the runs. One run measures each launch once per
//! mode, and the same warm launch can move by a third between runs on a
//! shared machine: a figure is worth quoting as the median and range of
//! several runs.

use serde::{Deserialize, Serialize};

use super::prefetcher::Mode;
use super::results::{self, UsageResults};
use crate::stats::median;

/// Every run, and the spread of each mode's figures over them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UsageRuns {
    pub runs: Vec<UsageResults>,
    pub summary: Vec<ModeSpread>,
}

/// One mode's totals over the runs in which it completed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModeSpread {
    pub mode: String,
    pub runs: usize,
    pub gap_captured: Spread,
    pub startup_gap_captured: Spread,
    pub eviction_gap_captured: Spread,
    /// Measured launches slower than 1.02 times cold, over all runs.
    pub slower_than_cold: usize,
    pub launches: usize,
}

/// The median and range of a figure over the runs that had it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub median: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
}

impl Spread {
    fn of(xs: &[f64]) -> Spread {
        Spread {
            median: median(xs),
            min: xs.iter().copied().reduce(f64::min),
            max: xs.iter().copied().reduce(f64::max),
        }
    }

    /// `72% (65–80%)`; `n/a` when no run had the figure.
    fn show(&self) -> String {
        match (self.median, self.min, self.max) {
            (Some(m), Some(lo), Some(hi)) => {
                format!("{:.0}% ({:.0}–{:.0}%)", m * 100.0, lo * 100.0, hi * 100.0)
            }
            _ => "n/a".into(),
        }
    }
}

/// The order of the modes in run `run` (0-based): as asked in even runs,
/// reversed in odd ones, so that no mode always follows the same one.
pub fn order(modes: &[Mode], run: usize) -> Vec<Mode> {
    if run % 2 == 1 {
        modes.iter().rev().copied().collect()
    } else {
        modes.to_vec()
    }
}

/// Each mode's spread over `runs`, in the order of the first run's totals.
pub fn summarize(runs: &[UsageResults]) -> Vec<ModeSpread> {
    let mut modes: Vec<&str> = Vec::new();
    for t in runs.iter().flat_map(|r| &r.totals) {
        if !modes.contains(&t.mode.as_str()) {
            modes.push(&t.mode);
        }
    }
    modes
        .into_iter()
        .map(|mode| {
            let totals: Vec<&results::ModeTotals> = runs
                .iter()
                .filter_map(|r| r.totals.iter().find(|t| t.mode == mode))
                .collect();
            let over = |f: fn(&results::ModeTotals) -> Option<f64>| {
                Spread::of(&totals.iter().filter_map(|t| f(t)).collect::<Vec<_>>())
            };
            ModeSpread {
                mode: mode.to_string(),
                runs: totals.len(),
                gap_captured: over(|t| t.gap_captured),
                startup_gap_captured: over(|t| t.startup_gap_captured),
                eviction_gap_captured: over(|t| t.eviction_gap_captured),
                slower_than_cold: totals.iter().map(|t| t.slower_than_cold).sum(),
                launches: totals.iter().map(|t| t.launches).sum(),
            }
        })
        .collect()
}

fn summary_rows(r: &UsageRuns) -> (Vec<String>, Vec<Vec<String>>) {
    let head = [
        "mode",
        "runs",
        "gap captured",
        "login sequences",
        "after an eviction",
        "slower than 1.02x cold",
    ]
    .map(String::from)
    .to_vec();
    let rows = r
        .summary
        .iter()
        .map(|s| {
            vec![
                s.mode.clone(),
                s.runs.to_string(),
                s.gap_captured.show(),
                s.startup_gap_captured.show(),
                s.eviction_gap_captured.show(),
                format!("{} of {}", s.slower_than_cold, s.launches),
            ]
        })
        .collect();
    (head, rows)
}

const SPREAD_NOTE: &str = "Median (min–max) over the runs of each mode's gap captured over \
the measured boots; the modes ran in turn, in reverse order every other run.";

/// Each run's tables, then the spread over the runs.
pub fn render(r: &UsageRuns) -> String {
    let n = r.runs.len();
    let mut out = String::new();
    for (i, run) in r.runs.iter().enumerate() {
        out += &format!("Run {} of {n}\n{}\n", i + 1, results::render(run));
    }
    let (h, rows) = summary_rows(r);
    let runs = if n == 1 { "run" } else { "runs" };
    out + &format!(
        "Over {n} {runs}:\n{}\n{SPREAD_NOTE}\n",
        results::text_table(&h, &rows)
    )
}

/// The spread over the runs first, then each run as one run's Markdown.
pub fn render_markdown(r: &UsageRuns) -> String {
    let n = r.runs.len();
    let (h, rows) = summary_rows(r);
    let runs = if n == 1 { "run" } else { "runs" };
    let mut out = format!(
        "## Usage log, over {n} {runs}\n\n{}\n{SPREAD_NOTE}\n\n",
        results::md_table(&h, &rows)
    );
    for (i, run) in r.runs.iter().enumerate() {
        let one = results::render_markdown(run);
        let one = one.replacen(
            "## Usage log",
            &format!("## Usage log, run {} of {n}", i + 1),
            1,
        );
        out += &one.replace("\n### ", "\n#### ");
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::results::ModeTotals;

    fn totals(mode: &str, gap: Option<f64>, slower: usize) -> ModeTotals {
        ModeTotals {
            mode: mode.into(),
            launches: 10,
            total_ms: 1.0,
            gap_captured: gap,
            precision: None,
            bytes_preloaded: None,
            bytes_used: None,
            max_held_bytes: None,
            budget_at_max_bytes: None,
            over_budget: None,
            read_bytes: 0,
            extra_read_bytes: None,
            slower_than_cold: slower,
            max_ratio_to_cold: None,
            startup_launches: 0,
            startup_gap_captured: None,
            eviction_launches: 0,
            eviction_gap_captured: None,
        }
    }

    fn run(t: Vec<ModeTotals>) -> UsageResults {
        let mut r = crate::usage::results::tests::results(vec![], vec![]);
        r.totals = t;
        r
    }

    #[test]
    fn the_spread_is_over_the_runs_a_mode_completed() {
        let runs = [
            run(vec![
                totals("none", Some(0.0), 0),
                totals("predict", Some(0.72), 1),
            ]),
            run(vec![
                totals("predict", Some(1.17), 2),
                totals("none", Some(0.0), 0),
            ]),
            run(vec![
                totals("none", Some(0.0), 0),
                totals("predict", Some(0.96), 0),
            ]),
            // `predict` failed in this one.
            run(vec![totals("none", Some(0.0), 0)]),
        ];
        let s = summarize(&runs);
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].mode.as_str(), s[0].runs), ("none", 4));
        let p = &s[1];
        assert_eq!((p.mode.as_str(), p.runs), ("predict", 3));
        assert_eq!(p.gap_captured.median, Some(0.96));
        assert_eq!(
            (p.gap_captured.min, p.gap_captured.max),
            (Some(0.72), Some(1.17))
        );
        assert_eq!(p.startup_gap_captured.median, None);
        assert_eq!((p.slower_than_cold, p.launches), (3, 30));
        assert_eq!(p.gap_captured.show(), "96% (72–117%)");
        assert_eq!(p.startup_gap_captured.show(), "n/a");
        let all = UsageRuns {
            runs: runs.to_vec(),
            summary: s,
        };
        let text = render(&all);
        assert!(
            text.contains("Run 4 of 4") && text.contains("Over 4 runs"),
            "{text}"
        );
        let md = render_markdown(&all);
        assert!(md.starts_with("## Usage log, over 4 runs"), "{md}");
        assert!(md.contains("## Usage log, run 2 of 4"), "{md}");
        assert!(
            md.contains("| predict | 3 | 96% (72–117%) | n/a | n/a | 3 of 30 |"),
            "{md}"
        );
    }

    #[test]
    fn every_other_run_takes_the_modes_in_reverse() {
        let m = [Mode::None, Mode::Predict, Mode::Warm];
        assert_eq!(order(&m, 0), m);
        assert_eq!(order(&m, 1), [Mode::Warm, Mode::Predict, Mode::None]);
        assert_eq!(order(&m, 2), m);
    }
}
