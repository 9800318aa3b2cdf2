//! Charts drawn on the server as SVG (no script, nothing fetched): one line per series over
//! evenly spaced buckets, each series told apart by its dash pattern as well as its colour, and
//! every chart followed by its numbers in a table, which is what a screen reader reads (the SVG
//! itself is one labelled image).

use chrono::{DateTime, Utc};
use maud::{Markup, html};

use super::layout;

const WIDTH: f64 = 560.0;
const HEIGHT: f64 = 150.0;
/// Room on the left for the scale's labels, and below for the times.
const LEFT: f64 = 44.0;
const BOTTOM: f64 = 18.0;
const TOP: f64 = 8.0;

/// Each series' stroke: colour and dash, in order (both, so that colour is not the only cue).
const STROKES: [(&str, &str); 5] = [
    ("#1f6feb", ""),
    ("#8250df", "6 3"),
    ("#bf8700", "2 3"),
    ("#cf222e", "8 3 2 3"),
    ("#1a7f37", "1 2"),
];

/// One line of a chart: a value per bucket, `None` where nothing was measured (the line
/// breaks there).
pub(crate) struct Series<'a> {
    pub name: &'a str,
    pub values: Vec<Option<f64>>,
}

impl<'a> Series<'a> {
    pub(crate) fn counts(name: &'a str, values: &[u64]) -> Self {
        Self {
            name,
            values: values.iter().map(|v| Some(*v as f64)).collect(),
        }
    }

    pub(crate) fn samples(name: &'a str, values: &[Option<u64>]) -> Self {
        Self {
            name,
            values: values.iter().map(|v| v.map(|v| v as f64)).collect(),
        }
    }
}

/// The top of the scale: the largest value rounded up to 1, 2 or 5 times a power of ten.
fn scale_top(largest: f64) -> f64 {
    if largest <= 0.0 {
        return 1.0;
    }
    let power = 10f64.powf(largest.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|step| step * power)
        .find(|top| *top >= largest)
        .unwrap_or(10.0 * power)
}

fn number(value: f64) -> String {
    if value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

/// The polyline segments of `values` (broken at each `None`), as SVG `points`.
fn segments(values: &[Option<f64>], top: f64) -> Vec<String> {
    let step = if values.len() > 1 {
        (WIDTH - LEFT) / (values.len() - 1) as f64
    } else {
        0.0
    };
    let plot = HEIGHT - BOTTOM - TOP;
    let mut lines = Vec::new();
    let mut current = Vec::new();
    for (i, value) in values.iter().enumerate() {
        match value {
            Some(v) => {
                let x = LEFT + step * i as f64;
                let y = TOP + plot - plot * (v / top);
                current.push(format!("{x:.1},{y:.1}"));
            }
            None if !current.is_empty() => lines.push(std::mem::take(&mut current).join(" ")),
            None => {}
        }
    }
    if !current.is_empty() {
        lines.push(current.join(" "));
    }
    lines
}

/// A chart titled `title` over `buckets` (their starts; labelled as `label_format`), with its
/// numbers in a table below it. `id` names the figure (unique on the page).
pub(crate) fn chart(
    id: &str,
    title: &str,
    buckets: &[DateTime<Utc>],
    label_format: &str,
    series: &[Series<'_>],
) -> Markup {
    let largest = series
        .iter()
        .flat_map(|s| s.values.iter().flatten())
        .fold(0.0f64, |a, b| a.max(*b));
    let top = scale_top(largest);
    let title_id = format!("{id}-title");
    let first = buckets.first().map(|b| b.format(label_format).to_string());
    let last = buckets.last().map(|b| b.format(label_format).to_string());
    let summary = series
        .iter()
        .map(|s| {
            let total: f64 = s.values.iter().flatten().sum();
            format!("{} {}", s.name, number(total))
        })
        .collect::<Vec<_>>()
        .join(", ");
    html! {
        figure.chart id=(id) {
            figcaption id=(title_id) { (title) }
            svg role="img" aria-labelledby=(title_id) viewBox=(format!("0 0 {WIDTH} {HEIGHT}")) width="100%" style="max-width:560px;background:#fff;border:1px solid #e3e6ea" {
                title { (title) ": " (summary) }
                line x1=(LEFT) y1=(TOP) x2=(LEFT) y2=(HEIGHT - BOTTOM) stroke="#8c959f" {}
                line x1=(LEFT) y1=(HEIGHT - BOTTOM) x2=(WIDTH) y2=(HEIGHT - BOTTOM) stroke="#8c959f" {}
                text x=(LEFT - 4.0) y=(TOP + 8.0) text-anchor="end" font-size="10" fill="#1d232a" { (number(top)) }
                text x=(LEFT - 4.0) y=(HEIGHT - BOTTOM) text-anchor="end" font-size="10" fill="#1d232a" { "0" }
                @if let Some(first) = &first {
                    text x=(LEFT) y=(HEIGHT - 4.0) font-size="10" fill="#1d232a" { (first) }
                }
                @if let Some(last) = &last {
                    text x=(WIDTH - 2.0) y=(HEIGHT - 4.0) text-anchor="end" font-size="10" fill="#1d232a" { (last) }
                }
                @for (n, line) in series.iter().enumerate() {
                    @let (colour, dash) = STROKES[n % STROKES.len()];
                    @for points in segments(&line.values, top) {
                        polyline points=(points) fill="none" stroke=(colour) stroke-width="1.6" stroke-dasharray=(dash) data-series=(line.name) {}
                    }
                }
            }
            p.legend {
                @for (n, line) in series.iter().enumerate() {
                    @let (colour, dash) = STROKES[n % STROKES.len()];
                    span style="margin-right:1rem" {
                        svg width="24" height="8" aria-hidden="true" {
                            line x1="0" y1="4" x2="24" y2="4" stroke=(colour) stroke-width="2" stroke-dasharray=(dash) {}
                        }
                        " " (line.name)
                    }
                }
            }
            details {
                summary { "The numbers: " (summary) }
                (layout::wide_table(title, html! {
                    table.chart-numbers data-chart=(id) {
                        caption { (title) }
                        thead { tr { th scope="col" { "From" } @for line in series { th.n scope="col" { (line.name) } } } }
                        tbody {
                            @for (i, bucket) in buckets.iter().enumerate() {
                                tr {
                                    th scope="row" { time datetime=(bucket.to_rfc3339()) { (bucket.format(label_format)) } }
                                    @for line in series {
                                        td.n { @match line.values.get(i).copied().flatten() { Some(v) => (number(v)), None => "—" } }
                                    }
                                }
                            }
                        }
                    }
                }))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scale_rounds_up_to_one_two_or_five() {
        assert_eq!(scale_top(0.0), 1.0);
        assert_eq!(scale_top(3.0), 5.0);
        assert_eq!(scale_top(12.0), 20.0);
        assert_eq!(scale_top(50.0), 50.0);
        assert_eq!(scale_top(501.0), 1000.0);
        assert_eq!(scale_top(0.3), 0.5);
    }

    #[test]
    fn a_gap_breaks_the_line() {
        let lines = segments(&[Some(1.0), Some(2.0), None, Some(1.0), Some(0.0)], 2.0);
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].split(' ').count(), 2);
        assert!(
            lines[0].ends_with(&format!(",{TOP:.1}")),
            "2 is the top: {lines:?}"
        );
        assert!(segments(&[None, None], 1.0).is_empty());
    }

    #[test]
    fn the_numbers_are_in_the_table_beside_the_picture() {
        let at = |m: i64| DateTime::<Utc>::from_timestamp(1_796_600_000 + m * 60, 0).unwrap();
        let markup = chart(
            "c",
            "Confirmations",
            &[at(0), at(1)],
            "%H:%M",
            &[
                Series::counts("done", &[3, 4]),
                Series::samples("ready", &[None, Some(2)]),
            ],
        )
        .into_string();
        assert!(
            markup.contains("<caption>Confirmations</caption>"),
            "{markup}"
        );
        assert!(markup.contains("done 7, ready 2"), "{markup}");
        assert!(
            markup.contains(r#"<td class="n">3</td><td class="n">—</td>"#),
            "{markup}"
        );
        assert!(markup.contains(r#"role="img""#), "{markup}");
    }
}
