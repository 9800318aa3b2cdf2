//! W1's invariants (docs/workflows/p2p.md, seed 000), in plain SQL, one statement per check.
//!
//! | check | invariant |
//! | --- | --- |
//! | `p2p_seller_liquidity` | no seller used or reserved beyond its offer: `remaining = amount - CONFIRMED`, `reserved = RESERVED + TRADING`, `CONFIRMED <= amount` |
//! | `p2p_stale_reservations` | no RESERVED match older than the zombie timeout (`PAYBUS_MATCH_ZOMBIE_TIMEOUT_MS`, default 5 min), none on a closed order |
//! | `p2p_deposit_fills` | every deposit order's CONFIRMED matches sum to what it filled (`amount - remaining`); a MATCHED order's to its whole amount |
//! | `p2p_settlement_legs` | every CONFIRMED match has exactly its legs (buyer CREDIT, seller DEBIT, buyer FEE when it carries a fee); no `P2P_SETTLEMENT` entry without a CONFIRMED match |
//! | `p2p_trades_in_doubt` | no TRADING fill (createTrade's outcome unknown) on a closed order; no IN_DOUBT order without its dead letter (after 5 minutes for it to be recorded); no TRADING fill sent longer ago than every check could take (`PAYBUS_MATCH_TRADE_CHECKS`' backoff plus the zombie timeout) whose order is not IN_DOUBT: asking about it stalled |
//!
//! The `recent` forms run the same SQL over the orders, matches and entries the window touched
//! (through their `index_*_recent`) or linked to them; an order is still checked against all of
//! its matches. `p2p_stale_reservations` and `p2p_trades_in_doubt` read live sets bounded by the
//! attempts in flight, so their recent form is the full one: a reservation goes stale by ageing,
//! which no window of writes shows.

use std::fmt;

use paybus_ops::audit::{Check, Finding, Scope, Window};
use serde::Serialize;
use sqlx::MySqlConnection;

use crate::config::MatchingConfig;

/// W1's checks, in the order `paybus audit` runs them.
pub const CHECKS: &[Check] = &[
    paybus_ops::audit_check!("p2p_seller_liquidity", seller_liquidity, recent: recent_seller_liquidity),
    // Bounded already (see the module docs): the same read every pass.
    paybus_ops::audit_check!("p2p_stale_reservations", stale_reservations, bounded),
    paybus_ops::audit_check!("p2p_deposit_fills", deposit_fills, recent: recent_deposit_fills),
    // Bounded already (see the module docs): the same read every pass.
    paybus_ops::audit_check!("p2p_trades_in_doubt", trades_in_doubt, bounded),
    paybus_ops::audit_check!("p2p_settlement_legs", settlement_legs, recent: recent_settlement_legs),
];

/// One broken W1 invariant; [`fmt::Display`] renders it as one line naming the ids involved.
/// Amounts are the database's exact text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "check", rename_all = "snake_case")]
pub enum Violation {
    /// A withdraw order whose amounts disagree with its matches (used or reserved twice,
    /// beyond its offer, or drifted).
    SellerLiquidity {
        withdraw_order_id: u64,
        amount: String,
        remaining_amount: String,
        reserved_amount: String,
        confirmed: String,
        reserved_by_matches: String,
    },
    /// A match RESERVED for longer than the zombie timeout, or on a closed order.
    StaleReservation {
        match_id: u64,
        deposit_order_id: u64,
        order_status: String,
        reserved_for_secs: u64,
    },
    /// A deposit order whose CONFIRMED matches disagree with its filled amount.
    DepositFill {
        deposit_order_id: u64,
        status: String,
        amount: String,
        remaining_amount: String,
        confirmed: String,
    },
    /// A CONFIRMED match whose ledger legs are missing, doubled or wrong.
    SettlementLegs {
        match_id: u64,
        credits: i64,
        debits: i64,
        fees: i64,
        entries: i64,
        expected_fees: i64,
    },
    /// A fill whose createTrade outcome is unknown (TRADING) on an order that was closed
    /// anyway: a trade may exist for an order paybus gave up on.
    InDoubtOnClosedOrder {
        deposit_order_id: u64,
        order_status: String,
        trade_key: String,
    },
    /// An IN_DOUBT order with no dead letter: nobody was told to look.
    InDoubtWithoutDeadLetter { deposit_order_id: u64 },
    /// A TRADING fill sent longer ago than every check could take, on an order not parked
    /// IN_DOUBT: asking about it stalled.
    InDoubtUnattended {
        deposit_order_id: u64,
        order_status: String,
        trade_key: String,
        sent_for_secs: u64,
    },
    /// A `P2P_SETTLEMENT` entry for a match that is not CONFIRMED (or does not exist).
    UnexpectedSettlementEntry {
        entry_id: u64,
        match_id: u64,
        match_status: Option<String>,
    },
}

impl Finding for Violation {
    fn check(&self) -> &'static str {
        match self {
            Violation::SellerLiquidity { .. } => "p2p_seller_liquidity",
            Violation::StaleReservation { .. } => "p2p_stale_reservation",
            Violation::DepositFill { .. } => "p2p_deposit_fill",
            Violation::SettlementLegs { .. } => "p2p_settlement_legs",
            Violation::UnexpectedSettlementEntry { .. } => "p2p_unexpected_settlement_entry",
            Violation::InDoubtOnClosedOrder { .. } => "p2p_in_doubt_on_closed_order",
            Violation::InDoubtWithoutDeadLetter { .. } => "p2p_in_doubt_without_dead_letter",
            Violation::InDoubtUnattended { .. } => "p2p_in_doubt_unattended",
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.check())?;
        match self {
            Violation::SellerLiquidity {
                withdraw_order_id,
                amount,
                remaining_amount,
                reserved_amount,
                confirmed,
                reserved_by_matches,
            } => write!(
                f,
                "withdraw order {withdraw_order_id} offers {amount} with {remaining_amount} \
                 remaining and {reserved_amount} reserved, but its matches have {confirmed} \
                 CONFIRMED and {reserved_by_matches} RESERVED or TRADING"
            ),
            Violation::StaleReservation {
                match_id,
                deposit_order_id,
                order_status,
                reserved_for_secs,
            } => write!(
                f,
                "match {match_id} of deposit order {deposit_order_id} ({order_status}) has been \
                 RESERVED for {reserved_for_secs} s"
            ),
            Violation::DepositFill {
                deposit_order_id,
                status,
                amount,
                remaining_amount,
                confirmed,
            } => write!(
                f,
                "deposit order {deposit_order_id} ({status}) of {amount} has {remaining_amount} \
                 remaining, but its CONFIRMED matches sum to {confirmed}"
            ),
            Violation::SettlementLegs {
                match_id,
                credits,
                debits,
                fees,
                entries,
                expected_fees,
            } => write!(
                f,
                "CONFIRMED match {match_id} has {credits} buyer CREDIT, {debits} seller DEBIT \
                 and {fees} FEE leg(s) ({entries} entries in all); expected 1, 1 and \
                 {expected_fees}"
            ),
            Violation::InDoubtOnClosedOrder {
                deposit_order_id,
                order_status,
                trade_key,
            } => write!(
                f,
                "deposit order {deposit_order_id} is {order_status} while its fill {trade_key} \
                 is in doubt (TRADING): a trade may exist for it at the quote service"
            ),
            Violation::InDoubtWithoutDeadLetter { deposit_order_id } => write!(
                f,
                "deposit order {deposit_order_id} is IN_DOUBT without a dead letter"
            ),
            Violation::InDoubtUnattended {
                deposit_order_id,
                order_status,
                trade_key,
                sent_for_secs,
            } => write!(
                f,
                "fill {trade_key} of deposit order {deposit_order_id} ({order_status}) has been \
                 in doubt for {sent_for_secs} s, longer than every check could take, and the \
                 order is not IN_DOUBT"
            ),
            Violation::UnexpectedSettlementEntry {
                entry_id,
                match_id,
                match_status,
            } => match match_status {
                Some(status) => write!(
                    f,
                    "entry {entry_id} settles match {match_id}, which is {status}"
                ),
                None => write!(
                    f,
                    "entry {entry_id} settles match {match_id}, which does not exist"
                ),
            },
        }
    }
}

/// An amount the database summed, as paybus writes amounts ("100", not
/// "100.000000000000000000"); kept as the database wrote it if it does not fit an amount.
fn exact(text: String) -> String {
    text.parse::<paybus_money::Amount>()
        .map_or(text, |amount| amount.to_string())
}

/// The withdraw orders a window touched: changed since its start, or with a match changed
/// since.
const TOUCHED_WITHDRAW_ORDERS: &str = " JOIN ( \
        SELECT id FROM p2p_withdraw_orders FORCE INDEX (index_p2p_withdraw_orders_recent) \
              WHERE updated_at >= ? \
        UNION SELECT withdraw_order_id FROM p2p_matches FORCE INDEX (index_p2p_matches_recent) \
              WHERE updated_at >= ?) touched \
     ON touched.id = w.id";

/// The deposit orders a window touched: changed since its start, or with a match changed
/// since.
const TOUCHED_DEPOSIT_ORDERS: &str = " JOIN ( \
        SELECT id FROM p2p_deposit_orders FORCE INDEX (index_p2p_deposit_orders_recent) \
              WHERE updated_at >= ? \
        UNION SELECT deposit_order_id FROM p2p_matches FORCE INDEX (index_p2p_matches_recent) \
              WHERE updated_at >= ?) touched \
     ON touched.id = d.id";

/// The matches a window touched: changed since its start, or settled by an entry written
/// since.
const TOUCHED_MATCHES: &str = " JOIN ( \
        SELECT id FROM p2p_matches FORCE INDEX (index_p2p_matches_recent) WHERE updated_at >= ? \
        UNION SELECT reference_id FROM ledger_entries FORCE INDEX (index_ledger_entries_recent) \
              WHERE created_at >= ? AND reference_type = 'P2P_SETTLEMENT') touched \
     ON touched.id = m.id";

/// The settlement entries a window touched: written since its start, or settling a match
/// changed since.
const TOUCHED_SETTLEMENT_ENTRIES: &str = " JOIN ( \
        SELECT id FROM ledger_entries FORCE INDEX (index_ledger_entries_recent) \
              WHERE created_at >= ? \
        UNION SELECT le.id FROM p2p_matches tm FORCE INDEX (index_p2p_matches_recent) \
              JOIN ledger_entries le \
                ON le.reference_type = 'P2P_SETTLEMENT' AND le.reference_id = tm.id \
              WHERE tm.updated_at >= ?) touched \
     ON touched.id = e.id";

/// Withdraw orders against their matches.
pub async fn seller_liquidity(conn: &mut MySqlConnection) -> Result<Vec<Violation>, sqlx::Error> {
    seller_liquidity_in(conn, Scope::All).await
}

/// [`seller_liquidity`] for the withdraw orders `window` touched.
pub async fn recent_seller_liquidity(
    conn: &mut MySqlConnection,
    window: Window,
) -> Result<Vec<Violation>, sqlx::Error> {
    seller_liquidity_in(conn, Scope::Recent(window)).await
}

async fn seller_liquidity_in(
    conn: &mut MySqlConnection,
    scope: Scope,
) -> Result<Vec<Violation>, sqlx::Error> {
    let rows: Vec<(u64, String, String, String, String, String)> = scope.fetch(
        conn,
        "SELECT id, CAST(amount AS CHAR), CAST(remaining_amount AS CHAR), \
                CAST(reserved_amount AS CHAR), CAST(confirmed AS CHAR), CAST(held AS CHAR) \
         FROM ( \
             SELECT w.id, w.amount, w.remaining_amount, w.reserved_amount, \
                    COALESCE(SUM(CASE WHEN m.status = 'CONFIRMED' THEN m.amount END), 0) AS confirmed, \
                    COALESCE(SUM(CASE WHEN m.status IN ('RESERVED', 'TRADING') \
                                      THEN m.amount END), 0) AS held \
             FROM p2p_withdraw_orders w {recent} \
             LEFT JOIN p2p_matches m ON m.withdraw_order_id = w.id \
             GROUP BY w.id, w.amount, w.remaining_amount, w.reserved_amount) seller \
         WHERE confirmed > amount OR confirmed + held > amount \
            OR remaining_amount <> amount - confirmed OR reserved_amount <> held \
         ORDER BY id",
        TOUCHED_WITHDRAW_ORDERS,
    )
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(withdraw_order_id, amount, remaining_amount, reserved_amount, confirmed, held)| {
                Violation::SellerLiquidity {
                    withdraw_order_id,
                    amount: exact(amount),
                    remaining_amount: exact(remaining_amount),
                    reserved_amount: exact(reserved_amount),
                    confirmed: exact(confirmed),
                    reserved_by_matches: exact(held),
                }
            },
        )
        .collect())
}

/// RESERVED matches older than the zombie timeout (`PAYBUS_MATCH_ZOMBIE_TIMEOUT_MS` as this
/// process reads it; the default when unset or malformed), or on a closed order.
pub async fn stale_reservations(conn: &mut MySqlConnection) -> Result<Vec<Violation>, sqlx::Error> {
    let timeout = MatchingConfig::from_env()
        .map(|config| config.zombie_timeout)
        .unwrap_or(crate::config::DEFAULT_ZOMBIE_TIMEOUT);
    let rows: Vec<(u64, u64, String, i64)> = sqlx::query_as(
        "SELECT m.id, m.deposit_order_id, d.status, \
                TIMESTAMPDIFF(SECOND, m.reserved_at, NOW(6)) \
         FROM p2p_matches m JOIN p2p_deposit_orders d ON d.id = m.deposit_order_id \
         WHERE m.status = 'RESERVED' \
           AND (m.reserved_at <= NOW(6) - INTERVAL ? MICROSECOND \
                OR d.status IN ('MATCHED', 'CANCELLED', 'EXPIRED')) \
         ORDER BY m.id",
    )
    .bind(paybus_retry::clock::micros(timeout))
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(match_id, deposit_order_id, order_status, seconds)| Violation::StaleReservation {
                match_id,
                deposit_order_id,
                order_status,
                reserved_for_secs: u64::try_from(seconds).unwrap_or(0),
            },
        )
        .collect())
}

/// How long after a dead-lettering decision its letter may still be on its way to
/// `dead_letters` (published by the runtime, drained by the recorder).
const DEAD_LETTER_GRACE: std::time::Duration = std::time::Duration::from_secs(5 * 60);

/// Fills in doubt (TRADING) and IN_DOUBT orders against where they must stand.
pub async fn trades_in_doubt(conn: &mut MySqlConnection) -> Result<Vec<Violation>, sqlx::Error> {
    let config = MatchingConfig::from_env().unwrap_or_default();
    // Every check's pause, then a dead attempt's claim timing out, then slack.
    let checks = config.trade_checks;
    let asking: std::time::Duration = (1..checks.max_attempts()).map(|n| checks.delay(n)).sum();
    let bound = asking + config.zombie_timeout + DEAD_LETTER_GRACE;
    let micros = paybus_retry::clock::micros;

    let closed: Vec<(u64, String, String)> = sqlx::query_as(
        "SELECT DISTINCT d.id, d.status, m.trade_key \
         FROM p2p_matches m JOIN p2p_deposit_orders d ON d.id = m.deposit_order_id \
         WHERE m.status = 'TRADING' AND d.status IN ('MATCHED', 'CANCELLED', 'EXPIRED') \
         ORDER BY d.id",
    )
    .fetch_all(&mut *conn)
    .await?;
    let mut violations: Vec<Violation> = closed
        .into_iter()
        .map(
            |(deposit_order_id, order_status, trade_key)| Violation::InDoubtOnClosedOrder {
                deposit_order_id,
                order_status,
                trade_key,
            },
        )
        .collect();

    // A letter's body is the `p2p.deposit_order.created` envelope naming the order (guarded:
    // a malformed letter's body is not JSON, and MySQL refuses JSON_EXTRACT on it).
    let unlettered: Vec<u64> = sqlx::query_scalar(
        "SELECT o.id FROM p2p_deposit_orders o \
         WHERE o.status = 'IN_DOUBT' AND o.updated_at < NOW(6) - INTERVAL ? MICROSECOND \
           AND NOT EXISTS ( \
               SELECT 1 FROM dead_letters l \
               WHERE l.function_name = ? \
                 AND CASE WHEN JSON_VALID(CAST(l.body AS CHAR CHARACTER SET utf8mb4)) \
                          THEN CAST(JSON_UNQUOTE(JSON_EXTRACT( \
                                   CAST(l.body AS CHAR CHARACTER SET utf8mb4), \
                                   '$.data.deposit_order_id')) AS UNSIGNED) END = o.id) \
         ORDER BY o.id",
    )
    .bind(micros(DEAD_LETTER_GRACE))
    .bind(crate::FUNCTION)
    .fetch_all(&mut *conn)
    .await?;
    violations.extend(
        unlettered
            .into_iter()
            .map(|deposit_order_id| Violation::InDoubtWithoutDeadLetter { deposit_order_id }),
    );

    let unattended: Vec<(u64, String, String, i64)> = sqlx::query_as(
        "SELECT d.id, d.status, m.trade_key, \
                MAX(TIMESTAMPDIFF(SECOND, m.trade_sent_at, NOW(6))) \
         FROM p2p_matches m JOIN p2p_deposit_orders d ON d.id = m.deposit_order_id \
         WHERE m.status = 'TRADING' AND m.trade_sent_at < NOW(6) - INTERVAL ? MICROSECOND \
           AND d.status IN ('PENDING', 'MATCHING') \
         GROUP BY d.id, d.status, m.trade_key ORDER BY d.id",
    )
    .bind(micros(bound))
    .fetch_all(conn)
    .await?;
    violations.extend(unattended.into_iter().map(
        |(deposit_order_id, order_status, trade_key, seconds)| Violation::InDoubtUnattended {
            deposit_order_id,
            order_status,
            trade_key,
            sent_for_secs: u64::try_from(seconds).unwrap_or(0),
        },
    ));
    Ok(violations)
}

/// Deposit orders against their CONFIRMED matches.
pub async fn deposit_fills(conn: &mut MySqlConnection) -> Result<Vec<Violation>, sqlx::Error> {
    deposit_fills_in(conn, Scope::All).await
}

/// [`deposit_fills`] for the deposit orders `window` touched.
pub async fn recent_deposit_fills(
    conn: &mut MySqlConnection,
    window: Window,
) -> Result<Vec<Violation>, sqlx::Error> {
    deposit_fills_in(conn, Scope::Recent(window)).await
}

async fn deposit_fills_in(
    conn: &mut MySqlConnection,
    scope: Scope,
) -> Result<Vec<Violation>, sqlx::Error> {
    let rows: Vec<(u64, String, String, String, String)> = scope.fetch(
        conn,
        "SELECT id, status, CAST(amount AS CHAR), CAST(remaining_amount AS CHAR), \
                CAST(confirmed AS CHAR) \
         FROM ( \
             SELECT d.id, d.status, d.amount, d.remaining_amount, \
                    COALESCE(SUM(CASE WHEN m.status = 'CONFIRMED' THEN m.amount END), 0) AS confirmed \
             FROM p2p_deposit_orders d {recent} \
             LEFT JOIN p2p_matches m ON m.deposit_order_id = d.id \
             GROUP BY d.id, d.status, d.amount, d.remaining_amount) buyer \
         WHERE confirmed <> amount - remaining_amount \
            OR (status = 'MATCHED' AND confirmed <> amount) \
         ORDER BY id",
        TOUCHED_DEPOSIT_ORDERS,
    )
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(deposit_order_id, status, amount, remaining_amount, confirmed)| {
                Violation::DepositFill {
                    deposit_order_id,
                    status,
                    amount: exact(amount),
                    remaining_amount: exact(remaining_amount),
                    confirmed: exact(confirmed),
                }
            },
        )
        .collect())
}

/// CONFIRMED matches against their `P2P_SETTLEMENT` ledger entries, both directions.
pub async fn settlement_legs(conn: &mut MySqlConnection) -> Result<Vec<Violation>, sqlx::Error> {
    settlement_legs_in(conn, Scope::All).await
}

/// [`settlement_legs`] for the matches and settlement entries `window` touched.
pub async fn recent_settlement_legs(
    conn: &mut MySqlConnection,
    window: Window,
) -> Result<Vec<Violation>, sqlx::Error> {
    settlement_legs_in(conn, Scope::Recent(window)).await
}

async fn settlement_legs_in(
    conn: &mut MySqlConnection,
    scope: Scope,
) -> Result<Vec<Violation>, sqlx::Error> {
    let rows: Vec<(u64, i64, i64, i64, i64, i64)> = scope.fetch(
        &mut *conn,
        "SELECT id, credits, debits, fees, entries, expected_fees FROM ( \
             SELECT m.id, \
                    CAST(COALESCE(SUM(e.entry_type = 'CREDIT' AND e.partner_id = d.partner_id \
                             AND e.currency = d.currency AND e.amount = m.amount), 0) AS SIGNED) AS credits, \
                    CAST(COALESCE(SUM(e.entry_type = 'DEBIT' AND e.partner_id = w.partner_id \
                             AND e.currency = w.currency AND e.amount = m.amount), 0) AS SIGNED) AS debits, \
                    CAST(COALESCE(SUM(e.entry_type = 'FEE' AND e.partner_id = d.partner_id \
                             AND e.currency = d.currency AND e.amount = m.fee), 0) AS SIGNED) AS fees, \
                    CAST(COUNT(e.id) AS SIGNED) AS entries, \
                    CAST(m.fee > 0 AS SIGNED) AS expected_fees \
             FROM p2p_matches m {recent} \
             JOIN p2p_deposit_orders d ON d.id = m.deposit_order_id \
             JOIN p2p_withdraw_orders w ON w.id = m.withdraw_order_id \
             LEFT JOIN ledger_entries e \
               ON e.reference_type = 'P2P_SETTLEMENT' AND e.reference_id = m.id \
             WHERE m.status = 'CONFIRMED' \
             GROUP BY m.id, m.fee) legs \
         WHERE credits <> 1 OR debits <> 1 OR fees <> expected_fees \
            OR entries <> 2 + expected_fees \
         ORDER BY id",
        TOUCHED_MATCHES,
    )
    .await?;
    let mut violations: Vec<Violation> = rows
        .into_iter()
        .map(
            |(match_id, credits, debits, fees, entries, expected_fees)| Violation::SettlementLegs {
                match_id,
                credits,
                debits,
                fees,
                entries,
                expected_fees,
            },
        )
        .collect();
    let rows: Vec<(u64, u64, Option<String>)> = scope
        .fetch(
            conn,
            "SELECT e.id, e.reference_id, m.status \
             FROM ledger_entries e {recent} LEFT JOIN p2p_matches m ON m.id = e.reference_id \
             WHERE e.reference_type = 'P2P_SETTLEMENT' \
               AND (m.id IS NULL OR m.status <> 'CONFIRMED') \
             ORDER BY e.id",
            TOUCHED_SETTLEMENT_ENTRIES,
        )
        .await?;
    violations.extend(rows.into_iter().map(|(entry_id, match_id, match_status)| {
        Violation::UnexpectedSettlementEntry {
            entry_id,
            match_id,
            match_status,
        }
    }));
    Ok(violations)
}
