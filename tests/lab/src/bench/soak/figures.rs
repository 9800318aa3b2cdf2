//! A window's figures, read from the database the workflows write: what finished in the
//! window and how long each item took, from the timestamps the workflows themselves record
//! (so the figure is the system's, not the client's view of it):
//!
//! - p2p: a deposit order's `created_at` to its `closed_at`;
//! - confirmations: a withdrawal's or deposit's `created_at` to its `confirmed_at`;
//! - bonuses: a bonus job's `created_at` (the payment completion) to its `processed_at` (the
//!   grant);
//! - markets: a market's `suspended_at` to each of its orders' `cancelled_at`.
//!
//! Next to them: every table's size, the outbox backlog, the dead letters, the queues, and the
//! continuous auditor's passes (a pass re-reads every row of its window, 15 minutes by
//! default: its cost grows until the window is full, and it is the sweeper's heaviest job).

use std::{collections::BTreeMap, fmt};

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::MySqlPool;

use super::{disk::DiskWindow, redo::RedoWindow, samples::WindowEnd};
use crate::finished::{Finished, Workflow, finished};

/// One workflow in one window.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Throughput {
    pub(crate) workflow: Workflow,
    pub(crate) finished: u64,
    pub(crate) per_second: f64,
    /// None when nothing finished.
    pub(crate) p50_ms: Option<f64>,
    pub(crate) p99_ms: Option<f64>,
}

impl Throughput {
    pub(crate) fn of(workflow: Workflow, items: &[Finished], seconds: f64) -> Self {
        let mut took: Vec<i64> = items.iter().map(|f| f.took_us).collect();
        took.sort_unstable();
        Self {
            workflow,
            finished: took.len() as u64,
            per_second: took.len() as f64 / seconds.max(f64::EPSILON),
            p50_ms: quantile_ms(&took, 0.50),
            p99_ms: quantile_ms(&took, 0.99),
        }
    }
}

/// The nearest-rank quantile of sorted microseconds, in milliseconds.
pub(crate) fn quantile_ms(sorted_us: &[i64], q: f64) -> Option<f64> {
    if sorted_us.is_empty() {
        return None;
    }
    let rank = ((q * sorted_us.len() as f64).ceil() as usize).clamp(1, sorted_us.len());
    Some(sorted_us[rank - 1] as f64 / 1_000.0)
}

/// One table's size as InnoDB's statistics have it (estimates: refreshed when a tenth of a
/// table changed, so a small table's figure lags a little).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TableSize {
    pub(crate) table: String,
    pub(crate) rows: u64,
    pub(crate) mib: f64,
}

/// The continuous auditor's passes that started in a window (`audit_passes`).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(crate) struct AuditorPasses {
    pub(crate) passes: u64,
    /// The longest pass, and all of them together, milliseconds.
    pub(crate) longest_ms: u64,
    pub(crate) total_ms: u64,
}

/// A window: from the end of the previous one (or the load's start) to its own end.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Window {
    pub(crate) n: u32,
    /// Part of the warm-up: not compared (see `SoakPlan::warm_up_windows`).
    pub(crate) warm_up: bool,
    pub(crate) from_s: f64,
    pub(crate) to_s: f64,
    pub(crate) workflows: Vec<Throughput>,
    /// Resident memory at the window's end, by process, KiB.
    pub(crate) rss_kib: BTreeMap<String, u64>,
    /// Of it, anonymous memory (heap and stacks), KiB.
    pub(crate) anon_kib: BTreeMap<String, u64>,
    /// Every table of the run's database, biggest first.
    pub(crate) tables: Vec<TableSize>,
    /// Outbox messages written and not yet published, at the window's end.
    pub(crate) outbox_backlog: i64,
    /// Dead letters at the window's end: all, and those NEW (no one has acted on them).
    pub(crate) dead_letters: i64,
    pub(crate) dead_letters_new: i64,
    /// Messages ready in every queue at the window's end, and the most at once in the window.
    pub(crate) queue_depth: u64,
    pub(crate) peak_queue_depth: u64,
    /// The non-empty queues at the window's end.
    pub(crate) queues: BTreeMap<String, u64>,
    pub(crate) auditor: AuditorPasses,
    /// The disk under MariaDB over the window (None where it could not be read).
    pub(crate) disk: Option<DiskWindow>,
    /// MariaDB's redo log over the window: the checkpoint age at its highest (None where it
    /// could not be read).
    pub(crate) redo: Option<RedoWindow>,
}

/// Reads each window's figures; remembers where the last one ended.
pub(crate) struct Meter {
    pool: MySqlPool,
    /// The load's start on the database's clock (the timestamps' clock).
    pub(crate) started_at: DateTime<Utc>,
    last_end: DateTime<Utc>,
    last_end_s: f64,
}

async fn database_now(pool: &MySqlPool) -> Result<DateTime<Utc>, sqlx::Error> {
    sqlx::query_scalar("SELECT NOW(6)").fetch_one(pool).await
}

impl Meter {
    pub(crate) async fn start(pool: &MySqlPool) -> anyhow::Result<Self> {
        let now = database_now(pool).await?;
        Ok(Self {
            pool: pool.clone(),
            started_at: now,
            last_end: now,
            last_end_s: 0.0,
        })
    }

    /// Window `n`, ending now; `sample` is the sampler's at this moment.
    pub(crate) async fn window(
        &mut self,
        n: u32,
        warm_up: bool,
        WindowEnd {
            sample,
            peak_queue_depth,
            disk,
            redo,
        }: WindowEnd,
    ) -> anyhow::Result<Window> {
        let end = database_now(&self.pool).await?;
        let seconds = (end - self.last_end).as_seconds_f64();
        let mut workflows = Vec::with_capacity(Workflow::ALL.len());
        for workflow in Workflow::ALL {
            let items = finished(&self.pool, workflow, self.last_end, end).await?;
            workflows.push(Throughput::of(workflow, &items, seconds));
        }
        let tables = table_sizes(&self.pool).await?;
        let outbox_backlog: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM outbox_messages WHERE published_at IS NULL")
                .fetch_one(&self.pool)
                .await?;
        let (dead_letters, dead_letters_new): (i64, i64) = sqlx::query_as(
            "SELECT COUNT(*), CAST(COALESCE(SUM(status = 'NEW'), 0) AS SIGNED) FROM dead_letters",
        )
        .fetch_one(&self.pool)
        .await?;
        let (passes, longest_ms, total_ms): (i64, i64, i64) = sqlx::query_as(
            "SELECT COUNT(*), CAST(COALESCE(MAX(duration_ms), 0) AS SIGNED), \
                    CAST(COALESCE(SUM(duration_ms), 0) AS SIGNED) \
             FROM audit_passes WHERE started_at >= ? AND started_at < ?",
        )
        .bind(self.last_end)
        .bind(end)
        .fetch_one(&self.pool)
        .await?;
        let count = |v: i64| u64::try_from(v).unwrap_or(0);
        let window = Window {
            n,
            warm_up,
            from_s: self.last_end_s,
            to_s: self.last_end_s + seconds,
            workflows,
            rss_kib: sample.rss_kib,
            anon_kib: sample.anon_kib,
            tables,
            outbox_backlog,
            dead_letters,
            dead_letters_new,
            queue_depth: sample.queue_depth,
            peak_queue_depth: peak_queue_depth.max(sample.queue_depth),
            queues: sample.queues,
            auditor: AuditorPasses {
                passes: count(passes),
                longest_ms: count(longest_ms),
                total_ms: count(total_ms),
            },
            disk,
            redo,
        };
        self.last_end = end;
        self.last_end_s = window.to_s;
        Ok(window)
    }
}

async fn table_sizes(pool: &MySqlPool) -> Result<Vec<TableSize>, sqlx::Error> {
    let rows: Vec<(String, Option<u64>, Option<u64>)> = sqlx::query_as(
        "SELECT CAST(table_name AS CHAR), CAST(table_rows AS UNSIGNED), \
                CAST(data_length + index_length AS UNSIGNED) \
         FROM information_schema.tables \
         WHERE table_schema = DATABASE() AND table_type = 'BASE TABLE' \
         ORDER BY data_length + index_length DESC, table_name",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(table, rows, bytes)| TableSize {
            table,
            rows: rows.unwrap_or(0),
            mib: bytes.unwrap_or(0) as f64 / (1024.0 * 1024.0),
        })
        .collect())
}

fn ms(value: Option<f64>) -> String {
    value.map_or_else(|| "—".to_owned(), |v| format!("{v:.0} ms"))
}

/// How many of the biggest tables a window prints (the JSON has them all).
const TABLES_SHOWN: usize = 8;

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "window {} ({:.0}–{:.0} s){}",
            self.n,
            self.from_s,
            self.to_s,
            if self.warm_up { ", the warm-up" } else { "" }
        )?;
        for w in &self.workflows {
            writeln!(
                f,
                "  {:<14} {:>8} finished {:>8.1}/s   p50 {:>8}   p99 {:>8}",
                w.workflow.name(),
                w.finished,
                w.per_second,
                ms(w.p50_ms),
                ms(w.p99_ms)
            )?;
        }
        let rss: Vec<String> = self
            .rss_kib
            .iter()
            .map(|(process, kib)| format!("{process} {:.1}", *kib as f64 / 1024.0))
            .collect();
        writeln!(f, "  RSS MiB: {}", rss.join(", "))?;
        let anon: Vec<String> = self
            .anon_kib
            .iter()
            .map(|(process, kib)| format!("{process} {:.1}", *kib as f64 / 1024.0))
            .collect();
        writeln!(
            f,
            "  of it anonymous (heap, stacks) MiB: {}",
            anon.join(", ")
        )?;
        let tables: Vec<String> = self
            .tables
            .iter()
            .take(TABLES_SHOWN)
            .map(|t| format!("{} {:.1} MiB/{} rows", t.table, t.mib, t.rows))
            .collect();
        writeln!(f, "  tables (biggest, estimates): {}", tables.join(", "))?;
        let queues: Vec<String> = self
            .queues
            .iter()
            .map(|(queue, n)| format!("{queue} {n}"))
            .collect();
        writeln!(
            f,
            "  auditor: {} passes, the longest {} ms, {} ms in all",
            self.auditor.passes, self.auditor.longest_ms, self.auditor.total_ms
        )?;
        if let Some(disk) = &self.disk {
            writeln!(
                f,
                "  disk under MariaDB: writes {:.2} ms, flushes {:.2} ms on average; the slowest \
                 stretch between samples: writes {:.2} ms, flushes {:.2} ms (to {:.0} s)",
                disk.write_ms,
                disk.flush_ms,
                disk.worst_write_ms,
                disk.worst_flush_ms,
                disk.worst_flush_at_s
            )?;
        }
        if let Some(redo) = &self.redo {
            writeln!(
                f,
                "  redo log: the checkpoint age up to {:.0} % of the age at which writers wait (at \
                 {:.0} s), dirty pages up to {:.0} % of the buffer pool",
                redo.max_checkpoint_percent, redo.max_checkpoint_at_s, redo.max_dirty_percent
            )?;
        }
        writeln!(
            f,
            "  outbox backlog {}, dead letters {} ({} NEW), queued {} (peak {}){}{}",
            self.outbox_backlog,
            self.dead_letters,
            self.dead_letters_new,
            self.queue_depth,
            self.peak_queue_depth,
            if queues.is_empty() { "" } else { ": " },
            queues.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nearest_rank_quantile_takes_the_value_at_or_above_the_share() {
        let us: Vec<i64> = (1..=100).map(|ms| ms * 1_000).collect();
        assert_eq!(quantile_ms(&us, 0.50), Some(50.0));
        assert_eq!(quantile_ms(&us, 0.99), Some(99.0));
        assert_eq!(quantile_ms(&us[..1], 0.99), Some(1.0));
        assert_eq!(quantile_ms(&[], 0.5), None);
    }
}
