//! The grant: one transaction that pays a bonus job exactly once (seed 003's
//! `applyChargeEvent`, now driven by the job row), committed only when the job's conditional
//! UPDATE to DONE still finds it this attempt's. Two attempts, two guards:
//!
//! - **the message's** ([`grant_due_in`], grant-bonus's immediate attempt and ops' retries):
//!   no claim is committed first. The transaction locks the jobs still PENDING and due (the
//!   row locks are the claim; a job another attempt claimed meanwhile is left out, nothing to
//!   roll back), credits their members, writes the EVENT charges and moves the jobs to DONE.
//!   A crash before the commit leaves them PENDING and due, nothing to reap. Several
//!   messages' jobs share one such transaction.
//! - **the worker's** ([`grant_in`]): its batch claim committed the jobs PROCESSING (`FOR
//!   UPDATE SKIP LOCKED`, so workers never share a job); the grant locks its job under that
//!   claim first, and DONE is guarded by it.
//!
//! Lock order in both: the job rows (in id order), then the members (in id order) — the
//! completion locks its charge, then the member, and no existing job row, so no two of them
//! wait on each other in a cycle.

use std::collections::BTreeMap;

use paybus_platform::retry::{Claim, Clock, Settled};
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

/// What the worker's grant transaction decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Granted {
    /// Granted: the EVENT charge `charge_id` and the credit are in the transaction; commit it.
    Done { charge_id: u64 },
    /// The claim is no longer this attempt's (the reaper returned it, ops changed the row):
    /// nothing was written.
    ClaimLost,
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
    if BONUS_JOBS.lock_claimed(conn, &claimed.claim).await? == Settled::ClaimLost {
        return Ok(Granted::ClaimLost);
    }
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
    if matched != 1 {
        return Err(BonusError::Inconsistent(format!(
            "bonus job {} was locked under its claim, yet its DONE matched {matched} rows",
            job.id
        )));
    }
    Ok(Granted::Done { charge_id })
}

/// The message path's grant of `jobs` (distinct, read PENDING and due just before), in the
/// caller's transaction: the jobs still due locked (in id order), their credits (one UPDATE
/// for several: the members' locks, in id order), one EVENT charge each, and each job
/// PENDING -> DONE. Returns the EVENT charge of each job granted; a job missing from it was
/// claimed by another attempt meanwhile and nothing was written for it. A single job's
/// missing member is `Vanished`, as in [`grant_in`]; in a batch, an error (roll back).
pub async fn grant_due_in(
    conn: &mut MySqlConnection,
    jobs: &[&BonusJob],
    clock: &Clock,
) -> Result<BTreeMap<u64, u64>, BonusError> {
    let ids: Vec<u64> = jobs.iter().map(|job| job.id).collect();
    let locked = BONUS_JOBS.lock_due(conn, &ids, clock).await?;
    let jobs: Vec<&BonusJob> = jobs
        .iter()
        .copied()
        .filter(|job| locked.contains(&job.id))
        .collect();
    if jobs.is_empty() {
        return Ok(BTreeMap::new());
    }
    if let [job] = jobs[..] {
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
            return Err(BonusError::Inconsistent(format!(
                "a member of bonus jobs {locked:?} is missing"
            )));
        }
    }
    let mut granted = BTreeMap::new();
    for job in &jobs {
        granted.insert(job.id, insert_charge(conn, job).await?);
    }
    let set = format!(
        "status = 'DONE', result_charge_id = CASE id {}END, \
         processed_at = COALESCE(?, NOW(6)), next_retry_at = NULL",
        "WHEN ? THEN ? ".repeat(granted.len())
    );
    let query = granted
        .iter()
        .fold(
            sqlx::query(AssertSqlSafe(BONUS_JOBS.due_update(&set, granted.len()))),
            |query, (job_id, charge_id)| query.bind(*job_id).bind(*charge_id),
        )
        .bind(clock.sql_now());
    let granted_ids: Vec<u64> = granted.keys().copied().collect();
    let matched = BONUS_JOBS
        .bind_due(query, &granted_ids, clock)
        .execute(conn)
        .await?
        .rows_affected();
    if matched != granted_ids.len() as u64 {
        return Err(BonusError::Inconsistent(format!(
            "bonus jobs {granted_ids:?} were locked while due, yet their DONE matched {matched}"
        )));
    }
    Ok(granted)
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
