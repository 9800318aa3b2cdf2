//! The `deposits` row: states and every statement W2 runs on it (the migration's header
//! comment says who moves a row in and out of each state).

use chrono::{DateTime, Utc};
use paybus_money::Amount;
use serde::{Deserialize, Serialize};
use sqlx::MySqlConnection;

use crate::{ConfirmError, CreateError};

const ENTITY: &str = "deposit";

/// `deposits.status`. The chain monitor's detection inserts DETECTED (the admin API stands in
/// for it); only confirm-deposit moves DETECTED to CONFIRMED.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    strum::Display,
    strum::EnumString,
    strum::IntoStaticStr,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[strum(serialize_all = "SCREAMING_SNAKE_CASE")]
pub enum DepositStatus {
    Detected,
    Confirmed,
    Failed,
}

impl DepositStatus {
    pub fn as_str(self) -> &'static str {
        self.into()
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
        Err(e) if paybus_platform::db::is_duplicate_on(&e, "uk_deposit_tx_to_active") => {
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

/// The deposit, or `None`. Within a transaction that just changed it, it carries the change.
pub async fn find(conn: &mut MySqlConnection, id: u64) -> Result<Option<Deposit>, ConfirmError> {
    let row: Option<DepositRow> = sqlx::query_as(
        "SELECT id, partner_id, currency, amount, fee, tx_hash, to_address, status, \
                confirmed_at, created_at, updated_at \
         FROM deposits WHERE id = ?",
    )
    .bind(id)
    .fetch_optional(conn)
    .await
    .map_err(ConfirmError::database(ENTITY))?;
    row.map(|row| {
        Ok(Deposit {
            id: row.id,
            partner_id: row.partner_id,
            amount: row.amount,
            fee: row.fee,
            status: parse_status(row.id, row.status)?,
            currency: row.currency,
            tx_hash: row.tx_hash,
            to_address: row.to_address,
            confirmed_at: row.confirmed_at,
            created_at: row.created_at,
            updated_at: row.updated_at,
        })
    })
    .transpose()
}

/// The conditional transition (seed 001 §4-6): true when this call made it.
pub async fn mark_confirmed(conn: &mut MySqlConnection, id: u64) -> Result<bool, ConfirmError> {
    let matched = sqlx::query(
        "UPDATE deposits SET status = 'CONFIRMED', confirmed_at = NOW(6) \
         WHERE id = ? AND status = 'DETECTED'",
    )
    .bind(id)
    .execute(conn)
    .await
    .map_err(ConfirmError::database(ENTITY))?
    .rows_affected();
    // sqlx counts matched rows (CLIENT_FOUND_ROWS); with the status in the WHERE clause a
    // match is a transition.
    Ok(matched == 1)
}

/// The latest committed status after an UPDATE that matched nothing: a locking read, because
/// a plain SELECT would answer from this transaction's snapshot.
pub async fn locked_status(
    conn: &mut MySqlConnection,
    id: u64,
) -> Result<Option<DepositStatus>, ConfirmError> {
    let status: Option<String> =
        sqlx::query_scalar("SELECT status FROM deposits WHERE id = ? FOR UPDATE")
            .bind(id)
            .fetch_optional(conn)
            .await
            .map_err(ConfirmError::database(ENTITY))?;
    status.map(|status| parse_status(id, status)).transpose()
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
