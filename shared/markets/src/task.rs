//! The `tasks` row: one unit of work a batch owes (one per (batch, target)), worked through the
//! platform's retry kit (the migration's header comment says who moves a row in and out of
//! each state).
//!
//! ```text
//!            claim (attempts + 1) → cancel → settle, one transaction
//! PENDING ──────────────────────────────────────────────► DONE      (this attempt cancelled it)
//!   ▲  │                                       └────────► SKIPPED   (already FILLED / CANCELLED)
//!   │  │ the cancel failed, below the limit: next_attempt_at = backoff, last_error
//!   └──┘ (the due sweep re-publishes it when due)
//!      │ at the limit, or the order does not exist ───────► FAILED + dead letter
//! ```

use paybus_retry::{AttemptCount, Lease, WorkTable};
use serde::Serialize;
use sqlx::{MySql, MySqlConnection, QueryBuilder};

paybus_db::column_enum! {
    /// `tasks.state`.
    #[derive(PartialOrd, Ord, strum::EnumIter)]
    pub enum TaskState {
        /// Waiting for its (next) attempt.
        Pending,
        /// Terminal: this task's attempt did the work.
        Done,
        /// Terminal: the work was no longer needed (principle 7), with the reason.
        Skipped,
        /// Terminal until ops retry it: given up, with its error and a dead letter.
        Failed,
    }
}

paybus_db::column_enum! {
    /// `tasks.type` and `task_batches.type`.
    pub enum TaskType {
        /// Cancel one order of a suspended market (target: the order id).
        CancelOpenOrder,
    }
}

/// A task as ops see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct TaskView {
    pub id: u64,
    pub batch_id: u64,
    pub target_id: u64,
    pub state: String,
    pub attempts: u32,
    pub next_attempt_at: Option<chrono::DateTime<chrono::Utc>>,
    pub last_error: Option<String>,
    pub finished_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// The tasks among `ids` (any batch), in id order; ids without a row are absent.
pub async fn find_all(
    conn: &mut MySqlConnection,
    ids: &[u64],
) -> Result<Vec<TaskView>, sqlx::Error> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut query = QueryBuilder::<MySql>::new(
        "SELECT id, batch_id, target_id, state, attempts, next_attempt_at, last_error, \
                finished_at FROM tasks WHERE id IN (",
    );
    let mut list = query.separated(", ");
    for id in ids {
        list.push_bind(*id);
    }
    query.push(") ORDER BY id");
    query.build_query_as().fetch_all(conn).await
}

/// The task rows as the retry kit works them: an in-place lease (the row stays PENDING; a
/// claim pushes `next_attempt_at` out), every claim counts an attempt, and the due sweep
/// re-publishes armed rows.
pub static TASKS: WorkTable = WorkTable {
    table: "tasks",
    status: "state",
    due: "PENDING",
    failed: "FAILED",
    attempts: "attempts",
    count: AttemptCount::OnClaim,
    next_attempt_at: "next_attempt_at",
    due_index: "index_tasks_due",
    last_error: "last_error",
    // `last_error` is a VARCHAR(1000).
    last_error_max: 1000,
    lease: Lease::InPlace,
    republished_at: Some("republished_at"),
    held_for_a_human: None,
};

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    #[test]
    fn states_and_types_are_their_column_values() {
        assert_eq!(TaskState::Skipped.to_string(), "SKIPPED");
        assert_eq!(TaskState::from_str("FAILED"), Ok(TaskState::Failed));
        assert_eq!(TaskType::CancelOpenOrder.to_string(), "CANCEL_OPEN_ORDER");
        assert_eq!(TASKS.due, <&str>::from(TaskState::Pending));
        assert_eq!(TASKS.failed, <&str>::from(TaskState::Failed));
    }
}
