//! One attempt at a bonus job, whoever makes it (the handler on the message, the worker on a
//! due retry). No transaction spans two steps:
//!
//! 1. **claim** (READ COMMITTED, short): PENDING and due -> PROCESSING with
//!    `processing_started_at` (the retry kit's status lease). The worker claims its batch
//!    itself (`claim_due`, `FOR UPDATE SKIP LOCKED`).
//! 2. **grant** (one transaction, `paybus_bonuses::grant::grant_in`): member lock, EVENT
//!    charge, credit, DONE — committed only if the claim is still this attempt's.
//! 3. after a failed grant, **settle** (short, conditional on the claim): PENDING with
//!    `last_error` and `next_retry_at` after the seed's backoff, or FAILED when the 3rd retry
//!    failed. The worker writes the dead letter of a FAILED job in this transaction (the
//!    handler's `Outcome::Failed` dead-letters the message instead).
//!
//! An attempt whose process dies leaves the job PROCESSING; the reaper returns it to PENDING
//! once its claim is older than the timeout, and a settle guarded by the old claim writes
//! nothing (principle 4: the row, re-read under its guard, decides).

use std::time::Duration;

use paybus_bonuses::{
    BonusError, BonusJobCreated,
    grant::{self, ClaimedJob, Granted},
    job::{self, BONUS_JOBS},
};
use paybus_platform::{
    bus::{Envelope, dead_letter},
    db,
    retry::{AfterFailure, Claim, Clock, RetryPolicy, RowState},
};
use sqlx::MySqlPool;

use crate::GrantBonus;

/// Who makes the attempt: it decides where a give-up's dead letter comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// grant-bonus on a `charge.bonus_job.created` message: `Outcome::Failed` dead-letters
    /// the message.
    Message,
    /// The worker on a due retry: no message to dead-letter, so the dead letter is recorded
    /// with the FAILED state, in the same transaction.
    Worker,
}

/// What the claim of one job found.
#[derive(Debug, Clone)]
pub enum Claimed {
    Job(ClaimedJob),
    /// Not this attempt's to make: granted, failed, in flight elsewhere, or not due yet.
    NotClaimed(RowState),
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

/// Claims job `id` if it is PENDING and due (the immediate attempt, or an ops retry).
pub async fn claim(pool: &MySqlPool, id: u64, clock: &Clock) -> Result<Claimed, BonusError> {
    let mut tx = db::begin_read_committed(pool).await?;
    let Some(claim) = BONUS_JOBS.claim(&mut tx, id, Duration::ZERO, clock).await? else {
        let state = BONUS_JOBS.describe(&mut tx, id, clock).await?;
        tx.rollback().await?;
        return Ok(state.map_or(Claimed::Missing, Claimed::NotClaimed));
    };
    let job = job::claimed(&mut tx, &claim).await?;
    tx.commit().await?;
    Ok(Claimed::Job(ClaimedJob { job, claim }))
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

/// Grants a claimed job, or settles its failure.
#[tracing::instrument(skip_all, fields(job_id = claimed.job.id, retry_count = claimed.claim.attempts))]
pub async fn attempt(
    pool: &MySqlPool,
    claimed: &ClaimedJob,
    policy: &RetryPolicy,
    clock: &Clock,
    source: Source,
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
                ?source,
                "bonus granted"
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
    let error = paybus_platform::telemetry::one_line(&error);
    settle_failure(pool, claimed, policy, &error, clock, source).await
}

/// Short transaction after a failed grant: retry after the backoff, or FAILED (with the
/// worker's dead letter).
async fn settle_failure(
    pool: &MySqlPool,
    claimed: &ClaimedJob,
    policy: &RetryPolicy,
    error: &str,
    clock: &Clock,
    source: Source,
) -> Result<Attempted, BonusError> {
    let id = claimed.job.id;
    let mut tx = pool.begin().await?;
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
    use paybus_platform::bus::Handler;
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
