//! `p2p_withdraw_orders`: sellers' liquidity (the migration's header comment says who moves a
//! row in and out of each state and what the three amounts mean).

use chrono::{DateTime, Utc};
use paybus_money::Amount;
use serde::Serialize;
use sqlx::{MySql, MySqlConnection, mysql::MySqlArguments, query::Query};

use paybus_db as db;

use crate::{CreateError, MatchError, inserted::Inserted, order_row, parse_column};

paybus_db::column_enum! {
    /// `p2p_withdraw_orders.status`.
    pub enum WithdrawOrderStatus {
        /// Liquidity left (`remaining_amount > 0`), some of it possibly reserved.
        Open,
        /// Terminal: every unit used by CONFIRMED matches.
        Filled,
    }
}

/// A withdraw order as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WithdrawOrder {
    pub id: u64,
    pub partner_id: u64,
    pub currency: String,
    pub amount: Amount,
    pub remaining_amount: Amount,
    pub reserved_amount: Amount,
    pub status: WithdrawOrderStatus,
    pub filled_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A seller's offer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewWithdrawOrder {
    pub partner_id: u64,
    pub currency: String,
    pub amount: Amount,
    /// The partner API's `Idempotency-Key` of the request that creates it: a create run again
    /// under the same key (its first process died after the commit) returns this order.
    pub idempotency_key: Option<String>,
}

const IDEMPOTENCY_KEY: &str = "uk_p2p_withdraw_orders_idempotency_key";

/// Inserts an OPEN withdraw order (all of it remaining, none reserved), in the caller's
/// transaction: `New(id)`, or `Existing(id)` when one was created under the same idempotency
/// key.
pub async fn create(
    conn: &mut MySqlConnection,
    new: &NewWithdrawOrder,
) -> Result<Inserted, CreateError> {
    let inserted = sqlx::query(
        "INSERT INTO p2p_withdraw_orders \
         (partner_id, currency, amount, remaining_amount, idempotency_key) \
         VALUES (?, ?, ?, ?, ?)",
    )
    .bind(new.partner_id)
    .bind(&new.currency)
    .bind(new.amount)
    .bind(new.amount)
    .bind(&new.idempotency_key)
    .execute(&mut *conn)
    .await;
    match inserted {
        Ok(done) => Ok(Inserted::New(done.last_insert_id())),
        Err(error) if db::is_duplicate_on(&error, IDEMPOTENCY_KEY) => {
            let existing: u64 = sqlx::query_scalar(
                "SELECT id FROM p2p_withdraw_orders WHERE partner_id = ? AND idempotency_key = ?",
            )
            .bind(new.partner_id)
            .bind(&new.idempotency_key)
            .fetch_one(&mut *conn)
            .await?;
            Ok(Inserted::Existing(existing))
        }
        Err(error) => Err(CreateError::from_insert(error, new.partner_id)),
    }
}

#[derive(sqlx::FromRow)]
struct Row {
    id: u64,
    partner_id: u64,
    currency: String,
    amount: Amount,
    remaining_amount: Amount,
    reserved_amount: Amount,
    status: String,
    filled_at: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

/// The withdraw order, or `None`.
pub async fn find(
    conn: &mut MySqlConnection,
    id: u64,
) -> Result<Option<WithdrawOrder>, MatchError> {
    let select = format!("SELECT {COLUMNS} FROM p2p_withdraw_orders WHERE id = ?");
    order_row::select_one(conn, select, &[id], Row::into_order).await
}

/// The partner's withdraw order, or `None` — also when it is another partner's (the partner
/// API's isolation is this WHERE, not a check after reading).
pub async fn find_for_partner(
    conn: &mut MySqlConnection,
    partner_id: u64,
    id: u64,
) -> Result<Option<WithdrawOrder>, MatchError> {
    let select =
        format!("SELECT {COLUMNS} FROM p2p_withdraw_orders WHERE id = ? AND partner_id = ?");
    order_row::select_one(conn, select, &[id, partner_id], Row::into_order).await
}

const COLUMNS: &str = "id, partner_id, currency, amount, remaining_amount, reserved_amount, \
    status, filled_at, created_at, updated_at";

impl Row {
    fn into_order(self) -> Result<WithdrawOrder, MatchError> {
        Ok(WithdrawOrder {
            status: parse_column("withdraw order", self.id, "status", self.status)?,
            id: self.id,
            partner_id: self.partner_id,
            currency: self.currency,
            amount: self.amount,
            remaining_amount: self.remaining_amount,
            reserved_amount: self.reserved_amount,
            filled_at: self.filled_at,
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }
}

/// Locks withdraw orders in id order, in the caller's transaction, before their matches are
/// updated. Changing a match's status rewrites its entry in the index behind its foreign key,
/// and InnoDB then re-checks the parent with a shared lock: two transactions holding that
/// shared lock on one seller and both wanting to write it deadlock (seen with 32 concurrent
/// settlements on the same oldest sellers). Taking the exclusive lock first, always in id
/// order, leaves nothing to upgrade and no circle to wait in.
pub(crate) async fn lock_in_order(
    conn: &mut MySqlConnection,
    ids: &[u64],
) -> Result<(), MatchError> {
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    for id in ids {
        sqlx::query("SELECT id FROM p2p_withdraw_orders WHERE id = ? FOR UPDATE")
            .bind(id)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// Gives `amount` of a reservation back (RESERVED → RELEASED), in the caller's transaction.
pub(crate) async fn unreserve(
    conn: &mut MySqlConnection,
    id: u64,
    amount: Amount,
) -> Result<(), MatchError> {
    let update = sqlx::query(
        "UPDATE p2p_withdraw_orders SET reserved_amount = reserved_amount - ? \
         WHERE id = ? AND reserved_amount >= ?",
    )
    .bind(amount)
    .bind(id)
    .bind(amount);
    guarded(conn, update, || {
        format!("withdraw order {id} holds less than the {amount} reserved on it")
    })
    .await
}

/// Holds `amount` more for a match, if that much is still available; in the caller's
/// transaction, which locked the row.
pub(crate) async fn reserve(
    conn: &mut MySqlConnection,
    id: u64,
    amount: Amount,
) -> Result<(), MatchError> {
    let update = sqlx::query(
        "UPDATE p2p_withdraw_orders SET reserved_amount = reserved_amount + ? \
         WHERE id = ? AND status = 'OPEN' AND remaining_amount - reserved_amount >= ?",
    )
    .bind(amount)
    .bind(id)
    .bind(amount);
    guarded(conn, update, || {
        format!("withdraw order {id} no longer has {amount} available under our lock")
    })
    .await
}

/// Uses `amount` of the reservation for good (a CONFIRMED match): remaining and reserved both
/// drop; FILLED when nothing remains. In the caller's transaction.
pub(crate) async fn use_reserved(
    conn: &mut MySqlConnection,
    id: u64,
    amount: Amount,
) -> Result<(), MatchError> {
    // `status` and `filled_at` are assigned first: they read the remaining amount before this
    // statement lowers it, whichever assignment order the server applies.
    let update = sqlx::query(
        "UPDATE p2p_withdraw_orders \
         SET status = IF(remaining_amount = ?, 'FILLED', status), \
             filled_at = IF(remaining_amount = ?, NOW(6), filled_at), \
             remaining_amount = remaining_amount - ?, \
             reserved_amount = reserved_amount - ? \
         WHERE id = ? AND status = 'OPEN' AND reserved_amount >= ? AND remaining_amount >= ?",
    )
    .bind(amount)
    .bind(amount)
    .bind(amount)
    .bind(amount)
    .bind(id)
    .bind(amount)
    .bind(amount);
    guarded(conn, update, || {
        format!(
            "withdraw order {id} does not hold the {amount} reserved for a match being confirmed"
        )
    })
    .await
}

/// Runs one of the guarded UPDATEs of a withdraw order, which must move its row: the guard
/// failing under the caller's lock means the books disagree (`disagreement` says how).
async fn guarded(
    conn: &mut MySqlConnection,
    update: Query<'_, MySql, MySqlArguments>,
    disagreement: impl FnOnce() -> String,
) -> Result<(), MatchError> {
    if update.execute(conn).await?.rows_affected() != 1 {
        return Err(MatchError::inconsistent(disagreement()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    #[test]
    fn statuses_are_their_column_values() {
        assert_eq!(WithdrawOrderStatus::Open.to_string(), "OPEN");
        assert_eq!(
            WithdrawOrderStatus::from_str("FILLED"),
            Ok(WithdrawOrderStatus::Filled)
        );
        assert!(WithdrawOrderStatus::from_str("open").is_err());
    }
}
