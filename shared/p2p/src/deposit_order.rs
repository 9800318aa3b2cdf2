//! `p2p_deposit_orders`: buyers' orders, their states and every statement that moves them; the
//! retry kit works them through [`DEPOSIT_ORDERS`], and [`close`] alone writes a terminal state.
//! ```text
//!                    claim (message, due-orders job, or inline at creation)
//!   PENDING ────────────────────────────────────────────────► MATCHING ──settle──► MATCHED
//!     ▲  ▲                                                      │  │ fill-or-cancel short ─► CANCELLED (NO_LIQUIDITY)
//!     │  └── accounting: not filled / error, below max ─────────┘  │ at max attempts ──────► CANCELLED (MATCH_FAILED) + dead letter
//!     └───── reaper: claim older than the zombie timeout ──────────┘
//!   PENDING / MATCHING (dead claim) ── past expires_at ──► EXPIRED
//!   MATCHING ── a fill's createTrade outcome unknown ──► PENDING (uncounted: asks again first)
//!            ── still unknown at PAYBUS_MATCH_TRADE_CHECKS ──► IN_DOUBT + dead letter
//!   IN_DOUBT ── `paybus p2p recheck` (ops) ──► PENDING
//! ```
//! The rule: an order with a TRADING fill is never closed (no expiry, no NO_LIQUIDITY, no
//! MATCH_FAILED) while a trade may exist for it at the quote service (principle 12).

use chrono::{DateTime, Utc};
use paybus_bus::UnitOfWork;
use paybus_db as db;
use paybus_money::Amount;
use paybus_ops::actor::Actor;
use paybus_ops::ops_log::{self, Entry};
use paybus_partners::NewNotification;
use paybus_retry::{AttemptCount, Claim, Clock, Lease, WorkTable, clock::micros};
use serde::Serialize;
use sqlx::{AssertSqlSafe, MySqlConnection};
use uuid::Uuid;

use crate::{
    CreateError, MatchError,
    inserted::Inserted,
    matches::{self, Held, MatchStatus, ReleaseReason},
    order_row, parse_column,
};

/// The unique key that makes a repeated create with the same partner reference a no-op.
const PARTNER_REF_KEY: &str = "uk_p2p_deposit_orders_partner_ref";
const IDEMPOTENCY_KEY: &str = "uk_p2p_deposit_orders_idempotency_key";
/// `partner_notifications.reference_type` of a deposit order's notifications.
pub const NOTIFICATION_REFERENCE: &str = "P2P_DEPOSIT_ORDER";

paybus_db::column_enum! {
    /// `p2p_deposit_orders.status`.
    pub enum DepositOrderStatus {
        /// Waiting for its (next) attempt.
        Pending,
        /// Claimed by an attempt (`claimed_at`).
        Matching,
        /// A fill's createTrade outcome stayed unknown after every check: parked for a human (a
        /// trade may exist at the quote service under the fill's key). Not terminal.
        InDoubt,
        /// Terminal: filled.
        Matched,
        /// Terminal: not filled (no liquidity, or given up).
        Cancelled,
        /// Terminal: its time ran out.
        Expired,
    }
}

impl DepositOrderStatus {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            DepositOrderStatus::Matched
                | DepositOrderStatus::Cancelled
                | DepositOrderStatus::Expired
        )
    }
}

paybus_db::column_enum! {
    /// Why an order was closed (`p2p_deposit_orders.close_reason`); each reason has its status.
    pub enum CloseReason {
        /// MATCHED: CONFIRMED matches cover the whole amount.
        Filled,
        /// CANCELLED by fill-or-cancel: the candidates could not fill it.
        NoLiquidity,
        /// CANCELLED by outcome accounting at the attempt limit (with a dead letter).
        MatchFailed,
        /// EXPIRED: past `expires_at`.
        Expired,
    }
}

impl CloseReason {
    pub fn status(self) -> DepositOrderStatus {
        match self {
            CloseReason::Filled => DepositOrderStatus::Matched,
            CloseReason::NoLiquidity | CloseReason::MatchFailed => DepositOrderStatus::Cancelled,
            CloseReason::Expired => DepositOrderStatus::Expired,
        }
    }

    /// The partner notification a close owes.
    pub fn event(self) -> &'static str {
        match self.status() {
            DepositOrderStatus::Matched => "P2P_DEPOSIT_MATCHED",
            DepositOrderStatus::Expired => "P2P_DEPOSIT_EXPIRED",
            _ => "P2P_DEPOSIT_CANCELLED",
        }
    }
}

/// The deposit orders as the retry kit works them: a status lease (MATCHING with
/// `claimed_at`), failures counted in `match_attempt_count`.
pub static DEPOSIT_ORDERS: WorkTable = WorkTable {
    table: "p2p_deposit_orders",
    status: "status",
    due: "PENDING",
    failed: "CANCELLED",
    attempts: "match_attempt_count",
    count: AttemptCount::OnFailure,
    next_attempt_at: "next_attempt_at",
    due_index: "index_p2p_deposit_orders_due",
    last_error: "last_error",
    // `last_error` is a VARCHAR(2000).
    last_error_max: 2000,
    lease: Lease::Status {
        status: "MATCHING",
        claimed_at: "claimed_at",
        claims_index: "index_p2p_deposit_orders_claims",
    },
    republished_at: None,
    held_for_a_human: Some("IN_DOUBT"),
};

/// A deposit order as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DepositOrder {
    pub id: u64,
    pub partner_id: u64,
    pub partner_order_ref: Option<String>,
    pub currency: String,
    pub amount: Amount,
    pub remaining_amount: Amount,
    pub fee_amount: Amount,
    pub status: DepositOrderStatus,
    pub claimed_at: Option<DateTime<Utc>>,
    pub match_attempt_count: u32,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    pub expires_at: DateTime<Utc>,
    pub closed_at: Option<DateTime<Utc>>,
    pub close_reason: Option<CloseReason>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[derive(sqlx::FromRow)]
struct Row {
    id: u64,
    partner_id: u64,
    partner_order_ref: Option<String>,
    currency: String,
    amount: Amount,
    remaining_amount: Amount,
    fee_amount: Amount,
    status: String,
    claimed_at: Option<DateTime<Utc>>,
    match_attempt_count: u32,
    next_attempt_at: Option<DateTime<Utc>>,
    last_error: Option<String>,
    expires_at: DateTime<Utc>,
    closed_at: Option<DateTime<Utc>>,
    close_reason: Option<String>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl Row {
    fn into_order(self) -> Result<DepositOrder, MatchError> {
        const ENTITY: &str = "deposit order";
        Ok(DepositOrder {
            status: parse_column(ENTITY, self.id, "status", self.status)?,
            close_reason: self
                .close_reason
                .map(|reason| parse_column(ENTITY, self.id, "close_reason", reason))
                .transpose()?,
            id: self.id,
            partner_id: self.partner_id,
            partner_order_ref: self.partner_order_ref,
            currency: self.currency,
            amount: self.amount,
            remaining_amount: self.remaining_amount,
            fee_amount: self.fee_amount,
            claimed_at: self.claimed_at,
            match_attempt_count: self.match_attempt_count,
            next_attempt_at: self.next_attempt_at,
            last_error: self.last_error,
            expires_at: self.expires_at,
            closed_at: self.closed_at,
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }
}

const COLUMNS: &str = "id, partner_id, partner_order_ref, currency, amount, remaining_amount, \
    fee_amount, status, claimed_at, match_attempt_count, next_attempt_at, last_error, \
    expires_at, closed_at, close_reason, created_at, updated_at";

/// The deposit order, or `None`. Inside a transaction that just changed it, it carries the
/// change.
pub async fn find(conn: &mut MySqlConnection, id: u64) -> Result<Option<DepositOrder>, MatchError> {
    let select = format!("SELECT {COLUMNS} FROM p2p_deposit_orders WHERE id = ?");
    order_row::select_one(conn, select, &[id], Row::into_order).await
}

/// The partner's deposit order, or `None` — also when it is another partner's (the partner
/// API's isolation is this WHERE, not a check after reading).
pub async fn find_for_partner(
    conn: &mut MySqlConnection,
    partner_id: u64,
    id: u64,
) -> Result<Option<DepositOrder>, MatchError> {
    let select =
        format!("SELECT {COLUMNS} FROM p2p_deposit_orders WHERE id = ? AND partner_id = ?");
    order_row::select_one(conn, select, &[id, partner_id], Row::into_order).await
}

/// The latest committed row, locked for the caller's transaction (a plain SELECT would answer
/// from the snapshot, the lie of seed 001).
pub async fn lock(conn: &mut MySqlConnection, id: u64) -> Result<Option<DepositOrder>, MatchError> {
    let select = format!("SELECT {COLUMNS} FROM p2p_deposit_orders WHERE id = ? FOR UPDATE");
    order_row::select_one(conn, select, &[id], Row::into_order).await
}

impl DepositOrder {
    /// Whether `claim` is the claim this order is held by now.
    pub fn is_held_by(&self, claim: &Claim) -> bool {
        self.status == DepositOrderStatus::Matching && self.claimed_at == claim.claimed_at
    }
}

/// Closes `order` EXPIRED if `now` (the kit's clock, which the caller read in one of its own
/// statements) is past its `expires_at`, in `uow`, which holds it under `claim`; true when it
/// did.
pub(crate) async fn close_if_expired(
    uow: &mut UnitOfWork<'_>,
    order: &DepositOrder,
    now: DateTime<Utc>,
    claim: &Claim,
    clock: &Clock,
    correlation_id: Uuid,
) -> Result<bool, MatchError> {
    if order.expires_at > now {
        return Ok(false);
    }
    close(
        uow,
        order.id,
        Closer::Claim(claim),
        Close::Expired,
        clock,
        correlation_id,
    )
    .await
}

/// A fill that leaves `remaining` of the order: its remaining amount and the fill's fee, in
/// the caller's transaction, which holds the order (a fill that leaves nothing is written by
/// the close, [`Close::Filled`]).
pub(crate) async fn record_fill(
    conn: &mut MySqlConnection,
    id: u64,
    remaining: Amount,
    fee: Amount,
) -> Result<(), MatchError> {
    sqlx::query(
        "UPDATE p2p_deposit_orders \
         SET remaining_amount = ?, fee_amount = fee_amount + ? WHERE id = ?",
    )
    .bind(remaining)
    .bind(fee)
    .bind(id)
    .execute(conn)
    .await?;
    Ok(())
}

/// MATCHING → IN_DOUBT under `claim`, with `error` as its `last_error` (asking about a fill in
/// doubt stopped), in the caller's transaction; false when the claim was taken over.
pub(crate) async fn hold_in_doubt(
    conn: &mut MySqlConnection,
    claim: &Claim,
    error: &str,
) -> Result<bool, MatchError> {
    let sql = DEPOSIT_ORDERS.guarded_update(
        "status = 'IN_DOUBT', claimed_at = NULL, next_attempt_at = NULL, last_error = ?",
    );
    let query = sqlx::query(AssertSqlSafe(sql)).bind(
        error
            .chars()
            .take(DEPOSIT_ORDERS.last_error_max)
            .collect::<String>(),
    );
    Ok(DEPOSIT_ORDERS
        .bind_guard(query, claim)
        .execute(conn)
        .await?
        .rows_affected()
        == 1)
}

/// Ops' answer to an IN_DOUBT order (`paybus p2p recheck`): PENDING and due now, its fill's
/// check count back to 0, so the next attempt asks the quote service again under the same
/// key. False when the order is not IN_DOUBT (nothing written). A recheck is logged
/// (`p2p_deposit_order.recheck`, by `actor`) in its transaction.
pub async fn recheck(pool: &sqlx::MySqlPool, id: u64, actor: &Actor) -> Result<bool, MatchError> {
    let mut tx = db::begin_read_committed(pool).await?;
    let moved = sqlx::query(
        "UPDATE p2p_deposit_orders SET status = 'PENDING', next_attempt_at = NULL \
         WHERE id = ? AND status = 'IN_DOUBT'",
    )
    .bind(id)
    .execute(&mut *tx)
    .await?
    .rows_affected()
        == 1;
    if moved {
        sqlx::query(
            "UPDATE p2p_matches SET trade_checks = 0 \
             WHERE deposit_order_id = ? AND status = 'TRADING'",
        )
        .bind(id)
        .execute(&mut *tx)
        .await?;
        ops_log::append(
            &mut tx,
            &Entry {
                actor,
                action: "p2p_deposit_order.recheck",
                subject: &format!("p2p_deposit_order:{id}"),
                detail: &serde_json::json!({ "from": "IN_DOUBT", "to": "PENDING" }),
            },
        )
        .await?;
    }
    tx.commit().await?;
    Ok(moved)
}

/// A buyer's order to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewDepositOrder {
    pub partner_id: u64,
    /// The partner's own id for it: a repeated create returns the order already created.
    pub partner_order_ref: Option<String>,
    /// The partner API's `Idempotency-Key` of the request that creates it: a create run again
    /// under the same key (its first process died after the commit) returns this order.
    pub idempotency_key: Option<String>,
    pub currency: String,
    pub amount: Amount,
}

/// How a new order starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// PENDING, due now: for the message or the due-orders job to claim.
    Pending,
    /// MATCHING, claimed by its creator at the kit's now (`claimed_at`): the inline path,
    /// which matches it in the request. Nobody ever sees it PENDING, so the due-orders job
    /// never races the request for it; [`claim_of_new`] gives the claim.
    Claimed,
}

/// Inserts an order (expiring `ttl` from the kit's now) as `start` says, in the caller's
/// transaction or on its own. A repeated partner reference is the expected outcome of a
/// retried request, not an error; a transaction stays usable.
pub async fn insert(
    conn: &mut MySqlConnection,
    new: &NewDepositOrder,
    ttl: std::time::Duration,
    clock: &Clock,
    start: Start,
) -> Result<Inserted, CreateError> {
    let sql = match start {
        Start::Pending => {
            "INSERT INTO p2p_deposit_orders \
             (partner_id, partner_order_ref, idempotency_key, currency, amount, \
              remaining_amount, expires_at) \
             VALUES (?, ?, ?, ?, ?, ?, COALESCE(?, NOW(6)) + INTERVAL ? MICROSECOND)"
        }
        Start::Claimed => {
            "INSERT INTO p2p_deposit_orders \
             (partner_id, partner_order_ref, idempotency_key, currency, amount, \
              remaining_amount, expires_at, status, claimed_at) \
             VALUES (?, ?, ?, ?, ?, ?, COALESCE(?, NOW(6)) + INTERVAL ? MICROSECOND, \
                     'MATCHING', COALESCE(?, NOW(6)))"
        }
    };
    let query = sqlx::query(sql)
        .bind(new.partner_id)
        .bind(&new.partner_order_ref)
        .bind(&new.idempotency_key)
        .bind(&new.currency)
        .bind(new.amount)
        .bind(new.amount)
        .bind(clock.sql_now())
        .bind(micros(ttl));
    let query = match start {
        Start::Pending => query,
        Start::Claimed => query.bind(clock.sql_now()),
    };
    let inserted = query.execute(&mut *conn).await;
    let (column, value) = match inserted {
        Ok(done) => return Ok(Inserted::New(done.last_insert_id())),
        Err(error) if db::is_duplicate_on(&error, PARTNER_REF_KEY) => {
            ("partner_order_ref", &new.partner_order_ref)
        }
        Err(error) if db::is_duplicate_on(&error, IDEMPOTENCY_KEY) => {
            ("idempotency_key", &new.idempotency_key)
        }
        Err(error) => return Err(CreateError::from_insert(error, new.partner_id)),
    };
    let existing: u64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT id FROM p2p_deposit_orders WHERE partner_id = ? AND {column} = ?"
    )))
    .bind(new.partner_id)
    .bind(value)
    .fetch_one(&mut *conn)
    .await?;
    tracing::info!(
        deposit_order_id = existing,
        partner_id = new.partner_id,
        by = column,
        "deposit order already created for this partner reference"
    );
    Ok(Inserted::Existing(existing))
}

/// PENDING → MATCHING if due, stamping `claimed_at` (the kit's conditional UPDATE), in the
/// caller's transaction (commit it before the attempt). `None`: not due, not PENDING, or no
/// such order.
pub async fn claim(
    conn: &mut MySqlConnection,
    id: u64,
    clock: &Clock,
) -> Result<Option<Claim>, MatchError> {
    // A status lease has no lease duration: the reaper times it out.
    Ok(DEPOSIT_ORDERS
        .claim(conn, id, std::time::Duration::ZERO, clock)
        .await?)
}

/// The claim an order inserted [`Start::Claimed`] is held by: its stamp, no attempt counted.
pub async fn claim_of_new(conn: &mut MySqlConnection, id: u64) -> Result<Claim, MatchError> {
    let claimed_at: Option<DateTime<Utc>> =
        sqlx::query_scalar("SELECT claimed_at FROM p2p_deposit_orders WHERE id = ?")
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?
            .flatten();
    let claimed_at = claimed_at
        .ok_or_else(|| MatchError::inconsistent(format!("new deposit order {id} has no claim")))?;
    Ok(Claim {
        id,
        attempts: 0,
        claimed_at: Some(claimed_at),
        failed_before: false,
    })
}

/// Who closes an order, and so the condition the close is guarded by.
#[derive(Debug, Clone, Copy)]
pub enum Closer<'a> {
    /// The attempt (or its accounting) holding this claim: only while the order is MATCHING
    /// with the claim's stamp.
    Claim(&'a Claim),
    /// A job that locked the open order itself (`FOR UPDATE`) and found it must close
    /// (expiry): while it is PENDING or MATCHING.
    Locked,
}

/// Why an order closes, with what that close writes on the row besides its terminal status.
#[derive(Debug, Clone, Copy)]
pub enum Close<'a> {
    /// MATCHED by the fill that leaves nothing: in the close's own statement the remaining
    /// amount goes to zero and the fill's fee is added (the caller holds the order and has
    /// checked that the fill covers what remained).
    Filled { last_fill_fee: Amount },
    /// CANCELLED by fill-or-cancel.
    NoLiquidity,
    /// CANCELLED at the attempt limit: the failed attempt counts and its error is the order's
    /// `last_error`.
    MatchFailed { error: &'a str },
    /// EXPIRED: past `expires_at`.
    Expired,
}

impl Close<'_> {
    pub fn reason(self) -> CloseReason {
        match self {
            Close::Filled { .. } => CloseReason::Filled,
            Close::NoLiquidity => CloseReason::NoLiquidity,
            Close::MatchFailed { .. } => CloseReason::MatchFailed,
            Close::Expired => CloseReason::Expired,
        }
    }
}

/// **The one way an order is closed**: the terminal status of `close`'s reason, `closed_at`
/// and `close_reason` (and what `close` also records), conditional on `closer`; then, only
/// when this call made the transition, its RESERVED matches released and the partner's
/// notification (and message) written, all in `uow`'s transaction (principle 8: the webhook
/// goes out after commit). False when the condition did not hold: nothing was written.
pub async fn close(
    uow: &mut UnitOfWork<'_>,
    id: u64,
    closer: Closer<'_>,
    close: Close<'_>,
    clock: &Clock,
    correlation_id: Uuid,
) -> Result<bool, MatchError> {
    let reason = close.reason();
    let status: &str = reason.status().into();
    let reason_text: &str = reason.into();
    let mut set = format!(
        "status = '{status}', close_reason = '{reason_text}', closed_at = COALESCE(?, NOW(6)), \
         next_attempt_at = NULL"
    );
    match close {
        Close::Filled { .. } => set.push_str(", remaining_amount = 0, fee_amount = fee_amount + ?"),
        Close::MatchFailed { .. } => {
            set.push_str(", match_attempt_count = match_attempt_count + 1, last_error = ?")
        }
        Close::NoLiquidity | Close::Expired => {}
    }
    let sql = match closer {
        Closer::Claim(_) => DEPOSIT_ORDERS.guarded_update(&set),
        Closer::Locked => format!(
            "UPDATE p2p_deposit_orders SET {set} WHERE id = ? AND status IN ('PENDING', 'MATCHING')"
        ),
    };
    let mut query = sqlx::query(AssertSqlSafe(sql)).bind(clock.sql_now());
    match close {
        Close::Filled { last_fill_fee } => query = query.bind(last_fill_fee),
        Close::MatchFailed { error } => {
            query = query.bind(
                error
                    .chars()
                    .take(DEPOSIT_ORDERS.last_error_max)
                    .collect::<String>(),
            )
        }
        Close::NoLiquidity | Close::Expired => {}
    }
    let query = match closer {
        Closer::Claim(claim) => DEPOSIT_ORDERS.bind_guard(query, claim),
        Closer::Locked => query.bind(id),
    };
    if query.execute(&mut **uow).await?.rows_affected() != 1 {
        return Ok(false);
    }
    let closed = read_closed(uow, id).await?;
    // A plain read is enough to know whether anything is still held: a match is RESERVED only
    // by its INSERT, under the order's lock, which this transaction holds; the release locks
    // what it moves.
    if closed.iter().any(|row| row.match_is(MatchStatus::Reserved)) {
        matches::release(uow, Held::OfOrders(&[id]), ReleaseReason::OrderClosed).await?;
    }
    notify(uow, id, closed, reason, correlation_id).await?;
    tracing::info!(deposit_order_id = id, %status, reason = reason_text, "deposit order closed");
    Ok(true)
}

/// One row of [`read_closed`]: the order as the close left it, with one of its CONFIRMED or
/// RESERVED matches (or none).
#[derive(sqlx::FromRow)]
struct ClosedRow {
    #[sqlx(flatten)]
    order: Row,
    match_status: Option<String>,
    match_id: Option<u64>,
    match_withdraw_order_id: Option<u64>,
    match_amount: Option<Amount>,
    match_fee: Option<Amount>,
    match_rate: Option<Amount>,
    match_trade_id: Option<String>,
}

impl ClosedRow {
    fn match_is(&self, status: MatchStatus) -> bool {
        self.match_status.as_deref() == Some(<&str>::from(status))
    }
}

/// The closed order and its CONFIRMED and RESERVED matches, in one read (the order's columns
/// repeat on each match's row).
async fn read_closed(uow: &mut UnitOfWork<'_>, id: u64) -> Result<Vec<ClosedRow>, MatchError> {
    let (confirmed, reserved): (&str, &str) =
        (MatchStatus::Confirmed.into(), MatchStatus::Reserved.into());
    Ok(sqlx::query_as(AssertSqlSafe(format!(
        "SELECT o.*, m.* FROM (SELECT {COLUMNS} FROM p2p_deposit_orders WHERE id = ?) o \
         LEFT JOIN ( \
             SELECT status AS match_status, id AS match_id, \
                    withdraw_order_id AS match_withdraw_order_id, amount AS match_amount, \
                    fee AS match_fee, rate AS match_rate, external_trade_id AS match_trade_id \
             FROM p2p_matches \
             WHERE deposit_order_id = ? AND status IN ('{confirmed}', '{reserved}') \
         ) m ON TRUE \
         ORDER BY m.match_id"
    )))
    .bind(id)
    .bind(id)
    .fetch_all(&mut **uow)
    .await?)
}

/// The partner's notification of a close, frozen now, with its message: the order as
/// [`read_closed`] found it and its CONFIRMED matches.
async fn notify(
    uow: &mut UnitOfWork<'_>,
    id: u64,
    rows: Vec<ClosedRow>,
    reason: CloseReason,
    correlation_id: Uuid,
) -> Result<(), MatchError> {
    let confirmed: Vec<serde_json::Value> = rows
        .iter()
        .filter(|row| row.match_is(MatchStatus::Confirmed))
        .filter_map(|row| {
            Some(serde_json::json!({
                "match_id": row.match_id?,
                "withdraw_order_id": row.match_withdraw_order_id,
                "amount": row.match_amount,
                "fee": row.match_fee,
                "rate": row.match_rate,
                "trade_id": row.match_trade_id,
            }))
        })
        .collect();
    let Some(row) = rows.into_iter().next() else {
        return Err(MatchError::inconsistent(format!(
            "deposit order {id} vanished while closing"
        )));
    };
    let order = row.order.into_order()?;
    let filled = order
        .amount
        .checked_sub(order.remaining_amount)
        .unwrap_or(Amount::ZERO);
    let payload = serde_json::json!({
        "event": reason.event(),
        "deposit_order_id": order.id,
        "partner_id": order.partner_id,
        "partner_order_ref": order.partner_order_ref,
        "status": order.status,
        "close_reason": reason,
        "currency": order.currency,
        "amount": order.amount,
        "filled_amount": filled,
        "fee_amount": order.fee_amount,
        "closed_at": order
            .closed_at
            .map(|at| at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)),
        "matches": confirmed,
    });
    paybus_partners::notifications::enqueue(
        uow,
        &NewNotification {
            partner_id: order.partner_id,
            event: reason.event(),
            reference_type: NOTIFICATION_REFERENCE,
            reference_id: id,
            payload: &payload,
        },
        correlation_id,
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    #[test]
    fn statuses_and_reasons_are_their_column_values() {
        assert_eq!(DepositOrderStatus::Matching.to_string(), "MATCHING");
        assert_eq!(
            DepositOrderStatus::from_str("EXPIRED"),
            Ok(DepositOrderStatus::Expired)
        );
        assert_eq!(CloseReason::MatchFailed.to_string(), "MATCH_FAILED");
        assert_eq!(
            CloseReason::from_str("NO_LIQUIDITY"),
            Ok(CloseReason::NoLiquidity)
        );
    }

    #[test]
    fn each_reason_closes_into_its_terminal_status() {
        for (reason, status, event) in [
            (
                CloseReason::Filled,
                DepositOrderStatus::Matched,
                "P2P_DEPOSIT_MATCHED",
            ),
            (
                CloseReason::NoLiquidity,
                DepositOrderStatus::Cancelled,
                "P2P_DEPOSIT_CANCELLED",
            ),
            (
                CloseReason::MatchFailed,
                DepositOrderStatus::Cancelled,
                "P2P_DEPOSIT_CANCELLED",
            ),
            (
                CloseReason::Expired,
                DepositOrderStatus::Expired,
                "P2P_DEPOSIT_EXPIRED",
            ),
        ] {
            assert_eq!(reason.status(), status);
            assert!(status.is_terminal());
            assert_eq!(reason.event(), event);
        }
        assert!(!DepositOrderStatus::Pending.is_terminal());
        assert!(!DepositOrderStatus::Matching.is_terminal());
        assert!(!DepositOrderStatus::InDoubt.is_terminal());
        assert_eq!(DepositOrderStatus::InDoubt.to_string(), "IN_DOUBT");
    }

    #[test]
    fn the_work_table_is_a_status_lease_counting_failures() {
        assert_eq!(
            DEPOSIT_ORDERS.lease,
            Lease::Status {
                status: "MATCHING",
                claimed_at: "claimed_at",
                claims_index: "index_p2p_deposit_orders_claims",
            }
        );
        assert_eq!(DEPOSIT_ORDERS.count, AttemptCount::OnFailure);
    }
}
