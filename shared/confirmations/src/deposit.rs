//! The `deposits` row: states and every statement W2 runs on it (the migration's header
//! comment says who moves a row in and out of each state); the confirmation transition itself
//! is [`confirmation`]'s.

use chrono::{DateTime, Utc};
use paybus_money::Amount;
use serde::Serialize;
use sqlx::{MySql, MySqlConnection, QueryBuilder};

use crate::{ConfirmError, CreateError, sql};

mod confirmation;
mod delivered;

pub use confirmation::{
    Confirmation, Confirmed, Confirming, DEPOSIT_CONFIRMED, confirm_all_if_detected,
    confirm_if_detected,
};
pub use delivered::{confirm, confirm_all};

const ENTITY: &str = "deposit";

paybus_db::column_enum! {
    /// `deposits.status`. The chain monitor's detection inserts DETECTED (the admin API stands in
    /// for it); only confirm-deposit moves DETECTED to CONFIRMED.
    pub enum DepositStatus {
        Detected,
        Confirmed,
        Failed,
    }
}

impl DepositStatus {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// No transition leaves it.
    pub fn is_terminal(self) -> bool {
        matches!(self, DepositStatus::Confirmed | DepositStatus::Failed)
    }
}

/// A deposit as stored; amounts read exactly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Deposit {
    pub id: u64,
    pub partner_id: u64,
    pub currency: String,
    pub amount: Amount,
    pub fee: Amount,
    pub tx_hash: String,
    pub to_address: String,
    pub status: DepositStatus,
    pub confirmed_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A detected deposit to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewDeposit {
    pub partner_id: u64,
    pub currency: String,
    pub amount: Amount,
    pub fee: Amount,
    pub tx_hash: String,
    pub to_address: String,
}

/// Inserts a DETECTED deposit. A second active deposit for the same (tx_hash, to_address) is
/// refused by its unique key (seed 001 §6, v2.21).
pub async fn create(conn: &mut MySqlConnection, new: &NewDeposit) -> Result<u64, CreateError> {
    let inserted = sqlx::query(
        "INSERT INTO deposits (partner_id, currency, amount, fee, tx_hash, to_address) \
         VALUES (?, ?, ?, ?, ?, ?)",
    )
    .bind(new.partner_id)
    .bind(&new.currency)
    .bind(new.amount)
    .bind(new.fee)
    .bind(&new.tx_hash)
    .bind(&new.to_address)
    .execute(&mut *conn)
    .await;
    match inserted {
        Ok(done) => Ok(done.last_insert_id()),
        Err(e) if paybus_db::is_duplicate_on(&e, "uk_deposit_tx_to_active") => {
            let existing: Option<u64> = sqlx::query_scalar(
                "SELECT id FROM deposits WHERE active_tx_key = CONCAT(?, '|', ?)",
            )
            .bind(&new.tx_hash)
            .bind(&new.to_address)
            .fetch_optional(conn)
            .await?;
            Err(CreateError::DuplicateActive { existing })
        }
        Err(e) => Err(CreateError::from_insert(e, new.partner_id)),
    }
}

#[derive(sqlx::FromRow)]
struct DepositRow {
    id: u64,
    partner_id: u64,
    currency: String,
    amount: Amount,
    fee: Amount,
    tx_hash: String,
    to_address: String,
    status: String,
    confirmed_at: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

/// The row query's head: every column of [`DepositRow`].
macro_rules! select_deposits {
    () => {
        "SELECT id, partner_id, currency, amount, fee, tx_hash, to_address, status, \
                confirmed_at, created_at, updated_at \
         FROM deposits"
    };
}

impl DepositRow {
    fn parse(self) -> Result<Deposit, ConfirmError> {
        Ok(Deposit {
            id: self.id,
            partner_id: self.partner_id,
            amount: self.amount,
            fee: self.fee,
            status: parse_status(self.id, self.status)?,
            currency: self.currency,
            tx_hash: self.tx_hash,
            to_address: self.to_address,
            confirmed_at: self.confirmed_at,
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }
}

/// The deposit, or `None`. Within a transaction that just changed it, it carries the change.
pub async fn find(conn: &mut MySqlConnection, id: u64) -> Result<Option<Deposit>, ConfirmError> {
    let row: Option<DepositRow> = sql::one(
        conn,
        concat!(select_deposits!(), " WHERE id = ?"),
        &[id],
        ENTITY,
    )
    .await?;
    row.map(DepositRow::parse).transpose()
}

/// The partner's deposit, or `None` — also when it is another partner's (the partner API's
/// isolation is this WHERE, not a check after reading).
pub async fn find_for_partner(
    conn: &mut MySqlConnection,
    partner_id: u64,
    id: u64,
) -> Result<Option<Deposit>, ConfirmError> {
    let row: Option<DepositRow> = sql::one(
        conn,
        concat!(select_deposits!(), " WHERE id = ? AND partner_id = ?"),
        &[id, partner_id],
        ENTITY,
    )
    .await?;
    row.map(DepositRow::parse).transpose()
}

/// The deposits as last committed, locked until the caller's transaction ends: the read a
/// transition decides on (a plain SELECT would answer from the transaction's REPEATABLE READ
/// snapshot). The locks are taken in id order, the global order of W2's row locks (see
/// [`confirm_all_if_detected`]), so two batches never wait for each other's rows in a cycle;
/// ids without a row are simply absent from the result.
pub async fn lock_all(
    conn: &mut MySqlConnection,
    ids: &[u64],
) -> Result<Vec<Deposit>, ConfirmError> {
    let rows: Vec<DepositRow> = sql::of_ids(
        conn,
        concat!(select_deposits!(), " WHERE id IN "),
        ids,
        " ORDER BY id FOR UPDATE",
        ENTITY,
    )
    .await?;
    rows.into_iter().map(DepositRow::parse).collect()
}

/// The conditional transition (seed 001 §4-6) for any number of deposits in one statement:
/// the number of rows it moved (the caller compares it with what it expected: with the status
/// in the WHERE clause, a matched row is a transition). `confirmed_at` comes from the caller,
/// so the notifications carry the stored value without reading the rows back.
pub async fn mark_all_confirmed(
    conn: &mut MySqlConnection,
    ids: &[u64],
    confirmed_at: DateTime<Utc>,
) -> Result<u64, ConfirmError> {
    if ids.is_empty() {
        return Ok(0);
    }
    let mut query =
        QueryBuilder::<MySql>::new("UPDATE deposits SET status = 'CONFIRMED', confirmed_at = ");
    query
        .push_bind(confirmed_at)
        .push(" WHERE status = 'DETECTED' AND id IN ");
    sql::update_ids(conn, query, ids.iter().copied(), ENTITY).await
}

/// The committed statuses, read outside any transaction in one statement: a handler's cheap
/// first look, so a duplicate of a finished confirmation costs one indexed read and no
/// transaction. Only a terminal status (CONFIRMED, FAILED: nothing leaves them) may be acted
/// on from it; anything else is decided under [`lock_all`]. Ids without a row are absent.
pub async fn committed_statuses(
    conn: &mut MySqlConnection,
    ids: &[u64],
) -> Result<Vec<(u64, DepositStatus)>, ConfirmError> {
    let rows: Vec<(u64, String)> = sql::of_ids(
        conn,
        "SELECT id, status FROM deposits WHERE id IN ",
        ids,
        "",
        ENTITY,
    )
    .await?;
    rows.into_iter()
        .map(|(id, status)| Ok((id, parse_status(id, status)?)))
        .collect()
}

fn parse_status(id: u64, value: String) -> Result<DepositStatus, ConfirmError> {
    value.parse().map_err(|_| ConfirmError::UnknownValue {
        entity: ENTITY,
        id,
        column: "status",
        value,
    })
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    #[test]
    fn statuses_are_their_column_values() {
        for status in [
            DepositStatus::Detected,
            DepositStatus::Confirmed,
            DepositStatus::Failed,
        ] {
            assert_eq!(DepositStatus::from_str(status.as_str()), Ok(status));
        }
        assert!(DepositStatus::from_str("detected").is_err());
    }
}
