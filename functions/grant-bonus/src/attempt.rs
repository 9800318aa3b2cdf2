//! One attempt at a bonus job, whoever makes it; every grant is one transaction (the credit, the
//! EVENT charge and DONE). Two paths, each with as few statements as its guarantees allow:
//!
//! - **the message** ([`attempt_messages`]: the immediate attempt, ops' retries): one plain
//!   read of the jobs (a duplicate or a job not due ends there), then one transaction that locks
//!   the jobs still PENDING and due and grants them (`paybus_bonuses::grant::grant_due_in`). No
//!   claim is committed first: a crash leaves nothing to reap. A failing grant rolls back, and
//!   each job is then granted on its own.
//! - **the worker** ([`claim_due`] then [`attempt`]): a batch claim commits the due jobs
//!   PROCESSING (the retry kit's status lease), then grants them one by one under that claim.
//!
//! A failed grant is **settled** conditionally on a claim: PENDING after the seed's backoff, or
//! FAILED (with its dead letter, on the worker's path) after the 3rd retry. A dead worker's jobs
//! go back to PENDING through the reaper, and a settle guarded by the old claim writes nothing
//! (principle 4: the row, re-read under its guard, decides).

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use paybus_bonuses::{
    BonusError, BonusJobCreated,
    grant::{self, ClaimedJob, Granted},
    job::{self, BONUS_JOBS, BonusJob, JobStatus},
};
use paybus_bus::{Envelope, dead_letter};
use paybus_db as db;
use paybus_retry::{AfterFailure, Claim, Clock, RetryPolicy, RowState};
use sqlx::{MySql, MySqlPool, pool::PoolConnection};

use crate::GrantBonus;

/// Who makes the attempt: it decides where a give-up's dead letter comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// grant-bonus on a `charge.bonus_job.created` message: `Outcome::Failed` dead-letters
    /// the message.
    Message,
    /// The worker on a due retry: no message to dead-letter, so the dead letter is recorded
    /// with the FAILED state, in the same transaction.
    Worker,
}

/// What the message path did for one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageResult {
    /// This message's attempt: granted, or failed and settled.
    Attempted(Attempted),
    /// Not this message's to attempt: granted, failed, in flight elsewhere, or not due yet.
    NotClaimed(RowState),
    /// An earlier message of the same batch names the same job and made its attempt.
    Repeated,
    /// No such job.
    Missing,
}

/// What an attempt did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempted {
    /// Granted: the EVENT charge `charge_id`, the credit and DONE are committed.
    Granted { charge_id: u64 },
    /// Failed, due again after `after`; `failures` counts every failure so far, the
    /// immediate attempt's included.
    Retry {
        after: Duration,
        failures: u32,
        error: String,
    },
    /// Failed at the limit: FAILED (`retry_count` failed retries).
    GaveUp { retry_count: u32, error: String },
    /// The claim had been taken over (reaped, or ops changed the row): nothing was written.
    ClaimLost,
}

/// The message path for the jobs of a batch of messages (`ids`, one per message, repeats
/// allowed), one result per message in order. A batch that fails as a whole (the database
/// went away, say) is tried again one message at a time, so each message gets its own
/// answer.
pub async fn attempt_messages(
    pool: &MySqlPool,
    ids: &[u64],
    policy: &RetryPolicy,
    clock: &Clock,
) -> Vec<Result<MessageResult, BonusError>> {
    match attempt_together(pool, ids, policy, clock).await {
        Ok(results) => results.into_iter().map(Ok).collect(),
        Err(error) if ids.len() == 1 => vec![Err(error)],
        Err(error) => {
            tracing::info!(
                size = ids.len(),
                error = %paybus_telemetry::one_line(&error),
                "bonus batch failed; attempting one message at a time"
            );
            let mut results = Vec::with_capacity(ids.len());
            for id in ids {
                results.push(
                    attempt_together(pool, std::slice::from_ref(id), policy, clock)
                        .await
                        .map(|mut one| one.remove(0)),
                );
            }
            results
        }
    }
}

async fn attempt_together(
    pool: &MySqlPool,
    ids: &[u64],
    policy: &RetryPolicy,
    clock: &Clock,
) -> Result<Vec<MessageResult>, BonusError> {
    let mut distinct = ids.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    // The read and the grant's transaction share one checkout of the pool (each return to it
    // costs a ping round trip).
    let mut conn = pool.acquire().await?;
    let states = job::with_states(&mut conn, &distinct, clock).await?;
    let mut due: Vec<&BonusJob> = states
        .iter()
        .filter(|(job, state)| job.status == JobStatus::Pending && state.is_due())
        .map(|(job, _)| job)
        .collect();
    due.sort_unstable_by_key(|job| job.id);
    let attempted = if due.is_empty() {
        drop(conn);
        BTreeMap::new()
    } else {
        grant_due(pool, Some(conn), &due, policy, clock).await?
    };
    let mut answered = BTreeSet::new();
    Ok(ids
        .iter()
        .map(|id| {
            if !answered.insert(*id) {
                MessageResult::Repeated
            } else if let Some(attempted) = attempted.get(id) {
                MessageResult::Attempted(attempted.clone())
            } else if let Some((_, state)) = states.iter().find(|(job, _)| job.id == *id) {
                MessageResult::NotClaimed(state.clone())
            } else {
                MessageResult::Missing
            }
        })
        .collect())
}

/// Grants `due` (by id) in one transaction (on `conn` when given); a job another attempt
/// claimed meanwhile is left out of it. When a grant fails, the transaction is rolled back and
/// each job is granted in one of its own, so only the failing job's failure is settled (the
/// claim taken in the settle's transaction).
async fn grant_due(
    pool: &MySqlPool,
    conn: Option<PoolConnection<MySql>>,
    due: &[&BonusJob],
    policy: &RetryPolicy,
    clock: &Clock,
) -> Result<BTreeMap<u64, Attempted>, BonusError> {
    let mut tx = match conn {
        Some(conn) => sqlx::Transaction::begin(conn, None).await?,
        None => pool.begin().await?,
    };
    let error = match grant::grant_due_in(&mut tx, due, clock).await {
        Ok(granted) => {
            tx.commit().await?;
            let mut attempted = BTreeMap::new();
            for job in due {
                let Some(&charge_id) = granted.get(&job.id) else {
                    tracing::warn!(
                        job_id = job.id,
                        "the job was claimed by another attempt before this grant locked it"
                    );
                    attempted.insert(job.id, Attempted::ClaimLost);
                    continue;
                };
                tracing::info!(
                    job_id = job.id,
                    charge_id,
                    member_id = job.member_id,
                    additional_can = job.additional_can,
                    batch = due.len(),
                    "bonus granted"
                );
                attempted.insert(job.id, Attempted::Granted { charge_id });
            }
            return Ok(attempted);
        }
        Err(error) => error,
    };
    if let Err(rollback) = tx.rollback().await {
        tracing::warn!(%rollback, "rolling back a failed grant failed");
    }
    if let [job] = due {
        let error = paybus_telemetry::one_line(&error);
        let attempted = settle_message_failure(pool, job, policy, &error, clock).await?;
        return Ok(BTreeMap::from([(job.id, attempted)]));
    }
    tracing::info!(
        size = due.len(),
        error = %paybus_telemetry::one_line(&error),
        "bonus grant batch rolled back; granting one job at a time"
    );
    let mut attempted = BTreeMap::new();
    for job in due {
        attempted.extend(Box::pin(grant_due(pool, None, &[*job], policy, clock)).await?);
    }
    Ok(attempted)
}

/// The message path's failed grant: the job claimed and its failure settled in one short
/// transaction (nothing if another attempt claimed it meanwhile).
async fn settle_message_failure(
    pool: &MySqlPool,
    job: &BonusJob,
    policy: &RetryPolicy,
    error: &str,
    clock: &Clock,
) -> Result<Attempted, BonusError> {
    let mut tx = db::begin_read_committed(pool).await?;
    let Some(claim) = BONUS_JOBS
        .claim(&mut tx, job.id, Duration::ZERO, clock)
        .await?
    else {
        tx.rollback().await?;
        tracing::warn!(
            job_id = job.id,
            error,
            "grant failed, and another attempt claimed the job since"
        );
        return Ok(Attempted::ClaimLost);
    };
    let claimed = ClaimedJob {
        job: job.clone(),
        claim,
    };
    settle_failure_in(tx, &claimed, policy, error, clock, Source::Message).await
}

/// Claims up to `limit` due jobs, oldest due first, skipping rows other claimers hold.
pub async fn claim_due(
    pool: &MySqlPool,
    limit: u32,
    clock: &Clock,
) -> Result<Vec<ClaimedJob>, BonusError> {
    let mut tx = db::begin_read_committed(pool).await?;
    let claims: Vec<Claim> = BONUS_JOBS
        .claim_due(&mut tx, limit, Duration::ZERO, clock)
        .await?;
    let mut claimed = Vec::with_capacity(claims.len());
    for claim in claims {
        let job = job::claimed(&mut tx, &claim).await?;
        claimed.push(ClaimedJob { job, claim });
    }
    tx.commit().await?;
    Ok(claimed)
}

/// The worker's attempt at a job it claimed: the grant, or the settle of its failure (with
/// the dead letter when it gives up).
#[tracing::instrument(skip_all, fields(job_id = claimed.job.id, retry_count = claimed.claim.attempts))]
pub async fn attempt(
    pool: &MySqlPool,
    claimed: &ClaimedJob,
    policy: &RetryPolicy,
    clock: &Clock,
) -> Result<Attempted, BonusError> {
    let mut tx = pool.begin().await?;
    let error = match grant::grant_in(&mut tx, claimed, clock).await {
        Ok(Granted::Done { charge_id }) => {
            tx.commit().await?;
            tracing::info!(
                job_id = claimed.job.id,
                charge_id,
                member_id = claimed.job.member_id,
                additional_can = claimed.job.additional_can,
                "bonus granted by the worker"
            );
            return Ok(Attempted::Granted { charge_id });
        }
        Ok(Granted::ClaimLost) => {
            tx.rollback().await?;
            tracing::warn!(
                job_id = claimed.job.id,
                "the claim was taken over; nothing granted"
            );
            return Ok(Attempted::ClaimLost);
        }
        Err(error) => error,
    };
    if let Err(rollback) = tx.rollback().await {
        tracing::warn!(%rollback, "rolling back a failed grant failed");
    }
    let error = paybus_telemetry::one_line(&error);
    let tx = pool.begin().await?;
    settle_failure_in(tx, claimed, policy, &error, clock, Source::Worker).await
}

/// Settles a failed grant in `tx` and commits it: retry after the backoff, or FAILED (with
/// the worker's dead letter).
async fn settle_failure_in(
    mut tx: sqlx::Transaction<'_, sqlx::MySql>,
    claimed: &ClaimedJob,
    policy: &RetryPolicy,
    error: &str,
    clock: &Clock,
    source: Source,
) -> Result<Attempted, BonusError> {
    let id = claimed.job.id;
    let settled = BONUS_JOBS
        .settle_failure(&mut tx, &claimed.claim, policy, error, clock)
        .await?;
    let attempted = match settled {
        AfterFailure::Retry { after, failures } => {
            tracing::warn!(
                job_id = id,
                failures,
                ?after,
                error,
                "bonus grant failed; retry scheduled"
            );
            Attempted::Retry {
                after,
                failures,
                error: error.to_owned(),
            }
        }
        AfterFailure::Failed { failures } => {
            // Failures after the immediate attempt's are the failed retries.
            let retry_count = failures.saturating_sub(1);
            if source == Source::Worker {
                record_dead_letter(&mut tx, claimed, retry_count, error).await?;
            }
            tracing::error!(
                job_id = id,
                retry_count,
                error,
                "bonus job FAILED: no more automatic retries"
            );
            Attempted::GaveUp {
                retry_count,
                error: error.to_owned(),
            }
        }
        AfterFailure::ClaimLost => {
            tx.rollback().await?;
            tracing::warn!(
                job_id = id,
                error,
                "grant failed after its claim was taken over"
            );
            return Ok(Attempted::ClaimLost);
        }
    };
    tx.commit().await?;
    Ok(attempted)
}

/// The worker's dead letter of a job that just became FAILED: the message a replay would send
/// (`charge.bonus_job.created {job_id}`), one dead letter per give-up.
async fn record_dead_letter(
    conn: &mut sqlx::MySqlConnection,
    claimed: &ClaimedJob,
    retry_count: u32,
    error: &str,
) -> Result<(), BonusError> {
    use paybus_bus::Handler;
    let id = claimed.job.id;
    let message = Envelope::new(BonusJobCreated { job_id: id })
        .to_outgoing()
        .map_err(|e| BonusError::Outbox(e.into()))?;
    dead_letter::record_given_up(
        conn,
        GrantBonus::FUNCTION,
        &format!(
            "{}:charge_event_job:{id}:failed:{retry_count}",
            GrantBonus::FUNCTION
        ),
        &message,
        &format!("bonus job {id} FAILED after {retry_count} retries; last error: {error}"),
        retry_count.saturating_add(1),
    )
    .await?;
    Ok(())
}
