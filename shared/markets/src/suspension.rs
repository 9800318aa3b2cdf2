//! Suspend, resume, and ops' retry of FAILED tasks (docs/workflows/markets.md, seed 004).
//!
//! ```text
//! suspend (one short transaction, flat in N):
//!   UPDATE markets SET status = 'SUSPENDED' WHERE symbol = ? AND status = 'ACTIVE'
//!   ├─ 0 rows → already SUSPENDED: 200 with the existing batch, nothing created
//!   └─ 1 row  → INSERT task_batches (market, max_target_id = highest order id now)
//!               → first tasks + messages (bounded: `Plan::in_request`) → COMMIT → 202
//! resume → only when complete: no PENDING task, no open order left
//! ```
//!
//! Block first, then enqueue what exists: the conditional UPDATE takes the market row
//! exclusively, so it waits for the placements in flight (which hold it shared) and every later
//! placement sees SUSPENDED. The frozen set (the market's open orders with id ≤ `max_target_id`)
//! can only shrink; nothing joins it.

use chrono::{DateTime, Utc};
use paybus_bus::Outbox;
use paybus_ops::actor::Actor;
use paybus_ops::ops_log::{self, Entry};
use serde::Serialize;
use serde_json::json;
use sqlx::MySqlPool;

use crate::{
    MarketError,
    market::{self, MarketStatus},
    materialise::{self, HeldBatch, Plan},
    order::MARKET_SUSPENDED,
    progress,
    task::TaskType,
};

/// Longest note ops may attach to a suspension (the column's size).
pub const NOTE_MAX: usize = 255;

/// What a suspend request did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Suspension {
    pub symbol: String,
    pub batch_id: u64,
    /// False when the market was already SUSPENDED: nothing was created.
    pub suspended_now: bool,
    pub suspended_at: Option<DateTime<Utc>>,
    /// Tasks created inside the request (the first chunk); the materialiser creates the rest.
    pub tasks_created_now: u64,
    /// The created count is final already (the whole set fit in the first chunk).
    pub materialised: bool,
}

/// Suspends `symbol`'s market: one transaction that blocks placement, freezes the set of
/// orders to cancel on a new batch row, and creates the first chunk of its tasks with their
/// messages (bounded by `plan.in_request`, so the request's latency does not grow with the
/// number of open orders). An already SUSPENDED market answers with its batch and creates nothing,
/// also when two suspends race (the second waits on the row lock, then matches nothing). A
/// suspension is logged (`market.suspend`, by `actor`) in its transaction; the answer for an
/// already SUSPENDED market writes nothing.
#[tracing::instrument(skip_all, fields(symbol, batch_id))]
pub async fn suspend(
    outbox: &Outbox,
    symbol: &str,
    note: Option<&str>,
    plan: &Plan,
    actor: &Actor,
) -> Result<Suspension, MarketError> {
    let symbol = market::symbol(symbol)?;
    if note.is_some_and(|n| n.chars().count() > NOTE_MAX) {
        return Err(MarketError::Invalid(format!(
            "note is longer than {NOTE_MAX} characters"
        )));
    }
    let mut uow = outbox.begin().await?;
    let blocked = sqlx::query(
        "UPDATE markets SET status = 'SUSPENDED', suspended_at = NOW(6), resumed_at = NULL \
         WHERE symbol = ? AND status = 'ACTIVE'",
    )
    .bind(&symbol)
    .execute(&mut *uow)
    .await?
    .rows_affected();
    if blocked == 0 {
        // The UPDATE keeps the row locked (REPEATABLE READ): this is its state now.
        let current = market::locked(&mut uow, &symbol).await?;
        uow.rollback().await?;
        return match current {
            None => Err(MarketError::UnknownMarket(symbol)),
            Some(m) if m.status == MarketStatus::Suspended => {
                let batch_id = m.current_batch_id.ok_or_else(|| {
                    MarketError::UnknownValue(paybus_db::column::UnknownValue {
                        entity: "market",
                        id: m.id,
                        column: "current_batch_id",
                        value: "NULL while SUSPENDED".into(),
                    })
                })?;
                tracing::info!(%symbol, batch_id, "market already suspended: nothing created");
                Ok(Suspension {
                    symbol,
                    batch_id,
                    suspended_now: false,
                    suspended_at: m.suspended_at,
                    tasks_created_now: 0,
                    materialised: false,
                })
            }
            Some(m) => Err(MarketError::UnknownValue(paybus_db::column::UnknownValue {
                entity: "market",
                id: m.id,
                column: "status",
                value: format!("{} after a suspend matched nothing", m.status),
            })),
        };
    }
    let (market_id, suspended_at): (u64, DateTime<Utc>) =
        sqlx::query_as("SELECT id, suspended_at FROM markets WHERE symbol = ?")
            .bind(&symbol)
            .fetch_one(&mut *uow)
            .await?;
    // The frozen set's bound: placements in flight committed before our UPDATE got the row,
    // and none can commit after it, so every order of this market placed before the
    // suspension has an id up to the highest id committed now (of any market: the primary
    // key's end, one index dive whatever the history). Not the highest *open* id of the
    // market: its newest orders may have been filled already, and the audit would read them
    // as accepted while suspended (found by `paybus-lab chaos`).
    let max_target_id: u64 =
        sqlx::query_scalar("SELECT CAST(COALESCE(MAX(id), 0) AS UNSIGNED) FROM orders")
            .fetch_one(&mut *uow)
            .await?;
    let batch_id = sqlx::query(
        "INSERT INTO task_batches (type, market_id, ref, reason, note, max_target_id) \
         VALUES (?, ?, ?, ?, ?, ?)",
    )
    .bind(<&str>::from(TaskType::CancelOpenOrder))
    .bind(market_id)
    .bind(&symbol)
    .bind(MARKET_SUSPENDED)
    .bind(note)
    .bind(max_target_id)
    .execute(&mut *uow)
    .await?
    .last_insert_id();
    sqlx::query("UPDATE markets SET current_batch_id = ? WHERE id = ?")
        .bind(batch_id)
        .bind(market_id)
        .execute(&mut *uow)
        .await?;
    let batch = HeldBatch {
        id: batch_id,
        market_id,
        max_target_id,
        materialise_cursor: 0,
    };
    let chunk = materialise::next_chunk(&mut uow, &batch, plan.in_request, plan).await?;
    ops_log::append(
        &mut uow,
        &Entry {
            actor,
            action: "market.suspend",
            subject: &format!("market:{symbol}"),
            detail: &json!({
                "batch_id": batch_id,
                "note": note,
                "max_target_id": max_target_id,
                "tasks_created_now": chunk.created,
            }),
        },
    )
    .await?;
    uow.commit().await?;
    tracing::Span::current().record("batch_id", batch_id);
    tracing::info!(
        %symbol,
        batch_id,
        max_target_id,
        tasks_created_now = chunk.created,
        materialised = chunk.finished,
        "market suspended"
    );
    Ok(Suspension {
        symbol,
        batch_id,
        suspended_now: true,
        suspended_at: Some(suspended_at),
        tasks_created_now: chunk.created,
        materialised: chunk.finished,
    })
}

/// What a resume request did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Resumed {
    /// SUSPENDED → ACTIVE now; the batch is closed.
    Resumed,
    /// It was ACTIVE already: nothing changed.
    AlreadyActive,
}

/// Resumes `symbol`'s market, only once its suspension's cancellation is complete: resuming a
/// half-cancelled market would leave orders nobody will cancel next to new ones (the seed's
/// incident). Refused with the progress summary otherwise. A resume is logged
/// (`market.resume`, by `actor`) in its transaction; an ACTIVE market's or a refused one
/// writes nothing.
#[tracing::instrument(skip_all, fields(symbol))]
pub async fn resume(pool: &MySqlPool, symbol: &str, actor: &Actor) -> Result<Resumed, MarketError> {
    let symbol = market::symbol(symbol)?;
    let mut tx = pool.begin().await?;
    let Some(current) = market::locked(&mut tx, &symbol).await? else {
        return Err(MarketError::UnknownMarket(symbol));
    };
    if current.status == MarketStatus::Active {
        tx.rollback().await?;
        return Ok(Resumed::AlreadyActive);
    }
    // The market row is ours: no placement, suspend, resume or retry moves under us, and a
    // complete batch has no PENDING task left to change.
    let progress = progress::of_market(&mut tx, &current)
        .await?
        .ok_or_else(|| MarketError::NeverSuspended(symbol.clone()))?;
    if !progress.complete {
        tx.rollback().await?;
        return Err(MarketError::StillCancelling {
            symbol,
            summary: progress.summary,
        });
    }
    sqlx::query(
        "UPDATE markets SET status = 'ACTIVE', resumed_at = NOW(6) \
         WHERE id = ? AND status = 'SUSPENDED'",
    )
    .bind(current.id)
    .execute(&mut *tx)
    .await?;
    sqlx::query("UPDATE task_batches SET closed_at = NOW(6) WHERE id = ? AND closed_at IS NULL")
        .bind(progress.batch_id)
        .execute(&mut *tx)
        .await?;
    ops_log::append(
        &mut tx,
        &Entry {
            actor,
            action: "market.resume",
            subject: &format!("market:{symbol}"),
            detail: &json!({ "batch_id": progress.batch_id, "summary": progress.summary }),
        },
    )
    .await?;
    tx.commit().await?;
    tracing::info!(%symbol, batch_id = progress.batch_id, "market resumed");
    Ok(Resumed::Resumed)
}

/// Puts the FAILED tasks of `symbol`'s current suspension back to PENDING with a fresh set of
/// attempts, due now (ops fixed what made them fail); the due sweep re-publishes them.
/// Returns how many. Only while the market is SUSPENDED. A retry that moved tasks is logged
/// (`market.retry_failed_tasks`, by `actor`) in its transaction; one that found none writes
/// nothing.
#[tracing::instrument(skip_all, fields(symbol))]
pub async fn retry_failed(
    pool: &MySqlPool,
    symbol: &str,
    actor: &Actor,
) -> Result<u64, MarketError> {
    let symbol = market::symbol(symbol)?;
    let mut tx = pool.begin().await?;
    let Some(current) = market::locked(&mut tx, &symbol).await? else {
        return Err(MarketError::UnknownMarket(symbol));
    };
    let (MarketStatus::Suspended, Some(batch_id)) = (current.status, current.current_batch_id)
    else {
        tx.rollback().await?;
        return Err(MarketError::NotSuspended(symbol));
    };
    let retried = sqlx::query(
        "UPDATE tasks SET state = 'PENDING', attempts = 0, next_attempt_at = NOW(6), \
                          republished_at = NULL \
         WHERE batch_id = ? AND state = 'FAILED'",
    )
    .bind(batch_id)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if retried > 0 {
        ops_log::append(
            &mut tx,
            &Entry {
                actor,
                action: "market.retry_failed_tasks",
                subject: &format!("market:{symbol}"),
                detail: &json!({ "batch_id": batch_id, "retried": retried }),
            },
        )
        .await?;
    }
    tx.commit().await?;
    tracing::info!(%symbol, batch_id, retried, "FAILED cancel tasks put back to PENDING");
    Ok(retried)
}
