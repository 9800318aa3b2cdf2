//! The withdrawal confirmation itself (docs/workflows/confirmations.md, seed 001 §4-2, §4-4, §4-5): one transition, for
//! one confirmation or many, in the caller's transaction. confirm-withdrawal's handler runs it
//! on what the broker delivered together; a single message is a batch of one.

use std::collections::BTreeMap;

use chrono::{SecondsFormat, SubsecRound, Utc};
use paybus_bus::{UnitOfWork, transition::Transition};
use paybus_ledger::{EntryType, IdemKey, Posted, Posting, ReferenceType};
use uuid::Uuid;

use super::{
    ENTITY, Withdrawal, WithdrawalKind, WithdrawalState, WithdrawalStatus, lock_all,
    mark_all_confirmed, record_history_all,
};
use crate::{
    ConfirmError,
    decisions::Decisions,
    owed::{self, Notifies},
};

/// The partner notification a confirmation owes (`partner_notifications.event`).
pub const WITHDRAWAL_CONFIRMED: &str = "WITHDRAWAL_CONFIRMED";
/// `withdrawals.tx_hash` is `VARCHAR(128)`.
const TX_HASH_MAX_CHARS: usize = 128;

/// What [`confirm_all_if_in_flight`] decided for one confirmation. Only `Transitioned` wrote
/// anything; the caller commits when one of the batch did, and rolls back otherwise.
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

/// One confirmation to apply: the withdrawal, the confirmed tx hash, the message's correlation
/// id.
#[derive(Debug, Clone, Copy)]
pub struct Confirming<'a> {
    pub withdrawal_id: u64,
    pub tx_hash: &'a str,
    pub correlation_id: Uuid,
}

/// [`confirm_all_if_in_flight`] with one confirmation.
pub async fn confirm_if_in_flight(
    uow: &mut UnitOfWork<'_>,
    withdrawal_id: u64,
    tx_hash: &str,
    correlation_id: Uuid,
) -> Result<Confirmation, ConfirmError> {
    let confirming = Confirming {
        withdrawal_id,
        tx_hash,
        correlation_id,
    };
    let mut decided = confirm_all_if_in_flight(uow, &[confirming]).await?;
    decided.pop().ok_or(ConfirmError::Incomplete {
        entity: ENTITY,
        expected: 1,
        moved: 0,
    })
}

/// Confirms each withdrawal if, and only if, this call moves it out of flight — in the
/// caller's transaction, one decision per confirmation in order (the caller commits when one
/// transitioned and rolls back otherwise; an error leaves the transaction to be rolled back).
///
/// 1. Reads the withdrawals with their row locks ([`lock_all`]): the latest committed
///    versions, not the snapshot the seed's `findById` trusted. Of two concurrent
///    confirmations the second waits there until the first commits, then reads CONFIRMED.
///    A withdrawal named again later in the batch is decided on the state its first
///    confirmation leaves, as if the two had come one after the other.
/// 2. Not in flight (or absent): nothing is written for it.
/// 3. One `UPDATE ... WHERE status IN ('BROADCASTING', 'PROCESSING', 'STALE') AND id IN (...)`:
///    still conditional (principle 1), so it must move exactly the rows the locked read found in
///    flight ([`ConfirmError::Incomplete`] otherwise).
/// 4. Their history rows, their `WITHDRAWAL_CONFIRMED` notifications and messages, and last
///    the DEBITs of the NORMAL ones keyed `WDR_CONFIRM:{id}` (a key already present is logged
///    and still counts as the transition's DEBIT). The DEBITs go last because a gate row
///    serialises every posting of its partner: taken just before the commit, it is held for
///    two statements instead of five.
///
/// Locks, in one global order so that concurrent batches (sharded consumers) cannot wait for
/// each other in a cycle: the withdrawal rows by id, then the new notification rows by
/// (event, reference), then the gate rows by (partner, currency) (`paybus_ledger::post_all`).
/// Every W2 transaction, whatever its size, takes them in that order.
///
/// Nine statements with BEGIN and COMMIT whatever the batch's size (two more for several
/// notifications' and entries' ids); the duplicate a handler sees most often (already
/// CONFIRMED) never gets here (the handler answers it from one committed read).
#[tracing::instrument(skip_all, fields(confirmations = batch.len()))]
pub async fn confirm_all_if_in_flight(
    uow: &mut UnitOfWork<'_>,
    batch: &[Confirming<'_>],
) -> Result<Vec<Confirmation>, ConfirmError> {
    for confirming in batch {
        validate_tx_hash(confirming.tx_hash)?;
    }
    confirm_all_validated(uow, batch).await
}

/// [`confirm_all_if_in_flight`] for tx hashes already validated (the batch driver refuses a bad
/// one before anything is read).
pub(super) async fn confirm_all_validated(
    uow: &mut UnitOfWork<'_>,
    batch: &[Confirming<'_>],
) -> Result<Vec<Confirmation>, ConfirmError> {
    let mut ids: Vec<u64> = batch.iter().map(|c| c.withdrawal_id).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut locked: BTreeMap<u64, Withdrawal> = lock_all(uow, &ids)
        .await?
        .into_iter()
        .map(|w| (w.id, w))
        .collect();

    let mut decisions = Decisions::new(batch.len());
    for (i, confirming) in batch.iter().enumerate() {
        let (withdrawal_id, tx_hash) = (confirming.withdrawal_id, confirming.tx_hash);
        if decisions.decide_repeat(withdrawal_id) {
            continue;
        }
        let Some(row) = locked.remove(&withdrawal_id) else {
            tracing::warn!(
                withdrawal_id,
                tx_hash,
                "withdrawal confirmation for an unknown withdrawal"
            );
            decisions.not_found(withdrawal_id);
            continue;
        };
        if !row.status.is_in_flight() {
            // The outcome (Skipped for a duplicate, a dead letter for an anomaly) says the
            // rest; this line only records what the locked read found.
            tracing::debug!(
                withdrawal_id, status = %row.status, tx_hash,
                recorded_tx_hash = row.tx_hash.as_deref(),
                "withdrawal confirmation not applied: not in flight"
            );
            let current = WithdrawalState {
                status: row.status,
                tx_hash: row.tx_hash,
            };
            decisions.not_transitioned(withdrawal_id, current);
            continue;
        }
        if let Some(broadcast) = row.tx_hash.as_deref()
            && broadcast != tx_hash
        {
            tracing::warn!(
                withdrawal_id,
                broadcast_tx_hash = %broadcast,
                tx_hash,
                "confirmation names another tx than the one broadcast; recording the confirmed one"
            );
        }
        let confirmed = WithdrawalState {
            status: WithdrawalStatus::Confirmed,
            tx_hash: Some(tx_hash.to_owned()),
        };
        decisions.moves(i, withdrawal_id, row, confirmed);
    }
    if let Some((moving, decided)) = decisions.moving() {
        confirm_moving(uow, batch, moving, decided).await?;
    }
    decisions.into_decided(ENTITY, batch.len())
}

/// Steps 3 and 4 of [`confirm_all_if_in_flight`] for the rows it found in flight (in id order
/// on return), filling their decisions.
async fn confirm_moving(
    uow: &mut UnitOfWork<'_>,
    batch: &[Confirming<'_>],
    moving: &mut [(usize, Withdrawal)],
    decided: &mut [Option<Confirmation>],
) -> Result<(), ConfirmError> {
    // The global lock order (see `confirm_all_if_in_flight`): rows written by id.
    moving.sort_unstable_by_key(|(_, row)| row.id);
    // DATETIME(6) keeps microseconds: the notification must carry exactly what is stored.
    let confirmed_at = Utc::now().trunc_subsecs(6);
    let updates: Vec<(u64, &str)> = moving
        .iter()
        .map(|(i, row)| (row.id, batch[*i].tx_hash))
        .collect();
    let moved = mark_all_confirmed(uow, &updates, confirmed_at).await?;
    if moved != moving.len() as u64 {
        // Unreachable while we hold the row locks; if it ever happens, keep nothing.
        return Err(ConfirmError::Incomplete {
            entity: ENTITY,
            expected: moving.len() as u64,
            moved,
        });
    }

    let mut history = Vec::with_capacity(moving.len());
    let mut previous = Vec::with_capacity(moving.len());
    for (i, row) in moving.iter_mut() {
        let tx_hash = batch[*i].tx_hash;
        history.push((
            row.id,
            Some(row.status),
            WithdrawalStatus::Confirmed,
            format!("tx {tx_hash} confirmed on chain"),
        ));
        previous.push(row.status);
        row.status = WithdrawalStatus::Confirmed;
        row.tx_hash = Some(tx_hash.to_owned());
        row.confirmed_at = Some(confirmed_at);
    }
    record_history_all(uow, &history)
        .await
        .map_err(ConfirmError::database(ENTITY))?;

    let notified = moving
        .iter()
        .map(|(i, row)| (row, batch[*i].correlation_id));
    let notification_ids = owed::notify_all(uow, notified).await?;

    let normal: Vec<usize> = (0..moving.len())
        .filter(|&m| moving[m].1.kind == WithdrawalKind::Normal)
        .collect();
    let debits: Vec<Posting> = normal
        .iter()
        .map(|&m| debit_posting(&moving[m].1))
        .collect();
    let mut posted: Vec<Option<Posted>> = vec![None; moving.len()];
    for (&m, debit) in normal.iter().zip(owed::post_keyed_all(uow, &debits).await?) {
        posted[m] = Some(debit);
    }

    for ((((i, row), previous_status), notification_id), debit) in moving
        .iter()
        .zip(previous)
        .zip(notification_ids)
        .zip(posted)
    {
        tracing::debug!(
            withdrawal_id = row.id,
            kind = %row.kind,
            tx_hash = row.tx_hash.as_deref(),
            previous_status = %previous_status,
            "withdrawal confirmed"
        );
        decided[*i] = Some(Transition::Transitioned(Confirmed {
            previous_status,
            kind: row.kind,
            debit,
            notification_id,
        }));
    }
    Ok(())
}

/// A tx hash that cannot be stored is refused before anything is read.
pub fn validate_tx_hash(tx_hash: &str) -> Result<(), ConfirmError> {
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
fn debit_posting(withdrawal: &Withdrawal) -> Posting {
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

impl Notifies for Withdrawal {
    const EVENT: &'static str = WITHDRAWAL_CONFIRMED;
    const REFERENCE_TYPE: &'static str = "WITHDRAWAL";

    fn partner_and_reference(&self) -> (u64, u64) {
        (self.partner_id, self.id)
    }

    /// The JSON the partner receives for a confirmed withdrawal.
    fn payload(&self) -> serde_json::Value {
        serde_json::json!({
            "event": WITHDRAWAL_CONFIRMED,
            "withdrawal_id": self.id,
            "partner_id": self.partner_id,
            "kind": self.kind.as_str(),
            "amount": self.amount.to_string(),
            "currency": self.currency,
            "to_address": self.to_address,
            "tx_hash": self.tx_hash,
            "confirmed_at": self
                .confirmed_at
                .map(|at| at.to_rfc3339_opts(SecondsFormat::Micros, true)),
        })
    }
}

#[cfg(test)]
mod tests {
    use paybus_bus::HandlerError;

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
