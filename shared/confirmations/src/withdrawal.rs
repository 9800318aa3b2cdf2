//! The `withdrawals` row and its status history: states, kinds, and every statement W2 runs on
//! them (the migration's header comment says who moves a row in and out of each state); the
//! confirmation transition itself is [`confirmation`]'s.

use chrono::{DateTime, Utc};
use paybus_money::Amount;
use serde::Serialize;
use sqlx::{MySql, MySqlConnection, QueryBuilder};

use crate::{ConfirmError, CreateError, sql};

mod confirmation;
mod delivered;

pub use confirmation::{
    Confirmation, Confirmed, Confirming, WITHDRAWAL_CONFIRMED, confirm_all_if_in_flight,
    confirm_if_in_flight, validate_tx_hash,
};
pub use delivered::{confirm, confirm_all};

const ENTITY: &str = "withdrawal";

paybus_db::column_enum! {
    /// `withdrawals.status`. Only confirm-withdrawal moves BROADCASTING / PROCESSING / STALE to
    /// CONFIRMED; REQUESTED, PROCESSING, BROADCASTING and STALE are set by the signer (the admin
    /// API stands in for it).
    #[derive(Default)]
    pub enum WithdrawalStatus {
        #[default]
        Requested,
        Processing,
        Broadcasting,
        Stale,
        Confirmed,
        Failed,
    }
}

impl WithdrawalStatus {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// A withdrawal may be created in this state (CONFIRMED and FAILED are reached only
    /// through the workflow).
    pub fn is_initial(self) -> bool {
        !self.is_terminal()
    }

    /// Broadcast and waiting for the chain: the states a confirmation moves to CONFIRMED.
    pub fn is_in_flight(self) -> bool {
        matches!(
            self,
            WithdrawalStatus::Broadcasting | WithdrawalStatus::Processing | WithdrawalStatus::Stale
        )
    }

    /// No transition leaves it.
    pub fn is_terminal(self) -> bool {
        matches!(self, WithdrawalStatus::Confirmed | WithdrawalStatus::Failed)
    }
}

paybus_db::column_enum! {
    /// `withdrawals.kind`: only a NORMAL withdrawal's confirmation moves the partner's balance.
    #[derive(Default)]
    pub enum WithdrawalKind {
        /// The partner's own withdrawal: DEBIT once, keyed `WDR_CONFIRM:{id}`.
        #[default]
        Normal,
        /// A settlement payout: the balance moved at settlement, no entry here.
        SettlementWithdraw,
        /// Between our own wallets: no entry.
        SelfTransfer,
    }
}

impl WithdrawalKind {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// A withdrawal as stored; amounts read exactly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Withdrawal {
    pub id: u64,
    pub partner_id: u64,
    pub kind: WithdrawalKind,
    pub status: WithdrawalStatus,
    pub currency: String,
    pub amount: Amount,
    pub to_address: String,
    pub tx_hash: Option<String>,
    pub confirmed_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// One row of `withdrawal_status_history`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct HistoryEntry {
    pub from_status: Option<String>,
    pub to_status: String,
    pub reason: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// A withdrawal to create (what the signer would have written).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewWithdrawal {
    pub partner_id: u64,
    pub kind: WithdrawalKind,
    pub status: WithdrawalStatus,
    pub currency: String,
    pub amount: Amount,
    pub to_address: String,
    pub tx_hash: Option<String>,
}

/// Inserts the withdrawal and its first history row (from NULL, with `reason`), in the
/// caller's transaction.
pub async fn create(
    conn: &mut MySqlConnection,
    new: &NewWithdrawal,
    reason: &str,
) -> Result<u64, CreateError> {
    if !new.status.is_initial() {
        return Err(CreateError::NotInitial);
    }
    let id = sqlx::query(
        "INSERT INTO withdrawals (partner_id, kind, status, currency, amount, to_address, tx_hash) \
         VALUES (?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(new.partner_id)
    .bind(new.kind.as_str())
    .bind(new.status.as_str())
    .bind(&new.currency)
    .bind(new.amount)
    .bind(&new.to_address)
    .bind(&new.tx_hash)
    .execute(&mut *conn)
    .await
    .map_err(|e| CreateError::from_insert(e, new.partner_id))?
    .last_insert_id();
    record_history(conn, id, None, new.status, reason).await?;
    Ok(id)
}

/// One history row: [`record_history_all`] with one.
pub async fn record_history(
    conn: &mut MySqlConnection,
    withdrawal_id: u64,
    from: Option<WithdrawalStatus>,
    to: WithdrawalStatus,
    reason: &str,
) -> Result<(), sqlx::Error> {
    record_history_all(conn, &[(withdrawal_id, from, to, reason.to_owned())]).await
}

/// The one writer of `withdrawal_status_history`: every transition records its rows here, in
/// the transition's transaction, one statement for any number of them.
pub async fn record_history_all(
    conn: &mut MySqlConnection,
    rows: &[(u64, Option<WithdrawalStatus>, WithdrawalStatus, String)],
) -> Result<(), sqlx::Error> {
    if rows.is_empty() {
        return Ok(());
    }
    let mut query = QueryBuilder::<MySql>::new(
        "INSERT INTO withdrawal_status_history (withdrawal_id, from_status, to_status, reason) ",
    );
    query.push_values(rows, |mut row, (withdrawal_id, from, to, reason)| {
        row.push_bind(*withdrawal_id)
            .push_bind(from.map(WithdrawalStatus::as_str))
            .push_bind(to.as_str())
            .push_bind(reason);
    });
    query.build().execute(conn).await?;
    Ok(())
}

#[derive(sqlx::FromRow)]
struct WithdrawalRow {
    id: u64,
    partner_id: u64,
    kind: String,
    status: String,
    currency: String,
    amount: Amount,
    to_address: String,
    tx_hash: Option<String>,
    confirmed_at: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

/// The row query's head: every column of [`WithdrawalRow`].
macro_rules! select_withdrawals {
    () => {
        "SELECT id, partner_id, kind, status, currency, amount, to_address, tx_hash, \
                confirmed_at, created_at, updated_at \
         FROM withdrawals"
    };
}

impl WithdrawalRow {
    fn parse(self) -> Result<Withdrawal, ConfirmError> {
        Ok(Withdrawal {
            id: self.id,
            partner_id: self.partner_id,
            kind: parse_column(self.id, "kind", self.kind)?,
            status: parse_column(self.id, "status", self.status)?,
            amount: self.amount,
            currency: self.currency,
            to_address: self.to_address,
            tx_hash: self.tx_hash,
            confirmed_at: self.confirmed_at,
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }
}

/// The withdrawal, or `None`. Within a transaction that just changed it, it carries the
/// change (seed 001 §4-4 "전이 후 fresh").
pub async fn find(conn: &mut MySqlConnection, id: u64) -> Result<Option<Withdrawal>, ConfirmError> {
    let row: Option<WithdrawalRow> = sql::one(
        conn,
        concat!(select_withdrawals!(), " WHERE id = ?"),
        &[id],
        ENTITY,
    )
    .await?;
    row.map(WithdrawalRow::parse).transpose()
}

/// The partner's withdrawal, or `None` — also when it is another partner's (the partner API's
/// isolation is this WHERE, not a check after reading).
pub async fn find_for_partner(
    conn: &mut MySqlConnection,
    partner_id: u64,
    id: u64,
) -> Result<Option<Withdrawal>, ConfirmError> {
    let row: Option<WithdrawalRow> = sql::one(
        conn,
        concat!(select_withdrawals!(), " WHERE id = ? AND partner_id = ?"),
        &[id, partner_id],
        ENTITY,
    )
    .await?;
    row.map(WithdrawalRow::parse).transpose()
}

/// The withdrawals as last committed, locked until the caller's transaction ends: the read a
/// transition decides on. A plain SELECT would answer from the transaction's REPEATABLE READ
/// snapshot — the very lie of seed 001, where two confirmations both saw BROADCASTING. A
/// concurrent confirmation waits here, then reads CONFIRMED. The locks are taken in id order
/// (the global order of W2's locks, see [`confirm_all_if_in_flight`]), so two batches never
/// wait for each other's rows in a cycle; ids without a row are simply absent from the result.
pub async fn lock_all(
    conn: &mut MySqlConnection,
    ids: &[u64],
) -> Result<Vec<Withdrawal>, ConfirmError> {
    let rows: Vec<WithdrawalRow> = sql::of_ids(
        conn,
        concat!(select_withdrawals!(), " WHERE id IN "),
        ids,
        " ORDER BY id FOR UPDATE",
        ENTITY,
    )
    .await?;
    rows.into_iter().map(WithdrawalRow::parse).collect()
}

/// The withdrawal's history, oldest first.
pub async fn history(
    conn: &mut MySqlConnection,
    withdrawal_id: u64,
) -> Result<Vec<HistoryEntry>, sqlx::Error> {
    sqlx::query_as(
        "SELECT from_status, to_status, reason, created_at FROM withdrawal_status_history \
         WHERE withdrawal_id = ? ORDER BY id",
    )
    .bind(withdrawal_id)
    .fetch_all(conn)
    .await
}

/// The conditional transition (seed 001 §4-2) for any number of withdrawals in one statement,
/// each with its own tx hash; the number of rows it moved (the caller compares it with what
/// it expected: with the status in the WHERE clause, a matched row is a transition).
/// `confirmed_at` comes from the caller, so the notification carries the stored value without
/// reading the row back.
pub async fn mark_all_confirmed(
    conn: &mut MySqlConnection,
    confirmations: &[(u64, &str)],
    confirmed_at: DateTime<Utc>,
) -> Result<u64, ConfirmError> {
    if confirmations.is_empty() {
        return Ok(0);
    }
    let mut query = QueryBuilder::<MySql>::new(
        "UPDATE withdrawals SET status = 'CONFIRMED', tx_hash = CASE id",
    );
    for (id, tx_hash) in confirmations {
        query
            .push(" WHEN ")
            .push_bind(*id)
            .push(" THEN ")
            .push_bind(*tx_hash);
    }
    query
        .push(" END, confirmed_at = ")
        .push_bind(confirmed_at)
        .push(" WHERE status IN ('BROADCASTING', 'PROCESSING', 'STALE') AND id IN ");
    let ids = confirmations.iter().map(|(id, _)| *id);
    sql::update_ids(conn, query, ids, ENTITY).await
}

/// Where a withdrawal stands: its status and the tx hash recorded on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WithdrawalState {
    pub status: WithdrawalStatus,
    pub tx_hash: Option<String>,
}

/// The committed states, read outside any transaction in one statement: the cheap first look a
/// handler takes so that a duplicate of a finished confirmation costs one indexed read and no
/// transaction. Only a terminal state may be acted on from it (nothing leaves CONFIRMED or
/// FAILED); anything else is decided under [`lock_all`]. Ids without a row are absent.
pub async fn committed_states(
    conn: &mut MySqlConnection,
    ids: &[u64],
) -> Result<Vec<(u64, WithdrawalState)>, ConfirmError> {
    let rows: Vec<(u64, String, Option<String>)> = sql::of_ids(
        conn,
        "SELECT id, status, tx_hash FROM withdrawals WHERE id IN ",
        ids,
        "",
        ENTITY,
    )
    .await?;
    rows.into_iter()
        .map(|(id, status, tx_hash)| {
            Ok((
                id,
                WithdrawalState {
                    status: parse_column(id, "status", status)?,
                    tx_hash,
                },
            ))
        })
        .collect()
}

fn parse_column<T: std::str::FromStr>(
    id: u64,
    column: &'static str,
    value: String,
) -> Result<T, ConfirmError> {
    value.parse().map_err(|_| ConfirmError::UnknownValue {
        entity: ENTITY,
        id,
        column,
        value,
    })
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    #[test]
    fn statuses_and_kinds_are_their_column_values() {
        for status in [
            WithdrawalStatus::Requested,
            WithdrawalStatus::Processing,
            WithdrawalStatus::Broadcasting,
            WithdrawalStatus::Stale,
            WithdrawalStatus::Confirmed,
            WithdrawalStatus::Failed,
        ] {
            assert_eq!(WithdrawalStatus::from_str(status.as_str()), Ok(status));
        }
        assert_eq!(
            WithdrawalKind::SettlementWithdraw.as_str(),
            "SETTLEMENT_WITHDRAW"
        );
        assert_eq!(
            WithdrawalKind::from_str("SELF_TRANSFER"),
            Ok(WithdrawalKind::SelfTransfer)
        );
        assert!(WithdrawalStatus::from_str("confirmed").is_err());
        assert!(!WithdrawalStatus::Confirmed.is_initial());
        assert!(WithdrawalStatus::Stale.is_initial());
    }
}
