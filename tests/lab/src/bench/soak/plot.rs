//! The soak's picture (SVG, the lab's [`crate::plot`]): four panels over the run's time —
//! items finished per second and their p99 per workflow, every process's RSS, the messages
//! queued — with the windows' bounds drawn as vertical lines. A leak is a rising RSS line, a
//! drift a rising p99, a backlog a rising queue: things read faster from a picture than from
//! the windows' text.

use std::path::Path;

use super::report::{Series, SoakReport};
use crate::plot::{self, Figure, Line, Panel};

pub(crate) fn draw(report: &SoakReport, path: &Path) -> anyhow::Result<()> {
    plot::draw(&figure(report), path)
}

fn figure(report: &SoakReport) -> Figure {
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
                // A bucket where nothing finished has no p99: the line joins its neighbours.
                let line = points.iter().filter_map(|p| Some((p.at_s, value(p)?)));
                Line::new(workflow.name(), line)
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
                .filter_map(|s| Some((s.at_s, *s.rss_kib.get(&process)? as f64 / 1024.0)));
            Line::new(process.as_str(), line)
        })
        .collect();
    let queued = vec![Line::new(
        "messages ready in every queue",
        report
            .samples
            .iter()
            .map(|s| (s.at_s, s.queue_depth as f64)),
    )];
    let r = &report.plan.rates;
    Figure {
        title: format!(
            "paybus soak: {:.0} min, every message ×{}, rates/s p2p {} · confirmations {} · bonuses {} · markets {}",
            report.plan.lasting.as_secs_f64() / 60.0,
            report.plan.copies,
            r.p2p,
            r.confirmations,
            r.bonuses,
            r.markets
        ),
        size: (1100, 1500),
        x_desc: "seconds since the load started".to_owned(),
        end_s,
        panels: vec![
            Panel::new("finished per second, by workflow", throughput),
            Panel::new("p99 ms, by workflow (per bucket)", p99),
            Panel::new("RSS MiB, by process", rss),
            Panel::new("messages queued", queued),
        ],
        marks: report.windows.iter().map(|w| w.to_s).collect(),
        bands_caption: "faults:",
        bands: Vec::new(),
        kinds: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeMap, time::Duration};

    use super::*;
    use crate::bench::soak::{
        SoakPlan,
        figures::Window,
        report::{Point, Series, Summary},
        samples::Sample,
    };
    use crate::finished::Workflow;

    /// A synthetic report: two windows, samples every 10 s, a bucket without a p99.
    fn report() -> SoakReport {
        let samples: Vec<Sample> = (0_u64..=12)
            .map(|i| Sample {
                at_s: i as f64 * 10.0,
                rss_kib: BTreeMap::from([
                    ("match-deposit".to_owned(), 20_000 + i * 100),
                    ("mariadb".to_owned(), 200_000 + i * 1_000),
                ]),
                anon_kib: BTreeMap::new(),
                queue_depth: (i % 4) * 7,
                queues: BTreeMap::new(),
                disk: None,
                redo: None,
            })
            .collect();
        let series = Workflow::ALL
            .into_iter()
            .enumerate()
            .map(|(n, workflow)| Series {
                workflow,
                points: (0_u64..12)
                    .map(|i| Point {
                        at_s: i as f64 * 10.0 + 5.0,
                        per_second: (n as f64 + 1.0) * 10.0 + (i % 3) as f64,
                        p99_ms: (i != 4).then_some(100.0 * (n as f64 + 1.0) + i as f64),
                    })
                    .collect(),
            })
            .collect();
        let window = |n: u32, from_s: f64, to_s: f64| Window {
            n,
            warm_up: n == 1,
            from_s,
            to_s,
            workflows: Vec::new(),
            rss_kib: BTreeMap::new(),
            anon_kib: BTreeMap::new(),
            tables: Vec::new(),
            outbox_backlog: 0,
            dead_letters: 0,
            dead_letters_new: 0,
            queue_depth: 0,
            peak_queue_depth: 0,
            queues: BTreeMap::new(),
            auditor: Default::default(),
            disk: None,
            redo: None,
        };
        SoakReport {
            plan: SoakPlan {
                rates: crate::chaos::load::Rates {
                    p2p: 1.0,
                    confirmations: 2.0,
                    bonuses: 3.0,
                    markets: 4.0,
                },
                lasting: Duration::from_secs(120),
                window: Duration::from_secs(60),
                windows: 2,
                warm_up_windows: 1,
                copies: 3,
                concurrency: 8,
            },
            windows: vec![window(1, 0.0, 60.0), window(2, 60.0, 120.0)],
            samples,
            series,
            summary: Summary::of(&[], &[]),
            load: Default::default(),
            load_sent: Duration::from_secs(120),
            time_to_quiescence: Duration::from_secs(3),
            peak_queue_depth: 21,
            messages_seen: 0,
            copies_published: 0,
            dead_letters: Vec::new(),
            violations: Vec::new(),
            state_dir: std::env::temp_dir(),
            plot: None,
        }
    }

    /// The soak's picture is the shared module's with four panels, the windows' bounds as
    /// marks and no faults (so no strip above the panels).
    #[test]
    fn the_soak_draws_four_panels_with_the_windows_as_marks_and_no_fault_strip() {
        let figure = figure(&report());
        let captions: Vec<&str> = figure.panels.iter().map(|p| p.caption.as_str()).collect();
        assert_eq!(
            captions,
            [
                "finished per second, by workflow",
                "p99 ms, by workflow (per bucket)",
                "RSS MiB, by process",
                "messages queued"
            ]
        );
        assert_eq!(figure.marks, [60.0, 120.0]);
        assert_eq!(figure.end_s, 120.0);
        // The bucket without a p99 is left out of its line, not drawn as a gap.
        assert!(
            figure.panels[1].lines[0]
                .points
                .iter()
                .all(|(_, y)| y.is_some())
        );
        assert_eq!(figure.panels[1].lines[0].points.len(), 11);

        let path = std::env::temp_dir().join(format!("paybus-soak-{}.svg", std::process::id()));
        draw(&report(), &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(svg.contains("RSS MiB, by process") && svg.contains("match-deposit"));
        assert!(!svg.contains("faults:"));
    }
}
