//! The deposit confirmation transition (seed 001 §4-6), in the caller's transaction.

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
pub const DEPOSIT_CONFIRMED: &str = "DEPOSIT_CONFIRMED";

/// `deposits.status`; who moves a row in and out of each state is documented on the
/// `deposits` migration. This function only ever moves DETECTED to CONFIRMED.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DepositStatus {
    Detected,
    Confirmed,
    Failed,
}

impl DepositStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            DepositStatus::Detected => "DETECTED",
            DepositStatus::Confirmed => "CONFIRMED",
            DepositStatus::Failed => "FAILED",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "DETECTED" => DepositStatus::Detected,
            "CONFIRMED" => DepositStatus::Confirmed,
            "FAILED" => DepositStatus::Failed,
            _ => return None,
        })
    }
}

impl fmt::Display for DepositStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What [`confirm_if_detected`] decided. Only `Transitioned` wrote anything; the caller
/// commits it, and rolls back otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confirmation {
    /// This call moved the deposit to CONFIRMED and wrote its side effects.
    Transitioned(Confirmed),
    /// The conditional UPDATE matched no row: someone else confirmed it first, or it FAILED.
    /// Nothing was written (no CREDIT, no FEE, no notification).
    NotTransitioned { status: DepositStatus },
    /// No deposit has this id.
    NotFound,
}

/// The side effects of a transition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confirmed {
    /// The CREDIT of the gross amount: `Recorded`, or `AlreadyRecorded` when the ledger
    /// already held `DEP_CREDIT:{id}` (the last line of defence held).
    pub credit: Posted,
    /// The FEE, likewise keyed `DEP_FEE:{id}`; `None` when the deposit has no fee.
    pub fee: Option<Posted>,
    /// The `DEPOSIT_CONFIRMED` notification row; `None` when one already existed.
    pub notification_id: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfirmError {
    #[error("database error while confirming a deposit: {0}")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("enqueueing the deposit notification: {0}")]
    Notification(HandlerError),
    #[error("deposit {deposit_id} has {column} {value:?}, which this code does not know")]
    UnknownValue {
        deposit_id: u64,
        column: &'static str,
        value: String,
    },
    #[error("deposit {deposit_id} {column} {value} cannot be represented exactly")]
    Unrepresentable {
        deposit_id: u64,
        column: &'static str,
        value: String,
    },
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

/// Confirms the deposit if, and only if, this call moves it from DETECTED — in the caller's
/// transaction (the caller commits on `Transitioned` and rolls back otherwise).
///
/// `UPDATE deposits SET status = 'CONFIRMED' ... WHERE id = ? AND status = 'DETECTED'`
/// decides by its affected rows (SPEC §2.1). 0 rows: logs the current status and writes
/// nothing. 1 row: CREDIT `amount` keyed `DEP_CREDIT:{id}`, FEE `fee` keyed `DEP_FEE:{id}`
/// when `fee > 0` (what the audit expects: no zero FEE rows), then the `DEPOSIT_CONFIRMED`
/// notification and its message. Both postings take the same (partner, currency) gate, so
/// they cannot deadlock with each other.
#[tracing::instrument(skip_all, fields(deposit_id = deposit_id))]
pub async fn confirm_if_detected(
    uow: &mut UnitOfWork<'_>,
    deposit_id: u64,
    correlation_id: Uuid,
) -> Result<Confirmation, ConfirmError> {
    if !mark_confirmed(uow, deposit_id).await? {
        return Ok(match current_status(uow, deposit_id).await? {
            None => {
                tracing::warn!(deposit_id, "deposit confirmation for an unknown deposit");
                Confirmation::NotFound
            }
            Some(status) => {
                if status == DepositStatus::Confirmed {
                    tracing::warn!(
                        deposit_id, status = %status,
                        "deposit confirmation skipped — already transitioned (idempotent)"
                    );
                } else {
                    // Confirmed on chain but FAILED here (dropped or reorged): ops must look.
                    tracing::error!(
                        deposit_id, status = %status,
                        "deposit confirmation skipped — the deposit is not DETECTED"
                    );
                }
                Confirmation::NotTransitioned { status }
            }
        });
    }

    let deposit = read_confirmed(uow, deposit_id).await?;
    let credit = post(
        uow,
        &deposit,
        EntryType::Credit,
        deposit.amount,
        IdemKey::deposit_credit(deposit_id),
    )
    .await?;
    let fee = if deposit.fee > Decimal::ZERO {
        Some(
            post(
                uow,
                &deposit,
                EntryType::Fee,
                deposit.fee,
                IdemKey::deposit_fee(deposit_id),
            )
            .await?,
        )
    } else {
        None
    };
    let notification_id = notify(uow, &deposit, correlation_id).await?;
    tracing::info!(
        deposit_id,
        partner_id = deposit.partner_id,
        tx_hash = %deposit.tx_hash,
        "deposit confirmed"
    );
    Ok(Confirmation::Transitioned(Confirmed {
        credit,
        fee,
        notification_id,
    }))
}

/// The conditional transition: true when this call made it.
async fn mark_confirmed(conn: &mut MySqlConnection, deposit_id: u64) -> Result<bool, ConfirmError> {
    let matched = sqlx::query(
        "UPDATE deposits SET status = 'CONFIRMED', confirmed_at = NOW(6) \
         WHERE id = ? AND status = 'DETECTED'",
    )
    .bind(deposit_id)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    // sqlx counts matched rows (CLIENT_FOUND_ROWS); with the status in the WHERE clause a
    // match is a transition.
    Ok(matched == 1)
}

/// The latest committed status after an UPDATE that matched nothing: a locking read, because
/// a plain SELECT would answer from this transaction's snapshot.
async fn current_status(
    conn: &mut MySqlConnection,
    deposit_id: u64,
) -> Result<Option<DepositStatus>, ConfirmError> {
    let status: Option<String> =
        sqlx::query_scalar("SELECT status FROM deposits WHERE id = ? FOR UPDATE")
            .bind(deposit_id)
            .fetch_optional(&mut *conn)
            .await?;
    status
        .map(|status| {
            DepositStatus::parse(&status).ok_or(ConfirmError::UnknownValue {
                deposit_id,
                column: "status",
                value: status,
            })
        })
        .transpose()
}

/// The deposit as this transaction just confirmed it.
struct ConfirmedDeposit {
    id: u64,
    partner_id: u64,
    currency: String,
    amount: Decimal,
    fee: Decimal,
    tx_hash: String,
    to_address: String,
    confirmed_at: DateTime<Utc>,
}

/// Reads the row after the transition: it carries this transaction's own change, so it is the
/// latest version.
async fn read_confirmed(
    conn: &mut MySqlConnection,
    deposit_id: u64,
) -> Result<ConfirmedDeposit, ConfirmError> {
    #[allow(clippy::type_complexity)]
    let (partner_id, currency, amount, fee, tx_hash, to_address, confirmed_at): (
        u64,
        String,
        String,
        String,
        String,
        String,
        DateTime<Utc>,
    ) = sqlx::query_as(
        // Amounts as text: sqlx's Decimal decoding rounds beyond 28 significant digits.
        "SELECT partner_id, currency, CAST(amount AS CHAR), CAST(fee AS CHAR), tx_hash, \
                to_address, confirmed_at \
         FROM deposits WHERE id = ?",
    )
    .bind(deposit_id)
    .fetch_one(&mut *conn)
    .await?;
    let exact = |column, value: String| {
        ledger::parse_exact(&value).ok_or(ConfirmError::Unrepresentable {
            deposit_id,
            column,
            value,
        })
    };
    Ok(ConfirmedDeposit {
        id: deposit_id,
        partner_id,
        currency,
        amount: exact("amount", amount)?,
        fee: exact("fee", fee)?,
        tx_hash,
        to_address,
        confirmed_at,
    })
}

/// One keyed posting of the confirmation (seed 001 §3: `DEP_CREDIT:{id}`, `DEP_FEE:{id}`).
async fn post(
    conn: &mut MySqlConnection,
    deposit: &ConfirmedDeposit,
    entry_type: EntryType,
    amount: Decimal,
    key: IdemKey,
) -> Result<Posted, ConfirmError> {
    let posting = Posting::new(
        deposit.partner_id,
        deposit.currency.clone(),
        entry_type,
        amount,
        ReferenceType::Deposit,
        deposit.id,
    )
    .idem_key(key)
    .memo(format!("deposit {} confirmed", deposit.id));
    let posted = ledger::post(conn, &posting).await?;
    if let Posted::AlreadyRecorded { idem_key } = &posted {
        // The transition was ours but the entry was not: some other path wrote it. The key
        // held; the confirmation still completes.
        tracing::warn!(
            deposit_id = deposit.id,
            idem_key = idem_key.as_str(),
            "deposit entry already recorded; not posted again"
        );
    }
    Ok(posted)
}

/// The `DEPOSIT_CONFIRMED` notification row and its message, in this transaction; the
/// webhook itself goes out after commit (deliver-webhook, principle 8).
async fn notify(
    uow: &mut UnitOfWork<'_>,
    deposit: &ConfirmedDeposit,
    correlation_id: Uuid,
) -> Result<Option<u64>, ConfirmError> {
    let payload = serde_json::json!({
        "event": DEPOSIT_CONFIRMED,
        "deposit_id": deposit.id,
        "partner_id": deposit.partner_id,
        "amount": deposit.amount.normalize().to_string(),
        "fee": deposit.fee.normalize().to_string(),
        "net_amount": (deposit.amount - deposit.fee).normalize().to_string(),
        "currency": deposit.currency,
        "tx_hash": deposit.tx_hash,
        "to_address": deposit.to_address,
        "confirmed_at": deposit.confirmed_at.to_rfc3339_opts(SecondsFormat::Micros, true),
    });
    notifications::enqueue(
        uow,
        &NewNotification {
            partner_id: deposit.partner_id,
            event: DEPOSIT_CONFIRMED,
            reference_type: "DEPOSIT",
            reference_id: deposit.id,
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
    fn statuses_round_trip_their_column_values() {
        for status in [
            DepositStatus::Detected,
            DepositStatus::Confirmed,
            DepositStatus::Failed,
        ] {
            assert_eq!(DepositStatus::parse(status.as_str()), Some(status));
        }
        assert_eq!(DepositStatus::parse("detected"), None);
    }

    #[test]
    fn only_infrastructure_faults_are_retried() {
        assert!(ConfirmError::Database(sqlx::Error::PoolTimedOut).is_retryable());
        assert!(
            !ConfirmError::Unrepresentable {
                deposit_id: 1,
                column: "fee",
                value: "1e40".into()
            }
            .is_retryable()
        );
    }
}
