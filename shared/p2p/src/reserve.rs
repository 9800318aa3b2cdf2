//! An attempt's first short transaction (seed 000 §0 ②, moved out of the quote call): lock
//! the claimed order, lock the oldest candidates `FOR UPDATE SKIP LOCKED` (at most
//! [`CANDIDATES`]; a candidate another matcher holds is skipped, never waited for), hold what
//! the fill needs as RESERVED matches, commit. No lock outlives it.

use paybus_money::Amount;
use paybus_platform::{
    bus::Outbox,
    retry::{Claim, Clock},
};
use uuid::Uuid;

use crate::{
    MatchError,
    config::{CANDIDATES, FillPolicy},
    deposit_order::{self, CloseReason, Closer},
    matches::{self, Reserved},
};

/// What the reserve step came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reservation {
    /// Liquidity held for one fill: trade it, then settle or release.
    Held(Fill),
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
    if deposit_order::close_if_expired(&mut uow, &order, claim, clock, correlation_id).await? {
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
            CloseReason::NoLiquidity,
            None,
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

    let settled_fills: i64 = sqlx::query_scalar(
        "SELECT COUNT(DISTINCT trade_key) FROM p2p_matches \
         WHERE deposit_order_id = ? AND status = 'CONFIRMED'",
    )
    .bind(claim.id)
    .fetch_one(&mut *uow)
    .await?;
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
    }))
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
