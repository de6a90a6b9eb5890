//! What a usage run collected, made into results, and where they go:
//! stdout, `--json`, `--export-markdown` and `--plot`.

use anyhow::{Context, Result};

use super::log::{self, Boot};
use super::prefetcher::Mode;
use super::results::{self, BootResult, LaunchResult, UsageResults, UsageSettings};
use super::runs::{self, UsageRuns};
use super::{plot, probe, UsageArgs};
use crate::machine::Machine;

/// One run of the log: what its modes measured.
#[derive(Default)]
pub(super) struct RunOutput {
    pub launches: Vec<LaunchResult>,
    pub boots: Vec<BootResult>,
    pub samples: Vec<probe::Sample>,
    /// The modes that completed, in the order they ran.
    pub done: Vec<Mode>,
}

impl RunOutput {
    /// The run's results: each launch against its baselines of the same
    /// run, and each mode's totals.
    pub fn results(
        self,
        machine: &Machine,
        settings: UsageSettings,
        boots: &[Boot],
    ) -> UsageResults {
        let mut launches = self.launches;
        results::fill_baselines(&mut launches);
        let totals = results::totals(&settings.modes, &launches, &self.boots, &self.samples);
        UsageResults {
            machine: machine.clone(),
            testbed: crate::testbed::inner().map(|t| t.info.clone()),
            settings,
            log: log::to_steps(boots),
            launches,
            boots: self.boots,
            samples: self.samples,
            totals,
        }
    }
}

/// One run's results: printed, and written where asked.
pub(super) fn write_results(args: &UsageArgs, res: &UsageResults, quiet: bool) -> Result<()> {
    print!("{}", results::render(res));
    write(args, res, results::render_markdown(res))?;
    if let Some(dir) = &args.plot {
        timeline(res, &dir.join("usage-timeline.svg"), quiet)?;
    }
    Ok(())
}

/// Several runs' results: each run and the spread over them, printed and
/// written where asked; a timeline per run.
pub(super) fn write_runs(args: &UsageArgs, all: &UsageRuns, quiet: bool) -> Result<()> {
    print!("{}", runs::render(all));
    write(args, all, runs::render_markdown(all))?;
    if let Some(dir) = &args.plot {
        for (i, res) in all.runs.iter().enumerate() {
            timeline(
                res,
                &dir.join(format!("usage-timeline-run{}.svg", i + 1)),
                quiet,
            )?;
        }
    }
    Ok(())
}

fn write(args: &UsageArgs, json: &impl serde::Serialize, markdown: String) -> Result<()> {
    if let Some(p) = &args.json {
        crate::export::write_file(p, |b| {
            serde_json::to_writer_pretty(&mut *b, json)?;
            b.push(b'\n');
            Ok(())
        })?;
    }
    if let Some(p) = &args.export_markdown {
        crate::export::write_file(p, |b| {
            b.extend_from_slice(markdown.as_bytes());
            Ok(())
        })?;
    }
    Ok(())
}

fn timeline(res: &UsageResults, p: &std::path::Path, quiet: bool) -> Result<()> {
    if let Some(dir) = p.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    plot::timeline(res, p)?;
    if !quiet {
        eprintln!("warmstart: wrote {}", p.display());
    }
    Ok(())
}
