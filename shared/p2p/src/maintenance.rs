//! The statements behind match-deposit's sweeper jobs (seed 000 §3–§5): the batch claim of due
//! orders, the zombie reaper and expiry. Each is one short READ COMMITTED transaction that
//! takes its rows `FOR UPDATE SKIP LOCKED`, so several sweepers never take the same order and
//! never wait on an attempt's lock.

use std::time::Duration;

use paybus_bus::Outbox;
use paybus_db as db;
use paybus_retry::{Claim, Clock, clock::micros};
use sqlx::AssertSqlSafe;
use uuid::Uuid;

use crate::{
    MatchError,
    deposit_order::{self, Close, Closer, DEPOSIT_ORDERS},
    matches::{self, Held, ReleaseReason},
};

/// Claims up to `limit` due PENDING orders, oldest due first: PENDING → MATCHING with
/// `claimed_at`, committed before any of them is worked on (seed 000 §3). Picks up orders whose
/// message was lost, whose retry is due, and the ones the reaper handed back.
pub async fn claim_due(
    outbox: &Outbox,
    limit: u32,
    clock: &Clock,
) -> Result<Vec<Claim>, MatchError> {
    let mut tx = db::begin_read_committed(outbox.pool()).await?;
    let claims = DEPOSIT_ORDERS
        .claim_due(&mut tx, limit, Duration::ZERO, clock)
        .await?;
    tx.commit().await?;
    Ok(claims)
}

/// The zombie reaper (seed 000 §5): MATCHING orders claimed longer than `timeout` ago (their
/// process died mid-attempt) go back to PENDING, due now, with no attempt counted; their
/// RESERVED matches are released in the same transaction, so no liquidity stays held by a dead
/// attempt. A TRADING fill (the attempt died after createTrade was sent) is *not* released: it
/// stays held, and the order's next attempt asks the quote service about it under its key
/// (resolution, not release). Only claimed rows (`claimed_at IS NOT NULL`). Returns the
/// orders' ids.
pub async fn reap_zombies(
    outbox: &Outbox,
    timeout: Duration,
    limit: u32,
    clock: &Clock,
) -> Result<Vec<u64>, MatchError> {
    let mut tx = db::begin_read_committed(outbox.pool()).await?;
    let ids = DEPOSIT_ORDERS
        .reap_expired(&mut tx, timeout, limit, clock)
        .await?;
    let released = matches::release(&mut tx, Held::OfOrders(&ids), ReleaseReason::Reaped).await?;
    if ids.is_empty() {
        tx.rollback().await?;
        return Ok(ids);
    }
    let in_doubt: i64 = ids
        .iter()
        .fold(
            sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT COUNT(DISTINCT trade_key) FROM p2p_matches \
                 WHERE deposit_order_id IN ({}) AND status = 'TRADING'",
                db::placeholders(ids.len())
            ))),
            |query, id| query.bind(*id),
        )
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    tracing::warn!(
        orders = ?ids, released, fills_in_doubt = in_doubt, ?timeout,
        "zombie claims reaped: orders PENDING again (fills in doubt are kept and asked about)"
    );
    Ok(ids)
}

/// Expiry: open orders past `expires_at` become EXPIRED and their reservations are released.
/// A MATCHING order only once its claim is older than `zombie_timeout`: a live attempt closes
/// its own order (its accounting sees the expiry), and its trade is never pulled from under it.
/// Never an order with a fill in doubt (TRADING): a trade may exist for it; its attempts ask
/// first, and it expires once the answer says no trade was made.
pub async fn expire_due(
    outbox: &Outbox,
    zombie_timeout: Duration,
    limit: u32,
    clock: &Clock,
) -> Result<Vec<u64>, MatchError> {
    let mut uow = outbox.begin_read_committed().await?;
    let ids: Vec<u64> = sqlx::query_scalar(
        "SELECT id FROM p2p_deposit_orders \
         WHERE status IN ('PENDING', 'MATCHING') AND expires_at <= COALESCE(?, NOW(6)) \
           AND (status = 'PENDING' \
                OR claimed_at <= COALESCE(?, NOW(6)) - INTERVAL ? MICROSECOND) \
           AND NOT EXISTS (SELECT 1 FROM p2p_matches m \
                           WHERE m.deposit_order_id = p2p_deposit_orders.id \
                             AND m.status = 'TRADING') \
         ORDER BY expires_at, id LIMIT ? FOR UPDATE SKIP LOCKED",
    )
    .bind(clock.sql_now())
    .bind(clock.sql_now())
    .bind(micros(zombie_timeout))
    .bind(limit)
    .fetch_all(&mut *uow)
    .await?;
    if ids.is_empty() {
        uow.rollback().await?;
        return Ok(ids);
    }
    // All of the batch's reservations in one pass (withdraw orders in id order), before the
    // closes, which then find none left.
    matches::release(&mut uow, Held::OfOrders(&ids), ReleaseReason::OrderClosed).await?;
    for &id in &ids {
        deposit_order::close(
            &mut uow,
            id,
            Closer::Locked,
            Close::Expired,
            clock,
            Uuid::now_v7(),
        )
        .await?;
    }
    uow.commit().await?;
    tracing::info!(orders = ?ids, "deposit orders expired");
    Ok(ids)
}
