//! The usage log a run replays: boots, each with launches and the time
//! before each.
//!
//! A log is JSON lines of [`Step`], the format `warmstart_predict::usage`
//! serializes (`{"step":"boot"}`, `{"step":"launch","after_ms":4000,
//! "program":"clang"}`, `{"step":"login","after_ms":3000}`,
//! `{"step":"evict","after_ms":2000}`). It comes from a file, from the shipped default
//! ([`default_spec`], generated), or from a daemon's own launch history
//! ([`from_history`]).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use warmstart_predict::usage::{generate, EvictSpec, LoginSpec, Routine, Step, UsageSpec};
use warmstart_predict::{Event, History, StartupKind};

/// One launch of a boot, with the log line it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLaunch {
    /// 1-based line of the log file (0 for a log not read from a file).
    pub line: usize,
    pub after_ms: u64,
    pub program: String,
}

/// What a [`Marker`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerKind {
    /// A new login session: the launches after it run in it.
    Login,
    /// Sync and drop the caches, the prefetcher left running.
    Evict,
}

/// A step of a boot that launches nothing, placed before the launch of
/// index `before` (`launches.len()`: after the last).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Marker {
    pub line: usize,
    pub before: usize,
    pub after_ms: u64,
    pub kind: MarkerKind,
}

/// One simulated boot and the launches that follow it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Boot {
    pub line: usize,
    pub launches: Vec<LogLaunch>,
    /// Logins and evictions, in log order.
    pub markers: Vec<Marker>,
}

impl Boot {
    /// The markers right before launch `n` (`launches.len()`: those after
    /// the last launch).
    pub fn markers_before(&self, n: usize) -> impl Iterator<Item = &Marker> {
        self.markers.iter().filter(move |m| m.before == n)
    }
}

/// What a launch is for the totals of issue 21's goals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LaunchKind {
    /// Part of a login's startup sequence: after a login step, each
    /// launch no longer than the sequence gap after the step before it
    /// (the login, or the previous launch); the first longer gap, an
    /// eviction or the next boot ends the sequence.
    pub startup_sequence: bool,
    /// The first launch after an eviction.
    pub after_eviction: bool,
}

/// Each launch's [`LaunchKind`] in `boot`, in order.
pub fn launch_kinds(boot: &Boot, sequence_gap_ms: u64) -> Vec<LaunchKind> {
    let (mut in_sequence, mut evicted) = (false, false);
    let mut out = Vec::with_capacity(boot.launches.len());
    for (n, l) in boot.launches.iter().enumerate() {
        for m in boot.markers_before(n) {
            match m.kind {
                MarkerKind::Login => in_sequence = true,
                MarkerKind::Evict => {
                    in_sequence = false;
                    evicted = true;
                }
            }
        }
        in_sequence &= l.after_ms <= sequence_gap_ms;
        out.push(LaunchKind {
            startup_sequence: in_sequence,
            after_eviction: std::mem::take(&mut evicted),
        });
    }
    out
}

/// The default log: habits over the suite's programs that start in a few
/// seconds (GIMP and LibreOffice are left out, to keep a six-mode run
/// short: the log waits 172 s per mode between its steps), 8 boots. Each boot logs in after 2 to 4 s;
/// the session autostarts gedit and clang, 300 to 800 ms apart (a login's
/// startup sequence); then one routine with some noise, 1 to 4 launches 2
/// to 6 s apart. About one boot in three empties the cache while idle
/// after one of its routine launches (1 to 3 s after it), and the next
/// launch comes 10 to 15 s later. The seed is the first that
/// [`meets_default_criterion`]: the measured boots (5 to 8) launch every
/// program of the routines, the training boots (1 to 4) launch each of
/// them at least twice (the daemon learns a program from its first two
/// launches: before that no prefetcher of its can help), the measured
/// boots all launch different programs, at least two of them have an
/// eviction followed by a launch, and no more than a third of all boots
/// (rounded up) have one.
pub fn default_spec() -> UsageSpec {
    let r = |p: &[&str], weight| Routine {
        programs: p.iter().map(|s| s.to_string()).collect(),
        weight,
    };
    UsageSpec {
        routines: vec![
            // Editing and building C and Java.
            r(&["gedit", "clang", "javac", "clang"], 3),
            // A data-analysis session.
            r(&["python-scipy", "gedit", "python-scipy"], 2),
            // A JavaScript project with a native part.
            r(&["npm", "gedit", "clang", "npm"], 2),
        ],
        boots: 8,
        routines_per_boot: 1,
        noise: 0.15,
        skip: 0.1,
        gap_ms: (2_000, 6_000),
        seed: SEED,
        login: Some(LoginSpec {
            after_ms: (2_000, 4_000),
            autostart: vec!["gedit".into(), "clang".into()],
            gap_ms: (300, 800),
            skip: 0.0,
        }),
        evict: Some(EvictSpec {
            chance: 1.0 / 3.0,
            after_ms: (1_000, 3_000),
            idle_ms: (10_000, 15_000),
        }),
    }
}

/// The default log's seed (see [`default_spec`]).
const SEED: u64 = 270;

/// Whether `boots`, generated from `spec`, the first `train` of them
/// training, fit the default log's criterion (see [`default_spec`]).
pub fn meets_default_criterion(spec: &UsageSpec, boots: &[Boot], train: usize) -> bool {
    let (training, measured) = boots.split_at(train.min(boots.len()));
    let launched = |bs: &[Boot], p: &str| {
        bs.iter()
            .flat_map(|b| &b.launches)
            .filter(|l| l.program == p)
            .count()
    };
    let trained = measured
        .iter()
        .flat_map(|b| &b.launches)
        .all(|l| launched(training, &l.program) >= 2);
    let programs: Vec<Vec<&str>> = measured
        .iter()
        .map(|b| b.launches.iter().map(|l| l.program.as_str()).collect())
        .collect();
    let differ = programs
        .iter()
        .enumerate()
        .all(|(i, p)| !programs[..i].contains(p));
    let evicts = |b: &&Boot| {
        b.markers
            .iter()
            .any(|m| m.kind == MarkerKind::Evict && m.before < b.launches.len())
    };
    let evicted = measured.iter().filter(evicts).count();
    let evicting_boots = boots.iter().filter(evicts).count();
    let every_program = spec
        .routines
        .iter()
        .flat_map(|r| &r.programs)
        .all(|p| launched(measured, p) > 0);
    every_program && trained && differ && evicted >= 2 && evicting_boots <= boots.len().div_ceil(3)
}

/// The default log's steps.
pub fn default_steps() -> Vec<Step> {
    generate(&default_spec())
}

/// Parses JSON lines of steps; blank lines and lines starting with `#` are
/// skipped. Errors name the line.
pub fn parse(text: &str) -> Result<Vec<Boot>> {
    let mut steps = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let l = line.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let step: Step = serde_json::from_str(l).with_context(|| {
            format!(
                "line {}: not a usage-log step ({{\"step\":\"boot\"}}, \
                 {{\"step\":\"launch\",\"after_ms\":N,\"program\":\"NAME\"}}, \
                 {{\"step\":\"login\",\"after_ms\":N}} or \
                 {{\"step\":\"evict\",\"after_ms\":N}})",
                i + 1
            )
        })?;
        steps.push((i + 1, step));
    }
    group(steps)
}

/// Reads a log file.
pub fn load(path: &Path) -> Result<Vec<Boot>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse(&text).with_context(|| format!("in {}", path.display()))
}

/// Steps without line numbers (a generated log) as boots.
pub fn from_steps(steps: &[Step]) -> Result<Vec<Boot>> {
    group(steps.iter().cloned().map(|s| (0, s)).collect())
}

fn group(steps: Vec<(usize, Step)>) -> Result<Vec<Boot>> {
    let mut boots: Vec<Boot> = Vec::new();
    for (line, step) in steps {
        match step {
            Step::Boot => boots.push(Boot {
                line,
                launches: Vec::new(),
                markers: Vec::new(),
            }),
            Step::Login { after_ms } | Step::Evict { after_ms } => {
                let (kind, what) = match step {
                    Step::Login { .. } => (MarkerKind::Login, "a login"),
                    _ => (MarkerKind::Evict, "an eviction"),
                };
                let Some(b) = boots.last_mut() else {
                    bail!("line {line}: {what} before the first boot step");
                };
                b.markers.push(Marker {
                    line,
                    before: b.launches.len(),
                    after_ms,
                    kind,
                });
            }
            Step::Launch { after_ms, program } => {
                let Some(b) = boots.last_mut() else {
                    bail!("line {line}: a launch before the first boot step");
                };
                if program.is_empty() {
                    bail!("line {line}: a launch with an empty program name");
                }
                b.launches.push(LogLaunch {
                    line,
                    after_ms,
                    program,
                });
            }
        }
    }
    if boots.is_empty() {
        bail!("the log has no boot step");
    }
    Ok(boots)
}

/// The log as steps again, for `--write-log` and the JSON export.
pub fn to_steps(boots: &[Boot]) -> Vec<Step> {
    let mut out = Vec::new();
    for b in boots {
        out.push(Step::Boot);
        for n in 0..=b.launches.len() {
            out.extend(b.markers_before(n).map(|m| match m.kind {
                MarkerKind::Login => Step::Login {
                    after_ms: m.after_ms,
                },
                MarkerKind::Evict => Step::Evict {
                    after_ms: m.after_ms,
                },
            }));
            if let Some(l) = b.launches.get(n) {
                out.push(Step::Launch {
                    after_ms: l.after_ms,
                    program: l.program.clone(),
                });
            }
        }
    }
    out
}

/// JSON lines of `steps`.
pub fn encode(steps: &[Step]) -> String {
    steps
        .iter()
        .map(|s| serde_json::to_string(s).expect("a step serializes") + "\n")
        .collect()
}

/// Checks that every program is one of `known`, naming the line.
pub fn check_programs(boots: &[Boot], known: &[String]) -> Result<()> {
    for l in boots.iter().flat_map(|b| &b.launches) {
        if !known.contains(&l.program) {
            bail!(
                "{}the program {:?} is not in the suite (it has: {})",
                if l.line > 0 {
                    format!("line {}: ", l.line)
                } else {
                    String::new()
                },
                l.program,
                known.join(", ")
            );
        }
    }
    Ok(())
}

/// The time a replay of `boots` waits between its steps, launches not
/// counted.
pub fn waits_ms(boots: &[Boot]) -> u64 {
    boots
        .iter()
        .flat_map(|b| {
            b.launches
                .iter()
                .map(|l| l.after_ms)
                .chain(b.markers.iter().map(|m| m.after_ms))
        })
        .sum()
}

/// How many of `boots` boots train by default: the first half.
pub fn default_train(boots: usize) -> usize {
    boots / 2
}

/// Checks `train` against the log: at least one boot must be measured.
pub fn check_train(train: usize, boots: usize) -> Result<()> {
    if train >= boots {
        bail!(
            "--train {train} leaves no boot to measure: the log has {boots} boot{}",
            if boots == 1 { "" } else { "s" }
        );
    }
    Ok(())
}

/// A daemon's launch history (`history.jsonl`) as a log: every boot
/// startup is a boot, every login startup a login, every launch of a
/// profile in `map` a launch of that suite program, its gap the time
/// since the previous event, capped at `max_gap_ms` (a night between two
/// launches is not replayed). Launches of profiles not in
/// `map` are left out; their profiles are returned, with how many launches
/// each had. (A history does not show evictions.)
pub fn from_history(
    text: &str,
    map: &BTreeMap<String, String>,
    max_gap_ms: u64,
) -> (Vec<Step>, BTreeMap<String, usize>) {
    let decoded = History::decode(text, usize::MAX);
    from_events(decoded.history.events(), map, max_gap_ms)
}

fn from_events<'a>(
    events: impl Iterator<Item = &'a Event>,
    map: &BTreeMap<String, String>,
    max_gap_ms: u64,
) -> (Vec<Step>, BTreeMap<String, usize>) {
    let mut steps = Vec::new();
    let mut unmapped = BTreeMap::new();
    let mut last_ms: Option<u64> = None;
    for e in events {
        match e {
            Event::Startup(s) if s.kind == StartupKind::Boot => {
                steps.push(Step::Boot);
                last_ms = Some(s.at_ms);
            }
            Event::Startup(s) => {
                if steps.is_empty() {
                    steps.push(Step::Boot);
                }
                let gap = last_ms.map_or(0, |t| s.at_ms.saturating_sub(t));
                steps.push(Step::Login {
                    after_ms: gap.min(max_gap_ms),
                });
                last_ms = Some(s.at_ms);
            }
            Event::Launch(l) => {
                let Some(program) = map.get(&l.profile) else {
                    *unmapped.entry(l.profile.clone()).or_insert(0) += 1;
                    continue;
                };
                if steps.is_empty() {
                    // A history that began after its boot was recorded.
                    steps.push(Step::Boot);
                }
                let gap = last_ms.map_or(0, |t| l.at_ms.saturating_sub(t));
                steps.push(Step::Launch {
                    after_ms: gap.min(max_gap_ms),
                    program: program.clone(),
                });
                last_ms = Some(l.at_ms);
            }
        }
    }
    (steps, unmapped)
}

/// Which suite program each profile of a state directory is: the one
/// whose command is the profile's, its first word compared by file name
/// (the daemon records the resolved executable, a suite may give a bare
/// name). Profiles matching no program are left out.
pub fn profiles_by_command(
    state_dir: &Path,
    programs: &[(String, Vec<String>)],
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Ok(rd) = std::fs::read_dir(state_dir.join("profiles")) else {
        return out;
    };
    for e in rd.flatten() {
        let Ok(bytes) = std::fs::read(e.path().join("profile.json")) else {
            continue;
        };
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
            continue;
        };
        let Some(cmd) = v["command"].as_array() else {
            continue;
        };
        let cmd: Vec<String> = cmd
            .iter()
            .filter_map(|s| s.as_str().map(String::from))
            .collect();
        if let Some((name, _)) = programs.iter().find(|(_, c)| same_command(c, &cmd)) {
            out.insert(e.file_name().to_string_lossy().into_owned(), name.clone());
        }
    }
    out
}

fn same_command(a: &[String], b: &[String]) -> bool {
    let base = |s: &String| {
        Path::new(s)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
    };
    a.len() == b.len() && !a.is_empty() && base(&a[0]) == base(&b[0]) && a[1..] == b[1..]
}

#[cfg(test)]
mod tests;
