//! The confirmation transition itself (seed 001 §4-2, §4-4, §4-5), in the caller's transaction.

use chrono::{SecondsFormat, SubsecRound, Utc};
use paybus_confirmations::{
    ConfirmError, owed,
    withdrawal::{self, Withdrawal, WithdrawalKind, WithdrawalState, WithdrawalStatus},
};
use paybus_ledger::{EntryType, IdemKey, Posted, Posting, ReferenceType};
use paybus_partners::NewNotification;
use paybus_platform::{bus::UnitOfWork, transition::Transition};
use sqlx::MySqlConnection;
use uuid::Uuid;

/// The partner notification a confirmation owes (`partner_notifications.event`).
pub const WITHDRAWAL_CONFIRMED: &str = "WITHDRAWAL_CONFIRMED";
/// `withdrawals.tx_hash` is `VARCHAR(128)`.
const TX_HASH_MAX_CHARS: usize = 128;

/// What [`confirm_if_in_flight`] decided. Only `Transitioned` wrote anything; the caller
/// commits it, and rolls back otherwise.
pub type Confirmation = Transition<Confirmed, WithdrawalState>;

/// The side effects of a transition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confirmed {
    /// The status the transition left (read under the row lock, so exact).
    pub previous_status: WithdrawalStatus,
    pub kind: WithdrawalKind,
    /// The confirmation DEBIT of a NORMAL withdrawal: `Recorded`, or `AlreadyRecorded` when
    /// the ledger already held `WDR_CONFIRM:{id}` (the last line of defence held). `None` for
    /// SETTLEMENT_WITHDRAW and SELF_TRANSFER, which never DEBIT.
    pub debit: Option<Posted>,
    /// The `WITHDRAWAL_CONFIRMED` notification row; `None` when one already existed.
    pub notification_id: Option<u64>,
}

/// Confirms the withdrawal if, and only if, this call moves it out of flight — in the
/// caller's transaction (the caller commits on `Transitioned` and rolls back otherwise).
///
/// 1. Reads the withdrawal with its row lock ([`withdrawal::lock`]): the latest committed
///    version, not the snapshot the seed's `findById` trusted. Of two concurrent
///    confirmations the second waits here until the first commits, then reads CONFIRMED.
/// 2. Not in flight (or absent): logs it and returns without writing anything.
/// 3. `UPDATE ... SET status = 'CONFIRMED' ... WHERE id = ? AND status IN ('BROADCASTING',
///    'PROCESSING', 'STALE')`: still conditional (SPEC §2.1), so the affected rows confirm
///    what the locked read decided.
/// 4. The history row, the `WITHDRAWAL_CONFIRMED` notification and its message, and last the
///    DEBIT of a NORMAL withdrawal keyed `WDR_CONFIRM:{id}` (a key already present is logged
///    by the ledger and still counts as this transition's DEBIT). The DEBIT goes last because
///    its gate row serialises every posting of the partner: taken just before the commit, it
///    is held for two statements instead of five.
///
/// Nine statements with BEGIN and COMMIT; the duplicate a handler sees most often (already
/// CONFIRMED) never gets here ([`crate::confirm`] answers it from one read).
#[tracing::instrument(skip_all, fields(withdrawal_id = withdrawal_id))]
pub async fn confirm_if_in_flight(
    uow: &mut UnitOfWork<'_>,
    withdrawal_id: u64,
    tx_hash: &str,
    correlation_id: Uuid,
) -> Result<Confirmation, ConfirmError> {
    validate_tx_hash(tx_hash)?;
    let Some(mut confirmed) = withdrawal::lock(uow, withdrawal_id).await? else {
        tracing::warn!(
            withdrawal_id,
            tx_hash,
            "withdrawal confirmation for an unknown withdrawal"
        );
        return Ok(Transition::NotFound);
    };
    let previous_status = confirmed.status;
    let current = || WithdrawalState {
        status: confirmed.status,
        tx_hash: confirmed.tx_hash.clone(),
    };
    if !previous_status.is_in_flight() {
        // The outcome (Skipped for a duplicate, a dead letter for an anomaly) says the rest;
        // this line only records what the locked read found.
        tracing::debug!(
            withdrawal_id, status = %previous_status, tx_hash,
            recorded_tx_hash = confirmed.tx_hash.as_deref(),
            "withdrawal confirmation not applied: not in flight"
        );
        return Ok(Transition::NotTransitioned { current: current() });
    }
    if let Some(broadcast) = confirmed.tx_hash.as_deref()
        && broadcast != tx_hash
    {
        tracing::warn!(
            withdrawal_id,
            broadcast_tx_hash = %broadcast,
            tx_hash,
            "confirmation names another tx than the one broadcast; recording the confirmed one"
        );
    }

    // DATETIME(6) keeps microseconds: the notification must carry exactly what is stored.
    let confirmed_at = Utc::now().trunc_subsecs(6);
    if !withdrawal::mark_confirmed(uow, withdrawal_id, tx_hash, confirmed_at).await? {
        // Unreachable while we hold the row lock; if it ever happens, write nothing.
        return Ok(Transition::NotTransitioned { current: current() });
    }
    confirmed.status = WithdrawalStatus::Confirmed;
    confirmed.tx_hash = Some(tx_hash.to_owned());
    confirmed.confirmed_at = Some(confirmed_at);

    withdrawal::record_history(
        uow,
        withdrawal_id,
        Some(previous_status),
        WithdrawalStatus::Confirmed,
        &format!("tx {tx_hash} confirmed on chain"),
    )
    .await
    .map_err(|source| ConfirmError::Database {
        entity: "withdrawal",
        source,
    })?;
    let notification_id = notify(uow, &confirmed, correlation_id).await?;
    let debit = match confirmed.kind {
        WithdrawalKind::Normal => Some(debit(uow, &confirmed).await?),
        WithdrawalKind::SettlementWithdraw | WithdrawalKind::SelfTransfer => None,
    };
    tracing::debug!(
        withdrawal_id,
        kind = %confirmed.kind,
        tx_hash,
        previous_status = %previous_status,
        "withdrawal confirmed"
    );
    Ok(Transition::Transitioned(Confirmed {
        previous_status,
        kind: confirmed.kind,
        debit,
        notification_id,
    }))
}

pub(crate) fn validate_tx_hash(tx_hash: &str) -> Result<(), ConfirmError> {
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

/// The confirmation DEBIT (seed 001 §3 key `WDR_CONFIRM:{id}`, reference WITHDRAWAL/id).
async fn debit(
    conn: &mut MySqlConnection,
    withdrawal: &Withdrawal,
) -> Result<Posted, ConfirmError> {
    owed::post_keyed(conn, &debit_posting(withdrawal)).await
}

pub(crate) fn debit_posting(withdrawal: &Withdrawal) -> Posting {
    Posting::new(
        withdrawal.partner_id,
        withdrawal.currency.clone(),
        EntryType::Debit,
        withdrawal.amount,
        ReferenceType::Withdrawal,
        withdrawal.id,
    )
    .idem_key(IdemKey::withdrawal_confirm(withdrawal.id))
    .memo(format!("withdrawal {} confirmed", withdrawal.id))
}

/// The `WITHDRAWAL_CONFIRMED` notification row and its message, in this transaction; the
/// webhook itself goes out after commit (deliver-webhook, principle 8).
async fn notify(
    uow: &mut UnitOfWork<'_>,
    withdrawal: &Withdrawal,
    correlation_id: Uuid,
) -> Result<Option<u64>, ConfirmError> {
    let payload = notification_payload(withdrawal);
    owed::notify_partner(uow, &notification(withdrawal, &payload), correlation_id).await
}

/// The JSON the partner receives for a confirmed withdrawal (frozen in the notification row).
pub(crate) fn notification_payload(withdrawal: &Withdrawal) -> serde_json::Value {
    serde_json::json!({
        "event": WITHDRAWAL_CONFIRMED,
        "withdrawal_id": withdrawal.id,
        "partner_id": withdrawal.partner_id,
        "kind": withdrawal.kind.as_str(),
        "amount": withdrawal.amount.to_string(),
        "currency": withdrawal.currency,
        "to_address": withdrawal.to_address,
        "tx_hash": withdrawal.tx_hash,
        "confirmed_at": withdrawal
            .confirmed_at
            .map(|at| at.to_rfc3339_opts(SecondsFormat::Micros, true)),
    })
}

pub(crate) fn notification<'a>(
    withdrawal: &Withdrawal,
    payload: &'a serde_json::Value,
) -> NewNotification<'a> {
    NewNotification {
        partner_id: withdrawal.partner_id,
        event: WITHDRAWAL_CONFIRMED,
        reference_type: "WITHDRAWAL",
        reference_id: withdrawal.id,
        payload,
    }
}

#[cfg(test)]
mod tests {
    use paybus_platform::bus::HandlerError;

    use super::*;

    #[test]
    fn a_tx_hash_must_be_present_and_fit_its_column() {
        assert!(validate_tx_hash("0xabc").is_ok());
        assert!(validate_tx_hash(&"a".repeat(128)).is_ok());
        for bad in [String::new(), "  ".to_owned(), "a".repeat(129)] {
            let error = validate_tx_hash(&bad).unwrap_err();
            assert!(!HandlerError::from(error).is_transient(), "{bad:?}");
        }
    }
}
