//! The seed's `createAndMatch` (seed 000 §0), kept as the control it is measured against: the
//! race tests' control and `paybus-lab bench match`'s baseline. It runs this crate's own
//! statements (the same rows and ledger legs as the real path), which is why it lives here
//! rather than in the test kit; nothing deployed calls it.

use paybus_bus::Outbox;
use paybus_money::Amount;
use paybus_retry::Clock;
use uuid::Uuid;

use crate::{
    CreateError, Inserted, MatchError,
    config::{CANDIDATES, DEFAULT_ORDER_TTL},
    deposit_order::{self, Close, CloseReason, Closer, NewDepositOrder, Start},
    matches::{self, Reserved},
    quote::{QuoteClient, QuoteRequest, TradeRequest},
    reserve::Fill,
    settle,
};

/// The seed's `createAndMatch` (seed 000 §0), for the race tests' control and the benchmark's
/// baseline: ONE transaction from the order's insert to its commit, `FOR UPDATE` (waiting, not
/// skipping) on the oldest candidates and on the partner's lock row, and the quote service
/// called with all of them held. Fill-or-cancel, the same rows and legs as the real path.
///
/// Under concurrency its REPEATABLE READ locking reads also deadlock on each other's gap
/// locks; a transaction that lost one is tried again, so what is measured is its lock holding.
pub async fn create_and_match_holding_locks(
    outbox: &Outbox,
    quote: &QuoteClient,
    new: &NewDepositOrder,
) -> Result<(u64, CloseReason), MatchError> {
    loop {
        match seed_create_and_match(outbox, quote, new).await {
            Err(MatchError::Database(error)) if paybus_db::error_number(&error) == Some(1213) => {}
            other => return other,
        }
    }
}

async fn seed_create_and_match(
    outbox: &Outbox,
    quote: &QuoteClient,
    new: &NewDepositOrder,
) -> Result<(u64, CloseReason), MatchError> {
    let clock = Clock::Database;
    let mut tx = outbox.begin().await?;
    // ① the order.
    let id = match deposit_order::insert(&mut tx, new, DEFAULT_ORDER_TTL, &clock, Start::Pending)
        .await
    {
        Ok(Inserted::New(id)) => id,
        Ok(Inserted::Existing(id)) => {
            return Err(MatchError::inconsistent(format!(
                "deposit order {id} already exists for this reference"
            )));
        }
        Err(CreateError::Match(error)) => return Err(error),
        Err(other) => return Err(MatchError::inconsistent(other.to_string())),
    };
    // ② the candidates, locked and waited for.
    let candidates: Vec<(u64, u64, Amount)> = sqlx::query_as(
        "SELECT id, partner_id, remaining_amount - reserved_amount FROM p2p_withdraw_orders \
         WHERE status = 'OPEN' AND currency = ? AND remaining_amount > reserved_amount \
         ORDER BY created_at, id LIMIT ? FOR UPDATE",
    )
    .bind(&new.currency)
    .bind(CANDIDATES)
    .fetch_all(&mut *tx)
    .await?;
    // ③ the partner's lock row.
    sqlx::query("SELECT id FROM partners WHERE id = ? FOR UPDATE")
        .bind(new.partner_id)
        .execute(&mut *tx)
        .await?;
    let mut left = new.amount;
    let mut reserved = Vec::new();
    let trade_key = format!("p2p-deposit-{id}-fill-1");
    for (withdraw_order_id, seller_partner_id, available) in candidates {
        if left.is_zero() {
            break;
        }
        let amount = available.min(left);
        left = left.checked_sub(amount).unwrap_or(Amount::ZERO);
        let match_id = matches::reserve(&mut tx, id, withdraw_order_id, amount, &trade_key).await?;
        reserved.push(Reserved {
            match_id,
            withdraw_order_id,
            seller_partner_id,
            amount,
        });
    }
    let close = if left.is_zero() {
        // ④ the external calls, every lock above still held.
        let reference = format!("p2p-deposit-{id}");
        let priced = quote
            .quote(&QuoteRequest {
                currency: &new.currency,
                amount: new.amount,
                reference: &reference,
            })
            .await?;
        let ids: Vec<u64> = reserved.iter().map(|m| m.match_id).collect();
        matches::mark_trading(&mut tx, &ids, &priced.quote_id, priced.rate, priced.fee).await?;
        let trade = quote
            .create_trade(
                &TradeRequest {
                    quote_id: &priced.quote_id,
                    currency: &new.currency,
                    amount: new.amount,
                    reference: &reference,
                    key: &trade_key,
                },
                &priced,
            )
            .await?;
        // ⑤ the matches.
        let fill = Fill {
            deposit_order_id: id,
            buyer_partner_id: new.partner_id,
            currency: new.currency.clone(),
            matches: reserved,
            total: new.amount,
            trade_key,
            sent: Some(priced),
            trade_checks: 0,
        };
        settle::confirm_fill(&mut tx, &fill, new.amount, &trade).await?;
        Close::Filled {
            last_fill_fee: trade.fee,
        }
    } else {
        Close::NoLiquidity
    };
    deposit_order::close(&mut tx, id, Closer::Locked, close, &clock, Uuid::now_v7()).await?;
    // ⑥ commit: only now are the locks released.
    tx.commit().await?;
    Ok((id, close.reason()))
}
