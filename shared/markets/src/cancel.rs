//! The cancel transition of markets' tasks, which cancel-orders runs for one message's tasks:
//! claim, cancel, settle, in one transaction for the whole group (one commit per group), task
//! ids ascending so overlapping groups lock in one order and never deadlock each other.
//!
//! For each task: claim it through the retry kit (not claimed: a duplicate or settled already),
//! then `UPDATE orders SET status = 'CANCELLED' … WHERE id = ? AND status IN ('OPEN',
//! 'PARTIALLY_FILLED')`. 1 row: DONE. 0 rows: the order's status, locked, says why: FILLED or
//! CANCELLED → SKIPPED with that reason (principle 7: no longer needed is not failed); no such
//! order → FAILED at once (the set was frozen from rows that existed).
//!
//! A statement that fails (other than an unreachable database or a deadlock, which requeue the
//! message) rolls the group back, and the group is redone one task per transaction: the failing
//! task's attempt is recorded in its row while the others complete.

use std::time::Duration;

use crate::{order, task::TASKS};
use paybus_db as db;
use paybus_retry::{AfterFailure, Clock, RetryPolicy, RowState};
use sqlx::{MySqlConnection, MySqlPool};

/// What one task's attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskOutcome {
    /// This attempt cancelled the order.
    Done,
    /// The order was closed already: the task is SKIPPED with this reason.
    Skipped(String),
    /// Not due, settled already, or claimed elsewhere: nothing written.
    NotClaimed(RowState),
    /// The attempt failed below the limit; due again after `after`.
    Retry { after: Duration, error: String },
    /// The task is FAILED now (the message becomes a dead letter).
    Failed(String),
    /// The message named a task that is not one of its batch.
    Unknown(String),
}

/// The retry settings a task's attempt runs with.
#[derive(Debug, Clone)]
pub struct Attempts {
    pub policy: RetryPolicy,
    pub lease: Duration,
    pub clock: Clock,
}

#[derive(Debug, Clone, sqlx::FromRow)]
struct Target {
    id: u64,
    target_id: u64,
    reason: String,
}

/// Works `task_ids` of `batch_id` (sorted, distinct); one outcome per id.
#[tracing::instrument(skip_all, fields(batch_id, tasks = task_ids.len()))]
pub async fn cancel_tasks(
    pool: &MySqlPool,
    batch_id: u64,
    task_ids: &[u64],
    attempts: &Attempts,
) -> Result<Vec<(u64, TaskOutcome)>, sqlx::Error> {
    let targets = targets(pool, batch_id, task_ids).await?;
    let mut outcomes: Vec<(u64, TaskOutcome)> = task_ids
        .iter()
        .filter(|id| !targets.iter().any(|t| t.id == **id))
        .map(|id| {
            let error = format!("task {id} is not a task of batch {batch_id}");
            (*id, TaskOutcome::Unknown(error))
        })
        .collect();

    let mut tx = db::begin_read_committed(pool).await?;
    let mut group = Vec::with_capacity(targets.len());
    let mut failed_statement = None;
    for target in &targets {
        match attempt(&mut tx, target, attempts).await {
            Ok(outcome) => group.push((target.id, outcome)),
            Err(e) => {
                failed_statement = Some(e);
                break;
            }
        }
    }
    match failed_statement {
        None => {
            tx.commit().await?;
            outcomes.extend(group);
            return Ok(outcomes);
        }
        Some(e) if db::is_unavailable(&e) => {
            let _ = tx.rollback().await;
            return Err(e);
        }
        Some(e) => {
            tracing::warn!(batch_id, error = %e, "a cancel failed: the group goes one task at a time");
            tx.rollback().await?;
        }
    }
    for target in &targets {
        outcomes.push((target.id, one_at_a_time(pool, target, attempts).await?));
    }
    Ok(outcomes)
}

/// The tasks of the batch among `ids`, in id order, with their order and the batch's reason.
async fn targets(pool: &MySqlPool, batch_id: u64, ids: &[u64]) -> Result<Vec<Target>, sqlx::Error> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut query = sqlx::QueryBuilder::<sqlx::MySql>::new(
        "SELECT t.id, t.target_id, b.reason FROM tasks t \
         JOIN task_batches b ON b.id = t.batch_id WHERE t.batch_id = ",
    );
    query.push_bind(batch_id).push(" AND t.id IN (");
    let mut list = query.separated(", ");
    for id in ids {
        list.push_bind(*id);
    }
    query.push(") ORDER BY t.id");
    query.build_query_as().fetch_all(pool).await
}

/// One task in a transaction of its own; a failing statement is recorded on the task.
async fn one_at_a_time(
    pool: &MySqlPool,
    target: &Target,
    attempts: &Attempts,
) -> Result<TaskOutcome, sqlx::Error> {
    let mut tx = db::begin_read_committed(pool).await?;
    match attempt(&mut tx, target, attempts).await {
        Ok(outcome) => {
            tx.commit().await?;
            Ok(outcome)
        }
        Err(e) if db::is_unavailable(&e) => {
            let _ = tx.rollback().await;
            Err(e)
        }
        Err(e) => {
            tx.rollback().await?;
            record_failure(pool, target, &paybus_telemetry::one_line(&e), attempts).await
        }
    }
}

/// Claim, cancel, settle, in the caller's transaction.
async fn attempt(
    conn: &mut MySqlConnection,
    target: &Target,
    attempts: &Attempts,
) -> Result<TaskOutcome, sqlx::Error> {
    let Some(claim) = TASKS
        .claim(conn, target.id, attempts.lease, &attempts.clock)
        .await?
    else {
        return not_claimed(conn, target.id, &attempts.clock).await;
    };
    // The claim and its settle share this transaction: the settle always finds its claim.
    if order::cancel_if_open(conn, target.target_id, &target.reason).await? {
        TASKS
            .settle_done(
                conn,
                &claim,
                "state = 'DONE', finished_at = NOW(6), next_attempt_at = NULL",
            )
            .await?;
        return Ok(TaskOutcome::Done);
    }
    let order_id = target.target_id;
    match order::locked_status(conn, order_id).await?.as_deref() {
        Some(status @ ("FILLED" | "CANCELLED")) => {
            let reason = format!("order {order_id} is already {status}");
            let sql = TASKS.guarded_update(
                "state = 'SKIPPED', finished_at = NOW(6), next_attempt_at = NULL, last_error = ?",
            );
            TASKS
                .bind_guard(sqlx::query(sqlx::AssertSqlSafe(sql)).bind(&reason), &claim)
                .execute(conn)
                .await?;
            Ok(TaskOutcome::Skipped(reason))
        }
        None => {
            let error = format!(
                "order {order_id} does not exist (task {} of its suspension)",
                target.id
            );
            TASKS.settle_failed(conn, &claim, &error).await?;
            Ok(TaskOutcome::Failed(error))
        }
        Some(status) => {
            let error =
                format!("order {order_id} is still {status} after a cancel matched nothing");
            let settled = TASKS
                .settle_failure(conn, &claim, &attempts.policy, &error, &attempts.clock)
                .await?;
            Ok(after_failure(target, settled, error, &attempts.policy))
        }
    }
}

/// A failed attempt in a transaction of its own: claimed (the attempt counts) and settled by
/// the policy.
async fn record_failure(
    pool: &MySqlPool,
    target: &Target,
    error: &str,
    attempts: &Attempts,
) -> Result<TaskOutcome, sqlx::Error> {
    let mut tx = db::begin_read_committed(pool).await?;
    let Some(claim) = TASKS
        .claim(&mut tx, target.id, attempts.lease, &attempts.clock)
        .await?
    else {
        let outcome = not_claimed(&mut tx, target.id, &attempts.clock).await?;
        tx.rollback().await?;
        return Ok(outcome);
    };
    let settled = TASKS
        .settle_failure(&mut tx, &claim, &attempts.policy, error, &attempts.clock)
        .await?;
    tx.commit().await?;
    Ok(after_failure(
        target,
        settled,
        format!("cancelling order {}: {error}", target.target_id),
        &attempts.policy,
    ))
}

fn after_failure(
    target: &Target,
    settled: AfterFailure,
    error: String,
    policy: &RetryPolicy,
) -> TaskOutcome {
    let id = target.id;
    match settled {
        AfterFailure::Retry { after, failures } => TaskOutcome::Retry {
            after,
            error: format!(
                "task {id}, attempt {failures}/{}: {error}",
                policy.max_attempts()
            ),
        },
        AfterFailure::Failed { failures } => TaskOutcome::Failed(format!(
            "task {id}: gave up after {failures} attempts; last error: {error}"
        )),
        // Our own transaction holds the claim: only ops changing the row gets here.
        AfterFailure::ClaimLost => TaskOutcome::Skipped(format!(
            "task {id}: changed by someone else during its attempt ({error})"
        )),
    }
}

async fn not_claimed(
    conn: &mut MySqlConnection,
    id: u64,
    clock: &Clock,
) -> Result<TaskOutcome, sqlx::Error> {
    Ok(match TASKS.describe(conn, id, clock).await? {
        Some(state) => TaskOutcome::NotClaimed(state),
        None => TaskOutcome::Unknown(format!("task {id} does not exist")),
    })
}
