//! The confirmation transition itself (seed 001 §4-2, §4-4, §4-5), in the caller's transaction.

use std::fmt;

use chrono::{DateTime, SecondsFormat, Utc};
use paybus_platform::{
    bus::{HandlerError, UnitOfWork, outbox::OutboxError},
    ledger::{self, EntryType, IdemKey, LedgerError, Posted, Posting, ReferenceType},
    notifications::{self, NewNotification},
};
use rust_decimal::Decimal;
use sqlx::MySqlConnection;
use uuid::Uuid;

/// The partner notification a confirmation owes (`partner_notifications.event`).
pub const WITHDRAWAL_CONFIRMED: &str = "WITHDRAWAL_CONFIRMED";
/// `withdrawals.tx_hash` is `VARCHAR(128)`.
const TX_HASH_MAX_CHARS: usize = 128;

/// `withdrawals.status`; who moves a row in and out of each state is documented on the
/// `withdrawals` migration. This function only ever moves BROADCASTING / PROCESSING / STALE
/// to CONFIRMED.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WithdrawalStatus {
    Requested,
    Processing,
    Broadcasting,
    Stale,
    Confirmed,
    Failed,
}

impl WithdrawalStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            WithdrawalStatus::Requested => "REQUESTED",
            WithdrawalStatus::Processing => "PROCESSING",
            WithdrawalStatus::Broadcasting => "BROADCASTING",
            WithdrawalStatus::Stale => "STALE",
            WithdrawalStatus::Confirmed => "CONFIRMED",
            WithdrawalStatus::Failed => "FAILED",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "REQUESTED" => WithdrawalStatus::Requested,
            "PROCESSING" => WithdrawalStatus::Processing,
            "BROADCASTING" => WithdrawalStatus::Broadcasting,
            "STALE" => WithdrawalStatus::Stale,
            "CONFIRMED" => WithdrawalStatus::Confirmed,
            "FAILED" => WithdrawalStatus::Failed,
            _ => return None,
        })
    }
}

impl fmt::Display for WithdrawalStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `withdrawals.kind`: only a NORMAL withdrawal's confirmation moves the partner's balance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WithdrawalKind {
    /// The partner's own withdrawal: DEBIT once, keyed `WDR_CONFIRM:{id}`.
    Normal,
    /// A settlement payout: the balance moved at settlement, no entry here.
    SettlementWithdraw,
    /// Between our own wallets: no entry.
    SelfTransfer,
}

impl WithdrawalKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WithdrawalKind::Normal => "NORMAL",
            WithdrawalKind::SettlementWithdraw => "SETTLEMENT_WITHDRAW",
            WithdrawalKind::SelfTransfer => "SELF_TRANSFER",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "NORMAL" => WithdrawalKind::Normal,
            "SETTLEMENT_WITHDRAW" => WithdrawalKind::SettlementWithdraw,
            "SELF_TRANSFER" => WithdrawalKind::SelfTransfer,
            _ => return None,
        })
    }
}

impl fmt::Display for WithdrawalKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What [`confirm_if_in_flight`] decided. Only `Transitioned` wrote anything; the caller
/// commits it, and rolls back otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confirmation {
    /// This call moved the withdrawal to CONFIRMED and wrote its side effects.
    Transitioned(Confirmed),
    /// The conditional UPDATE matched no row: someone else confirmed it first, or it is not
    /// in flight. Nothing was written (no DEBIT, no history, no notification).
    NotTransitioned { status: WithdrawalStatus },
    /// No withdrawal has this id.
    NotFound,
}

/// The side effects of a transition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confirmed {
    /// The status before the transition, read from this transaction's snapshot before the
    /// UPDATE: for the history row's display only (seed 001 §4-4); under contention it may be
    /// stale, and `None` when the snapshot predates the row.
    pub previous_status: Option<WithdrawalStatus>,
    pub kind: WithdrawalKind,
    /// The confirmation DEBIT of a NORMAL withdrawal: `Recorded`, or `AlreadyRecorded` when
    /// the ledger already held `WDR_CONFIRM:{id}` (the last line of defence held). `None` for
    /// SETTLEMENT_WITHDRAW and SELF_TRANSFER, which never DEBIT.
    pub debit: Option<Posted>,
    /// The `WITHDRAWAL_CONFIRMED` notification row; `None` when one already existed.
    pub notification_id: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfirmError {
    #[error("database error while confirming a withdrawal: {0}")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("enqueueing the withdrawal notification: {0}")]
    Notification(HandlerError),
    #[error("tx hash {tx_hash:?} is not valid: {reason}")]
    InvalidTxHash {
        tx_hash: String,
        reason: &'static str,
    },
    #[error("withdrawal {withdrawal_id} has {column} {value:?}, which this code does not know")]
    UnknownValue {
        withdrawal_id: u64,
        column: &'static str,
        value: String,
    },
    #[error("withdrawal {withdrawal_id} amount {amount} cannot be represented exactly")]
    Unrepresentable { withdrawal_id: u64, amount: String },
}

impl ConfirmError {
    /// Whether trying again can help: a database or broker fault may pass; bad data and a
    /// refused posting will not (they become a dead letter for ops).
    pub fn is_retryable(&self) -> bool {
        match self {
            ConfirmError::Database(_) | ConfirmError::Ledger(LedgerError::Database(_)) => true,
            ConfirmError::Notification(HandlerError::Outbox(OutboxError::Serialise(_))) => false,
            ConfirmError::Notification(_) => true,
            ConfirmError::Ledger(_)
            | ConfirmError::InvalidTxHash { .. }
            | ConfirmError::UnknownValue { .. }
            | ConfirmError::Unrepresentable { .. } => false,
        }
    }
}

impl From<ConfirmError> for HandlerError {
    fn from(error: ConfirmError) -> Self {
        match error {
            ConfirmError::Database(e) | ConfirmError::Ledger(LedgerError::Database(e)) => {
                HandlerError::Database(e)
            }
            ConfirmError::Notification(e) => e,
            other => HandlerError::Infrastructure(other.to_string()),
        }
    }
}

/// Confirms the withdrawal if, and only if, this call moves it out of flight — in the
/// caller's transaction (the caller commits on `Transitioned` and rolls back otherwise).
///
/// 1. Reads the current status for the history row (display only: a snapshot read).
/// 2. `UPDATE ... SET status = 'CONFIRMED' ... WHERE id = ? AND status IN ('BROADCASTING',
///    'PROCESSING', 'STALE')`. The affected rows decide (SPEC §2.1): InnoDB evaluates an
///    UPDATE's WHERE on the latest committed version under the row's X-lock, not on the
///    snapshot, so of two concurrent confirmations exactly one gets 1.
/// 3. 0 rows: logs "already transitioned (idempotent)" with the current status and returns
///    without writing anything.
/// 4. 1 row: NORMAL → DEBIT `amount` keyed `WDR_CONFIRM:{id}` (a key already present is
///    logged by the ledger and still counts as this transition's DEBIT); then the history
///    row; then the `WITHDRAWAL_CONFIRMED` notification and its message.
#[tracing::instrument(skip_all, fields(withdrawal_id = withdrawal_id))]
pub async fn confirm_if_in_flight(
    uow: &mut UnitOfWork<'_>,
    withdrawal_id: u64,
    tx_hash: &str,
    correlation_id: Uuid,
) -> Result<Confirmation, ConfirmError> {
    validate_tx_hash(tx_hash)?;
    let before = snapshot_status(uow, withdrawal_id).await?;
    if let Some((_, Some(broadcast))) = &before
        && broadcast != tx_hash
    {
        tracing::warn!(
            withdrawal_id,
            broadcast_tx_hash = %broadcast,
            tx_hash,
            "confirmation names another tx than the one broadcast; recording the confirmed one"
        );
    }

    if !mark_confirmed(uow, withdrawal_id, tx_hash).await? {
        return Ok(match current_status(uow, withdrawal_id).await? {
            None => {
                tracing::warn!(
                    withdrawal_id,
                    tx_hash,
                    "withdrawal confirmation for an unknown withdrawal"
                );
                Confirmation::NotFound
            }
            Some(status) => {
                if status == WithdrawalStatus::Confirmed {
                    tracing::warn!(
                        withdrawal_id, status = %status, tx_hash,
                        "withdrawal confirmation skipped — already transitioned (idempotent)"
                    );
                } else {
                    // On chain but not in flight here (FAILED, or never sent): ops must look.
                    tracing::error!(
                        withdrawal_id, status = %status, tx_hash,
                        "withdrawal confirmation skipped — the withdrawal is not in flight"
                    );
                }
                Confirmation::NotTransitioned { status }
            }
        });
    }

    let withdrawal = read_confirmed(uow, withdrawal_id).await?;
    let debit = match withdrawal.kind {
        WithdrawalKind::Normal => Some(debit(uow, &withdrawal).await?),
        WithdrawalKind::SettlementWithdraw | WithdrawalKind::SelfTransfer => None,
    };
    let previous_status = before.map(|(status, _)| status);
    insert_history(uow, withdrawal_id, previous_status, tx_hash).await?;
    let notification_id = notify(uow, &withdrawal, correlation_id).await?;
    tracing::info!(
        withdrawal_id,
        kind = %withdrawal.kind,
        tx_hash,
        previous_status = previous_status.map(WithdrawalStatus::as_str),
        "withdrawal confirmed"
    );
    Ok(Confirmation::Transitioned(Confirmed {
        previous_status,
        kind: withdrawal.kind,
        debit,
        notification_id,
    }))
}

fn validate_tx_hash(tx_hash: &str) -> Result<(), ConfirmError> {
    let invalid = |reason| {
        Err(ConfirmError::InvalidTxHash {
            tx_hash: tx_hash.chars().take(TX_HASH_MAX_CHARS + 8).collect(),
            reason,
        })
    };
    if tx_hash.trim().is_empty() {
        return invalid("it is empty");
    }
    if tx_hash.chars().count() > TX_HASH_MAX_CHARS {
        return invalid("it is longer than 128 characters");
    }
    Ok(())
}

/// The status (and broadcast tx hash) as this transaction's snapshot sees it. Never a
/// decision input: under contention it is what fooled the seed's `findById` check.
async fn snapshot_status(
    conn: &mut MySqlConnection,
    withdrawal_id: u64,
) -> Result<Option<(WithdrawalStatus, Option<String>)>, ConfirmError> {
    let row: Option<(String, Option<String>)> =
        sqlx::query_as("SELECT status, tx_hash FROM withdrawals WHERE id = ?")
            .bind(withdrawal_id)
            .fetch_optional(&mut *conn)
            .await?;
    row.map(|(status, tx_hash)| Ok((parse_status(withdrawal_id, &status)?, tx_hash)))
        .transpose()
}

/// The conditional transition (seed 001 §4-2): true when this call made it.
async fn mark_confirmed(
    conn: &mut MySqlConnection,
    withdrawal_id: u64,
    tx_hash: &str,
) -> Result<bool, ConfirmError> {
    let matched = sqlx::query(
        "UPDATE withdrawals SET status = 'CONFIRMED', tx_hash = ?, confirmed_at = NOW(6) \
         WHERE id = ? AND status IN ('BROADCASTING', 'PROCESSING', 'STALE')",
    )
    .bind(tx_hash)
    .bind(withdrawal_id)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    // sqlx counts matched rows (CLIENT_FOUND_ROWS); with the status in the WHERE clause a
    // match is a transition.
    Ok(matched == 1)
}

/// The latest committed status after an UPDATE that matched nothing. A locking read: a plain
/// SELECT would answer from this transaction's snapshot (the very lie of seed 001). The
/// UPDATE already holds this row's lock under REPEATABLE READ, so it waits for nobody.
async fn current_status(
    conn: &mut MySqlConnection,
    withdrawal_id: u64,
) -> Result<Option<WithdrawalStatus>, ConfirmError> {
    let status: Option<String> =
        sqlx::query_scalar("SELECT status FROM withdrawals WHERE id = ? FOR UPDATE")
            .bind(withdrawal_id)
            .fetch_optional(&mut *conn)
            .await?;
    status
        .map(|status| parse_status(withdrawal_id, &status))
        .transpose()
}

fn parse_status(withdrawal_id: u64, text: &str) -> Result<WithdrawalStatus, ConfirmError> {
    WithdrawalStatus::parse(text).ok_or_else(|| ConfirmError::UnknownValue {
        withdrawal_id,
        column: "status",
        value: text.to_owned(),
    })
}

/// The withdrawal as this transaction just confirmed it.
struct ConfirmedWithdrawal {
    id: u64,
    partner_id: u64,
    kind: WithdrawalKind,
    currency: String,
    amount: Decimal,
    to_address: String,
    tx_hash: String,
    confirmed_at: DateTime<Utc>,
}

/// Reads the row after the transition: it carries this transaction's own change, so it is the
/// latest version (seed 001 §4-4 "전이 후 fresh").
async fn read_confirmed(
    conn: &mut MySqlConnection,
    withdrawal_id: u64,
) -> Result<ConfirmedWithdrawal, ConfirmError> {
    #[allow(clippy::type_complexity)]
    let (partner_id, kind, currency, amount, to_address, tx_hash, confirmed_at): (
        u64,
        String,
        String,
        String,
        String,
        String,
        DateTime<Utc>,
    ) = sqlx::query_as(
        // Amount as text: sqlx's Decimal decoding rounds beyond 28 significant digits.
        "SELECT partner_id, kind, currency, CAST(amount AS CHAR), to_address, tx_hash, \
                confirmed_at \
         FROM withdrawals WHERE id = ?",
    )
    .bind(withdrawal_id)
    .fetch_one(&mut *conn)
    .await?;
    Ok(ConfirmedWithdrawal {
        id: withdrawal_id,
        partner_id,
        kind: WithdrawalKind::parse(&kind).ok_or_else(|| ConfirmError::UnknownValue {
            withdrawal_id,
            column: "kind",
            value: kind.clone(),
        })?,
        currency,
        amount: ledger::parse_exact(&amount).ok_or(ConfirmError::Unrepresentable {
            withdrawal_id,
            amount,
        })?,
        to_address,
        tx_hash,
        confirmed_at,
    })
}

/// The confirmation DEBIT (seed 001 §3 key `WDR_CONFIRM:{id}`, reference WITHDRAWAL/id).
async fn debit(
    conn: &mut MySqlConnection,
    withdrawal: &ConfirmedWithdrawal,
) -> Result<Posted, ConfirmError> {
    let posting = Posting::new(
        withdrawal.partner_id,
        withdrawal.currency.clone(),
        EntryType::Debit,
        withdrawal.amount,
        ReferenceType::Withdrawal,
        withdrawal.id,
    )
    .idem_key(IdemKey::withdrawal_confirm(withdrawal.id))
    .memo(format!("withdrawal {} confirmed", withdrawal.id));
    let posted = ledger::post(conn, &posting).await?;
    if let Posted::AlreadyRecorded { idem_key } = &posted {
        // The transition was ours but the DEBIT was not: some other path wrote it. The key
        // held; the confirmation still completes (history, notification).
        tracing::warn!(
            withdrawal_id = withdrawal.id,
            idem_key = idem_key.as_str(),
            "confirmation DEBIT already recorded; not debited again"
        );
    }
    Ok(posted)
}

async fn insert_history(
    conn: &mut MySqlConnection,
    withdrawal_id: u64,
    previous_status: Option<WithdrawalStatus>,
    tx_hash: &str,
) -> Result<(), ConfirmError> {
    sqlx::query(
        "INSERT INTO withdrawal_status_history (withdrawal_id, from_status, to_status, reason) \
         VALUES (?, ?, 'CONFIRMED', ?)",
    )
    .bind(withdrawal_id)
    .bind(previous_status.map(WithdrawalStatus::as_str))
    .bind(format!("tx {tx_hash} confirmed on chain"))
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The `WITHDRAWAL_CONFIRMED` notification row and its message, in this transaction; the
/// webhook itself goes out after commit (deliver-webhook, principle 8).
async fn notify(
    uow: &mut UnitOfWork<'_>,
    withdrawal: &ConfirmedWithdrawal,
    correlation_id: Uuid,
) -> Result<Option<u64>, ConfirmError> {
    let payload = serde_json::json!({
        "event": WITHDRAWAL_CONFIRMED,
        "withdrawal_id": withdrawal.id,
        "partner_id": withdrawal.partner_id,
        "kind": withdrawal.kind.as_str(),
        "amount": withdrawal.amount.normalize().to_string(),
        "currency": withdrawal.currency,
        "to_address": withdrawal.to_address,
        "tx_hash": withdrawal.tx_hash,
        "confirmed_at": withdrawal.confirmed_at.to_rfc3339_opts(SecondsFormat::Micros, true),
    });
    notifications::enqueue(
        uow,
        &NewNotification {
            partner_id: withdrawal.partner_id,
            event: WITHDRAWAL_CONFIRMED,
            reference_type: "WITHDRAWAL",
            reference_id: withdrawal.id,
            payload: &payload,
        },
        correlation_id,
    )
    .await
    .map_err(ConfirmError::Notification)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_kinds_round_trip_their_column_values() {
        for status in [
            WithdrawalStatus::Requested,
            WithdrawalStatus::Processing,
            WithdrawalStatus::Broadcasting,
            WithdrawalStatus::Stale,
            WithdrawalStatus::Confirmed,
            WithdrawalStatus::Failed,
        ] {
            assert_eq!(WithdrawalStatus::parse(status.as_str()), Some(status));
        }
        for kind in [
            WithdrawalKind::Normal,
            WithdrawalKind::SettlementWithdraw,
            WithdrawalKind::SelfTransfer,
        ] {
            assert_eq!(WithdrawalKind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(WithdrawalStatus::parse("confirmed"), None);
    }

    #[test]
    fn a_tx_hash_must_be_present_and_fit_its_column() {
        assert!(validate_tx_hash("0xabc").is_ok());
        assert!(validate_tx_hash(&"a".repeat(128)).is_ok());
        for bad in [String::new(), "  ".to_owned(), "a".repeat(129)] {
            let error = validate_tx_hash(&bad).unwrap_err();
            assert!(!error.is_retryable(), "{error}");
        }
    }

    #[test]
    fn only_infrastructure_faults_are_retried() {
        assert!(ConfirmError::Database(sqlx::Error::PoolTimedOut).is_retryable());
        assert!(
            ConfirmError::Ledger(LedgerError::Database(sqlx::Error::PoolTimedOut)).is_retryable()
        );
        assert!(
            !ConfirmError::Ledger(LedgerError::InvalidCurrency {
                currency: "usdt".into()
            })
            .is_retryable()
        );
        assert!(
            !ConfirmError::Unrepresentable {
                withdrawal_id: 1,
                amount: "1e40".into()
            }
            .is_retryable()
        );
    }
}
