//! What a confirm function's handler does with the confirmations the broker delivered
//! together, one message being a batch of one: one committed read, then one transaction for
//! the rest (the transition, [`Confirms::transition`]), about a dozen statements whatever
//! their number. Each kind of confirmation is its message's [`Confirms`] impl, in its own
//! module ([`withdrawal::confirm_all`](crate::withdrawal::confirm_all),
//! [`deposit::confirm_all`](crate::deposit::confirm_all)).
//!
//! The batch is an optimisation, never a semantic. Every message gets the outcome it would
//! have got alone, because the same rules decide: a committed terminal state answers a message
//! at once, the rows are read under their locks before anything is written, and an entity
//! named twice is decided on the state its first confirmation leaves. Anything that fails the
//! batch's transaction — a balance out of range, a deadlock — rolls it back, and its messages
//! go again one per transaction, through the same path, so that each meets its own fate.

use std::{
    collections::{BTreeMap, HashMap},
    fmt::Display,
};

use futures_util::future::join_all;
use paybus_bus::{Batched, HandlerError, Outbox, Outcome, UnitOfWork, transition::Transition};
use sqlx::{MySql, MySqlConnection, pool::PoolConnection};
use uuid::Uuid;

use crate::ConfirmError;

/// One kind of confirmation, as the driver sees it: how its messages name their entity, how
/// its committed state is read and judged, and its transition.
pub trait Confirms: Send + Sync + 'static {
    /// The message's data (`deposit.tx_confirmed`'s, …).
    type Message: Send + Sync;
    /// What a transition wrote.
    type Confirmed: Send;
    /// Where an entity stands, as the committed read and the locked read see it.
    type Current: Send + Sync;

    /// The entity the message confirms.
    fn id(message: &Self::Message) -> u64;

    /// Who the outcomes' texts are about ("deposit 7").
    fn subject(message: &Self::Message) -> impl Display;

    /// A message that can never be applied is refused before anything is read.
    fn validate(_message: &Self::Message) -> Result<(), ConfirmError> {
        Ok(())
    }

    /// The committed states of `ids` (sorted, distinct), read outside any transaction; ids
    /// without a row are absent.
    fn committed(
        conn: &mut MySqlConnection,
        ids: &[u64],
    ) -> impl Future<Output = Result<Vec<(u64, Self::Current)>, ConfirmError>> + Send;

    /// Nothing leaves this state: the committed read may answer from it.
    fn is_terminal(current: &Self::Current) -> bool;

    /// The transition for `batch` in `uow`'s transaction, one decision per confirmation in
    /// order; the driver commits when one transitioned and rolls back otherwise.
    fn transition(
        uow: &mut UnitOfWork<'_>,
        batch: &[(&Self::Message, Uuid)],
    ) -> impl Future<Output = Result<Vec<Decision<Self>>, ConfirmError>> + Send;

    /// The outcome of a confirmation that found its entity in `current` and did not
    /// transition: `Skipped` for a plain duplicate, `Failed` for an anomaly ops must see.
    fn not_confirmed(message: &Self::Message, current: &Self::Current) -> Outcome;
}

/// What [`Confirms::transition`] decided for one confirmation.
pub type Decision<C> = Transition<<C as Confirms>::Confirmed, <C as Confirms>::Current>;

/// One confirmation: [`confirm_all`] with one.
pub async fn confirm<C: Confirms>(
    outbox: &Outbox,
    message: C::Message,
    correlation_id: Uuid,
) -> Result<Outcome, HandlerError> {
    confirm_all::<C>(outbox, &[(message, correlation_id)])
        .await
        .pop()
        .unwrap_or_else(unanswered)
}

/// What a confirm handler answers for the messages the broker delivered together:
/// [`confirm_all`] over their data, one result each in order.
pub async fn confirm_delivered<C: Confirms>(
    outbox: &Outbox,
    messages: Vec<Batched<C::Message>>,
) -> Vec<Result<Outcome, HandlerError>> {
    let confirmations: Vec<_> = messages
        .into_iter()
        .map(|batched| (batched.message.data, batched.message.correlation_id))
        .collect();
    confirm_all::<C>(outbox, &confirmations).await
}

/// The handler's confirmations (on `outbox`'s database; the benchmarks drive it directly too):
/// one result per confirmation, in order.
///
/// 1. A message [`Confirms::validate`] refuses is answered at once (a dead letter).
/// 2. One plain read of the committed rows, outside any transaction: a terminal state never
///    changes again, so that read answers a duplicate (or an anomaly) without a transaction
///    and without waiting for a row lock.
/// 3. Anything else — not yet terminal, absent, or a state the read may have caught just
///    before a concurrent commit — in one transaction, decided under the row locks; if that
///    transaction fails, one transaction per confirmation, the repeats of an entity after its
///    first.
pub async fn confirm_all<C: Confirms>(
    outbox: &Outbox,
    confirmations: &[(C::Message, Uuid)],
) -> Vec<Result<Outcome, HandlerError>> {
    let mut results: Vec<Option<Result<Outcome, HandlerError>>> =
        confirmations.iter().map(|_| None).collect();
    let mut valid = Vec::with_capacity(confirmations.len());
    for (i, (message, _)) in confirmations.iter().enumerate() {
        match C::validate(message) {
            Ok(()) => valid.push(i),
            Err(invalid) => results[i] = Some(HandlerError::from(invalid).into_outcome()),
        }
    }

    let mut ids: Vec<u64> = valid.iter().map(|&i| C::id(&confirmations[i].0)).collect();
    ids.sort_unstable();
    ids.dedup();
    // Only a shortcut: a failed read decides nothing, the transaction below decides all. The
    // transaction then runs on the same connection (one checkout of the pool, whose every
    // return costs a ping round trip); not after a failed read, which may have broken it.
    let mut conn = outbox.pool().acquire().await.ok();
    let committed: BTreeMap<u64, C::Current> = match conn.as_mut() {
        Some(read_on) if !ids.is_empty() => match C::committed(read_on, &ids).await {
            Ok(states) => states.into_iter().collect(),
            Err(_) => {
                conn = None;
                BTreeMap::new()
            }
        },
        _ => BTreeMap::new(),
    };
    let mut pending = Vec::with_capacity(valid.len());
    for i in valid {
        let message = &confirmations[i].0;
        match committed.get(&C::id(message)) {
            Some(current) if C::is_terminal(current) => {
                results[i] = Some(Ok(C::not_confirmed(message, current)));
            }
            _ => pending.push(i),
        }
    }

    if !pending.is_empty() {
        match in_one_transaction::<C>(outbox, conn.take(), confirmations, &pending).await {
            Ok(answers) => {
                for (&i, answer) in pending.iter().zip(answers) {
                    results[i] = Some(Ok(answer));
                }
            }
            Err(error) if pending.len() == 1 => {
                results[pending[0]] = Some(error.into_outcome());
            }
            Err(error) => {
                tracing::info!(
                    size = pending.len(),
                    error = %paybus_telemetry::one_line(&error),
                    "confirmation batch rolled back; confirming one per transaction"
                );
                for round in rounds::<C>(confirmations, &pending) {
                    let answers = join_all(round.iter().map(|&i| async move {
                        in_one_transaction::<C>(outbox, None, confirmations, &[i])
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

/// `indices` in rounds of distinct entities: the first confirmation of each, then the second,
/// … — a round's transactions may run together, and a repeat sees its first's commit.
fn rounds<C: Confirms>(confirmations: &[(C::Message, Uuid)], indices: &[usize]) -> Vec<Vec<usize>> {
    let mut seen: HashMap<u64, usize> = HashMap::new();
    let mut rounds: Vec<Vec<usize>> = Vec::new();
    for &i in indices {
        let round = seen.entry(C::id(&confirmations[i].0)).or_insert(0);
        if rounds.len() <= *round {
            rounds.push(Vec::new());
        }
        rounds[*round].push(i);
        *round += 1;
    }
    rounds
}

/// The transition for `indices` in one transaction (on `conn` when given, else on a
/// connection of the pool): committed when it made at least one transition, rolled back
/// otherwise and on any error; the handler's outcome for each.
async fn in_one_transaction<C: Confirms>(
    outbox: &Outbox,
    conn: Option<PoolConnection<MySql>>,
    confirmations: &[(C::Message, Uuid)],
    indices: &[usize],
) -> Result<Vec<Outcome>, HandlerError> {
    let batch: Vec<(&C::Message, Uuid)> = indices
        .iter()
        .map(|&i| (&confirmations[i].0, confirmations[i].1))
        .collect();
    let mut uow = match conn {
        Some(conn) => outbox.begin_on(conn).await?,
        None => outbox.begin().await?,
    };
    match C::transition(&mut uow, &batch).await {
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
                .map(|((message, _), decision)| {
                    decision.outcome(C::subject(message), |current| {
                        C::not_confirmed(message, current)
                    })
                })
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

    /// Only [`Confirms::id`] matters to the rounds.
    struct Ids;

    impl Confirms for Ids {
        type Message = u64;
        type Confirmed = ();
        type Current = ();

        fn id(message: &u64) -> u64 {
            *message
        }

        fn subject(message: &u64) -> impl Display {
            *message
        }

        async fn committed(
            _: &mut MySqlConnection,
            _: &[u64],
        ) -> Result<Vec<(u64, ())>, ConfirmError> {
            Ok(Vec::new())
        }

        fn is_terminal(_: &()) -> bool {
            false
        }

        async fn transition(
            _: &mut UnitOfWork<'_>,
            batch: &[(&u64, Uuid)],
        ) -> Result<Vec<Transition<(), ()>>, ConfirmError> {
            Ok(batch.iter().map(|_| Transition::NotFound).collect())
        }

        fn not_confirmed(_: &u64, _: &()) -> Outcome {
            Outcome::Done
        }
    }

    #[test]
    fn the_fallback_runs_each_entitys_repeats_after_its_first() {
        let confirmations: Vec<(u64, Uuid)> = [7, 8, 7, 9, 7, 8]
            .into_iter()
            .map(|id| (id, Uuid::nil()))
            .collect();

        let rounds = rounds::<Ids>(&confirmations, &[0, 1, 2, 3, 4, 5]);

        assert_eq!(rounds, vec![vec![0, 1, 3], vec![2, 5], vec![4]]);
    }
}
