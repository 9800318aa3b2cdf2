//! The soak's report: every window, the samples behind the plot, and a summary that sets the
//! last window against the first one after the warm-up — what a leak (RSS) or a backlog
//! (outbox, queues) would show — and fits each workflow's p99 trend through every window
//! after the warm-up, what a drift would show. The summary informs; only the exactly-once
//! checks at quiescence fail the run.

use std::{collections::BTreeMap, fmt, path::PathBuf, time::Duration};

use serde::Serialize;

use super::{
    SoakPlan, Workflow,
    figures::{Throughput, Window},
    samples::{HARNESS, Sample},
};
use crate::bench::median;
use crate::chaos::{
    checks::{DeadLetters, Violation},
    load::Load,
    report::seconds,
};

/// The targets: RSS growth and p99 drift after the warm-up, at most.
pub(crate) const RSS_GROWTH_TARGET: f64 = 0.10;
pub(crate) const P99_DRIFT_TARGET: f64 = 0.20;

/// A backlog may grow by this many, or a tenth of itself, and still be flat: a handful of
/// messages in flight at a window's end is the load, not a backlog.
const BACKLOG_FLOOR: i64 = 100;

/// One point of a workflow's series (the plot's throughput and p99 lines).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Point {
    pub(crate) at_s: f64,
    pub(crate) per_second: f64,
    pub(crate) p99_ms: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Series {
    pub(crate) workflow: Workflow,
    pub(crate) points: Vec<Point>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct SoakReport {
    pub(crate) plan: SoakPlan,
    pub(crate) windows: Vec<Window>,
    pub(crate) samples: Vec<Sample>,
    pub(crate) series: Vec<Series>,
    pub(crate) summary: Summary,
    pub(crate) load: Load,
    #[serde(serialize_with = "seconds")]
    pub(crate) load_sent: Duration,
    #[serde(serialize_with = "seconds")]
    pub(crate) time_to_quiescence: Duration,
    pub(crate) peak_queue_depth: u64,
    pub(crate) messages_seen: u64,
    pub(crate) copies_published: u64,
    pub(crate) dead_letters: Vec<DeadLetters>,
    pub(crate) violations: Vec<Violation>,
    pub(crate) state_dir: PathBuf,
    pub(crate) plot: Option<PathBuf>,
}

/// A figure at the first window after the warm-up and at the last one.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Change<T> {
    pub(crate) what: String,
    pub(crate) from: T,
    pub(crate) to: T,
    /// `to / from - 1`.
    pub(crate) change: f64,
}

fn change<T: Copy + Into<f64>>(what: String, from: T, to: T) -> Change<T> {
    let (a, b) = (from.into(), to.into());
    Change {
        what,
        from,
        to,
        change: if a > 0.0 { b / a - 1.0 } else { 0.0 },
    }
}

/// A workflow's p99 trend over the windows after the warm-up: the Theil–Sen line, whose slope
/// is the median of the slopes between every two windows.
///
/// Why not the last window against the first: on a flat series the p99 of one 5-minute
/// window against another's moves ±30 % on this machine (windows of one soak after the
/// warm-up: 43, 72, 63, 50, 57 ms), more than the 20 % target, so that comparison judges
/// which windows happened to be quiet. A least-squares line would follow one stalled window
/// (717, 3,601, 1,551, 1,828, 197 ms); the median of the pairwise slopes does not, and a rise
/// that lasts (passes growing through the run: 241, 661, 307 ms) still tilts it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct P99Trend {
    pub(crate) what: String,
    /// The median of the windows' p99s: what the drift is relative to.
    pub(crate) median_ms: f64,
    /// The line's slope, milliseconds per window.
    pub(crate) per_window_ms: f64,
    /// The line's rise from the first window after the warm-up to the last, against the median.
    pub(crate) drift: f64,
}

/// The trend of `points` (window number, p99 ms); None for fewer than two.
fn p99_trend(what: &str, points: &[(u32, f64)]) -> Option<P99Trend> {
    let slopes = points
        .iter()
        .enumerate()
        .flat_map(|(i, &(x1, y1))| {
            points[i + 1..]
                .iter()
                .map(move |&(x2, y2)| (y2 - y1) / (f64::from(x2) - f64::from(x1)))
        })
        .collect();
    let per_window_ms = median(slopes)?;
    let median_ms = median(points.iter().map(|&(_, y)| y).collect())?;
    let span = f64::from(points.last()?.0 - points.first()?.0);
    Some(P99Trend {
        what: what.to_owned(),
        median_ms,
        per_window_ms,
        drift: if median_ms > 0.0 {
            per_window_ms * span / median_ms
        } else {
            0.0
        },
    })
}

/// A workflow's p99 at the first window after the warm-up and at a later `window`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct WorstP99 {
    pub(crate) window: u32,
    #[serde(flatten)]
    pub(crate) p99_ms: Change<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Summary {
    /// The windows compared (None: fewer than two windows after the warm-up).
    pub(crate) compared: Option<(u32, u32)>,
    /// Every process's RSS, KiB.
    pub(crate) rss: Vec<Change<u32>>,
    /// The function processes' largest growth (the target's figure: the harness holds the
    /// load's tallies, and MariaDB fills its buffer pool, both by design).
    pub(crate) largest_function_rss_growth: Option<f64>,
    /// Every process's anonymous memory (heap and stacks), KiB: what a leak grows, where the
    /// RSS also counts the binary's pages as its rarer code paths first run.
    pub(crate) anon: Vec<Change<u32>>,
    /// The function processes' largest anonymous growth.
    pub(crate) largest_function_anon_growth: Option<f64>,
    /// Each workflow's p99 trend after the warm-up (the target's figure, [`P99Trend`]).
    pub(crate) p99_trends: Vec<P99Trend>,
    pub(crate) largest_p99_drift: Option<f64>,
    /// Each workflow's p99 in the last window against the first after the warm-up (no target:
    /// two windows, see [`P99Trend`]).
    pub(crate) p99_ms: Vec<Change<f64>>,
    /// The highest p99 of any window after the warm-up against the first's, for the workflow
    /// where it rose most (no target): a soak whose middle windows stalled can end on a quiet
    /// one.
    pub(crate) worst_p99: Option<WorstP99>,
    pub(crate) outbox_backlog: Option<(i64, i64)>,
    pub(crate) queue_depth: Option<(u64, u64)>,
    pub(crate) backlog_flat: Option<bool>,
    /// Items not terminal once the run went quiet (each one a violation too).
    pub(crate) stuck: Vec<(String, i64)>,
}

/// Each process's figure in both windows, from one to the other.
fn changes(from: &BTreeMap<String, u64>, to: &BTreeMap<String, u64>) -> Vec<Change<u32>> {
    let kib = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
    from.iter()
        .filter_map(|(process, &a)| Some(change(process.clone(), kib(a), kib(*to.get(process)?))))
        .collect()
}

fn largest_function_growth(changes: &[Change<u32>]) -> Option<f64> {
    changes
        .iter()
        .filter(|c| is_function(&c.what))
        .map(|c| c.change)
        .reduce(f64::max)
}

fn is_function(process: &str) -> bool {
    process != HARNESS && process != "mariadb" && process != "rabbitmq"
}

impl Summary {
    pub(crate) fn of(windows: &[Window], stuck: &[(String, i64)]) -> Self {
        let mut summary = Self {
            compared: None,
            rss: Vec::new(),
            largest_function_rss_growth: None,
            anon: Vec::new(),
            largest_function_anon_growth: None,
            p99_trends: Vec::new(),
            largest_p99_drift: None,
            p99_ms: Vec::new(),
            worst_p99: None,
            outbox_backlog: None,
            queue_depth: None,
            backlog_flat: None,
            stuck: stuck.to_vec(),
        };
        let (Some(first), Some(last)) = (windows.iter().find(|w| !w.warm_up), windows.last())
        else {
            return summary;
        };
        if first.n == last.n {
            return summary;
        }
        summary.compared = Some((first.n, last.n));
        summary.rss = changes(&first.rss_kib, &last.rss_kib);
        summary.largest_function_rss_growth = largest_function_growth(&summary.rss);
        summary.anon = changes(&first.anon_kib, &last.anon_kib);
        summary.largest_function_anon_growth = largest_function_growth(&summary.anon);
        let p99 = |w: &Window, workflow: Workflow| -> Option<f64> {
            w.workflows
                .iter()
                .find(|t: &&Throughput| t.workflow == workflow)?
                .p99_ms
        };
        for workflow in Workflow::ALL {
            if let (Some(from), Some(to)) = (p99(first, workflow), p99(last, workflow)) {
                summary
                    .p99_ms
                    .push(change(workflow.name().to_owned(), from, to));
            }
        }
        let compared: Vec<&Window> = windows.iter().filter(|w| !w.warm_up).collect();
        for workflow in Workflow::ALL {
            let points: Vec<(u32, f64)> = compared
                .iter()
                .filter_map(|w| Some((w.n, p99(w, workflow)?)))
                .collect();
            summary
                .p99_trends
                .extend(p99_trend(workflow.name(), &points));
        }
        summary.largest_p99_drift = summary.p99_trends.iter().map(|t| t.drift).reduce(f64::max);
        summary.worst_p99 = windows
            .iter()
            .filter(|w| !w.warm_up && w.n > first.n)
            .flat_map(|window| {
                Workflow::ALL.into_iter().filter_map(move |workflow| {
                    let p99_ms = change(
                        workflow.name().to_owned(),
                        p99(first, workflow)?,
                        p99(window, workflow)?,
                    );
                    Some(WorstP99 {
                        window: window.n,
                        p99_ms,
                    })
                })
            })
            .max_by(|a, b| a.p99_ms.change.total_cmp(&b.p99_ms.change));
        summary.outbox_backlog = Some((first.outbox_backlog, last.outbox_backlog));
        summary.queue_depth = Some((first.queue_depth, last.queue_depth));
        let flat = |from: i64, to: i64| to <= from + BACKLOG_FLOOR.max(from / 10);
        summary.backlog_flat = Some(
            flat(first.outbox_backlog, last.outbox_backlog)
                && flat(
                    i64::try_from(first.queue_depth).unwrap_or(i64::MAX),
                    i64::try_from(last.queue_depth).unwrap_or(i64::MAX),
                ),
        );
        summary
    }
}

fn verdict(value: Option<f64>, target: f64) -> String {
    match value {
        None => "not compared".to_owned(),
        Some(v) if v <= target => format!(
            "{:+.1} % (target ≤ {:.0} %: met)",
            v * 100.0,
            target * 100.0
        ),
        Some(v) => format!(
            "{:+.1} % (target ≤ {:.0} %: NOT met)",
            v * 100.0,
            target * 100.0
        ),
    }
}

impl SoakReport {
    pub(crate) fn summary_text(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for SoakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = &self.plan.rates;
        writeln!(
            f,
            "\nsoak: {:.1} min, windows of {:.1} min, every message ×{}; rates/s p2p {}, confirmations {}, bonuses {}, markets {}",
            self.plan.lasting.as_secs_f64() / 60.0,
            self.plan.window.as_secs_f64() / 60.0,
            self.plan.copies,
            r.p2p,
            r.confirmations,
            r.bonuses,
            r.markets
        )?;
        let s = &self.summary;
        match s.compared {
            Some((from, to)) => writeln!(f, "summary: window {to} against window {from}")?,
            None => writeln!(
                f,
                "summary: fewer than two windows after the warm-up ({} windows: the auditor's \
                 passes to reach their steady span), nothing compared",
                self.plan.warm_up_windows
            )?,
        }
        writeln!(
            f,
            "  RSS growth, largest of the functions: {}",
            verdict(s.largest_function_rss_growth, RSS_GROWTH_TARGET)
        )?;
        write_kib_changes(f, &s.rss)?;
        writeln!(
            f,
            "  of it anonymous memory (heap, stacks), largest growth of the functions: {:+.1} %",
            s.largest_function_anon_growth.unwrap_or(0.0) * 100.0
        )?;
        write_kib_changes(f, &s.anon)?;
        writeln!(
            f,
            "  p99 drift, largest (each workflow's Theil–Sen trend over the windows after the \
             warm-up, against its median): {}",
            verdict(s.largest_p99_drift, P99_DRIFT_TARGET)
        )?;
        for t in &s.p99_trends {
            writeln!(
                f,
                "    {:<14} median {:>8.0} ms, {:+8.1} ms a window  {:+.1} %",
                t.what,
                t.median_ms,
                t.per_window_ms,
                t.drift * 100.0
            )?;
        }
        writeln!(f, "  p99, the last window against the first (no target):")?;
        for c in &s.p99_ms {
            writeln!(
                f,
                "    {:<14} {:>8.0} → {:>8.0} ms  {:+.1} %",
                c.what,
                c.from,
                c.to,
                c.change * 100.0
            )?;
        }
        if let Some(w) = &s.worst_p99 {
            writeln!(
                f,
                "  p99, the worst window against the first (no target): {:+.1} % ({}, window {}: \
                 {:.0} → {:.0} ms)",
                w.p99_ms.change * 100.0,
                w.p99_ms.what,
                w.window,
                w.p99_ms.from,
                w.p99_ms.to
            )?;
        }
        if let (Some((ob_from, ob_to)), Some((q_from, q_to)), Some(flat)) =
            (s.outbox_backlog, s.queue_depth, s.backlog_flat)
        {
            writeln!(
                f,
                "  backlog: outbox {ob_from} → {ob_to}, queued {q_from} → {q_to}: {}",
                if flat { "flat" } else { "GROWING" }
            )?;
        }
        if s.stuck.is_empty() {
            writeln!(f, "  stuck after quiescence: nothing")?;
        } else {
            for (what, n) in &s.stuck {
                writeln!(f, "  STUCK after quiescence: {what}: {n}")?;
            }
        }
        writeln!(
            f,
            "  load sent in {:.1?}, quiet {:.1?} later; peak queue depth {}; messages seen {}, copies {}",
            self.load_sent,
            self.time_to_quiescence,
            self.peak_queue_depth,
            self.messages_seen,
            self.copies_published
        )?;
        if self.dead_letters.is_empty() {
            writeln!(f, "  dead letters: none")?;
        }
        for group in &self.dead_letters {
            writeln!(
                f,
                "  dead letters: {} {} {}",
                group.function, group.reason, group.count
            )?;
        }
        if let Some(plot) = &self.plot {
            writeln!(f, "  plot: {}", plot.display())?;
        }
        writeln!(f, "  logs: {}", self.state_dir.display())?;
        if self.violations.is_empty() {
            writeln!(
                f,
                "\nPASSED: every item terminal and exactly once, audit clean, every queue empty"
            )
        } else {
            writeln!(f, "\nFAILED: {} violation(s)", self.violations.len())?;
            for v in &self.violations {
                writeln!(f, "  [{}] {}", v.check, v.detail)?;
            }
            Ok(())
        }
    }
}

/// One line per process: its figure in both windows, MiB, and the change.
fn write_kib_changes(f: &mut fmt::Formatter<'_>, changes: &[Change<u32>]) -> fmt::Result {
    for c in changes {
        writeln!(
            f,
            "    {:<36} {:>8.1} → {:>8.1} MiB  {:+.1} %",
            c.what,
            f64::from(c.from) / 1024.0,
            f64::from(c.to) / 1024.0,
            c.change * 100.0
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::bench::soak::figures::AuditorPasses;

    fn window(n: u32, rss_kib: u64, p99_ms: f64, outbox_backlog: i64) -> Window {
        Window {
            n,
            warm_up: n == 1,
            from_s: 0.0,
            to_s: 1.0,
            workflows: vec![Throughput {
                workflow: Workflow::P2p,
                finished: 10,
                per_second: 10.0,
                p50_ms: Some(p99_ms / 2.0),
                p99_ms: Some(p99_ms),
            }],
            rss_kib: BTreeMap::from([
                ("match-deposit".to_owned(), rss_kib),
                (HARNESS.to_owned(), rss_kib * 10),
            ]),
            // The binary's pages are a fixed 8 MiB of the function's RSS here: its anonymous
            // part grows faster than its RSS.
            anon_kib: BTreeMap::from([("match-deposit".to_owned(), rss_kib.saturating_sub(8_192))]),
            tables: Vec::new(),
            outbox_backlog,
            dead_letters: 0,
            dead_letters_new: 0,
            queue_depth: 0,
            peak_queue_depth: 0,
            queues: BTreeMap::new(),
            auditor: AuditorPasses::default(),
            disk: None,
            redo: None,
        }
    }

    #[test]
    fn the_summary_compares_the_last_window_with_the_first_after_the_warm_up() {
        let windows = [
            window(1, 1_000, 900.0, 0),
            window(2, 10_000, 100.0, 50),
            window(3, 10_500, 110.0, 60),
            window(4, 12_000, 150.0, 500),
        ];
        let summary = Summary::of(&windows, &[]);
        assert_eq!(summary.compared, Some((2, 4)));
        let growth = summary.largest_function_rss_growth.expect("compared");
        assert!((growth - 0.2).abs() < 1e-9, "{growth}");
        let anon = summary.largest_function_anon_growth.expect("compared");
        let expected = (12_000.0 - 8_192.0) / (10_000.0 - 8_192.0) - 1.0;
        assert!((anon - expected).abs() < 1e-9, "{anon}");
        // The trend through 100, 110, 150: the median slope 25 ms a window, over two windows,
        // against the median 110.
        let drift = summary.largest_p99_drift.expect("compared");
        assert!((drift - 50.0 / 110.0).abs() < 1e-9, "{drift}");
        assert!((summary.p99_ms[0].change - 0.5).abs() < 1e-9);
        let worst = summary.worst_p99.as_ref().expect("compared");
        assert_eq!(
            (worst.window, worst.p99_ms.from, worst.p99_ms.to),
            (4, 100.0, 150.0)
        );
        assert_eq!(summary.outbox_backlog, Some((50, 500)));
        assert_eq!(summary.backlog_flat, Some(false));
    }

    #[test]
    fn a_warm_up_of_several_windows_is_left_out_of_the_comparison() {
        let mut windows = [
            window(1, 1_000, 900.0, 0),
            window(2, 9_000, 800.0, 50),
            window(3, 10_000, 100.0, 50),
            window(4, 10_500, 110.0, 60),
        ];
        windows[1].warm_up = true;
        let summary = Summary::of(&windows, &[]);
        assert_eq!(summary.compared, Some((3, 4)));
        let drift = summary.largest_p99_drift.expect("compared");
        assert!((drift - 10.0 / 105.0).abs() < 1e-9, "{drift}");
        windows[2].warm_up = true;
        assert_eq!(Summary::of(&windows, &[]).compared, None);
    }

    #[test]
    fn a_stall_in_a_middle_window_is_the_worst_p99_though_the_last_is_quiet() {
        let windows = [
            window(1, 1_000, 900.0, 0),
            window(2, 10_000, 100.0, 50),
            window(3, 10_000, 700.0, 50),
            window(4, 10_000, 90.0, 50),
        ];
        let summary = Summary::of(&windows, &[]);
        // The stall does not tilt the trend: slopes 600, -5 and -610, the median -5.
        let trend = &summary.p99_trends[0];
        assert!((trend.per_window_ms + 5.0).abs() < 1e-9, "{trend:?}");
        let drift = summary.largest_p99_drift.expect("compared");
        assert!((drift + 0.1).abs() < 1e-9, "{drift}");
        let worst = summary.worst_p99.expect("compared");
        assert_eq!(
            (worst.window, worst.p99_ms.from, worst.p99_ms.to),
            (3, 100.0, 700.0)
        );
        assert!(
            (worst.p99_ms.change - 6.0).abs() < 1e-9,
            "{}",
            worst.p99_ms.change
        );
    }

    fn p99s_after_a_warm_up(p99s: &[f64]) -> Vec<Window> {
        std::iter::once(window(1, 1_000, 900.0, 0))
            .chain((2..).zip(p99s).map(|(n, &p99)| window(n, 10_000, p99, 50)))
            .collect()
    }

    #[test]
    fn a_flat_but_noisy_p99_has_no_drift_where_its_last_window_against_its_first_has() {
        // 2026-12-05's soak 2, confirmations after the warm-up.
        let summary = Summary::of(&p99s_after_a_warm_up(&[43.0, 72.0, 63.0, 50.0, 57.0]), &[]);
        let drift = summary.largest_p99_drift.expect("compared");
        assert!(drift.abs() < 0.05, "{drift}");
        assert!(summary.p99_ms[0].change > 0.3, "{:?}", summary.p99_ms);
    }

    #[test]
    fn a_rise_that_lasts_is_a_drift_past_the_target() {
        // The auditor's growing passes before 13a943d, confirmations after the warm-up.
        let summary = Summary::of(&p99s_after_a_warm_up(&[241.0, 661.0, 307.0]), &[]);
        let drift = summary.largest_p99_drift.expect("compared");
        assert!((drift - 66.0 / 307.0).abs() < 1e-9, "{drift}");
        assert!(drift > P99_DRIFT_TARGET);
    }

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(Vec::new()), None);
    }

    #[test]
    fn two_windows_are_too_few_to_compare() {
        let windows = [window(1, 1_000, 900.0, 0), window(2, 10_000, 100.0, 50)];
        let summary = Summary::of(&windows, &[]);
        assert_eq!(summary.compared, None);
        assert_eq!(summary.largest_p99_drift, None);
        assert!(summary.worst_p99.is_none());
        assert_eq!(summary.backlog_flat, None);
    }
}
