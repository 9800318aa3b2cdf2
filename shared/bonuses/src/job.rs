//! Bonus jobs (`charge_event_job`, seed 003): one row per bonus a completed charge owes, granted
//! exactly once by [`crate::grant`]; the kit's table is [`BONUS_JOBS`], the schedule
//! [`RETRY_POLICY`]. The states as they are (the migration's header comment keeps its first form):
//!
//! ```text
//!                  message's grant: locked while PENDING and due, DONE in one transaction
//!  completion ──► PENDING ─────────────────────────────────────────────────────────► DONE
//!                  │ ▲ ▲ ▲  worker's claim (due retries)                              ▲
//!                  └─┼─┼─┼──────────────────────────────► PROCESSING ──worker's grant──┘
//!                    │ │ └─ failure: next_retry_at + 5 / 10 / 15 min, ──┤
//!                    │ │    retry_count (retries only), last_error      │
//!                    │ └─── reaper: claim older than the timeout ───────┤
//!                    │                    3rd retry fails (+ dead letter)
//!                    └──── ops retry (next_retry_at = now) ◄── FAILED ◄─┘
//! ```

use std::time::Duration;

use chrono::{DateTime, Utc};
use paybus_bus::{Envelope, Outbox, UnitOfWork, outbox::OutboxError};
use paybus_db as db;
use paybus_ops::actor::Actor;
use paybus_ops::ops_log::{self, Entry};
use paybus_retry::{AttemptCount, Backoff, Claim, Clock, Lease, RetryPolicy, RowState, WorkTable};
use serde::Serialize;
use sqlx::{AssertSqlSafe, MySqlConnection};
use uuid::Uuid;

use crate::{
    BonusError,
    charge::{Container, PaymentGateway},
    error::parse_column,
    messages::BonusJobCreated,
};

const ENTITY: &str = "bonus job";

paybus_db::column_enum! {
    /// `charge_event_job.status`.
    pub enum JobStatus {
        /// Waiting for its attempt (due when `next_retry_at` is NULL or past).
        Pending,
        /// Claimed by an attempt (`processing_started_at`); the reaper returns it if that attempt
        /// died.
        Processing,
        /// Terminal: granted (`result_charge_id`, `processed_at`).
        Done,
        /// Terminal until ops retry it: the 3rd retry failed (with a dead letter).
        Failed,
    }
}

impl JobStatus {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

paybus_db::column_enum! {
    /// `charge_event_job.job_type`: why the bonus is owed.
    pub enum JobType {
        /// The member's first completed purchase (no event row: `charge_event_id` NULL).
        FirstCharge,
        /// A charge completed while a charge event was active.
        ActiveChargeEvent,
    }
}

impl JobType {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// The bonus jobs as the retry kit works them: a status lease (PROCESSING with
/// `processing_started_at`, which every settle is guarded by), and
/// [`AttemptCount::OnRetryFailure`]: the immediate attempt's failure schedules the first retry
/// without counting one. A failed grant of the message's is claimed and settled in one
/// transaction, so it never stays PROCESSING.
pub static BONUS_JOBS: WorkTable = WorkTable {
    table: "charge_event_job",
    status: "status",
    due: "PENDING",
    failed: "FAILED",
    attempts: "retry_count",
    count: AttemptCount::OnRetryFailure,
    next_attempt_at: "next_retry_at",
    due_index: "idx_charge_event_job_status_next_retry_at",
    last_error: "last_error",
    // A TEXT column holds 65,535 bytes; 4,000 characters fit in any encoding.
    last_error_max: 4_000,
    lease: Lease::Status {
        status: "PROCESSING",
        claimed_at: "processing_started_at",
        claims_index: "idx_charge_event_job_stuck_claims",
    },
    republished_at: None,
    held_for_a_human: None,
};

/// Seed 003's confirmed schedule: the immediate attempt, then 3 retries, 5, 10 and 15 minutes
/// after the failure before each. Attempts in all, the immediate one included.
pub const MAX_ATTEMPTS: u32 = 4;
/// The pause after the 1st, 2nd and 3rd failure.
pub const BACKOFF: Backoff = Backoff::schedule(&[
    Duration::from_secs(5 * 60),
    Duration::from_secs(10 * 60),
    Duration::from_secs(15 * 60),
]);

/// The retry policy of every bonus job: a failed immediate attempt waits 5 minutes
/// (`retry_count` stays 0); failed retry 1 waits 10 minutes, retry 2 waits 15; when retry 3
/// fails the job is FAILED with `retry_count` 3. Checked when compiled, like W1's.
pub const RETRY_POLICY: RetryPolicy = RetryPolicy::constant(MAX_ATTEMPTS, BACKOFF);

/// A job as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BonusJob {
    pub id: u64,
    pub source_charge_id: u64,
    pub result_charge_id: Option<u64>,
    pub member_id: u64,
    pub charge_event_id: Option<u64>,
    pub job_type: JobType,
    pub idempotency_key: String,
    pub additional_can: i32,
    pub payment_gateway: PaymentGateway,
    pub container: Container,
    pub method_snapshot: String,
    pub status: JobStatus,
    pub retry_count: i32,
    pub next_retry_at: Option<DateTime<Utc>>,
    pub processing_started_at: Option<DateTime<Utc>>,
    pub processed_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// The columns of [`JobRow`].
macro_rules! job_columns {
    () => {
        concat!(
            "id, source_charge_id, result_charge_id, member_id, charge_event_id, ",
            "job_type, idempotency_key, additional_can, payment_gateway, container, ",
            "method_snapshot, status, retry_count, next_retry_at, processing_started_at, ",
            "processed_at, last_error, created_at, updated_at"
        )
    };
}

/// `SELECT <the columns of JobRow> FROM charge_event_job <tail>`.
macro_rules! select_jobs {
    ($tail:literal) => {
        concat!("SELECT ", job_columns!(), " FROM charge_event_job ", $tail)
    };
}

#[derive(sqlx::FromRow)]
struct JobRow {
    id: u64,
    source_charge_id: u64,
    result_charge_id: Option<u64>,
    member_id: u64,
    charge_event_id: Option<u64>,
    job_type: String,
    idempotency_key: String,
    additional_can: i32,
    payment_gateway: String,
    container: String,
    method_snapshot: String,
    status: String,
    retry_count: i32,
    next_retry_at: Option<DateTime<Utc>>,
    processing_started_at: Option<DateTime<Utc>>,
    processed_at: Option<DateTime<Utc>>,
    last_error: Option<String>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl JobRow {
    fn into_job(self) -> Result<BonusJob, BonusError> {
        let id = self.id;
        Ok(BonusJob {
            id,
            source_charge_id: self.source_charge_id,
            result_charge_id: self.result_charge_id,
            member_id: self.member_id,
            charge_event_id: self.charge_event_id,
            job_type: parse_column(ENTITY, id, "job_type", self.job_type)?,
            idempotency_key: self.idempotency_key,
            additional_can: self.additional_can,
            payment_gateway: parse_column(ENTITY, id, "payment_gateway", self.payment_gateway)?,
            container: parse_column(ENTITY, id, "container", self.container)?,
            method_snapshot: self.method_snapshot,
            status: parse_column(ENTITY, id, "status", self.status)?,
            retry_count: self.retry_count,
            next_retry_at: self.next_retry_at,
            processing_started_at: self.processing_started_at,
            processed_at: self.processed_at,
            last_error: self.last_error,
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }
}

fn into_jobs(rows: Vec<JobRow>) -> Result<Vec<BonusJob>, BonusError> {
    rows.into_iter().map(JobRow::into_job).collect()
}

/// A bonus a completed charge owes, with everything its grant needs frozen now (seed 003:
/// editing or ending the event later changes nothing already owed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewJob {
    pub source_charge_id: u64,
    pub member_id: u64,
    pub charge_event_id: Option<u64>,
    pub job_type: JobType,
    pub additional_can: i32,
    pub payment_gateway: PaymentGateway,
    pub container: Container,
    pub method_snapshot: String,
}

impl NewJob {
    /// `charge-event:{sourceChargeId}:{jobType}:{chargeEventId or none}` (the seed's form).
    pub fn idempotency_key(&self) -> String {
        let event = self
            .charge_event_id
            .map_or_else(|| "none".to_owned(), |id| id.to_string());
        format!(
            "charge-event:{}:{}:{event}",
            self.source_charge_id, self.job_type
        )
    }
}

/// Inserts the job PENDING (due now) and its `charge.bonus_job.created` message in `uow`'s
/// transaction. `None` when a job with its idempotency key exists: the unique key is the last
/// line of defence behind the completion's transition, and hitting it is expected, not an
/// error (no second message either).
pub async fn enqueue(
    uow: &mut UnitOfWork<'_>,
    new: &NewJob,
    correlation_id: Uuid,
) -> Result<Option<u64>, OutboxError> {
    let key = new.idempotency_key();
    let inserted = sqlx::query(
        "INSERT INTO charge_event_job (source_charge_id, member_id, charge_event_id, job_type, \
             idempotency_key, additional_can, payment_gateway, container, method_snapshot) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(new.source_charge_id)
    .bind(new.member_id)
    .bind(new.charge_event_id)
    .bind(new.job_type.as_str())
    .bind(&key)
    .bind(new.additional_can)
    .bind(new.payment_gateway.as_str())
    .bind(new.container.as_str())
    .bind(&new.method_snapshot)
    .execute(&mut **uow)
    .await;
    // MySQL rolls back only the failed statement: the transaction stays usable.
    let id = match inserted {
        Ok(done) => done.last_insert_id(),
        Err(e) if db::is_duplicate_on(&e, "uk_charge_event_job_idempotency_key") => {
            tracing::warn!(idempotency_key = %key, "bonus job already exists; not created again");
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    uow.send(&Envelope::with_correlation(
        correlation_id,
        BonusJobCreated { job_id: id },
    ))
    .await?;
    tracing::info!(job_id = id, idempotency_key = %key, additional_can = new.additional_can,
        "bonus job created");
    Ok(Some(id))
}

pub async fn find(conn: &mut MySqlConnection, id: u64) -> Result<Option<BonusJob>, BonusError> {
    by_id(conn, select_jobs!("WHERE id = ?"), id).await
}

/// The jobs of `ids` that exist, each with where it stands for the retry kit (its state by
/// `clock`, read in the same statement): what the message path reads before it grants, in
/// one plain read — a duplicate or a job that is not due costs nothing more.
pub async fn with_states(
    conn: &mut MySqlConnection,
    ids: &[u64],
    clock: &Clock,
) -> Result<Vec<(BonusJob, RowState)>, BonusError> {
    #[derive(sqlx::FromRow)]
    struct Stated {
        #[sqlx(flatten)]
        row: JobRow,
        now: DateTime<Utc>,
    }
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let sql = format!(
        "SELECT {}, COALESCE(?, NOW(6)) AS now FROM charge_event_job WHERE id IN ({})",
        job_columns!(),
        db::placeholders(ids.len())
    );
    let rows: Vec<Stated> = ids
        .iter()
        .fold(
            sqlx::query_as(AssertSqlSafe(sql)).bind(clock.sql_now()),
            |query, id| query.bind(*id),
        )
        .fetch_all(conn)
        .await?;
    rows.into_iter()
        .map(|Stated { row, now }| {
            let state = RowState {
                status: row.status.clone(),
                attempts: u64::try_from(row.retry_count).unwrap_or(0),
                next_attempt_at: row.next_retry_at,
                last_error: row.last_error.clone(),
                now,
            };
            Ok((row.into_job()?, state))
        })
        .collect()
}

async fn by_id(
    conn: &mut MySqlConnection,
    sql: &'static str,
    id: u64,
) -> Result<Option<BonusJob>, BonusError> {
    let row: Option<JobRow> = sqlx::query_as(sql).bind(id).fetch_optional(conn).await?;
    row.map(JobRow::into_job).transpose()
}

/// The jobs a charge's completion created, oldest first.
pub async fn for_charge(
    conn: &mut MySqlConnection,
    source_charge_id: u64,
) -> Result<Vec<BonusJob>, BonusError> {
    let rows: Vec<JobRow> = sqlx::query_as(select_jobs!("WHERE source_charge_id = ? ORDER BY id"))
        .bind(source_charge_id)
        .fetch_all(conn)
        .await?;
    into_jobs(rows)
}

/// A page of the jobs ops look at (seed 003: every job but DONE and PROCESSING, i.e. PENDING
/// and FAILED), or of one of those two statuses, by id after `after_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobPage {
    /// PENDING or FAILED; `None` for both.
    pub status: Option<JobStatus>,
    pub after_id: u64,
    pub limit: u32,
}

/// Jobs waiting for a retry (PENDING) or for ops (FAILED), by id: keyset pages stay exact
/// while jobs move in and out of the list.
pub async fn list(conn: &mut MySqlConnection, page: JobPage) -> Result<Vec<BonusJob>, BonusError> {
    let rows: Vec<JobRow> = match page.status {
        Some(status) => {
            sqlx::query_as(select_jobs!(
                "WHERE status = ? AND status IN ('PENDING', 'FAILED') AND id > ? \
                 ORDER BY id LIMIT ?"
            ))
            .bind(status.as_str())
            .bind(page.after_id)
            .bind(page.limit)
            .fetch_all(conn)
            .await?
        }
        None => {
            sqlx::query_as(select_jobs!(
                "WHERE status IN ('PENDING', 'FAILED') AND id > ? ORDER BY id LIMIT ?"
            ))
            .bind(page.after_id)
            .bind(page.limit)
            .fetch_all(conn)
            .await?
        }
    };
    into_jobs(rows)
}

/// The jobs a claim (or the worker's batch claim) took.
pub async fn claimed(conn: &mut MySqlConnection, claim: &Claim) -> Result<BonusJob, BonusError> {
    find(conn, claim.id).await?.ok_or(BonusError::Vanished {
        entity: ENTITY,
        id: claim.id,
    })
}

/// Ops' retry of a FAILED job (seed 003's admin API): FAILED -> PENDING, due now, with its
/// message so the attempt starts at once. True when this call moved it; nothing is written
/// otherwise (the caller reads the job to say why).
pub async fn retry_failed(
    uow: &mut UnitOfWork<'_>,
    id: u64,
    correlation_id: Uuid,
) -> Result<bool, OutboxError> {
    let matched = sqlx::query(
        "UPDATE charge_event_job SET status = 'PENDING', next_retry_at = NOW(6) \
         WHERE id = ? AND status = 'FAILED'",
    )
    .bind(id)
    .execute(&mut **uow)
    .await?
    .rows_affected();
    if matched == 0 {
        return Ok(false);
    }
    uow.send(&Envelope::with_correlation(
        correlation_id,
        BonusJobCreated { job_id: id },
    ))
    .await?;
    tracing::info!(job_id = id, "FAILED bonus job put back to PENDING by ops");
    Ok(true)
}

/// What ops' retry of a job did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpsRetry {
    /// FAILED -> PENDING, due now; its message is published.
    Retried(BonusJob),
    /// The job is not FAILED (as shown): nothing changed.
    NotFailed(BonusJob),
    Missing,
}

/// Ops' retry (admin API, `paybus jobs retry`) in a transaction of its own: [`retry_failed`],
/// logged in the ops log (`bonus_job.retry`, by `actor`), committed and published at once; or
/// the job as it stands when it is not FAILED (nothing written, nothing logged).
pub async fn retry_by_ops(outbox: &Outbox, id: u64, actor: &Actor) -> Result<OpsRetry, BonusError> {
    let mut uow = outbox.begin().await?;
    let correlation_id = Uuid::now_v7();
    if retry_failed(&mut uow, id, correlation_id).await? {
        let job = find(&mut uow, id).await?;
        ops_log::append(
            &mut uow,
            &Entry {
                actor,
                action: "bonus_job.retry",
                subject: &format!("charge_event_job:{id}"),
                detail: &serde_json::json!({
                    "retry_count": job.as_ref().map(|job| job.retry_count),
                    "last_error": job.as_ref().and_then(|job| job.last_error.as_deref()),
                    "correlation_id": correlation_id,
                }),
            },
        )
        .await?;
        uow.commit().await?;
        return Ok(job.map_or(OpsRetry::Missing, OpsRetry::Retried));
    }
    let current = find_locked(&mut uow, id).await?;
    uow.rollback().await?;
    Ok(current.map_or(OpsRetry::Missing, OpsRetry::NotFailed))
}

/// [`find`] as a locking read (the latest committed state, for explaining a transition that
/// did not happen).
pub async fn find_locked(
    conn: &mut MySqlConnection,
    id: u64,
) -> Result<Option<BonusJob>, BonusError> {
    by_id(conn, select_jobs!("WHERE id = ? FOR UPDATE"), id).await
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use paybus_retry::RetryDecision;

    use super::*;

    #[test]
    fn the_idempotency_key_has_the_seed_s_form() {
        let mut job = NewJob {
            source_charge_id: 42,
            member_id: 7,
            charge_event_id: None,
            job_type: JobType::FirstCharge,
            additional_can: 10,
            payment_gateway: PaymentGateway::Pg,
            container: Container::Pg,
            method_snapshot: "first charge bonus".into(),
        };
        assert_eq!(job.idempotency_key(), "charge-event:42:FIRST_CHARGE:none");
        job.job_type = JobType::ActiveChargeEvent;
        job.charge_event_id = Some(3);
        assert_eq!(
            job.idempotency_key(),
            "charge-event:42:ACTIVE_CHARGE_EVENT:3"
        );
    }

    #[test]
    fn the_schedule_is_five_ten_fifteen_minutes_then_failed() {
        let policy = RETRY_POLICY;
        let minutes = |failures| match policy.after_failure(failures) {
            RetryDecision::RetryAfter(pause) => Some(pause.as_secs() / 60),
            RetryDecision::GiveUp => None,
        };
        assert_eq!(
            (1..=5).map(minutes).collect::<Vec<_>>(),
            [Some(5), Some(10), Some(15), None, None]
        );
    }

    #[test]
    fn statuses_and_types_are_their_column_values() {
        assert_eq!(JobStatus::Processing.as_str(), "PROCESSING");
        assert_eq!(JobStatus::from_str("FAILED"), Ok(JobStatus::Failed));
        assert_eq!(JobType::ActiveChargeEvent.as_str(), "ACTIVE_CHARGE_EVENT");
        assert!(JobStatus::from_str("failed").is_err());
    }
}
