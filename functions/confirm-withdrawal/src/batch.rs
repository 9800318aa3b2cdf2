//! Many confirmations in one transaction (issue 14): what the broker has already delivered is
//! confirmed with set-based statements, about a dozen whatever the batch size, instead of a
//! dozen per message.
//!
//! The batch is an optimisation, never a semantic. Every message gets the outcome
//! [`confirm`](crate::confirm) would have given it alone, because the same rules decide: a
//! committed terminal state answers a message at once, the rows are read under their locks
//! before anything is written, and the conditional UPDATE still has to move exactly the rows
//! the locked read found in flight. Anything unusual — a key the ledger already holds, a
//! notification that already exists, a balance out of range, a deadlock — rolls the whole
//! batch back and its messages go one by one through `confirm`, which knows each case.

use std::collections::{BTreeMap, HashSet};

use chrono::{SubsecRound, Utc};
use futures_util::future::join_all;
use paybus_confirmations::{
    ConfirmError,
    withdrawal::{self, WithdrawalKind, WithdrawalState, WithdrawalStatus},
};
use paybus_ledger as ledger;
use paybus_partners::notifications;
use paybus_platform::{
    bus::{HandlerError, Outbox, Outcome, UnitOfWork},
    transition::Transition,
};
use uuid::Uuid;

use crate::{
    WithdrawalTxConfirmed, confirm,
    confirmation::{debit_posting, notification, notification_payload, validate_tx_hash},
    not_confirmed,
};

/// What the batch decided for one confirmation (the side effects are the batch's).
pub type BatchDecision = Transition<(), WithdrawalState>;

/// One confirmation of a batch: the withdrawal, the confirmed tx hash, the message's
/// correlation id.
#[derive(Debug, Clone, Copy)]
pub struct Confirming<'a> {
    pub withdrawal_id: u64,
    pub tx_hash: &'a str,
    pub correlation_id: Uuid,
}

/// The handler's batch: one result per confirmation, in order.
///
/// 1. A tx hash that cannot be stored is answered at once (a dead letter, as alone).
/// 2. Repeats of a withdrawal within the batch are duplicates of its first confirmation: they
///    are answered after it, from the state it left (or by `confirm` when that is unknown).
/// 3. One committed read answers every withdrawal already CONFIRMED or FAILED.
/// 4. The rest, when there are at least two, in one transaction
///    ([`confirm_all_if_in_flight`]); otherwise, or if that transaction fails, one by one.
pub async fn confirm_all(
    outbox: &Outbox,
    confirmations: &[(WithdrawalTxConfirmed, Uuid)],
) -> Vec<Result<Outcome, HandlerError>> {
    let mut results: Vec<Option<Result<Outcome, HandlerError>>> =
        confirmations.iter().map(|_| None).collect();
    let mut firsts = Vec::new();
    let mut repeats = Vec::new();
    let mut seen = HashSet::new();
    for (i, (confirmation, _)) in confirmations.iter().enumerate() {
        if let Err(invalid) = validate_tx_hash(&confirmation.tx_hash) {
            results[i] = Some(HandlerError::from(invalid).into_outcome());
        } else if seen.insert(confirmation.withdrawal_id) {
            firsts.push(i);
        } else {
            repeats.push(i);
        }
    }

    // The state each first confirmation is known to have left its withdrawal in (`None`: it
    // does not exist), for answering the repeats.
    let mut left: BTreeMap<u64, Option<WithdrawalState>> = BTreeMap::new();
    let ids: Vec<u64> = firsts
        .iter()
        .map(|&i| confirmations[i].0.withdrawal_id)
        .collect();
    // A failed read decides nothing: those messages go one by one and meet the fault there.
    let committed: BTreeMap<u64, WithdrawalState> = match outbox.pool().acquire().await {
        Ok(mut conn) => withdrawal::committed_states(&mut conn, &ids)
            .await
            .map(|states| states.into_iter().collect())
            .unwrap_or_default(),
        Err(_) => BTreeMap::new(),
    };
    let mut in_flight = Vec::new();
    for &i in &firsts {
        let confirmation = &confirmations[i].0;
        match committed.get(&confirmation.withdrawal_id) {
            Some(current) if current.status.is_terminal() => {
                results[i] = Some(Ok(not_confirmed(
                    confirmation.withdrawal_id,
                    &confirmation.tx_hash,
                    current,
                )));
                left.insert(confirmation.withdrawal_id, Some(current.clone()));
            }
            _ => in_flight.push(i),
        }
    }

    if in_flight.len() >= 2 {
        let batch: Vec<Confirming<'_>> = in_flight
            .iter()
            .map(|&i| Confirming {
                withdrawal_id: confirmations[i].0.withdrawal_id,
                tx_hash: &confirmations[i].0.tx_hash,
                correlation_id: confirmations[i].1,
            })
            .collect();
        match in_one_transaction(outbox, &batch).await {
            Ok(decisions) => {
                for ((&i, confirming), decision) in in_flight.iter().zip(&batch).zip(decisions) {
                    let id = confirming.withdrawal_id;
                    results[i] = Some(Ok(answer(id, confirming.tx_hash, &decision)));
                    left.insert(
                        id,
                        match decision {
                            Transition::Transitioned(()) => Some(WithdrawalState {
                                status: WithdrawalStatus::Confirmed,
                                tx_hash: Some(confirming.tx_hash.to_owned()),
                            }),
                            Transition::NotTransitioned { current } => Some(current),
                            Transition::NotFound => None,
                        },
                    );
                }
            }
            Err(error) => tracing::info!(
                size = batch.len(),
                error = %paybus_platform::telemetry::one_line(&error),
                "confirmation batch rolled back; confirming one by one"
            ),
        }
    }

    let alone: Vec<usize> = firsts
        .into_iter()
        .filter(|&i| results[i].is_none())
        .collect();
    answer_alone(outbox, confirmations, &alone, &mut results).await;
    let mut unknown = Vec::new();
    for i in repeats {
        let confirmation = &confirmations[i].0;
        match left.get(&confirmation.withdrawal_id) {
            Some(state) => {
                let decision: BatchDecision = match state {
                    Some(current) => Transition::NotTransitioned {
                        current: current.clone(),
                    },
                    None => Transition::NotFound,
                };
                results[i] = Some(Ok(answer(
                    confirmation.withdrawal_id,
                    &confirmation.tx_hash,
                    &decision,
                )));
            }
            None => unknown.push(i),
        }
    }
    // After the firsts: a repeat must see its first's commit.
    answer_alone(outbox, confirmations, &unknown, &mut results).await;
    results
        .into_iter()
        .map(|result| result.unwrap_or_else(unreachable_unanswered))
        .collect()
}

/// The handler's outcome for a decision, as [`confirm`] words it.
fn answer(withdrawal_id: u64, tx_hash: &str, decision: &BatchDecision) -> Outcome {
    decision.outcome(format_args!("withdrawal {withdrawal_id}"), |current| {
        not_confirmed(withdrawal_id, tx_hash, current)
    })
}

/// `confirm` for each of `indices`, concurrently (they are distinct withdrawals).
async fn answer_alone(
    outbox: &Outbox,
    confirmations: &[(WithdrawalTxConfirmed, Uuid)],
    indices: &[usize],
    results: &mut [Option<Result<Outcome, HandlerError>>],
) {
    let answers = join_all(indices.iter().map(|&i| {
        let (confirmation, correlation_id) = &confirmations[i];
        confirm(outbox, confirmation, *correlation_id)
    }))
    .await;
    for (&i, answer) in indices.iter().zip(answers) {
        results[i] = Some(answer);
    }
}

/// Every confirmation is answered above; a gap would be a bug, and requeueing is the safe
/// answer to it.
fn unreachable_unanswered() -> Result<Outcome, HandlerError> {
    Err(HandlerError::Database(sqlx::Error::Protocol(
        "confirmation left unanswered by its batch".to_owned(),
    )))
}

/// The batch's transaction: committed when it made at least one transition, rolled back
/// otherwise and on any error.
async fn in_one_transaction(
    outbox: &Outbox,
    batch: &[Confirming<'_>],
) -> Result<Vec<BatchDecision>, HandlerError> {
    let mut uow = outbox.begin().await?;
    match confirm_all_if_in_flight(&mut uow, batch).await {
        Ok(decisions) => {
            if decisions
                .iter()
                .any(|decision| matches!(decision, Transition::Transitioned(())))
            {
                uow.commit().await?;
            } else {
                uow.rollback().await?;
            }
            Ok(decisions)
        }
        Err(error) => {
            if let Err(rollback) = uow.rollback().await {
                tracing::warn!(%rollback, "rolling back a failed confirmation batch failed");
            }
            Err(error.into())
        }
    }
}

/// [`confirm_if_in_flight`](crate::confirm_if_in_flight) for several withdrawals (distinct ids,
/// valid tx hashes) in the caller's transaction, in about ten statements:
/// the rows locked in id order; one conditional UPDATE for those in flight, which must move
/// exactly them; their history rows; their notifications and messages; and last the DEBITs of
/// the NORMAL ones, gate by gate in `(partner, currency)` order (`ledger::post_all`). An error
/// leaves the transaction to be rolled back.
pub async fn confirm_all_if_in_flight(
    uow: &mut UnitOfWork<'_>,
    batch: &[Confirming<'_>],
) -> Result<Vec<BatchDecision>, ConfirmError> {
    let ids: Vec<u64> = batch.iter().map(|c| c.withdrawal_id).collect();
    let mut locked: BTreeMap<u64, withdrawal::Withdrawal> = withdrawal::lock_all(uow, &ids)
        .await?
        .into_iter()
        .map(|w| (w.id, w))
        .collect();
    let mut decisions = Vec::with_capacity(batch.len());
    let mut moving = Vec::new();
    for confirming in batch {
        decisions.push(match locked.get(&confirming.withdrawal_id) {
            None => Transition::NotFound,
            Some(current) if !current.status.is_in_flight() => Transition::NotTransitioned {
                current: WithdrawalState {
                    status: current.status,
                    tx_hash: current.tx_hash.clone(),
                },
            },
            Some(_) => {
                moving.push(*confirming);
                Transition::Transitioned(())
            }
        });
    }
    if moving.is_empty() {
        return Ok(decisions);
    }

    let confirmed_at = Utc::now().trunc_subsecs(6);
    let updates: Vec<(u64, &str)> = moving
        .iter()
        .map(|c| (c.withdrawal_id, c.tx_hash))
        .collect();
    let moved = withdrawal::mark_all_confirmed(uow, &updates, confirmed_at).await?;
    if moved != moving.len() as u64 {
        return Err(ConfirmError::Incomplete {
            entity: "withdrawal",
            expected: moving.len() as u64,
            moved,
        });
    }

    let mut history = Vec::with_capacity(moving.len());
    let mut confirmed = Vec::with_capacity(moving.len());
    for confirming in &moving {
        let Some(mut row) = locked.remove(&confirming.withdrawal_id) else {
            continue;
        };
        history.push((
            row.id,
            row.status,
            WithdrawalStatus::Confirmed,
            format!("tx {} confirmed on chain", confirming.tx_hash),
        ));
        row.status = WithdrawalStatus::Confirmed;
        row.tx_hash = Some(confirming.tx_hash.to_owned());
        row.confirmed_at = Some(confirmed_at);
        confirmed.push((row, confirming.correlation_id));
    }
    withdrawal::record_history_all(uow, &history)
        .await
        .map_err(|source| ConfirmError::Database {
            entity: "withdrawal",
            source,
        })?;

    let payloads: Vec<serde_json::Value> = confirmed
        .iter()
        .map(|(row, _)| notification_payload(row))
        .collect();
    let owed: Vec<_> = confirmed
        .iter()
        .zip(&payloads)
        .map(|((row, correlation_id), payload)| (notification(row, payload), *correlation_id))
        .collect();
    notifications::enqueue_all(uow, &owed)
        .await
        .map_err(|source| ConfirmError::Notification {
            entity: "WITHDRAWAL",
            source,
        })?;

    let debits: Vec<ledger::Posting> = confirmed
        .iter()
        .filter(|(row, _)| row.kind == WithdrawalKind::Normal)
        .map(|(row, _)| debit_posting(row))
        .collect();
    ledger::post_all(uow, &debits).await?;
    tracing::debug!(
        confirmed = confirmed.len(),
        debits = debits.len(),
        "withdrawal confirmations batched"
    );
    Ok(decisions)
}
