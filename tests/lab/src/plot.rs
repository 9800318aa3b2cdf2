//! The lab's pictures (SVG, plotters): stacked panels over one time axis, each a set of lines
//! with a legend, with vertical marks (the soak's window bounds) and bands (a chaos run's
//! faults: a shaded stretch of time across every panel, with its label in a strip of its own
//! above them and a legend of their kinds). The soak's plot and the chaos timeline both draw
//! through [`draw`], so they look alike and are read alike.
//!
//! A line may have gaps (`None`): a sample that could not be read (the database or the broker
//! was down) is left out rather than drawn as a zero, which would be a lie.

use std::path::Path;

use anyhow::Context;
use plotters::{coord::Shift, prelude::*};

/// The lines' colours, in order (matplotlib's "tab10": told apart in print and by most
/// colour-blind readers).
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

/// The bands' colours, by kind in [`Figure::kinds`]' order then first appearance: hues far apart, so that two
/// kinds stay told apart when lightly shaded and overlapping (a restart under an outage).
const BAND_COLOURS: [RGBColor; 12] = [
    RGBColor(200, 30, 45),
    RGBColor(118, 42, 131),
    RGBColor(33, 102, 172),
    RGBColor(140, 81, 10),
    RGBColor(240, 140, 0),
    RGBColor(1, 133, 113),
    RGBColor(197, 27, 125),
    RGBColor(90, 90, 90),
    RGBColor(128, 128, 0),
    RGBColor(0, 0, 128),
    RGBColor(27, 120, 55),
    RGBColor(190, 160, 0),
];

/// How strongly a band shades the panels it crosses (its own strip row is darker), and its
/// edges: where two bands overlap, their edges still say which is which.
const BAND_SHADE: f64 = 0.12;
const BAND_EDGE: f64 = 0.4;
const BAND_TICK: f64 = 0.45;
const STRIP_SHADE: f64 = 0.45;

/// Left and right of every chart: the margin and the y labels' width. The fault strip uses
/// the same, so its time axis lines up with the panels'.
const MARGIN: u32 = 10;
const Y_LABELS: u32 = 60;

/// The strip's text: its font size and the width a character takes on average at that size
/// (sans-serif; a label a little longer than its estimate only runs into the gap after it).
const LABEL_FONT: u32 = 11;
const LABEL_CHAR_PX: f64 = 6.2;
/// Space kept after a label before the next one in the same row.
const LABEL_GAP_PX: f64 = 8.0;
/// Rows of labels in the strip at most: a busy run (a SIGKILL every 2 s) labels what fits and
/// leaves the rest to the kinds' legend.
const MAX_LANES: usize = 8;
const LANE_PX: u32 = 15;
const LEGEND_PX: u32 = 22;
/// A band narrower than this many pixels is drawn as a tick: an instant (a SIGKILL).
const TICK_PX: f64 = 2.0;

/// One line of a panel: (seconds, value), `None` for a gap.
#[derive(Debug, Clone)]
pub(crate) struct Line {
    pub(crate) name: String,
    pub(crate) points: Vec<(f64, Option<f64>)>,
}

impl Line {
    /// A line without gaps.
    pub(crate) fn new(
        name: impl Into<String>,
        points: impl IntoIterator<Item = (f64, f64)>,
    ) -> Self {
        Self {
            name: name.into(),
            points: points.into_iter().map(|(x, y)| (x, Some(y))).collect(),
        }
    }

    /// A line that breaks where a value is `None`.
    pub(crate) fn with_gaps(
        name: impl Into<String>,
        points: impl IntoIterator<Item = (f64, Option<f64>)>,
    ) -> Self {
        Self {
            name: name.into(),
            points: points.into_iter().collect(),
        }
    }

    /// Its unbroken stretches, in order; at least one (empty for a line without points, so
    /// it still has its place in the legend).
    fn segments(&self) -> Vec<Vec<(f64, f64)>> {
        let mut segments = vec![Vec::new()];
        for &(x, y) in &self.points {
            match y {
                Some(y) => segments.last_mut().map_or((), |s| s.push((x, y))),
                None if segments.last().is_some_and(|s| !s.is_empty()) => {
                    segments.push(Vec::new());
                }
                None => {}
            }
        }
        if segments.len() > 1 && segments.last().is_some_and(Vec::is_empty) {
            segments.pop();
        }
        segments
    }

    fn top(&self) -> f64 {
        self.points
            .iter()
            .filter_map(|&(_, y)| y)
            .fold(0.0, f64::max)
    }
}

/// One panel: a caption over its lines.
#[derive(Debug, Clone)]
pub(crate) struct Panel {
    pub(crate) caption: String,
    pub(crate) lines: Vec<Line>,
}

impl Panel {
    pub(crate) fn new(caption: impl Into<String>, lines: Vec<Line>) -> Self {
        Self {
            caption: caption.into(),
            lines,
        }
    }
}

/// A stretch of time something lasted (a fault: a partition, an outage, a restart from its
/// start to when the service answered), shaded across every panel; `end_s <= start_s` is an
/// instant (a SIGKILL), drawn as a tick. `kind` groups bands under one colour and one entry
/// of the legend; `label` is what the strip writes at its start (short: "match-deposit",
/// "node 2").
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Band {
    pub(crate) start_s: f64,
    pub(crate) end_s: f64,
    pub(crate) label: String,
    pub(crate) kind: String,
}

impl Band {
    pub(crate) fn new(
        start_s: f64,
        end_s: f64,
        label: impl Into<String>,
        kind: impl Into<String>,
    ) -> Self {
        Self {
            start_s,
            end_s,
            label: label.into(),
            kind: kind.into(),
        }
    }

    /// Its stretch inside `[0, end_s]` (None: entirely outside), never reversed.
    fn within(&self, end_s: f64) -> Option<(f64, f64)> {
        let start = self.start_s.max(0.0);
        let end = self.end_s.max(self.start_s).min(end_s);
        (start <= end_s && end >= 0.0).then_some((start, end.max(start)))
    }
}

/// A picture: a title over `panels` (top to bottom, sharing the x axis from 0 to `end_s`),
/// `marks` as vertical lines and `bands` as shaded stretches across all of them.
#[derive(Debug, Clone)]
pub(crate) struct Figure {
    pub(crate) title: String,
    /// Width and height in pixels.
    pub(crate) size: (u32, u32),
    pub(crate) x_desc: String,
    pub(crate) end_s: f64,
    pub(crate) panels: Vec<Panel>,
    pub(crate) marks: Vec<f64>,
    pub(crate) bands: Vec<Band>,
    /// What the bands are, heading their strip's legend (`faults:`, `deploy:`).
    pub(crate) bands_caption: &'static str,
    /// The bands' kinds in the order their colours are given (a kind of no band here keeps
    /// its colour and stays out of the legend; a kind not listed comes after): a kind's
    /// colour is then the same from one picture to the next.
    pub(crate) kinds: Vec<String>,
}

/// Writes `figure` to `path` as SVG.
pub(crate) fn draw(figure: &Figure, path: &Path) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, figure.size).into_drawing_area();
    root.fill(&WHITE)?;
    let (title, body) = root.split_vertically(40);
    title.titled(&figure.title, ("sans-serif", 18))?;
    let kinds = kinds(&figure.kinds, &figure.bands);
    let body = if figure.bands.is_empty() {
        body
    } else {
        let plot_px = f64::from(figure.size.0.saturating_sub(2 * MARGIN + Y_LABELS)).max(1.0);
        let layout = lanes(&figure.bands, figure.end_s, plot_px);
        let rows = layout.iter().flatten().max().map_or(1, |lane| lane + 1);
        let legend = legend_places(&kinds, figure.size.0);
        let legend_rows = legend.iter().map(|&(row, _)| row + 1).max().unwrap_or(1);
        let strip_px = legend_rows as u32 * LEGEND_PX + rows as u32 * LANE_PX + 10;
        let (strip, body) = body.split_vertically(strip_px);
        strip_of(&strip, figure, &kinds, &legend, &layout, rows)
            .context("while drawing the bands' strip")?;
        body
    };
    let panels = body.split_evenly((figure.panels.len().max(1), 1));
    for (area, panel) in panels.iter().zip(&figure.panels) {
        panel_of(area, panel, figure, &kinds)
            .with_context(|| format!("while drawing {:?}", panel.caption))?;
    }
    root.present()
        .with_context(|| format!("while writing {}", path.display()))?;
    Ok(())
}

/// The kinds of `bands` with their colours, in the legend's order: `order` first, then the
/// others as they appear. A colour is a kind's place in that whole list, bands or not.
fn kinds<'a>(order: &'a [String], bands: &'a [Band]) -> Vec<(&'a str, RGBColor)> {
    let mut all: Vec<&str> = order.iter().map(String::as_str).collect();
    for band in bands {
        if !all.contains(&band.kind.as_str()) {
            all.push(&band.kind);
        }
    }
    all.into_iter()
        .enumerate()
        .filter(|(_, kind)| bands.iter().any(|band| band.kind == *kind))
        .map(|(n, kind)| (kind, BAND_COLOURS[n % BAND_COLOURS.len()]))
        .collect()
}

fn colour_of(kinds: &[(&str, RGBColor)], kind: &str) -> RGBColor {
    kinds
        .iter()
        .find(|(k, _)| *k == kind)
        .map_or(BLACK, |&(_, colour)| colour)
}

/// Where each kind of the legend goes: (row, x in pixels), left to right from the y labels'
/// edge, on as many rows as a picture `width` wide needs.
fn legend_places(kinds: &[(&str, RGBColor)], width: u32) -> Vec<(usize, i32)> {
    let left = f64::from(MARGIN + Y_LABELS);
    let right = f64::from(width.saturating_sub(MARGIN));
    let (mut row, mut x) = (0, left);
    kinds
        .iter()
        .map(|(kind, _)| {
            let wide = 18.0 + kind.chars().count() as f64 * LABEL_CHAR_PX;
            if x > left && x + wide > right {
                (row, x) = (row + 1, left);
            }
            let place = (row, x as i32);
            x += wide + 16.0;
            place
        })
        .collect()
}

/// The strip row of each band's label (None: no row had room, so it goes unlabelled; outside
/// the axis: no row either): the first row, top down, where it overlaps no label placed
/// before it. Bands that last are placed before the instants (a SIGKILL every 2 s must not
/// take the rows a partition needs), each in time order. A label takes its band's width or
/// its text's, whichever is wider, plus a gap; `plot_px` is the axis' width in pixels (0 to
/// `end_s`).
fn lanes(bands: &[Band], end_s: f64, plot_px: f64) -> Vec<Option<usize>> {
    let px_per_s = plot_px / end_s.max(f64::EPSILON);
    let instant = |band: &Band| band.end_s <= band.start_s;
    let mut order: Vec<usize> = (0..bands.len()).collect();
    order.sort_by(|&a, &b| {
        instant(&bands[a])
            .cmp(&instant(&bands[b]))
            .then(bands[a].start_s.total_cmp(&bands[b].start_s))
    });
    // Every row's labels so far, as stretches of pixels.
    let mut rows: Vec<Vec<(f64, f64)>> = Vec::new();
    let mut layout = vec![None; bands.len()];
    for i in order {
        let Some((start, end)) = bands[i].within(end_s) else {
            continue;
        };
        let (from, band_to) = (start * px_per_s, end * px_per_s);
        let text_to = from + bands[i].label.chars().count() as f64 * LABEL_CHAR_PX;
        let to = band_to.max(text_to) + LABEL_GAP_PX;
        let free = |row: &Vec<(f64, f64)>| row.iter().all(|&(a, b)| to <= a || b <= from);
        let lane = match rows.iter().position(free) {
            Some(lane) => lane,
            None if rows.len() < MAX_LANES => {
                rows.push(Vec::new());
                rows.len() - 1
            }
            None => continue,
        };
        rows[lane].push((from, to));
        layout[i] = Some(lane);
    }
    layout
}

/// The strip above the panels: the kinds' legend, then a row per lane with each band shaded
/// in its row and labelled at its start.
fn strip_of<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    figure: &Figure,
    kinds: &[(&str, RGBColor)],
    legend_places: &[(usize, i32)],
    layout: &[Option<usize>],
    rows: usize,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let legend_rows = legend_places
        .iter()
        .map(|&(row, _)| row + 1)
        .max()
        .unwrap_or(1);
    let (legend, lanes) = area.split_vertically(legend_rows as u32 * LEGEND_PX);
    let label = ("sans-serif", LABEL_FONT).into_font().color(&BLACK);
    legend.draw(&Text::new(
        figure.bands_caption,
        (MARGIN as i32, 5),
        label.clone(),
    ))?;
    for ((kind, colour), &(row, at)) in kinds.iter().zip(legend_places) {
        let y = row as i32 * LEGEND_PX as i32 + 5;
        legend.draw(&Rectangle::new(
            [(at, y), (at + 14, y + 12)],
            colour.mix(STRIP_SHADE).filled(),
        ))?;
        legend.draw(&Text::new(kind.to_string(), (at + 18, y), label.clone()))?;
    }
    let mut chart = ChartBuilder::on(&lanes)
        .margin_left(MARGIN)
        .margin_right(MARGIN)
        .margin_bottom(6)
        .y_label_area_size(Y_LABELS)
        .build_cartesian_2d(0.0..figure.end_s.max(f64::EPSILON), 0.0..rows as f64)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let plot_px = f64::from(chart.plotting_area().dim_in_pixel().0).max(1.0);
    let tick_s = TICK_PX * figure.end_s / plot_px;
    for (band, lane) in figure.bands.iter().zip(layout) {
        let (Some((start, end)), Some(lane)) = (band.within(figure.end_s), lane) else {
            continue;
        };
        let colour = colour_of(kinds, &band.kind);
        // Row 0 on top: the earliest labels read first.
        let top = (rows - lane) as f64;
        let bottom = top - 0.85;
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(start, bottom), (end.max(start + tick_s), top)],
                colour.mix(STRIP_SHADE).filled(),
            )))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        chart
            .draw_series(std::iter::once(
                EmptyElement::at((start, top))
                    + Text::new(band.label.clone(), (3, 1), label.clone()),
            ))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok(())
}

fn panel_of<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    panel: &Panel,
    figure: &Figure,
    kinds: &[(&str, RGBColor)],
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let end_s = figure.end_s;
    let top = panel
        .lines
        .iter()
        .map(Line::top)
        .fold(0.0_f64, f64::max)
        .max(1.0)
        * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.caption, ("sans-serif", 16))
        .margin(MARGIN)
        .x_label_area_size(30)
        .y_label_area_size(Y_LABELS)
        .build_cartesian_2d(0.0..end_s, 0.0..top)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .x_desc(figure.x_desc.as_str())
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    // Under everything else: a band is the background the lines are read against.
    let plot_px = f64::from(chart.plotting_area().dim_in_pixel().0).max(1.0);
    let tick_s = TICK_PX * end_s / plot_px;
    for band in &figure.bands {
        let Some((start, end)) = band.within(end_s) else {
            continue;
        };
        let colour = colour_of(kinds, &band.kind);
        if end - start < tick_s {
            chart
                .draw_series(LineSeries::new(
                    [(start, 0.0), (start, top)],
                    colour.mix(BAND_TICK).stroke_width(1),
                ))
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        } else {
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(start, 0.0), (end, top)],
                    colour.mix(BAND_SHADE).filled(),
                )))
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            for x in [start, end] {
                chart
                    .draw_series(LineSeries::new(
                        [(x, 0.0), (x, top)],
                        colour.mix(BAND_EDGE).stroke_width(1),
                    ))
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
            }
        }
    }
    for &x in &figure.marks {
        chart
            .draw_series(LineSeries::new(
                [(x, 0.0), (x, top)],
                BLACK.mix(0.25).stroke_width(1),
            ))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    for (i, line) in panel.lines.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        for (n, segment) in line.segments().into_iter().enumerate() {
            let drawn = chart
                .draw_series(LineSeries::new(segment, colour.stroke_width(2)))
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            // One legend entry a line, however many stretches it has.
            if n == 0 {
                drawn.label(line.name.clone()).legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 16, y)], colour.stroke_width(2))
                });
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_breaks_at_every_gap_and_keeps_one_stretch_when_it_has_none() {
        let line = Line::with_gaps(
            "depth",
            [
                (0.0, None),
                (1.0, Some(1.0)),
                (2.0, Some(2.0)),
                (3.0, None),
                (4.0, None),
                (5.0, Some(5.0)),
                (6.0, None),
            ],
        );
        assert_eq!(
            line.segments(),
            vec![vec![(1.0, 1.0), (2.0, 2.0)], vec![(5.0, 5.0)]]
        );
        assert_eq!(Line::new("empty", []).segments(), vec![Vec::new()]);
        assert_eq!(line.top(), 5.0);
    }

    #[test]
    fn a_band_is_clipped_to_the_axis_and_an_instant_or_a_reversed_one_has_no_width() {
        let band = |start_s, end_s| Band::new(start_s, end_s, "", "");
        assert_eq!(band(-2.0, 5.0).within(10.0), Some((0.0, 5.0)));
        assert_eq!(band(8.0, 30.0).within(10.0), Some((8.0, 10.0)));
        assert_eq!(band(3.0, 3.0).within(10.0), Some((3.0, 3.0)));
        assert_eq!(band(4.0, 1.0).within(10.0), Some((4.0, 4.0)));
        assert_eq!(band(11.0, 12.0).within(10.0), None);
        assert_eq!(band(-5.0, -1.0).within(10.0), None);
    }

    #[test]
    fn labels_take_the_first_free_row_and_a_band_wider_than_its_label_keeps_its_row() {
        // 100 s over 1000 px: 10 px a second; "kill" is about 25 px (+8 gap).
        let bands = [
            Band::new(5.0, 5.0, "kill", "SIGKILL"), // 50..83: row 1 (after the partition)
            Band::new(0.0, 20.0, "partition", "network"), // 0..208 px: first, row 0
            Band::new(9.0, 9.0, "kill", "SIGKILL"), // 90..123: row 1 is free again
            Band::new(8.0, 8.0, "kill", "SIGKILL"), // 80..113, placed before 9: row 2
            Band::new(21.0, 21.0, "kill", "SIGKILL"), // row 0 is free again at 208 px
            Band::new(30.0, 40.0, "outage", "webhooks"), // 300..408: placed before the kills
            Band::new(25.0, 25.0, "kill", "SIGKILL"), // 250..283: fits before the outage
        ];
        let layout = lanes(&bands, 100.0, 1000.0);
        assert_eq!(
            layout,
            vec![
                Some(1),
                Some(0),
                Some(1),
                Some(2),
                Some(0),
                Some(0),
                Some(0)
            ]
        );
    }

    #[test]
    fn a_busy_run_labels_what_fits_in_the_rows_and_leaves_the_rest_unlabelled() {
        let bands: Vec<Band> = (0..20)
            .map(|i| Band::new(f64::from(i) * 0.1, f64::from(i) * 0.1, "kill", "SIGKILL"))
            .collect();
        let layout = lanes(&bands, 100.0, 1000.0);
        assert_eq!(layout.iter().flatten().count(), MAX_LANES);
        assert_eq!(layout[MAX_LANES], None);
        let outside = [Band::new(200.0, 210.0, "late", "x")];
        assert_eq!(lanes(&outside, 100.0, 1000.0), vec![None]);
        // A lasting band placed last in time still gets a row before any instant.
        let mut busy = bands.clone();
        busy.push(Band::new(0.5, 60.0, "partition", "network"));
        assert_eq!(lanes(&busy, 100.0, 1000.0)[20], Some(0));
    }

    #[test]
    fn the_legend_wraps_to_a_new_row_when_the_next_kind_would_pass_the_right_edge() {
        let kinds: Vec<(&str, RGBColor)> = ["aaaaaaaaaa"; 5].iter().map(|k| (*k, BLACK)).collect();
        // Each entry is 18 + 62 px wide, then 16 px of space: 96 px apart from x = 70.
        assert_eq!(
            legend_places(&kinds, 400),
            [(0, 70), (0, 166), (0, 262), (1, 70), (1, 166)]
        );
        assert!(legend_places(&kinds, 2000).iter().all(|&(row, _)| row == 0));
    }

    #[test]
    fn kinds_keep_the_order_given_then_of_first_appearance_and_one_colour_each() {
        let bands = [
            Band::new(1.0, 1.0, "a", "SIGKILL"),
            Band::new(2.0, 4.0, "b", "database restart"),
            Band::new(3.0, 3.0, "c", "SIGKILL"),
        ];
        let found = kinds(&[], &bands);
        let names: Vec<&str> = found.iter().map(|(k, _)| *k).collect();
        assert_eq!(names, ["SIGKILL", "database restart"]);
        assert_ne!(found[0].1, found[1].1);
        assert_eq!(colour_of(&found, "SIGKILL"), BAND_COLOURS[0]);
        // In a fixed order, an absent kind keeps its colour's place and stays out.
        let order = ["database restart", "broker restart", "SIGKILL"].map(String::from);
        let found = kinds(&order, &bands);
        assert_eq!(
            found,
            [
                ("database restart", BAND_COLOURS[0]),
                ("SIGKILL", BAND_COLOURS[2])
            ]
        );
    }

    /// Draws a figure with every element into a temporary file and reads it back.
    #[test]
    fn a_figure_with_bands_draws_its_strip_legend_and_panels() {
        let path = std::env::temp_dir().join(format!("paybus-plot-{}.svg", std::process::id()));
        let figure = Figure {
            title: "a title".to_owned(),
            size: (900, 700),
            x_desc: "seconds".to_owned(),
            end_s: 60.0,
            panels: vec![
                Panel::new(
                    "first panel",
                    vec![Line::new("up", [(0.0, 0.0), (60.0, 5.0)])],
                ),
                Panel::new(
                    "second panel",
                    vec![Line::with_gaps(
                        "gappy",
                        [(0.0, Some(1.0)), (30.0, None), (60.0, Some(2.0))],
                    )],
                ),
            ],
            marks: vec![30.0],
            bands: vec![
                Band::new(10.0, 30.0, "partition db", "network partition"),
                Band::new(12.0, 12.0, "match-deposit", "function SIGKILL"),
            ],
            bands_caption: "faults:",
            kinds: Vec::new(),
        };
        draw(&figure, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        for text in [
            "a title",
            "first panel",
            "second panel",
            "faults:",
            "network partition",
            "function SIGKILL",
            "partition db",
            "match-deposit",
            "gappy",
        ] {
            assert!(svg.contains(text), "{text} missing");
        }
    }
}
