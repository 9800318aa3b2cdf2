//! The deposit confirmation itself (docs/workflows/confirmations.md, seed 001 §4-6): one
//! transition, for one confirmation or many, in the caller's transaction. confirm-deposit's
//! handler runs it on what the broker delivered together; a single message is a batch of one.

use std::collections::BTreeMap;

use chrono::{SecondsFormat, SubsecRound, Utc};
use paybus_bus::{UnitOfWork, transition::Transition};
use paybus_ledger::{EntryType, IdemKey, Posted, Posting, ReferenceType};
use paybus_money::Amount;
use uuid::Uuid;

use super::{Deposit, DepositStatus, ENTITY, lock_all, mark_all_confirmed};
use crate::{
    ConfirmError,
    decisions::Decisions,
    owed::{self, Notifies},
};

/// The partner notification a confirmation owes (`partner_notifications.event`).
pub const DEPOSIT_CONFIRMED: &str = "DEPOSIT_CONFIRMED";

/// What [`confirm_all_if_detected`] decided for one confirmation. Only `Transitioned` wrote
/// anything; the caller commits when one of the batch did, and rolls back otherwise.
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

/// One confirmation to apply: the deposit and the message's correlation id.
#[derive(Debug, Clone, Copy)]
pub struct Confirming {
    pub deposit_id: u64,
    pub correlation_id: Uuid,
}

/// [`confirm_all_if_detected`] with one confirmation.
pub async fn confirm_if_detected(
    uow: &mut UnitOfWork<'_>,
    deposit_id: u64,
    correlation_id: Uuid,
) -> Result<Confirmation, ConfirmError> {
    let confirming = Confirming {
        deposit_id,
        correlation_id,
    };
    let mut decided = confirm_all_if_detected(uow, &[confirming]).await?;
    decided.pop().ok_or(ConfirmError::Incomplete {
        entity: ENTITY,
        expected: 1,
        moved: 0,
    })
}

/// Confirms each deposit if, and only if, this call moves it from DETECTED — in the caller's
/// transaction, one decision per confirmation in order (the caller commits when one
/// transitioned and rolls back otherwise; an error leaves the transaction to be rolled back).
///
/// 1. Reads the deposits with their row locks ([`lock_all`]): the latest committed versions,
///    not the transaction's snapshot. Of two concurrent confirmations the second waits there
///    until the first commits, then reads CONFIRMED. A deposit named again later in the batch
///    is decided on the state its first confirmation leaves (CONFIRMED), as if the two had
///    come one after the other.
/// 2. Not DETECTED (or absent): nothing is written for it.
/// 3. One `UPDATE deposits SET status = 'CONFIRMED' ... WHERE status = 'DETECTED' AND id IN
///    (...)`: still conditional (principle 1), so it must move exactly the rows the locked read
///    found DETECTED ([`ConfirmError::Incomplete`] otherwise).
/// 4. Their `DEPOSIT_CONFIRMED` notifications and messages, then last each deposit's CREDIT
///    of the gross amount keyed `DEP_CREDIT:{id}` and its FEE keyed `DEP_FEE:{id}` when
///    `fee > 0` (what the audit expects: no zero FEE rows). A key already present is logged
///    and still counts as the transition's entry. The postings go last because a gate row
///    serialises every posting of its partner: taken just before the commit, it is held for
///    two statements.
///
/// Locks, in the one global order every W2 transaction takes (see
/// `withdrawal::confirm_all_if_in_flight`), so concurrent batches (sharded consumers) cannot
/// wait for each other in a cycle: the deposit rows by id, then the new notification rows by
/// (event, reference), then the gate rows by (partner, currency) (`paybus_ledger::post_all`).
///
/// Eight statements with BEGIN and COMMIT whatever the batch's size, one more to read back
/// the entries' ids when there are several (a deposit with a fee has two) and one for several
/// notifications' ids; the duplicate a handler sees most often (already
/// CONFIRMED) never gets here (the handler answers it from one committed read).
#[tracing::instrument(skip_all, fields(confirmations = batch.len()))]
pub async fn confirm_all_if_detected(
    uow: &mut UnitOfWork<'_>,
    batch: &[Confirming],
) -> Result<Vec<Confirmation>, ConfirmError> {
    let mut ids: Vec<u64> = batch.iter().map(|c| c.deposit_id).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut locked: BTreeMap<u64, Deposit> = lock_all(uow, &ids)
        .await?
        .into_iter()
        .map(|d| (d.id, d))
        .collect();

    let mut decisions = Decisions::new(batch.len());
    for (i, confirming) in batch.iter().enumerate() {
        let deposit_id = confirming.deposit_id;
        if decisions.decide_repeat(deposit_id) {
            continue;
        }
        let Some(row) = locked.remove(&deposit_id) else {
            tracing::warn!(deposit_id, "deposit confirmation for an unknown deposit");
            decisions.not_found(deposit_id);
            continue;
        };
        if row.status != DepositStatus::Detected {
            // The outcome (Skipped for a duplicate, a dead letter for an anomaly) says the
            // rest; this line only records what the locked read found.
            tracing::debug!(
                deposit_id, status = %row.status,
                "deposit confirmation not applied: not DETECTED"
            );
            decisions.not_transitioned(deposit_id, row.status);
            continue;
        }
        decisions.moves(i, deposit_id, row, DepositStatus::Confirmed);
    }
    if let Some((moving, decided)) = decisions.moving() {
        confirm_moving(uow, batch, moving, decided).await?;
    }
    decisions.into_decided(ENTITY, batch.len())
}

/// Steps 3 and 4 of [`confirm_all_if_detected`] for the rows it found DETECTED (in id order on
/// return), filling their decisions.
async fn confirm_moving(
    uow: &mut UnitOfWork<'_>,
    batch: &[Confirming],
    moving: &mut [(usize, Deposit)],
    decided: &mut [Option<Confirmation>],
) -> Result<(), ConfirmError> {
    // The global lock order (see `confirm_all_if_detected`): rows written by id.
    moving.sort_unstable_by_key(|(_, row)| row.id);
    // DATETIME(6) keeps microseconds: the notification must carry exactly what is stored.
    let confirmed_at = Utc::now().trunc_subsecs(6);
    let ids: Vec<u64> = moving.iter().map(|(_, row)| row.id).collect();
    let moved = mark_all_confirmed(uow, &ids, confirmed_at).await?;
    if moved != moving.len() as u64 {
        // Unreachable while we hold the row locks; if it ever happens, keep nothing.
        return Err(ConfirmError::Incomplete {
            entity: ENTITY,
            expected: moving.len() as u64,
            moved,
        });
    }
    for (_, row) in moving.iter_mut() {
        row.status = DepositStatus::Confirmed;
        row.confirmed_at = Some(confirmed_at);
    }

    let notified = moving
        .iter()
        .map(|(i, row)| (row, batch[*i].correlation_id));
    let notification_ids = owed::notify_all(uow, notified).await?;

    // Each deposit's CREDIT, then its FEE when it has one: the order sequential confirmations
    // would have posted them in, so each gate's balance chain is the same.
    let mut postings = Vec::with_capacity(2 * moving.len());
    for (_, row) in moving.iter() {
        postings.push(posting(
            row,
            EntryType::Credit,
            row.amount,
            IdemKey::deposit_credit(row.id),
        ));
        if row.fee.is_positive() {
            postings.push(posting(
                row,
                EntryType::Fee,
                row.fee,
                IdemKey::deposit_fee(row.id),
            ));
        }
    }
    let mut posted = owed::post_keyed_all(uow, &postings).await?.into_iter();

    for ((i, row), notification_id) in moving.iter().zip(notification_ids) {
        let incomplete = || {
            ConfirmError::Ledger(paybus_ledger::LedgerError::Incomplete {
                written: 0,
                expected: postings.len() as u64,
            })
        };
        let credit = posted.next().ok_or_else(incomplete)?;
        let fee = if row.fee.is_positive() {
            Some(posted.next().ok_or_else(incomplete)?)
        } else {
            None
        };
        tracing::debug!(
            deposit_id = row.id,
            partner_id = row.partner_id,
            tx_hash = %row.tx_hash,
            "deposit confirmed"
        );
        decided[*i] = Some(Transition::Transitioned(Confirmed {
            credit,
            fee,
            notification_id,
        }));
    }
    Ok(())
}

/// One keyed posting of the confirmation (seed 001 §3: `DEP_CREDIT:{id}`, `DEP_FEE:{id}`).
fn posting(deposit: &Deposit, entry_type: EntryType, amount: Amount, key: IdemKey) -> Posting {
    Posting::new(
        deposit.partner_id,
        deposit.currency.clone(),
        entry_type,
        amount,
        ReferenceType::Deposit,
        deposit.id,
    )
    .idem_key(key)
    .memo(format!("deposit {} confirmed", deposit.id))
}

impl Notifies for Deposit {
    const EVENT: &'static str = DEPOSIT_CONFIRMED;
    const REFERENCE_TYPE: &'static str = "DEPOSIT";

    fn partner_and_reference(&self) -> (u64, u64) {
        (self.partner_id, self.id)
    }

    /// The JSON the partner receives for a confirmed deposit.
    fn payload(&self) -> serde_json::Value {
        serde_json::json!({
            "event": DEPOSIT_CONFIRMED,
            "deposit_id": self.id,
            "partner_id": self.partner_id,
            "amount": self.amount.to_string(),
            "fee": self.fee.to_string(),
            "net_amount": (self.amount - self.fee).to_string(),
            "currency": self.currency,
            "tx_hash": self.tx_hash,
            "to_address": self.to_address,
            "confirmed_at": self
                .confirmed_at
                .map(|at| at.to_rfc3339_opts(SecondsFormat::Micros, true)),
        })
    }
}
