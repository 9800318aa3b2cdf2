//! An attempt's first short transaction (seed 000 §0 ②, moved out of the quote call): lock
//! the claimed order, lock the oldest candidates `FOR UPDATE SKIP LOCKED` (at most
//! [`CANDIDATES`]; a candidate another matcher holds is skipped, never waited for), hold what
//! the fill needs as RESERVED matches, commit. No lock outlives it.
//!
//! An order with a fill in doubt (TRADING: its createTrade's outcome is unknown) reserves
//! nothing and is never closed here: the attempt asks about that fill first, under its key
//! (principle 12).

use chrono::{DateTime, Utc};
use paybus_bus::Outbox;
use paybus_money::Amount;
use paybus_retry::{Claim, Clock};
use uuid::Uuid;

use crate::{
    MatchError,
    config::{CANDIDATES, FillPolicy},
    deposit_order::{self, Close, CloseReason, Closer},
    matches::{self, Reserved},
    quote::Quote,
};

/// What the reserve step came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reservation {
    /// Liquidity held for one fill: trade it, then settle or release.
    Held(Fill),
    /// A fill of this order is TRADING (sent, outcome unknown): ask again under its key.
    InDoubt(Fill),
    /// The order was closed here (fill-or-cancel found too little; or it had expired).
    Closed(CloseReason),
    /// Partial-retry found nothing available: the order stays MATCHING (seed 000 §3.1's
    /// "returns normally, still MATCHING").
    NothingAvailable { remaining: Amount },
    /// Fill-or-cancel came up short only because other matchers hold candidates this very
    /// moment (they were skipped, not counted): try again shortly, do not cancel.
    Contended { remaining: Amount },
    /// The order is no longer held by this claim (reaped, or expired meanwhile).
    ClaimLost,
}

/// One fill's reservations: the matches, their total and the fill's idempotency key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fill {
    pub(crate) deposit_order_id: u64,
    pub(crate) buyer_partner_id: u64,
    pub(crate) currency: String,
    pub(crate) matches: Vec<Reserved>,
    pub(crate) total: Amount,
    /// `p2p-deposit-{id}-fill-{n}`: n counts this order's settled fills, so a fill tried
    /// again (after a failed call, a crash, a lost settle) asks the quote service for the
    /// same trade.
    pub(crate) trade_key: String,
    /// The quote a TRADING fill was sent with (the same body is sent again), and how many of
    /// its calls ended unknown; `None` / 0 for a fill just reserved.
    pub(crate) sent: Option<Quote>,
    pub(crate) trade_checks: u32,
}

#[derive(sqlx::FromRow)]
struct Candidate {
    id: u64,
    partner_id: u64,
    available: Amount,
}

/// The reserve transaction (READ COMMITTED: its SKIP LOCKED scan takes no gap locks).
#[tracing::instrument(skip_all, fields(deposit_order_id = claim.id))]
pub(crate) async fn reserve(
    outbox: &Outbox,
    claim: &Claim,
    policy: FillPolicy,
    clock: &Clock,
    correlation_id: Uuid,
) -> Result<Reservation, MatchError> {
    let mut uow = outbox.begin_read_committed().await?;
    let order = match deposit_order::lock(&mut uow, claim.id).await? {
        Some(order) if order.is_held_by(claim) => order,
        _ => {
            uow.rollback().await?;
            return Ok(Reservation::ClaimLost);
        }
    };
    // One read of the order's fills: how many are settled (the next key's number), and
    // whether one is in doubt; with the clock the expiry is judged by.
    let (settled_fills, in_doubt, now): (i64, Option<String>, DateTime<Utc>) = sqlx::query_as(
        "SELECT CAST(COUNT(DISTINCT CASE WHEN status = 'CONFIRMED' THEN trade_key END) AS SIGNED), \
                MAX(CASE WHEN status = 'TRADING' THEN trade_key END), COALESCE(?, NOW(6)) \
         FROM p2p_matches WHERE deposit_order_id = ?",
    )
    .bind(clock.sql_now())
    .bind(claim.id)
    .fetch_one(&mut *uow)
    .await?;
    if let Some(trade_key) = in_doubt {
        let fill = in_doubt_fill(&mut uow, &order, trade_key).await?;
        uow.rollback().await?;
        return Ok(Reservation::InDoubt(fill));
    }
    if deposit_order::close_if_expired(&mut uow, &order, now, claim, clock, correlation_id).await? {
        uow.commit().await?;
        return Ok(Reservation::Closed(CloseReason::Expired));
    }

    let need = order.remaining_amount;
    let candidates: Vec<Candidate> = sqlx::query_as(
        "SELECT id, partner_id, remaining_amount - reserved_amount AS available \
         FROM p2p_withdraw_orders \
         WHERE status = 'OPEN' AND currency = ? AND remaining_amount > reserved_amount \
         ORDER BY created_at, id LIMIT ? FOR UPDATE SKIP LOCKED",
    )
    .bind(&order.currency)
    .bind(CANDIDATES)
    .fetch_all(&mut *uow)
    .await?;
    let plan = allocate(&candidates, need);
    let planned: Amount = plan.iter().map(|(_, amount)| *amount).sum();

    if planned < need && policy == FillPolicy::FillOrCancel {
        // Skipped rows are not missing liquidity: look at the same candidates without locking
        // (capped at the largest amount: ten huge offers must not overflow the sum's decoding).
        let visible: Amount = sqlx::query_scalar(
            "SELECT LEAST(COALESCE(SUM(available), 0), 999999999999999999.999999999999999999) \
             FROM ( \
                 SELECT remaining_amount - reserved_amount AS available FROM p2p_withdraw_orders \
                 WHERE status = 'OPEN' AND currency = ? AND remaining_amount > reserved_amount \
                 ORDER BY created_at, id LIMIT ?) oldest",
        )
        .bind(&order.currency)
        .bind(CANDIDATES)
        .fetch_one(&mut *uow)
        .await?;
        if visible >= need {
            uow.rollback().await?;
            return Ok(Reservation::Contended { remaining: need });
        }
        let closed = deposit_order::close(
            &mut uow,
            claim.id,
            Closer::Claim(claim),
            Close::NoLiquidity,
            clock,
            correlation_id,
        )
        .await?;
        uow.commit().await?;
        if !closed {
            return Ok(Reservation::ClaimLost);
        }
        tracing::info!(
            deposit_order_id = claim.id, %need, available = %visible,
            "fill-or-cancel: not enough liquidity; cancelled"
        );
        return Ok(Reservation::Closed(CloseReason::NoLiquidity));
    }
    if planned.is_zero() {
        uow.rollback().await?;
        return Ok(Reservation::NothingAvailable { remaining: need });
    }

    let trade_key = format!("p2p-deposit-{}-fill-{}", claim.id, settled_fills + 1);
    let mut reserved = Vec::with_capacity(plan.len());
    for (candidate, amount) in plan {
        let match_id =
            matches::reserve(&mut uow, claim.id, candidate.id, amount, &trade_key).await?;
        reserved.push(Reserved {
            match_id,
            withdraw_order_id: candidate.id,
            seller_partner_id: candidate.partner_id,
            amount,
        });
    }
    uow.commit().await?;
    tracing::debug!(deposit_order_id = claim.id, %planned, matches = reserved.len(), "reserved");
    Ok(Reservation::Held(Fill {
        deposit_order_id: claim.id,
        buyer_partner_id: order.partner_id,
        currency: order.currency,
        matches: reserved,
        total: planned,
        trade_key,
        sent: None,
        trade_checks: 0,
    }))
}

#[derive(sqlx::FromRow)]
struct TradingMatch {
    id: u64,
    withdraw_order_id: u64,
    seller_partner_id: u64,
    amount: Amount,
    quote_id: String,
    rate: Amount,
    fee: Amount,
    trade_checks: u32,
}

/// The TRADING matches under `trade_key` as the fill they were sent as (the quote they carry
/// is the body sent again).
async fn in_doubt_fill(
    conn: &mut sqlx::MySqlConnection,
    order: &deposit_order::DepositOrder,
    trade_key: String,
) -> Result<Fill, MatchError> {
    let rows: Vec<TradingMatch> = sqlx::query_as(
        "SELECT m.id, m.withdraw_order_id, w.partner_id AS seller_partner_id, m.amount, \
                m.quote_id, m.rate, m.fee, m.trade_checks \
         FROM p2p_matches m JOIN p2p_withdraw_orders w ON w.id = m.withdraw_order_id \
         WHERE m.deposit_order_id = ? AND m.trade_key = ? AND m.status = 'TRADING' \
         ORDER BY m.id",
    )
    .bind(order.id)
    .bind(&trade_key)
    .fetch_all(&mut *conn)
    .await?;
    let Some(first) = rows.first() else {
        return Err(MatchError::inconsistent(format!(
            "deposit order {}: fill {trade_key} is TRADING but has no matches",
            order.id
        )));
    };
    let mut total = Amount::ZERO;
    let mut fee = Amount::ZERO;
    for row in &rows {
        total = total
            .checked_add(row.amount)
            .ok_or_else(|| MatchError::inconsistent("a fill beyond DECIMAL(36,18)"))?;
        fee = fee
            .checked_add(row.fee)
            .ok_or_else(|| MatchError::inconsistent("a fee beyond DECIMAL(36,18)"))?;
    }
    Ok(Fill {
        deposit_order_id: order.id,
        buyer_partner_id: order.partner_id,
        currency: order.currency.clone(),
        sent: Some(Quote {
            quote_id: first.quote_id.clone(),
            rate: first.rate,
            fee,
        }),
        trade_checks: rows.iter().map(|r| r.trade_checks).max().unwrap_or(0),
        matches: rows
            .iter()
            .map(|r| Reserved {
                match_id: r.id,
                withdraw_order_id: r.withdraw_order_id,
                seller_partner_id: r.seller_partner_id,
                amount: r.amount,
            })
            .collect(),
        total,
        trade_key,
    })
}

/// Oldest first, each candidate gives what it has until `need` is covered.
fn allocate(candidates: &[Candidate], need: Amount) -> Vec<(&Candidate, Amount)> {
    let mut left = need;
    let mut plan = Vec::new();
    for candidate in candidates {
        if left.is_zero() {
            break;
        }
        let take = candidate.available.min(left);
        if take.is_positive() {
            plan.push((candidate, take));
            left = left.checked_sub(take).unwrap_or(Amount::ZERO);
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use paybus_money::Amount;

    use super::*;

    fn d(text: &str) -> Amount {
        text.parse().expect("an amount")
    }

    fn candidate(id: u64, available: &str) -> Candidate {
        Candidate {
            id,
            partner_id: 1,
            available: d(available),
        }
    }

    #[test]
    fn the_oldest_candidates_fill_first_and_nobody_gives_more_than_needed() {
        let candidates = [candidate(1, "30"), candidate(2, "50"), candidate(3, "100")];
        let plan: Vec<(u64, Amount)> = allocate(&candidates, d("60"))
            .into_iter()
            .map(|(c, amount)| (c.id, amount))
            .collect();
        assert_eq!(plan, [(1, d("30")), (2, d("30"))]);
    }

    #[test]
    fn too_little_liquidity_takes_everything_there_is() {
        let candidates = [candidate(1, "0.5"), candidate(2, "0.25")];
        let plan: Amount = allocate(&candidates, d("1"))
            .into_iter()
            .map(|(_, a)| a)
            .sum();
        assert_eq!(plan, d("0.75"));
        assert!(allocate(&[], d("1")).is_empty());
    }
}
