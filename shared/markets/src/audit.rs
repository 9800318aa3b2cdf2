//! W4's invariants (docs/workflows/markets.md, seed 004): plain SQL, one statement per check.
//!
//! | check | invariant |
//! | --- | --- |
//! | `open_order_left_behind` | no order of a suspended market's frozen set is open without a task once the batch is materialised (nothing slips out of the set) |
//! | `order_accepted_while_suspended` | a SUSPENDED market has no order placed after its suspension (id above the batch's `max_target_id`) |
//! | `task_count_mismatch` | a materialised batch has exactly `created_count` tasks |
//! | `task_disagrees_with_order` | a DONE task's order is CANCELLED for the batch's reason; a SKIPPED task's order is closed |
//!
//! One task per (batch, target) is the unique key `uk_tasks_batch_target`, not a check. The
//! `recent` forms narrow the same SQL to batches materialised, suspended markets' orders placed
//! and tasks changed since the window's start; a batch's frozen set is checked in the passes
//! after it is materialised, since nothing enters or leaves it later.

use std::fmt;

use paybus_ops::audit::{Check, Finding, Scope, Window};
use serde::Serialize;
use sqlx::MySqlConnection;

/// W4's checks, in the order `paybus audit` runs them.
pub const CHECKS: &[Check] = &[
    paybus_ops::audit_check!("suspension_sets", suspension_sets, recent: recent_suspension_sets),
    paybus_ops::audit_check!("cancel_tasks", cancel_tasks, recent: recent_cancel_tasks),
];

/// One broken W4 invariant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "check", rename_all = "snake_case")]
pub enum Violation {
    OpenOrderLeftBehind {
        order_id: u64,
        symbol: String,
        batch_id: u64,
    },
    OrderAcceptedWhileSuspended {
        order_id: u64,
        symbol: String,
        batch_id: u64,
        max_target_id: u64,
    },
    TaskCountMismatch {
        batch_id: u64,
        created_count: u64,
        tasks: u64,
    },
    TaskDisagreesWithOrder {
        task_id: u64,
        state: String,
        order_id: u64,
        order_status: Option<String>,
    },
}

impl Finding for Violation {
    fn check(&self) -> &'static str {
        match self {
            Violation::OpenOrderLeftBehind { .. } => "open_order_left_behind",
            Violation::OrderAcceptedWhileSuspended { .. } => "order_accepted_while_suspended",
            Violation::TaskCountMismatch { .. } => "task_count_mismatch",
            Violation::TaskDisagreesWithOrder { .. } => "task_disagrees_with_order",
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.check())?;
        match self {
            Violation::OpenOrderLeftBehind {
                order_id,
                symbol,
                batch_id,
            } => write!(
                f,
                "order {order_id} of suspended market {symbol} is open but batch {batch_id} \
                 has no task for it"
            ),
            Violation::OrderAcceptedWhileSuspended {
                order_id,
                symbol,
                batch_id,
                max_target_id,
            } => write!(
                f,
                "order {order_id} of market {symbol} was placed after its suspension (batch \
                 {batch_id} froze orders up to {max_target_id})"
            ),
            Violation::TaskCountMismatch {
                batch_id,
                created_count,
                tasks,
            } => write!(
                f,
                "batch {batch_id} says {created_count} tasks were created but has {tasks}"
            ),
            Violation::TaskDisagreesWithOrder {
                task_id,
                state,
                order_id,
                order_status,
            } => write!(
                f,
                "task {task_id} is {state} but its order {order_id} is {}",
                order_status.as_deref().unwrap_or("missing")
            ),
        }
    }
}

/// The batches materialised since a window's start.
const MATERIALISED_BATCHES: &str = " JOIN ( \
        SELECT id FROM task_batches WHERE materialised_at >= ?) touched \
     ON touched.id = b.id";

/// The batches a window touched: materialised since its start, or with a task changed since.
const TOUCHED_BATCHES: &str = " JOIN ( \
        SELECT id FROM task_batches WHERE materialised_at >= ? \
        UNION SELECT batch_id FROM tasks FORCE INDEX (index_tasks_recent) \
              WHERE updated_at >= ?) touched \
     ON touched.id = b.id";

/// The tasks changed since a window's start.
const TOUCHED_TASKS: &str = " JOIN ( \
        SELECT id FROM tasks FORCE INDEX (index_tasks_recent) WHERE updated_at >= ?) touched \
     ON touched.id = t.id";

/// The frozen sets of open suspensions: nothing left behind, nothing added after.
pub async fn suspension_sets(conn: &mut MySqlConnection) -> Result<Vec<Violation>, sqlx::Error> {
    suspension_sets_in(conn, Scope::All).await
}

/// [`suspension_sets`] for the batches materialised and the orders placed in `window`.
pub async fn recent_suspension_sets(
    conn: &mut MySqlConnection,
    window: Window,
) -> Result<Vec<Violation>, sqlx::Error> {
    suspension_sets_in(conn, Scope::Recent(window)).await
}

async fn suspension_sets_in(
    conn: &mut MySqlConnection,
    scope: Scope,
) -> Result<Vec<Violation>, sqlx::Error> {
    let left: Vec<(u64, String, u64)> = scope
        .fetch(
            &mut *conn,
            "SELECT o.id, b.ref, b.id \
         FROM task_batches b {recent} \
         JOIN orders o ON o.open_market_id = b.market_id AND o.id <= b.max_target_id \
         LEFT JOIN tasks t ON t.batch_id = b.id AND t.target_id = o.id \
         WHERE b.closed_at IS NULL AND b.materialised_at IS NOT NULL AND t.id IS NULL \
         ORDER BY o.id",
            MATERIALISED_BATCHES,
        )
        .await?;
    let mut violations: Vec<Violation> = left
        .into_iter()
        .map(
            |(order_id, symbol, batch_id)| Violation::OpenOrderLeftBehind {
                order_id,
                symbol,
                batch_id,
            },
        )
        .collect();
    let late: Vec<(u64, String, u64, u64)> = scope
        .fetch(
            &mut *conn,
            "SELECT o.id, m.symbol, b.id, b.max_target_id \
             FROM markets m \
             JOIN task_batches b ON b.id = m.current_batch_id \
             JOIN orders o ON o.market_id = m.id AND o.id > b.max_target_id {recent} \
             WHERE m.status = 'SUSPENDED' \
             ORDER BY o.id",
            " AND o.created_at >= ?",
        )
        .await?;
    violations.extend(
        late.into_iter()
            .map(|(order_id, symbol, batch_id, max_target_id)| {
                Violation::OrderAcceptedWhileSuspended {
                    order_id,
                    symbol,
                    batch_id,
                    max_target_id,
                }
            }),
    );
    Ok(violations)
}

/// Batches and their tasks: counts add up, and every settled task agrees with its order.
pub async fn cancel_tasks(conn: &mut MySqlConnection) -> Result<Vec<Violation>, sqlx::Error> {
    cancel_tasks_in(conn, Scope::All).await
}

/// [`cancel_tasks`] for the batches and tasks `window` touched.
pub async fn recent_cancel_tasks(
    conn: &mut MySqlConnection,
    window: Window,
) -> Result<Vec<Violation>, sqlx::Error> {
    cancel_tasks_in(conn, Scope::Recent(window)).await
}

async fn cancel_tasks_in(
    conn: &mut MySqlConnection,
    scope: Scope,
) -> Result<Vec<Violation>, sqlx::Error> {
    let counts: Vec<(u64, u64, i64)> = scope
        .fetch(
            &mut *conn,
            "SELECT b.id, b.created_count, COUNT(t.id) \
         FROM task_batches b {recent} LEFT JOIN tasks t ON t.batch_id = b.id \
         WHERE b.materialised_at IS NOT NULL \
         GROUP BY b.id, b.created_count \
         HAVING COUNT(t.id) <> b.created_count \
         ORDER BY b.id",
            TOUCHED_BATCHES,
        )
        .await?;
    let mut violations: Vec<Violation> = counts
        .into_iter()
        .map(
            |(batch_id, created_count, tasks)| Violation::TaskCountMismatch {
                batch_id,
                created_count,
                tasks: u64::try_from(tasks).unwrap_or_default(),
            },
        )
        .collect();
    let disagreeing: Vec<(u64, String, u64, Option<String>)> = scope
        .fetch(
            &mut *conn,
            "SELECT t.id, t.state, t.target_id, o.status \
         FROM tasks t {recent} \
         JOIN task_batches b ON b.id = t.batch_id \
         LEFT JOIN orders o ON o.id = t.target_id \
         WHERE t.type = 'CANCEL_OPEN_ORDER' AND ( \
               (t.state = 'DONE' AND (o.id IS NULL OR o.status <> 'CANCELLED' \
                                      OR o.cancel_reason <> b.reason)) \
            OR (t.state = 'SKIPPED' AND (o.id IS NULL \
                                         OR o.status IN ('OPEN', 'PARTIALLY_FILLED')))) \
         ORDER BY t.id",
            TOUCHED_TASKS,
        )
        .await?;
    violations.extend(
        disagreeing
            .into_iter()
            .map(
                |(task_id, state, order_id, order_status)| Violation::TaskDisagreesWithOrder {
                    task_id,
                    state,
                    order_id,
                    order_status,
                },
            ),
    );
    Ok(violations)
}
