//! What the handler answers for the confirmations the broker delivered together,
//! one message being a batch of one: one committed read, then one transaction for the rest
//! ([`withdrawal::confirm_all_if_in_flight`], the transition, in the domain crate), about a
//! dozen statements whatever their number.
//!
//! The batch is an optimisation, never a semantic. Every message gets the outcome it would
//! have got alone, because the same rules decide: a committed terminal state answers a message
//! at once, the rows are read under their locks before anything is written, and a withdrawal
//! named twice is decided on the state its first confirmation leaves. Anything that fails the
//! batch's transaction — a balance out of range, a deadlock — rolls it back, and its messages
//! go again one per transaction, through the same path, so that each meets its own fate.

use std::collections::{BTreeMap, HashMap};

use futures_util::future::join_all;
use paybus_confirmations::withdrawal::{
    self, Confirmation, Confirming, WithdrawalState, confirm_all_if_in_flight,
};
use paybus_platform::{
    bus::{HandlerError, Outbox, Outcome},
    transition::Transition,
};
use uuid::Uuid;

use crate::{WithdrawalTxConfirmed, not_confirmed};

/// What the handler does with one confirmation: [`confirm_all`] with one.
pub async fn confirm(
    outbox: &Outbox,
    confirmation: &WithdrawalTxConfirmed,
    correlation_id: Uuid,
) -> Result<Outcome, HandlerError> {
    confirm_all(outbox, &[(confirmation.clone(), correlation_id)])
        .await
        .pop()
        .unwrap_or_else(unanswered)
}

/// The handler's confirmations (on `outbox`'s database; the benchmark drives it directly too):
/// one result per confirmation, in order.
///
/// 1. A tx hash that cannot be stored is answered at once (a dead letter).
/// 2. One plain read of the committed rows, outside any transaction: a withdrawal already
///    CONFIRMED or FAILED never changes again, so that read answers a duplicate (or an
///    anomaly) without a transaction and without waiting for a row lock.
/// 3. Anything else — in flight, absent, or a state the read may have caught just before a
///    concurrent commit — in one transaction, decided under the row locks; if that
///    transaction fails, one transaction per confirmation, the repeats of a withdrawal after
///    its first.
pub async fn confirm_all(
    outbox: &Outbox,
    confirmations: &[(WithdrawalTxConfirmed, Uuid)],
) -> Vec<Result<Outcome, HandlerError>> {
    let mut results: Vec<Option<Result<Outcome, HandlerError>>> =
        confirmations.iter().map(|_| None).collect();
    let mut valid = Vec::with_capacity(confirmations.len());
    for (i, (confirmation, _)) in confirmations.iter().enumerate() {
        match withdrawal::validate_tx_hash(&confirmation.tx_hash) {
            Ok(()) => valid.push(i),
            Err(invalid) => results[i] = Some(HandlerError::from(invalid).into_outcome()),
        }
    }

    let mut ids: Vec<u64> = valid
        .iter()
        .map(|&i| confirmations[i].0.withdrawal_id)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    // Only a shortcut: a failed read decides nothing, the transaction below decides all.
    let committed: BTreeMap<u64, WithdrawalState> = match outbox.pool().acquire().await {
        Ok(mut conn) if !ids.is_empty() => withdrawal::committed_states(&mut conn, &ids)
            .await
            .map(|states| states.into_iter().collect())
            .unwrap_or_default(),
        _ => BTreeMap::new(),
    };
    let mut in_flight = Vec::with_capacity(valid.len());
    for i in valid {
        let confirmation = &confirmations[i].0;
        match committed.get(&confirmation.withdrawal_id) {
            Some(current) if current.status.is_terminal() => {
                results[i] = Some(Ok(not_confirmed(
                    confirmation.withdrawal_id,
                    &confirmation.tx_hash,
                    current,
                )));
            }
            _ => in_flight.push(i),
        }
    }

    if !in_flight.is_empty() {
        match in_one_transaction(outbox, confirmations, &in_flight).await {
            Ok(answers) => {
                for (&i, answer) in in_flight.iter().zip(answers) {
                    results[i] = Some(Ok(answer));
                }
            }
            Err(error) if in_flight.len() == 1 => {
                results[in_flight[0]] = Some(error.into_outcome());
            }
            Err(error) => {
                tracing::info!(
                    size = in_flight.len(),
                    error = %paybus_platform::telemetry::one_line(&error),
                    "confirmation batch rolled back; confirming one per transaction"
                );
                for round in rounds(confirmations, &in_flight) {
                    let answers = join_all(round.iter().map(|&i| async move {
                        in_one_transaction(outbox, confirmations, &[i])
                            .await
                            .and_then(|mut answers| answers.pop().map_or_else(unanswered, Ok))
                    }))
                    .await;
                    for (i, answer) in round.into_iter().zip(answers) {
                        results[i] = Some(answer.or_else(HandlerError::into_outcome));
                    }
                }
            }
        }
    }
    results
        .into_iter()
        .map(|result| result.unwrap_or_else(unanswered))
        .collect()
}

/// `indices` in rounds of distinct withdrawals: the first confirmation of each, then the
/// second, … — a round's transactions may run together, and a repeat sees its first's commit.
fn rounds(confirmations: &[(WithdrawalTxConfirmed, Uuid)], indices: &[usize]) -> Vec<Vec<usize>> {
    let mut seen: HashMap<u64, usize> = HashMap::new();
    let mut rounds: Vec<Vec<usize>> = Vec::new();
    for &i in indices {
        let round = seen.entry(confirmations[i].0.withdrawal_id).or_insert(0);
        if rounds.len() <= *round {
            rounds.push(Vec::new());
        }
        rounds[*round].push(i);
        *round += 1;
    }
    rounds
}

/// The transition for `indices` in one transaction: committed when it made at least one
/// transition, rolled back otherwise and on any error; the handler's outcome for each.
async fn in_one_transaction(
    outbox: &Outbox,
    confirmations: &[(WithdrawalTxConfirmed, Uuid)],
    indices: &[usize],
) -> Result<Vec<Outcome>, HandlerError> {
    let batch: Vec<Confirming<'_>> = indices
        .iter()
        .map(|&i| Confirming {
            withdrawal_id: confirmations[i].0.withdrawal_id,
            tx_hash: &confirmations[i].0.tx_hash,
            correlation_id: confirmations[i].1,
        })
        .collect();
    let mut uow = outbox.begin().await?;
    match confirm_all_if_in_flight(&mut uow, &batch).await {
        Ok(decided) => {
            if decided
                .iter()
                .any(|decision| matches!(decision, Transition::Transitioned(_)))
            {
                uow.commit().await?;
            } else {
                uow.rollback().await?;
            }
            Ok(batch
                .iter()
                .zip(&decided)
                .map(|(confirming, decision)| answer(confirming, decision))
                .collect())
        }
        Err(error) => {
            if let Err(rollback) = uow.rollback().await {
                tracing::warn!(%rollback, "rolling back a failed confirmation transaction failed");
            }
            Err(error.into())
        }
    }
}

/// The handler's outcome for a decision.
fn answer(confirming: &Confirming<'_>, decision: &Confirmation) -> Outcome {
    let Confirming {
        withdrawal_id,
        tx_hash,
        ..
    } = *confirming;
    decision.outcome(format_args!("withdrawal {withdrawal_id}"), |current| {
        not_confirmed(withdrawal_id, tx_hash, current)
    })
}

/// Every confirmation is answered above; a gap would be a bug, and requeueing is the safe
/// answer to it.
fn unanswered() -> Result<Outcome, HandlerError> {
    Err(HandlerError::Database(sqlx::Error::Protocol(
        "confirmation left unanswered".to_owned(),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn confirmation(withdrawal_id: u64) -> (WithdrawalTxConfirmed, Uuid) {
        let tx_hash = "0xabc".to_owned();
        (
            WithdrawalTxConfirmed {
                withdrawal_id,
                tx_hash,
            },
            Uuid::nil(),
        )
    }

    #[test]
    fn the_fallback_runs_each_withdrawals_repeats_after_its_first() {
        let confirmations: Vec<_> = [7, 8, 7, 9, 7, 8].into_iter().map(confirmation).collect();

        let rounds = rounds(&confirmations, &[0, 1, 2, 3, 4, 5]);

        assert_eq!(rounds, vec![vec![0, 1, 3], vec![2, 5], vec![4]]);
    }
}
