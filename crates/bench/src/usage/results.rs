//! A usage run's results: every launch and boot, the samples, and each
//! mode's totals, with the arithmetic that turns times into shares of the
//! cold–warm gap.

use serde::{Deserialize, Serialize};
use warmstart_launch::daemon::PredictionStatus;
use warmstart_predict::usage::Step;

use super::probe::Sample;
use crate::machine::Machine;
use crate::testbed::TestbedInfo;

/// A launch slower than this times its cold time did harm.
pub const HARM_RATIO: f64 = 1.02;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UsageResults {
    pub machine: Machine,
    /// The storage testbed the log ran in (`--fs`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub testbed: Option<TestbedInfo>,
    pub settings: UsageSettings,
    /// The log replayed.
    pub log: Vec<Step>,
    pub launches: Vec<LaunchResult>,
    pub boots: Vec<BootResult>,
    pub samples: Vec<Sample>,
    pub totals: Vec<ModeTotals>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UsageSettings {
    pub suite: String,
    /// `default`, or the log file, or the history it came from.
    pub log_source: String,
    pub boots: usize,
    /// The first this many boots train; the rest are measured.
    pub train_boots: usize,
    pub modes: Vec<String>,
    /// `allow-list` (the log's programs) or `all` (the daemon's policy).
    pub learn: String,
    /// The disks whose reads are counted.
    pub disks: Vec<String>,
    /// `--sequence-gap`: the longest gap within a login's startup sequence.
    #[serde(default)]
    pub sequence_gap_s: Option<f64>,
}

/// One launch of one mode.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LaunchResult {
    pub mode: String,
    /// 1-based boot, and launch within it.
    pub boot: usize,
    pub launch: usize,
    pub program: String,
    /// Of a measured boot (not a training one).
    pub measured: bool,
    /// When it began, seconds since the mode's first boot began.
    pub start_s: f64,
    pub ms: f64,
    /// The same launch in the `none` and `warm` modes.
    pub cold_ms: Option<f64>,
    pub warm_ms: Option<f64>,
    /// (cold - t) / (cold - warm).
    pub gap: Option<f64>,
    /// The daemon's preloader state and predictions (profiles, scores,
    /// residency, whether preloaded) right before the launch, in the
    /// daemon modes.
    #[serde(default)]
    pub preload_state_before: Option<String>,
    #[serde(default)]
    pub predictions_before: Option<Vec<PredictionStatus>>,
    /// Part of a login's startup sequence (the launches right after a
    /// login step, to the first gap longer than `--sequence-gap`).
    #[serde(default)]
    pub startup_sequence: bool,
    /// The first launch after an eviction while idle.
    #[serde(default)]
    pub after_eviction: bool,
}

/// What a mode's prefetcher did during one boot.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct BootResult {
    pub mode: String,
    pub boot: usize,
    pub measured: bool,
    /// Read from the counted disks from the drop of the caches to the
    /// prefetcher's stop.
    pub read_bytes: u64,
    /// The daemon's foresight counters at the end of the boot (they start
    /// from zero at each daemon start).
    pub daemon: Option<DaemonBoot>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct DaemonBoot {
    /// It had learned every launch (and, with startup plans, recorded the
    /// startup) when stopped.
    pub finished: bool,
    pub launches_learned: u64,
    pub launches_prefetched: u64,
    pub startups_recorded: u64,
    pub startup_replays: u64,
    pub history_events: usize,
    pub preloads: u64,
    pub bytes_preloaded: u64,
    pub bytes_used: u64,
    pub preloads_used: u64,
    pub preloads_unused: u64,
    /// Still held at the end of the boot: preloads no launch of the boot
    /// used (they count as read for nothing).
    pub held_bytes: u64,
}

/// One mode over the measured boots.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModeTotals {
    pub mode: String,
    pub launches: usize,
    pub total_ms: f64,
    /// Σ(cold - t) / Σ(cold - warm) over the measured launches.
    pub gap_captured: Option<f64>,
    /// Bytes preloaded that a launch used / bytes preloaded (the daemon's
    /// figures; preloads held at a boot's end count as unused). `None`:
    /// nothing preloaded, or not known (Debian's preload).
    pub precision: Option<f64>,
    pub bytes_preloaded: Option<u64>,
    pub bytes_used: Option<u64>,
    /// Most memory the daemon's preloads held, and the budget then.
    pub max_held_bytes: Option<u64>,
    pub budget_at_max_bytes: Option<u64>,
    /// Whether any sample had preloads holding more than the budget.
    pub over_budget: Option<bool>,
    pub read_bytes: u64,
    /// `read_bytes` minus the `none` mode's.
    pub extra_read_bytes: Option<i64>,
    /// Measured launches slower than [`HARM_RATIO`] times cold.
    pub slower_than_cold: usize,
    /// The slowest launch relative to its cold time.
    pub max_ratio_to_cold: Option<f64>,
    /// Measured launches of login startup sequences, and the gap captured
    /// over them as over all (`gap_captured`).
    #[serde(default)]
    pub startup_launches: usize,
    #[serde(default)]
    pub startup_gap_captured: Option<f64>,
    /// Measured first launches after an eviction, and the gap captured
    /// over them.
    #[serde(default)]
    pub eviction_launches: usize,
    #[serde(default)]
    pub eviction_gap_captured: Option<f64>,
}

/// The share of the cold–warm gap a launch of `t` captured; `None` when
/// there is no gap to capture (warm not faster than cold).
pub fn gap(cold: f64, warm: f64, t: f64) -> Option<f64> {
    (cold > warm).then(|| (cold - t) / (cold - warm))
}

/// Sets every launch's cold and warm times (the same boot and launch in
/// the `none` and `warm` modes) and its gap.
pub fn fill_baselines(launches: &mut [LaunchResult]) {
    let find = |ls: &[LaunchResult], mode: &str, boot, launch| {
        ls.iter()
            .find(|l| l.mode == mode && l.boot == boot && l.launch == launch)
            .map(|l| l.ms)
    };
    let snapshot = launches.to_vec();
    for l in launches.iter_mut() {
        l.cold_ms = find(&snapshot, "none", l.boot, l.launch);
        l.warm_ms = find(&snapshot, "warm", l.boot, l.launch);
        l.gap = match (l.cold_ms, l.warm_ms) {
            (Some(c), Some(w)) => gap(c, w, l.ms),
            _ => None,
        };
    }
}

/// Σ(cold - t) / Σ(cold - warm) over `launches` (their baselines
/// filled); `None` when a launch lacks a baseline or there is no gap.
pub fn gap_over<'a>(launches: impl IntoIterator<Item = &'a LaunchResult>) -> Option<f64> {
    let (mut saved, mut possible) = (0.0, 0.0);
    for l in launches {
        let (c, w) = (l.cold_ms?, l.warm_ms?);
        saved += c - l.ms;
        possible += c - w;
    }
    (possible > 0.0).then(|| saved / possible)
}

/// Bytes used / bytes preloaded over measured boots.
pub fn precision(boots: &[&DaemonBoot]) -> Option<f64> {
    let pre: u64 = boots.iter().map(|b| b.bytes_preloaded).sum();
    let used: u64 = boots.iter().map(|b| b.bytes_used).sum();
    (pre > 0).then(|| used as f64 / pre as f64)
}

/// Each mode's totals over the measured boots (`launches` with their
/// baselines filled).
pub fn totals(
    modes: &[String],
    launches: &[LaunchResult],
    boots: &[BootResult],
    samples: &[Sample],
) -> Vec<ModeTotals> {
    let read = |mode: &str| -> u64 {
        boots
            .iter()
            .filter(|b| b.mode == mode && b.measured)
            .map(|b| b.read_bytes)
            .sum()
    };
    let none_read = modes.iter().any(|m| m == "none").then(|| read("none"));
    modes
        .iter()
        .map(|mode| {
            let ls: Vec<&LaunchResult> = launches
                .iter()
                .filter(|l| &l.mode == mode && l.measured)
                .collect();
            let startup: Vec<&LaunchResult> =
                ls.iter().copied().filter(|l| l.startup_sequence).collect();
            let evicted: Vec<&LaunchResult> =
                ls.iter().copied().filter(|l| l.after_eviction).collect();
            let daemon: Vec<&DaemonBoot> = boots
                .iter()
                .filter(|b| &b.mode == mode && b.measured)
                .filter_map(|b| b.daemon.as_ref())
                .collect();
            let has_daemon = !daemon.is_empty();
            let measured_boots: Vec<usize> = boots
                .iter()
                .filter(|b| &b.mode == mode && b.measured)
                .map(|b| b.boot)
                .collect();
            let held = samples
                .iter()
                .filter(|s| &s.mode == mode && measured_boots.contains(&s.boot))
                .filter_map(|s| Some((s.held_bytes?, s.budget_bytes.unwrap_or(0))));
            let max_held = held.clone().max_by_key(|(h, _)| *h);
            let over = held.clone().any(|(h, b)| h > b);
            let ratios: Vec<f64> = ls
                .iter()
                .filter_map(|l| Some(l.ms / l.cold_ms.filter(|c| *c > 0.0)?))
                .collect();
            let r = read(mode);
            ModeTotals {
                mode: mode.clone(),
                launches: ls.len(),
                total_ms: ls.iter().map(|l| l.ms).sum(),
                gap_captured: gap_over(ls.iter().copied()),
                precision: precision(&daemon),
                bytes_preloaded: has_daemon.then(|| daemon.iter().map(|b| b.bytes_preloaded).sum()),
                bytes_used: has_daemon.then(|| daemon.iter().map(|b| b.bytes_used).sum()),
                max_held_bytes: has_daemon.then(|| max_held.map_or(0, |m| m.0)),
                budget_at_max_bytes: max_held.map(|m| m.1),
                over_budget: has_daemon.then_some(over),
                read_bytes: r,
                extra_read_bytes: none_read.map(|n| r as i64 - n as i64),
                slower_than_cold: ratios.iter().filter(|x| **x > HARM_RATIO).count(),
                max_ratio_to_cold: ratios.iter().copied().reduce(f64::max),
                startup_launches: startup.len(),
                startup_gap_captured: gap_over(startup),
                eviction_launches: evicted.len(),
                eviction_gap_captured: gap_over(evicted),
            }
        })
        .collect()
}

fn pct(x: Option<f64>) -> String {
    x.map_or("n/a".into(), |v| format!("{:.0}%", v * 100.0))
}

fn mib(b: Option<u64>) -> String {
    b.map_or("n/a".into(), |v| {
        format!("{:.1} MiB", v as f64 / (1 << 20) as f64)
    })
}

fn signed_mib(b: Option<i64>) -> String {
    b.map_or("n/a".into(), |v| {
        format!("{:+.1} MiB", v as f64 / (1 << 20) as f64)
    })
}

/// The rows of the per-launch table: boot, launch, program, then each
/// mode's time and gap.
fn launch_rows(r: &UsageResults) -> (Vec<String>, Vec<Vec<String>>) {
    let modes = &r.settings.modes;
    let mut head = vec!["boot".to_string(), "#".into(), "program".into()];
    head.extend(modes.iter().cloned());
    let mut keys: Vec<(usize, usize, String, bool)> = r
        .launches
        .iter()
        .map(|l| (l.boot, l.launch, l.program.clone(), l.measured))
        .collect();
    keys.sort();
    keys.dedup();
    let rows = keys
        .into_iter()
        .map(|(boot, launch, program, measured)| {
            let kind = r
                .launches
                .iter()
                .find(|l| l.boot == boot && l.launch == launch)
                .map_or("", |l| {
                    if l.startup_sequence {
                        " (login)"
                    } else if l.after_eviction {
                        " (evicted)"
                    } else {
                        ""
                    }
                });
            let mut row = vec![
                format!("{boot}{}", if measured { "" } else { " (train)" }),
                launch.to_string(),
                format!("{program}{kind}"),
            ];
            for m in modes {
                let cell = r
                    .launches
                    .iter()
                    .find(|l| &l.mode == m && l.boot == boot && l.launch == launch)
                    .map_or("-".into(), |l| match l.gap {
                        Some(g) if m != "none" && m != "warm" => {
                            format!("{:.0} ms ({:.0}%)", l.ms, g * 100.0)
                        }
                        _ => format!("{:.0} ms", l.ms),
                    });
                row.push(cell);
            }
            row
        })
        .collect();
    (head, rows)
}

fn totals_rows(r: &UsageResults) -> (Vec<String>, Vec<Vec<String>>) {
    let head = [
        "mode",
        "launches",
        "total",
        "gap captured",
        "precision",
        "preloaded",
        "max held / budget",
        "extra read",
        "slower than 1.02x cold",
    ]
    .map(String::from)
    .to_vec();
    let rows = r
        .totals
        .iter()
        .map(|t| {
            vec![
                t.mode.clone(),
                t.launches.to_string(),
                format!("{:.2} s", t.total_ms / 1e3),
                pct(t.gap_captured),
                pct(t.precision),
                mib(t.bytes_preloaded),
                match (t.max_held_bytes, t.budget_at_max_bytes) {
                    (Some(h), Some(b)) => format!("{} / {}", mib(Some(h)), mib(Some(b))),
                    (Some(h), None) => mib(Some(h)),
                    _ => "n/a".into(),
                },
                signed_mib(t.extra_read_bytes),
                match (t.slower_than_cold, t.max_ratio_to_cold) {
                    (n, Some(x)) => format!("{n} (max {x:.2}x)"),
                    (n, None) => format!("{n}"),
                },
            ]
        })
        .collect();
    (head, rows)
}

/// The rows of the goals table: each mode's gap over login startup
/// sequences and first launches after an eviction.
fn goal_rows(r: &UsageResults) -> (Vec<String>, Vec<Vec<String>>) {
    let head = [
        "mode",
        "startup-sequence launches",
        "gap captured",
        "launches after an eviction",
        "gap captured",
    ]
    .map(String::from)
    .to_vec();
    let rows = r
        .totals
        .iter()
        .map(|t| {
            vec![
                t.mode.clone(),
                t.startup_launches.to_string(),
                pct(t.startup_gap_captured),
                t.eviction_launches.to_string(),
                pct(t.eviction_gap_captured),
            ]
        })
        .collect();
    (head, rows)
}

/// Whether the goals table has anything to show: the log has logins or
/// evictions.
fn has_goals(r: &UsageResults) -> bool {
    r.log
        .iter()
        .any(|s| matches!(s, Step::Login { .. } | Step::Evict { .. }))
}

pub(crate) fn text_table(head: &[String], rows: &[Vec<String>]) -> String {
    let mut w: Vec<usize> = head.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let s: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<width$}", width = w[i]))
            .collect();
        s.join("  ").trim_end().to_string() + "\n"
    };
    let mut out = line(head);
    for r in rows {
        out += &line(r);
    }
    out
}

pub(crate) fn md_table(head: &[String], rows: &[Vec<String>]) -> String {
    let mut out = format!("| {} |\n", head.join(" | "));
    out += &format!("|{}\n", "---|".repeat(head.len()));
    for r in rows {
        out += &format!("| {} |\n", r.join(" | "));
    }
    out
}

const GAP_NOTE: &str = "Gap captured = (cold - t) / (cold - warm), cold being the `none` \
mode's time of the same launch and warm the `warm` mode's; totals are over the measured \
boots. Precision = bytes preloaded that a launch used / bytes preloaded (the daemon's \
figures; n/a for Debian's preload, whose reads are not observable).";

/// What the goals table and the per-launch marks mean.
fn goals_note(r: &UsageResults) -> String {
    format!(
        "A login's startup sequence (marked \"(login)\") is the launches after a login step, \
         each at most {} s after the step before it; \"(evicted)\" marks the first launch after \
         an eviction (caches dropped while the prefetcher ran). Gap captured over them as over all.",
        r.settings.sequence_gap_s.unwrap_or(2.0)
    )
}

/// The table printed on stdout.
pub fn render(r: &UsageResults) -> String {
    let (h, rows) = launch_rows(r);
    let (th, trows) = totals_rows(r);
    let goals = if has_goals(r) {
        let (gh, grows) = goal_rows(r);
        format!(
            "\nLogin startup sequences and launches after an eviction, over the measured \
             boots:\n{}\n{}\n",
            text_table(&gh, &grows),
            goals_note(r)
        )
    } else {
        String::new()
    };
    let testbed: String = r
        .testbed
        .iter()
        .flat_map(TestbedInfo::lines)
        .map(|l| l + "\n")
        .collect();
    format!(
        "Usage log: {} boots ({} training), {} launches; {}\n{testbed}\n{}\nTotals over the measured boots:\n{}{goals}\n{GAP_NOTE}\n",
        r.settings.boots,
        r.settings.train_boots,
        r.log.iter().filter(|s| matches!(s, Step::Launch { .. })).count(),
        r.settings.log_source,
        text_table(&h, &rows),
        text_table(&th, &trows),
    )
}

/// The results as Markdown: machine and method, then the tables.
pub fn render_markdown(r: &UsageResults) -> String {
    let (h, rows) = launch_rows(r);
    let (th, trows) = totals_rows(r);
    let (method, goals) = if has_goals(r) {
        let (gh, grows) = goal_rows(r);
        (
            " A login step started a new login session (a new audit session id) for the \
             boot's next launches; an eviction step synced and dropped the caches with the \
             prefetcher running.",
            format!(
                "### Login startup sequences and launches after an eviction\n\n{}\n{}\n\n",
                md_table(&gh, &grows),
                goals_note(r)
            ),
        )
    } else {
        ("", String::new())
    };
    let testbed = match &r.testbed {
        Some(t) => {
            let device = t
                .device
                .as_ref()
                .map(|d| format!(" Device (fio on the loop device): {d}."))
                .unwrap_or_default();
            format!(
                "Testbed: {} (image `{}`, contents {}).{device}\n\n",
                t.description,
                t.image,
                t.contents.join(", ")
            )
        }
        None => String::new(),
    };
    format!(
        "## Usage log\n\nMachine: {}.\n\n{testbed}Method: `warmstart bench usage` replayed {} \
         ({} boots, the first {} training); at each boot, sync, caches dropped, the mode's \
         prefetcher restarted with the state of its earlier boots; launches without a \
         wrapper; modes {}.{method} Reads counted on {}.\n\n### Totals\n\n{}\n{goals}### Launches\n\n{}\n{GAP_NOTE}\n",
        r.machine.describe(),
        r.settings.log_source,
        r.settings.boots,
        r.settings.train_boots,
        r.settings.modes.join(", "),
        r.settings.disks.join(", "),
        md_table(&th, &trows),
        md_table(&h, &rows),
    )
}

#[cfg(test)]
pub(crate) mod tests;
