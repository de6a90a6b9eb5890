//! Every run, exported for other tools (as hyperfine's `--export-json` and
//! `--export-csv`): JSON with the machine, settings, summaries and all runs;
//! CSV with one row per run.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::machine::Machine;
use crate::runner::{Learned, Run, Summary};
use crate::timeline::Timeline;

/// How the benchmark was run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    pub rounds: usize,
    pub warmup: usize,
    /// "drop-caches" or "evict-files".
    pub cold_by: String,
    pub scenarios: Vec<String>,
}

/// One program's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProgramResult {
    pub name: String,
    pub command: Vec<String>,
    pub ready: String,
    pub learned: Learned,
    pub summary: Vec<Summary>,
    pub runs: Vec<Run>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timelines: Vec<Timeline>,
}

/// Everything a bench run measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Results {
    pub machine: Machine,
    /// The storage testbed the launches ran in (`--fs`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub testbed: Option<crate::testbed::TestbedInfo>,
    pub settings: Settings,
    pub programs: Vec<ProgramResult>,
}

pub fn write_json(results: &Results, w: impl Write) -> Result<()> {
    serde_json::to_writer_pretty(w, results)?;
    Ok(())
}

/// Columns: program, round, position, scenario, time_s, exit_code,
/// resident_before, prefetched_bytes, device_read_bytes (`--fs`), and for
/// `run` the wrapper's own costs: wrapper_before_replay_ms,
/// wrapper_held_ms, wrapper_after_exit_ms. Empty cells where a value does
/// not apply.
pub fn write_csv(results: &Results, w: impl Write) -> Result<()> {
    let mut c = csv::Writer::from_writer(w);
    c.write_record([
        "program",
        "round",
        "position",
        "scenario",
        "time_s",
        "exit_code",
        "resident_before",
        "prefetched_bytes",
        "device_read_bytes",
        "wrapper_before_replay_ms",
        "wrapper_held_ms",
        "wrapper_after_exit_ms",
    ])?;
    let opt = |v: Option<String>| v.unwrap_or_default();
    let ms = |v: Option<f64>| v.map(|x| format!("{x:.3}")).unwrap_or_default();
    for p in &results.programs {
        for r in &p.runs {
            c.write_record([
                r.program.clone(),
                r.round.to_string(),
                opt(r.position.map(|x| x.to_string())),
                r.scenario.name().to_string(),
                format!("{:.6}", r.time_s),
                opt(r.exit_code.map(|x| x.to_string())),
                opt(r.resident_before.map(|x| format!("{x:.4}"))),
                opt(r.prefetched_bytes.map(|x| x.to_string())),
                opt(r.device_read_bytes.map(|x| x.to_string())),
                ms(r.wrapper.and_then(|w| w.before_replay_ms)),
                ms(r.wrapper.and_then(|w| w.held_ms)),
                ms(r.wrapper.and_then(|w| w.after_exit_ms)),
            ])?;
        }
    }
    c.flush()?;
    Ok(())
}

/// Writes through a temporary file so a failed run never leaves half an
/// export behind.
pub fn write_file(path: &Path, f: impl FnOnce(&mut Vec<u8>) -> Result<()>) -> Result<()> {
    let mut buf = Vec::new();
    f(&mut buf)?;
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, &buf).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::runner::{run_program, summarize, Executor, Measurement, NoProgress, WrapperTimes};
    use crate::scenario::Scenario;
    use std::time::Duration;

    struct Fixed;
    impl Executor for Fixed {
        fn learn(&mut self) -> Result<Learned> {
            Ok(Learned::default())
        }
        fn warmup(&mut self) -> Result<()> {
            Ok(())
        }
        fn measure(&mut self, s: Scenario) -> Result<Measurement> {
            let t = match s {
                Scenario::Cold => 2.0,
                Scenario::Warm => 1.0,
                Scenario::PrefetchOnly => 0.5,
                _ => 1.25,
            };
            Ok(Measurement {
                time: Duration::from_secs_f64(t),
                exit_code: Some(0),
                resident_before: (s == Scenario::Cold).then_some(0.0),
                prefetched_bytes: (s == Scenario::Warmstart).then_some(4096),
                device_read_bytes: None,
                wrapper: (s == Scenario::Run).then_some(WrapperTimes {
                    before_replay_ms: Some(6.5),
                    held_ms: Some(3.0),
                    after_exit_ms: Some(1.5),
                }),
            })
        }
    }

    pub(crate) fn sample() -> Results {
        let sc = [
            Scenario::Cold,
            Scenario::Warm,
            Scenario::PrefetchOnly,
            Scenario::Bound,
            Scenario::Warmstart,
            Scenario::Run,
            Scenario::Daemon,
        ];
        let (learned, runs) = run_program("demo", &mut Fixed, &sc, 2, 0, &mut NoProgress).unwrap();
        Results {
            machine: Machine::default(),
            testbed: None,
            settings: Settings {
                rounds: 2,
                warmup: 0,
                cold_by: "drop-caches".into(),
                scenarios: sc.iter().map(|s| s.name().to_string()).collect(),
            },
            programs: vec![ProgramResult {
                name: "demo".into(),
                command: vec!["true".into()],
                ready: "exit".into(),
                learned,
                summary: summarize(&runs),
                runs,
                timelines: Vec::new(),
            }],
        }
    }

    #[test]
    fn csv_has_every_run_and_bound_rows() {
        let r = sample();
        let mut out = Vec::new();
        write_csv(&r, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "program,round,position,scenario,time_s,exit_code,resident_before,prefetched_bytes,\
             device_read_bytes,wrapper_before_replay_ms,wrapper_held_ms,wrapper_after_exit_ms"
        );
        // 6 launched + 1 bound per round, 2 rounds.
        assert_eq!(lines.len(), 1 + 14);
        assert_eq!(lines[1], "demo,0,0,cold,2.000000,0,0.0000,,,,,");
        assert!(lines.contains(&"demo,0,,bound,1.000000,,,,,,,"), "{text}");
        assert!(
            lines.contains(&"demo,1,3,warmstart,1.250000,0,,4096,,,,"),
            "{text}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("demo,0,")
                    && l.contains(",run,1.250000,0,,,,6.500,3.000,1.500")),
            "{text}"
        );
    }

    #[test]
    fn json_round_trips_and_names_scenarios_in_kebab_case() {
        let r = sample();
        let mut out = Vec::new();
        write_json(&r, &mut out).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let p = &v["programs"][0];
        assert_eq!(p["runs"].as_array().unwrap().len(), 14);
        let sum = p["summary"].as_array().unwrap();
        let names: Vec<&str> = sum
            .iter()
            .map(|s| s["scenario"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "cold",
                "warm",
                "prefetch-only",
                "bound",
                "warmstart",
                "run",
                "daemon"
            ]
        );
        assert_eq!(sum[4]["gap_captured"], 0.75);
        let back: Results = serde_json::from_slice(&out).unwrap();
        assert_eq!(back, r);
    }
}
