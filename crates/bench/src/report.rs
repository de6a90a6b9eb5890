//! The human-readable results: one table per program (median, min…max,
//! ratio to cold, share of the cold–warm gap captured) and, across
//! programs, the mean gap each strategy captured.

use std::fmt::Write;

use crate::export::Results;
use crate::runner::Summary;
use crate::scenario::Scenario;

/// "812.3 ms", "4.21 s".
pub fn fmt_time(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.2} s")
    } else {
        format!("{:.1} ms", s * 1e3)
    }
}

fn fmt_pct(x: Option<f64>) -> String {
    x.map_or("–".into(), |v| format!("{:.0}%", v * 100.0))
}

/// The table of one program.
pub fn program_table(summary: &[Summary]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "  {:<14} {:>10}  {:>23}  {:>7}  {:>12}  {:>6}",
        "scenario", "median", "min … max", "vs cold", "gap captured", "paired"
    );
    for s in summary {
        // The gap is a figure of merit for launches that a prefetcher
        // speeds up; for cold it is 0 by definition, and prefetch-only
        // (no application) and learning (a cost) are read as ratios.
        let no_gap = !s.scenario.has_gap();
        let gap = |g: Option<f64>| {
            if no_gap {
                "–".to_string()
            } else {
                fmt_pct(g)
            }
        };
        let _ = writeln!(
            out,
            "  {:<14} {:>10}  {:>23}  {:>7}  {:>12}  {:>6}{}",
            s.scenario.name(),
            fmt_time(s.median_s),
            format!("{} … {}", fmt_time(s.min_s), fmt_time(s.max_s)),
            s.vs_cold.map_or("–".into(), |v| format!("{v:.2}")),
            gap(s.gap_captured),
            gap(s.paired_gap),
            if s.outlier_rounds.is_empty() {
                String::new()
            } else {
                format!("  (outliers in rounds {:?})", s.outlier_rounds)
            }
        );
    }
    out
}

/// Mean share of the gap captured per scenario, over the programs that
/// have a gap (cold slower than warm).
pub fn mean_gaps(results: &Results) -> Vec<(Scenario, f64, usize)> {
    mean_of(results, |s| s.gap_captured)
}

/// The same for the gap captured from paired rounds.
pub fn mean_paired_gaps(results: &Results) -> Vec<(Scenario, f64, usize)> {
    mean_of(results, |s| s.paired_gap)
}

fn mean_of(
    results: &Results,
    gap: impl Fn(&Summary) -> Option<f64>,
) -> Vec<(Scenario, f64, usize)> {
    let mut out = Vec::new();
    for sc in Scenario::ALL {
        if !sc.has_gap() {
            continue;
        }
        let g: Vec<f64> = results
            .programs
            .iter()
            .flat_map(|p| p.summary.iter())
            .filter(|s| s.scenario == sc)
            .filter_map(&gap)
            .collect();
        if !g.is_empty() {
            out.push((sc, g.iter().sum::<f64>() / g.len() as f64, g.len()));
        }
    }
    out
}

/// Mean ratio to cold per scenario over all programs.
pub fn mean_vs_cold(results: &Results) -> Vec<(Scenario, f64)> {
    let mut out = Vec::new();
    for sc in Scenario::ALL {
        let g: Vec<f64> = results
            .programs
            .iter()
            .flat_map(|p| p.summary.iter())
            .filter(|s| s.scenario == sc)
            .filter_map(|s| s.vs_cold)
            .collect();
        if !g.is_empty() {
            out.push((sc, g.iter().sum::<f64>() / g.len() as f64));
        }
    }
    out
}

/// Lines warning about outliers, as hyperfine words them.
pub fn outlier_warnings(results: &Results) -> Vec<String> {
    let mut w = Vec::new();
    for p in &results.programs {
        for s in &p.summary {
            if !s.outlier_rounds.is_empty() {
                w.push(format!(
                    "{} / {}: statistical outliers in round(s) {:?}. Consider re-running on a quiet \
                     system without interference from other programs, or with more --runs.",
                    p.name, s.scenario, s.outlier_rounds
                ));
            }
        }
    }
    w
}

/// Programs where warmstart captured less of the gap than a peer, and
/// where `warmstart run` or the daemon was slower than a cold start.
pub fn losses(results: &Results) -> Vec<String> {
    let mut out = Vec::new();
    for p in &results.programs {
        let gap = |sc: Scenario| {
            p.summary
                .iter()
                .find(|s| s.scenario == sc)
                .and_then(|s| s.gap_captured)
        };
        for sc in [Scenario::Run, Scenario::Daemon] {
            if let Some(g) = gap(sc).filter(|g| *g < 0.0) {
                out.push(format!(
                    "{}: {sc} was slower than a cold start (gap captured {})",
                    p.name,
                    fmt_pct(Some(g))
                ));
            }
        }
        let Some(ours) = gap(Scenario::Warmstart) else {
            continue;
        };
        for peer in [
            Scenario::Sorted,
            Scenario::Fast,
            Scenario::Paralfetch,
            Scenario::PreloadAll,
            Scenario::Vmtouch,
        ] {
            if let Some(theirs) = gap(peer) {
                if theirs > ours {
                    out.push(format!(
                        "{}: {} captured {} of the gap, warmstart {}",
                        p.name,
                        peer,
                        fmt_pct(Some(theirs)),
                        fmt_pct(Some(ours))
                    ));
                }
            }
        }
    }
    out
}

/// One line on `warmstart run`'s own costs over the launches it
/// prefetched (medians): what the in-process replay does not pay.
pub fn wrapper_costs(runs: &[crate::runner::Run]) -> Option<String> {
    let times: Vec<_> = runs
        .iter()
        .filter(|r| r.scenario == Scenario::Run)
        .filter_map(|r| r.wrapper)
        .filter(|w| w.before_replay_ms.is_some())
        .collect();
    let median = |f: fn(&crate::runner::WrapperTimes) -> Option<f64>| {
        let v: Vec<f64> = times.iter().filter_map(f).collect();
        crate::stats::median(&v).map_or("-".into(), |m| format!("{m:.1} ms"))
    };
    (!times.is_empty()).then(|| {
        format!(
            "run's own costs (medians of {3} prefetched launches): replay started {0} after \
             the wrapper began deciding, program held {1} for the head start, caller kept {2} \
             after the exit",
            median(|w| w.before_replay_ms),
            median(|w| w.held_ms),
            median(|w| w.after_exit_ms),
            times.len()
        )
    })
}

/// One line on a standalone replay against reading its bytes in one
/// sequential stream (the 1.3x goal). With `sequential` rounds,
/// the median over rounds of `prefetch-only`'s time over `sequential`'s in
/// the same round; else, with `seq_mb_s` (fio's 1 MiB sequential read of
/// the same device in the same run), the median `prefetch-only` time over
/// the time its median device bytes take at that rate. `None` without
/// prefetch-only rounds or either ruler.
pub fn standalone_vs_sequential(
    runs: &[crate::runner::Run],
    seq_mb_s: Option<f64>,
) -> Option<String> {
    let of = |s: Scenario| -> Vec<&crate::runner::Run> {
        runs.iter().filter(|r| r.scenario == s).collect()
    };
    let (alone, seq) = (of(Scenario::PrefetchOnly), of(Scenario::Sequential));
    let ratios: Vec<f64> = alone
        .iter()
        .filter_map(|a| {
            let s = seq.iter().find(|s| s.round == a.round)?;
            (s.time_s > 0.0).then(|| a.time_s / s.time_s)
        })
        .collect();
    if let Some(r) = crate::stats::median(&ratios) {
        let t: Vec<f64> = seq.iter().map(|s| s.time_s).collect();
        return Some(format!(
            "prefetch-only took {r:.2}x the time of reading its bytes sequentially \
             (sequential: {} median; paired median of {} rounds)",
            fmt_time(crate::stats::median(&t)?),
            ratios.len()
        ));
    }
    let times: Vec<f64> = alone.iter().map(|r| r.time_s).collect();
    let bytes: Vec<f64> = alone
        .iter()
        .filter_map(|r| r.device_read_bytes)
        .map(|b| b as f64)
        .collect();
    let (t, b, rate) = (
        crate::stats::median(&times)?,
        crate::stats::median(&bytes)?,
        seq_mb_s?,
    );
    if b <= 0.0 || rate <= 0.0 {
        return None;
    }
    let sequential = b / (rate * 1e6);
    Some(format!(
        "prefetch-only took {:.2}x the time its device bytes take read sequentially \
         ({:.1} MB: {} at fio's {:.1} MB/s; medians of {} rounds)",
        t / sequential,
        b / 1e6,
        fmt_time(sequential),
        rate,
        alone.len()
    ))
}

/// fio's 1 MiB sequential read of the testbed's device model, MB/s, if
/// the run measured one (`--storage`).
pub fn fio_sequential_rate(results: &Results) -> Option<f64> {
    let t = results.testbed.as_ref()?;
    t.device.as_ref().map(|d| d.seq1m_mb_s)
}

/// The whole report.
pub fn render(results: &Results) -> String {
    let mut out = String::new();
    if let Some(t) = &results.testbed {
        for l in t.lines() {
            let _ = writeln!(out, "{l}");
        }
        out.push('\n');
    }
    for p in &results.programs {
        let _ = writeln!(
            out,
            "{}: {}   (ready: {}, {} rounds)",
            p.name,
            p.command.join(" "),
            p.ready,
            results.settings.rounds
        );
        let l = &p.learned;
        let _ = writeln!(
            out,
            "  learned from {} traces [{}]: {} files, {:.1} MiB data, {:.1} MiB metadata",
            l.traces,
            l.backend,
            l.files,
            l.data_bytes as f64 / 1048576.0,
            l.metadata_bytes as f64 / 1048576.0
        );
        for n in &l.notes {
            let _ = writeln!(out, "  note: {n}");
        }
        out.push_str(&program_table(&p.summary));
        if let Some(w) = wrapper_costs(&p.runs) {
            let _ = writeln!(out, "  {w}");
        }
        if let Some(l) = standalone_vs_sequential(&p.runs, fio_sequential_rate(results)) {
            let _ = writeln!(out, "  {l}");
        }
        out.push('\n');
    }
    if results.programs.len() > 1 {
        let _ = writeln!(out, "mean over {} programs:", results.programs.len());
        let gaps = mean_gaps(results);
        let paired = mean_paired_gaps(results);
        for (sc, v) in mean_vs_cold(results) {
            let g = gaps.iter().find(|x| x.0 == sc);
            let p = paired.iter().find(|x| x.0 == sc);
            let _ = writeln!(
                out,
                "  {:<14} vs cold {:.2}   gap captured {:>5}  paired {:>5}{}",
                sc.name(),
                v,
                fmt_pct(g.map(|x| x.1)),
                fmt_pct(p.map(|x| x.1)),
                match (g, p) {
                    (Some(g), Some(p)) if p.2 != g.2 => {
                        format!(" ({} programs; paired: {})", g.2, p.2)
                    }
                    (Some(g), _) => format!(" ({} programs)", g.2),
                    _ => String::new(),
                }
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::tests::sample;

    #[test]
    fn renders_every_scenario_with_ratios() {
        let r = sample();
        let text = render(&r);
        assert!(text.contains("demo: true"), "{text}");
        let line = |name: &str| {
            text.lines()
                .find(|l| l.trim_start().starts_with(name))
                .unwrap_or_else(|| panic!("{name} missing in\n{text}"))
                .to_string()
        };
        assert!(line("cold").contains("2.00 s"));
        assert!(line("cold").contains("1.00"));
        assert!(line("warm ").contains("100%"));
        assert!(line("warmstart").contains("0.62"));
        assert!(line("warmstart").contains("75%"));
        assert!(line("bound").contains("1.00 s"));
        assert!(line("run").contains("75%"));
        assert!(line("daemon").contains("0.62"));
        assert!(
            text.contains(
                "run's own costs (medians of 2 prefetched launches): replay started 6.5 ms after \
                 the wrapper began deciding, program held 3.0 ms for the head start, caller kept \
                 1.5 ms after the exit"
            ),
            "{text}"
        );
    }

    #[test]
    fn wrapper_costs_count_only_prefetched_run_launches() {
        let mut r = sample();
        let runs = &mut r.programs[0].runs;
        // A launch that was learned or found warm starts no replay.
        for x in runs.iter_mut().filter(|x| x.scenario == Scenario::Run) {
            x.wrapper.as_mut().unwrap().before_replay_ms = None;
        }
        assert_eq!(wrapper_costs(runs), None);
        runs.iter_mut()
            .find(|x| x.scenario == Scenario::Run)
            .unwrap()
            .wrapper
            .as_mut()
            .unwrap()
            .before_replay_ms = Some(9.0);
        assert!(wrapper_costs(runs)
            .unwrap()
            .contains("replay started 9.0 ms after"));
        assert!(wrapper_costs(runs)
            .unwrap()
            .contains("medians of 1 prefetched"));
    }

    #[test]
    fn a_standalone_replay_is_set_against_a_sequential_read_of_its_bytes() {
        let mut r = sample();
        let runs = &mut r.programs[0].runs;
        assert_eq!(
            standalone_vs_sequential(runs, Some(100.0)),
            None,
            "no device counter outside a testbed"
        );
        let mut n = 0;
        for (i, x) in runs
            .iter_mut()
            .filter(|x| x.scenario == Scenario::PrefetchOnly)
            .enumerate()
        {
            // 0.5 s and 0.7 s for 40 and 60 MB: medians 0.6 s, 50 MB.
            x.time_s = 0.5 + 0.2 * i as f64;
            x.device_read_bytes = Some(40_000_000 + 20_000_000 * i as u64);
            n += 1;
        }
        assert_eq!(n, 2, "the sample has two prefetch-only rounds");
        let l = standalone_vs_sequential(runs, Some(100.0)).unwrap();
        assert!(
            l.starts_with("prefetch-only took 1.20x the time"),
            "50 MB at 100 MB/s is 0.5 s: {l}"
        );
        assert!(
            l.contains("(50.0 MB: 500.0 ms at fio's 100.0 MB/s; medians of 2 rounds)"),
            "{l}"
        );
        assert_eq!(standalone_vs_sequential(runs, Some(0.0)), None);
        assert_eq!(standalone_vs_sequential(runs, None), None);
        // Sequential rounds of the same run come first: 0.5 / 0.4 and
        // 0.7 / 0.5 s, a paired median of 1.325.
        let mut seq: Vec<_> = runs
            .iter()
            .filter(|x| x.scenario == Scenario::PrefetchOnly)
            .cloned()
            .collect();
        for (i, x) in seq.iter_mut().enumerate() {
            x.scenario = Scenario::Sequential;
            x.time_s = 0.4 + 0.1 * i as f64;
        }
        runs.extend(seq);
        let l = standalone_vs_sequential(runs, Some(100.0)).unwrap();
        assert!(
            l.starts_with("prefetch-only took 1.32x the time of reading its bytes sequentially"),
            "{l}"
        );
        assert!(
            l.contains("(sequential: 450.0 ms median; paired median of 2 rounds)"),
            "{l}"
        );
    }

    #[test]
    fn run_or_daemon_slower_than_cold_is_noted() {
        let mut r = sample();
        for s in &mut r.programs[0].summary {
            if s.scenario == Scenario::Daemon {
                s.gap_captured = Some(-0.2);
            }
        }
        let l = losses(&r);
        assert_eq!(l.len(), 1, "{l:?}");
        assert!(
            l[0].contains("daemon was slower than a cold start"),
            "{l:?}"
        );
        let g = mean_gaps(&r);
        assert!(g.iter().any(|x| x.0 == Scenario::Run));
    }

    #[test]
    fn times_and_losses() {
        assert_eq!(fmt_time(0.8123), "812.3 ms");
        assert_eq!(fmt_time(4.214), "4.21 s");
        assert!(losses(&sample()).is_empty());
        let g = mean_gaps(&sample());
        assert_eq!(g[0], (Scenario::Warm, 1.0, 1));
        assert!(g.iter().all(|x| x.0 != Scenario::PrefetchOnly));
    }
}
