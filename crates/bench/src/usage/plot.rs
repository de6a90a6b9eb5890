//! The usage run's timeline as SVG: one panel per mode, over the seconds
//! of its run, with the page cache (`Cached:`), the memory the daemon's
//! preloads held and their budget, a mark where a preload started, and a
//! bar for each launch (its length the launch time, stretched to stay
//! visible; training boots paler).

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

use super::results::UsageResults;

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("plotting: {e:?}")
}

const MIB: f64 = (1u64 << 20) as f64;
const CACHED: RGBColor = RGBColor(120, 120, 120);
const HELD: RGBColor = RGBColor(217, 72, 1);
const BUDGET: RGBColor = RGBColor(253, 174, 107);
const LAUNCH: RGBColor = RGBColor(49, 130, 189);
const BOOT: RGBColor = RGBColor(200, 200, 200);

/// Writes the timeline of every mode of `r` to `path`.
pub fn timeline(r: &UsageResults, path: &Path) -> Result<()> {
    let modes = &r.settings.modes;
    let h = 170 * modes.len().max(1) as u32 + 70;
    let root = SVGBackend::new(path, (1000, h)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (title, body) = root.split_vertically(50);
    title
        .draw(&Text::new(
            "Usage log: page cache (grey), memory held by preloads (orange) and their \
             budget (light), preloads started (triangles), launches (blue bars)",
            (10, 10),
            ("sans-serif", 14),
        ))
        .map_err(err)?;
    let xmax = r
        .samples
        .iter()
        .map(|s| s.t_s)
        .chain(r.launches.iter().map(|l| l.start_s + l.ms / 1e3))
        .fold(1.0, f64::max);
    let panels = body.split_evenly((modes.len().max(1), 1));
    for (mode, area) in modes.iter().zip(panels.iter()) {
        let samples: Vec<_> = r.samples.iter().filter(|s| &s.mode == mode).collect();
        let ymax = samples
            .iter()
            .map(|s| s.cached_bytes.max(s.held_bytes.unwrap_or(0)) as f64 / MIB)
            .fold(16.0, f64::max)
            * 1.1;
        let mut chart = ChartBuilder::on(area)
            .margin(6)
            .x_label_area_size(22)
            .y_label_area_size(60)
            .caption(mode.as_str(), ("sans-serif", 13))
            .build_cartesian_2d(0f64..xmax, 0f64..ymax)
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_desc("s")
            .y_desc("MiB")
            .draw()
            .map_err(err)?;
        // Boot starts: the first sample of each boot.
        let mut boots: Vec<f64> = Vec::new();
        let mut last_boot = 0;
        for s in &samples {
            if s.boot != last_boot {
                boots.push(s.t_s);
                last_boot = s.boot;
            }
        }
        chart
            .draw_series(
                boots
                    .iter()
                    .map(|&t| PathElement::new(vec![(t, 0.0), (t, ymax)], BOOT.stroke_width(1))),
            )
            .map_err(err)?;
        // One line per boot: the daemon is restarted in between.
        for b in 1..=last_boot {
            let in_boot: Vec<_> = samples.iter().filter(|s| s.boot == b).collect();
            let line = |f: &dyn Fn(&super::probe::Sample) -> Option<u64>| -> Vec<(f64, f64)> {
                in_boot
                    .iter()
                    .filter_map(|s| Some((s.t_s, f(s)? as f64 / MIB)))
                    .collect()
            };
            chart
                .draw_series(LineSeries::new(line(&|s| Some(s.cached_bytes)), CACHED))
                .map_err(err)?;
            chart
                .draw_series(LineSeries::new(
                    line(&|s| s.budget_bytes)
                        .into_iter()
                        .map(|(t, y)| (t, y.min(ymax))),
                    BUDGET,
                ))
                .map_err(err)?;
            chart
                .draw_series(LineSeries::new(
                    line(&|s| s.held_bytes),
                    HELD.stroke_width(2),
                ))
                .map_err(err)?;
            // A preload started between two samples whose counter grew.
            let starts: Vec<f64> = in_boot
                .windows(2)
                .filter(|w| w[1].preloads > w[0].preloads && w[0].preloads.is_some())
                .map(|w| w[1].t_s)
                .collect();
            chart
                .draw_series(
                    starts
                        .into_iter()
                        .map(|t| TriangleMarker::new((t, ymax * 0.9), 5, HELD.filled())),
                )
                .map_err(err)?;
        }
        let bar_h = ymax * 0.06;
        let min_w = xmax / 400.0;
        chart
            .draw_series(r.launches.iter().filter(|l| &l.mode == mode).map(|l| {
                let c = if l.measured {
                    LAUNCH.filled()
                } else {
                    LAUNCH.mix(0.4).filled()
                };
                let end = l.start_s + (l.ms / 1e3).max(min_w);
                Rectangle::new([(l.start_s, 0.0), (end, bar_h)], c)
            }))
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::probe::Sample;
    use crate::usage::results::{LaunchResult, UsageSettings};

    #[test]
    fn draws_every_mode() {
        let sample = |mode: &str, boot, t_s, held: Option<u64>, preloads| Sample {
            mode: mode.into(),
            boot,
            t_s,
            cached_bytes: 100 << 20,
            held_bytes: held,
            budget_bytes: held.map(|_| 50 << 20),
            preload_state: None,
            preloads,
        };
        let r = UsageResults {
            machine: Default::default(),
            testbed: None,
            settings: UsageSettings {
                suite: "s".into(),
                log_source: "l".into(),
                boots: 2,
                train_boots: 1,
                modes: vec!["none".into(), "predict".into()],
                learn: "allow-list".into(),
                disks: vec![],
                sequence_gap_s: None,
            },
            log: vec![],
            launches: vec![LaunchResult {
                mode: "predict".into(),
                boot: 2,
                launch: 1,
                program: "p".into(),
                measured: true,
                start_s: 3.0,
                ms: 400.0,
                cold_ms: None,
                warm_ms: None,
                gap: None,
                preload_state_before: None,
                predictions_before: None,
                startup_sequence: false,
                after_eviction: false,
            }],
            boots: vec![],
            samples: vec![
                sample("none", 1, 0.0, None, None),
                sample("predict", 1, 0.0, Some(0), Some(0)),
                sample("predict", 1, 1.0, Some(10 << 20), Some(1)),
                sample("predict", 2, 2.0, Some(0), Some(0)),
            ],
            totals: vec![],
        };
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t.svg");
        timeline(&r, &p).unwrap();
        let svg = std::fs::read_to_string(&p).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("predict") && svg.contains("none"));
    }
}
