//! The writes around an attempt's trade: the fill marked TRADING before createTrade is sent
//! ([`mark_trading`]), then the last short transaction — the quote service traded the fill,
//! so its matches become CONFIRMED with the trade's own terms, the sellers' liquidity is used,
//! the ledger legs are posted and, when nothing remains, the order is MATCHED — or, when the
//! call provably did not trade, the reservation is released. Both are conditional on the
//! attempt's claim: an attempt whose claim was taken over (its process was presumed dead)
//! writes nothing.
//!
//! Ledger legs per CONFIRMED match, reference `P2P_SETTLEMENT`/match id, `idem_key` NULL (seed
//! 001: P2P legs legitimately repeat, so they stay out of the keyed set): the buyer's partner
//! CREDIT of the amount and FEE of the match's fee (the fill's fee rides on its first match),
//! the seller's partner DEBIT of the amount. Gates are taken in (partner, currency) order.

use std::collections::BTreeMap;

use paybus_bus::Outbox;
use paybus_db as db;
use paybus_ledger::{self as ledger, EntryType, Posting, ReferenceType};
use paybus_money::Amount;
use paybus_retry::{Claim, Clock};
use sqlx::{AssertSqlSafe, MySqlConnection};
use uuid::Uuid;

use crate::{
    MatchError,
    deposit_order::{self, Close, Closer},
    matches::{self, Held, ReleaseReason},
    quote::{Quote, Trade},
    reserve::Fill,
    withdraw_order,
};

/// What the settle transaction came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Settled {
    /// Nothing remains: the order is MATCHED.
    Filled,
    /// Part of the order is filled; `remaining` is left (partial-retry).
    Partial { remaining: Amount },
    /// The claim is gone: nothing was written.
    ClaimLost,
}

/// RESERVED → TRADING with `quote`, in a statement of its own (autocommit), before createTrade
/// is sent; false when the claim was taken over meanwhile (the reaper released the
/// reservation): then nothing may be sent.
pub(crate) async fn mark_trading(
    outbox: &Outbox,
    fill: &Fill,
    quote: &Quote,
) -> Result<bool, MatchError> {
    let ids: Vec<u64> = fill.matches.iter().map(|m| m.match_id).collect();
    let mut conn = outbox.pool().acquire().await?;
    let mut tries = 0;
    loop {
        tries += 1;
        match matches::mark_trading(&mut conn, &ids, &quote.quote_id, quote.rate, quote.fee).await {
            // The one conditional UPDATE was rolled back whole by a deadlock with another
            // matcher's reservation: nothing was sent yet, so it runs again.
            Err(error) if error.is_deadlock() && tries < MARK_TRIES => {
                tokio::time::sleep(std::time::Duration::from_millis(10 * u64::from(tries))).await;
            }
            marked => return marked,
        }
    }
}

/// How often the TRADING mark runs again after a deadlock before the attempt gives up.
const MARK_TRIES: u32 = 3;

#[tracing::instrument(skip_all, fields(deposit_order_id = claim.id, trade_id = %trade.trade_id))]
pub(crate) async fn settle(
    outbox: &Outbox,
    claim: &Claim,
    fill: &Fill,
    trade: &Trade,
    clock: &Clock,
    correlation_id: Uuid,
) -> Result<Settled, MatchError> {
    let mut uow = outbox.begin_read_committed().await?;
    let order = match deposit_order::lock(&mut uow, claim.id).await? {
        Some(order) if order.is_held_by(claim) => order,
        _ => {
            uow.rollback().await?;
            return Ok(Settled::ClaimLost);
        }
    };
    // An error drops the transaction, which rolls it back.
    let remaining = confirm_fill(&mut uow, fill, order.remaining_amount, trade).await?;

    let settled = if remaining.is_zero() {
        let closed = deposit_order::close(
            &mut uow,
            claim.id,
            Closer::Claim(claim),
            Close::Filled {
                last_fill_fee: trade.fee,
            },
            clock,
            correlation_id,
        )
        .await?;
        if !closed {
            // Locked and held by this claim above: the close cannot miss. Should it, nothing
            // is kept (the fill stays TRADING; the next attempt settles it under its key),
            // since the matcher takes `Filled` as the row's own word and skips accounting.
            return Err(MatchError::inconsistent(format!(
                "deposit order {} was locked under this claim, yet closing it matched nothing",
                claim.id
            )));
        }
        Settled::Filled
    } else {
        deposit_order::record_fill(&mut uow, claim.id, remaining, trade.fee).await?;
        Settled::Partial { remaining }
    };
    uow.commit().await?;
    tracing::info!(
        deposit_order_id = claim.id, filled = %fill.total, %remaining,
        trade_key = %fill.trade_key, "fill settled"
    );
    Ok(settled)
}

/// The fill's writes once traded, in the caller's transaction (which holds the deposit order):
/// the ledger legs, the sellers' reservations used (in id order), its TRADING matches
/// CONFIRMED with the trade and its terms. Returns what remains of the order, which the caller
/// writes with the fill's fee: in the close when nothing remains
/// ([`Close::Filled`](deposit_order::Close::Filled)), else [`deposit_order::record_fill`].
///
/// The legs go first: their gate rows serialise every settlement of one partner, and a
/// settlement queued at a gate while holding its sellers would make concurrent reserves skip
/// those sellers (SKIP LOCKED) for as long as the queue lasts. Sellers are held only for the
/// short tail.
pub(crate) async fn confirm_fill(
    conn: &mut MySqlConnection,
    fill: &Fill,
    order_remaining: Amount,
    trade: &Trade,
) -> Result<Amount, MatchError> {
    let id = fill.deposit_order_id;
    let remaining = order_remaining
        .checked_sub(fill.total)
        .filter(|left| !left.is_negative())
        .ok_or_else(|| {
            MatchError::inconsistent(format!(
                "deposit order {id}: fill of {} over a remaining {order_remaining}",
                fill.total
            ))
        })?;
    post_legs(conn, fill, trade.fee).await?;
    // The sellers' reservations are used first, in id order: each UPDATE takes its seller's
    // exclusive lock before the matches below are rewritten (the order
    // `withdraw_order::lock_in_order` keeps elsewhere, without a statement of its own).
    let mut sellers: Vec<_> = fill.matches.iter().collect();
    sellers.sort_by_key(|m| m.withdraw_order_id);
    for m in sellers {
        withdraw_order::use_reserved(conn, m.withdraw_order_id, m.amount).await?;
    }
    let ids: Vec<u64> = fill.matches.iter().map(|m| m.match_id).collect();
    let first = ids.first().copied().unwrap_or_default();
    let confirm = sqlx::query(AssertSqlSafe(format!(
        "UPDATE p2p_matches \
         SET status = 'CONFIRMED', confirmed_at = NOW(6), rate = ?, external_trade_id = ?, \
             fee = IF(id = ?, ?, 0) \
         WHERE id IN ({}) AND status = 'TRADING'",
        db::placeholders(ids.len())
    )))
    .bind(trade.rate)
    .bind(trade.trade_id.trim())
    .bind(first)
    .bind(trade.fee);
    let confirmed = ids
        .iter()
        .fold(confirm, |query, id| query.bind(*id))
        .execute(&mut *conn)
        .await?
        .rows_affected();
    if confirmed != ids.len() as u64 {
        // The caller holds the order, so nobody else can have released its reservations:
        // this is not a race.
        return Err(MatchError::inconsistent(format!(
            "deposit order {id}: {confirmed} of {} matches of the fill still TRADING at settle",
            ids.len()
        )));
    }
    Ok(remaining)
}

/// The legs of every match of the fill, each gate (partner, currency) taken once and in
/// order, so two settlements never wait for each other's gates in a circle.
async fn post_legs(conn: &mut MySqlConnection, fill: &Fill, fee: Amount) -> Result<(), MatchError> {
    let mut by_gate: BTreeMap<u64, Vec<Posting>> = BTreeMap::new();
    for (i, m) in fill.matches.iter().enumerate() {
        let leg = |partner_id: u64, entry_type: EntryType, amount: Amount, memo: String| {
            Posting::new(
                partner_id,
                fill.currency.clone(),
                entry_type,
                amount,
                ReferenceType::P2pSettlement,
                m.match_id,
            )
            .memo(memo)
        };
        let buyer = by_gate.entry(fill.buyer_partner_id).or_default();
        buyer.push(leg(
            fill.buyer_partner_id,
            EntryType::Credit,
            m.amount,
            format!(
                "p2p deposit order {} filled by match {}",
                fill.deposit_order_id, m.match_id
            ),
        ));
        if i == 0 && fee.is_positive() {
            buyer.push(leg(
                fill.buyer_partner_id,
                EntryType::Fee,
                fee,
                format!("p2p fee of deposit order {}", fill.deposit_order_id),
            ));
        }
        by_gate.entry(m.seller_partner_id).or_default().push(leg(
            m.seller_partner_id,
            EntryType::Debit,
            m.amount,
            format!(
                "p2p withdraw order {} used by match {}",
                m.withdraw_order_id, m.match_id
            ),
        ));
    }
    // One call for every leg: the ledger moves all the gates in one upsert (in the order
    // above) and writes the entries in one INSERT, instead of two statements per leg.
    let postings: Vec<Posting> = by_gate.into_values().flatten().collect();
    ledger::post_all(conn, &postings).await?;
    Ok(())
}

/// The fill provably did not trade (getQuote failed: its matches are RESERVED; createTrade
/// was definitively refused: TRADING): its reservations go back to the sellers, if the claim
/// still holds (otherwise whoever took the order over owns them now).
#[tracing::instrument(skip_all, fields(deposit_order_id = claim.id))]
pub(crate) async fn release(
    outbox: &Outbox,
    claim: &Claim,
    fill: &Fill,
    reason: ReleaseReason,
) -> Result<u64, MatchError> {
    let mut uow = outbox.begin_read_committed().await?;
    match deposit_order::lock(&mut uow, claim.id).await? {
        Some(order) if order.is_held_by(claim) => {}
        _ => {
            uow.rollback().await?;
            return Ok(0);
        }
    }
    let ids: Vec<u64> = fill.matches.iter().map(|m| m.match_id).collect();
    let held = if reason == ReleaseReason::TradeRefused {
        Held::Refused(&ids)
    } else {
        Held::Matches(&ids)
    };
    let released = matches::release(&mut uow, held, reason).await?;
    uow.commit().await?;
    Ok(released)
}
