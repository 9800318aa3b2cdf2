//! `p2p_matches`: one deposit order's share of one withdraw order, RESERVED by an attempt,
//! TRADING once its createTrade is (about to be) sent, then CONFIRMED by its settlement or
//! RELEASED (the migrations' header comments are the reference).
//!
//! ```text
//!  RESERVED ──mark (before createTrade is sent)──► TRADING ──the service's trade──► CONFIRMED
//!     │                                               │
//!     └─► RELEASED (nothing was sent)                 └─► RELEASED (TRADE_REFUSED: a definitive refusal)
//! ```
//!
//! A TRADING match is never released by anything but a definitive answer: not by the reaper,
//! expiry, outcome accounting or a close (their releases take RESERVED rows only).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use paybus_db as db;
use paybus_money::Amount;
use serde::Serialize;
use sqlx::{AssertSqlSafe, MySqlConnection};

use crate::{MatchError, parse_column, withdraw_order};

paybus_db::column_enum! {
    /// `p2p_matches.status`.
    pub enum MatchStatus {
        /// Liquidity held for an attempt between its reserve and its createTrade call.
        Reserved,
        /// createTrade was (or is being) sent under the fill's key: the trade may exist at the
        /// quote service, so the liquidity stays held until a definitive answer.
        Trading,
        /// Terminal: traded and settled.
        Confirmed,
        /// Terminal: given back to the seller.
        Released,
    }
}

/// Why a reservation was given back (`p2p_matches.release_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::Display, strum::IntoStaticStr)]
#[strum(serialize_all = "SCREAMING_SNAKE_CASE")]
pub enum ReleaseReason {
    /// getQuote failed: createTrade was never sent.
    QuoteFailed,
    /// createTrade was definitively refused (a 4xx that refuses the request): not traded.
    TradeRefused,
    /// The attempt ended without settling it (an error after the trade, e.g. the database).
    AttemptEnded,
    /// The attempt's process died: the zombie reaper took the order back.
    Reaped,
    /// The deposit order was closed (expired, or given up) with the reservation still held.
    OrderClosed,
}

/// A match as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Match {
    pub id: u64,
    pub deposit_order_id: u64,
    pub withdraw_order_id: u64,
    pub amount: Amount,
    pub fee: Amount,
    pub rate: Option<Amount>,
    pub trade_key: String,
    pub quote_id: Option<String>,
    pub trade_sent_at: Option<DateTime<Utc>>,
    /// createTrade calls whose outcome stayed unknown.
    pub trade_checks: u32,
    pub last_trade_error: Option<String>,
    pub external_trade_id: Option<String>,
    pub status: MatchStatus,
    pub release_reason: Option<String>,
    pub reserved_at: DateTime<Utc>,
    pub confirmed_at: Option<DateTime<Utc>>,
    pub released_at: Option<DateTime<Utc>>,
}

#[derive(sqlx::FromRow)]
struct Row {
    id: u64,
    deposit_order_id: u64,
    withdraw_order_id: u64,
    amount: Amount,
    fee: Amount,
    rate: Option<Amount>,
    trade_key: String,
    quote_id: Option<String>,
    trade_sent_at: Option<DateTime<Utc>>,
    trade_checks: u32,
    last_trade_error: Option<String>,
    external_trade_id: Option<String>,
    status: String,
    release_reason: Option<String>,
    reserved_at: DateTime<Utc>,
    confirmed_at: Option<DateTime<Utc>>,
    released_at: Option<DateTime<Utc>>,
}

/// Every match of a deposit order, oldest first.
pub async fn of_deposit_order(
    conn: &mut MySqlConnection,
    deposit_order_id: u64,
) -> Result<Vec<Match>, MatchError> {
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT id, deposit_order_id, withdraw_order_id, amount, fee, rate, trade_key, \
                quote_id, trade_sent_at, trade_checks, last_trade_error, external_trade_id, \
                status, release_reason, reserved_at, confirmed_at, released_at \
         FROM p2p_matches WHERE deposit_order_id = ? ORDER BY id",
    )
    .bind(deposit_order_id)
    .fetch_all(conn)
    .await?;
    rows.into_iter()
        .map(|row| {
            Ok(Match {
                status: parse_column("match", row.id, "status", row.status)?,
                id: row.id,
                deposit_order_id: row.deposit_order_id,
                withdraw_order_id: row.withdraw_order_id,
                amount: row.amount,
                fee: row.fee,
                rate: row.rate,
                trade_key: row.trade_key,
                quote_id: row.quote_id,
                trade_sent_at: row.trade_sent_at,
                trade_checks: row.trade_checks,
                last_trade_error: row.last_trade_error,
                external_trade_id: row.external_trade_id,
                release_reason: row.release_reason,
                reserved_at: row.reserved_at,
                confirmed_at: row.confirmed_at,
                released_at: row.released_at,
            })
        })
        .collect()
}

/// One reserved share, as the attempt that reserved it knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reserved {
    pub(crate) match_id: u64,
    pub(crate) withdraw_order_id: u64,
    pub(crate) seller_partner_id: u64,
    pub(crate) amount: Amount,
}

/// Inserts a RESERVED match and holds its amount on the withdraw order (locked by the
/// caller), in the caller's transaction.
pub(crate) async fn reserve(
    conn: &mut MySqlConnection,
    deposit_order_id: u64,
    withdraw_order_id: u64,
    amount: Amount,
    trade_key: &str,
) -> Result<u64, MatchError> {
    withdraw_order::reserve(conn, withdraw_order_id, amount).await?;
    let id = sqlx::query(
        "INSERT INTO p2p_matches (deposit_order_id, withdraw_order_id, amount, trade_key) \
         VALUES (?, ?, ?, ?)",
    )
    .bind(deposit_order_id)
    .bind(withdraw_order_id)
    .bind(amount)
    .bind(trade_key)
    .execute(conn)
    .await?
    .last_insert_id();
    Ok(id)
}

/// RESERVED → TRADING for one fill, with the quote it is about to be traded at (the rate, and
/// the fee on its first match, as settlement will record them unless the trade says
/// otherwise), committed by the caller **before** createTrade is sent, so that a crash or a
/// lost answer after the send finds the fill in doubt, never releasable. False when not every
/// match was still RESERVED (the reaper took the order back meanwhile): nothing is to be sent.
pub(crate) async fn mark_trading(
    conn: &mut MySqlConnection,
    ids: &[u64],
    quote_id: &str,
    rate: Amount,
    fee: Amount,
) -> Result<bool, MatchError> {
    let Some(&first) = ids.first() else {
        return Ok(false);
    };
    let mark = sqlx::query(AssertSqlSafe(format!(
        "UPDATE p2p_matches \
         SET status = 'TRADING', trade_sent_at = NOW(6), quote_id = ?, rate = ?, \
             fee = IF(id = ?, ?, 0) \
         WHERE id IN ({}) AND status = 'RESERVED'",
        db::placeholders(ids.len())
    )))
    .bind(quote_id)
    .bind(rate)
    .bind(first)
    .bind(fee);
    let marked = ids
        .iter()
        .fold(mark, |query, id| query.bind(*id))
        .execute(conn)
        .await?
        .rows_affected();
    Ok(marked == ids.len() as u64)
}

/// One unknown outcome more for a TRADING fill: its `trade_checks` becomes `checks` and the
/// error is kept, in the caller's transaction.
pub(crate) async fn note_unknown_outcome(
    conn: &mut MySqlConnection,
    deposit_order_id: u64,
    trade_key: &str,
    checks: u32,
    error: &str,
) -> Result<(), MatchError> {
    sqlx::query(
        "UPDATE p2p_matches SET trade_checks = ?, last_trade_error = ? \
         WHERE deposit_order_id = ? AND trade_key = ? AND status = 'TRADING'",
    )
    .bind(checks)
    .bind(error.chars().take(2000).collect::<String>())
    .bind(deposit_order_id)
    .bind(trade_key)
    .execute(conn)
    .await?;
    Ok(())
}

/// Which reservations to give back.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Held<'a> {
    /// These matches (one attempt's), if still RESERVED.
    Matches(&'a [u64]),
    /// Every RESERVED match of these deposit orders (never a TRADING one: its trade may exist).
    OfOrders(&'a [u64]),
    /// These matches of a fill that is TRADING, after a definitive refusal of its trade.
    Refused(&'a [u64]),
}

/// RESERVED → RELEASED with `reason`, and the withdraw orders' reserved amounts given back,
/// in the caller's transaction; returns how many matches it released. Withdraw orders are
/// updated in id order, whichever orders the matches belong to, so two releases (or a
/// release and a settle) never wait for each other in a circle.
pub(crate) async fn release(
    conn: &mut MySqlConnection,
    held: Held<'_>,
    reason: ReleaseReason,
) -> Result<u64, MatchError> {
    let (column, ids, status) = match held {
        Held::Matches(ids) => ("id", ids, MatchStatus::Reserved),
        Held::OfOrders(ids) => ("deposit_order_id", ids, MatchStatus::Reserved),
        Held::Refused(ids) => ("id", ids, MatchStatus::Trading),
    };
    let status: &str = status.into();
    if ids.is_empty() {
        return Ok(0);
    }
    let list = db::placeholders(ids.len());
    let rows: Vec<(u64, u64, Amount)> = ids
        .iter()
        .fold(
            sqlx::query_as(AssertSqlSafe(format!(
                "SELECT id, withdraw_order_id, amount FROM p2p_matches \
                 WHERE {column} IN ({list}) AND status = '{status}' ORDER BY id FOR UPDATE"
            ))),
            |query, id| query.bind(*id),
        )
        .fetch_all(&mut *conn)
        .await?;
    if rows.is_empty() {
        return Ok(0);
    }
    let released: Vec<u64> = rows.iter().map(|(id, _, _)| *id).collect();
    let sellers: Vec<u64> = rows.iter().map(|(_, seller, _)| *seller).collect();
    withdraw_order::lock_in_order(conn, &sellers).await?;
    let release = sqlx::query(AssertSqlSafe(format!(
        "UPDATE p2p_matches SET status = 'RELEASED', released_at = NOW(6), release_reason = ? \
         WHERE id IN ({}) AND status = '{status}'",
        db::placeholders(released.len())
    )))
    .bind(<&str>::from(reason));
    released
        .iter()
        .fold(release, |query, id| query.bind(*id))
        .execute(&mut *conn)
        .await?;
    let mut per_seller: BTreeMap<u64, Amount> = BTreeMap::new();
    for (_, withdraw_order_id, amount) in &rows {
        let held = per_seller.entry(*withdraw_order_id).or_insert(Amount::ZERO);
        *held = held
            .checked_add(*amount)
            .ok_or_else(|| MatchError::inconsistent("reservations beyond DECIMAL(36,18)"))?;
    }
    for (withdraw_order_id, amount) in per_seller {
        withdraw_order::unreserve(conn, withdraw_order_id, amount).await?;
    }
    Ok(released.len() as u64)
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    #[test]
    fn statuses_and_reasons_are_their_column_values() {
        assert_eq!(MatchStatus::Reserved.to_string(), "RESERVED");
        assert_eq!(MatchStatus::from_str("RELEASED"), Ok(MatchStatus::Released));
        assert_eq!(MatchStatus::Trading.to_string(), "TRADING");
        assert_eq!(<&str>::from(ReleaseReason::TradeRefused), "TRADE_REFUSED");
        assert_eq!(<&str>::from(ReleaseReason::QuoteFailed), "QUOTE_FAILED");
        assert_eq!(ReleaseReason::OrderClosed.to_string(), "ORDER_CLOSED");
    }
}
