//! Where a suspension stands (docs/workflows/markets.md, seed 004): the seed's `GROUP BY state`, the created
//! count, the open orders left in the frozen set, and completion:
//!
//! - **preparing** — tasks are still being materialised: the created count is not final.
//! - **in progress** — some task is PENDING.
//! - **needs attention** — no task is PENDING, yet orders of the set are still open (a FAILED
//!   task's order, which ops can retry): not complete, and not moving by itself.
//! - **complete** ⇔ materialised, no PENDING task and no open order left. "0 tasks created"
//!   (the market had no open order) is complete, and says so.
//!
//! Everything is read in one snapshot, so the counts agree with each other (a cancel commits
//! its order and its task together).

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{MySqlConnection, MySqlPool};

use crate::{
    MarketError, grouped,
    market::{self, Market, MarketStatus},
    task::TaskState,
};

/// Tasks of a batch by state (the seed's GROUP BY).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TaskCounts {
    #[serde(rename = "PENDING")]
    pub pending: u64,
    #[serde(rename = "DONE")]
    pub done: u64,
    #[serde(rename = "SKIPPED")]
    pub skipped: u64,
    #[serde(rename = "FAILED")]
    pub failed: u64,
}

impl TaskCounts {
    pub fn total(&self) -> u64 {
        self.pending + self.done + self.skipped + self.failed
    }

    /// Tasks that reached a terminal state.
    pub fn settled(&self) -> u64 {
        self.done + self.skipped + self.failed
    }

    pub fn get(&self, state: TaskState) -> u64 {
        match state {
            TaskState::Pending => self.pending,
            TaskState::Done => self.done,
            TaskState::Skipped => self.skipped,
            TaskState::Failed => self.failed,
        }
    }
}

/// The suspension's phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, strum::Display)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Phase {
    Preparing,
    InProgress,
    NeedsAttention,
    Complete,
}

/// A suspension's progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Progress {
    pub symbol: String,
    pub market_status: MarketStatus,
    pub batch_id: u64,
    pub reason: String,
    pub note: Option<String>,
    pub suspended_at: DateTime<Utc>,
    pub phase: Phase,
    /// Tasks created so far; final once `preparing` is false.
    pub created: u64,
    pub preparing: bool,
    pub tasks: TaskCounts,
    /// Orders of the frozen set still open.
    pub open_orders: u64,
    pub complete: bool,
    /// One line for people: "suspension in progress (6,204 / 8,000)".
    pub summary: String,
}

#[derive(sqlx::FromRow)]
struct BatchRow {
    reason: String,
    note: Option<String>,
    market_id: u64,
    max_target_id: u64,
    created_count: u64,
    materialised: bool,
    created_at: DateTime<Utc>,
}

/// The progress of `market`'s latest suspension; `None` if it was never suspended. Run it in
/// a transaction so every count comes from one snapshot.
pub async fn of_market(
    conn: &mut MySqlConnection,
    market: &Market,
) -> Result<Option<Progress>, MarketError> {
    let Some(batch_id) = market.current_batch_id else {
        return Ok(None);
    };
    let batch: BatchRow = sqlx::query_as(
        "SELECT reason, note, market_id, max_target_id, created_count, \
                materialised_at IS NOT NULL AS materialised, created_at \
         FROM task_batches WHERE id = ?",
    )
    .bind(batch_id)
    .fetch_one(&mut *conn)
    .await?;
    // DONE is derived, not counted: at a million-order suspension counting the DONE rows
    // read the whole batch on every refresh of the console (2 s), while the other states are
    // few once the batch moves. `created_count` moves in the same transaction as the task
    // inserts and this runs in one snapshot, so created - others is exact (the audit's
    // `task_count_mismatch` checks created_count against the rows).
    let by_state: Vec<(String, i64)> = sqlx::query_as(
        "SELECT state, COUNT(*) FROM tasks WHERE batch_id = ? AND state <> 'DONE' \
         GROUP BY state",
    )
    .bind(batch_id)
    .fetch_all(&mut *conn)
    .await?;
    let mut tasks = TaskCounts::default();
    for (state, count) in by_state {
        let count = u64::try_from(count).unwrap_or_default();
        match state.parse::<TaskState>() {
            Ok(TaskState::Pending) => tasks.pending = count,
            Ok(TaskState::Done) => tasks.done = count,
            Ok(TaskState::Skipped) => tasks.skipped = count,
            Ok(TaskState::Failed) => tasks.failed = count,
            Err(_) => {
                return Err(MarketError::UnknownValue(paybus_db::column::UnknownValue {
                    entity: "task batch",
                    id: batch_id,
                    column: "tasks.state",
                    value: state,
                }));
            }
        }
    }
    tasks.done = batch
        .created_count
        .saturating_sub(tasks.pending + tasks.skipped + tasks.failed);
    let open_orders: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM orders WHERE open_market_id = ? AND id <= ?")
            .bind(batch.market_id)
            .bind(batch.max_target_id)
            .fetch_one(&mut *conn)
            .await?;
    let open_orders = u64::try_from(open_orders).unwrap_or_default();
    let preparing = !batch.materialised;
    let phase = if preparing {
        Phase::Preparing
    } else if tasks.pending > 0 {
        Phase::InProgress
    } else if open_orders > 0 {
        Phase::NeedsAttention
    } else {
        Phase::Complete
    };
    let created = batch.created_count;
    Ok(Some(Progress {
        summary: summary(phase, created, &tasks, open_orders),
        symbol: market.symbol.clone(),
        market_status: market.status,
        batch_id,
        reason: batch.reason,
        note: batch.note,
        suspended_at: batch.created_at,
        phase,
        created,
        preparing,
        tasks,
        open_orders,
        complete: phase == Phase::Complete,
    }))
}

/// The progress of `symbol`'s latest suspension, in one snapshot.
pub async fn of_symbol(pool: &MySqlPool, symbol: &str) -> Result<Progress, MarketError> {
    let symbol = market::symbol(symbol)?;
    let mut tx = pool.begin().await?;
    let Some(market) = market::find(&mut tx, &symbol).await? else {
        return Err(MarketError::UnknownMarket(symbol));
    };
    let progress = of_market(&mut tx, &market).await?;
    tx.rollback().await?;
    progress.ok_or(MarketError::NeverSuspended(symbol))
}

fn summary(phase: Phase, created: u64, tasks: &TaskCounts, open_orders: u64) -> String {
    let settled = grouped(tasks.settled());
    match phase {
        Phase::Preparing => format!(
            "suspension preparing: {} tasks created so far, {} settled, {} open orders left",
            grouped(created),
            settled,
            grouped(open_orders)
        ),
        Phase::InProgress => {
            format!("suspension in progress ({settled} / {})", grouped(created))
        }
        Phase::NeedsAttention => format!(
            "suspension needs attention: no task pending but {} orders still open \
             ({} tasks FAILED: retry them once the cause is fixed)",
            grouped(open_orders),
            grouped(tasks.failed)
        ),
        Phase::Complete if created == 0 => {
            "suspension complete: 0 tasks created (no open orders at suspension)".to_owned()
        }
        Phase::Complete => {
            let mut line = format!(
                "suspension complete ({settled} / {}: {} DONE, {} SKIPPED",
                grouped(created),
                grouped(tasks.done),
                grouped(tasks.skipped)
            );
            if tasks.failed > 0 {
                line.push_str(&format!(", {} FAILED", grouped(tasks.failed)));
            }
            line.push(')');
            line
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(pending: u64, done: u64, skipped: u64, failed: u64) -> TaskCounts {
        TaskCounts {
            pending,
            done,
            skipped,
            failed,
        }
    }

    #[test]
    fn the_summary_reads_like_the_seeds_screen() {
        assert_eq!(
            summary(Phase::InProgress, 8_000, &counts(1_796, 6_204, 0, 0), 1_796),
            "suspension in progress (6,204 / 8,000)"
        );
        assert_eq!(
            summary(Phase::Complete, 0, &counts(0, 0, 0, 0), 0),
            "suspension complete: 0 tasks created (no open orders at suspension)"
        );
        assert_eq!(
            summary(Phase::Complete, 8_000, &counts(0, 7_950, 48, 2), 0),
            "suspension complete (8,000 / 8,000: 7,950 DONE, 48 SKIPPED, 2 FAILED)"
        );
        assert!(
            summary(Phase::NeedsAttention, 10, &counts(0, 9, 0, 1), 1)
                .contains("1 orders still open")
        );
        assert!(
            summary(Phase::Preparing, 3_000, &counts(3_000, 0, 0, 0), 8_000)
                .starts_with("suspension preparing: 3,000 tasks created so far")
        );
    }
}
