//! SVG figures, as the papers draw them: launch times normalised to cold
//! per program and scenario (FAST Fig. 11, Paralfetch Fig. 10), and the CPU
//! and storage activity of one cold, one warm and one warmstart launch
//! (FAST Fig. 12).

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};
use plotters::prelude::*;

use crate::export::Results;
use crate::scenario::Scenario;
use crate::timeline::Timeline;

/// One colour per scenario, stable across figures: greys for the baselines,
/// colours for the strategies, ours in the strongest one.
fn colour(s: Scenario) -> RGBColor {
    match s {
        Scenario::Cold => RGBColor(90, 90, 90),
        Scenario::Warm => RGBColor(170, 170, 170),
        Scenario::PrefetchOnly => RGBColor(200, 200, 160),
        Scenario::Sequential => RGBColor(170, 170, 130),
        Scenario::Bound => RGBColor(225, 225, 225),
        Scenario::Demand => RGBColor(210, 210, 190),
        Scenario::Contention => RGBColor(205, 190, 190),
        Scenario::Sorted => RGBColor(141, 160, 203),
        Scenario::Fast => RGBColor(102, 194, 165),
        Scenario::Paralfetch => RGBColor(231, 138, 195),
        Scenario::PreloadAll => RGBColor(166, 216, 84),
        Scenario::Vmtouch => RGBColor(229, 196, 148),
        Scenario::Warmstart => RGBColor(217, 72, 1),
        // warmstart as users run it: the same hue, darker and lighter.
        Scenario::Run => RGBColor(140, 45, 4),
        Scenario::Daemon => RGBColor(253, 141, 60),
        Scenario::Learning => RGBColor(120, 90, 160),
    }
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("plotting: {e:?}")
}

/// Writes every figure into `dir`; returns the files written.
pub fn write_all(results: &Results, dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    if results.programs.iter().any(|p| !p.summary.is_empty()) {
        let p = dir.join("launch-times.svg");
        launch_times(results, &p)?;
        out.push(p);
    }
    for prog in &results.programs {
        if prog.timelines.is_empty() {
            continue;
        }
        let p = dir.join(format!("timeline-{}.svg", file_name(&prog.name)));
        timeline(&prog.name, &prog.timelines, results.machine.cores, &p)?;
        out.push(p);
    }
    Ok(out)
}

fn file_name(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Grouped bars: one group per program, one bar per scenario, the median
/// over cold's median, with a whisker from min to max.
pub fn launch_times(results: &Results, path: &Path) -> Result<()> {
    let scenarios: Vec<Scenario> = Scenario::ALL
        .into_iter()
        .filter(|s| {
            results
                .programs
                .iter()
                .any(|p| p.summary.iter().any(|x| x.scenario == *s))
        })
        .collect();
    let n = results.programs.len().max(1);
    let width = (260 * n as u32).max(640) + 180;
    let root = SVGBackend::new(path, (width, 440)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    // The legend gets its own column: inside the plot it hides bars.
    let (plot_area, legend) = root.split_horizontally(width - 150);
    let cold = |p: &crate::export::ProgramResult| {
        p.summary
            .iter()
            .find(|s| s.scenario == Scenario::Cold)
            .map(|s| s.median_s)
    };
    let mut ymax: f64 = 1.2;
    for p in &results.programs {
        if let Some(c) = cold(p) {
            for s in &p.summary {
                ymax = ymax.max(s.max_s / c * 1.05);
            }
        }
    }
    let ymax = ymax.min(4.0);
    let mut chart = ChartBuilder::on(&plot_area)
        .caption(
            "Launch time normalised to cold start (median; whiskers: min–max)",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..n as f64, 0f64..ymax)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc("t / t_cold")
        .draw()
        .map_err(err)?;
    let k = scenarios.len() as f64;
    let slot = 0.8 / k;
    for (j, sc) in scenarios.iter().enumerate() {
        let c = colour(*sc);
        let mut bars = Vec::new();
        let mut whiskers = Vec::new();
        for (i, p) in results.programs.iter().enumerate() {
            let (Some(cm), Some(s)) = (cold(p), p.summary.iter().find(|x| x.scenario == *sc))
            else {
                continue;
            };
            let x0 = i as f64 + 0.1 + j as f64 * slot;
            let x1 = x0 + slot * 0.9;
            bars.push(Rectangle::new(
                [(x0, 0.0), (x1, (s.median_s / cm).min(ymax))],
                c.filled(),
            ));
            let xm = (x0 + x1) / 2.0;
            whiskers.push(PathElement::new(
                vec![
                    (xm, (s.min_s / cm).min(ymax)),
                    (xm, (s.max_s / cm).min(ymax)),
                ],
                BLACK.stroke_width(1),
            ));
        }
        chart.draw_series(bars).map_err(err)?;
        chart.draw_series(whiskers).map_err(err)?;
        let y = 50 + 20 * j as i32;
        legend
            .draw(&Rectangle::new([(10, y - 6), (22, y + 6)], c.filled()))
            .map_err(err)?;
        legend
            .draw(&Text::new(sc.name(), (28, y - 7), ("sans-serif", 13)))
            .map_err(err)?;
    }
    chart
        .draw_series(std::iter::once(PathElement::new(
            vec![(0.0, 1.0), (n as f64, 1.0)],
            BLACK.mix(0.5).stroke_width(1),
        )))
        .map_err(err)?;
    for (i, p) in results.programs.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(i as f64 + 0.5, 0.0));
        plot_area
            .draw(&Text::new(
                p.name.clone(),
                (x - 4 * p.name.len() as i32, y + 12),
                ("sans-serif", 14),
            ))
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// Spans of consecutive samples for which `busy` holds, as (start, end) ms.
pub fn busy_spans(
    t: &Timeline,
    busy: impl Fn(&crate::timeline::Sample) -> bool,
) -> Vec<(f64, f64)> {
    let mut out: Vec<(f64, f64)> = Vec::new();
    let mut open: Option<f64> = None;
    let mut prev = 0.0;
    for s in &t.samples {
        match (busy(s), open) {
            (true, None) => open = Some(s.t_ms),
            (false, Some(a)) => {
                out.push((a, s.t_ms));
                open = None;
            }
            _ => {}
        }
        prev = s.t_ms;
    }
    if let Some(a) = open {
        out.push((a, prev.max(a + 1.0)));
    }
    out
}

/// Three stacked panels (cold, warm, warmstart), each with a CPU track
/// (some task runnable) and a storage track (a request in flight or a task
/// waiting for I/O), on one time scale.
pub fn timeline(name: &str, tls: &[Timeline], _cores: usize, path: &Path) -> Result<()> {
    let h = 120 * tls.len() as u32 + 60;
    let root = SVGBackend::new(path, (900, h)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (title, body) = root.split_vertically(40);
    title
        .draw(&Text::new(
            format!("{name}: CPU and storage activity during one launch (2 ms samples)"),
            (10, 12),
            ("sans-serif", 16),
        ))
        .map_err(err)?;
    let xmax = tls.iter().map(|t| t.launch_ms).fold(1.0, f64::max);
    let panels = body.split_evenly((tls.len(), 1));
    for (t, area) in tls.iter().zip(panels.iter()) {
        let mut chart = ChartBuilder::on(area)
            .margin(6)
            .x_label_area_size(22)
            .y_label_area_size(70)
            .caption(
                format!("{} ({:.0} ms)", t.scenario, t.launch_ms),
                ("sans-serif", 13),
            )
            .build_cartesian_2d(0f64..xmax, 0f64..2.0)
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(3)
            .y_label_formatter(&|y| match *y as i32 {
                0 => "storage".into(),
                1 => "CPU".into(),
                _ => String::new(),
            })
            .x_desc("ms")
            .draw()
            .map_err(err)?;
        let cpu = busy_spans(t, |s| s.running > 0);
        let io = busy_spans(t, |s| s.in_flight > 0 || s.blocked > 0);
        chart
            .draw_series(cpu.into_iter().map(|(a, b)| {
                Rectangle::new([(a, 1.1), (b, 1.9)], colour(Scenario::Warmstart).filled())
            }))
            .map_err(err)?;
        chart
            .draw_series(io.into_iter().map(|(a, b)| {
                Rectangle::new([(a, 0.1), (b, 0.9)], colour(Scenario::Sorted).filled())
            }))
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::tests::sample;
    use crate::timeline::Sample;

    #[test]
    fn spans_of_busy_samples() {
        let s = |t, running| Sample {
            t_ms: t,
            running,
            blocked: 0,
            in_flight: 0,
        };
        let tl = Timeline {
            scenario: Scenario::Cold,
            launch_ms: 10.0,
            samples: vec![s(0.0, 1), s(2.0, 1), s(4.0, 0), s(6.0, 2), s(8.0, 1)],
        };
        assert_eq!(busy_spans(&tl, |x| x.running > 0), [(0.0, 4.0), (6.0, 8.0)]);
    }

    #[test]
    fn writes_svg_figures() {
        let mut r = sample();
        r.programs[0].timelines = vec![Timeline {
            scenario: Scenario::Cold,
            launch_ms: 5.0,
            samples: vec![Sample {
                t_ms: 1.0,
                running: 1,
                blocked: 1,
                in_flight: 1,
            }],
        }];
        let d = tempfile::tempdir().unwrap();
        let files = write_all(&r, d.path()).unwrap();
        assert_eq!(files.len(), 2);
        let svg = std::fs::read_to_string(&files[0]).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..40.min(svg.len())]);
        assert!(svg.contains("warmstart") && svg.contains("demo"));
        assert!(std::fs::read_to_string(&files[1])
            .unwrap()
            .contains("storage"));
    }
}
