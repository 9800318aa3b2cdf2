//! The soak's picture (SVG, plotters): four panels over the run's time — items finished per
//! second and their p99 per workflow, every process's RSS, the messages queued — with the
//! windows' bounds drawn as vertical lines. A leak is a rising RSS line, a drift a rising p99,
//! a backlog a rising queue: things read faster from a picture than from the windows' text.

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;

use super::report::{Series, SoakReport};

const COLOURS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

type Line = (String, Vec<(f64, f64)>);

pub(crate) fn draw(report: &SoakReport, path: &Path) -> anyhow::Result<()> {
    let end_s = report
        .samples
        .last()
        .map_or(0.0, |s| s.at_s)
        .max(report.windows.last().map_or(0.0, |w| w.to_s))
        .max(1.0);
    let per_workflow = |value: fn(&super::report::Point) -> Option<f64>| -> Vec<Line> {
        report
            .series
            .iter()
            .map(|Series { workflow, points }| {
                let line = points
                    .iter()
                    .filter_map(|p| Some((p.at_s, value(p)?)))
                    .collect();
                (workflow.name().to_owned(), line)
            })
            .collect()
    };
    let throughput = per_workflow(|p| Some(p.per_second));
    let p99 = per_workflow(|p| p.p99_ms);
    let mut processes: Vec<String> = report
        .samples
        .iter()
        .flat_map(|s| s.rss_kib.keys().cloned())
        .collect();
    processes.sort();
    processes.dedup();
    let rss: Vec<Line> = processes
        .into_iter()
        .map(|process| {
            let line = report
                .samples
                .iter()
                .filter_map(|s| Some((s.at_s, *s.rss_kib.get(&process)? as f64 / 1024.0)))
                .collect();
            (process, line)
        })
        .collect();
    let queued: Vec<Line> = vec![(
        "messages ready in every queue".to_owned(),
        report
            .samples
            .iter()
            .map(|s| (s.at_s, s.queue_depth as f64))
            .collect(),
    )];
    let bounds: Vec<f64> = report.windows.iter().map(|w| w.to_s).collect();

    let root = SVGBackend::new(path, (1100, 1500)).into_drawing_area();
    root.fill(&WHITE)?;
    let (title, body) = root.split_vertically(40);
    let r = &report.plan.rates;
    title.titled(
        &format!(
            "paybus soak: {:.0} min, every message ×{}, rates/s p2p {} · confirmations {} · bonuses {} · markets {}",
            report.plan.lasting.as_secs_f64() / 60.0,
            report.plan.copies,
            r.p2p,
            r.confirmations,
            r.bonuses,
            r.markets
        ),
        ("sans-serif", 18),
    )?;
    let panels = body.split_evenly((4, 1));
    let specs: [(&str, &[Line]); 4] = [
        ("finished per second, by workflow", &throughput),
        ("p99 ms, by workflow (per bucket)", &p99),
        ("RSS MiB, by process", &rss),
        ("messages queued", &queued),
    ];
    for (panel, (caption, lines)) in panels.iter().zip(specs) {
        panel_of(panel, caption, lines, end_s, &bounds)
            .with_context(|| format!("while drawing {caption:?}"))?;
    }
    root.present()
        .with_context(|| format!("while writing {}", path.display()))?;
    Ok(())
}

fn panel_of<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    caption: &str,
    lines: &[Line],
    end_s: f64,
    bounds: &[f64],
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let top = lines
        .iter()
        .flat_map(|(_, points)| points.iter().map(|&(_, y)| y))
        .fold(0.0_f64, f64::max)
        .max(1.0)
        * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..end_s, 0.0..top)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .x_desc("seconds since the load started")
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    for &x in bounds {
        chart
            .draw_series(LineSeries::new(
                [(x, 0.0), (x, top)],
                BLACK.mix(0.25).stroke_width(1),
            ))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    for (i, (name, points)) in lines.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                colour.stroke_width(2),
            ))
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], colour.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK.mix(0.3))
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}
