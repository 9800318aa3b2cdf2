//! The grant: one transaction that pays a bonus job exactly once (seed 003's
//! `applyChargeEvent`, now driven by the job row), committed only when the job's conditional
//! UPDATE to DONE still finds it this attempt's. Two attempts, two guards:
//!
//! - **the message's** ([`grant_due_in`], grant-bonus's immediate attempt and ops' retries):
//!   no claim is committed first. The transaction credits the member (the member's lock),
//!   writes the EVENT charge and moves the job PENDING -> DONE only if it is still PENDING and
//!   due; its row locks are the claim. A crash before the commit leaves the job PENDING and
//!   due, nothing to reap. Several messages' jobs share one such transaction.
//! - **the worker's** ([`grant_in`]): its batch claim committed the jobs PROCESSING (`FOR
//!   UPDATE SKIP LOCKED`, so workers never share a job); DONE is guarded by that claim.
//!
//! Lock order in both: the members (in id order in a batch), then the job rows — the
//! completion locks its charge, then the member, and nothing locks a job and then a member.

use paybus_platform::retry::{Claim, Clock};
use sqlx::{AssertSqlSafe, MySqlConnection};

use crate::{
    BonusError, charge,
    job::{BONUS_JOBS, BonusJob},
    member::{self, Credit},
};

/// A job an attempt holds: the row as claimed, and the claim its settle is guarded by.
#[derive(Debug, Clone)]
pub struct ClaimedJob {
    pub job: BonusJob,
    pub claim: Claim,
}

/// What a grant transaction decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Granted {
    /// Granted: the EVENT charges (one per job, in the jobs' order) and the credits are in
    /// the transaction; commit it.
    Done { charge_ids: Vec<u64> },
    /// A job was no longer this attempt's (another attempt claimed it, the reaper returned
    /// it, ops changed it) or, in a batch, a member was not found: roll back, nothing may be
    /// kept.
    NotAll,
}

/// The assignments of a job the worker granted (binds: the result charge, then the clock).
const DONE: &str = "status = 'DONE', result_charge_id = ?, processed_at = COALESCE(?, NOW(6)), \
                    next_retry_at = NULL";

/// The worker's grant of a job it claimed, in the caller's transaction: the credit (the
/// member's lock), the EVENT charge (the job's snapshot: cans, gateway, container, reason) and
/// PROCESSING -> DONE with `result_charge_id` and `processed_at`, conditional on the claim.
pub async fn grant_in(
    conn: &mut MySqlConnection,
    claimed: &ClaimedJob,
    clock: &Clock,
) -> Result<Granted, BonusError> {
    let job = &claimed.job;
    member::credit(conn, job.member_id, job.container, job.additional_can).await?;
    let charge_id = insert_charge(conn, job).await?;
    let matched = BONUS_JOBS
        .bind_guard(
            sqlx::query(AssertSqlSafe(BONUS_JOBS.guarded_update(DONE)))
                .bind(charge_id)
                .bind(clock.sql_now()),
            &claimed.claim,
        )
        .execute(conn)
        .await?
        .rows_affected();
    Ok(if matched == 1 {
        Granted::Done {
            charge_ids: vec![charge_id],
        }
    } else {
        Granted::NotAll
    })
}

/// The message path's grant of `jobs` (distinct, read PENDING and due just before), in the
/// caller's transaction: every credit in one UPDATE (the members' locks, in id order), one
/// EVENT charge per job, and every job PENDING -> DONE in one UPDATE guarded by "still
/// PENDING and due". `Done` only when every job and every member was found so; a single
/// job's missing member is `Vanished`, as in [`grant_in`].
pub async fn grant_due_in(
    conn: &mut MySqlConnection,
    jobs: &[&BonusJob],
    clock: &Clock,
) -> Result<Granted, BonusError> {
    if let [job] = jobs {
        member::credit(conn, job.member_id, job.container, job.additional_can).await?;
    } else {
        let credits: Vec<Credit> = jobs
            .iter()
            .map(|job| Credit {
                member_id: job.member_id,
                container: job.container,
                cans: job.additional_can,
            })
            .collect();
        if !member::credit_all(conn, &credits).await? {
            return Ok(Granted::NotAll);
        }
    }
    let mut charge_ids = Vec::with_capacity(jobs.len());
    for job in jobs {
        charge_ids.push(insert_charge(conn, job).await?);
    }
    let ids: Vec<u64> = jobs.iter().map(|job| job.id).collect();
    let set = format!(
        "status = 'DONE', result_charge_id = CASE id {}END, \
         processed_at = COALESCE(?, NOW(6)), next_retry_at = NULL",
        "WHEN ? THEN ? ".repeat(ids.len())
    );
    let query = ids
        .iter()
        .zip(&charge_ids)
        .fold(
            sqlx::query(AssertSqlSafe(BONUS_JOBS.due_update(&set, ids.len()))),
            |query, (job_id, charge_id)| query.bind(*job_id).bind(*charge_id),
        )
        .bind(clock.sql_now());
    let matched = BONUS_JOBS
        .bind_due(query, &ids, clock)
        .execute(conn)
        .await?
        .rows_affected();
    Ok(if matched == ids.len() as u64 {
        Granted::Done { charge_ids }
    } else {
        Granted::NotAll
    })
}

/// The job's EVENT charge, from its snapshot.
async fn insert_charge(conn: &mut MySqlConnection, job: &BonusJob) -> Result<u64, sqlx::Error> {
    charge::insert_bonus(
        conn,
        &charge::BonusCharge {
            member_id: job.member_id,
            cans: job.additional_can,
            payment_gateway: job.payment_gateway,
            container: job.container,
            method: &job.method_snapshot,
        },
    )
    .await
}
