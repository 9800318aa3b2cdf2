//! The deposit confirmation transition (seed 001 §4-6), in the caller's transaction.

use chrono::{SecondsFormat, SubsecRound, Utc};
use paybus_confirmations::{
    ConfirmError,
    deposit::{self, Deposit, DepositStatus},
    owed,
};
use paybus_ledger::{EntryType, IdemKey, Posted, Posting, ReferenceType};
use paybus_money::Amount;
use paybus_partners::NewNotification;
use paybus_platform::{bus::UnitOfWork, transition::Transition};
use sqlx::MySqlConnection;
use uuid::Uuid;

/// The partner notification a confirmation owes (`partner_notifications.event`).
pub const DEPOSIT_CONFIRMED: &str = "DEPOSIT_CONFIRMED";

/// What [`confirm_if_detected`] decided. Only `Transitioned` wrote anything; the caller
/// commits it, and rolls back otherwise.
pub type Confirmation = Transition<Confirmed, DepositStatus>;

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

/// Confirms the deposit if, and only if, this call moves it from DETECTED — in the caller's
/// transaction (the caller commits on `Transitioned` and rolls back otherwise).
///
/// The deposit is read with its row lock ([`deposit::lock`]: the latest committed version,
/// not the transaction's snapshot), and moved by `UPDATE deposits SET status = 'CONFIRMED' ...
/// WHERE id = ? AND status = 'DETECTED'`, still conditional (principle 1). Not DETECTED: logs
/// the status and writes nothing. DETECTED: the `DEPOSIT_CONFIRMED` notification and its
/// message, then CREDIT `amount` keyed `DEP_CREDIT:{id}` and FEE `fee` keyed `DEP_FEE:{id}`
/// when `fee > 0` (what the audit expects: no zero FEE rows). The postings go last, so the
/// partner's gate row — which serialises all its postings — is held only until the commit
/// that follows; both take the same (partner, currency) gate, so they cannot deadlock with
/// each other.
#[tracing::instrument(skip_all, fields(deposit_id = deposit_id))]
pub async fn confirm_if_detected(
    uow: &mut UnitOfWork<'_>,
    deposit_id: u64,
    correlation_id: Uuid,
) -> Result<Confirmation, ConfirmError> {
    let Some(mut deposit) = deposit::lock(uow, deposit_id).await? else {
        tracing::warn!(deposit_id, "deposit confirmation for an unknown deposit");
        return Ok(Transition::NotFound);
    };
    if deposit.status != DepositStatus::Detected {
        // The outcome (Skipped for a duplicate, a dead letter for an anomaly) says the rest;
        // this line only records what the locked read found.
        tracing::debug!(deposit_id, status = %deposit.status, "deposit confirmation not applied: not DETECTED");
        return Ok(Transition::NotTransitioned {
            current: deposit.status,
        });
    }
    // DATETIME(6) keeps microseconds: the notification must carry exactly what is stored.
    let confirmed_at = Utc::now().trunc_subsecs(6);
    if !deposit::mark_confirmed(uow, deposit_id, confirmed_at).await? {
        // Unreachable while we hold the row lock; if it ever happens, write nothing.
        return Ok(Transition::NotTransitioned {
            current: deposit.status,
        });
    }
    deposit.status = DepositStatus::Confirmed;
    deposit.confirmed_at = Some(confirmed_at);

    let notification_id = notify(uow, &deposit, correlation_id).await?;
    let credit = post(
        uow,
        &deposit,
        EntryType::Credit,
        deposit.amount,
        IdemKey::deposit_credit(deposit_id),
    )
    .await?;
    let fee = if deposit.fee.is_positive() {
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
    tracing::debug!(
        deposit_id,
        partner_id = deposit.partner_id,
        tx_hash = %deposit.tx_hash,
        "deposit confirmed"
    );
    Ok(Transition::Transitioned(Confirmed {
        credit,
        fee,
        notification_id,
    }))
}

/// One keyed posting of the confirmation (seed 001 §3: `DEP_CREDIT:{id}`, `DEP_FEE:{id}`).
async fn post(
    conn: &mut MySqlConnection,
    deposit: &Deposit,
    entry_type: EntryType,
    amount: Amount,
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
    owed::post_keyed(conn, &posting).await
}

/// The `DEPOSIT_CONFIRMED` notification row and its message, in this transaction; the
/// webhook itself goes out after commit (deliver-webhook, principle 8).
async fn notify(
    uow: &mut UnitOfWork<'_>,
    deposit: &Deposit,
    correlation_id: Uuid,
) -> Result<Option<u64>, ConfirmError> {
    let payload = serde_json::json!({
        "event": DEPOSIT_CONFIRMED,
        "deposit_id": deposit.id,
        "partner_id": deposit.partner_id,
        "amount": deposit.amount.to_string(),
        "fee": deposit.fee.to_string(),
        "net_amount": (deposit.amount - deposit.fee).to_string(),
        "currency": deposit.currency,
        "tx_hash": deposit.tx_hash,
        "to_address": deposit.to_address,
        "confirmed_at": deposit
            .confirmed_at
            .map(|at| at.to_rfc3339_opts(SecondsFormat::Micros, true)),
    });
    let notification = NewNotification {
        partner_id: deposit.partner_id,
        event: DEPOSIT_CONFIRMED,
        reference_type: "DEPOSIT",
        reference_id: deposit.id,
        payload: &payload,
    };
    owed::notify_partner(uow, &notification, correlation_id).await
}
